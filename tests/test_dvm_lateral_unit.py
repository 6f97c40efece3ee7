"""Generators, LATERAL, views and the safety rejections without a JVM: the operator trees, the shape of their
delta SQL, view inlining with a stub catalog, and the messages of what is refused."""

from __future__ import annotations

import pytest
from dvm_rendering import merge_sql, refresh_context

import dvm
from dvm import Context, QueryError, SourceRef, UnsupportedError
from dvm.operators import Generate, LateralJoin
from dvm.views import ViewDef, inline_views

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

SCHEMAS = {
    "a": [("id", "int"), ("k", "int"), ("w", "int"), ("arr", "array<int>"), ("m", "map<string,int>"),
          ("st", "array<struct<x:int,y:string>>")],
    "b": [("id", "int"), ("k", "int"), ("v", "int")],
}


def ctx(a_changed: bool = True, b_changed: bool = True) -> Context:
    return refresh_context({"a": SourceRef("/w/a", 5, 4 if a_changed else 5),
                            "b": SourceRef("/w/b", 9, 8 if b_changed else 9)})


def nodes(plan: dvm.Plan, kind: type) -> list:
    return [n for n in plan.root.walk() if isinstance(n, kind)]


@pytest.mark.parametrize(
    ("query", "names", "outer"),
    [
        ("SELECT a.id, e.x FROM a LATERAL VIEW explode(a.arr) e AS x", ["id", "x"], False),
        ("SELECT id, p, x FROM a LATERAL VIEW OUTER posexplode(arr) e AS p, x", ["id", "p", "x"], True),
        ("SELECT id, explode(arr) AS x FROM a", ["id", "x"], False),
        ("SELECT id, explode(m) FROM a", ["id", "key", "value"], False),  # a map: two columns
        ("SELECT id, posexplode_outer(arr) AS (p, x) FROM a", ["id", "p", "x"], False),
        ("SELECT id, inline(st) FROM a", ["id", "x", "y"], False),  # struct fields
        ("SELECT id, stack(2, k, w) AS s FROM a", ["id", "s"], False),
        ("SELECT k, explode(collect_list(id)) AS x FROM a GROUP BY k", ["k", "x"], False),
    ],
)
def test_generators_are_differentiated_by_applying_them_to_the_delta(query: str, names: list[str],
                                                                     outer: bool) -> None:
    plan = dvm.compile_query(query, SCHEMAS)
    assert plan.names == names and plan.layout == "bag"
    (gen,) = nodes(plan, Generate)
    assert gen.outer == outer and len(gen.out) == len(names) - 1
    assert "generator applied to the input delta" in plan.tree_text()
    sql = merge_sql(plan, ctx(b_changed=False), ["string"] * len(names))
    assert sql is not None and "LATERAL VIEW " in sql
    if "GROUP BY" not in query:  # linear: no snapshot of the pre frontier (the nested aggregate rescans)
        assert "VERSION AS OF 4" not in sql


def test_lateral_view_needs_column_names() -> None:
    with pytest.raises(UnsupportedError, match="AS x"):
        dvm.compile_query("SELECT a.id, e.col FROM a LATERAL VIEW explode(a.arr) e", SCHEMAS)


def test_lateral_subquery_recomputes_affected_rows_on_both_snapshots() -> None:
    """Top-N per left row: a change of b reaches the left rows its correlation matches; those are
    recomputed at the pre and the post frontier and netted. Ties are broken by the output columns."""
    plan = dvm.compile_query(
        "SELECT a.id, t.v FROM a, LATERAL (SELECT b.v FROM b WHERE b.k = a.k AND b.v > 0 ORDER BY b.v DESC "
        "LIMIT 3) t", SCHEMAS)
    (lat,) = nodes(plan, LateralJoin)
    assert lat.kind == "CROSS" and len(lat.inner) == 1
    (src,) = lat.inner
    assert src.filter is not None and "> 0" in src.filter.sql() and [c for c, _ in src.scan.columns] == ["k", "v"]
    assert "row-scoped recompute" in plan.tree_text()
    assert "ORDER BY b.v DESC, b.v" in lat.item.sql("spark")  # the tie-break
    both = merge_sql(plan, ctx(), ["int", "int"])
    assert both is not None
    assert "delta.`/w/b` VERSION AS OF 8" in both and "delta.`/w/b` VERSION AS OF 9" in both  # pre and post
    assert "LEFT SEMI JOIN" in both and "HAVING SUM(__w) <> 0" in both
    left_only = merge_sql(plan, ctx(b_changed=False), ["int", "int"])
    assert left_only is not None and "VERSION AS OF 8" not in left_only and "LEFT SEMI JOIN" not in left_only
    assert merge_sql(plan, ctx(False, False), ["int", "int"]) is None


