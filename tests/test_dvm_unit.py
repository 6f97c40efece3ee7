"""The differentiation engine without a JVM: parsing, rejections and the shape of generated SQL."""

from __future__ import annotations

import pytest

import dvm
from dvm import Context, QueryError, SourceRef, UnsupportedError
from dvm.operators.join import InnerJoin
from dvm.plan import bag_rows_sql

SCHEMAS = {
    "emp": [("id", "int"), ("name", "string"), ("dept", "int"), ("sal", "double")],
    "dept": [("id", "int"), ("dname", "string")],
}


def ctx(emp_changed: bool = True, dept_changed: bool = True) -> Context:
    return Context(
        {
            "emp": SourceRef("/w/emp", 5, 4 if emp_changed else 5),
            "dept": SourceRef("/w/dept", 9, 8 if dept_changed else 9),
        },
        target_path="/w/st",
    )


def test_layouts() -> None:
    assert dvm.compile_query("SELECT dept, SUM(sal) AS s FROM emp GROUP BY dept", SCHEMAS).layout == "keyed"
    assert dvm.compile_query("SELECT DISTINCT dept FROM emp", SCHEMAS).layout == "keyed"
    assert dvm.compile_query("SELECT e.name FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS).layout == "bag"


def test_inner_join_delta_reads_post_snapshots_only() -> None:
    """ΔL ⋈ R_post + L_post ⋈ ΔR − ΔL ⋈ ΔR: no time travel to the pre frontier (a snapshot per version
    costs a Spark job), and the correction term keeps join-key-change-plus-delete exact."""
    plan = dvm.compile_query("SELECT e.name, d.dname FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS)
    sql = plan.merge_source_sql(ctx(), ["string", "string"])
    assert sql is not None
    assert "delta.`/w/dept` VERSION AS OF 9" in sql and "delta.`/w/emp` VERSION AS OF 5" in sql
    assert "VERSION AS OF 8" not in sql and "VERSION AS OF 4" not in sql
    assert "-(__l.__w * __r.__w)" in sql  # the ΔL ⋈ ΔR correction
    assert "table_changes_by_path('/w/emp', 5, 5)" in sql
    assert "table_changes_by_path('/w/dept', 9, 9)" in sql
    # with both sides changed the join's delta is netted before anything reads it: an inserted row joined
    # with a partner deleted in the same window is a +1/-1 pair of a tuple that never existed, which
    # MIN/MAX above would otherwise take for an inserted value
    join = next(n for n in plan.root.walk() if isinstance(n, InnerJoin))
    both = join.delta(ctx())
    assert both is not None and both.rstrip().endswith("HAVING SUM(__w) <> 0")
    one = join.delta(ctx(dept_changed=False))
    assert one is not None and "-(__l.__w * __r.__w)" not in one and not one.rstrip().endswith("<> 0")


def test_unchanged_sources_drop_their_terms() -> None:
    plan = dvm.compile_query("SELECT e.name, d.dname FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS)
    sql = plan.merge_source_sql(ctx(dept_changed=False), ["string", "string"])
    assert sql is not None and "table_changes_by_path('/w/dept'" not in sql
    assert plan.merge_source_sql(ctx(False, False), ["string", "string"]) is None


def test_only_used_columns_are_read_and_consolidated() -> None:
    plan = dvm.compile_query("SELECT name FROM emp WHERE sal > 1", SCHEMAS)
    scan = [n for n in plan.root.walk() if n.label().startswith("Scan")][0]
    assert scan.label() == "Scan emp [name, sal]"


@pytest.mark.parametrize(
    ("query", "construct"),
    [
        ("SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS rn FROM emp", "window function"),
        ("SELECT id FROM emp LIMIT 3", "LIMIT"),
        ("SELECT id, rand() AS r FROM emp", "volatile function"),
        ("SELECT id FROM emp WHERE dept IN (SELECT id FROM dept)", "subquery predicate"),
        ("SELECT COUNT(DISTINCT dept) AS n FROM emp", "COUNT(DISTINCT)"),
        ("SELECT id FROM emp INTERSECT SELECT id FROM dept", "INTERSECT"),
    ],
)
def test_unsupported_constructs_are_named(query: str, construct: str) -> None:
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query(query, SCHEMAS)
    assert e.value.construct == construct
    assert "refresh_mode" in str(e.value) or "instead" in str(e.value)


@pytest.mark.parametrize(
    ("query", "needle"),
    [("SELECT FROM WHERE", "invalid SQL"), ("SELECT x FROM nope", "nope"), ("SELECT nope FROM emp", "nope"),
     ("INSERT INTO emp VALUES (1)", "SELECT")],
)
def test_query_errors_name_the_problem(query: str, needle: str) -> None:
    with pytest.raises(QueryError, match=needle):
        dvm.compile_query(query, SCHEMAS)


def test_float_row_ids_tolerate_summation_order() -> None:
    sql = bag_rows_sql("SELECT 1", ["a", "b"], ["double", "int"], "__w")
    assert "format_string('%.12g', `a` + 0.0)" in sql and "MAX(`a`) AS `a`" in sql


def test_keyed_top_keeps_algebraic_state() -> None:
    plan = dvm.compile_query("SELECT dept, SUM(sal) AS s, AVG(sal) AS a, MIN(sal) AS m FROM emp GROUP BY dept",
                             SCHEMAS)
    assert plan.hidden_columns() == ["__row_id", "__cnt", "__agg0_sum", "__agg0_nn", "__agg1_sum", "__agg1_nn",
                                     "__agg2_ext"]
    sql = plan.merge_source_sql(ctx(dept_changed=False), ["int", "double", "double", "double"])
    assert sql is not None and "LEFT JOIN delta.`/w/st` __o" in sql and "__rescan" in sql
    assert "algebraic" in plan.tree_text()
