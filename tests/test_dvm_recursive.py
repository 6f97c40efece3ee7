"""WITH RECURSIVE in the differentiation engine, without a JVM: which rule a recursive CTE gets (and why),
which relations each rule reads, and what is still refused. The rules' results are checked against Spark
in tests/test_oracle_recursive.py."""

from __future__ import annotations

import pytest
from dvm_rendering import computed, full_sql, loops, merge_sql, refresh_context

import dvm
from dvm import Context, SourceRef, UnsupportedError
from dvm.operators import RecursiveCte
from dvm.parser import analyzable

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

SCHEMAS = {
    "org": [("id", "int"), ("name", "string"), ("parent", "int")],
    "edges": [("src", "int"), ("dst", "int")],
    "nodes": [("id", "int"), ("ok", "boolean")],
}
TREE = (
    "WITH RECURSIVE t AS (SELECT id, name, parent, name AS path, 0 AS depth FROM org WHERE parent IS NULL "
    "UNION ALL SELECT o.id, o.name, o.parent, concat(t.path, '/', o.name), t.depth + 1 "
    "FROM org o JOIN t ON o.parent = t.id) "
)
REACH = "WITH RECURSIVE r(a, b) AS (SELECT src, dst FROM edges UNION SELECT r.a, e.dst FROM r JOIN edges e ON r.b = e.src) "
TYPES5 = ["int", "string", "int", "string", "int"]


def ctx(*changed: str, inserts_only: bool = False) -> Context:
    refs = {k: SourceRef(f"/w/{k}", 5, 4 if k in changed else 5, insert_only=inserts_only and k in changed)
            for k in SCHEMAS}
    return refresh_context(refs)


def everything(c: Context, sql: str | None) -> str:
    """The query and the loops it reads (the refresh runs those first), as one text to search."""
    assert sql is not None
    return "\n".join([sql] + [f"{s.seed}\n{s.step or ''}" for _, s in c.fixpoints])


def rec(plan: dvm.Plan) -> RecursiveCte:
    return next(n for n in plan.root.walk() if isinstance(n, RecursiveCte))


def test_recursive_cte_is_an_operator_with_its_strategy() -> None:
    plan = dvm.compile_query(TREE + "SELECT id, name, parent, path, depth FROM t", SCHEMAS)
    r = rec(plan)
    assert r.columns == ["id", "name", "parent", "path", "depth"] and not r.distinct
    assert r.shape is not None and [o.alias for o in r.shape.occurrences] == ["o"]
    assert r.shape.occurrences[0].columns == ["id", "name", "parent"]
    text = plan.tree_text()
    assert "RecursiveCte t (UNION ALL)" in text and "semi-naive" in text and "counting" in text
    assert r.anchor is not None  # the anchor has its own operator tree (its delta rule gives ΔA)


def test_rule_per_window_and_notes() -> None:
    plan = dvm.compile_query(TREE + "SELECT id, name, parent, path, depth FROM t", SCHEMAS)
    c = ctx("org", inserts_only=True)
    sql = everything(c, merge_sql(plan, c, TYPES5))
    assert c.notes == ["recursive CTE t: semi-naive (the window only inserted rows)"]
    assert len(loops(c)) == 1 and "_k0" not in sql  # New only: no deletion half
    c = ctx("org")
    sql = everything(c, merge_sql(plan, c, TYPES5))
    assert c.notes == ["recursive CTE t: counting (the window deleted or updated rows)"]
    lost, new = (s for _, s in loops(c))  # weighted loops netted per round
    assert lost.weighted and new.weighted and lost.columns[-1] == "__w"
    assert "_k0" in lost.step and "__trickle_prev__" in lost.step  # Lost propagates over kept rows
    assert loops(c)[0][0] in new.seed and "_rk" in new.seed  # New starts from R_pre − Lost
    assert "_k0" not in new.step and "VERSION AS OF 5" in new.step  # and propagates over Q


