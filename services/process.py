"""A server run as a child process (Kafka, Kafka Connect, PostgreSQL): the start, stop and kill they share.

Each server of ``services/`` runs as a real process of the machine, in its own process group, so that
signals sent to the test runner's terminal do not hit it and a stop or a kill reaches all of it (a JVM's
threads, every PostgreSQL backend). What differs is how it is prepared and launched (:meth:`_launch`),
when it is ready (:meth:`_wait_ready`) and how it is asked to stop (:meth:`_request_stop`); the rest is here
once: a failed start kills what it launched, ``stop()`` forces a shutdown that hangs, ``kill()`` is a real
``kill -9`` for crash tests, and a server still running when the interpreter exits is killed by an
``atexit`` hook so that failed tests do not leak processes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["ManagedProcess", "LOG_TAIL_LINES", "tail", "free_ports"]

HOST = "127.0.0.1"  # loopback only: tests must never expose a server or depend on host names
LOG_TAIL_LINES = 40


def tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of a log, for an error message (a note when there is no such file)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except OSError:
        return f"(no {path.name})\n"


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all sockets held open together so they differ)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ManagedProcess:
    """One server running as a child process in its own process group, with its files in ``workdir``.

    Use it as a context manager, or call ``start()`` / ``stop()``. Subclasses implement :meth:`_launch`
    (prepare, then :meth:`_spawn`) and :meth:`_wait_ready`, and may override :meth:`_request_stop`,
    :meth:`_force_stop` and :meth:`_close_clients`.
    """

    #: seconds ``start()`` waits for the server to be ready, and ``stop()`` for it to exit, by default
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None

    # -- context manager ------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- state ----------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None before start and after stop/kill)."""
        return self._proc.pid if self.is_running() else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout_s: float | None = None) -> Self:
        """Start the server and return only once it is ready (idempotent while running). On failure the
        process is killed and the error carries the end of its log."""
        if self.is_running():
            return self
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        self._launch(deadline)
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.kill()
            raise
        return self

    def _launch(self, deadline: float) -> None:
        """Prepare the server's files and start its process with :meth:`_spawn`."""
        raise NotImplementedError

    def _wait_ready(self, deadline: float) -> None:
        """Return once clients can use the server; raise (with diagnostics) if it exits or ``deadline``
        (``time.monotonic()``) passes first."""
        raise NotImplementedError

    def _diagnostics(self) -> str:
        """What a start-up error carries: the end of the server's log."""
        raise NotImplementedError

    def _check_alive(self, error: type[Exception], what: str) -> None:
        """Raise ``error``, with the diagnostics, when the server (``what``) exited while starting."""
        proc = self._proc
        assert proc is not None
        if proc.poll() is not None:
            raise error(f"{what} exited with code {proc.returncode} during start-up.\n{self._diagnostics()}")

    def _spawn(self, cmd: list[str], *, cwd: Path, output: Path, **popen: Any) -> None:
        """Run ``cmd`` in its own process group (killpg reaches all of it), its stdout and stderr appended
        to ``output``, and have it killed at interpreter exit unless stopped before."""
        with open(output, "ab") as out:  # the child keeps its own copy of the descriptor
            self._proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **popen,
            )
        atexit.register(self._kill_at_exit)

    def stop(self, timeout_s: float | None = None) -> None:
        """Shut down cleanly (:meth:`_request_stop`), and force it (:meth:`_force_stop`) if the server has
        not exited after ``timeout_s``. Idempotent."""
        self._close_clients()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._request_stop(proc)
            try:
                proc.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                self._force_stop(proc)
        self._forget()

    def kill(self) -> None:
        """``kill -9`` the whole process group, as a crash would: no shutdown hook, no clean close.
        Idempotent."""
        self._close_clients()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            proc.wait()
        self._forget()

    def _request_stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Ask for a clean shutdown: SIGTERM to the group (a JVM runs its shutdown hooks)."""
        self._signal_group(signal.SIGTERM)

    def _force_stop(self, proc: subprocess.Popen[bytes]) -> None:
        """The clean shutdown hangs: SIGKILL to the group."""
        self._signal_group(signal.SIGKILL)
        proc.wait()

    def _close_clients(self) -> None:
        """Close the clients this object holds to the server before it goes away (none by default)."""

    def _signal_group(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:  # never signal a reaped pid: it may be reused
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def _forget(self) -> None:
        self._proc = None
        atexit.unregister(self._kill_at_exit)

    def _kill_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()
