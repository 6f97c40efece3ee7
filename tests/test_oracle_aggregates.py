"""Oracle tests of the aggregate family, every call DIFFERENTIAL over >= 20 random change cycles.

Why these tables: one stream table per maintenance strategy, because a group-rescan call rescans every group
its delta touches and would hide the algebraic rules of the calls beside it:

* ``alg`` — algebraic and semi-algebraic calls only (COUNT / COUNT(x, y) / SUM / AVG with FILTER, BOOL_AND / OR, BIT_XOR,
  BIT_AND / OR, the STDDEV / VARIANCE / COVAR / CORR / REGR_* family, MIN_BY / MAX_BY, FIRST / LAST /
  ANY_VALUE), grouped by ``grp, x % 2`` so groups are small (emptied and re-filled, single values, constant
  values, all-NULL arguments when ``x`` is NULL);
* ``resc`` — group-rescan calls (COUNT(DISTINCT), collect_list / collect_set, percentile, median,
  percentile_approx, mode, kurtosis, skewness, approx_count_distinct, SUM(DISTINCT)). STRING_AGG / LISTAGG are in the
  corners test: Spark 4.1 itself fails (ClassCastException) on LISTAGG ... WITHIN GROUP next to two
  DISTINCT aggregates, so the oracle could not run them here;
* ``cube`` — CUBE over a keyless source with exact duplicates, with GROUPING() / grouping_id();
* ``sets`` — ROLLUP crossed with GROUPING SETS over the same source.

Random values are chosen so Spark's own answer is unique: MIN_BY / MAX_BY order by ``v * 1e6 + id`` (no
ties), FIRST / LAST / ANY_VALUE take a value fixed by the group key, collect_list is wrapped in
array_sort, ``mode(x, true)``. CORR's arguments never have a constant variable in a group of two or more
rows, because Spark raises DIVIDE_BY_ZERO there (ANSI mode). ``test_aggregate_corners_differential`` then
walks fixed data through the corners random data only hits by luck: every row deleted (global aggregates
over an empty table), groups re-filled, all-NULL groups, a group made constant (the cancellation rescan of
the moment family) and reduced to a single value; it also holds the nested case (GROUPING SETS with a
repeated set and rescan-only functions in a subquery under a WHERE: group rescan of both snapshots, bag
layout), which does not need random data to be exercised.

``TRICKLE_ORACLE_CYCLES`` and ``TRICKLE_ORACLE_SEED`` (an int or ``random``) override the defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from decimal import Decimal as D
from typing import Any

from coverage_rows import Row
from oracle import Col, Extreme, TableSpec, check_steps_differential, run_oracle

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

COVERAGE_TITLE = "Aggregates: every maintained function, FILTER, GROUPING SETS / ROLLUP / CUBE"
_A = "test_aggregate_family_differential"


def _agg(construct: str, calls: str, status: str = "DIFFERENTIAL", test: str = _A, reason: str = "") -> Row:
    return Row(construct, status, f"SELECT k, {calls} FROM a GROUP BY k", test, reason)  # type: ignore[arg-type]


_RESCAN = "recompute-scoped"
COVERAGE = [
    _agg("COUNT(*), COUNT(x)", "COUNT(*) AS n, COUNT(v) AS nv", reason="algebraic: counts kept per group"),
    _agg("COUNT(x, y)", "COUNT(v, s) AS n", reason="rows where every argument is non-NULL"),
    _agg("SUM, AVG", "SUM(v) AS s, AVG(x) AS av", reason="algebraic: running sum and non-NULL count"),
    _agg("COUNT_IF", "count_if(v > 3) AS n"),
    _agg("Aggregate FILTER (WHERE ...)", "SUM(x) FILTER (WHERE v > 5) AS s, COUNT(*) FILTER (WHERE x > 0) AS n",
         reason="folded into the argument (CASE WHEN ... END), on every maintained aggregate"),
    _agg("BOOL_AND / EVERY, BOOL_OR / SOME", "bool_and(v > 3) AS ba, every(v < 9) AS ev, bool_or(x > 1) AS bo, "
         "some(x < 0) AS so", reason="algebraic: counts of true and false values"),
    _agg("BIT_XOR", "bit_xor(v) AS bx", reason="algebraic: XOR is its own inverse"),
    _agg("BIT_AND, BIT_OR", "bit_and(v) AS ba, bit_or(v) AS bo",
         reason="semi-algebraic: a group is rescanned when a deleted value may have set a bit"),
    _agg("STDDEV / STDDEV_SAMP / STD, STDDEV_POP", "stddev(x) AS sd, stddev_samp(x) AS ss, std(x) AS st, "
         "stddev_pop(x) AS sp", reason="algebraic: count, mean and centred moments; rescan when they cancel"),
    _agg("VARIANCE / VAR_SAMP, VAR_POP", "variance(x) AS va, var_samp(x) AS vs, var_pop(x) AS vp"),
    _agg("COVAR_POP, COVAR_SAMP, CORR", "covar_pop(x, v) AS cp, covar_samp(x, v) AS cs, corr(x, v) AS cr"),
    _agg("REGR_COUNT / AVGX / AVGY / SLOPE / INTERCEPT / R2 / SXX / SYY / SXY",
         "regr_count(x, v) AS rc, regr_avgx(x, v) AS ax, regr_avgy(x, v) AS ay, regr_slope(x, v) AS sl, "
         "regr_intercept(x, v) AS ri, regr_r2(x, v) AS r2, regr_sxx(x, v) AS sxx, regr_syy(x, v) AS syy, "
         "regr_sxy(x, v) AS sxy"),
    _agg("MIN, MAX", "MIN(x) AS mn, MAX(s) AS mx",
         reason="semi-algebraic: a group is rescanned only when a deleted value was its MIN / MAX"),
    _agg("MIN_BY, MAX_BY", "min_by(s, x) AS mnb, max_by(v, x) AS mxb"),
    _agg("FIRST, LAST, ANY_VALUE", "first(s) AS f, last(s) AS l, any_value(s) AS av",
         reason="kept as the least non-NULL value, so the result is deterministic"),
    _agg("COUNT(DISTINCT ...)", "COUNT(DISTINCT v) AS dv, COUNT(DISTINCT v, s) AS dvs", _RESCAN),
    _agg("Other aggregates with DISTINCT (SUM(DISTINCT x), ...)", "SUM(DISTINCT v) AS s", _RESCAN),
    _agg("COLLECT_LIST / ARRAY_AGG, COLLECT_SET", "array_sort(collect_list(s)) AS l, "
         "array_sort(collect_set(v)) AS cs", _RESCAN, reason="kept sorted by value"),
    _agg("ARRAY_AGG spelling", "array_sort(array_agg(v)) AS l", _RESCAN),
    _agg("STRING_AGG / LISTAGG [WITHIN GROUP (ORDER BY ...)]", "string_agg(s, ', ') WITHIN GROUP (ORDER BY s) AS m",
         _RESCAN),
    _agg("PERCENTILE, PERCENTILE_APPROX, MEDIAN", "percentile(x, 0.5) AS p, percentile_approx(v, 0.25) AS pa, "
         "median(x) AS md", _RESCAN),
    _agg("MODE", "mode(v, true) AS mo", _RESCAN, reason="maintained as mode(x, true): ties go to the least value"),
    _agg("KURTOSIS, SKEWNESS", "kurtosis(x) AS ku, skewness(v) AS sk", _RESCAN),
    _agg("APPROX_COUNT_DISTINCT", "approx_count_distinct(s) AS n", _RESCAN),
    Row("GROUP BY CUBE, GROUPING(), grouping_id()", "DIFFERENTIAL",
        "SELECT k, s, COUNT(*) AS n, SUM(v) AS sv, grouping(k) AS gk, grouping_id() AS gid FROM c GROUP BY CUBE(k, s)",
        _A, "one branch per grouping set (at most 64); GROUPING() is a constant per branch"),
    Row("GROUP BY ROLLUP", "DIFFERENTIAL", "SELECT k, s, COUNT(*) AS n, MAX(v) AS mx FROM c GROUP BY ROLLUP(k, s)", _A),
    Row("GROUP BY GROUPING SETS, crossed with ROLLUP / CUBE", "DIFFERENTIAL",
        "SELECT k, s, v % 2 AS p, COUNT(*) AS n, AVG(v) AS av FROM c GROUP BY ROLLUP(k, s), GROUPING SETS ((v % 2), ())",
        _A),
    _agg("PERCENTILE_CONT / PERCENTILE_DISC ... WITHIN GROUP", "percentile_cont(0.5) WITHIN GROUP (ORDER BY v) AS p",
         "FULL-only", None, "percentile_cont: write percentile(x, p), which interpolates the same way and is "
         "maintained; percentile_disc has no maintained equivalent"),
    _agg("mode() WITHIN GROUP (ORDER BY x)", "mode() WITHIN GROUP (ORDER BY v) AS m", "FULL-only", None,
         "write mode(x, true), which is maintained"),
    _agg("try_sum, try_avg, product, histogram_numeric, sketches (hll_*, theta_*, kll_*, ...)",
         "try_sum(v) AS s", "FULL-only", None, "no maintained rule"),
    Row("More than 64 grouping sets", "FULL-only",
        "SELECT COUNT(*) AS n FROM a GROUP BY CUBE(id, k, v, s, x, v + 1, x + 1)", None,
        "each grouping set is one branch of the maintained aggregate; list the sets you need with GROUPING SETS"),
]

M = TableSpec(
    "m",
    (
        Col("grp", "jkey", domain=(1, 4)),
        Col("x", "int", domain=(0, 20)),
        Col("v", "double", domain=(-50, 150)),
        Col("name", "string"),
    ),
    key="id",
    rows=36,
    max_changes=5,
)
E = TableSpec(  # keyless: exact duplicate rows
    "e",
    (Col("grp", "jkey", domain=(1, 3)), Col("val", "int", domain=(0, 9)), Col("tag", "string")),
    key=None,
    rows=24,
    dup_fraction=0.3,
    max_changes=4,
)

ORDER = "v * 1000000 + id"  # a unique ordering for MIN_BY / MAX_BY (v has two decimals, ids are < 1000)

QUERIES = {
    "alg": (
        "SELECT grp, x % 2 AS par, COUNT(*) AS n, COUNT(x) AS nx, COUNT(x, name) AS nxn, "
        "SUM(v) FILTER (WHERE x > 5) AS sv, "
        "AVG(x) FILTER (WHERE v > 0) AS ax, COUNT(*) FILTER (WHERE v > 50) AS nbig, count_if(x > 10) AS ci, "
        "bool_and(x > 3) AS band, bool_or(v > 100) AS bor, every(x < 19) AS ev, some(v < -40) AS so, "
        "bit_xor(x) AS bx, bit_and(x + 1) AS ba, bit_or(x) AS bo, "
        "stddev_samp(v) AS sds, stddev_pop(x) AS sdp, var_samp(x) AS vs, var_pop(v) AS vp, "
        "variance(v) AS var, stddev(x) AS sd, std(v) AS sd2, "
        "covar_pop(x, v) AS cvp, covar_samp(v, x) AS cvs, corr(id, v + id) AS cr, "
        "regr_count(v, x) AS rc, regr_avgx(v, x) AS rax, regr_avgy(v, x) AS ray, regr_slope(v, x) AS rs, "
        "regr_intercept(v, x) AS ri, regr_r2(v, x) AS r2, regr_sxx(v, x) AS rsxx, regr_syy(v, x) AS rsyy, "
        f"regr_sxy(v, x) AS rsxy, max_by(name, {ORDER}) AS mxb, min_by(x, {ORDER}) AS mnb, "
        f"max_by(v, {ORDER}) FILTER (WHERE x > 8) AS mxbf, MIN(v) AS mnv, MAX(name) AS mxn, "
        "first(grp) AS fg, last(grp * 10) AS lg, any_value(grp + 1) AS ag, "
        "stddev_pop(v) FILTER (WHERE name IS NOT NULL) AS sdf "
        "FROM {m} GROUP BY grp, x % 2"
    ),
    "resc": (
        "SELECT grp, COUNT(DISTINCT x) AS dx, COUNT(DISTINCT x, name) AS dxn, SUM(DISTINCT x) AS sdx, "
        "array_sort(collect_list(name)) AS cl, array_sort(collect_set(x)) AS cs, "
        "percentile(v, 0.5) AS p50, median(x) AS med, percentile_approx(x, 0.25) AS pa, mode(x, true) AS mo, "
        "kurtosis(v) AS ku, skewness(x) AS sk, approx_count_distinct(name) AS acd, "
        "COUNT(DISTINCT name) FILTER (WHERE x > 4) AS dnf, array_sort(collect_list(x) FILTER (WHERE v > 0)) AS clf "
        "FROM {m} GROUP BY grp"
    ),
    "cube": (
        "SELECT grp, tag, COUNT(*) AS n, SUM(val) AS s, bool_or(val > 7) AS bo, bit_xor(val) AS bx, "
        "MIN(val) AS mn, MAX(tag) AS mx, grouping(grp) AS gg, grouping(tag) AS gt, "
        "grouping_id() AS gid FROM {e} GROUP BY CUBE(grp, tag)"
    ),
    # ordered string aggregation (group rescan); ties in ORDER BY are equal strings, so the result is unique
    "strs": (
        "SELECT grp, string_agg(name, ', ') WITHIN GROUP (ORDER BY name) AS sa, "
        "listagg(name) WITHIN GROUP (ORDER BY name DESC) AS la, array_sort(array_agg(x)) AS ax, COUNT(*) AS n "
        "FROM {m} GROUP BY grp"
    ),
    # ROLLUP crossed with GROUPING SETS: six grouping sets
    "sets": (
        "SELECT grp, tag, val % 2 AS par, COUNT(*) AS n, SUM(val) AS s, MAX(val) AS mx, AVG(val) AS av, "
        "grouping_id() AS gid FROM {e} GROUP BY ROLLUP(grp, tag), GROUPING SETS ((val % 2), ())"
    ),
}


def test_aggregate_family_differential(spark: Any, st: Any) -> None:
    """Every aggregate function of the family, with FILTER and CUBE, equals its query after each of >= 20
    random change batches, each refresh DIFFERENTIAL; the extremum rows of ``v`` and ``x`` are deleted or
    moved in many cycles (MIN / MAX / MIN_BY / MAX_BY / BIT_AND / BIT_OR rescans and the moment family's
    cancellation rescans)."""
    run_oracle(
        spark,
        st,
        [M, E],
        QUERIES,
        cycles=CYCLES,
        seed=404,
        extremes=[Extreme("m", "v"), Extreme("m", "x"), Extreme("e", "val", p=0.2)],
    )


# --------------------------------------------------------------------------------------------------
# Fixed data through the corners
# --------------------------------------------------------------------------------------------------

CORNER_COLUMNS = "id INT, grp INT, x INT, v DOUBLE, name STRING, d DECIMAL(10,2)"
CORNER_ROWS = [
    (1, 1, 3, 2.7, "a", D("1.25")), (2, 1, 5, -1.3, "b", D("3.10")), (3, 1, 8, 7.1, "a", D("2.05")),
    (4, 1, None, None, None, None),
    (5, 2, None, None, None, None), (6, 2, None, None, "c", None),  # group 2: every aggregated argument NULL
    (7, 3, 9, 100.5, "d", D("7.77")),  # a single row
    (8, None, 1, 0.5, "e", D("0.01")),  # the NULL group key
]

CORNER_QUERIES = {
    # ROLLUP: per-group rows plus the () set, which disappears when the table is empty (unlike a global)
    "c_rollup": (
        "SELECT grp, COUNT(*) AS n, COUNT(x) AS nx, SUM(x) AS sx, AVG(v) AS av, stddev_samp(v) AS sd, "
        "var_pop(x) AS vp, stddev_pop(v) AS sdp, covar_samp(x, v) AS cs, regr_slope(v, x) AS rs, "
        "regr_r2(v, x) AS r2, regr_intercept(v, x) AS ri, regr_sxx(v, x) AS sxx, bool_and(x > 2) AS ba, "
        "bool_or(v > 5) AS bo, bit_xor(x) AS bx, bit_and(x) AS bn, bit_or(x) AS bor, MIN(v) AS mn, "
        "max_by(name, id) AS mb, min_by(v, id) AS nb, SUM(v) FILTER (WHERE x > 4) AS sf, "
        "grouping_id() AS gid FROM {src} GROUP BY ROLLUP(grp)"
    ),
    "c_global": (
        "SELECT COUNT(*) AS n, COUNT(x) AS nx, SUM(v) AS sv, AVG(x) AS ax, var_samp(v) AS vs, "
        "stddev_pop(x) AS sp, regr_count(v, x) AS rc, regr_avgx(v, x) AS rax, bool_and(v > 0) AS ba, "
        "bit_xor(x) AS bx, bit_or(x) AS bo, MIN(v) AS mn, MAX(name) AS mx, max_by(name, id) AS mb, "
        "COUNT(*) FILTER (WHERE v > 1) AS nf, AVG(d) AS ad, SUM(d) AS sd, var_pop(d) AS vd, "
        "regr_avgx(v, d) AS rad FROM {src}"
    ),
    "c_nested": (
        "SELECT grp, n, dn, names, sd, gid FROM (SELECT grp, COUNT(*) AS n, "
        "listagg(DISTINCT name, ';') WITHIN GROUP (ORDER BY name DESC) AS dn, "
        "string_agg(name, ',') WITHIN GROUP (ORDER BY name) AS names, stddev_pop(v) AS sd, grouping_id() AS gid "
        "FROM {src} GROUP BY GROUPING SETS ((grp), (), (grp))) t WHERE n > 1 OR gid = 1"
    ),
    "c_rescan": (
        "SELECT COUNT(*) AS n, COUNT(DISTINCT x) AS dx, array_sort(collect_list(name)) AS cl, "
        "string_agg(name, ',') WITHIN GROUP (ORDER BY name) AS sa, percentile(v, 0.5) AS p, "
        "mode(x, true) AS mo, median(v) AS md FROM {src}"
    ),
}

CORNER_STEPS = [
    ("group 1 made constant (moments cancel: rescan; regr_slope / regr_r2 turn NULL)",
     "UPDATE {src} SET x = 5, v = 2.7, d = 2.10 WHERE grp = 1 AND x IS NOT NULL"),
    ("group 1 reduced to one value", "DELETE FROM {src} WHERE id IN (2, 3)"),
    ("every row deleted (global aggregates over an empty table, groups and the () set vanish)",
     "DELETE FROM {src} WHERE id > 0"),  # with a condition: an unconditional DELETE counts as a truncate
    ("groups re-filled, one of them all-NULL",
     "INSERT INTO {src} VALUES (9, 1, 4, 3.5, 'z', 0.10), (10, 1, 6, -2.0, 'y', 0.21), "
     "(11, 2, NULL, NULL, NULL, NULL), (12, 3, 7, 8.25, 'x', 5.00), (13, 3, 7, 8.25, 'x', 5.00)"),
]


def test_aggregate_corners_differential(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """Constant groups, single values, all-NULL groups, every row deleted and groups re-filled: each
    refresh is DIFFERENTIAL and every stream table equals its query afterwards."""
    src = make_source("corners", CORNER_COLUMNS, rows=CORNER_ROWS)
    names = {n: unique_name(n) for n in CORNER_QUERIES}
    queries = {names[n]: q.format(src=src) for n, q in CORNER_QUERIES.items()}
    check_steps_differential(spark, st, src, queries, queries, CORNER_STEPS)
    # compare_rows tolerates float noise; a DECIMAL average must match Spark's to the last digit
    g = names["c_global"]
    got = st.read(g).select("ad", "sd").collect()[0]
    want = spark.sql(queries[g]).select("ad", "sd").collect()[0]
    assert (got["ad"], got["sd"]) == (want["ad"], want["sd"]), (got, want)
