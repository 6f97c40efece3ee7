"""Oracle tests of set operations (INTERSECT [ALL], EXCEPT / MINUS [ALL], nested with UNION [ALL]), scalar
subqueries (uncorrelated and correlated, in SELECT and in WHERE) and CTEs read more than once — all
DIFFERENTIAL over >= 20 random change cycles.

Sources: ``a`` keyed, ``b`` and ``c`` keyless with exact duplicate rows; every column takes NULLs and the
values come from small domains (``k`` 1..4 in b and c, 1..5 in a, so a's k = 5 never has a partner;
``v`` 0..5), so the same tuple sits in several tables with several copies: the ALL variants see real
multiplicities and the NULL-equal tuples (``(NULL, 3)`` in both inputs) must meet. The correlated scalar
subqueries filter their groups (``b.v > 2``), so groups are small and regularly become empty (COUNT must
then be 0, SUM NULL) and come back.

The stream tables pack the constructs (a refresh has a fixed cost of its own): UNION ALL branches named by
``b`` under one bag top, a DISTINCT top (UNION of set operations), and one keyed aggregate over a set
operation, a shared CTE and scalar subqueries in WHERE. ``test_scalar_subquery_corners_differential``
walks fixed data through what random data only hits by luck: a correlated group emptied and refilled,
the uncorrelated subquery's table emptied (AVG over nothing is NULL), NULL correlation keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from coverage_rows import Row
from oracle import Col, TableSpec, check_many, run_oracle

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

A = TableSpec(
    "a",
    (Col("k", "jkey", domain=(1, 5)), Col("v", "int", domain=(0, 5))),
    key="id",
    rows=14,
    dup_fraction=0.3,
    max_changes=3,
)
B = TableSpec(  # keyless: exact duplicates
    "b",
    (Col("k", "jkey", domain=(1, 4)), Col("v", "int", domain=(0, 5))),
    key=None,
    rows=12,
    dup_fraction=0.35,
    max_changes=3,
)
C = TableSpec(  # keyless: exact duplicates
    "c",
    (Col("k", "jkey", domain=(1, 4)), Col("v", "int", domain=(0, 5))),
    key=None,
    rows=10,
    dup_fraction=0.3,
    max_changes=3,
)

QUERIES = {
    # every set operation under UNION ALL (bag top), mixed nestings and SQL's precedence (INTERSECT binds
    # tighter than UNION / EXCEPT)
    "setops": (
        "SELECT 'intersect_all' AS b, k, v FROM (SELECT k, v FROM {a} INTERSECT ALL SELECT k, v FROM {b}) s "
        "UNION ALL SELECT 'intersect', k, v FROM (SELECT k, v FROM {b} INTERSECT SELECT k, v FROM {c}) s "
        "UNION ALL SELECT 'except_all', k, v FROM (SELECT k, v FROM {b} EXCEPT ALL SELECT k, v FROM {c}) s "
        "UNION ALL SELECT 'minus', k, v FROM (SELECT k, v FROM {a} MINUS SELECT k, v FROM {b}) s "
        "UNION ALL SELECT 'except_all_of_union_all', k, v FROM (SELECT k, v FROM {b} "
        "EXCEPT ALL (SELECT k, v FROM {c} UNION ALL SELECT k, v FROM {a} WHERE v > 2)) s "
        "UNION ALL SELECT 'precedence', k, 0 FROM (SELECT k FROM {a} UNION ALL SELECT k FROM {b} "
        "INTERSECT ALL SELECT k FROM {c}) s "
        "UNION ALL SELECT 'intersect_of_except', k, v FROM ((SELECT k, v FROM {b} EXCEPT ALL "
        "SELECT k, v FROM {a}) INTERSECT SELECT k, v FROM {c}) s"
    ),
    # the brief's mixed nesting at the top: a DISTINCT top (keyed layout) over UNION of set operations
    "setop_top": (
        "(SELECT k, v FROM {a} EXCEPT SELECT k, v FROM {b}) UNION (SELECT k, v FROM {b} INTERSECT SELECT k, v FROM {c})"
    ),
    # scalar subqueries: uncorrelated and correlated, in SELECT and in WHERE; COUNT over an emptied group is
    # 0, SUM NULL; HAVING and COALESCE see the empty input
    "scalar": (
        "SELECT 'uncorr' AS b, a.id AS id, a.v AS x, (SELECT MAX(c.v) FROM {c} c WHERE c.v < 4) AS y FROM {a} a "
        "WHERE a.v > (SELECT AVG(b.v) FROM {b} b) "
        "UNION ALL SELECT 'select_corr', a.id, (SELECT COUNT(*) FROM {b} b WHERE b.k = a.k AND b.v > 2), "
        "(SELECT SUM(b.v) FROM {b} b WHERE b.v > 2 AND a.k = b.k) FROM {a} a "
        "UNION ALL SELECT 'where_corr', a.id, (SELECT COUNT(c.v) + 1 FROM {c} c WHERE c.k = a.k), "
        "(SELECT COALESCE(SUM(c.v), -1) FROM {c} c WHERE c.k = a.k AND c.v > 1 HAVING COUNT(*) > 1) FROM {a} a "
        "WHERE a.v >= (SELECT AVG(c.v) FROM {c} c WHERE c.k = a.k) "
        # TPC-H Q17's shape: FROM a, b joined by the WHERE, beside a correlated subquery of one of them
        "UNION ALL SELECT 'where_corr_join', a.id, b.v, a.v FROM {a} a, {b} b "
        "WHERE a.k = b.k AND b.v > 1 AND a.v < (SELECT AVG(c.v) FROM {c} c WHERE c.k = b.k)"
    ),
    # CTEs read several times: a grouped CTE self-joined (inner and LEFT), a filtered one on both sides of
    # EXCEPT ALL
    "cte": (
        "WITH t AS (SELECT k, SUM(v) AS s, COUNT(*) AS n FROM {b} GROUP BY k), "
        "u AS (SELECT k, v FROM {c} WHERE v IS NOT NULL) "
        "SELECT 'self_join' AS b, x.k AS k, x.s AS p, y.n AS q FROM t x JOIN t y ON x.k = y.k + 1 "
        "UNION ALL SELECT 'left_self', x.k, x.n, y.s FROM t x LEFT JOIN t y ON y.k = x.k - 1 "
        "UNION ALL SELECT 'setop', k, v, 0 FROM (SELECT k, v FROM u EXCEPT ALL SELECT k, v FROM u WHERE v > 3) s"
    ),
    # a keyed top (algebraic state, MAX with rescans) over a set operation, a shared CTE and scalar
    # subqueries in WHERE under OR
    "agg_mix": (
        "WITH t AS (SELECT a.k, a.v FROM {a} a WHERE a.v IS NOT NULL) "
        "SELECT g, COUNT(*) AS n, SUM(v) AS s, MAX(v) AS m FROM ("
        "SELECT k AS g, v FROM (SELECT k, v FROM {b} EXCEPT ALL SELECT k, v FROM {c}) s "
        "UNION ALL SELECT x.k + 10, y.v FROM t x JOIN t y ON x.k = y.k AND x.v < y.v "
        "UNION ALL SELECT a.k + 20, a.v FROM {a} a WHERE a.v > (SELECT AVG(b.v) FROM {b} b WHERE b.k = a.k) "
        "OR a.v = (SELECT MIN(c.v) FROM {c} c)) u GROUP BY g"
    ),
}


def test_setops_scalar_subqueries_ctes_differential(spark: Any, st: Any) -> None:
    """Every construct above equals its query after each of >= 20 random change cycles, each refresh
    DIFFERENTIAL (run_oracle fails on any other action)."""
    run_oracle(spark, st, [A, B, C], QUERIES, cycles=CYCLES, seed=606)


CORNER_COLUMNS = "id INT, k INT, v INT"
CORNER_QUERIES = {
    "corr": (
        "SELECT a.id, (SELECT COUNT(*) FROM {b} b WHERE b.k = a.k) AS n, "
        "(SELECT SUM(b.v) FROM {b} b WHERE b.k = a.k) AS s, "
        "(SELECT collect_list(b.v) FROM {b} b WHERE b.k = a.k) AS l, "
        "(SELECT AVG(b.v) FROM {b} b) AS m FROM {a} a WHERE a.v <= (SELECT MAX(b.v) FROM {b} b WHERE b.k = a.k) "
        "OR (SELECT COUNT(*) FROM {b} b WHERE b.k = a.k) = 0"
    ),
    "setop": "SELECT k, v FROM {a} INTERSECT ALL SELECT k, v FROM {b} EXCEPT SELECT k, v FROM {b} WHERE v > 8",
}
CORNER_STEPS = [
    ("group k=1 emptied (COUNT 0, SUM NULL, collect_list [])", "DELETE FROM {b} WHERE k = 1"),
    ("group k=1 refilled with duplicates and a NULL value",
     "INSERT INTO {b} VALUES (101, 1, 4), (102, 1, 4), (103, 1, NULL)"),
    ("every row of b deleted (AVG over nothing is NULL)", "DELETE FROM {b} WHERE id > 0"),
    ("NULL keys on both sides (never correlated; NULL-equal in set operations)",
     "INSERT INTO {b} VALUES (104, NULL, 2), (105, NULL, 2), (106, 2, 3)"),
]


def test_scalar_subquery_corners_differential(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """Groups of a correlated scalar subquery emptied and refilled, the uncorrelated one's table emptied,
    NULL correlation keys: each refresh DIFFERENTIAL and each stream table equal to its query."""
    a = make_source("a", CORNER_COLUMNS, rows=[(1, 1, 2), (2, 1, 9), (3, 2, 1), (4, None, 2), (5, 3, 0)])
    b = make_source("b", CORNER_COLUMNS, rows=[(11, 1, 5), (12, 1, 5), (13, 2, 0), (14, None, 2)])
    queries = {unique_name(n): q.format(a=a, b=b) for n, q in CORNER_QUERIES.items()}
    for name, q in queries.items():
        st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL")
    failures = check_many(spark, st, queries, "after create")
    assert not failures, "\n\n".join(failures.values())
    for what, statement in CORNER_STEPS:
        spark.sql(statement.format(b=b))
        results = {n: st.refresh_stream_table(n) for n in queries}
        wrong = {n: (r.action, r.reason) for n, r in results.items() if r.action != "DIFFERENTIAL"}
        assert not wrong, f"{what}: refreshes not DIFFERENTIAL: {wrong}"
        failures = check_many(spark, st, queries, what)
        assert not failures, "\n\n".join(failures.values())


_T = "test_setops_scalar_subqueries_ctes_differential"

_NESTED = "the subquery is an aggregate below the top: its affected groups are rescanned (group rescan)"

COVERAGE: list[Row] = [
    Row("INTERSECT", "DIFFERENTIAL", "SELECT k, v FROM a INTERSECT SELECT k, v FROM b", _T),
    Row("INTERSECT ALL", "DIFFERENTIAL", "SELECT k, v FROM a INTERSECT ALL SELECT k, v FROM c", _T),
    Row("EXCEPT", "DIFFERENTIAL", "SELECT k FROM a EXCEPT SELECT k FROM b", _T),
    Row("EXCEPT ALL", "DIFFERENTIAL", "SELECT k, v FROM c EXCEPT ALL SELECT k, v FROM a", _T),
    Row("MINUS [ALL]", "DIFFERENTIAL", "SELECT k FROM a MINUS SELECT k FROM b", _T),
    Row("set operations nested with UNION [ALL]", "DIFFERENTIAL",
        "(SELECT k FROM a EXCEPT SELECT k FROM b) UNION (SELECT k FROM b INTERSECT SELECT k FROM c)", _T),
    Row("scalar subquery in SELECT (uncorrelated)", "recompute-scoped",
        "SELECT id, (SELECT MAX(v) FROM b) AS m FROM a", _T, _NESTED),
    Row("scalar subquery in WHERE (uncorrelated)", "recompute-scoped",
        "SELECT id FROM a WHERE v > (SELECT AVG(v) FROM b)", _T, _NESTED),
    Row("correlated scalar subquery (equality correlation)", "recompute-scoped",
        "SELECT a.id, (SELECT COUNT(*) FROM b WHERE b.k = a.k) AS n FROM a", _T, _NESTED),
    Row("correlated scalar subquery in WHERE", "recompute-scoped",
        "SELECT a.id FROM a WHERE a.v >= (SELECT AVG(b.v) FROM b WHERE b.k = a.k)", _T, _NESTED),
    Row("CTE referenced several times", "recompute-scoped",
        "WITH t AS (SELECT k, SUM(v) AS s FROM b GROUP BY k) SELECT x.k, y.s FROM t x JOIN t y ON x.k = y.k + 1", _T,
        "the CTE's subtree is built and differentiated once for all references; " + _NESTED),
    Row("non-aggregate scalar subquery", "FULL-only", "SELECT a.id, (SELECT b.v FROM b WHERE b.id = a.k) AS w FROM a",
        reason="may return several rows (an error in SQL); write it as an aggregate (MAX, ANY_VALUE) or a join"),
    Row("correlated scalar subquery with a non-equality correlation", "FULL-only",
        "SELECT a.id, (SELECT MAX(b.v) FROM b WHERE b.k > a.k) AS m FROM a",
        reason="decorrelation needs equalities inner = outer (they become the GROUP BY of a joined aggregate)"),
    Row("scalar subquery in HAVING / ON / GROUP BY, or in the SELECT list of an aggregating query", "FULL-only",
        "SELECT a.k, COUNT(*) AS n FROM a GROUP BY a.k HAVING COUNT(*) > (SELECT MAX(b.v) FROM b)",
        reason="maintained in SELECT lists of non-aggregating queries and in WHERE only"),
]