@pytest.mark.parametrize(
    ("query", "kind", "reached"),
    [
        ("SELECT a.id, t.s FROM a, LATERAL (SELECT SUM(v) AS s, COUNT(*) AS n FROM b WHERE b.k = a.k) t",
         "CROSS", True),
        ("SELECT a.id, t.v FROM a LEFT JOIN LATERAL (SELECT b.v FROM b WHERE b.k = a.k) t ON TRUE", "LEFT", True),
        ("SELECT a.id, t.v FROM a JOIN LATERAL (SELECT b.v FROM b WHERE b.k = a.k) t ON t.v > a.w", "INNER", True),
        # a disjunction over b and a is still a condition on the changed row of b
        ("SELECT a.id, t.v FROM a, LATERAL (SELECT b.v FROM b WHERE b.k = a.k OR b.v = 1) t", "CROSS", True),
        # correlated only through two tables at once: any change of either reaches every left row
        ("SELECT a.id, t.v FROM a, LATERAL (SELECT b1.v FROM b b1 JOIN b b2 ON b1.id = b2.k "
         "WHERE b1.k + b2.k = a.k) t", "CROSS", False),
        # b read in a nested subquery of the lateral item: no usable correlation either
        ("SELECT a.id, t.n FROM a, LATERAL (SELECT COUNT(*) AS n FROM b b1 WHERE b1.k = a.k AND EXISTS "
         "(SELECT 1 FROM b b2 WHERE b2.id = b1.v)) t", "CROSS", None),
    ],
)
def test_lateral_joins_and_what_reaches_a_left_row(query: str, kind: str, reached: bool | None) -> None:
    plan = dvm.compile_query(query, SCHEMAS)
    (lat,) = nodes(plan, LateralJoin)
    assert lat.kind == kind
    filters = [s.filter is not None for s in lat.inner]
    if reached is None:
        assert sorted(filters) == [False, True]  # b1 correlated, b2 (nested) reaches every row
    else:
        assert set(filters) == {reached}
    assert merge_sql(plan, ctx(), ["int", "int"]) is not None


def test_lateral_table_function_is_linear() -> None:
    plan = dvm.compile_query("SELECT a.id, t.x FROM a LEFT JOIN LATERAL explode(a.arr) AS t(x) ON t.x > a.w",
                             SCHEMAS)
    (lat,) = nodes(plan, LateralJoin)
    assert lat.inner == [] and "a function of each left row" in lat.strategy()
    sql = merge_sql(plan, ctx(), ["int", "int"])
    assert sql is not None and "LEFT SEMI JOIN" not in sql and "LEFT JOIN LATERAL EXPLODE(`__l`." in sql


def test_lateral_subquery_can_read_a_cte() -> None:
    plan = dvm.compile_query("WITH big AS (SELECT * FROM b WHERE v > 10) SELECT a.id, t.v FROM a, "
                             "LATERAL (SELECT big.v FROM big WHERE big.k = a.k ORDER BY big.v LIMIT 1) t", SCHEMAS)
    (lat,) = nodes(plan, LateralJoin)
    assert [s.scan.source for s in lat.inner] == ["b"] and lat.inner[0].filter is None  # read through a CTE


