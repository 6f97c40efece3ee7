"""Unit tests of the scheduling core: pure Python, no Spark.

The scheduler takes its clock, its refresh and its status writer as callables, so these tests drive it
with a fake clock and a fake refresh that records calls and fails on demand: they test the decisions
(due times, waves, back-off, ERROR, skips), not Spark.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest

from pipeline.errors import CatalogError
from pipeline.schedule import (
    effective_schedules,
    next_due,
    parse_duration,
    schedule_interval,
    validate_schedule,
)
from pipeline.scheduler import Scheduler

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

T0 = datetime(2024, 1, 1, 0, 5, tzinfo=UTC).timestamp()


# --- helpers ----------------------------------------------------------------------------------------------


class FakeClock:
    """Epoch seconds that only move when the test says so."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeRefresh:
    """Records refreshes; ``fail[name] = k`` makes the next k refreshes of ``name`` raise (-1: always)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, name: str) -> str:
        with self.lock:
            self.calls.append(name)
            left = self.fail.get(name, 0)
            if left:
                self.fail[name] = left - 1 if left > 0 else left
                raise RuntimeError(f"boom in {name}\nsecond line")
        return f"ok:{name}"


class FixedRng(random.Random):
    """``random()`` returns a fixed value, to pin the jitter at its bounds."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def row(name: str, schedule: str | None = "1m", sources: Iterable[str] = (), status: str = "ACTIVE",
        refresh_mode: str = "AUTO", consecutive_errors: int = 0,
        last_refresh_at: float | None = None) -> dict[str, Any]:
    """A row shaped like ``StreamTables.status()`` (sources mix plain Delta tables and stream tables)."""
    return {"name": name, "schedule": schedule, "sources": sorted(sources), "status": status,
            "refresh_mode": refresh_mode, "consecutive_errors": consecutive_errors,
            "last_refresh_at": last_refresh_at}


class Harness:
    """A scheduler wired to fakes, plus the log and the set_status calls it made."""

    def __init__(self, rows: list[dict[str, Any]], **kw: Any) -> None:
        self.clock = FakeClock()
        self.refresh = FakeRefresh()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.statuses: list[tuple[str, str, str]] = []
        kw.setdefault("rng", random.Random(7))
        self.sched = Scheduler(self.refresh, lambda n, s, r: self.statuses.append((n, s, r)), clock=self.clock,
                               log=lambda e, f: self.events.append((e, f)), **kw)
        self.sched.sync(rows)

    def names(self, event: str) -> list[str]:
        return [f["name"] for e, f in self.events if e == event]

    def state(self, name: str) -> Any:
        return self.sched.tables()[name]


# --- next_due / schedule_interval -------------------------------------------------------------------------


def test_duration_next_due() -> None:
    assert next_due("30s", 100.0, 500.0) == 130.0
    assert next_due("1h30m", 0.0, 1.0) == 5400.0
    assert next_due("30s", None, 500.0) == 500.0  # never refreshed: due now


def test_cron_next_due_is_strictly_after_last_in_utc() -> None:
    at = datetime(2024, 1, 1, 0, 5, tzinfo=UTC).timestamp()
    ten = datetime(2024, 1, 1, 0, 10, tzinfo=UTC).timestamp()
    assert next_due("*/5 * * * *", at, at) == ten  # exactly on a fire time: the next one
    assert next_due("*/5 * * * *", at + 120.5, at) == ten
    assert next_due("@hourly", at, at) == datetime(2024, 1, 1, 1, tzinfo=UTC).timestamp()
    assert next_due("@daily", at, at) == datetime(2024, 1, 2, tzinfo=UTC).timestamp()
    assert next_due("* * * * * */15", at, at) == at + 15  # 6 fields: seconds last (croniter)
    assert next_due("@hourly", None, 42.0) == 42.0


def test_next_due_rejects_unresolved_and_bad_schedules() -> None:
    with pytest.raises(ValueError):
        next_due("CALCULATED", 0.0, 1.0)
    with pytest.raises(ValueError):
        next_due("every tuesday", 0.0, 1.0)


