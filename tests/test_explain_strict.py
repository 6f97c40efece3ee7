"""``explain`` says, before anything runs, how a query is maintained; strict mode fails instead of falling
back to FULL.

Why: a silent fallback to FULL is the top complaint about every peer system. ``explain`` must show for any
query the operator tree, which operators apply a delta rule and which recompute what a change touches (and
why), and the delta SQL; for a query the engine cannot differentiate, the reason and that AUTO refreshes it
FULL. Strict mode (API flag, ``trickle --strict``, Spark conf ``trickle.refresh.strict``) turns that fallback
into an error naming the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import dvm
from pipeline import RefreshError, StreamTables, UnsupportedError
from pipeline.cli import build_parser
from pipeline.refresh import STRICT

COLUMNS = "id INT, grp INT, val INT, name STRING"
ROWS = [(1, 1, 5, "a"), (2, 1, 7, "b"), (3, 2, None, "c"), (4, 3, 2, None)]
UNSUPPORTED = "SELECT id, uuid() AS tag FROM {src}"  # never differentiable: a new value at every evaluation


def test_tree_text_marks_recomputing_operators_with_their_reason() -> None:
    """Without Spark: every operator line says how its delta is computed; the ones that recompute what a
    change touches are marked RECOMPUTE with why, and the header sums it up."""
    schemas = {"t": [("id", "int"), ("g", "int"), ("v", "int")], "u": [("id", "int"), ("g", "int")]}
    plain = dvm.compile_query("SELECT t.g, COUNT(*) AS n, SUM(t.v) AS s FROM t JOIN u ON t.g = u.g GROUP BY t.g",
                              schemas)
    text = plain.tree_text()
    assert "every operator applies a delta rule" in text and "RECOMPUTE" not in text, text
    assert "InnerJoin" in text and "-- incremental" in text and "-- algebraic" in text, text
    assert plain.recomputes() == []
    scoped = dvm.compile_query("SELECT g, COUNT(DISTINCT v) AS d FROM t GROUP BY g HAVING COUNT(*) > 1", schemas)
    text = scoped.tree_text()
    assert "recompute-scoped: 1 operator" in text, text
    assert "-- RECOMPUTE: group rescan (HAVING" in text, text
    ((node, why),) = scoped.recomputes()
    assert type(node).__name__ == "Aggregate" and "HAVING" in why


def test_explain_shows_tree_strategies_and_delta_sql(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    src = make_source("ex", COLUMNS, rows=ROWS)
    query = (f"SELECT s.grp, COUNT(*) AS n, COUNT(DISTINCT s.name) AS dn FROM {src} s "
             f"WHERE EXISTS (SELECT 1 FROM {src} o WHERE o.grp = s.grp AND o.id <> s.id) GROUP BY s.grp")
    text = st.explain(query)
    for needle in ("query (not a stream table)", "operator tree", "SemiJoin", "incremental (left rows touched",
                   "RECOMPUTE: group rescan", "COUNT(DISTINCT", "needs the set of distinct values",
                   "hidden columns: __row_id, __cnt", "delta SQL", "MERGE INTO", "TABLE_CHANGES_BY_PATH"):
        assert needle in text, f"{needle!r} missing from explain:\n{text}"
    # by name: the stored definition, the same plan
    name = unique_name("explained")
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    by_name = st.explain(name)
    assert f"stream table: {name}" in by_name and "refresh_mode: DIFFERENTIAL" in by_name
    def tree(explained: str) -> str:  # the apply rules differ: a query is explained as AUTO, engine unknown
        return explained.split("operator tree")[1].split("apply (chosen per refresh")[0]

    assert tree(by_name) == tree(text)
    assert "AUTO: FULL when more than" in text and "AUTO: FULL" not in by_name
    assert "committed by delta-rs, in one commit" in by_name, by_name


def test_explain_of_an_unsupported_query_gives_the_reason_and_the_fallback(
    spark: Any, st: Any, make_source: Callable[..., str]
) -> None:
    src = make_source("exu", COLUMNS, rows=ROWS)
    text = st.explain(UNSUPPORTED.format(src=src))
    for needle in ("FULL only", "uuid", "AUTO: every refresh is FULL", "strict mode would fail",
                   "DIFFERENTIAL / IMMEDIATE: refused at create"):
        assert needle in text, f"{needle!r} missing from explain:\n{text}"
    assert "delta SQL" not in text


def test_strict_refresh_fails_with_the_reason_instead_of_falling_back(
    spark: Any, st: Any, tmp_path: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """A table AUTO refreshes FULL (created without strict mode): a strict refresh raises RefreshError
    naming the construct, records the error, and leaves the table as it was; the Spark conf turns strict mode
    on where the API leaves it unset; a strict create refuses such a query outright."""
    src = make_source("strict", COLUMNS, rows=ROWS)
    name = unique_name("strict")
    st.create_stream_table(name, UNSUPPORTED.format(src=src), refresh_mode="AUTO")  # initial population: FULL
    spark.sql(f"INSERT INTO {src} VALUES (5, 1, 9, 'e')")
    strict = StreamTables(spark, root=str(st.catalog.root), strict=True)
    with pytest.raises(RefreshError) as info:
        strict.refresh_stream_table(name)
    msg = str(info.value)
    assert "uuid" in msg and "strict mode" in msg and "FULL" in msg, msg
    last = strict.history(name, limit=1)[0]
    assert last["status"] == "ERROR" and "uuid" in last["error"], last
    assert st.read(name).count() == len(ROWS), "a failed strict refresh changed the table"

    # strict=None (the default) follows the Spark conf
    spark.conf.set(STRICT, "true")
    try:
        with pytest.raises(RefreshError, match="strict mode"):
            StreamTables(spark, root=str(st.catalog.root)).refresh_stream_table(name)
        with pytest.raises(UnsupportedError, match="strict mode: AUTO would refresh it FULL"):
            StreamTables(spark, root=str(st.catalog.root)).create_stream_table(
                unique_name("strict_create"), UNSUPPORTED.format(src=src), refresh_mode="AUTO")
    finally:
        spark.conf.unset(STRICT)
    # without strict mode the same refresh falls back, with the reason recorded
    r = st.refresh_stream_table(name)
    assert r.action == "FULL" and "uuid" in r.reason, (r.action, r.reason)


def test_cli_strict_flag_before_or_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["--strict", "refresh", "t"]).strict is True
    assert parser.parse_args(["refresh", "t", "--strict"]).strict is True
    assert parser.parse_args(["refresh", "t"]).strict is None  # the Spark conf decides
