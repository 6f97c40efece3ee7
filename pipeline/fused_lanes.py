"""The fused path's refresh lanes: each IMMEDIATE table a mirror's micro-batch feeds is refreshed by a thread of
its own, beside ingestion, not inside the batch.

Why: with the refreshes inside ``foreachBatch`` (the first fused path), a batch ended only when every table
it fed was refreshed. Profiled at 5k events/s, those refreshes were 54% of the ingestion batches' time; the
next batch's events waited for them, so latency grew with the rate instead of staying flat, and one slow or
failing table held back the ingestion of its topic and every table refreshed after it in the batch.

Here a batch commits its mirror, *marks* the tables it feeds (:func:`pipeline.fused.fed_by`) and returns.
Each table's lane refreshes it as soon as the lane is free. Marks that arrive while it refreshes coalesce
into one more refresh, which covers every batch committed meanwhile: a refresh reads from the frontier in
the stream table's own commit to the sources' latest versions, never from the batch. So the refresh rate
adapts to the ingestion rate (fewer, larger refreshes under load), exactly-once is untouched (what to apply
is still decided by the frontier), and a kill -9 at any point leaves at most marks unserved: the runtime
marks every fused table once at start (the catch-up).

Order between lanes does not matter for correctness: a refresh first refreshes its stale upstream stream
tables itself, under their per-table locks (:meth:`pipeline.refresh.Refresher.refresh`), so a downstream
lane that runs before its upstream's lane still sees a consistent upstream.

A lane whose refresh raises retries after ``backoff(n)`` seconds (n = failures in a row); marks in between
do not cut the back-off short, or a table that fails on its data would be retried with every batch. Only
its own lane waits: the ingestion and the other lanes go on (issue [F] point 5).

Threads and injected callables only, no Spark: tested in tests/test_fused_lanes.py; wired by
:class:`pipeline.runtime.Runtime`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: ``refresh(name)`` -> its result; ``done(name, result, why)``; ``failed(name, error, why, failures, retry_in)``
Refresh = Callable[[str], Any]
Done = Callable[[str, Any, str], None]
Failed = Callable[[str, BaseException, str, int, float], None]


@dataclass
class _Lane:
    name: str
    thread: threading.Thread | None = None
    marked: bool = False
    why: str = ""
    failures: int = 0
    retry_at: float = 0.0  # time.monotonic() before which a failed lane does not refresh
    refreshing: bool = False
    closed: bool = False
    refreshes: int = 0


class RefreshLanes:
    """One lane (a daemon thread) per table; :meth:`mark` never blocks on a refresh."""

    def __init__(self, refresh: Refresh, done: Done, failed: Failed, backoff: Callable[[int], float]) -> None:
        self._refresh, self._done, self._failed, self._backoff = refresh, done, failed, backoff
        self._lanes: dict[str, _Lane] = {}
        self._cv = threading.Condition()
        self._stopping = False

    def open(self, name: str, why: str = "the start") -> None:
        """Give ``name`` a lane (if it has none) and mark it once: it may have missed batches while it had
        none (at start, after a crash, or created while the pipeline runs)."""
        with self._cv:
            if self._stopping or name in self._lanes:
                return
            lane = _Lane(name, marked=True, why=why)
            lane.thread = threading.Thread(target=self._run, args=(lane,), name=f"trickle-fused-{name}",
                                           daemon=True)
            self._lanes[name] = lane
            lane.thread.start()

    def close(self, name: str) -> None:
        """Retire ``name``'s lane; a refresh in flight finishes, nothing after it starts."""
        with self._cv:
            lane = self._lanes.pop(name, None)
            if lane is not None:
                lane.closed = True
                self._cv.notify_all()

    def mark(self, names: Iterable[str], why: str) -> None:
        """``names`` have new input: each lane refreshes once more after what it is doing now. Names
        without a lane are ignored (the lane, when opened, marks itself)."""
        with self._cv:
            hit = False
            for name in names:
                lane = self._lanes.get(name)
                if lane is not None and not lane.marked:
                    lane.marked, lane.why, hit = True, why, True
            if hit:
                self._cv.notify_all()

    def names(self) -> set[str]:
        with self._cv:
            return set(self._lanes)

    def idle(self) -> bool:
        """No lane is marked or refreshing (a failed lane waiting for its retry is marked)."""
        with self._cv:
            return not any(lane.marked or lane.refreshing for lane in self._lanes.values())

    def stop(self, timeout_s: float = 120.0) -> None:
        """No more refreshes start; wait (at most ``timeout_s``) for those in flight. Marks left unserved are
        caught up at the next start."""
        with self._cv:
            self._stopping = True
            lanes = list(self._lanes.values())
            self._lanes.clear()
            for lane in lanes:
                lane.closed = True
            self._cv.notify_all()
        deadline = time.monotonic() + timeout_s
        for lane in lanes:
            if lane.thread is not None:
                lane.thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self, lane: _Lane) -> str | None:
        """Block until ``lane`` may refresh (its reason) or is closed (None)."""
        with self._cv:
            while True:
                if lane.closed:
                    return None
                wait = lane.retry_at - time.monotonic()
                if lane.marked and wait <= 0:
                    lane.marked, lane.refreshing = False, True
                    return lane.why
                self._cv.wait(wait if lane.marked else None)

    def _run(self, lane: _Lane) -> None:
        while (why := self._next(lane)) is not None:
            try:
                result = self._refresh(lane.name)
            except Exception as e:  # noqa: BLE001 - this lane retries with back-off; the others go on
                with self._cv:
                    lane.failures += 1
                    delay = self._backoff(lane.failures)
                    lane.retry_at = time.monotonic() + delay
                    lane.marked, lane.refreshing = True, False
                    lane.why = "its failed refresh"
                    failures = lane.failures
                self._report(self._failed, lane.name, e, why, failures, delay)
                continue
            with self._cv:
                lane.failures, lane.retry_at, lane.refreshing = 0, 0.0, False
                lane.refreshes += 1
                self._cv.notify_all()  # idle() waiters
            self._report(self._done, lane.name, result, why)

    @staticmethod
    def _report(callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # noqa: BLE001, S110 - a logger that fails must not end the lane
            pass
