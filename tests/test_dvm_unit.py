"""The differentiation engine without a JVM: parsing, rejections and the shape of generated SQL."""

from __future__ import annotations

import pytest
from dvm_rendering import delta_sql, full_sql, held_queries, merge_sql, refresh_context

import dvm
from dvm import Context, QueryError, SourceRef, UnsupportedError
from dvm.context import Fixpoint
from dvm.operators.join import InnerJoin
from dvm.plan import bag_delta_sql

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

SCHEMAS = {
    "emp": [("id", "int"), ("name", "string"), ("dept", "int"), ("sal", "double")],
    "dept": [("id", "int"), ("dname", "string")],
}


def ctx(emp_changed: bool = True, dept_changed: bool = True) -> Context:
    return refresh_context({
        "emp": SourceRef("/w/emp", 5, 4 if emp_changed else 5),
        "dept": SourceRef("/w/dept", 9, 8 if dept_changed else 9),
    })


def test_layouts() -> None:
    assert dvm.compile_query("SELECT dept, SUM(sal) AS s FROM emp GROUP BY dept", SCHEMAS).layout == "keyed"
    assert dvm.compile_query("SELECT DISTINCT dept FROM emp", SCHEMAS).layout == "keyed"
    assert dvm.compile_query("SELECT e.name FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS).layout == "bag"


def test_inner_join_delta_reads_post_snapshots_only() -> None:
    """ΔL ⋈ R_post + L_post ⋈ ΔR − ΔL ⋈ ΔR: no time travel to the pre frontier (a snapshot per version
    costs a Spark job), and the correction term keeps join-key-change-plus-delete exact."""
    plan = dvm.compile_query("SELECT e.name, d.dname FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS)
    sql = merge_sql(plan, ctx(), ["string", "string"])
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
    both = delta_sql(join, ctx())
    assert both is not None and both.rstrip().endswith("HAVING SUM(__w) <> 0")
    one = delta_sql(join, ctx(dept_changed=False))
    assert one is not None and "-(__l.__w * __r.__w)" not in one and not one.rstrip().endswith("<> 0")


def test_a_join_delta_is_the_same_text_at_every_refresh() -> None:
    """The names a join's delta gives its shared inputs (``__jN``) count within one refresh, so the same
    query's delta is the same text at the next refresh: the local engine then parses it once."""
    plan = dvm.compile_query("SELECT e.name, d.dname FROM emp e JOIN dept d ON e.dept = d.id "
                             "JOIN dept d2 ON d2.id = e.id", SCHEMAS)
    first, second = (merge_sql(plan, ctx(), ["string", "string"]) for _ in range(2))
    assert first is not None and "__j1 AS" in first and first == second


def test_unchanged_sources_drop_their_terms() -> None:
    plan = dvm.compile_query("SELECT e.name, d.dname FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS)
    sql = merge_sql(plan, ctx(dept_changed=False), ["string", "string"])
    assert sql is not None and "table_changes_by_path('/w/dept'" not in sql
    assert merge_sql(plan, ctx(False, False), ["string", "string"]) is None


def test_only_used_columns_are_read_and_consolidated() -> None:
    plan = dvm.compile_query("SELECT name FROM emp WHERE sal > 1", SCHEMAS)
    scan = [n for n in plan.root.walk() if n.label().startswith("Scan")][0]
    assert scan.label() == "Scan emp [name, sal]"


@pytest.mark.parametrize(
    ("query", "construct"),
    [
        ("SELECT id FROM emp LIMIT 3", "LIMIT"),
        ("SELECT id FROM emp UNION ALL SELECT id FROM dept LIMIT 3", "LIMIT"),
        ("SELECT * FROM (SELECT id FROM emp LIMIT 3) t", "LIMIT"),
        ("SELECT id FROM emp ORDER BY id LIMIT dept", "LIMIT"),
        ("SELECT id, rand() AS r FROM emp", "volatile function"),
        ("SELECT id, dept IN (SELECT id FROM dept) AS d FROM emp", "subquery predicate"),
        ("SELECT try_sum(sal) AS n FROM emp", "aggregate try_sum"),
        ("SELECT e.id FROM emp e JOIN dept d ON d.id = (SELECT MAX(id) FROM dept)", "scalar subquery"),
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
    """Floats are grouped and hashed by a rounded form (evaluated by Spark in test_plain_rows); the stream
    table's own form is used, and a table declared before ``bits37`` keeps ``digits12``."""
    sql = bag_delta_sql("SELECT 1", ["a", "b"], ["double", "int"], "__w")
    assert "CAST(`a` AS DOUBLE) * 65537D - (CAST(`a` AS DOUBLE) * 65537D - CAST(`a` AS DOUBLE))" in sql
    assert "format_string" not in sql and "MAX(`a`) AS `a`" in sql
    legacy = bag_delta_sql("SELECT 1", ["a", "b"], ["double", "int"], "__w", "digits12")
    assert "format_string('%.12g', `a` + 0.0)" in legacy and "65537D" not in legacy
    with pytest.raises(ValueError, match="unknown float identity 'digits11'"):
        bag_delta_sql("SELECT 1", ["a"], ["double"], "__w", "digits11")


def test_keyed_top_keeps_algebraic_state() -> None:
    plan = dvm.compile_query("SELECT dept, SUM(sal) AS s, AVG(sal) AS a, MIN(sal) AS m FROM emp GROUP BY dept",
                             SCHEMAS)
    assert plan.hidden_columns() == ["__row_id", "__cnt", "__agg0_sum", "__agg0_nn", "__agg1_sum", "__agg1_nn",
                                     "__agg2_ext"]
    sql = merge_sql(plan, ctx(dept_changed=False), ["int", "double", "double", "double"])
    assert sql is not None and "LEFT JOIN delta.`/w/st` __o" in sql and "__rescan" in sql
    assert "algebraic" in plan.tree_text()


# --------------------------------------------------------------------------------------------------
# Joins: FULL / USING / NATURAL / nested; WHERE-clause subqueries as semi-, anti- and mark joins
# --------------------------------------------------------------------------------------------------

JOIN_SCHEMAS = {
    "a": [("id", "int"), ("k", "int"), ("x", "int")],
    "b": [("id", "int"), ("k", "int"), ("y", "int")],
    "c": [("k", "int"), ("z", "int")],
}


def _labels(query: str) -> list[str]:
    return [n.label() for n in dvm.compile_query(query, JOIN_SCHEMAS).root.walk()]


def _abc_ctx(a: bool = True, b: bool = True, c: bool = True) -> Context:
    return refresh_context({n: SourceRef(f"/w/{n}", 5, 4 if ch else 5) for n, ch in (("a", a), ("b", b), ("c", c))})


def test_full_join_is_its_own_operator_and_using_keys_follow_the_merged_column() -> None:
    """sqlglot keys a USING join chained after a FULL join on the first table's column (a.k = c.k); Spark
    keys it on the merged column COALESCE(a.k, b.k) (b.k after a RIGHT join). The tree must follow Spark."""
    labels = _labels("SELECT * FROM a FULL JOIN b USING (k) JOIN c USING (k)")
    assert any(lb.startswith("FullJoin ON") for lb in labels)
    inner = next(lb for lb in labels if lb.startswith("InnerJoin"))
    assert "COALESCE(" in inner, inner
    labels = _labels("SELECT c.z FROM a RIGHT JOIN b USING (k) JOIN c USING (k)")
    right = next(n for n in dvm.compile_query("SELECT c.z FROM a RIGHT JOIN b USING (k) JOIN c USING (k)",
                                              JOIN_SCHEMAS).root.walk() if n.label().startswith("Scan b"))
    inner = next(lb for lb in labels if lb.startswith("InnerJoin"))
    assert right.cols[0] in inner and "COALESCE" not in inner  # keyed on b.k, not a.k
    # NATURAL: the common columns, merged like USING
    plan = dvm.compile_query("SELECT * FROM a NATURAL FULL JOIN b", JOIN_SCHEMAS)
    assert len(plan.root.cols) == 4 and "COALESCE" in plan.root.label()


def _held_text(sql: str, ctx: Context) -> str:
    """``sql`` and the seeds of the relations it holds: everything a refresh runs."""
    return sql + "".join(spec.seed + (spec.step or "") for _, spec in ctx.fixpoints)


def _netted_delta(ctx: Context) -> list[Fixpoint]:
    """The held netted delta of a plain-rows (bag) table: read twice by its change rows (dvm.plan)."""
    return [spec for _, spec in ctx.fixpoints if spec.step is None and " AS __dw " in spec.seed]


def test_materialised_change_windows_are_read_once_per_source() -> None:
    """With ``materialize_changes`` (every refresh) a source's Change Data Feed window is one materialised
    relation, however many places of the delta read it: the SQL names it, never ``table_changes``."""
    plan = dvm.compile_query("SELECT a.x, b.y FROM a FULL JOIN b ON a.k = b.k UNION ALL "
                             "SELECT a.x, c.z FROM a JOIN c ON a.k = c.k", JOIN_SCHEMAS)
    ctx = Context({n: SourceRef(f"/w/{n}", 5, 4) for n in "abc"}, materialize_changes=True, target_path="/w/st")
    sql = plan.merge_source_sql(ctx, ["int", "int"])
    assert sql is not None and "table_changes" not in sql
    [netted] = _netted_delta(ctx)
    assert "table_changes" not in netted.seed
    seeds = sorted(spec.seed for _, spec in ctx.fixpoints if spec is not netted)
    assert seeds == [f"SELECT * FROM table_changes_by_path('/w/{n}', 5, 5)" for n in "abc"]
    assert all(spec.step is None and name in _held_text(sql, ctx) for name, spec in ctx.fixpoints)


def test_change_windows_read_once_after_cte_inlining_are_not_materialised() -> None:
    """Materialising costs a Spark job; it pays only where Spark would plan the window several times, which
    a CTE read by several terms also causes. A window read once is put back in place, also when the one
    place is a held query (the netted delta of a plain-rows table, which runs once)."""
    from dvm.rewrite import inlined_read_counts

    sql = ("WITH x AS (SELECT * FROM global_temp.w1), y AS (SELECT * FROM x UNION ALL SELECT * FROM x) "
           "SELECT * FROM y JOIN (WITH x AS (SELECT 1) SELECT * FROM x, global_temp.w2) ON TRUE")
    reads = inlined_read_counts(sql)
    assert reads[("global_temp", "w1")] == 2 and reads[("global_temp", "w2")] == 1
    assert reads[("global_temp", "w3")] == 0
    # a one-source filter reads its window once: only the netted delta is held, the Change Data Feed read
    # in place inside it
    plan = dvm.compile_query("SELECT a.x FROM a WHERE a.x > 1", JOIN_SCHEMAS)
    ctx = Context({"a": SourceRef("/w/a", 5, 4)}, materialize_changes=True, target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.merge_source_sql(ctx, ["int"]) or "")
    [netted] = _netted_delta(ctx)
    assert len(ctx.fixpoints) == 1 and "table_changes_by_path('/w/a', 5, 5)" in netted.seed
    assert "table_changes" not in sql and sql.count(ctx.fixpoints[0][0]) == 2
    # the full join reads each window several times (terms over one shared delta): both stay materialised
    plan = dvm.compile_query("SELECT a.x, b.y FROM a FULL JOIN b ON a.k = b.k", JOIN_SCHEMAS)
    ctx = Context({n: SourceRef(f"/w/{n}", 5, 4) for n in "ab"}, materialize_changes=True, target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.merge_source_sql(ctx, ["int", "int"]) or "")
    assert len(ctx.fixpoints) == 3 and "table_changes" not in _held_text(sql, ctx).replace(
        "SELECT * FROM table_changes", "")


def test_small_snapshots_are_held_once_and_single_reads_put_back() -> None:
    """A snapshot under ``hold_below`` bytes is read through one held relation wherever the delta reads it; a
    large one, or one without a known size, stays a Delta time-travel scan; one read only once is put back."""
    plan = dvm.compile_query("SELECT a.x, b.y FROM a FULL JOIN b ON a.k = b.k", JOIN_SCHEMAS)
    refs = {"a": SourceRef("/w/a", 5, 4, sizes={4: 900, 5: 1000}), "b": SourceRef("/w/b", 5, 4, sizes={4: 5000})}
    ctx = Context(refs, materialize_changes=True, hold_below=4096, target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.merge_source_sql(ctx, ["int", "int"]) or "")
    [netted] = _netted_delta(ctx)
    sql += netted.seed  # the query and the netted delta it holds: each runs once
    held = {spec.seed: name for name, spec in ctx.fixpoints if spec is not netted}
    assert {"SELECT * FROM delta.`/w/a` VERSION AS OF 4", "SELECT * FROM delta.`/w/a` VERSION AS OF 5"} & set(held)
    for version in (4, 5):  # every snapshot of a: held, or read in place at most once
        seed = f"SELECT * FROM delta.`/w/a` VERSION AS OF {version}"
        assert (seed in held and held[seed] in sql) or sql.count(f"delta.`/w/a` VERSION AS OF {version}") <= 1
    assert not any("/w/b` VERSION" in seed for seed in held) and sql.count("delta.`/w/b` VERSION AS OF") >= 2
    # a one-source filter reads its snapshot at most once: nothing is held but the netted delta
    plan = dvm.compile_query("SELECT a.x FROM a WHERE a.x > 1", JOIN_SCHEMAS)
    ctx = Context({"a": SourceRef("/w/a", 5, 4, sizes={4: 900, 5: 1000})}, materialize_changes=True, hold_below=4096,
                  target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.merge_source_sql(ctx, ["int"]) or "")
    assert len(ctx.fixpoints) == 1 and "global_temp" not in _held_text(sql, ctx).replace(ctx.fixpoints[0][0], "")


def test_nested_join_groups_and_semi_anti_join_syntax() -> None:
    labels = _labels("SELECT a.x, b.y, c.z FROM a FULL JOIN (b LEFT JOIN c ON b.k = c.k) ON a.k = b.k")
    assert [lb.split(" ")[0] for lb in labels] == ["Project", "FullJoin", "Scan", "LeftJoin", "Scan", "Scan"]
    assert [lb.split(" ")[0] for lb in _labels("SELECT a.x FROM a LEFT SEMI JOIN b ON a.k = b.k")][1] == "SemiJoin"
    assert [lb.split(" ")[0] for lb in _labels("SELECT a.x FROM a LEFT ANTI JOIN b ON a.k < b.k")][1] == "AntiJoin"


def test_full_join_delta_is_left_join_plus_padded_anti_join() -> None:
    plan = dvm.compile_query("SELECT a.x, b.y FROM a FULL JOIN b ON a.k = b.k", JOIN_SCHEMAS)
    join = next(n for n in plan.root.walk() if n.label().startswith("FullJoin"))
    both = delta_sql(join, _abc_ctx())
    assert both is not None and both.startswith("WITH ")
    assert "LEFT OUTER JOIN" in both and "LEFT ANTI JOIN" in both and "NULL AS" in both
    # pre and post recomputed in one pass: rows tagged with their state meet the other side's rows of it
    assert "__l.__sa = __r.__sb" in both and "VERSION AS OF 4" in both
    # each input's delta and snapshots are named once, however many terms read them
    assert both.count("table_changes_by_path('/w/a'") == 1 and both.count("table_changes_by_path('/w/b'") == 1
    # one side unchanged: its two states are one read (tagged by a cross join), no pre version of it
    one = delta_sql(join, _abc_ctx(b=False))
    assert one is not None and "VERSION AS OF 4)" not in one.replace("/w/a` VERSION AS OF 4", "")
    assert delta_sql(join, _abc_ctx(False, False, False)) is None
    assert "FullJoin" in plan.tree_text() and "anti-join" in plan.tree_text()


@pytest.mark.parametrize(
    ("where", "kind", "needles"),
    [
        ("EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.y > 3)", "SemiJoin", []),
        ("NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.y > a.x)", "AntiJoin", [">"]),
        ("a.x IN (SELECT b.y FROM b)", "SemiJoin", ["="]),
        # NOT IN: a row of the subquery blocks unless the comparison is FALSE (NULLs block)
        ("a.x NOT IN (SELECT b.y FROM b)", "AntiJoin", ["IS NULL", " OR "]),
        ("NOT (a.x IN (SELECT b.y FROM b WHERE b.k = a.k))", "AntiJoin", ["IS NULL"]),
        # ALL: anti-join on "comparison is not TRUE"; NOT ALL: semi-join on "comparison is FALSE"
        ("a.x > ALL (SELECT b.y FROM b WHERE b.k = a.k)", "AntiJoin", ["NOT", "IS NULL"]),
        ("NOT (a.x > ALL (SELECT b.y FROM b))", "SemiJoin", ["NOT"]),
        ("a.x < ANY (SELECT b.y FROM b)", "SemiJoin", ["<"]),
        ("NOT (a.x = ANY (SELECT b.y FROM b))", "AntiJoin", ["IS NULL"]),
        ("(a.x, a.k) IN (SELECT b.y, b.k FROM b)", "SemiJoin", [" AND "]),
        ("a.x IN (SELECT MAX(b.y) FROM b GROUP BY b.k)", "SemiJoin", []),
    ],
)
def test_subquery_predicates_become_semi_and_anti_joins(where: str, kind: str, needles: list[str]) -> None:
    labels = _labels(f"SELECT a.id FROM a WHERE a.id > 0 AND {where}")
    join = next(lb for lb in labels if lb.startswith(("SemiJoin", "AntiJoin")))
    assert join.startswith(kind), labels
    for n in needles:
        assert n in join, (n, join)
    assert any(lb.startswith("Filter") for lb in labels)  # the plain conjunct stays a filter


def test_subquery_predicates_under_or_get_mark_joins() -> None:
    plan = dvm.compile_query(
        "SELECT a.id FROM a WHERE a.x > 1 OR NOT EXISTS (SELECT 1 FROM b WHERE b.k > a.k) "
        "OR a.k NOT IN (SELECT c.k FROM c)", JOIN_SCHEMAS)
    joins = [n for n in plan.root.walk() if n.label().startswith("MarkJoin")]
    assert len(joins) == 1 and len(joins[0].marks) == 2  # side by side, not stacked
    filt = next(n for n in plan.root.walk() if n.label().startswith("Filter"))
    assert all(f"NOT `{m.name}`" in filt.label() for m in joins[0].marks), filt.label()  # both negated forms
    sql = merge_sql(plan, _abc_ctx(), ["int"])
    assert sql is not None and "EXISTS" not in sql.upper()  # marks are joins, not correlated subqueries
    # several ANDed predicates share one mark join too; a lone one is a plain semi-/anti-join
    labels = _labels("SELECT a.id FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k) "
                     "AND a.x NOT IN (SELECT c.z FROM c)")
    assert labels[1].startswith("Filter `") and " AND NOT `" in labels[1] and labels[2].startswith("MarkJoin")


def test_push_not_is_de_morgan_down_to_subquery_predicates() -> None:
    import sqlglot

    from dvm import rewrite

    e = sqlglot.parse_one("SELECT 1 FROM t WHERE NOT (x > 1 AND (y IN (SELECT 1) OR NOT EXISTS (SELECT 2)))")
    pushed = rewrite.push_not(e.args["where"].this)
    assert pushed.sql() == "NOT (x > 1) OR (NOT (y IN (SELECT 1)) AND EXISTS(SELECT 2))"
    parts = rewrite.conjuncts(rewrite.push_not(sqlglot.parse_one("NOT (a OR EXISTS (SELECT 1))")))
    assert [p.sql() for p in parts] == ["NOT (a)", "NOT (EXISTS(SELECT 1))"]
    assert rewrite.as_atom(parts[1])[1] is True  # type: ignore[index]


def test_quantified_comparisons_are_rewritten_for_spark() -> None:
    """Spark SQL cannot parse x op ALL/ANY (subquery): FULL refreshes run a CASE over two EXISTS."""
    from dvm.parser import pin_sources

    out = pin_sources("SELECT a.id FROM a WHERE a.x > ALL (SELECT b.y FROM b WHERE b.k = a.k)",
                      {"a": "delta.`/w/a` VERSION AS OF 1", "b": "delta.`/w/b` VERSION AS OF 2"})
    assert "ALL (" not in out and out.count("EXISTS(") == 2 and "THEN FALSE" in out and "ELSE TRUE" in out
    assert "b.k = a.k AND NOT (a.x > b.y)" in out  # correlated: the comparison joins the subquery's WHERE
    # an unqualified outer column could resolve inside the subquery: use a derived table instead
    out = pin_sources("SELECT id FROM a WHERE x = ANY (SELECT y FROM b)",
                      {"a": "delta.`/w/a` VERSION AS OF 1", "b": "delta.`/w/b` VERSION AS OF 2"})
    assert "AS __q(__c)" in out and "THEN TRUE" in out and "ELSE FALSE" in out


@pytest.mark.parametrize(
    ("query", "construct", "needle"),
    [
        ("SELECT a.id, EXISTS (SELECT 1 FROM b WHERE b.k = a.k) AS e FROM a", "subquery predicate", "WHERE"),
        ("SELECT a.id FROM a JOIN b ON a.k = b.k AND a.x IN (SELECT c.z FROM c)", "subquery predicate", "ON"),
        ("SELECT a.k, COUNT(*) AS n FROM a GROUP BY a.k HAVING COUNT(*) > ALL (SELECT c.z FROM c)",
         "subquery predicate", "HAVING"),
        ("SELECT a.id FROM a WHERE CASE WHEN a.x IN (SELECT c.z FROM c) THEN 1 ELSE 0 END = 1",
         "subquery predicate", "WHERE"),
        ("SELECT a.id, (SELECT b.y FROM b WHERE b.id = a.k) AS w FROM a", "scalar subquery", "aggregate"),
        ("SELECT a.id, (SELECT SUM(c.z) FROM c GROUP BY c.k) AS s FROM a", "scalar subquery", "several rows"),
        ("SELECT a.k, COUNT(*) AS n FROM a GROUP BY a.k HAVING COUNT(*) > (SELECT MAX(c.z) FROM c)",
         "scalar subquery", "HAVING"),
        ("SELECT a.k, COUNT(*) AS n, (SELECT MAX(c.z) FROM c) AS m FROM a GROUP BY a.k", "scalar subquery",
         "aggregating query"),
        ("SELECT a.id, (SELECT MAX(b.y) FROM b WHERE b.k > a.k) AS m FROM a", "correlated scalar subquery",
         "equalit"),
        ("SELECT a.id, (SELECT MAX(b.y + a.x) FROM b WHERE b.k = a.k) AS m FROM a", "correlated scalar subquery",
         "SELECT list"),
        ("SELECT a.id FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.y > (SELECT AVG(c.z) FROM c WHERE c.k = a.k))",
         "correlated scalar subquery", "further out"),
        ("SELECT a.id FROM a WHERE a.x IN (SELECT MAX(b.y) FROM b WHERE b.k = a.k)", "correlated subquery",
         "GROUP BY"),
        ("SELECT a.id FROM a WHERE EXISTS (SELECT 1 FROM b JOIN c ON c.k = b.k AND c.z = a.x)",
         "correlated subquery", "ON"),
    ],
)
def test_unsupported_subqueries_are_named(query: str, construct: str, needle: str) -> None:
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query(query, JOIN_SCHEMAS)
    assert e.value.construct == construct, str(e.value)
    assert needle in str(e.value) and "refresh_mode='FULL'" in str(e.value), str(e.value)


# --------------------------------------------------------------------------------------------------
# Aggregates: rewrites (FILTER, GROUPING SETS), strategies, rejections
# --------------------------------------------------------------------------------------------------

AGG_SCHEMAS = {"t": [("id", "int"), ("g", "int"), ("h", "string"), ("x", "int"), ("v", "double"), ("b", "boolean")]}


def _normalized(select_list: str) -> str:
    import sqlglot

    from dvm.operators.aggregates import normalize

    tree = sqlglot.parse_one(f"SELECT {select_list} FROM t", read="spark")
    return ", ".join(e.sql("spark") for e in normalize(tree).expressions)


@pytest.mark.parametrize(
    ("written", "maintained"),
    [
        ("COUNT(*) FILTER (WHERE x > 1)", "COUNT(CASE WHEN x > 1 THEN 1 END)"),
        ("SUM(v) FILTER (WHERE b)", "SUM(CASE WHEN b THEN v END)"),
        ("COUNT(DISTINCT x, h) FILTER (WHERE v > 0)",
         "COUNT(DISTINCT CASE WHEN v > 0 THEN x END, CASE WHEN v > 0 THEN h END)"),
        ("max_by(h, v) FILTER (WHERE x > 2)", "MAX_BY(h, CASE WHEN x > 2 THEN v END)"),
        ("covar_pop(x, v) FILTER (WHERE b)", "COVAR_POP(CASE WHEN b THEN x END, CASE WHEN b THEN v END)"),
        ("string_agg(h, ',') WITHIN GROUP (ORDER BY h) FILTER (WHERE x > 0)",
         "LISTAGG(CASE WHEN x > 0 THEN h END, ',') WITHIN GROUP (ORDER BY h)"),
        ("count_if(x > 3)", "COUNT(CASE WHEN x > 3 THEN 1 END)"),
        ("COUNT(x, v)", "COUNT(CASE WHEN NOT x IS NULL AND NOT v IS NULL THEN 1 END)"),
        ("every(b), some(b), any(b), std(v)", "BOOL_AND(b), BOOL_OR(b), BOOL_OR(b), STDDEV(v)"),
        ("first(h) IGNORE NULLS", "FIRST(h)"),
    ],
)
def test_aggregate_rewrites(written: str, maintained: str) -> None:
    """FILTER folds into the arguments (exact: every maintained aggregate ignores NULL inputs; COUNT(*)
    counts a CASE instead), and Spark spellings sqlglot does not type become typed aggregates."""
    assert _normalized(written) == maintained


def test_grouping_sets_expand_to_branches() -> None:
    import sqlglot

    from dvm.operators.aggregates import grouping_bits, grouping_sets

    def sets(group_by: str) -> tuple[list[str], list[tuple[int, ...]] | None]:
        tree = sqlglot.parse_one(f"SELECT 1 FROM t GROUP BY {group_by}", read="spark")
        exprs, out = grouping_sets(tree.args["group"])
        return [e.sql("spark") for e in exprs], out

    assert sets("g, h") == (["g", "h"], None)
    assert sets("ROLLUP(g, h)") == (["g", "h"], [(0, 1), (0,), ()])
    assert sets("g, h WITH ROLLUP") == (["g", "h"], [(0, 1), (0,), ()])
    assert sets("CUBE(g, h)") == (["g", "h"], [(0, 1), (0,), (1,), ()])
    assert sets("GROUPING SETS ((g), (g, h), (), g)") == (["g", "h"], [(0,), (0, 1), (), (0,)])
    assert sets("g, h GROUPING SETS ((h), (g))") == (["g", "h"], [(1,), (0,)])  # Hive: GROUP BY order
    exprs, out = sets("g, ROLLUP(h, x), GROUPING SETS ((v), ())")  # a cross product
    assert exprs == ["g", "h", "x", "v"] and out is not None and len(out) == 6 and (0, 1, 2, 3) in out
    # grouping_id(): a bit per column, 1 where the set aggregates it away, the first column most significant
    assert grouping_bits([(0, 1), (0,), (1,), ()], [0, 1]) == [0, 1, 2, 3]
    assert grouping_bits([(0, 1), (0,), (1,), ()], [1]) == [0, 1, 0, 1]


def test_grouping_sets_past_the_limit_are_refused_with_the_count() -> None:
    cols = ", ".join(f"c{i}" for i in range(7))
    schemas = {"w": [(f"c{i}", "int") for i in range(7)]}
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query(f"SELECT COUNT(*) AS n FROM w GROUP BY CUBE({cols})", schemas)
    assert e.value.construct == "GROUPING SETS"
    assert "128 grouping sets" in str(e.value) and "limit of 64" in str(e.value), str(e.value)
    with pytest.raises(UnsupportedError, match="65 grouping sets"):
        sets = ", ".join(["(c0)"] * 65)
        dvm.compile_query(f"SELECT COUNT(*) AS n FROM w GROUP BY GROUPING SETS ({sets})", schemas)
    # 64 is allowed: CUBE of 6 columns
    plan = dvm.compile_query(f"SELECT COUNT(*) AS n FROM w GROUP BY CUBE({cols[:-4]})", schemas)
    assert plan.keyed is not None and len(plan.keyed.agg.branches()) == 64


def test_grouping_sets_top_is_keyed_per_set() -> None:
    """One stored row per (grouping set, keys): the set ordinal is part of __row_id, GROUPING() /
    grouping_id() are constants per set, and a set without keys has no row over an empty input."""
    plan = dvm.compile_query(
        "SELECT g, h, COUNT(*) AS n, SUM(x) AS s, grouping(g) AS gg, grouping_id() AS gid FROM t "
        "GROUP BY ROLLUP(g, h)", AGG_SCHEMAS)
    assert plan.layout == "keyed" and plan.keyed is not None
    agg = plan.keyed.agg
    assert agg.sets == [(0, 1), (0,), ()] and plan.keyed.group_names[-1] == agg.set_col
    ctx_t = refresh_context({"t": SourceRef("/w/t", 5, 4)})
    full = full_sql(plan, ctx_t, ["int", "string", "bigint", "bigint", "tinyint", "bigint"])
    assert full.count(" HAVING COUNT(*) > 0") == 1  # the () set only
    assert f"xxhash64(`{agg.groups[0][0]}`, `{agg.groups[1][0]}`, `{agg.set_col}`" in full
    assert f"CASE `{agg.set_col}` WHEN 0 THEN 0 WHEN 1 THEN 1 WHEN 2 THEN 3 END" in full  # grouping_id()
    sql = merge_sql(plan, ctx_t, ["int", "string", "bigint", "bigint", "tinyint", "bigint"])
    assert sql is not None and sql.count(" AS INT) AS ") >= 3  # the set ordinal of each branch's delta


@pytest.mark.parametrize(
    ("call", "family"),
    [
        ("COUNT(*)", "algebraic"), ("SUM(x) FILTER (WHERE b)", "algebraic"), ("AVG(v)", "algebraic"),
        ("bool_and(b)", "algebraic"), ("every(b)", "algebraic"), ("bit_xor(x)", "algebraic"),
        ("stddev(v)", "algebraic"), ("var_pop(x)", "algebraic"), ("corr(x, v)", "algebraic"),
        ("regr_slope(v, x)", "algebraic"), ("regr_r2(v, x)", "algebraic"),
        ("MIN(v)", "semi-algebraic"), ("max_by(h, v)", "semi-algebraic"), ("first(h)", "semi-algebraic"),
        ("any_value(h)", "semi-algebraic"), ("bit_and(x)", "semi-algebraic"), ("bit_or(x)", "semi-algebraic"),
        ("COUNT(DISTINCT x)", "group rescan"), ("SUM(DISTINCT x)", "group rescan"),
        ("collect_list(h)", "group rescan"), ("collect_set(x)", "group rescan"),
        ("string_agg(h, ',')", "group rescan"), ("listagg(h) WITHIN GROUP (ORDER BY x DESC)", "group rescan"),
        ("percentile(v, 0.5)", "group rescan"), ("percentile_approx(v, 0.5)", "group rescan"),
        ("median(v)", "group rescan"), ("mode(x)", "group rescan"),
    ],
)
def test_each_aggregate_has_a_strategy_and_explain_names_it(call: str, family: str) -> None:
    plan = dvm.compile_query(f"SELECT g, {call} AS a FROM t GROUP BY g", AGG_SCHEMAS)
    assert plan.keyed is not None
    (a,) = plan.keyed.agg.aggs
    assert a.family == family
    text = plan.tree_text()
    assert f"-- {family}" in text, text


def test_order_dependent_aggregates_are_deterministic() -> None:
    """Spark leaves the order (or the row) undefined; the maintained value is one answer Spark may give."""

    def maintained(call: str) -> str:
        plan = dvm.compile_query(f"SELECT {call} AS a FROM t", AGG_SCHEMAS)
        assert plan.keyed is not None
        return plan.keyed.agg.aggs[0].sql()

    assert maintained("first(h)") == maintained("last(h)") == maintained("any_value(h)") == "MIN(`__t1`)"
    assert maintained("collect_list(h)") == "array_sort(collect_list(`__t1`))"
    assert maintained("collect_list(DISTINCT h)") == "array_sort(collect_set(`__t1`))"
    assert maintained("mode(h)") == maintained("mode(h, false)") == "mode(`__t1`, true)"
    # ordered by the value itself: array_join of the sorted list (no LISTAGG WITHIN GROUP, which Spark 4.1
    # cannot combine with two DISTINCT aggregates); other keys keep LISTAGG with the value appended
    assert maintained("string_agg(h, '-')") == (
        "CASE WHEN COUNT(`__t1`) > 0 THEN array_join(array_sort(collect_list(`__t1`)), '-') END")
    assert maintained("listagg(DISTINCT h) WITHIN GROUP (ORDER BY h DESC)") == (
        "CASE WHEN COUNT(`__t1`) > 0 THEN array_join(reverse(array_sort(collect_set(`__t1`))), '') END")
    assert maintained("string_agg(h, ',') WITHIN GROUP (ORDER BY x DESC)").endswith(
        "WITHIN GROUP (ORDER BY `__t2` DESC, `__t1`)")
    # ties on the ordering go to the least / greatest value, a NULL value first: the struct is picked by a key
    # where a NULL field never decides (Spark orders a struct's NULL fields first, DuckDB last)
    assert ("MAX_BY(CASE WHEN (`__t2`) IS NOT NULL THEN named_struct('o', `__t2`, 'v', `__t1`) END, "
            "CASE WHEN (`__t2`) IS NOT NULL THEN named_struct('o', `__t2`, 'n', (`__t1`) IS NOT NULL, 'v', `__t1`) END)"
            ) in maintained("max_by(h, v)")


def test_moment_calls_over_the_same_variables_share_one_state() -> None:
    plan = dvm.compile_query(
        "SELECT g, stddev(v) AS a, variance(v) AS b, var_pop(v) AS c, regr_slope(v, x) AS d, regr_r2(v, x) AS e, "
        "covar_pop(x, v) AS f, corr(v, x) AS h FROM t GROUP BY g", AGG_SCHEMAS)
    hidden = plan.hidden_columns()
    assert hidden == ["__row_id", "__cnt", "__agg0_n", "__agg0_mx", "__agg0_qx",
                      "__agg3_n", "__agg3_mx", "__agg3_qx", "__agg3_my", "__agg3_qy", "__agg3_c"], hidden
    text = plan.tree_text()
    assert "reads the moments kept for call 0" in text and "reads the moments kept for call 3" in text


@pytest.mark.parametrize(
    ("query", "construct", "needle"),
    [
        ("SELECT try_sum(x) AS s FROM t", "aggregate try_sum", "refresh_mode='FULL'"),
        ("SELECT g, percentile_cont(0.5) WITHIN GROUP (ORDER BY v) AS p FROM t GROUP BY g",
         "aggregate percentilecont", "percentile(x, p)"),
        ("SELECT g, mode() WITHIN GROUP (ORDER BY x) AS m FROM t GROUP BY g", "aggregate mode", "WITHIN GROUP"),
        ("SELECT g, max_by(h, v, 2) AS m FROM t GROUP BY g", "aggregate max_by", "count"),
        ("SELECT g, kurtosis(v) FILTER (WHERE b) AS k, skewness(v) AS s, approx_top_k(h) AS t FROM t GROUP BY g",
         "aggregate approxtopk", "not maintained"),
    ],
)
def test_unmaintained_aggregates_are_refused_clearly(query: str, construct: str, needle: str) -> None:
    with pytest.raises(UnsupportedError) as e:
        dvm.compile_query(query, AGG_SCHEMAS)
    assert e.value.construct == construct, str(e.value)
    assert needle in str(e.value), str(e.value)


def test_grouping_without_grouping_sets_is_a_query_error() -> None:
    with pytest.raises(QueryError, match="GROUPING SETS"):
        dvm.compile_query("SELECT g, grouping(g) AS gg FROM t GROUP BY g", AGG_SCHEMAS)


# --------------------------------------------------------------------------------------------------
# Set operations, scalar subqueries, shared CTEs
# --------------------------------------------------------------------------------------------------


def _plan_labels(plan: dvm.Plan) -> list[str]:
    return [n.label() for n in plan.root.walk()]


def test_set_operations_nest_as_sql_does() -> None:
    """INTERSECT binds tighter than UNION and EXCEPT; MINUS is EXCEPT; each maps to one SetOp."""
    plan = dvm.compile_query("SELECT k FROM a UNION ALL SELECT k FROM b INTERSECT ALL SELECT k FROM c", JOIN_SCHEMAS)
    labels = _plan_labels(plan)
    assert labels[0] == "UnionAll (2 branches)" and labels[1].startswith("Project")
    assert labels[2] == "Scan a [k]" and labels[3] == "SetOp INTERSECT ALL"
    plan = dvm.compile_query("(SELECT k FROM a MINUS ALL SELECT k FROM b) EXCEPT SELECT k FROM c", JOIN_SCHEMAS)
    assert [x for x in _plan_labels(plan) if x.startswith("SetOp")] == ["SetOp EXCEPT", "SetOp EXCEPT ALL"]
    assert plan.layout == "bag"
    with pytest.raises(QueryError, match="INTERSECT branches have 1 and 2 columns"):
        dvm.compile_query("SELECT k FROM a INTERSECT SELECT k, y FROM b", JOIN_SCHEMAS)


def test_set_operation_delta_counts_touched_tuples_on_post_snapshots() -> None:
    """Pre counts come from post counts minus the deltas: no time travel to the pre frontier; the touched
    tuples are matched NULL-safely; the rule of each operation is min / max(l - r, 0) / the two tests."""
    schemas = {"emp": SCHEMAS["emp"], "dept": SCHEMAS["dept"]}
    rules = {"INTERSECT ALL": "least(__cl, __cr)", "EXCEPT ALL": "greatest(__cl - __cr, 0)",
             "INTERSECT": "WHEN __cl > 0 AND __cr > 0", "EXCEPT": "WHEN __cl > 0 AND __cr = 0"}
    for op, rule in rules.items():
        plan = dvm.compile_query(f"SELECT dept FROM emp {op} SELECT id FROM dept", schemas)
        sql = merge_sql(plan, ctx(), ["int"])
        assert sql is not None and rule in sql, op
        assert "VERSION AS OF 4" not in sql and "VERSION AS OF 8" not in sql
        assert "LEFT SEMI JOIN" in sql and "<=>" in sql
        assert f" {op} " in plan.root.snapshot(ctx(), "post")
        one = merge_sql(plan, ctx(dept_changed=False), ["int"])
        assert one is not None and "table_changes_by_path('/w/dept'" not in one
        assert "VERSION AS OF 9" in one  # the unchanged side's post counts are still read
    plan = dvm.compile_query("SELECT dept FROM emp INTERSECT SELECT id FROM dept", schemas)
    assert merge_sql(plan, ctx(False, False), ["int"]) is None


def test_scalar_subqueries_become_joins() -> None:
    """Uncorrelated: a cross join with the one-row aggregate. Correlated: a LEFT JOIN keyed on the correlated
    equality, also the aggregate's GROUP BY; COUNT over a missing group is 0 (not the NULL a bare LEFT JOIN
    gives), SUM's stays NULL."""
    plan = dvm.compile_query("SELECT a.id FROM a WHERE a.x > (SELECT AVG(c.z) FROM c)", JOIN_SCHEMAS)
    labels = _plan_labels(plan)
    assert "InnerJoin ON TRUE" in labels and not any(x.startswith("LeftJoin") for x in labels)
    plan = dvm.compile_query("SELECT a.id, (SELECT COUNT(*) FROM b WHERE b.k = a.k AND b.y > 1) AS n, "
                             "(SELECT SUM(b.y) FROM b WHERE a.k = b.k) AS s FROM a", JOIN_SCHEMAS)
    labels = _plan_labels(plan)
    assert labels[0].startswith("Project `__t1`, (CASE WHEN `") and "IS NULL THEN 0 ELSE" in labels[0]
    assert labels[0].count("CASE") == 1  # SUM over no rows is NULL, as the LEFT JOIN gives
    assert sum(x.startswith("LeftJoin ON") for x in labels) == 2
    assert sum(x.startswith("Aggregate GROUP BY `") for x in labels) == 2
    # FROM a, b with a correlated subquery in WHERE (TPC-H Q17): the LEFT JOIN sits on top of ``a, b``, and the
    # WHERE's equality between them still becomes their join's condition (it was ON TRUE: a cross product)
    plan = dvm.compile_query("SELECT a.id, b.y FROM a, b WHERE a.k = b.k AND b.y > 1 AND "
                             "a.x < (SELECT AVG(c.z) FROM c WHERE c.k = a.k)", JOIN_SCHEMAS)
    labels = _plan_labels(plan)
    assert any(x.startswith("LeftJoin ON") for x in labels)
    assert "InnerJoin ON `__t2` = `__t5`" in labels and "InnerJoin ON TRUE" not in labels, labels
    assert any(x.startswith("Filter") and "> 1" in x and "__t2" not in x for x in labels), labels
    # ... and the WHERE's conjunct over b alone filters b below that join, so a change's rows are filtered before
    # the join, and the keys they filter the subquery's groups by are only those that can pass (Q17's brand)
    below = [n for n in plan.root.walk() if isinstance(n, InnerJoin)][0]
    assert below.right.label().startswith("Filter") and "> 1" in below.right.label(), labels
    assert below.right.children[0].label().startswith("Scan b"), labels


def test_where_conjuncts_over_one_join_input_filter_it() -> None:
    """A WHERE conjunct over one input of inner joins filters that input (as Spark's optimiser places it), one
    over the left input of a LEFT JOIN too; one over the LEFT JOIN's right input, over both inputs, or with a
    subquery stays above the joins."""
    plan = dvm.compile_query("SELECT a.id, b.y, c.z FROM a JOIN b ON a.k = b.k LEFT JOIN c ON c.k = a.k "
                             "WHERE a.x = 1 AND b.y IN (2, 3) AND c.z IS NULL AND a.x < b.y "
                             "AND a.id IN (SELECT k FROM c)", JOIN_SCHEMAS)
    inner = [n for n in plan.root.walk() if isinstance(n, InnerJoin)][0]
    assert inner.left.label() == "Filter `__t3` = 1" and inner.right.label() == "Filter `__t6` IN (2, 3)", \
        plan.tree_text()
    above = [n.label() for n in plan.root.walk() if n.label().startswith("Filter")]
    assert any("IS NULL" in x and "`__t3` < `__t6`" in x for x in above), above
    # identical subqueries share one join; a query without FROM reads the subquery as its FROM
    plan = dvm.compile_query("SELECT a.id, (SELECT MAX(c.z) FROM c) AS m, (SELECT MAX(c.z) FROM c) + 1 AS m1 "
                             "FROM a", JOIN_SCHEMAS)
    assert sum(x.startswith("InnerJoin") for x in _plan_labels(plan)) == 1
    plan = dvm.compile_query("SELECT (SELECT MAX(c.z) FROM c) AS m", JOIN_SCHEMAS)
    assert not any("Join" in x for x in _plan_labels(plan))


def test_correlated_scalar_subquery_empty_value() -> None:
    """HAVING and COALESCE are evaluated on the empty input for an outer row without a group; a GROUP BY on
    the correlated key gives no row (NULL) there."""
    from dvm.rewrites.scalar_subquery import _empty_value

    assert _empty_value(sqlglot_expr("COALESCE(SUM(x), -1)")).sql("spark") == "COALESCE(NULL, -1)"
    assert _empty_value(sqlglot_expr("COUNT(x) + 1")).sql("spark") == "0 + 1"
    assert _empty_value(sqlglot_expr("collect_set(x)")).sql("spark") == "ARRAY()"
    plan = dvm.compile_query("SELECT a.id, (SELECT COALESCE(SUM(b.y), -1) FROM b WHERE b.k = a.k "
                             "HAVING COUNT(*) > 1) AS s FROM a", JOIN_SCHEMAS)
    assert "THEN CASE WHEN 0 > 1 THEN COALESCE(NULL, -1) END ELSE" in _plan_labels(plan)[0]
    plan = dvm.compile_query("SELECT a.id, (SELECT COUNT(*) FROM b WHERE b.k = a.k GROUP BY b.k) AS n FROM a",
                             JOIN_SCHEMAS)
    assert "CASE" not in _plan_labels(plan)[0]


def sqlglot_expr(sql: str):
    import sqlglot

    return sqlglot.parse_one(sql, read="spark")


def test_shared_cte_is_differentiated_once() -> None:
    """A CTE read twice is one subtree, rendered once per form in the statement's outermost WITH; a CTE
    read once is inlined."""
    q = ("WITH t AS (SELECT k, SUM(z) AS s FROM c GROUP BY k) "
         "SELECT x.k, x.s, y.s AS s2 FROM t x JOIN t y ON x.k = y.k + 1")
    plan = dvm.compile_query(q, JOIN_SCHEMAS)
    refs = [n for n in plan.root.walk() if n.label() == "CteRef t"]
    assert len(refs) == 2 and refs[0].shared is refs[1].shared and refs[0].cols != refs[1].cols
    c = refresh_context({"c": SourceRef("/w/c", 7, 6)})
    assert merge_sql(plan, c, ["int", "bigint", "bigint"]) is not None
    [sql] = held_queries(c)  # the netted delta, computed once: the whole delta rule
    assert sql.startswith("WITH __cte")
    ident = refs[0].shared.ident
    assert sql.count(f"{ident}_delta AS (") == 1 and sql.count(f"{ident}_post AS (") == 1
    assert f"{ident}_pre" not in sql  # the join rule reads post snapshots only
    # the body's group rescan reads the change feed twice (affected groups at post and at pre), and only in
    # the one definition: built per reference, the text would hold it four times
    assert sql.count("table_changes_by_path('/w/c', 7, 7)") == 2
    unchanged = refresh_context({"c": SourceRef("/w/c", 7, 7)})
    assert merge_sql(plan, unchanged, ["int", "bigint", "bigint"]) is None
    full = full_sql(plan, c, ["int", "bigint", "bigint"])
    assert full.count(f"{ident}_post AS (") == 1 and f"{ident}_delta" not in full
    once = dvm.compile_query("WITH t AS (SELECT k, z FROM c) SELECT k FROM t", JOIN_SCHEMAS)
    sql = merge_sql(once, c, ["int"])
    assert sql is not None and "__cte" not in sql


def test_shared_cte_sql_grows_linearly_with_nesting() -> None:
    """A chain of CTEs each self-joining the previous one: with one definition per CTE the SQL grows by a
    constant per level (built per reference it grew 2.5x per level: 2.3k, 6.4k, 16k, 40k characters)."""
    sizes = []
    for depth in (1, 2, 3, 4):
        ctes = ["t0 AS (SELECT k, z FROM c WHERE z > 0)"] + [
            f"t{i} AS (SELECT x.k, y.z FROM t{i - 1} x JOIN t{i - 1} y ON x.k = y.k)" for i in range(1, depth + 1)]
        plan = dvm.compile_query(f"WITH {', '.join(ctes)} SELECT k, z FROM t{depth}", JOIN_SCHEMAS)
        c = refresh_context({"c": SourceRef("/w/c", 7, 6)})
        assert merge_sql(plan, c, ["int", "int"]) is not None
        [sql] = held_queries(c)  # the netted delta, computed once: the whole delta rule
        assert sql.count("table_changes_by_path") == 1
        sizes.append(len(sql))
    steps = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert max(steps) < 1.2 * min(steps), sizes


def test_bytes_read_counts_each_delta_file_read_once() -> None:
    """What a delta job reads decides its partitions (see ``Refresher._job_conf``): every change window and
    every snapshot read in Spark once, whatever the number of places that name it; a snapshot read by the
    driver counts nothing; an unknown size, or the stored table read in place, makes it unknown."""
    plan = dvm.compile_query("SELECT a.x, b.y FROM a JOIN b ON a.k = b.k", JOIN_SCHEMAS)
    refs = {"a": SourceRef("/w/a", 5, 4, sizes={4: 900, 5: 1000}, change_bytes=70),
            "b": SourceRef("/w/b", 5, 4, sizes={4: 5000, 5: 5000}, change_bytes=30)}
    ctx = Context(refs, materialize_changes=True, target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.netted_delta_sql(ctx, ["int", "int"]) or "")
    read = ctx.bytes_read(sql)
    assert read is not None and read >= 70 + 30 and read <= 70 + 30 + 900 + 1000 + 5000 + 5000
    text = sql + "".join(spec.seed for _, spec in ctx.fixpoints)
    expected = 100 + sum(size for key, ref in refs.items() for v, size in ref.sizes.items()
                         if f"delta.`/w/{key}` VERSION AS OF {v}" in text)
    assert read == expected
    # the same snapshots read by the driver (held under driver_below) reach Spark as local relations
    ctx = Context(refs, materialize_changes=True, hold_below=1 << 20, driver_below=1 << 20, target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.netted_delta_sql(ctx, ["int", "int"]) or "")
    assert ctx.bytes_read(sql) == 100
    # and so do change windows under changes_driver_below: nothing left for Spark to read
    ctx = Context(refs, materialize_changes=True, hold_below=1 << 20, driver_below=1 << 20,
                  changes_driver_below=1 << 20, target_path="/w/st")
    sql = ctx.unshare_single_reads(plan.netted_delta_sql(ctx, ["int", "int"]) or "")
    assert ctx.bytes_read(sql) == 0
    assert len(ctx.driver_held) == len(ctx.fixpoints) == 2 + len(
        {v for ref in refs.values() for v in (ref.pre, ref.post)}), "every read held, for the driver"
    # a window of unknown size; the stored table read in place (the general delta of a plain-rows table
    # reads it to pick the copies it deletes)
    unknown = {"a": SourceRef("/w/a", 5, 4, sizes={4: 900, 5: 1000}), "b": refs["b"]}
    ctx = Context(unknown, materialize_changes=True, target_path="/w/st")
    assert ctx.bytes_read(ctx.unshare_single_reads(plan.netted_delta_sql(ctx, ["int", "int"]) or "")) is None
    ctx = Context(refs, materialize_changes=True, target_path="/w/st")
    assert ctx.bytes_read(ctx.unshare_single_reads(plan.merge_source_sql(ctx, ["int", "int"]) or "")) is None
    assert Context(refs).bytes_read("SELECT * FROM delta.`/w/a` VERSION AS OF 5") == 1000


def test_nested_types_are_read_field_by_field() -> None:
    """The catalog stores column types as Spark's ``simpleString``; a plain-rows table's identity of a nested
    column is built from it, so every field must be read (sqlglot's parser dropped ``select`` after ``end``
    and every field of ``struct<a b:int>``), decimals' commas kept, and a type Spark shortened refused."""
    from dvm.plan import _canonical, nested_type

    assert nested_type("struct<end:int,select:int>") == ("struct", [("end", "int"), ("select", "int")])
    assert nested_type("struct<a b:int>") == ("struct", [("a b", "int")])
    assert nested_type("MAP<STRING,ARRAY<DECIMAL(10,2)>>") == ("map", "string", ("array", "decimal(10,2)"))
    assert nested_type("array<struct<key:string,value:double>>") == (
        "array", ("struct", [("key", "string"), ("value", "double")]))
    assert nested_type("bigint") == "bigint"
    with pytest.raises(ValueError, match="maxToStringFields"):
        nested_type("struct<a:int,b:int,... 30 more fields>")
    with pytest.raises(ValueError, match="cannot read"):
        nested_type("map<int>")
    sql = _canonical("`s`", "struct<a b:int,x:double>", "bits37+nested")
    assert "`s`.`a b`" in sql and "65537D" in sql
    assert _canonical("`s`", "struct<a b:int>", "bits37") == "`s`"  # older tables hash as Spark does
