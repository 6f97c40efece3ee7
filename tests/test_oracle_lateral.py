"""Oracle tests of generators, LATERAL and views as sources, all DIFFERENTIAL over >= 20 random change cycles.

Sources: ``docs`` (keyed; ``tags`` an ARRAY<INT> that is at times NULL, empty or holds NULL elements, so
explode and explode_outer differ; ``grp`` 1..5 where group 5 never has items) and ``items`` (keyless,
exact duplicate rows, NULL scores and tags; ``vals`` an array too). Four stream tables:

* ``gen`` — generators (the generator applied to the delta): LATERAL VIEW [OUTER] explode, posexplode_outer
  in the SELECT list, explode in the SELECT list, LEFT JOIN LATERAL explode(...) ON θ, two chained LATERAL
  VIEWs, and posexplode over the keyless source's duplicates;
* ``gen_agg`` — a keyed aggregate over LATERAL VIEW OUTER explode (the aggregate reads the generator's delta);
* ``lat`` — lateral subqueries (row-scoped recompute): top-2 per group (rows enter and leave the top as scores,
  groups and duplicates change), a correlated global aggregate (COUNT 0 / SUM NULL for a group without
  items), LEFT JOIN LATERAL with a non-equi correlation and ON TRUE, JOIN LATERAL ... ON θ;
* ``viewed`` — a stream table over a temporary view over a catalog view (which explodes ``docs``), joined
  with ``items``: maintained over the base tables (frontiers and change feeds are theirs).

Top-N subqueries order by every output column, so Spark's own answer (the oracle) is unique.
``test_lateral_corners_differential`` walks fixed data through the corners: arrays turning NULL, empty and
[NULL], a group losing all its items (top-N empty, LEFT padding, COUNT 0), duplicates entering the top.
``TRICKLE_ORACLE_CYCLES`` and ``TRICKLE_ORACLE_SEED`` (an int or ``random``) override the defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from coverage_rows import Row
from oracle import Col, TableSpec, check_many, run_oracle

from pipeline import SourceError
from tests.conftest import local_engine_mode

# DuckDB computes the deltas it can, as in production (the suite's default); tests/test_local_engine.py
# compares its lateral subqueries and explodes with Spark's
_engine = local_engine_mode("auto")

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

DOCS = TableSpec(
    "docs",
    (Col("grp", "jkey", domain=(1, 5)), Col("tags", "array", domain=(0, 5)), Col("w", "int", domain=(0, 5))),
    key="id",
    rows=12,
    max_changes=3,
)
ITEMS = TableSpec(  # keyless: exact duplicates (ties in the top-N are identical rows)
    "items",
    (Col("grp", "jkey", domain=(1, 4)), Col("score", "int", domain=(0, 12)), Col("tag", "string"),
     Col("vals", "array", domain=(0, 3))),
    key=None,
    rows=16,
    dup_fraction=0.3,
    max_changes=3,
)

QUERIES = {
    "gen": (
        "SELECT 'view' AS b, d.id AS id, d.grp AS g, CAST(NULL AS INT) AS p, e.x AS x "
        "FROM {docs} d LATERAL VIEW explode(d.tags) e AS x "
        "UNION ALL SELECT 'view_outer', d.id, d.grp, NULL, e.x FROM {docs} d LATERAL VIEW OUTER explode(d.tags) e AS x "
        "UNION ALL SELECT 'posexplode_outer', id, grp, p, x "
        "FROM (SELECT id, grp, posexplode_outer(tags) AS (p, x) FROM {docs}) s "
        "UNION ALL SELECT 'select_explode', id, w, NULL, explode(tags) AS x FROM {docs} "
        "UNION ALL SELECT 'left_lateral_fn', d.id, d.w, NULL, t.x FROM {docs} d "
        "LEFT JOIN LATERAL explode(d.tags) AS t(x) ON t.x > d.w "
        "UNION ALL SELECT 'chained_views', d.id, e.x, NULL, f.y FROM {docs} d LATERAL VIEW explode(d.tags) e AS x "
        "LATERAL VIEW explode(array(e.x, d.w)) f AS y "
        "UNION ALL SELECT 'keyless_dups', i.grp, i.score, e.pos, e.v FROM {items} i "
        "LATERAL VIEW OUTER posexplode(i.vals) e AS pos, v"
    ),
    "gen_agg": (
        "SELECT e.x AS x, COUNT(*) AS n, SUM(d.w) AS sw, MIN(d.id) AS mn, MAX(d.grp) AS mg "
        "FROM {docs} d LATERAL VIEW OUTER explode(d.tags) e AS x GROUP BY e.x"
    ),
    "lat": (
        "SELECT 'topn' AS b, d.id AS id, t.score AS v, t.tag AS s FROM {docs} d, "
        "LATERAL (SELECT i.score, i.tag FROM {items} i WHERE i.grp = d.grp ORDER BY i.score DESC, i.tag LIMIT 2) t "
        "UNION ALL SELECT 'agg', d.id, t.total, CAST(t.n AS STRING) FROM {docs} d, "
        "LATERAL (SELECT SUM(i.score) AS total, COUNT(*) AS n FROM {items} i WHERE i.grp = d.grp) t "
        "UNION ALL SELECT 'left_topn', d.id, t.score, t.tag FROM {docs} d LEFT JOIN LATERAL "
        "(SELECT i.score, i.tag FROM {items} i WHERE i.grp = d.grp AND i.score > d.w ORDER BY i.score, i.tag "
        "LIMIT 1) t ON TRUE "
        "UNION ALL SELECT 'join_on', d.id, t.score, t.tag FROM {docs} d JOIN LATERAL "
        "(SELECT i.score, i.tag FROM {items} i WHERE i.grp = d.grp) t ON t.score < d.w * 2"
    ),
    "viewed": "SELECT v.g, v.x, v.n, i.score FROM {v_grp} v JOIN {items} i ON i.grp = v.g",
}

# a temporary view over a catalog view over ``docs``: the stream table is maintained over ``docs``
VIEWS = {
    "v_flat": "CREATE VIEW {v_flat} AS SELECT d.id, d.grp, e.x FROM {docs} d LATERAL VIEW OUTER explode(d.tags) e AS x",
    "v_grp": "CREATE TEMPORARY VIEW {v_grp} (g, x, n) AS SELECT grp, x, COUNT(*) FROM {v_flat} "
             "WHERE x IS NOT NULL GROUP BY grp, x",
}


def test_lateral_family_differential(spark: Any, st: Any) -> None:
    """Generators, lateral subqueries and a stream table over nested views equal their queries after each
    of >= 20 random change batches, every refresh DIFFERENTIAL, frontiers on the base tables."""
    actions = run_oracle(spark, st, [DOCS, ITEMS], QUERIES, cycles=CYCLES, seed=808, views=VIEWS)
    assert set(actions) == set(QUERIES)


# --------------------------------------------------------------------------------------------------
# Fixed data through the corners
# --------------------------------------------------------------------------------------------------

# arrays are tuples in test data (see oracle.sql_literal)
CORNER_DOCS = [(1, 1, (1, 2, None), 0), (2, 2, (), 3), (3, 1, None, 1), (4, 3, (5, 5), 2), (5, 2, (None,), 9)]
CORNER_ITEMS = [(1, 10, "a", (1,)), (1, 10, "a", (1,)), (1, 7, "b", ()), (2, 3, None, None), (3, None, "c", (2,))]

CORNER_QUERIES = {
    "c_gen": (
        "SELECT 'inner' AS b, d.id AS id, e.x AS x FROM {docs} d LATERAL VIEW explode(d.tags) e AS x "
        "UNION ALL SELECT 'outer', d.id, e.x FROM {docs} d LATERAL VIEW OUTER explode(d.tags) e AS x "
        "UNION ALL SELECT 'select', id, explode_outer(tags) FROM {docs}"
    ),
    "c_lat": (
        "SELECT 'top' AS b, d.id AS id, t.score AS v, t.tag AS s FROM {docs} d, LATERAL (SELECT i.score, i.tag "
        "FROM {items} i WHERE i.grp = d.grp ORDER BY i.score DESC, i.tag LIMIT 2) t "
        "UNION ALL SELECT 'cnt', d.id, t.n, CAST(t.s AS STRING) FROM {docs} d, "
        "LATERAL (SELECT COUNT(*) AS n, SUM(i.score) AS s FROM {items} i WHERE i.grp = d.grp) t "
        "UNION ALL SELECT 'left', d.id, t.score, t.tag FROM {docs} d "
        "LEFT JOIN LATERAL (SELECT i.score, i.tag FROM {items} i WHERE i.grp = d.grp) t ON TRUE"
    ),
}

CORNER_STEPS = [
    ("arrays become NULL, empty and [NULL]; a doc moves group",
     ["UPDATE {docs} SET tags = NULL WHERE id = 1", "UPDATE {docs} SET tags = array(7, NULL) WHERE id = 2",
      "UPDATE {docs} SET tags = array() WHERE id = 4", "UPDATE {docs} SET grp = 1 WHERE id = 5"]),
    ("group 1 loses every item (top-N empty, LEFT padding, COUNT 0 / SUM NULL)",
     ["DELETE FROM {items} WHERE grp = 1"]),
    ("duplicates enter the top of group 2 and push the old top out; a NULL score in group 3",
     ["INSERT INTO {items} VALUES (2, 9, 'z', array(1)), (2, 9, 'z', array(1)), (3, NULL, 'c', array(2))"]),
    ("a doc deleted and one re-inserted with the same values as another (duplicate left rows)",
     ["DELETE FROM {docs} WHERE id = 3", "INSERT INTO {docs} VALUES (6, 2, array(9), 1), (7, 2, array(9), 1)"]),
]


def test_lateral_corners_differential(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """NULL / empty / [NULL] arrays through explode vs explode_outer, a group emptied and refilled, duplicate
    rows entering a top-N: each refresh DIFFERENTIAL, each table equal to its query afterwards."""
    docs = make_source("docs", "id INT, grp INT, tags ARRAY<INT>, w INT", rows=CORNER_DOCS)
    items = make_source("items", "grp INT, score INT, tag STRING, vals ARRAY<INT>", rows=CORNER_ITEMS)
    names = {n: unique_name(n) for n in CORNER_QUERIES}
    queries = {names[n]: q.format(docs=docs, items=items) for n, q in CORNER_QUERIES.items()}
    for name, q in queries.items():
        st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL")
    failures = check_many(spark, st, queries, "after create")
    assert not failures, "\n\n".join(failures.values())
    for what, statements in CORNER_STEPS:
        for s in statements:
            spark.sql(s.format(docs=docs, items=items))
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = dict(zip(queries, pool.map(st.refresh_stream_table, queries), strict=True))
        wrong = {n: (r.action, r.reason) for n, r in results.items() if r.action not in ("DIFFERENTIAL", "NO_DATA")}
        assert not wrong, f"{what}: refreshes not DIFFERENTIAL: {wrong}"
        failures = check_many(spark, st, queries, what)
        assert not failures, "\n\n".join(failures.values())


def test_view_sources_are_inlined_and_dataframe_views_rejected(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """A view's definition is captured at create: the stream table lists the base tables as sources,
    keeps its frontier on them, and is unaffected when the view is dropped later. A temporary view made
    from a DataFrame has no SQL text: rejected, saying what to do."""
    base = make_source("vbase", "id INT, k INT", rows=[(1, 1), (2, 2)])
    view, name = unique_name("vview"), unique_name("over_view")
    spark.sql(f"CREATE TEMPORARY VIEW {view} AS SELECT id, k * 10 AS k10 FROM {base} WHERE k > 1")
    st.create_stream_table(name, f"SELECT k10, COUNT(*) AS n FROM {view} GROUP BY k10", refresh_mode="DIFFERENTIAL")
    (info,) = [s for s in st.status() if s["name"] == name]
    assert info["sources"] == [base] and info["differentiable"], info
    assert view in st.explain(name) and "views inlined" in st.explain(name)
    spark.sql(f"DROP VIEW {view}")
    spark.sql(f"INSERT INTO {base} VALUES (3, 2), (4, 0)")
    r = st.refresh_stream_table(name)
    assert r.action == "DIFFERENTIAL" and set(r.frontier) == {base}, r
    assert sorted(tuple(x) for x in st.read(name).collect()) == [(20, 2)]

    df_view = unique_name("dfview")
    spark.table(base).createOrReplaceTempView(df_view)
    with pytest.raises(SourceError, match="DataFrame"):
        st.create_stream_table(unique_name("bad"), f"SELECT id FROM {df_view}", refresh_mode="AUTO")
    assert not any(s["name"].startswith("bad") for s in st.status())


# --------------------------------------------------------------------------------------------------
# The coverage table's rows for this family
# --------------------------------------------------------------------------------------------------

COVERAGE: list[Row] = [
    Row("LATERAL VIEW explode", "DIFFERENTIAL", "SELECT c.k, e.x FROM c LATERAL VIEW explode(c.arr) e AS x",
        "test_lateral_family_differential"),
    Row("LATERAL VIEW OUTER explode / posexplode", "DIFFERENTIAL",
        "SELECT c.k, e.p, e.x FROM c LATERAL VIEW OUTER posexplode(c.arr) e AS p, x",
        "test_lateral_family_differential"),
    Row("explode / explode_outer / posexplode in the SELECT list", "DIFFERENTIAL",
        "SELECT k, posexplode_outer(arr) AS (p, x) FROM c", "test_lateral_family_differential"),
    Row("LEFT JOIN LATERAL table function ON θ", "DIFFERENTIAL",
        "SELECT c.k, t.x FROM c LEFT JOIN LATERAL explode(c.arr) AS t(x) ON t.x > c.v",
        "test_lateral_family_differential"),
    Row("aggregate over LATERAL VIEW", "DIFFERENTIAL",
        "SELECT e.x, COUNT(*) AS n FROM c LATERAL VIEW explode(c.arr) e AS x GROUP BY e.x",
        "test_lateral_family_differential"),
    Row("LATERAL subquery top-N (ORDER BY ... LIMIT n per row)", "recompute-scoped",
        "SELECT a.id, t.v FROM a, LATERAL (SELECT b.v FROM b WHERE b.k = a.k ORDER BY b.v DESC, b.id LIMIT 3) t",
        "test_lateral_family_differential",
        "left rows touched by ΔL or correlated with a changed row of b are recomputed on both snapshots"),
    Row("LATERAL correlated aggregate", "recompute-scoped",
        "SELECT a.id, t.s FROM a, LATERAL (SELECT SUM(b.v) AS s FROM b WHERE b.k = a.k) t",
        "test_lateral_family_differential",
        "left rows touched by ΔL or correlated with a changed row of b are recomputed on both snapshots"),
    Row("LEFT JOIN LATERAL (subquery) ON TRUE", "recompute-scoped",
        "SELECT a.id, t.v FROM a LEFT JOIN LATERAL (SELECT b.v FROM b WHERE b.k = a.k) t ON TRUE",
        "test_lateral_family_differential",
        "left rows touched by ΔL or correlated with a changed row of b are recomputed on both snapshots"),
    Row("LATERAL VIEW without column names", "FULL-only", "SELECT c.k FROM c LATERAL VIEW explode(c.arr) e",
        reason="name the generator's columns (LATERAL VIEW explode(arr) t AS x)"),
    Row("LIMIT without ORDER BY", "rejected", "SELECT k FROM c LIMIT 3",
        reason="arbitrary rows; add ORDER BY ... (unique key last) for a top-k"),
    Row("rand() / uuid() / shuffle()", "rejected", "SELECT k, rand() AS r FROM c",
        reason="a different value at every evaluation"),
    Row("current_timestamp() / current_date() / now()", "rejected", "SELECT k, current_date() AS d FROM c",
        reason="fixed within a refresh, different between refreshes; FULL refreshes evaluate it"),
    Row("TABLESAMPLE", "rejected", "SELECT k FROM c TABLESAMPLE (10 PERCENT)",
        reason="a different sample at every read; filter on pmod(xxhash64(key), 100) instead"),
]