def test_old_result_is_read_from_the_stream_table_when_it_stores_the_cte() -> None:
    """SELECT of every CTE column (any order): R_pre = the stream table (each stored row weighs 1), no pre
    recursion. Projecting fewer columns: R_pre is the recursion evaluated on the old snapshot."""
    plan = dvm.compile_query(TREE + "SELECT depth, path, id, parent, name FROM t", SCHEMAS)
    c = ctx("org")
    sql = everything(c, merge_sql(plan, c, ["int", "string", "int", "int", "string"]))
    assert "CAST(1 AS BIGINT) AS __w FROM delta.`/w/st`" in sql and "WITH RECURSIVE" not in sql
    assert "`path` AS `path`" in sql  # user column -> CTE column by name
    narrow = dvm.compile_query(TREE + "SELECT id, depth FROM t", SCHEMAS)
    c = ctx("org")
    sql = everything(c, merge_sql(narrow, c, ["int", "int"]))
    assert "AS __w FROM delta.`/w/st`" not in sql
    r_pre = computed(c)[0][1]  # the old result, recomputed once by Spark's recursion on P
    assert r_pre.step is None and "WITH RECURSIVE" in r_pre.seed and "VERSION AS OF 4" in r_pre.seed


def test_only_the_anchor_changed_reads_no_old_result() -> None:
    q = ("WITH RECURSIVE t AS (SELECT id FROM nodes WHERE ok UNION ALL SELECT e.dst FROM edges e JOIN t "
         "ON e.src = t.id WHERE e.src < e.dst) SELECT id FROM t")
    plan = dvm.compile_query(q, SCHEMAS)
    c = ctx("nodes")
    sql = everything(c, merge_sql(plan, c, ["int"]))
    assert "_rp" not in sql and "table_changes_by_path('/w/edges'" not in sql
    assert merge_sql(plan, ctx(), ["int"]) is None


def test_several_occurrences_telescope() -> None:
    """F_D = F(D_e, P_n) + F(K_e, D_n): one term per changed occurrence, earlier ones at K."""
    q = ("WITH RECURSIVE t AS (SELECT id FROM nodes WHERE ok UNION ALL SELECT e.dst FROM t JOIN edges e "
         "ON e.src = t.id JOIN nodes n ON n.id = e.dst WHERE n.ok AND e.src < e.dst) SELECT id FROM t")
    plan = dvm.compile_query(q, SCHEMAS)
    r = rec(plan)
    assert r.shape is not None and [(o.alias, o.source) for o in r.shape.occurrences] == [("e", "edges"), ("n", "nodes")]
    c = ctx("edges", "nodes")
    sql = everything(c, merge_sql(plan, c, ["int"]))
    assert "_k0" in sql and "_k1" in sql and "_d1" in sql


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        ("SELECT o.id, o.name, o.parent, t.path, t.depth + 1 FROM t LEFT JOIN org o ON o.parent = t.id",
         "LEFT JOIN"),
        ("SELECT DISTINCT o.id, o.name, o.parent, t.path, t.depth + 1 FROM org o JOIN t ON o.parent = t.id",
         "DISTINCT"),
        ("SELECT o.id, o.name, o.parent, t.path, t.depth + 1 FROM (SELECT * FROM org WHERE id > 0) o "
         "JOIN t ON o.parent = t.id", "subquery"),
        ("SELECT o.id, o.name, o.parent, t.path, t.depth + 1 FROM org o JOIN t ON o.parent = t.id "
         "WHERE o.id NOT IN (SELECT src FROM edges)", "subquery"),
    ],
)
def test_terms_that_are_not_linear_and_monotone_use_recompute_diff(step: str, reason: str) -> None:
    q = ("WITH RECURSIVE t AS (SELECT id, name, parent, name AS path, 0 AS depth FROM org WHERE parent IS NULL "
         f"UNION ALL {step}) SELECT id, name, parent, path, depth FROM t")
    plan = dvm.compile_query(q, SCHEMAS)
    r = rec(plan)
    assert r.shape is None and reason in r.shape_reason
    c = ctx("org")
    sql = merge_sql(plan, c, TYPES5)
    assert sql is not None and "recompute-diff" in c.notes[0] and reason in c.notes[0]
    assert "VERSION AS OF 5" in sql and "AS __w FROM delta.`/w/st`" in sql  # post recursion minus the stored result
    assert "recompute-diff" in plan.tree_text()


