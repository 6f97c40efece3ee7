"""The fused path's refresh lanes: each IMMEDIATE table a mirror's micro-batch feeds is refreshed by a thread of
its own, beside ingestion, not inside the batch.

Why: with the refreshes inside ``foreachBatch`` (the first fused path), a batch ended only when every table
it fed was refreshed. Profiled at 5k events/s, those refreshes were 54% of the ingestion batches' time; the
next batch's events waited for them, so latency grew with the rate instead of staying flat, and one slow or
failing table held back the ingestion of its topic and every table refreshed after it in the batch.

Here a batch commits its mirror, *marks* the tables it feeds (:func:`pipeline.fused.fed_by`), and waits
for the refreshes that cover its marks, but only up to a budget (``runtime.fused_wait_seconds``), and not
at all for a lane backing off after a failure or one that already kept a batch waiting that long (*late*)
and is still in that refresh. Each table's lane refreshes it as soon as the lane is
free. Marks that arrive while it refreshes coalesce into one more refresh, which covers every batch
committed meanwhile: a refresh reads from the frontier in the stream table's own commit to the sources'
latest versions, never from the batch. So exactly-once is untouched (what to apply is still decided by the
frontier), and a kill -9 at any point leaves at most marks unserved: the runtime marks every fused table
once at start (the catch-up).

Why wait at all: on a small machine, refreshes running *beside* the ingestion's next batch made both slower
(the driver's GIL and the cores are shared), and so the latency from producer to stream table too (figures in
docs/BENCHMARKS.md, "Figures behind the code"). So in the normal case a batch and its refreshes still run back
to back, and only a table slower than the budget, or failing, is left to its lane while the ingestion goes on.

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
    attempts: int = 0  # refreshes finished, succeeded or failed: what a batch's ticket waits for
    late: bool = False  # a batch gave up waiting for the refresh in flight


class RefreshLanes:
    """One lane (a daemon thread) per table; :meth:`mark` never blocks on a refresh, :meth:`wait` does, up
    to its timeout."""

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

    def mark(self, names: Iterable[str], why: str) -> dict[str, int]:
        """``names`` have new input: each lane refreshes once more after what it is doing now. Names
        without a lane are ignored (the lane, when opened, marks itself).

        Returns a ticket per lane for :meth:`wait`: the attempt that will cover this mark (the next one,
        or the one after the refresh in flight). None for a lane backing off after a failure, nor for a
        late one (see :meth:`wait`)."""
        tickets: dict[str, int] = {}
        with self._cv:
            now = time.monotonic()
            for name in names:
                lane = self._lanes.get(name)
                if lane is None:
                    continue
                if not lane.late and lane.retry_at <= now:
                    tickets[name] = lane.attempts + (2 if lane.refreshing else 1)
                if not lane.marked:
                    lane.marked, lane.why = True, why
            self._cv.notify_all()
        return tickets

    def wait(self, tickets: dict[str, int], timeout_s: float) -> list[str]:
        """Wait until the refreshes of ``tickets`` (from :meth:`mark`) have finished, succeeded or failed,
        for at most ``timeout_s``; returns the names not done then. Those are *late* until their refresh in
        flight ends: later batches do not wait for them, so a slow table costs the ingestion one budget."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                late = [n for n, t in tickets.items()
                        if (lane := self._lanes.get(n)) is not None and not lane.closed and lane.attempts < t]
                left = deadline - time.monotonic()
                if not late:
                    return late
                if left <= 0:
                    for n in late:
                        self._lanes[n].late = True
                    return late
                self._cv.wait(left)

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
                    lane.attempts, lane.late = lane.attempts + 1, False
                    failures = lane.failures
                    self._cv.notify_all()  # wait()
                self._report(self._failed, lane.name, e, why, failures, delay)
                continue
            with self._cv:
                lane.failures, lane.retry_at, lane.refreshing, lane.late = 0, 0.0, False, False
                lane.attempts += 1
                self._cv.notify_all()  # wait()
            self._report(self._done, lane.name, result, why)

    @staticmethod
    def _report(callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # noqa: BLE001, S110 - a logger that fails must not end the lane
            pass
