"""The refusals made before anything is built: constructs no refresh can keep equal to the query
(volatile and clock functions, TABLESAMPLE, LIMIT without ORDER BY), order-dependent ones inside LATERAL
subqueries, and the clauses the operator tree does not maintain, each with a hint. Checked once over the
whole tree by :func:`reject_unsupported`, so the builder can assume a query it walks is maintainable."""

from __future__ import annotations

from sqlglot import exp

import dvm.operators.aggregates as aggregates
from dvm import rewrite
from dvm.builder.syntax import function_name
from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError
from dvm.operators.window import owning_window
from dvm.parser import is_recursive_cte

#: functions whose value changes between evaluations (or depends on how the data is split into files and
#: partitions): a delta computed with them would not add up, and a recompute would not reproduce what is stored
VOLATILE = {
    "rand", "random", "randn", "uuid", "shuffle", "randstr", "uniform", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start", "input_file_block_length", "reflect",
    "java_method", "try_reflect",
}
VOLATILE_EXP = (exp.Rand, exp.Randn, exp.Uuid, exp.Shuffle, exp.Randstr, exp.Uniform)
#: the clock: fixed within one refresh (Spark evaluates it once per query) but different at every refresh,
#: so rows computed by earlier refreshes would keep an old value while new rows get a new one
CLOCK = {"current_timestamp", "now", "current_date", "curdate", "localtimestamp", "current_time"}
CLOCK_EXP = (exp.CurrentTimestamp, exp.CurrentDate, exp.Localtimestamp, exp.CurrentTime, exp.CurrentDatetime)
#: written without parentheses these parse as columns; they are the clock unless a source has such a column
CLOCK_KEYWORDS = {"localtimestamp", "current_time"}

#: aggregate functions maintained differentially (sqlglot node -> canonical name); see dvm.operators.aggregates
AGG_FUNCS: dict[type[exp.Expression], str] = aggregates.FUNCTIONS


def lateral_bodies(tree: exp.Expression) -> set[int]:
    """ids of the nodes inside LATERAL subqueries: Spark evaluates those wholesale (per left row, see
    :mod:`dvm.operators.lateral`), so only the safety checks apply to them."""
    return {id(n) for lat in tree.find_all(exp.Lateral) if isinstance(lat.this, exp.Subquery)
            for n in lat.this.walk()}


def _in_lateral_body(holder: exp.Expression | None) -> bool:
    """``holder`` is the query directly inside ``LATERAL ( ... )``."""
    parent = holder.parent if holder is not None else None
    return isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.Lateral)


def reject_unsafe(node: exp.Expression) -> None:
    """Constructs no refresh can keep equal to the query, wherever they stand: random or clock-dependent
    functions, TABLESAMPLE, LIMIT / OFFSET without ORDER BY (arbitrary rows)."""
    if isinstance(node, VOLATILE_EXP) or (isinstance(node, exp.Func) and function_name(node) in VOLATILE):
        name = node.sql(SPARK).split("(")[0].lower()
        raise UnsupportedError("volatile function", f"non-deterministic function {name}() gives a "
                               "different value at every evaluation, so its deltas do not add up; "
                               "compute it in the source table, or use refresh_mode='FULL'")
    if isinstance(node, CLOCK_EXP) or (isinstance(node, exp.Func) and function_name(node) in CLOCK):
        name = node.sql(SPARK).split("(")[0].lower()
        raise UnsupportedError("volatile function", f"{name}() is fixed within one refresh but differs between "
                               "refreshes, so rows computed by earlier refreshes would keep their old value "
                               "(and nothing is recomputed while the sources do not change); store the time in "
                               "the source table or compare with a literal, or use refresh_mode='FULL' (it is "
                               "then evaluated at each refresh that has source changes)")
    if isinstance(node, exp.TableSample):
        raise UnsupportedError("TABLESAMPLE", "TABLESAMPLE draws a different random sample at every read, so "
                               "a stream table cannot be kept equal to its query; for a stable sample filter "
                               "on a hash of a key instead, e.g. WHERE pmod(xxhash64(id), 100) < 10 for about "
                               "10 percent, or use refresh_mode='FULL'")
    if isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)) and (
        node.parent is None or node.parent.args.get("order") is None
    ):
        what = "OFFSET" if isinstance(node, exp.Offset) else "LIMIT"
        raise UnsupportedError("LIMIT", f"{what} without ORDER BY keeps arbitrary rows, which differ from one "
                               "evaluation to the next, so a stream table cannot be kept equal to its query; "
                               "for a top-k add an ORDER BY on columns that make the order total (a unique "
                               f"key last), e.g. ORDER BY score DESC, id {what} n; or drop the {what}, or use "
                               "refresh_mode='FULL' (some n rows, chosen anew at each refresh)")