def test_schedule_interval_uses_typical_cron_gap() -> None:
    assert schedule_interval("90s") == 90
    assert schedule_interval("@hourly") == 3600
    assert schedule_interval("*/5 * * * *") == 300
    assert schedule_interval("0 9 * * 1-5") == 86400  # weekdays: daily, not the weekend gap
    assert schedule_interval("* * * * * */10") == 10


def test_existing_schedule_helpers_still_work() -> None:
    assert parse_duration("1h30m") == 5400
    assert validate_schedule("calculated") == "CALCULATED"
    assert validate_schedule("5M") == "5m"
    assert validate_schedule("@hourly") == "@hourly"
    with pytest.raises(CatalogError):
        validate_schedule("soon")


# --- CALCULATED --------------------------------------------------------------------------------------------


def test_calculated_chain_takes_the_consumer_schedule() -> None:
    tables = {"a": "CALCULATED", "b": "CALCULATED", "c": "5m"}
    assert effective_schedules(tables, {"a": {"b"}, "b": {"c"}}) == {"a": "5m", "b": "5m", "c": "5m"}


def test_calculated_diamond_takes_the_tightest_consumer() -> None:
    # src feeds l and r; both feed d. l is CALCULATED too, so src sees d's schedule through l.
    tables = {"src": "CALCULATED", "l": "CALCULATED", "r": "1h", "d": "*/5 * * * *"}
    consumers = {"src": {"l", "r"}, "l": {"d"}, "r": {"d"}}
    out = effective_schedules(tables, consumers)
    assert out == {"src": "*/5 * * * *", "l": "*/5 * * * *", "r": "1h", "d": "*/5 * * * *"}
    # A duration tighter than the cron's typical gap wins.
    assert effective_schedules({**tables, "r": "2m"}, consumers)["src"] == "2m"


def test_calculated_without_scheduled_consumer_gets_default() -> None:
    assert effective_schedules({"a": "CALCULATED"}, {}) == {"a": "1m"}
    assert effective_schedules({"a": "CALCULATED", "b": "CALCULATED"}, {"a": {"b"}}, default="30s") == {
        "a": "30s", "b": "30s"}


def test_immediate_consumer_counts_as_default_and_stays_unscheduled() -> None:
    assert effective_schedules({"a": "CALCULATED", "i": None}, {"a": {"i"}}) == {"a": "1m", "i": None}
    assert effective_schedules({"a": "CALCULATED", "i": None, "f": "10s"}, {"a": {"i", "f"}})["a"] == "10s"
    assert effective_schedules({"a": "CALCULATED", "i": None, "s": "1h"}, {"a": {"i", "s"}})["a"] == "1m"


def test_calculated_cycle_resolves_without_recursing() -> None:
    """A cycle of stream tables (allow_circular): the member being resolved adds no candidate, so the
    resolution ends; a consumer outside the cycle still sets its members' schedule."""
    assert effective_schedules({"a": "CALCULATED", "b": "CALCULATED"}, {"a": {"b"}, "b": {"a"}}) == {
        "a": "1m", "b": "1m"}
    assert effective_schedules({"a": "CALCULATED", "b": "CALCULATED", "c": "10s"},
                               {"a": {"b"}, "b": {"a", "c"}}) == {"a": "10s", "b": "10s", "c": "10s"}


def test_sync_resolves_calculated_through_sources() -> None:
    h = Harness([row("a", "CALCULATED", ["orders"]), row("b", "10s", ["a"]), row("i", None, ["a"],
                                                                                  refresh_mode="IMMEDIATE")])
    states = h.sched.tables()
    assert states["a"].schedule == "10s" and states["a"].declared_schedule == "CALCULATED"
    assert states["a"].upstream == set()  # orders is a plain Delta table
    assert states["b"].upstream == {"a"}
    assert states["i"].schedule is None and states["i"].next_attempt is None


# --- waves ------------------------------------------------------------------------------------------------


def test_waves_follow_topological_order_with_diamond() -> None:
    h = Harness([row("a", sources=["orders"]), row("b", sources=["a"]), row("c", sources=["a"]),
                 row("d", sources=["b", "c"]), row("x", sources=["orders"])])
    assert h.sched.due(h.clock()) == [["a", "x"], ["b", "c"], ["d"]]
    h.sched.tick()
    assert h.refresh.calls.index("a") < min(h.refresh.calls.index("b"), h.refresh.calls.index("c"))
    assert h.refresh.calls[-1] == "d"
    assert h.sched.due(h.clock()) == []


