"""Aggregate functions: which ones are maintained, and by which strategy (one module per family).

| strategy | module | functions |
|---|---|---|
| algebraic (new state = old state + delta sums, never reads a source) | :mod:`.algebraic` | COUNT(*), COUNT(x), SUM, AVG, BOOL_AND / EVERY, BOOL_OR / SOME / ANY, BIT_XOR (COUNT_IF, COUNT(x, y) via rewrites) |
| algebraic (count, means, centred moments; rescan on cancellation) | :mod:`.moments` | STDDEV / STDDEV_SAMP / STD, STDDEV_POP, VARIANCE / VAR_SAMP, VAR_POP, COVAR_POP, COVAR_SAMP, CORR, REGR_COUNT / AVGX / AVGY / SLOPE / INTERCEPT / R2 / SXX / SYY / SXY |
| semi-algebraic (merge inserts; rescan a group only if a deletion may matter) | :mod:`.extremum` | MIN, MAX, MIN_BY, MAX_BY, FIRST, LAST, ANY_VALUE, BIT_AND, BIT_OR |
| group rescan (recompute the groups a delta touches) | :mod:`.rescan` | COUNT(DISTINCT), any aggregate with DISTINCT, COLLECT_LIST / ARRAY_AGG, COLLECT_SET, STRING_AGG / LISTAGG, PERCENTILE, PERCENTILE_APPROX, MEDIAN, MODE, KURTOSIS, SKEWNESS, APPROX_COUNT_DISTINCT |

FILTER (WHERE ...) works on all of them (folded into the arguments, :mod:`.rewrite`), and so do GROUPING
SETS / CUBE / ROLLUP (up to 64 grouping sets). Order-dependent functions get deterministic rules, documented
in their modules. Every other aggregate is refused with :class:`~dvm.errors.UnsupportedError` in
DIFFERENTIAL / IMMEDIATE mode (AUTO refreshes such a query FULL).

These strategies apply to an aggregate at the top of a stream table (its state is stored there). An
aggregate nested deeper in a query (under a join, in a subquery) has no stored state and is maintained by
group rescan of both snapshots whatever its functions (:mod:`dvm.operators.aggregate`).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dvm.dialect import SPARK
from dvm.errors import UnsupportedError
from dvm.operators.aggregates.algebraic import BitXor, BoolAndOr, Count, CountStar, SumAvg
from dvm.operators.aggregates.base import AggCall, spark
from dvm.operators.aggregates.extremum import BitAndOr, Extremum
from dvm.operators.aggregates.moments import PAIR, SINGLE, Moments, share_states
from dvm.operators.aggregates.rescan import GroupRescan
from dvm.operators.aggregates.rewrite import MAX_GROUPING_SETS, grouping_bits, grouping_sets, normalize

#: sqlglot aggregate node → canonical function name (what :func:`build_call` accepts)
FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
    exp.LogicalAnd: "bool_and", exp.LogicalOr: "bool_or",
    exp.BitwiseXorAgg: "bit_xor", exp.BitwiseAndAgg: "bit_and", exp.BitwiseOrAgg: "bit_or",
    exp.Stddev: "stddev_samp", exp.StddevSamp: "stddev_samp", exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp", exp.VariancePop: "var_pop",
    exp.CovarPop: "covar_pop", exp.CovarSamp: "covar_samp", exp.Corr: "corr",
    exp.RegrCount: "regr_count", exp.RegrAvgx: "regr_avgx", exp.RegrAvgy: "regr_avgy",
    exp.RegrSlope: "regr_slope", exp.RegrIntercept: "regr_intercept", exp.RegrR2: "regr_r2",
    exp.RegrSxx: "regr_sxx", exp.RegrSyy: "regr_syy", exp.RegrSxy: "regr_sxy",
    exp.First: "first", exp.Last: "last", exp.AnyValue: "any_value", exp.FirstValue: "first",
    exp.LastValue: "last", exp.ArgMin: "min_by", exp.ArgMax: "max_by",
    exp.ArrayAgg: "collect_list", exp.ArrayUniqueAgg: "collect_set", exp.GroupConcat: "string_agg",
    exp.Quantile: "percentile", exp.ApproxQuantile: "percentile_approx", exp.Median: "median",
    exp.Mode: "mode", exp.Kurtosis: "kurtosis", exp.Skewness: "skewness",
    exp.ApproxDistinct: "approx_count_distinct",
}

#: GROUPING() / grouping_id(): not computed by the aggregate, constants per grouping set
GROUPING_FUNCS = (exp.Grouping, exp.GroupingId)

#: Spark aggregates sqlglot parses as plain function calls: refused rather than taken for scalar functions
UNTYPED_AGGREGATES = {
    "try_sum", "try_avg", "histogram_numeric", "count_min_sketch", "hll_sketch_agg", "hll_union_agg",
    "bitmap_construct_agg", "bitmap_or_agg", "bitmap_and_agg", "approx_top_k", "approx_top_k_accumulate",
    "approx_top_k_combine", "kll_sketch_agg_bigint", "kll_sketch_agg_float", "kll_sketch_agg_double",
    "theta_sketch_agg", "theta_union_agg", "theta_intersection_agg", "product",
}

#: what to write instead, for aggregates refused on purpose
HINTS: dict[type[exp.Expression], str] = {
    exp.PercentileCont: "use percentile(x, p), which interpolates the same way",
    exp.PercentileDisc: "use percentile_approx(x, p) if an approximation will do",
}

_IDEMPOTENT = {"min", "max", "bool_and", "bool_or", "bit_and", "bit_or", "first", "last", "any_value"}

Translate = Callable[[exp.Expression], exp.Expression]


def shown(node: exp.Expression) -> str:
    """A call as the user wrote it, for messages (sqlglot's Spark output drops or rewrites some forms:
    PERCENTILE_CONT ... WITHIN GROUP, MAX_BY with a count)."""
    if isinstance(node, (exp.ArgMax, exp.ArgMin)) and node.args.get("count") is not None:
        args = ", ".join(spark(node.args[k]) for k in ("this", "expression", "count"))
        return f"{'MAX_BY' if isinstance(node, exp.ArgMax) else 'MIN_BY'}({args})"[:60]
    return (node.sql() if isinstance(node, exp.WithinGroup) else node.sql(SPARK))[:60]


def unsupported(construct: str, what: str, hint: str = "") -> UnsupportedError:
    return UnsupportedError(construct, f"aggregate {what} is not maintained differentially"
                            f"{'; ' + hint if hint else ''}; use refresh_mode='FULL' or AUTO")


def _rescan(name: str, func: str, args: list[exp.Expression], ordinal: int, sql: str, why: str,
            distinct: bool = False) -> AggCall:
    return GroupRescan(name, func, args, ordinal, distinct, {"sql": sql, "why": why})


def _string_agg(node: exp.GroupConcat, tr: Translate, name: str, ordinal: int) -> AggCall:
    """STRING_AGG / LISTAGG in a deterministic order. Ordered by the value itself (no WITHIN GROUP, or
    WITHIN GROUP (ORDER BY x [ASC|DESC])) it is rendered as ``array_join`` of the sorted ``collect_list``:
    Spark 4.1 fails (ClassCastException) on LISTAGG ... WITHIN GROUP next to two DISTINCT aggregates, and a
    query without WITHIN GROUP must not inherit that. Other keys keep LISTAGG ... WITHIN GROUP, with the
    value appended as the last key."""
    this = node.this
    keys: list[exp.Expression] = []
    if isinstance(this, exp.Order):
        keys = [tr(k) for k in this.expressions]
        this = this.this
    distinct = isinstance(this, exp.Distinct)
    if distinct and len(this.expressions) != 1:
        raise unsupported("aggregate string_agg", spark(node)[:60], "STRING_AGG(DISTINCT ...) takes one value")
    value = tr(this.expressions[0] if distinct else this)
    v = spark(value)
    sep = node.args.get("separator")
    sep_sql = spark(tr(sep)) if sep is not None else "''"
    by_value = len(keys) <= 1 and all(spark(k.this if isinstance(k, exp.Ordered) else k) == v for k in keys)
    why = "concatenation has no inverse; kept in order of the WITHIN GROUP keys, then of the value"
    if by_value:
        desc = bool(keys) and isinstance(keys[0], exp.Ordered) and bool(keys[0].args.get("desc"))
        items = f"array_sort({'collect_set' if distinct else 'collect_list'}({v}))"
        items = f"reverse({items})" if desc else items
        sql = f"CASE WHEN COUNT({v}) > 0 THEN array_join({items}, {sep_sql}) END"
        return _rescan(name, "string_agg", [value], ordinal, sql, why, distinct)
    order = [spark(k) for k in keys] + [v]
    args = f"{'DISTINCT ' if distinct else ''}{v}" + (f", {spark(tr(sep))}" if sep is not None else "")
    sql = f"LISTAGG({args}) WITHIN GROUP (ORDER BY {', '.join(order)})"
    return _rescan(name, "string_agg", [value], ordinal, sql, why, distinct)


def build_call(node: exp.AggFunc, tr: Translate, name: str, ordinal: int) -> AggCall:
    """The maintained form of one (normalized) aggregate node; ``tr`` translates argument expressions to
    internal column names. Raises UnsupportedError for forms that are not maintained."""
    func = FUNCTIONS.get(type(node))
    if func is None:
        raise unsupported(f"aggregate {node.key}", spark(node)[:60], HINTS.get(type(node), ""))
    this = node.this
    distinct = isinstance(this, exp.Distinct)
    if func == "count":
        if this is None or isinstance(this, exp.Star):
            return CountStar(name, "count_star", [], ordinal)
        if distinct:
            args = [tr(e) for e in this.expressions]
            sql = f"COUNT(DISTINCT {', '.join(spark(a) for a in args)})"
            return _rescan(name, "count_distinct", args, ordinal, sql, "needs the set of distinct values", True)
        return Count(name, "count", [tr(this)], ordinal)
    if distinct and func in _IDEMPOTENT and len(this.expressions) == 1:
        this, distinct = this.expressions[0], False
    if func == "collect_list" and distinct:
        func, this, distinct = "collect_set", this.expressions[0], False
    if distinct:
        t = tr(node)
        return _rescan(name, f"{func}_distinct", [tr(e) for e in this.expressions], ordinal, spark(t),
                       "DISTINCT needs the set of distinct values", True)
    if func in ("sum", "avg"):
        return SumAvg(name, func, [tr(this)], ordinal)
    if func in ("bool_and", "bool_or"):
        return BoolAndOr(name, func, [tr(this)], ordinal)
    if func == "bit_xor":
        return BitXor(name, func, [tr(this)], ordinal)
    if func in ("bit_and", "bit_or"):
        return BitAndOr(name, func, [tr(this)], ordinal)
    if func in SINGLE:
        return Moments(name, func, [tr(this)], ordinal)
    if func in PAIR:
        if node.expression is None:
            raise unsupported(f"aggregate {func}", spark(node)[:60], "it takes two arguments")
        return Moments(name, func, [tr(this), tr(node.expression)], ordinal)
    if func in ("min", "max", "first", "last", "any_value"):
        return Extremum(name, func, [tr(this)], ordinal)
    if func in ("min_by", "max_by"):
        if node.args.get("count") is not None:
            raise unsupported(f"aggregate {func}", shown(node), "the form with a count is not supported")
        return Extremum(name, func, [tr(this), tr(node.expression)], ordinal)
    if func in ("collect_list", "collect_set"):
        if isinstance(this, exp.Order):
            raise unsupported(f"aggregate {func}", spark(node)[:60],
                              "ORDER BY inside it is not supported; the list is kept sorted by value")
        a = tr(this)
        return _rescan(name, func, [a], ordinal, f"array_sort({func}({spark(a)}))",
                       "a list has no inverse; kept sorted by value")
    if func == "string_agg":
        return _string_agg(node, tr, name, ordinal)
    if func == "mode":
        if this is None:
            raise unsupported("aggregate mode", spark(node)[:60], "write mode(x): it is maintained as "
                              "mode(x, true), the least of the most frequent values")
        a = tr(this)
        return _rescan(name, func, [a], ordinal, f"mode({spark(a)}, true)",
                       "frequencies of every value; ties go to the least value")
    if func == "percentile_approx" and (node.args.get("weight") or node.args.get("error_tolerance")):
        raise unsupported("aggregate percentile_approx", spark(node)[:60], "only (x, p[, accuracy]) is supported")
    t = tr(node)
    return _rescan(name, func, [tr(this)], ordinal, spark(t), "order statistics / sketches have no inverse")


__all__ = ["AggCall", "FUNCTIONS", "share_states", "shown", "GROUPING_FUNCS", "UNTYPED_AGGREGATES", "HINTS", "MAX_GROUPING_SETS",
           "build_call", "grouping_bits", "grouping_sets", "normalize", "unsupported"]
