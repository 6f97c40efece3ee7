"""A real PostgreSQL server as a local process, configured for logical decoding (Debezium), for tests and demos.

Why a real server and not a fake: the Debezium connector reads PostgreSQL's write-ahead log through a
replication slot and the ``pgoutput`` plugin; only a real server produces real LSNs, transactions, TOAST and
TRUNCATE messages. Why not Docker: the project must run where no container engine exists, and the server
binaries are one ``apt-get install postgresql`` away (see :func:`find_pg_bindir` for where they are looked
for). The cluster is a throw-away: ``initdb`` into the workdir, trust authentication on the loopback
interface only, fsync off.

Usage::

    with PostgresServer(tmp_path / "pg") as pg:                  # start(): initdb once, launch, wait
        pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        pg.query("SELECT id, v FROM t")                           # [("1", "a"), ...]: text, None for NULL
        pg.dsn                                                    # postgresql://postgres@127.0.0.1:<port>/postgres

Everything lives in ``workdir``: ``data/`` (the cluster; its ``trickle.conf`` holds the settings below),
``postgres.log`` (the server's stderr), ``initdb.log`` and ``postgres.json`` (the port, so a restart on the
same workdir keeps the same address -- a Debezium connector's offsets and config name it).

Running as root: PostgreSQL refuses to, so the server runs as the ``postgres`` system user (or the one named
by ``TRICKLE_PG_OS_USER``), switched to by ``subprocess`` itself (``user=``/``group=``, the setuid that
``runuser``/``setpriv`` would do, without depending on either tool or PAM). That user must be able to reach
the data directory; a workdir under a private directory (pytest's ``/tmp/pytest-of-root`` is mode 0700) is
not reachable, so then the cluster goes to a fresh directory under the system temp dir instead, ``data`` in
the workdir becomes a symlink to it, and it is deleted by :meth:`PostgresServer.destroy` or at interpreter
exit (it survives stop/start/kill within the process, not across processes).

Only the standard library is used: statements run through ``psql`` (no Python driver to install).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from services.process import LOG_TAIL_LINES, ManagedProcess, free_ports, tail

__all__ = ["PostgresServer", "PostgresServiceError", "find_pg_bindir"]

HOST = "127.0.0.1"  # loopback only: never expose a trust-authenticated server
SUPERUSER = "postgres"  # initdb -U: the same role name whoever runs the server
OS_USER_ENV = "TRICKLE_PG_OS_USER"  # the system user to run as when we are root (default "postgres")
BINDIR_ENV = "TRICKLE_PG_BINDIR"  # where initdb/postgres/psql live, when auto-detection is not wanted
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux (104 on BSDs) including "/.s.PGSQL.<port>"
# Small on purpose: a test cluster holds kilobytes and shares 2 cores with Spark and two JVMs.
# wal_level=logical plus senders and slots are what Debezium needs. fsync and full_page_writes off only risk
# data on an operating-system crash; a killed server (kill -9, what crash tests do) loses nothing, because
# synchronous_commit stays on: with it off, a commit acknowledged just before the kill could vanish.
SERVER_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "max_connections": "40",
    "shared_buffers": "16MB",
    "fsync": "off",
    "full_page_writes": "off",
    "timezone": "'UTC'",  # deterministic timestamptz text in tests
    "log_timezone": "'UTC'",
    "logging_collector": "off",  # stderr goes to postgres.log through the descriptor we hand it
    "log_line_prefix": "'%m [%p] '",
}


class PostgresServiceError(RuntimeError):
    """The local PostgreSQL server could not be found, initialised, started or queried."""


# ------------------------------------------------------------------------------------------ binaries


def _has_server(d: Path) -> bool:
    return all(os.access(d / exe, os.X_OK) for exe in ("postgres", "initdb", "pg_ctl"))


def _version_key(path: Path) -> tuple[int, ...]:
    """(15,) for /usr/lib/postgresql/15/bin, (16, 2) for /usr/pgsql-16.2/bin: newest first when sorted."""
    return tuple(int(n) for n in re.findall(r"\d+", str(path)))


def find_pg_bindir() -> Path:
    """The folder holding PostgreSQL's server programs (``initdb``, ``postgres``, ``pg_ctl``, ``psql``).

    Why a search: distributions keep them off ``PATH`` (Debian/Ubuntu ``/usr/lib/postgresql/<major>/bin``,
    the PGDG RPMs ``/usr/pgsql-<major>/bin``) and the major version differs between machines. Order:
    ``$TRICKLE_PG_BINDIR``; ``pg_config --bindir`` (right whenever the server package matches the
    ``pg_config`` installed); ``postgres`` on ``PATH`` (Homebrew, Fedora, Arch); the newest of the
    distribution folders.
    """
    env = os.environ.get(BINDIR_ENV)
    if env:
        if _has_server(Path(env)):
            return Path(env)
        raise PostgresServiceError(f"${BINDIR_ENV}={env} does not hold initdb, postgres and pg_ctl.")
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    globbed = [*Path("/usr/lib/postgresql").glob("*/bin"), *Path("/usr").glob("pgsql-*/bin")]
    candidates += sorted(globbed, key=_version_key, reverse=True)
    for d in candidates:
        if _has_server(d):
            return d
    raise PostgresServiceError(
        "PostgreSQL server programs (initdb, postgres, pg_ctl) not found: install the server package "
        "(Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew "
        f"install postgresql) or set {BINDIR_ENV} to the folder holding them."
    )


# ----------------------------------------------------------------------------------------- helpers


def _clean_env() -> dict[str, str]:
    """The environment minus libpq's PG* variables: a developer's PGHOST/PGPORT/PGOPTIONS/PGDATA must not
    redirect or reconfigure what the harness runs (every program gets explicit -D/-h/-p/-U/-d)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"  # initdb --locale=C and the server's messages must not depend on the machine
    return env