def test_waves_order_through_a_table_that_is_not_due() -> None:
    h = Harness([row("a", "10s"), row("b", "1h", ["a"]), row("c", "10s", ["b"])])
    h.sched.tick()
    h.clock.t += 10
    assert h.sched.due(h.clock()) == [["a"], ["c"]]  # c reads a through b: still after a


def test_due_respects_schedule_and_anchor() -> None:
    h = Harness([row("a", "1m"), row("b", "@hourly")])
    h.sched.tick()
    assert sorted(h.refresh.calls) == ["a", "b"]
    assert h.state("a").next_attempt == T0 + 60
    assert h.state("b").next_attempt == datetime(2024, 1, 1, 1, tzinfo=UTC).timestamp()
    h.clock.t += 59
    assert h.sched.tick() == []
    h.clock.t += 1
    assert [o.name for o in h.sched.tick()] == ["a"]
    assert h.state("a").last_ok == T0 + 60


def test_independent_tables_refresh_concurrently() -> None:
    barrier = threading.Barrier(2, timeout=5)
    seen: list[str] = []

    def refresh(name: str) -> str:
        barrier.wait()  # raises BrokenBarrierError unless the other refresh is in flight too
        seen.append(threading.current_thread().name)
        return name

    sched = Scheduler(refresh, lambda *a: None, clock=FakeClock(), threads=2)
    try:
        sched.sync([row("p"), row("q")])
        out = sched.tick()
    finally:
        sched.close()
    assert sorted(o.name for o in out) == ["p", "q"] and all(o.ok for o in out)
    assert len(set(seen)) == 2


# --- failures ---------------------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_bounds() -> None:
    h = Harness([row("a", "1h")], max_consecutive_errors=10, backoff_base=1.0, backoff_max=300.0)
    h.refresh.fail["a"] = -1
    for n in range(1, 8):
        out = h.sched.tick()
        assert [o.ok for o in out] == [False] and out[0].error == "RuntimeError: boom in a"
        base = min(300.0, 2.0 ** (n - 1))
        delay = h.state("a").next_attempt - h.clock()
        assert 0.5 * base <= delay < 1.5 * base
        assert h.state("a").consecutive_errors == n
        h.clock.t = h.state("a").next_attempt
    failed = [f for e, f in h.events if e == "refresh_failed"]
    assert [f["consecutive_errors"] for f in failed] == list(range(1, 8))
    assert all(f["retry_in"] > 0 and "boom in a" in f["error"] for f in failed)


@pytest.mark.parametrize("value, factor", [(0.0, 0.5), (0.999999, 1.499999)])
def test_backoff_cap_and_jitter_extremes(value: float, factor: float) -> None:
    h = Harness([row("a")], max_consecutive_errors=10, backoff_base=100.0, backoff_max=150.0,
                rng=FixedRng(value))
    h.refresh.fail["a"] = -1
    h.sched.tick()
    assert h.state("a").next_attempt - h.clock() == pytest.approx(100.0 * factor)
    h.clock.t = h.state("a").next_attempt
    h.sched.tick()  # 2nd failure: 200 capped to 150 before jitter
    assert h.state("a").next_attempt - h.clock() == pytest.approx(150.0 * factor)


def test_success_after_failure_resets_errors_and_returns_to_schedule() -> None:
    h = Harness([row("a", "1m")])
    h.refresh.fail["a"] = 1
    h.sched.tick()
    h.clock.t = h.state("a").next_attempt
    assert [o.ok for o in h.sched.tick()] == [True]
    s = h.state("a")
    assert s.consecutive_errors == 0 and s.next_attempt == h.clock() + 60


