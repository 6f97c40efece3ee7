"""Oracle tests of the join family: FULL / RIGHT / NATURAL / USING joins, non-equi and self-joins, nested
mixes of inner and outer joins, semi- and anti-joins (EXISTS, NOT EXISTS, IN, NOT IN with SQL's NULL
semantics, ALL / ANY, LEFT SEMI / ANTI JOIN), several of them ANDed and under OR — all DIFFERENTIAL over
>= 20 random change cycles.

Why so few stream tables: each refresh costs seconds of Spark jobs here (a Delta file-listing job per
distinct scan, a job per broadcast join, the MERGE), so the default test packs the constructs into three
stream tables over three small shared sources: ``ord`` (keyed, NULL and dangling ``cid``), ``cust`` (keyed from a small
key range, so deleted keys come back) and ``tags`` (keyless, exact duplicates, NULLs). Churn updates a
child's ``cid`` away from a parent and deletes that parent in the same commit window. A slower variant
(marked ``slow``) gives each construct its own UNION ALL branch, so a failure names it.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import sqlglot
from coverage_rows import Row
from oracle import Churn, Col, TableSpec, run_oracle

from dvm.rewrite import expand_quantified

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

COVERAGE_TITLE = "Joins: outer, natural / USING, non-equi, self, nested; semi- and anti-joins (EXISTS, IN, ALL / ANY)"
_J = "test_join_family_differential"
COVERAGE = [
    Row("FULL OUTER JOIN", "DIFFERENTIAL", "SELECT a.id, b.id AS bid, a.v, b.v AS bv FROM a FULL JOIN b ON a.k = b.k", _J,
        "LEFT join delta plus the NULL-padded anti-join delta of the right side"),
    Row("FULL JOIN with a non-equi condition", "DIFFERENTIAL",
        "SELECT a.id, b.id AS bid FROM a FULL OUTER JOIN b ON a.k = b.k AND a.v > b.v", _J),
    Row("RIGHT OUTER JOIN", "DIFFERENTIAL", "SELECT a.id, b.id AS bid, b.s FROM a RIGHT JOIN b ON a.k = b.k", _J,
        "a LEFT join with the sides swapped"),
    Row("JOIN ... USING, NATURAL JOIN", "DIFFERENTIAL",
        "SELECT k, a.id, c.v FROM a JOIN b USING (k) NATURAL RIGHT JOIN c", _J),
    Row("USING after a FULL JOIN (joins on the merged column)", "DIFFERENTIAL",
        "SELECT k, a.id, b.v, c.v AS cv FROM a FULL JOIN b USING (k) LEFT JOIN c USING (k)", _J,
        "keyed on COALESCE(a.k, b.k), as SQL says"),
    Row("Self-join", "DIFFERENTIAL", "SELECT x.id, y.id AS yid FROM a x FULL JOIN a y ON x.k = y.k AND x.id < y.id", _J),
    Row("Nested (parenthesised) joins mixing inner and outer", "DIFFERENTIAL",
        "SELECT a.id, b.id AS bid, c.v FROM a FULL JOIN (b LEFT JOIN c ON b.k = c.k AND c.v > b.v) ON a.k = b.k", _J),
    Row("Inner join on a non-equi (band) condition", "DIFFERENTIAL",
        "SELECT a.id, b.id AS bid FROM a JOIN b ON a.v BETWEEN b.v AND b.v + 1", _J),
    Row("CROSS JOIN", "DIFFERENTIAL", "SELECT a.id, c.v FROM a CROSS JOIN c WHERE c.v > a.v", _J),
    Row("Aggregate over a FULL JOIN", "DIFFERENTIAL",
        "SELECT b.k, COUNT(*) AS n, SUM(a.v) AS s, MAX(a.v) AS mx, MIN(b.x) AS mn FROM a FULL JOIN b ON a.k = b.k "
        "GROUP BY b.k", _J),
    Row("EXISTS (subquery), correlated on equality and non-equality", "DIFFERENTIAL",
        "SELECT id, v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.v >= a.v)", _J,
        "a semi-join: left rows touched by a change are re-checked on both snapshots"),
    Row("NOT EXISTS (subquery)", "DIFFERENTIAL",
        "SELECT id, v FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.v > a.v)", _J, "an anti-join"),
    Row("IN (subquery)", "DIFFERENTIAL", "SELECT id FROM a WHERE v IN (SELECT v FROM c)", _J),
    Row("NOT IN (subquery), with SQL's NULL semantics", "DIFFERENTIAL",
        "SELECT id FROM a WHERE v NOT IN (SELECT v FROM c WHERE c.k = a.k)", _J,
        "a NULL among the subquery's values empties the result; a NULL left value qualifies only against an "
        "empty subquery"),
    Row("op ALL (subquery)", "DIFFERENTIAL", "SELECT id FROM a WHERE v > ALL (SELECT v FROM c WHERE c.k = a.k)", _J),
    Row("op ANY / SOME (subquery)", "DIFFERENTIAL", "SELECT id FROM a WHERE v < ANY (SELECT v FROM b WHERE b.k = 2)", _J),
    Row("Subquery predicates under OR / NOT", "DIFFERENTIAL",
        "SELECT id FROM a WHERE v > 7 OR EXISTS (SELECT 1 FROM b WHERE b.k = a.k) OR NOT (v < ANY (SELECT v FROM c))",
        _J, "one mark join (a flag per predicate) read by a filter"),
    Row("LEFT SEMI JOIN (Spark)", "DIFFERENTIAL", "SELECT a.id FROM a LEFT SEMI JOIN b ON b.k = a.k AND b.v > a.v", _J),
    Row("LEFT ANTI JOIN (Spark)", "DIFFERENTIAL", "SELECT a.id FROM a LEFT ANTI JOIN c ON c.k = a.k", _J),
    Row("IN / EXISTS subquery outside WHERE (HAVING, SELECT list)", "FULL-only",
        "SELECT k, COUNT(*) AS n FROM a GROUP BY k HAVING k IN (SELECT k FROM b)", None,
        "maintained only in a WHERE clause, combined with AND / OR / NOT; move it there"),
    Row("Correlated subquery predicate with GROUP BY / aggregates", "FULL-only",
        "SELECT id FROM a WHERE v IN (SELECT MAX(b.v) FROM b WHERE b.k = a.k)", None,
        "decorrelate it into a join with a GROUP BY subquery in FROM"),
]

CUST = TableSpec(
    "cust",
    (Col("region", "jkey", domain=(1, 3)), Col("credit", "int", domain=(0, 9))),
    key="cid",
    key_range=(1, 8),
    rows=6,
    max_changes=2,
)
ORD = TableSpec(  # cid 9 never has a customer; NULL cid never joins
    "ord",
    (Col("cid", "jkey", domain=(1, 9)), Col("qty", "int", domain=(0, 9))),
    key="oid",
    rows=16,
    max_changes=3,
)
TAGS = TableSpec(  # keyless: exact duplicate rows, NULL cid and NULL val
    "tags",
    (Col("cid", "jkey", domain=(1, 9)), Col("val", "int", domain=(0, 9))),
    key=None,
    rows=12,
    dup_fraction=0.3,
    max_changes=3,
)

# The default suite: every construct of the scope at least once, in three stream tables (a refresh has a
# fixed cost of its own, so constructs share tables as UNION ALL branches named by ``b``, or share one
# keyed aggregate); inside a branch several constructs are combined where that hides nothing (each join
# of the tree is still differentiated on its own).
QUERIES = {
    "outer_joins": (
        # FULL ... USING, then a LEFT join USING the merged column COALESCE(o.cid, c.cid) (sqlglot alone
        # would key it on o.cid)
        "SELECT 'full_using_chain' AS b, cid AS k, o.oid AS x, c.credit AS y, t.val AS z "
        "FROM {ord} o FULL JOIN {cust} c USING (cid) LEFT JOIN {tags} t USING (cid) "
        # self-join (cust twice), FULL with an equi + non-equi condition over a parenthesised LEFT join
        # with a non-equi condition
        "UNION ALL SELECT 'self_full_nested', x.cid, x.credit, y.cid, t.val FROM {cust} x "
        "FULL JOIN ({cust} y LEFT JOIN {tags} t ON y.cid = t.cid AND t.val > y.credit) "
        "ON x.region = y.region AND x.cid < y.cid "
        # NATURAL RIGHT join (rewritten to LEFT), then an inner join USING the merged column (o.cid)
        "UNION ALL SELECT 'natural_right_inner', cid, o.oid, t.val, c.region "
        "FROM {tags} t NATURAL RIGHT JOIN {ord} o JOIN {cust} c USING (cid)"
    ),
    # keyed top (MIN/MAX must not take rows of the padding terms for inserted values) over a FULL join and
    # over NOT EXISTS with a non-equi correlation, an uncorrelated NOT IN (NULLs come and go in it) and IN
    "agg_full_anti": (
        "SELECT g, COUNT(*) AS n, SUM(v) AS s, MAX(v) AS mx, MIN(w) AS mn FROM ("
        "SELECT c.region AS g, o.qty AS v, c.credit AS w FROM {ord} o FULL JOIN {cust} c ON o.cid = c.cid "
        "UNION ALL SELECT c.region + 10, c.credit, c.cid FROM {cust} c "
        "WHERE NOT EXISTS (SELECT 1 FROM {ord} o WHERE o.cid = c.cid AND o.qty > c.credit) "
        "AND c.cid NOT IN (SELECT t.cid FROM {tags} t WHERE t.val = 3) "
        "AND c.credit IN (SELECT t.val FROM {tags} t)) u GROUP BY g"
    ),
    "semi_anti": (
        # ANDed: EXISTS with an equality and a non-equality correlation, correlated NOT IN over a keyless
        # subquery with NULLs (a NULL among its values empties it; a NULL qty qualifies only if it is empty)
        "SELECT 'exists_not_in' AS b, o.oid AS id, o.qty AS v FROM {ord} o "
        "WHERE EXISTS (SELECT 1 FROM {cust} c WHERE c.cid = o.cid AND c.credit >= o.qty) "
        "AND o.qty NOT IN (SELECT t.val FROM {tags} t WHERE t.cid = o.cid) "
        # under OR and NOT: > ALL (correlated), IN, NOT (< ANY), each a mark join read by one filter
        "UNION ALL SELECT 'or_quantified', o.oid, o.qty FROM {ord} o "
        "WHERE o.qty > ALL (SELECT t.val FROM {tags} t WHERE t.cid = o.cid) "
        "OR o.cid IN (SELECT c.cid FROM {cust} c WHERE c.region = 1) "
        "OR NOT (o.qty < ANY (SELECT c.credit FROM {cust} c WHERE c.region = 2))"
        # join kinds the branches above do not use: Spark's LEFT SEMI / LEFT ANTI JOIN, CROSS JOIN, an inner
        # join on a band (non-equi) condition, a plain RIGHT join
        "UNION ALL SELECT 'left_semi', c.cid, c.credit FROM {cust} c LEFT SEMI JOIN {ord} o "
        "ON o.cid = c.cid AND o.qty > c.credit "
        "UNION ALL SELECT 'left_anti', c.cid, c.credit FROM {cust} c LEFT ANTI JOIN {tags} t ON t.cid = c.cid "
        "UNION ALL SELECT 'cross', c.cid, t.val FROM {cust} c CROSS JOIN {tags} t WHERE t.val > c.credit + 4 "
        "UNION ALL SELECT 'band', o.oid, c.cid FROM {ord} o JOIN {cust} c ON o.qty BETWEEN c.credit AND c.credit + 1 "
        "UNION ALL SELECT 'right', o.oid, c.region FROM {cust} c RIGHT JOIN {ord} o ON c.cid = o.cid"
    ),
}

# One UNION ALL branch per construct (column ``b`` names it, so a diff points at the construct): slower,
# for a change to the join family (``pytest -m slow tests/test_oracle_joins.py``).
BRANCH_QUERIES = {
    # FULL (USING, equi + non-equi), LEFT with a non-equi (band) condition, RIGHT (rewritten to LEFT)
    "outer_joins": (
        "SELECT 'full_using' AS b, cid AS k, o.oid AS x, c.credit AS y, o.qty AS z "
        "FROM {ord} o FULL JOIN {cust} c USING (cid) "
        "UNION ALL SELECT 'full_nonequi', c.cid, o.oid, c.credit, o.qty "
        "FROM {ord} o FULL OUTER JOIN {cust} c ON o.cid = c.cid AND o.qty > c.credit "
        "UNION ALL SELECT 'left_band', c.cid, o.oid, c.credit, o.qty "
        "FROM {ord} o LEFT JOIN {cust} c ON o.qty BETWEEN c.credit AND c.credit + 1 "
        "UNION ALL SELECT 'right', c.cid, o.oid, c.region, o.qty FROM {cust} c RIGHT JOIN {ord} o ON c.cid = o.cid"
    ),
    # USING chained after a FULL join (keyed on COALESCE(o.cid, c.cid)), NATURAL FULL, RIGHT ... USING
    "using_natural": (
        "SELECT 'full_using_left_using' AS b, cid AS k, o.oid AS x, c.region AS y, t.val AS z "
        "FROM {ord} o FULL JOIN {cust} c USING (cid) LEFT JOIN {tags} t USING (cid) "
        "UNION ALL SELECT 'natural_full', cid, credit, region, val FROM {tags} NATURAL FULL JOIN {cust} "
        "UNION ALL SELECT 'right_using_join', cid, o.oid, t.val, o.qty "
        "FROM {tags} t RIGHT JOIN {ord} o USING (cid) JOIN {cust} c USING (cid)"
    ),
    # self-joins (same source, two aliases) and nested mixes of inner and outer joins
    "self_nested": (
        "SELECT 'self_full' AS b, x.cid AS p, y.cid AS q, x.region AS r FROM {cust} x "
        "FULL JOIN {cust} y ON x.region = y.region AND x.cid < y.cid "
        "UNION ALL SELECT 'self_inner', a.oid, b.oid, a.cid FROM {ord} a JOIN {ord} b ON a.cid = b.cid AND a.qty < b.qty "
        "UNION ALL SELECT 'left_then_inner', o.oid, c.cid, t.val FROM {ord} o LEFT JOIN {cust} c ON o.cid = c.cid "
        "JOIN {tags} t ON t.val = o.qty "
        "UNION ALL SELECT 'full_of_left', o.oid, c.cid, t.val FROM {ord} o "
        "FULL JOIN ({cust} c LEFT JOIN {tags} t ON c.cid = t.cid) ON o.cid = c.cid"
    ),
    # keyed top over a FULL join: MIN/MAX must not see phantom inserts from the padding terms
    "agg_full": (
        "SELECT c.region, COUNT(*) AS n, COUNT(o.oid) AS no, SUM(o.qty) AS sq, MAX(o.qty) AS mx, "
        "MIN(c.credit) AS mn FROM {ord} o FULL JOIN {cust} c ON o.cid = c.cid GROUP BY c.region"
    ),
    # semi/anti joins as conjuncts: EXISTS + IN ANDed, NOT EXISTS with equality and non-equality correlation,
    # correlated and uncorrelated NOT IN (NULLs on both sides), Spark's LEFT SEMI / LEFT ANTI JOIN
    "semi_anti": (
        "SELECT 'exists_and_in' AS b, o.oid AS id, o.qty AS v FROM {ord} o "
        "WHERE EXISTS (SELECT 1 FROM {cust} c WHERE c.cid = o.cid AND c.credit > 3) "
        "AND o.qty IN (SELECT t.val FROM {tags} t) "
        "UNION ALL SELECT 'not_exists', o.oid, o.qty FROM {ord} o "
        "WHERE NOT EXISTS (SELECT 1 FROM {tags} t WHERE t.cid = o.cid AND t.val > o.qty) "
        "UNION ALL SELECT 'not_in_corr', o.oid, o.qty FROM {ord} o "
        "WHERE o.qty NOT IN (SELECT t.val FROM {tags} t WHERE t.cid = o.cid) "
        "UNION ALL SELECT 'not_in', o.oid, o.qty FROM {ord} o WHERE o.cid NOT IN (SELECT t.cid FROM {tags} t WHERE t.val = 3) "
        "UNION ALL SELECT 'left_semi', c.cid, c.credit FROM {cust} c LEFT SEMI JOIN {ord} o "
        "ON o.cid = c.cid AND o.qty > c.credit "
        "UNION ALL SELECT 'left_anti', c.cid, c.credit FROM {cust} c LEFT ANTI JOIN {tags} t ON t.cid = c.cid"
    ),
    # subquery predicates under OR / NOT (mark joins) and quantified comparisons
    "subq_or_quant": (
        "SELECT 'or' AS b, o.oid AS id, o.qty AS v FROM {ord} o WHERE o.qty > 7 "
        "OR EXISTS (SELECT 1 FROM {cust} c WHERE c.cid = o.cid AND c.region = 1) "
        "OR o.cid NOT IN (SELECT t.cid FROM {tags} t WHERE t.val < 2) "
        "UNION ALL SELECT 'not_and', o.oid, o.qty FROM {ord} o "
        "WHERE NOT (o.qty IN (SELECT t.val FROM {tags} t WHERE t.cid = o.cid) AND o.cid IN (SELECT c.cid FROM {cust} c)) "
        "UNION ALL SELECT 'gt_all', o.oid, o.qty FROM {ord} o WHERE o.qty > ALL (SELECT t.val FROM {tags} t WHERE t.cid = o.cid) "
        "UNION ALL SELECT 'lt_any', o.oid, o.qty FROM {ord} o WHERE o.qty < ANY (SELECT c.credit FROM {cust} c WHERE c.region = 2) "
        "UNION ALL SELECT 'not_ge_all_or', o.oid, o.qty FROM {ord} o "
        "WHERE NOT (o.qty >= ALL (SELECT c.credit FROM {cust} c WHERE c.cid <> o.cid)) OR o.cid IS NULL"
    ),
    # keyed top over a semi-join with a non-equality correlation
    "agg_semi": (
        "SELECT t.cid, COUNT(*) AS n, SUM(t.val) AS s FROM {tags} t "
        "WHERE EXISTS (SELECT 1 FROM {ord} o WHERE o.cid = t.cid AND o.qty >= t.val) GROUP BY t.cid"
    ),
}

_QUANTIFIED = re.compile(r"\b(ALL|ANY|SOME)\s*\(\s*SELECT\b", re.IGNORECASE)


class QuantifiedSpark:
    """Spark SQL cannot parse ``x op ALL/ANY (subquery)``. The oracle's own queries go through the rewrite
    the FULL refresh uses (CASE over two EXISTS, SQL's three-valued result), while the stream table is
    maintained by the semi-/anti-join rule: two formulations that check each other. The rewrite itself is
    checked against hand-computed truth values in :func:`test_quantified_rewrite_truth_table`."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark

    def sql(self, query: str, *args: Any, **kwargs: Any) -> Any:
        if _QUANTIFIED.search(query):
            query = expand_quantified(sqlglot.parse_one(query, read="spark")).sql(dialect="spark")
        return self._spark.sql(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)


CHURN = [Churn("ord", "cid", "cust"), Churn("tags", "cid", "cust", p=0.25)]


def test_join_family_differential(spark: Any, st: Any) -> None:
    """Every construct above equals its query after each of >= 20 random change cycles (refreshed
    DIFFERENTIAL: run_oracle fails on any other action), with join-key churn against deleted partners."""
    run_oracle(QuantifiedSpark(spark), st, [ORD, CUST, TAGS], QUERIES, cycles=CYCLES, seed=404, churn=CHURN)


@pytest.mark.slow
def test_join_family_one_branch_per_construct(spark: Any, st: Any) -> None:
    """The same scope with one UNION ALL branch per construct (more of them, e.g. LEFT SEMI / ANTI JOIN,
    uncorrelated ANY, NOT (... AND ...)), so a failure names its construct."""
    run_oracle(QuantifiedSpark(spark), st, [ORD, CUST, TAGS], BRANCH_QUERIES, cycles=CYCLES, seed=505, churn=CHURN)


def test_quantified_rewrite_truth_table(spark: Any) -> None:
    """x op ALL/ANY (subquery) rewritten for Spark gives SQL's three-valued answer (TRUE / FALSE / NULL),
    including the empty subquery, NULL x and NULL among the values."""
    cases = [  # (x, values, > ALL, = ANY, < ANY)
        (5, [1, 2], True, False, False),
        (5, [1, 7], False, False, True),
        (5, [], True, False, False),
        (5, [1, None], None, None, None),
        (5, [9, None], False, None, True),
        (5, [5, None], False, True, None),
        (None, [1], None, None, None),
        (None, [], True, False, False),
    ]
    values = ", ".join(f"({i}, {v if v is not None else 'NULL'})" for i, (_, vs, *_r) in enumerate(cases) for v in vs)
    xs = ", ".join(f"({i}, {x if x is not None else 'NULL'})" for i, (x, *_r) in enumerate(cases))
    query = (
        f"SELECT l.i, l.x > ALL (SELECT s.v FROM s WHERE s.i = l.i) AS gt_all, "
        f"l.x = ANY (SELECT s.v FROM s WHERE s.i = l.i) AS eq_any, "
        f"l.x < SOME (SELECT s.v FROM s WHERE s.i = l.i) AS lt_any "
        f"FROM (SELECT * FROM VALUES {xs} AS l(i, x)) l"
    )
    spark.sql(f"CREATE OR REPLACE TEMP VIEW s AS SELECT * FROM VALUES {values} AS s(i, v)")
    got = {r["i"]: (r["gt_all"], r["eq_any"], r["lt_any"]) for r in QuantifiedSpark(spark).sql(query).collect()}
    want = {i: tuple(c[2:]) for i, c in enumerate(cases)}
    assert got == want