#: aggregates whose value depends on the order Spark reads rows in (array_sort(collect_list(x)) does not)
ORDER_DEPENDENT = (exp.ArrayAgg, exp.ArrayUniqueAgg, exp.First, exp.Last, exp.AnyValue, exp.FirstValue,
                   exp.LastValue, exp.GroupConcat, exp.ArgMax, exp.ArgMin, exp.Mode)


def reject_order_dependent(node: exp.Expression) -> None:
    """Inside a LATERAL subquery, which Spark evaluates as written: a left row's rows are recomputed on
    both snapshots at every change that reaches it, and the rows taken back must be the rows stored, so
    whatever depends on the order rows are read in is refused (ORDER BY ... LIMIT gets a tie-break)."""
    if isinstance(node, (exp.Limit, exp.Offset)) and not _in_lateral_body(node.parent):
        raise UnsupportedError("LIMIT", "ORDER BY ... LIMIT is maintained inside a LATERAL subquery only at "
                               "its top level (a top-k per left row); use refresh_mode='FULL' or AUTO")
    if isinstance(node, exp.Window):
        raise UnsupportedError("window function", "window functions inside a LATERAL subquery are not "
                               "maintained (ties make their result depend on the read order); use ORDER BY ... "
                               "LIMIT in the subquery, or refresh_mode='FULL' or AUTO")
    sorted_list = isinstance(node, (exp.ArrayAgg, exp.ArrayUniqueAgg)) and isinstance(node.parent, exp.ArraySort)
    deterministic_mode = isinstance(node, exp.Mode) and any(
        isinstance(a, exp.Boolean) and a.this is True for a in node.iter_expressions())
    if isinstance(node, ORDER_DEPENDENT) and not sorted_list and not deterministic_mode:
        name = node.sql(SPARK).split("(")[0].lower()
        raise UnsupportedError("order-dependent aggregate", f"{name}() inside a LATERAL subquery depends on the "
                               "order Spark reads rows in, and a left row's result is recomputed whenever a "
                               "change reaches it, so it could differ from the stored one; use "
                               "array_sort(collect_list(...)), MIN / MAX, mode(x, true), or refresh_mode='FULL'")