class _OsUser:
    """The unprivileged system user the server runs as when this process is root."""

    def __init__(self, name: str) -> None:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise PostgresServiceError(
                f"PostgreSQL refuses to run as root and there is no {name!r} system user to run it as. "
                f"Create one (Debian: it comes with apt-get install postgresql; else useradd --system "
                f"{name}), set {OS_USER_ENV} to another unprivileged user, or run as a non-root user."
            ) from None
        if pw.pw_uid == 0:
            raise PostgresServiceError(f"{OS_USER_ENV}={name} is a root account; PostgreSQL refuses to run as root.")
        self.name = name
        self.uid = pw.pw_uid
        self.gid = pw.pw_gid
        self.groups = os.getgrouplist(name, pw.pw_gid)

    def popen_kwargs(self) -> dict[str, Any]:
        # setgroups/setregid/setreuid in the child just before exec: real and effective ids both become the
        # user's (postgres also refuses to run when they differ).
        return {"user": self.uid, "group": self.gid, "extra_groups": self.groups}

    def can_reach(self, path: Path) -> bool:
        """Whether the user may search every directory down to ``path`` (by mode bits; ACLs are ignored,
        which can only make us choose the temp-dir fallback needlessly, never wrongly)."""
        for d in [*reversed(path.parents), path]:
            try:
                st = d.stat()
            except OSError:
                return False
            if st.st_uid == self.uid:
                bit = stat.S_IXUSR
            elif st.st_gid in self.groups:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return False
        return True

    def chown(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid)


# -------------------------------------------------------------------------------------------- server


