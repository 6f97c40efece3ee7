"""Window functions, TopK and DISTINCT ON in the differentiation engine, without a JVM: the rewrites, the
tie-breakers, the shape of the delta SQL and the rejections."""

from __future__ import annotations

import pytest
import sqlglot
from dvm_rendering import delta_sql, merge_sql, refresh_context
from sqlglot import exp

import dvm
from dvm import Context, QueryError, SourceRef, UnsupportedError
from dvm.operators import Aggregate, Scan, TopK, UnionAll, Window
from dvm.operators.window import needs_tie_break, tie_broken
from dvm.parser import pin_sources

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

SCHEMAS = {
    "emp": [("id", "int"), ("name", "string"), ("dept", "int"), ("sal", "double"), ("tags", "map<string,int>")],
    "dept": [("id", "int"), ("dname", "string")],
}


def ctx(emp_changed: bool = True, dept_changed: bool = True) -> Context:
    return refresh_context({
        "emp": SourceRef("/w/emp", 5, 4 if emp_changed else 5),
        "dept": SourceRef("/w/dept", 9, 8 if dept_changed else 9),
    })


def window_of(sql: str) -> exp.Window:
    w = sqlglot.parse_one(sql, read="spark").find(exp.Window)
    assert w is not None
    return w


def node(plan: dvm.Plan, kind: type) -> object:
    return next(n for n in plan.root.walk() if isinstance(n, kind))


@pytest.mark.parametrize(
    ("call", "tie_break"),
    [
        ("ROW_NUMBER() OVER (PARTITION BY g ORDER BY x)", True),
        ("NTILE(2) OVER (ORDER BY x)", True),
        ("LAG(x) OVER (ORDER BY x)", True),
        ("LEAD(x, 2) OVER (PARTITION BY g ORDER BY x)", True),
        ("SUM(x) OVER (ORDER BY x ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)", True),
        ("FIRST_VALUE(x) OVER (PARTITION BY g)", True),  # whole unordered partition: first row is arbitrary
        ("RANK() OVER (ORDER BY x)", False),
        ("DENSE_RANK() OVER (ORDER BY x)", False),
        ("CUME_DIST() OVER (ORDER BY x)", False),
        ("SUM(x) OVER (PARTITION BY g ORDER BY x)", False),  # RANGE: tied rows are peers
        ("SUM(x) OVER (PARTITION BY g)", False),
        ("FIRST_VALUE(x) OVER (ORDER BY x)", False),  # RANGE frame: a tie-breaker would change the frame
        ("AVG(x) OVER (ORDER BY x RANGE BETWEEN 2 PRECEDING AND CURRENT ROW)", False),
    ],
)
def test_positional_windows_get_tie_breakers(call: str, tie_break: bool) -> None:
    """A positional function must give the same values when recomputed over the same rows, so every input
    column is appended to its ORDER BY; peer-based ones, and RANGE frames, are left as written."""
    w = window_of(f"SELECT {call} FROM t")
    assert needs_tie_break(w) is tie_break
    out = tie_broken(w, ["a", "b"]).sql("spark")
    assert ("`a` ASC, `b` ASC" in out or "`a`, `b`" in out) is tie_break, out


def test_unordered_first_value_keeps_its_whole_partition_frame() -> None:
    out = tie_broken(window_of("SELECT FIRST_VALUE(x) OVER (PARTITION BY g) FROM t"), ["a"]).sql("spark")
    assert "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING" in out, out


def test_tie_breakers_skip_map_columns_and_keys_already_there() -> None:
    plan = dvm.compile_query("SELECT id, tags, ROW_NUMBER() OVER (PARTITION BY dept ORDER BY id) AS rn FROM emp",
                             SCHEMAS)
    w = node(plan, Window)
    assert isinstance(w, Window)
    computed = w.computed[0][1].sql("spark")
    assert computed.count("`__t1`") == 1, computed  # id is the ORDER BY already: not appended twice
    scan_cols = dict(node(plan, dvm.operators.Scan).columns)  # type: ignore[attr-defined]
    assert f"`{scan_cols['tags']}`" not in computed and f"`{scan_cols['dept']}`" in computed


def test_one_partition_by_recomputes_the_touched_partitions_on_both_snapshots() -> None:
    plan = dvm.compile_query(
        "SELECT id, ROW_NUMBER() OVER (PARTITION BY dept ORDER BY sal DESC, id) AS rn FROM emp", SCHEMAS)
    w = node(plan, Window)
    d = delta_sql(w, ctx())  # type: ignore[attr-defined]
    assert d is not None
    assert "VERSION AS OF 5" in d and "VERSION AS OF 4" in d  # both snapshots
    assert d.count("LEFT SEMI JOIN") == 2 and "<=>" in d  # restricted to touched partitions, NULL-safe
    assert d.rstrip().endswith("HAVING SUM(__w) <> 0")  # unchanged rows cancel here
    assert "partition-scoped" in w.strategy()  # type: ignore[attr-defined]
    assert delta_sql(w, ctx(emp_changed=False)) is None  # type: ignore[attr-defined]