def reject_unsupported(tree: exp.Expression, columns: set[str] | None = None) -> None:
    """Fail on constructs the operator tree cannot maintain, naming them and saying what to do.

    ``columns``: the (lower case) column names of every source, to tell the clock keywords written without
    parentheses (``localtimestamp``) from columns of that name.

    The body of a recursive CTE is not built into operators (Spark evaluates it, see
    :mod:`dvm.operators.recursive`): only the safety checks apply inside it, and LIMIT (its rows would depend
    on the evaluation order of the rounds); its anchor is checked again when it is built."""
    in_lateral = lateral_bodies(tree)
    in_recursive = {id(n) for cte in tree.find_all(exp.CTE) if is_recursive_cte(cte) for n in cte.this.walk()}
    for node in tree.walk():
        reject_unsafe(node)
        if (isinstance(node, exp.Column) and not node.table and node.name.lower() in CLOCK_KEYWORDS
                and node.name.lower() not in (columns or set())):
            reject_unsafe(exp.Anonymous(this=node.name))
        if id(node) in in_recursive:
            if isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)):
                raise UnsupportedError("LIMIT", "ORDER BY ... LIMIT inside a recursive CTE is not maintained; "
                                       "use refresh_mode='FULL' or AUTO")
            continue
        if id(node) in in_lateral:
            reject_order_dependent(node)
            continue
        if isinstance(node, exp.Window):
            check_window_position(node)
        if isinstance(node, exp.Unnest):
            raise UnsupportedError("UNNEST", "UNNEST is not Spark SQL; use LATERAL VIEW explode(...) t AS x")
        if isinstance(node, exp.Lateral):
            join = node.parent
            side = (join.side or "").upper() if isinstance(join, exp.Join) else ""
            kind = (join.kind or "").upper() if isinstance(join, exp.Join) else ""
            if not node.args.get("view") and (not isinstance(join, exp.Join) or side in ("RIGHT", "FULL")
                                              or kind in ("SEMI", "ANTI")):
                raise UnsupportedError("LATERAL", "a LATERAL item is maintained after a FROM item, joined with "
                                       "a comma, [CROSS] JOIN or LEFT JOIN; use refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Exists, exp.Any, exp.All)) or (
            isinstance(node, exp.In) and node.args.get("query") is not None
        ):
            pred = rewrite.predicate_of(node)
            if pred is None or not rewrite.in_where_position(pred):
                raise UnsupportedError("subquery predicate", f"subquery predicate {node.sql(SPARK)[:80]} is "
                                       "maintained differentially only in a WHERE clause, combined with AND / "
                                       "OR / NOT (not in SELECT, ON, HAVING or inside other expressions); "
                                       "move it there or use refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.Group):
            aggregates.grouping_sets(node)  # refuses more than MAX_GROUPING_SETS branches
        if owning_window(node) is not None:
            continue  # evaluated by its window (partition recompute): any deterministic function works
        if (isinstance(node, exp.AggFunc) and type(node) not in AGG_FUNCS
                and not isinstance(node, aggregates.GROUPING_FUNCS)):
            raise aggregates.unsupported(f"aggregate {node.key}", node.sql(SPARK)[:60],
                                         aggregates.HINTS.get(type(node), ""))
        if isinstance(node, exp.Anonymous) and node.name.lower() in aggregates.UNTYPED_AGGREGATES:
            raise aggregates.unsupported(f"aggregate {node.name.lower()}", node.sql(SPARK)[:60])
        if isinstance(node, exp.WithinGroup):
            raise aggregates.unsupported(f"aggregate {node.this.key}", aggregates.shown(node),
                                         aggregates.HINTS.get(type(node.this), "WITHIN GROUP is supported "
                                                              "for STRING_AGG / LISTAGG only"))
        if isinstance(node, exp.Filter):  # left over by aggregates.normalize: not on a maintained aggregate
            raise UnsupportedError("aggregate FILTER", f"FILTER on {node.this.sql(SPARK)[:60]} is not "
                                   "maintained differentially; use CASE WHEN inside the aggregate")
        if isinstance(node, exp.Join):
            side, kind = (node.side or "").upper(), (node.kind or "").upper()
            method = (node.args.get("method") or "").upper()
            if method not in ("", "NATURAL") or (side == "RIGHT" and kind in ("SEMI", "ANTI")):
                what = " ".join(x for x in (method, side, kind) if x)
                raise UnsupportedError(f"{what} JOIN", f"{what} JOIN is not maintained differentially yet; "
                                       "use refresh_mode='FULL' or AUTO")


def check_window_position(w: exp.Window) -> None:
    """A window function belongs in a SELECT list or an ORDER BY (QUALIFY is rewritten before this)."""
    n: exp.Expression = w
    while n.parent is not None and not isinstance(n.parent, (exp.Select, exp.Union)):
        if isinstance(n.parent, exp.Window):
            raise QueryError(f"nested window function {n.parent.sql(SPARK)[:80]}")
        n = n.parent
    if n.arg_key not in ("expressions", "order"):
        raise QueryError(f"window function {w.sql(SPARK)[:80]} is allowed only in the SELECT list, ORDER BY "
                         "or QUALIFY (filter on it in an outer query: SELECT * FROM (SELECT ..., "
                         "ROW_NUMBER() OVER (...) AS rn FROM t) WHERE rn <= 3)")
