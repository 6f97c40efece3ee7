"""The fused path's refresh lanes (pipeline/fused_lanes.py), with real threads and no Spark: marks coalesce,
a slow or failing table holds back only its own lane, failures back off, and stop waits for what is in
flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.fused_lanes import RefreshLanes

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit


def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class _Tables:
    """refresh() records each call; a table can be made to block until released, or to fail."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.failing: set[str] = set()
        self.done: list[tuple[str, str]] = []
        self.failed: list[tuple[str, int, float]] = []
        self.lock = threading.Lock()

    def refresh(self, name: str) -> str:
        with self.lock:
            self.calls.append(name)
        if name in self.gates:
            assert self.gates[name].wait(30), "gate never opened"
        if name in self.failing:
            raise RuntimeError(f"{name} is broken")
        return f"refreshed {name}"

    def count(self, name: str) -> int:
        with self.lock:
            return self.calls.count(name)

    def lanes(self, backoff: Callable[[int], float] = lambda n: 0.05 * n) -> RefreshLanes:
        return RefreshLanes(self.refresh, lambda n, r, why: self.done.append((n, why)),
                            lambda n, e, why, k, delay: self.failed.append((n, k, delay)), backoff)


def test_a_lane_refreshes_once_when_opened_then_once_per_mark() -> None:
    t = _Tables()
    lanes = t.lanes()
    lanes.open("a")
    _until(lambda: t.count("a") == 1 and lanes.idle())
    assert t.done == [("a", "the start")]
    lanes.mark(["a", "not_a_lane"], "a batch of orders")
    _until(lambda: t.count("a") == 2 and lanes.idle())
    assert t.done[-1] == ("a", "a batch of orders")
    time.sleep(0.1)
    assert t.count("a") == 2, "a lane refreshed without a mark"
    lanes.stop()


def test_marks_during_a_refresh_coalesce_into_one_more() -> None:
    t = _Tables()
    t.gates["a"] = threading.Event()
    lanes = t.lanes()
    lanes.open("a")
    _until(lambda: t.count("a") == 1)  # in flight, blocked
    for i in range(20):
        lanes.mark(["a"], f"batch {i}")
    t.gates["a"].set()
    _until(lambda: t.count("a") == 2 and lanes.idle())
    time.sleep(0.1)
    assert t.count("a") == 2, f"20 marks during one refresh gave {t.count('a') - 1} more refreshes, not 1"
    lanes.stop()


def test_a_slow_table_and_a_failing_table_hold_back_only_their_own_lanes() -> None:
    t = _Tables()
    t.gates["slow"] = threading.Event()
    t.failing.add("broken")
    lanes = t.lanes(backoff=lambda n: 0.02 * 2 ** (n - 1))
    for name in ("slow", "broken", "fast"):
        lanes.open(name)
    _until(lambda: t.count("fast") == 1 and t.count("slow") == 1)
    for i in range(5):
        lanes.mark(["slow", "broken", "fast"], f"batch {i}")
        _until(lambda i=i: t.count("fast") == i + 2)  # served while slow is stuck in its first refresh
    assert t.count("slow") == 1
    _until(lambda: len(t.failed) >= 3)
    attempts = [k for n, k, _ in t.failed if n == "broken"]
    assert attempts[:3] == [1, 2, 3], attempts
    delays = [d for n, _, d in t.failed if n == "broken"]
    assert delays[:3] == [0.02, 0.04, 0.08], "the back-off does not grow"
    t.failing.discard("broken")
    _until(lambda: any(n == "broken" for n, _ in t.done))
    assert ("broken", "its failed refresh") in t.done
    t.gates["slow"].set()
    _until(lambda: t.count("slow") == 2 and lanes.idle())
    lanes.stop()