def test_several_partition_bys_recompute_the_closure() -> None:
    plan = dvm.compile_query(
        "SELECT id, COUNT(*) OVER (PARTITION BY dept) AS n, MAX(sal) OVER (PARTITION BY name) AS m FROM emp",
        SCHEMAS)
    w = node(plan, Window)
    assert isinstance(w, Window) and len(w.specs) == 2
    d = delta_sql(w, ctx())
    assert d is not None and "BOOL_OR(__h0)" in d and "BOOL_OR(__h1)" in d and "WHERE __aff" in d
    assert "2 PARTITION BY lists" in w.strategy()


def test_no_partition_by_recomputes_the_whole_input_and_says_so() -> None:
    plan = dvm.compile_query("SELECT id, LAG(sal) OVER (ORDER BY id) AS p FROM emp", SCHEMAS)
    w = node(plan, Window)
    assert isinstance(w, Window) and w.whole_input
    assert "whole-input recompute" in w.strategy() and "PARTITION BY" in w.strategy()
    assert "whole-input recompute" in plan.tree_text()
    d = delta_sql(w, ctx())
    assert d is not None and "WHERE EXISTS" in d


def test_window_over_group_by_evaluates_above_the_aggregate() -> None:
    plan = dvm.compile_query(
        "SELECT dept, SUM(sal) AS s, RANK() OVER (ORDER BY SUM(sal) DESC) AS r, SUM(COUNT(*)) OVER () AS t "
        "FROM emp GROUP BY dept", SCHEMAS)
    text = plan.tree_text()
    assert text.index("Window") < text.index("Aggregate"), text
    agg = node(plan, dvm.operators.Aggregate)
    assert sorted(a.func for a in agg.aggs) == ["count_star", "sum"]  # type: ignore[attr-defined]
    # a window aggregate alone does not make the query an aggregate
    plan = dvm.compile_query("SELECT id, SUM(sal) OVER (PARTITION BY dept) AS s FROM emp", SCHEMAS)
    assert "Aggregate" not in plan.tree_text() and plan.layout == "bag"


def test_any_deterministic_function_works_over_a_window() -> None:
    """Windows are recomputed, so even aggregates refused at the top of a GROUP BY are fine OVER a window."""
    plan = dvm.compile_query("SELECT id, try_sum(sal) OVER (PARTITION BY dept) AS s, percentile_cont(0.5) "
                             "WITHIN GROUP (ORDER BY sal) OVER (PARTITION BY dept) AS p FROM emp", SCHEMAS)
    assert isinstance(node(plan, Window), Window)


def test_ignore_nulls_survives_inside_a_window() -> None:
    plan = dvm.compile_query("SELECT id, FIRST_VALUE(sal) IGNORE NULLS OVER (PARTITION BY dept ORDER BY id) AS f "
                             "FROM emp", SCHEMAS)
    assert "IGNORE NULLS" in node(plan, Window).label()  # type: ignore[attr-defined]


def test_named_windows_and_qualify_are_rewritten() -> None:
    plan = dvm.compile_query("SELECT id, SUM(sal) OVER w AS s FROM emp WINDOW w AS (PARTITION BY dept ORDER BY id)",
                             SCHEMAS)
    assert "PARTITION BY" in node(plan, Window).label()  # type: ignore[attr-defined]
    plan = dvm.compile_query("SELECT id, name FROM emp QUALIFY ROW_NUMBER() OVER (PARTITION BY dept ORDER BY id) = 1",
                             SCHEMAS)
    assert plan.names == ["id", "name"] and "Filter" in plan.tree_text()
    with pytest.raises(QueryError, match="QUALIFY"):
        dvm.compile_query("SELECT * FROM emp QUALIFY ROW_NUMBER() OVER (ORDER BY id) = 1", SCHEMAS)


def test_window_function_outside_select_is_a_query_error() -> None:
    with pytest.raises(QueryError, match="SELECT list"):
        dvm.compile_query("SELECT id FROM emp WHERE ROW_NUMBER() OVER (ORDER BY id) = 1", SCHEMAS)


# --- TopK ---


def test_topk_at_the_top_diffs_the_post_top_against_the_stored_rows() -> None:
    plan = dvm.compile_query("SELECT id, sal FROM emp ORDER BY sal DESC, id LIMIT 3", SCHEMAS)
    assert plan.topk is not None and plan.layout == "bag"
    sql = merge_sql(plan, ctx(), ["int", "double"])
    assert sql is not None
    assert "VERSION AS OF 5" in sql and "VERSION AS OF 4" not in sql  # no pre snapshot
    assert "CAST(-1 AS BIGINT) AS __w FROM delta.`/w/st`" in sql  # the stored rows are TopK(pre), -1 each
    assert "LIMIT 3" in sql
    assert merge_sql(plan, ctx(emp_changed=False), ["int", "double"]) is None
    assert "merged against the stored rows" in plan.tree_text()


