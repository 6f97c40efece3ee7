"""A refresh's bookkeeping, written by one background worker after the refresh has committed and returned.

What: the refresh record in the history and the stream table's new state (frontier, last refresh, AUTO's cost
model) in its catalog slot (:meth:`pipeline.refresh.Refresher._record_ok`).

Why: both are written after the commit, and neither is read by the refresh that writes them. In a small
refresh they cost ~0.5 ms of ~20 ms, written after its delta and its commit had pushed the catalog's code out
of the processor's caches (docs/BENCHMARKS.md, "Session 61"). On a worker they overlap whatever the caller
does next: the next table's refresh in a scheduler, the caller's own work after a manual refresh.

Why it is safe:

- *Readers in this process see them.* Every catalog read or write of a stream table first waits for its
  queued bookkeeping (:func:`settle`, called by :class:`pipeline.catalog.Catalog` for the table's name), so a
  refresh, ``status``, ``history`` or an ALTER that follows a refresh finds its record and state, exactly as
  when they were written inline. The key is the table's definition file, so two ``Catalog`` objects of one root
  share it.
- *Another process* may read the state one refresh behind for about a millisecond, as it could while a
  refresh was between its commit and its record before.
- *A crash* before the worker wrote them leaves the catalog one refresh behind its table, the case the refresh
  path already repairs from the table's own log (the commit carries the refresh record; see
  :mod:`pipeline.refresh`), as after a crash between commit and record before.
- *A failure* (a full disk) is not lost: the failed bookkeeping is run again by the next :func:`settle` of its
  table, in the caller's thread, and a second failure raises there.

One worker runs the jobs in the order they were queued; the interpreter joins it at exit. The worker's own
catalog calls do not wait for themselves (:func:`settle` returns at once on the worker). A forked child starts
with nothing queued (its parent writes its own).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

_log = logging.getLogger(__name__)

_worker: ThreadPoolExecutor | None = None
#: the queued job per key, with the job itself (run again by :func:`settle` when it failed)
_queued: dict[str, tuple[Future[None], Callable[[], None]]] = {}
_lock = threading.Lock()
_on_worker = threading.local()


def later(key: str, job: Callable[[], None]) -> None:
    """Run ``job`` on the worker; :func:`settle` of ``key`` waits for it. A job queued for a key that still has
    one waits for that one first (the worker runs jobs in order)."""
    global _worker
    with _lock:
        before = _queued.get(key)
    if before is not None and before[0].done() and before[0].exception() is not None:
        settle(key)  # the failed one is written first, here (replacing its entry would lose it)
    with _lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trickle-bookkeeping",
                                         initializer=_mark_worker)
        entry = (_worker.submit(job), job)
        _queued[key] = entry
    entry[0].add_done_callback(lambda f: _forget(key, f))


def settle(key: str | None = None) -> None:
    """Wait until the bookkeeping queued for ``key`` (every key when None) is written. One that failed on the
    worker is run again here, and raises when it fails again."""
    if getattr(_on_worker, "yes", False):
        return
    with _lock:
        if not _queued:
            return
        waiting = list(_queued.items()) if key is None else (
            [(key, _queued[key])] if key in _queued else [])
    for k, (future, job) in waiting:
        error = future.exception()
        if error is None:
            continue
        _log.warning("bookkeeping of %s failed on the worker (%s); writing it again", k,
                     str(error).splitlines()[0][:300] if str(error) else type(error).__name__)
        with _lock:
            if _queued.get(k, (None,))[0] is future:
                del _queued[k]
        job()


def _mark_worker() -> None:
    _on_worker.yes = True


def _forked() -> None:
    """A forked child has no worker: it starts with none queued (the parent's are written by the parent)."""
    global _worker, _lock
    _worker, _lock = None, threading.Lock()
    _queued.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _forget(key: str, future: Future[None]) -> None:
    """Drop a finished job, unless it failed (:func:`settle` runs it again) or a newer one replaced it."""
    if future.exception() is not None:
        return
    with _lock:
        if _queued.get(key, (None,))[0] is future:
            del _queued[key]