def test_a_failed_lane_is_not_retried_before_its_back_off_by_new_marks() -> None:
    t = _Tables()
    t.failing.add("broken")
    lanes = t.lanes(backoff=lambda n: 60.0)
    lanes.open("broken")
    _until(lambda: len(t.failed) == 1)
    for i in range(10):
        lanes.mark(["broken"], f"batch {i}")
    time.sleep(0.2)
    assert t.count("broken") == 1, "marks cut a failed table's back-off short"
    assert not lanes.idle(), "a table waiting for its retry counts as work left"
    lanes.stop(timeout_s=1)


def test_stop_waits_for_the_refresh_in_flight_and_starts_no_other() -> None:
    t = _Tables()
    t.gates["a"] = threading.Event()
    lanes = t.lanes()
    lanes.open("a")
    lanes.open("b")
    _until(lambda: t.count("a") == 1 and t.count("b") == 1)
    lanes.mark(["a", "b"], "a batch")
    stopped: list[Any] = []
    stopper = threading.Thread(target=lambda: stopped.append(lanes.stop(timeout_s=10)))
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive(), "stop did not wait for the refresh in flight"
    t.gates["a"].set()
    stopper.join(10)
    assert stopped == [None]
    assert t.count("a") == 1, "a refresh started after stop"
    lanes.open("c")  # ignored once stopped
    lanes.mark(["a", "b", "c"], "late batch")
    time.sleep(0.1)
    assert t.count("c") == 0 and lanes.names() == set()


def test_a_closed_lane_refreshes_no_more() -> None:
    t = _Tables()
    lanes = t.lanes()
    lanes.open("a")
    _until(lambda: t.count("a") == 1 and lanes.idle())
    lanes.close("a")
    lanes.mark(["a"], "a batch")
    time.sleep(0.1)
    assert t.count("a") == 1
    lanes.open("a", why="re-opened")  # e.g. its followed sources changed
    _until(lambda: t.count("a") == 2)
    assert t.done[-1] == ("a", "re-opened")
    lanes.stop()


def test_a_batch_waits_for_the_refreshes_it_started_and_no_longer_than_its_budget() -> None:
    t = _Tables()
    t.gates["slow"] = threading.Event()
    t.gates["slow"].set()
    lanes = t.lanes(backoff=lambda n: 60.0)
    lanes.open("slow")
    lanes.open("fast")
    _until(lambda: lanes.idle())
    tickets = lanes.mark(["fast", "slow"], "batch 1")
    assert set(tickets) == {"fast", "slow"}
    assert lanes.wait(tickets, 10) == [], "the batch moved on before its refreshes finished"
    assert t.count("fast") == 2 and t.count("slow") == 2, "wait returned before the refreshes ran"
    t.gates["slow"].clear()
    started = time.monotonic()
    assert lanes.wait(lanes.mark(["fast", "slow"], "batch 2"), 0.3) == ["slow"]
    assert 0.3 <= time.monotonic() - started < 5
    tickets = lanes.mark(["fast", "slow"], "batch 3")
    assert set(tickets) == {"fast"}, "a batch waited again for a table that kept one waiting its whole budget"
    assert lanes.wait(tickets, 10) == []
    t.failing.add("fast")
    assert lanes.wait(lanes.mark(["fast"], "batch 4"), 10) == [], "a failed refresh is finished too"
    assert lanes.mark(["fast"], "batch 5") == {}, "a batch waits for a lane backing off after a failure"
    t.gates["slow"].set()
    lanes.stop(timeout_s=1)


def test_a_mark_during_a_refresh_waits_for_the_refresh_after_it() -> None:
    """Two sources' batches mark one table: the second batch's events are not in the refresh in flight, so
    it waits for the next one (which covers them)."""
    t = _Tables()
    t.gates["a"] = threading.Event()
    lanes = t.lanes()
    lanes.open("a")
    _until(lambda: t.count("a") == 1)
    tickets = lanes.mark(["a"], "a batch of customers")
    assert tickets == {"a": 2}
    t.gates["a"].set()
    assert lanes.wait(tickets, 10) == []
    assert t.count("a") == 2, "the batch went on before the refresh covering it had run"
    lanes.stop()