class PostgresServer(ManagedProcess):
    """One PostgreSQL cluster running as a child process, listening on ``127.0.0.1:<port>``.

    Use it as a context manager, or call ``start()`` / ``stop()``. The postmaster runs in its own process
    group, so ``kill()`` (a real ``kill -9`` of it and every backend, as a crash would) reaches all of it
    and a later ``start()`` on the same workdir goes through crash recovery like a production server. A
    server still running when the interpreter exits is killed by an ``atexit`` hook.

    ``database`` is created on first start if missing (``postgres`` always exists); ``execute``/``query``
    use it unless told otherwise. The superuser is ``postgres`` with trust authentication, for normal and
    replication connections, from the loopback interface and the Unix socket only.

    Cost on a busy 2-core machine: about 1-2 s for initdb (first start only), under 1 s to start or stop.
    """

    def __init__(self, workdir: Path, port: int | None = None, database: str = "postgres") -> None:
        super().__init__(workdir)
        saved = self._saved_state()
        self.port: int = port if port is not None else int(saved.get("port") or free_ports(1)[0])
        self.database = database
        self.user = SUPERUSER
        self.log_file = self.workdir / "postgres.log"
        self.bindir = find_pg_bindir()
        self._os_user: _OsUser | None = (
            _OsUser(os.environ.get(OS_USER_ENV, "postgres")) if os.geteuid() == 0 else None
        )
        self._external: Path | None = None  # the temp-dir cluster when the OS user cannot reach the workdir
        self.data_dir = self._choose_data_dir(saved.get("data_dir"))

    def __repr__(self) -> str:
        return f"PostgresServer(dsn={self.dsn!r}, pid={self.pid}, workdir={str(self.workdir)!r})"

    # -- state ----------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def dsn(self) -> str:
        """libpq URI of ``database`` as the superuser (no password: trust authentication)."""
        return f"postgresql://{self.user}@{HOST}:{self.port}/{self.database}"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{HOST}:{self.port}/{self.database}"

    def _saved_state(self) -> dict[str, Any]:
        try:
            raw = json.loads((self.workdir / "postgres.json").read_text())
            return raw if isinstance(raw, dict) else {}
        except (OSError, ValueError):
            return {}

    def _choose_data_dir(self, saved: Any) -> Path:
        """``workdir/data``, or (root, unreachable workdir) a directory under the system temp dir."""
        inside = self.workdir / "data"
        ou = self._os_user
        if ou is None or ou.can_reach(self.workdir):
            if inside.is_symlink():  # left by an earlier run that needed the fallback
                inside.unlink()
            return inside
        if isinstance(saved, str) and Path(saved).is_dir() and saved != str(inside):
            self._external = Path(saved)  # same process restarting on this workdir: keep the cluster
        else:
            self._external = Path(tempfile.mkdtemp(prefix="trickle-pg-"))
            ou.chown(self._external)
        if inside.is_symlink() or inside.exists():
            if inside.is_symlink() or inside.is_file():
                inside.unlink()
            else:
                shutil.rmtree(inside)
        inside.symlink_to(self._external, target_is_directory=True)
        atexit.register(self._remove_external_at_exit)
        return self._external

    # -- configuration --------------------------------------------------------------------------

    def _settings(self) -> dict[str, str]:
        socket_dir = str(self.data_dir)
        if len(socket_dir) + len(f"/.s.PGSQL.{self.port}") > _SOCKET_PATH_MAX:
            socket_dir = ""  # too long for a Unix socket path: TCP only (every client here uses TCP)
        return {
            **SERVER_SETTINGS,
            "listen_addresses": f"'{HOST}'",
            "port": str(self.port),
            "unix_socket_directories": "'" + socket_dir.replace("'", "''") + "'",
        }

    def _write_config(self) -> None:
        (self.data_dir / "trickle.conf").write_text(
            "# written by services/postgres.py on every start\n"
            + "".join(f"{k} = {v}\n" for k, v in self._settings().items())
        )
        (self.workdir / "postgres.json").write_text(
            json.dumps({"port": self.port, "data_dir": str(self.data_dir)}) + "\n"
        )

    def _initdb(self, timeout_s: float) -> None:
        """initdb once (trust auth, C locale, UTF-8, no fsync), then pg_hba.conf and the include of our
        settings; later starts reuse the cluster."""
        if (self.data_dir / "PG_VERSION").is_file():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if any(self.data_dir.iterdir()):  # a half-made cluster from an interrupted initdb
            for child in self.data_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        self.data_dir.chmod(0o700)
        if self._os_user is not None:
            self._os_user.chown(self.data_dir)
        cmd = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]
        log = self.workdir / "initdb.log"
        try:
            with open(log, "wb") as out:
                proc = subprocess.run(
                    cmd,
                    cwd=self.data_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=_clean_env(),
                    timeout=max(timeout_s, 1.0),
                    **self._user_kwargs(),
                )
        except subprocess.TimeoutExpired as e:
            raise PostgresServiceError(f"initdb of {self.data_dir} timed out.\n{tail(log)}") from e
        if proc.returncode != 0:
            raise PostgresServiceError(
                f"initdb of {self.data_dir} failed (exit {proc.returncode}):\n--- {log} ---\n{tail(log)}"
            )
        # Trust for everything, normal and replication, but only from the loopback address / the socket.
        (self.data_dir / "pg_hba.conf").write_text(
            "# written by services/postgres.py: a throw-away test cluster on 127.0.0.1\n"
            "local   all          all                 trust\n"
            "local   replication  all                 trust\n"
            f"host    all          all   {HOST}/32  trust\n"
            f"host    replication  all   {HOST}/32  trust\n"
        )
        with open(self.data_dir / "postgresql.conf", "a") as f:
            f.write("\ninclude_if_exists = 'trickle.conf'\n")

    def _user_kwargs(self) -> dict[str, Any]:
        return self._os_user.popen_kwargs() if self._os_user is not None else {}

    # -- lifecycle ------------------------------------------------------------------------------

    def _launch(self, deadline: float) -> None:
        self._initdb(deadline - time.monotonic())
        self._write_config()
        self._spawn([str(self.bindir / "postgres"), "-D", str(self.data_dir)], cwd=self.data_dir,
                    output=self.log_file, env=_clean_env(), **self._user_kwargs())

    def _wait_ready(self, deadline: float) -> None:
        """Ready means the server accepts connections and ``database`` exists."""
        self._wait_accepting(deadline)
        if self.database != "postgres":
            self.create_database(self.database, exist_ok=True)

    def _wait_accepting(self, deadline: float) -> None:
        isready = [str(self.bindir / "pg_isready"), "-q", "-h", HOST, "-p", str(self.port), "-U", self.user,
                   "-d", "postgres"]
        while True:
            self._check_alive(PostgresServiceError, "PostgreSQL")
            with contextlib.suppress(subprocess.TimeoutExpired):
                r = subprocess.run(isready + ["-t", "2"], env=_clean_env(), capture_output=True, timeout=5)
                if r.returncode == 0:
                    return
            if time.monotonic() >= deadline:
                raise PostgresServiceError(
                    f"PostgreSQL on {HOST}:{self.port} was not ready in time.\n{self._diagnostics()}"
                )
            time.sleep(0.1)

    def _diagnostics(self) -> str:
        return f"--- last {LOG_TAIL_LINES} lines of {self.log_file} ---\n{tail(self.log_file)}"

    def _request_stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Fast shutdown (SIGINT: abort open transactions, checkpoint, exit). Replication clients
        (Debezium) are disconnected."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)  # the postmaster alone: it shuts its children down

    def _force_stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Immediate shutdown (SIGQUIT), and then SIGKILL if that hangs too."""
        self._signal_group(signal.SIGQUIT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            super()._force_stop(proc)

    def destroy(self) -> None:
        """Stop the server and delete the cluster (wherever it lives): for fixtures' teardown."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        inside = self.workdir / "data"
        if inside.is_symlink():
            inside.unlink()
        self._external = None
        with contextlib.suppress(OSError):
            (self.workdir / "postgres.json").unlink()

    def _remove_external_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()
            if self._external is not None:
                shutil.rmtree(self._external, ignore_errors=True)

    # -- SQL ------------------------------------------------------------------------------------

    def _psql(self, sql: str, database: str | None, extra: list[str], timeout_s: float) -> str:
        psql = self.bindir / "psql"
        exe = str(psql) if os.access(psql, os.X_OK) else (shutil.which("psql") or "psql")
        cmd = [
            exe,
            "-X",  # no ~/.psqlrc
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            HOST,
            "-p",
            str(self.port),
            "-U",
            self.user,
            "-d",
            database or self.database,
            *extra,
            "-f",
            "-",
        ]
        try:
            proc = subprocess.run(
                cmd, input=sql, capture_output=True, text=True, env=_clean_env(), timeout=timeout_s
            )
        except subprocess.TimeoutExpired as e:
            raise PostgresServiceError(f"psql timed out after {timeout_s} s running:\n{sql}") from e
        if proc.returncode != 0:
            raise PostgresServiceError(
                f"psql failed (exit {proc.returncode}) running:\n{sql}\n--- psql ---\n{proc.stderr.strip()}\n"
                + self._diagnostics()
            )
        return proc.stdout

    def execute(self, sql: str, database: str | None = None, timeout_s: float = 60) -> None:
        """Run SQL statements, each in its own transaction unless the text has BEGIN/COMMIT (psql reads
        them as a script, so ``CREATE DATABASE`` works too). Stops at the first error and raises it."""
        self._psql(sql, database, [], timeout_s)

    def query(self, sql: str, database: str | None = None, timeout_s: float = 60) -> list[tuple[str | None, ...]]:
        """Rows of one query (SELECT, VALUES, WITH ...) as tuples of PostgreSQL's text output, SQL NULL as
        None. Cast in SQL when another text form is wanted.

        Why ``COPY (query) TO STDOUT``: its text format escapes backslashes, tabs and newlines inside values
        and writes NULL as ``\\N``, so NULL, '' and any text come back apart (psql's aligned or CSV output
        prints NULL and '' alike)."""
        body = sql.strip().rstrip(";").strip()
        out = self._psql(f"COPY ({body}) TO STDOUT", database, [], timeout_s)
        return [
            tuple(None if f == "\\N" else _COPY_ESCAPE.sub(_unescape, f) for f in line.split("\t"))
            for line in out.split("\n")[:-1]
        ]

    def create_database(self, name: str, *, exist_ok: bool = False) -> None:
        """CREATE DATABASE ``name`` (an identifier, quoted as such); ``exist_ok`` makes it idempotent."""
        quoted = '"' + name.replace('"', '""') + '"'
        literal = "'" + name.replace("'", "''") + "'"
        if exist_ok and self.query(f"SELECT 1 FROM pg_database WHERE datname = {literal}", database="postgres"):
            return
        self.execute(f"CREATE DATABASE {quoted}", database="postgres")


_COPY_ESCAPE = re.compile(r"\\(.)", re.S)
_COPY_CHARS = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _unescape(m: re.Match[str]) -> str:
    """One backslash sequence of COPY's text format (``\\\\`` -> ``\\``, ``\\n`` -> newline, ...)."""
    c = m.group(1)
    return _COPY_CHARS.get(c, c)