def test_topk_hidden_sort_columns_are_dropped_and_tie_broken() -> None:
    plan = dvm.compile_query("SELECT name FROM emp ORDER BY sal DESC LIMIT 2 OFFSET 1", SCHEMAS)
    assert plan.topk is not None and len(plan.root.cols) == 1
    order = plan.topk.order_sql()
    assert order.startswith(f"`{plan.topk.child.cols[1]}` DESC") and "ASC NULLS FIRST" in order
    assert plan.topk.limit == 2 and plan.topk.offset == 1


def test_topk_in_a_subquery_recomputes_both_snapshots() -> None:
    plan = dvm.compile_query(
        "SELECT t.id, d.dname FROM (SELECT id, dept FROM emp ORDER BY sal, id LIMIT 5) t JOIN dept d ON d.id = t.dept",
        SCHEMAS)
    assert plan.topk is None
    topk = node(plan, TopK)
    d = delta_sql(topk, ctx())  # type: ignore[attr-defined]
    assert d is not None and "VERSION AS OF 5" in d and "VERSION AS OF 4" in d


@pytest.mark.parametrize(
    ("query", "below", "bounds"),
    [
        ("SELECT dept, COUNT(*) AS n FROM emp GROUP BY dept ORDER BY COUNT(*) DESC, dept LIMIT 2", Aggregate,
         "LIMIT 2"),
        ("SELECT DISTINCT dept FROM emp ORDER BY dept LIMIT 2", Aggregate, "LIMIT 2"),
        ("SELECT id FROM emp UNION ALL SELECT id FROM dept ORDER BY id LIMIT 3", UnionAll, "LIMIT 3"),
        ("SELECT id FROM emp ORDER BY id OFFSET 2", Scan, "OFFSET 2"),
        ("SELECT id, ROW_NUMBER() OVER (ORDER BY sal, id) AS r FROM emp ORDER BY r LIMIT 2", Window, "LIMIT 2"),
    ],
)
def test_topk_shapes_compile_to_a_top_k_over_their_operator(query: str, below: type, bounds: str) -> None:
    """Each shape is a TopK at the top of the plan, over the operator its query names (GROUP BY, DISTINCT,
    UNION ALL, a window), ordered by the query's keys: its delta is the new top against the stored rows."""
    plan = dvm.compile_query(query, SCHEMAS)
    topk = plan.topk
    assert topk is not None and any(isinstance(n, below) for n in topk.child.walk())
    sql = merge_sql(plan, ctx(), ["int"] * len(plan.names))
    assert sql is not None and f"ORDER BY {topk.order_sql()} {bounds})" in sql, sql
    assert "CAST(-1 AS BIGINT) AS __w FROM delta.`/w/st`" in sql  # minus the stored rows


def test_fetch_first_is_a_limit_and_with_ties_is_refused() -> None:
    plan = dvm.compile_query("SELECT id FROM emp ORDER BY id FETCH FIRST 3 ROWS ONLY", SCHEMAS, "postgres")
    assert plan.topk is not None and plan.topk.limit == 3
    with pytest.raises(QueryError, match="WITH TIES"):
        dvm.compile_query("SELECT id FROM emp ORDER BY id FETCH FIRST 3 ROWS WITH TIES", SCHEMAS, "postgres")


def test_limit_without_order_by_suggests_order_by() -> None:
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query("SELECT id FROM emp LIMIT 3", SCHEMAS)
    assert e.value.construct == "LIMIT" and "ORDER BY" in str(e.value)


def test_order_by_of_select_distinct_must_be_selected() -> None:
    with pytest.raises(QueryError, match="SELECT DISTINCT"):
        dvm.compile_query("SELECT DISTINCT dept FROM emp ORDER BY sal LIMIT 2", SCHEMAS)


# --- DISTINCT ON ---


def test_distinct_on_is_row_number_equal_one() -> None:
    plan = dvm.compile_query("SELECT DISTINCT ON (dept) dept, name AS n FROM emp ORDER BY dept, n DESC",
                             SCHEMAS, "postgres")
    w = node(plan, Window)
    label = w.label()  # type: ignore[attr-defined]
    assert label.startswith("Window ROW_NUMBER() OVER (PARTITION BY")
    assert "DESC NULLS FIRST" in label  # PostgreSQL's NULL order, made explicit for Spark
    assert plan.names == ["dept", "n"] and "= 1" in plan.tree_text()


def test_distinct_on_with_limit_keeps_the_order_outside() -> None:
    sql = pin_sources("SELECT DISTINCT ON (dept) dept, id FROM emp ORDER BY dept, sal DESC LIMIT 2",
                      {"emp": "delta.`/w/emp` VERSION AS OF 5"})
    outer = sql[sql.rindex(")"):]
    assert "__trickle_rn = 1" in outer and "ORDER BY" in outer and "LIMIT 2" in outer, sql
    assert "DISTINCT ON" not in sql
    with pytest.raises(QueryError, match="DISTINCT ON"):
        dvm.compile_query("SELECT DISTINCT ON (dept) * FROM emp", SCHEMAS, "postgres")