def test_set_semantics_render_fixpoints_in_order() -> None:
    plan = dvm.compile_query(REACH + "SELECT a, b FROM r", SCHEMAS)
    assert rec(plan).distinct and "DRed" in plan.tree_text()
    c = ctx("edges")
    sql = merge_sql(plan, c, ["int", "int"])
    assert sql is not None and c.notes == ["recursive CTE r: DRed (the window deleted or updated rows)"]
    names = [n for n, _ in loops(c)]
    assert len(names) == 3 and all(n in sql for n in (names[0], names[1], names[2]))
    od, rd, new = (s for _, s in loops(c))
    assert "__trickle_prev__" in od.step and "INTERSECT" in od.step  # over-deletion stays inside R_pre
    assert names[0] in rd.seed and names[0] in rd.step  # re-derivation stays inside the over-deleted set
    assert names[1] in new.seed and "EXCEPT" in new.step  # insertion skips what survived
    c = ctx("edges", inserts_only=True)
    merge_sql(plan, c, ["int", "int"])
    assert len(loops(c)) == 1 and "semi-naive" in c.notes[0]
    full = refresh_context({k: SourceRef(f"/w/{k}", 5) for k in SCHEMAS})
    sql = full_sql(plan, full, ["int", "int"])
    assert len(loops(full)) == 1 and loops(full)[0][0] in sql and "UNION ALL" not in loops(full)[0][1].step


def test_analyzable_turns_recursive_union_into_union_all() -> None:
    out = analyzable(REACH + "SELECT a, b FROM r")
    assert "UNION ALL" in out.upper()
    plain = "SELECT src FROM edges UNION SELECT dst FROM edges"
    assert analyzable(plain) == plain


def test_anchor_the_tree_cannot_build_is_diffed_natively() -> None:
    q = ("WITH RECURSIVE t AS (SELECT MIN(id) AS id, size(histogram_numeric(id, 3)) AS rk FROM org "
         "WHERE parent IS NULL "
         "UNION ALL SELECT o.id, t.rk FROM org o JOIN t ON o.parent = t.id) SELECT id, rk FROM t")
    plan = dvm.compile_query(q, SCHEMAS)
    assert rec(plan).anchor is None and any("evaluating it twice" in n for n in plan.notes)
    c = ctx("org")
    assert "HISTOGRAM_NUMERIC" in everything(c, merge_sql(plan, c, ["int", "int"])).upper()


@pytest.mark.parametrize(
    ("query", "construct"),
    [
        ("WITH RECURSIVE t AS (SELECT id FROM org UNION ALL SELECT o.id FROM org o JOIN t ON o.parent = t.id "
         "WHERE rand() < 0.5) SELECT id FROM t", "volatile function"),
        ("WITH RECURSIVE t AS (SELECT id FROM org UNION ALL SELECT o.id FROM org o JOIN t ON o.parent = t.id "
         "LIMIT 10) SELECT id FROM t", "LIMIT"),
    ],
)
def test_nondeterminism_inside_a_recursive_cte_is_refused(query: str, construct: str) -> None:
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query(query, SCHEMAS)
    assert e.value.construct == construct


def test_recursive_cte_under_an_aggregate_and_a_join() -> None:
    """The CTE is an operator like any other: its delta feeds a keyed top, or a join."""
    agg = dvm.compile_query(TREE + "SELECT depth, COUNT(*) AS n FROM t GROUP BY depth", SCHEMAS)
    assert agg.layout == "keyed" and merge_sql(agg, ctx("org"), ["int", "bigint"]) is not None
    join = dvm.compile_query(TREE + "SELECT t.path, e.dst FROM t JOIN edges e ON e.src = t.id", SCHEMAS)
    assert merge_sql(join, ctx("org", "edges"), ["string", "int"]) is not None
