"""One ``trickle run`` per conf file and warehouse: a lease with an expiry, kept on the warehouse's own store.

Why a lease and not a lock file or a pid: the two runs may be on two machines that share only the store
(an S3 bucket), and a crashed run must not block the next one forever. The running job renews the lease
every ``ttl / 3`` seconds; a lease not renewed for ``ttl`` seconds (default 60, ``TRICKLE_LEASE_SECONDS``) is
expired, and the next run takes it over.

How, with nothing but put-if-absent (:meth:`connectors.storage.Storage.put_if_absent`, atomic on every store:
``If-None-Match: *`` on S3, a hard link on a local disk, ``create(overwrite=false)`` on HDFS/GCS/ADLS):

* The lease is a series of generation files ``<catalog>/leases/<name>/<generation:012d>.json``; the highest
  generation is the lease. Each holds the owner (host, pid, a random id) and the time it expires.
* Taking the lease creates the next generation with put-if-absent, and only when the current one is expired
  (or there is none). Two runs racing for the same generation: exactly one create succeeds; the other gets a
  clear :class:`LeaseHeld` naming the holder.
* Renewing rewrites the owner's own generation file (nobody else writes it), after checking that no higher
  generation exists. If one does (the job stalled past its expiry and another run took over), the renewal
  raises :class:`LeaseLost` and the job stops: two runs may overlap for at most one renewal interval, which
  costs no rows, since every refresh commit is a Delta commit checked against the version it read.
* A holder on the same host whose process is gone (killed, crashed) is taken over at once: a supervisor's
  restart does not wait for the expiry.
* Expiry compares wall clocks of different machines: keep them within a fraction of ``ttl`` (NTP).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from connectors.storage import Exists, Storage, join
from pipeline.errors import TrickleError

DEFAULT_TTL = 60.0


class LeaseHeld(TrickleError):
    """Another live run holds the lease."""


class LeaseLost(TrickleError):
    """This run's lease was taken over (it was not renewed in time)."""


def ttl_seconds() -> float:
    return float(os.environ.get("TRICKLE_LEASE_SECONDS") or DEFAULT_TTL)


class Lease:
    """The lease ``name`` under ``folder`` (``<catalog root>/leases``) on ``storage``."""

    def __init__(self, storage: Storage, folder: str, name: str, ttl: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.dir = join(folder, name)
        self.name = name
        self.ttl = ttl_seconds() if ttl is None else ttl
        self.clock = clock
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "id": uuid.uuid4().hex}
        self.generation: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _generations(self) -> list[int]:
        return sorted(int(n[:-5]) for n in self.storage.list(self.dir) if n.endswith(".json") and n[:-5].isdigit())

    def _file(self, generation: int) -> str:
        return join(self.dir, f"{generation:012d}.json")

    def _doc(self) -> str:
        return json.dumps({**self.owner, "expires_at": self.clock() + self.ttl, "ttl": self.ttl})

    def current(self) -> tuple[int, dict[str, Any]] | None:
        """The newest generation and its holder, None when there is none."""
        for g in reversed(self._generations()):
            text = self.storage.read_text(self._file(g))
            if text is not None:
                return g, json.loads(text)
        return None

    def acquire(self) -> None:
        """Take the lease, or :class:`LeaseHeld` saying who holds it and until when."""
        cur = self.current()
        if cur is not None:
            g, holder = cur
            left = float(holder.get("expires_at", 0)) - self.clock()
            if left > 0 and not self._dead_here(holder):
                raise LeaseHeld(self._held_message(holder, left))
        nxt = 0 if cur is None else cur[0] + 1
        try:
            self.storage.put_if_absent(self._file(nxt), self._doc())
        except Exists:
            cur = self.current()
            holder = cur[1] if cur else {}
            raise LeaseHeld(self._held_message(holder, float(holder.get("expires_at", 0)) - self.clock())) from None
        self.generation = nxt
        for old in self._generations():  # superseded generations: only the newest counts
            if old < nxt:
                self.storage.delete(self._file(old))

    def _dead_here(self, holder: dict[str, Any]) -> bool:
        """Whether the holder ran on this host and its process is gone: a job killed and restarted by a
        supervisor on the same machine takes its own lease over at once instead of waiting for the expiry."""
        if holder.get("host") != self.owner["host"] or not isinstance(holder.get("pid"), int):
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:  # alive, owned by another user
            return False
        return False

    def _held_message(self, holder: dict[str, Any], left: float) -> str:
        return (f"another 'trickle run' of {self.name} is running (host {holder.get('host')}, pid "
                f"{holder.get('pid')}; its lease at {self.dir} expires in {max(0.0, left):.0f} s unless it renews "
                f"it). Stop that run first; if it crashed, its lease expires by itself within "
                f"{self.ttl:.0f} s (TRICKLE_LEASE_SECONDS)")

    def renew(self) -> None:
        """Push the expiry forward, or :class:`LeaseLost` when another run took the lease over."""
        if self.generation is None:
            raise LeaseLost(f"lease {self.dir} is not held")
        newer = [g for g in self._generations() if g > self.generation]
        if newer:
            raise LeaseLost(f"the lease of {self.name} at {self.dir} was taken over by another run (it was not "
                            f"renewed within {self.ttl:.0f} s); this run stops")
        self.storage.write_text(self._file(self.generation), self._doc())

    def release(self) -> None:
        """Give the lease up at once (a clean stop), so the next run need not wait for the expiry."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)
        if self.generation is not None and not any(g > self.generation for g in self._generations()):
            self.storage.delete(self._file(self.generation))
        self.generation = None

    def keep_renewed(self, on_lost: Callable[[Exception], None]) -> None:
        """Renew every ``ttl / 3`` seconds in a daemon thread until :meth:`release`; ``on_lost`` is called
        once when the lease is lost or cannot be renewed before it expires."""
        def loop() -> None:
            last_ok = self.clock()
            while not self._stop.wait(self.ttl / 3):
                try:
                    self.renew()
                    last_ok = self.clock()
                except LeaseLost as e:
                    on_lost(e)
                    return
                except Exception as e:  # noqa: BLE001 - the store may be briefly unreachable: retry until expiry
                    if self.clock() - last_ok >= self.ttl:
                        on_lost(LeaseLost(f"the lease of {self.name} could not be renewed for {self.ttl:.0f} s: {e}"))
                        return

        self._thread = threading.Thread(target=loop, name=f"trickle-lease-{self.name}", daemon=True)
        self._thread.start()


def run_lease(catalog: Any, conf_path: str | os.PathLike[str], ttl: float | None = None) -> Lease:
    """The lease of ``trickle run <conf_path>`` on ``catalog``'s store: named by the conf file's name, so the
    same file run twice against one warehouse (from any machine) conflicts."""
    name = "run-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(os.fspath(conf_path)))
    return Lease(catalog.storage, join(catalog.root, "leases"), name, ttl=ttl)