def test_error_state_after_max_failures_calls_set_status_once() -> None:
    h = Harness([row("a"), row("b")], max_consecutive_errors=3)
    h.refresh.fail["a"] = -1
    for _ in range(3):
        h.sched.tick()
        h.clock.t = max(h.state("a").next_attempt or h.clock(), h.clock())
    assert h.refresh.calls.count("a") == 3
    assert len(h.statuses) == 1
    name, status, reason = h.statuses[0]
    assert (name, status) == ("a", "ERROR") and "3 consecutive refresh failures" in reason
    assert "boom in a" in reason
    s = h.state("a")
    assert s.status == "ERROR" and s.next_attempt is None
    assert h.names("error_state") == ["a"]

    # The catalog still says ACTIVE with 3 errors (set_status not visible yet): stays out of the schedule.
    h.sched.sync([row("a", consecutive_errors=3), row("b")])
    for _ in range(3):
        h.clock.t += 3600
        h.sched.tick()
    assert h.refresh.calls.count("a") == 3 and len(h.statuses) == 1
    assert h.refresh.calls.count("b") == 4  # the others keep going

    # ALTER ... status=ACTIVE resets the catalog's error count: the table is back, due at once.
    h.refresh.fail.pop("a")
    h.sched.sync([row("a", consecutive_errors=0, last_refresh_at=None), row("b")])
    assert h.state("a").status == "ACTIVE" and h.state("a").consecutive_errors == 0
    assert "a" in {n for wave in h.sched.due(h.clock()) for n in wave}
    assert [o.ok for o in h.sched.tick() if o.name == "a"] == [True]


def test_set_status_failure_is_logged_and_table_stays_out() -> None:
    def set_status(name: str, status: str, reason: str) -> None:
        raise OSError("catalog not writable")

    events: list[str] = []
    refresh = FakeRefresh()
    refresh.fail["a"] = -1
    clock = FakeClock()
    sched = Scheduler(refresh, set_status, clock=clock, max_consecutive_errors=1,
                      log=lambda e, f: events.append(e))
    sched.sync([row("a")])
    sched.tick()
    assert events[-2:] == ["error_state", "set_status_failed"]
    clock.t += 3600
    assert sched.tick() == []


def test_downstream_skipped_when_upstream_fails_then_follows_its_retry() -> None:
    h = Harness([row("a", sources=["orders"]), row("b", sources=["a"]), row("c", sources=["b"]),
                 row("x", sources=["orders"])])
    h.refresh.fail["a"] = 1
    out = {o.name: o for o in h.sched.tick()}
    assert not out["a"].ok and out["a"].error is not None
    assert out["b"].skipped_reason == "upstream a failed its last refresh"
    assert out["c"].skipped_reason == "upstream a failed its last refresh"  # transitively
    assert out["x"].ok
    assert h.refresh.calls.count("b") == 0 and h.refresh.calls.count("c") == 0
    assert h.names("skipped") == ["b", "c"]
    retry = h.state("a").next_attempt
    assert h.state("b").next_attempt == retry and h.state("c").next_attempt == retry
    assert h.state("b").consecutive_errors == 0  # a skip is not a failure

    h.clock.t = retry
    assert h.sched.due(h.clock()) == [["a"], ["b"], ["c"]]
    assert all(o.ok for o in h.sched.tick())


def test_downstream_skipped_while_upstream_is_in_backoff() -> None:
    # a failed in an earlier tick and retries later; b (created meanwhile) is due now but must neither
    # publish over a stale a nor re-trigger a's refresh (a refresh refreshes stale upstream first).
    h = Harness([row("a", "1h")], backoff_base=100.0, rng=FixedRng(0.5))
    h.refresh.fail["a"] = 1
    h.sched.tick()
    assert h.state("a").next_attempt == h.clock() + 100  # jitter factor 0.5 + 0.5
    h.clock.t += 10
    h.sched.sync([row("a", "1h"), row("b", "10s", ["a"])])
    assert h.sched.due(h.clock()) == [["b"]]
    out = h.sched.tick()
    assert out[0].skipped_reason == "upstream a failed its last refresh"
    assert h.state("b").next_attempt == h.state("a").next_attempt
    assert "b" not in h.refresh.calls
    h.clock.t = h.state("a").next_attempt
    assert h.sched.due(h.clock()) == [["a"], ["b"]]
    assert all(o.ok for o in h.sched.tick())


