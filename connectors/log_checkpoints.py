"""Log checkpoints of stream tables, written by one background worker instead of inside the refresh.

Why: spark-trickle's own commits are followed by a classic checkpoint every ``delta.checkpointInterval``
versions (see :func:`connectors.delta_rs.checkpoint_due`), and delta-rs took 17-25 ms to open the table and
write it, in a refresh of about 40 ms: one refresh in ten paid half again its time for a file no part of that
refresh reads (docs/BENCHMARKS.md, "Session 60"). delta-rs' ``create_checkpoint`` runs in Rust without the
GIL, so a worker thread writes it while the caller goes on.

Why it is safe: a checkpoint of version ``v`` is derived from the commits up to ``v``, which never change, so
writing it while later commits land is what any reader or writer of a Delta table may do; a checkpoint that
is late, or never written (the process killed), only makes readers replay a few more commits. The one thing
that must not happen is a worker writing into a table's folder after the table was dropped: the folder would
come back holding a ``_delta_log`` with a checkpoint and no commits. So whoever deletes a table's files, or
writes a checkpoint itself, first waits with :func:`settle`. One worker keeps the checkpoints of a table in
version order (``_last_checkpoint`` never goes back), and the interpreter joins it at exit.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from connectors import delta_rs
from connectors.storage import local_path

_log = logging.getLogger(__name__)

_worker: ThreadPoolExecutor | None = None
#: the newest checkpoint queued per local table folder (the worker runs them in order)
_queued: dict[str, Future[bool]] = {}
_lock = threading.Lock()


def write_later(path: str, version: int) -> Future[bool]:
    """Queue a checkpoint of the local table at ``path`` as of ``version`` (see the module docstring); the
    future answers whether one was written. The caller checked the table's features, as for
    :func:`connectors.delta_rs.checkpoint`."""
    global _worker
    folder = os.path.abspath(local_path(path) or path)
    with _lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trickle-checkpoint")
        future = _worker.submit(_write, path, folder, version)
        _queued[folder] = future
    future.add_done_callback(lambda f: _forget(folder, f))
    return future


def settle(path: str | None = None) -> None:
    """Wait until the checkpoints queued for the table at ``path`` (every table when None) are written."""
    with _lock:
        if path is None:
            waiting = list(_queued.values())
        else:
            found = _queued.get(os.path.abspath(local_path(path) or path))
            waiting = [found] if found is not None else []
    for future in waiting:  # the newest of a table: the worker ran its older ones first
        future.exception()


def _write(path: str, folder: str, version: int) -> bool:
    # a table dropped since (its commit gone) gets no checkpoint, and no folder back
    if not os.path.exists(os.path.join(folder, "_delta_log", f"{version:020d}.json")):
        return False
    try:
        return delta_rs.checkpoint(path, version, shared=False)
    except Exception as e:  # noqa: BLE001 - the commit has landed; the next checkpoint, or housekeeping, will do
        _log.warning("no log checkpoint of %s at version %d (%s)", path, version, str(e).splitlines()[0][:300])
        return False


def _forget(folder: str, future: Future[bool]) -> None:
    with _lock:
        if _queued.get(folder) is future:
            del _queued[folder]