# --------------------------------------------------------------------------------------------------
# Safety rejections
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "construct", "needle"),
    [
        ("SELECT id FROM a LIMIT 3", "LIMIT", "add an ORDER BY"),
        ("SELECT a.id, t.v FROM a, LATERAL (SELECT b.v FROM b WHERE b.k = a.k LIMIT 2) t", "LIMIT",
         "add an ORDER BY"),
        ("SELECT a.id, t.v FROM a, LATERAL (SELECT s.v FROM (SELECT b.v FROM b ORDER BY b.v LIMIT 2) s) t",
         "LIMIT", "top level"),
        ("SELECT a.id, t.l FROM a, LATERAL (SELECT collect_list(b.v) AS l FROM b WHERE b.k = a.k) t",
         "order-dependent aggregate", "array_sort(collect_list"),
        ("SELECT a.id, t.f FROM a, LATERAL (SELECT first(b.v) AS f FROM b WHERE b.k = a.k) t",
         "order-dependent aggregate", "first()"),
        ("SELECT a.id, t.r FROM a, LATERAL (SELECT row_number() OVER (ORDER BY b.v) AS r FROM b "
         "WHERE b.k = a.k) t", "window function", "LATERAL"),
        ("SELECT id FROM a TABLESAMPLE (10 PERCENT)", "TABLESAMPLE", "xxhash64"),
        ("SELECT id, rand() AS r FROM a", "volatile function", "different value at every evaluation"),
        ("SELECT id, uuid() AS u FROM a", "volatile function", "uuid()"),
        ("SELECT id, shuffle(arr) AS s FROM a", "volatile function", "shuffle()"),
        ("SELECT id, monotonically_increasing_id() AS m FROM a", "volatile function", "monotonically"),
        ("SELECT id FROM a WHERE k > rand() * 5", "volatile function", "rand()"),
        ("SELECT a.id, t.v FROM a, LATERAL (SELECT b.v FROM b WHERE b.k = a.k AND rand() > 0.5) t",
         "volatile function", "rand()"),
        ("SELECT id, current_timestamp() AS t FROM a", "volatile function", "differs between refreshes"),
        ("SELECT id, now() AS t FROM a", "volatile function", "differs between refreshes"),
        ("SELECT id, current_date AS d FROM a", "volatile function", "differs between refreshes"),
        ("SELECT id, localtimestamp AS d FROM a", "volatile function", "differs between refreshes"),
        ("SELECT id, unix_timestamp() AS t FROM a", "volatile function", "differs between refreshes"),
    ],
)
def test_unsafe_constructs_are_refused_with_what_to_do(query: str, construct: str, needle: str) -> None:
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query(query, SCHEMAS)
    assert e.value.construct == construct and needle in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("query", "names", "kept"),
    [
        # with an argument: deterministic
        ("SELECT id, unix_timestamp(CAST(k AS STRING)) AS t FROM a", ["id", "t"], ["UNIX_TIMESTAMP("]),
        # a column named like a function
        ("SELECT upper(uuid) AS u FROM (SELECT 'x' AS uuid FROM a) s", ["u"], ["UPPER("]),
        ("SELECT localtimestamp FROM (SELECT k AS localtimestamp FROM a) s", ["localtimestamp"], ["`localtimestamp`"]),
        ("SELECT a.id, t.l FROM a, LATERAL (SELECT array_sort(collect_list(b.v)) AS l, mode(b.v, true) AS m, "
         "approx_count_distinct(b.v) AS d FROM b WHERE b.k = a.k) t", ["id", "l"],
         ["ARRAY_SORT(COLLECT_LIST(", "MODE(", "APPROX_COUNT_DISTINCT("]),
    ],
)
def test_deterministic_lookalikes_are_accepted(query: str, names: list[str], kept: list[str]) -> None:
    """Maintained differentially, with the lookalike kept as written in the delta the refresh runs."""
    plan = dvm.compile_query(query, {**SCHEMAS, "a": SCHEMAS["a"] + [("localtimestamp", "int")]})
    assert plan.names == names
    sql = merge_sql(plan, ctx(), ["string"] * len(names))
    assert sql is not None and all(k in sql for k in kept), sql


# --------------------------------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------------------------------

VIEWS = {
    "db.v1": ViewDef("db.v1", "SELECT id, k FROM base WHERE k > 0", ["id", "k"], {"ns": "db"}),
    "v2": ViewDef("v2", "SELECT id, k + 1 AS kk FROM db.v1", ["x", "y"], {"ns": ""}),
    "loop": ViewDef("loop", "SELECT * FROM loop", ["a"], {"ns": ""}),
}


def resolve(name: str, inside: ViewDef | None) -> str | ViewDef:
    """A stub catalog: names inside ``db.v1`` resolve in ``db``."""
    full = name if inside is None or "." in name or not inside.context["ns"] else f"{inside.context['ns']}.{name}"
    return VIEWS.get(full, full)


def test_views_are_inlined_recursively_with_their_column_names() -> None:
    sql, views = inline_views("SELECT v.x, v.y FROM v2 v JOIN b ON b.k = v.y", resolve)
    assert views == ["v2", "db.v1"]
    assert "FROM db.base AS base" in sql and "AS v(x, y)" in sql and "AS v1(id, k)" in sql
    assert sorted(dvm.source_keys(sql)) == ["b", "db.base"]
    plan = dvm.compile_query(sql, {"db.base": [("id", "int"), ("k", "int")], "b": SCHEMAS["b"]})
    assert plan.names == ["x", "y"]


def test_queries_without_views_are_unchanged_and_cycles_refused() -> None:
    assert inline_views("SELECT a.id FROM a", resolve) == ("SELECT a.id FROM a", [])
    with pytest.raises(QueryError, match="cycle"):
        inline_views("SELECT * FROM loop", resolve)