# --- status / sync ----------------------------------------------------------------------------------------


def test_suspended_table_is_skipped_and_its_downstream_too() -> None:
    h = Harness([row("a", status="SUSPENDED"), row("b", sources=["a"]), row("x")])
    assert h.state("a").next_attempt is None
    out = {o.name: o for o in h.sched.tick()}
    assert "a" not in out and "a" not in h.refresh.calls
    assert out["b"].skipped_reason == "upstream a is SUSPENDED"
    assert out["x"].ok
    assert h.state("b").next_attempt == h.clock() + 60  # next slot, not every tick
    h.clock.t += 1
    assert h.sched.tick() == []

    h.sched.sync([row("a"), row("b", sources=["a"]), row("x")])  # ALTER ... status=ACTIVE
    assert ("table_changed", {"name": "a", "next_attempt": h.clock(), "status": ["SUSPENDED", "ACTIVE"]}) in \
        h.events
    assert h.sched.due(h.clock()) == [["a"]]


def test_sync_adds_new_tables_and_drops_removed_ones() -> None:
    h = Harness([row("a"), row("b")])
    h.sched.tick()
    h.clock.t += 5
    h.sched.sync([row("a"), row("c", "30s", ["a"])])  # another process: dropped b, created c
    assert set(h.sched.tables()) == {"a", "c"}
    assert h.names("table_removed") == ["b"]
    assert h.names("table_added") == ["a", "b", "c"]
    assert h.sched.due(h.clock()) == [["c"]]  # never refreshed: due now
    h.sched.tick()
    assert h.refresh.calls[-1] == "c" and "b" not in h.sched.tables()


def test_sync_picks_up_schedule_change_and_refresh_elsewhere() -> None:
    h = Harness([row("a", "1h")])
    h.sched.tick()
    assert h.state("a").next_attempt == T0 + 3600
    h.sched.sync([row("a", "5m")])
    assert h.state("a").next_attempt == T0 + 300
    h.clock.t += 100
    h.sched.sync([row("a", "5m", last_refresh_at=T0 + 90)])  # refreshed by `trickle refresh`
    assert h.state("a").next_attempt == T0 + 90 + 300
    h.sched.sync([row("a", "5m", last_refresh_at=T0 + 90)])  # nothing new: no event
    assert [e for e, _ in h.events].count("table_changed") == 2


def test_sync_immediate_and_bad_schedules_are_not_scheduled() -> None:
    h = Harness([row("i", "1m", refresh_mode="IMMEDIATE"), row("bad", "whenever")])
    h.sched.sync([row("i", "1m", refresh_mode="IMMEDIATE"), row("bad", "whenever")])
    assert h.sched.due(h.clock()) == []
    assert h.names("invalid_schedule") == ["bad"]  # once, not every sync
    assert h.sched.next_wakeup() is None


def test_sync_inherits_catalog_state_at_startup() -> None:
    h = Harness([row("a", "1m", last_refresh_at=T0 - 30, consecutive_errors=2), row("e", status="ERROR")],
                max_consecutive_errors=3)
    assert h.state("a").next_attempt == T0 + 30 and h.state("a").consecutive_errors == 2
    assert h.state("e").next_attempt is None
    assert h.sched.next_wakeup() == T0 + 30
    h.clock.t += 30
    h.refresh.fail["a"] = 1
    h.sched.tick()  # third failure in a row across restarts
    assert h.statuses and h.statuses[0][:2] == ("a", "ERROR")


def test_broken_log_callback_does_not_stop_refreshes() -> None:
    def log(event: str, fields: dict[str, Any]) -> None:
        raise ValueError("sink down")

    refresh = FakeRefresh()
    sched = Scheduler(refresh, lambda *a: None, clock=FakeClock(), log=log)
    sched.sync([row("a")])
    assert [o.ok for o in sched.tick()] == [True] and refresh.calls == ["a"]


