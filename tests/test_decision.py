"""What a refresh does (pipeline/decision.py), decided from the sources' windows before anything runs: pure, no
Spark; and the history record every writer builds (pipeline/history.py)."""

from __future__ import annotations

import json

import pytest

from connectors.delta_log import SourceWindow, TableMeta
from pipeline import history
from pipeline.catalog import SourceInfo, StreamTableDef
from pipeline.decision import change_ratio, decide
from pipeline.errors import RefreshError, SourceChangedError
from pipeline.source_schema import Verdict

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

META = TableMeta("id-1", '{"type":"struct","fields":[]}')


def table(mode: str = "DIFFERENTIAL", **kw: object) -> StreamTableDef:
    sources = {"a": SourceInfo("/t/a", "delta"), "b": SourceInfo("/t/b", "stream_table")}
    return StreamTableDef("s", "SELECT 1", None, mode, "/t/s", sources, ["x"], ["int"], "bag", **kw)  # type: ignore[arg-type]


def window(pre: int | None, post: int, **kw: object) -> SourceWindow:
    return SourceWindow(pre, post, META, **kw)  # type: ignore[arg-type]


def test_nothing_moved_is_no_data_and_a_moved_source_is_differential() -> None:
    pre = {"a": 3, "b": 7}
    same = {"a": window(3, 3), "b": window(7, 7)}
    assert decide(table(), pre, same, {}, None, strict=False).action == "NO_DATA"
    moved = {"a": window(3, 5, sizes={5: 1000}, change_bytes=100), "b": window(7, 7, sizes={7: 1000})}
    d = decide(table(), pre, moved, {}, Verdict(), strict=False)
    assert (d.action, d.change_ratio) == ("DIFFERENTIAL", 0.05)
    # a pending re-initialisation is never NO_DATA, even when no source moved
    assert decide(table(reinitialize="the query was altered"), pre, same, {}, None, False).action == "REINITIALIZE"


def test_the_rules_in_order_of_precedence() -> None:
    pre = {"a": 3, "b": 7}
    moved = {"a": window(3, 4), "b": window(7, 7)}
    assert decide(table(), None, moved, {}, None, False).reason == "initial population"
    assert decide(table(), pre, moved, {"a": "source a was re-created"}, Verdict(), False).action == "REINITIALIZE"
    assert decide(table(), {"a": 3}, moved, {}, Verdict(), False).reason == "the set of sources changed"
    changed = {"a": window(3, 4, schema_changed_at=4), "b": window(7, 7)}
    assert "changed its schema at version 4" in decide(table(), pre, changed, {}, Verdict(), False).reason
    # the schema check found the change harmless: carry on differentially, with its note
    harmless = Verdict(notes=["column c added, not read"], checked={"a"})
    d = decide(table(), pre, changed, {}, harmless, False)
    assert d.action == "DIFFERENTIAL" and d.reason.endswith("column c added, not read")
    with pytest.raises(SourceChangedError, match="column gone"):
        decide(table(), pre, moved, {}, Verdict("ERROR", ["column gone"]), False)
    assert decide(table("FULL"), pre, moved, {}, Verdict(), False).reason == "refresh_mode is FULL"
    truncated = {"a": window(3, 4, truncated_at=4), "b": window(7, 7)}
    assert decide(table(), pre, truncated, {}, Verdict(), False).reason == "source a was truncated (version 4)"
    # an upstream stream table's truncate is an ordinary change to it
    up_truncated = {"a": window(3, 3), "b": window(7, 8, truncated_at=8)}
    assert decide(table(), pre, up_truncated, {}, Verdict(), False).action == "DIFFERENTIAL"


def test_a_query_that_cannot_be_differentiated() -> None:
    pre, moved = {"a": 3, "b": 7}, {"a": window(3, 4), "b": window(7, 7)}
    d = decide(table("AUTO", full_reason="LIMIT without ORDER BY"), pre, moved, {}, Verdict(), False)
    assert (d.action, d.reason) == ("FULL", "query not differentiable: LIMIT without ORDER BY")
    with pytest.raises(RefreshError, match="strict mode"):
        decide(table("AUTO", full_reason="x"), pre, moved, {}, Verdict(), True)
    with pytest.raises(RefreshError, match="cannot be refreshed differentially"):
        decide(table("IMMEDIATE", full_reason="x"), pre, moved, {}, Verdict(), False)


def test_auto_decides_by_the_change_ratio_and_strict_auto_stays_differential() -> None:
    pre = {"a": 3, "b": 7}
    big = {"a": window(3, 4, sizes={4: 1000}, change_bytes=900), "b": window(7, 7, sizes={7: 0})}
    learned = {"full_s": 1.0, "floor_s": 0.2, "slope_s": 2.0, "full_n": 5, "diff_n": 5}
    d = decide(table("AUTO", cost_model=learned), pre, big, {}, Verdict(), False)
    assert d.action == "FULL" and d.change_ratio == 0.9
    assert decide(table("AUTO", cost_model=learned), pre, big, {}, Verdict(), True).action == "DIFFERENTIAL"


def test_change_ratio_counts_only_changed_sources_over_every_source() -> None:
    windows = {"a": window(1, 2, sizes={2: 300}, change_bytes=30), "b": window(5, 5, sizes={5: 700}, change_bytes=99)}
    assert change_ratio({"a": 1, "b": 5}, windows) == pytest.approx(0.03)
    assert change_ratio(None, windows) is None
    unknown = {"a": window(1, 2, change_bytes=30), "b": window(5, 5, sizes={5: 700})}
    assert change_ratio({"a": 1, "b": 5}, unknown) is None


def test_every_history_record_has_the_same_keys() -> None:
    records = [
        history.refreshed("s", "r1", "FULL", "initial population", 1.0, 12.34, (3, 0, 0), {"a": 1}, apply="x"),
        history.no_data("s", "nothing", 1.0, 0.5, {"a": 1}),
        history.recovered("s", "r2", "DIFFERENTIAL", {"a": 2}),
        history.failed("s", 1.0, 3.0, ValueError("bad\nsecond line")),
        history.scheduled("s", "RETRY", "attempt 1 failed", error="x", retry_at=9.0),
    ]
    docs = [json.loads(json.dumps(r.to_json())) for r in records]
    assert len({tuple(sorted(doc)) for doc in docs}) == 1
    ok, nodata, rec, err, sched = docs
    assert (ok["status"], ok["rows_inserted"], ok["duration_ms"], ok["apply"]) == ("OK", 3, 12.3, "x")
    assert nodata["action"] == "NO_DATA" and nodata["refresh_id"].startswith("nodata-")
    assert rec["reason"].startswith("recovered") and rec["rows_inserted"] is None
    assert err["error"] == "ValueError: bad" and "ValueError" in err["traceback"]
    assert (sched["initiated_by"], sched["retry_at"], sched["refresh_id"][:6]) == ("SCHEDULER", 9.0, "retry-")