def test_runtime_records_scheduler_decisions_in_history(tmp_path: Any) -> None:
    """Retries, skips, unusable schedules, status changes and ERROR land in the refresh history (the
    refreshes record themselves), so `trickle history` explains why a table was not refreshed."""
    from types import SimpleNamespace

    from pipeline.catalog import Catalog, StreamTableDef
    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime

    cat = Catalog(tmp_path / "trickle")
    cat.put(StreamTableDef("t", "SELECT 1", "1m", "AUTO", str(tmp_path / "t"), {}, ["x"], ["int"], "bag"))
    conf_file = tmp_path / "c.yaml"
    conf_file.write_text("stream_tables: []\n")
    events: list[tuple[str, Any]] = []
    log = SimpleNamespace(event=lambda what, **f: events.append((what, f)),
                          error=lambda m: events.append(("error", m)))
    rt = Runtime(SimpleNamespace(spark=None, catalog=cat), load_conf(conf_file), log, tmp_path)  # type: ignore[arg-type]
    rt._decision("refresh_failed", {"name": "t", "error": "boom", "consecutive_errors": 1, "retry_in": 1.5,
                                    "retry_at": 5.0, "traceback": "..."})
    rt._decision("skipped", {"name": "t", "reason": "upstream u failed its last refresh", "next_attempt": 9.0})
    rt._decision("invalid_schedule", {"name": "t", "schedule": "every day", "error": "not a duration"})
    rt._decision("table_changed", {"name": "t", "status": ["ACTIVE", "SUSPENDED"], "next_attempt": None})
    rt._set_status("t", "ERROR", "3 consecutive refresh failures; last: boom")
    rt._decision("table_added", {"name": "gone"})  # not in the catalog: logged only
    hist = list(reversed(cat.history("t", limit=10)))
    assert [(h["status"], h["action"]) for h in hist] == [
        ("RETRY", None), ("SKIPPED", "SKIP"), ("SKIPPED", "SKIP"), ("SUSPENDED", None), ("ERROR", None)]
    assert "retry in 1.5 s" in hist[0]["reason"] and hist[0]["error"] == "boom"
    assert "upstream u" in hist[1]["reason"] and "every day" in hist[2]["reason"]
    assert cat.get("t").status == "ERROR"
    assert not any(w == "error" and "cannot record" in str(f) for w, f in events)


def test_runtime_restarts_a_dead_streaming_query_with_backoff(tmp_path: Any) -> None:
    """A streaming query that died is restarted after the back-off (and again, later, if it dies again),
    instead of leaving its stream table stale until someone restarts the job."""
    from types import SimpleNamespace

    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime

    conf_file = tmp_path / "c.yaml"
    conf_file.write_text("stream_tables: []\nruntime:\n  retry_backoff_seconds: 0.2\n")
    started: list[str] = []

    def start(name: str, follow: set[str] | None = None) -> Any:
        started.append(name)
        return SimpleNamespace(isActive=True, exception=lambda: None)

    errors: list[str] = []
    log = SimpleNamespace(event=lambda what, **f: None, error=errors.append)
    rt = Runtime(SimpleNamespace(spark=None, catalog=None, start=start), load_conf(conf_file), log, tmp_path)  # type: ignore[arg-type]
    dead = SimpleNamespace(isActive=False, exception=lambda: "NullPointerException: boom")
    rt.immediate["t"] = dead
    rt._check_queries()
    assert not started and "restarting in 0.2 s" in errors[-1]
    rt._check_queries()
    assert not started  # still in back-off
    time.sleep(0.25)
    rt._check_queries()
    assert started == ["t"] and rt.immediate["t"].isActive
    rt.immediate["t"] = dead  # dies again: the next back-off is twice as long
    rt._check_queries()
    assert "restarting in 0.4 s" in errors[-1]


def test_history_is_pruned_to_the_newest_records(tmp_path: Any) -> None:
    from pipeline import catalog as cat_mod

    cat = cat_mod.Catalog(tmp_path / "trickle")
    for i in range(cat_mod.HISTORY_PRUNE_EVERY * 2 + 1):
        cat.append_history("t", {"refresh_id": f"r{i}", "started_at": 1000.0 + i, "action": "NO_DATA"})
    assert cat.prune_history("t", keep=10) > 0
    assert [h["refresh_id"] for h in cat.history("t", limit=100)] == [f"r{i}" for i in range(200, 190, -1)]
