"""DuckDB on the driver (pipeline/local_engine.py): its xxhash64 is Spark's, it refuses what it would evaluate
differently, and a refresh it computes is recorded as such and equals the query (the whole suite runs with
``trickle.refresh.localEngine=verify``, so every delta it computes is also compared with Spark's)."""

from __future__ import annotations

import datetime
import math
import random
import re
import tempfile
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from pipeline import local_engine
from tests.conftest import local_engine_mode
from tests.oracle import assert_matches

_engine = local_engine_mode("verify")  # every delta computed by both engines and compared


class _Ctx:
    fixpoints: list[Any] = []
    key_filters: list[Any] = []
    target_path = None
    run_id = "0123456789ab"


def _duck_rows(sql: str, table: Any, types: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """``sql`` (Spark SQL over the relation ``t``, whose Spark types are ``types``) run by the engine's
    translation over ``table``, as a refresh's statement is (the hashes it outputs computed after DuckDB)."""
    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000)  # type: ignore[arg-type]
    engine.con.register("t", table)
    if types is not None:
        engine.types["t"] = types
    try:
        rows = engine.con.sql(engine.translate.final(sql)).to_arrow_table()
        if engine.translate.deferred:
            rows = local_engine._hashed_columns(rows, engine.translate.deferred)
        return [tuple(r.values()) for r in rows.to_pylist()]
    finally:
        engine.con.close()


def _duck(sql: str, table: Any, types: dict[str, Any] | None = None) -> list[Any]:
    """The first column of :func:`_duck_rows`."""
    return [r[0] for r in _duck_rows(sql, table, types)]


ROWS = pa.table({
    "i": pa.array([0, 1, -7, 2147483647, None], pa.int32()),
    "l": pa.array([0, -1, 1 << 40, -(1 << 62), None], pa.int64()),
    "s": pa.array(["", "a", "Grüße ∑", "x" * 100, None], pa.string()),
    "d": pa.array([datetime.date(1970, 1, 1), datetime.date(1994, 1, 1), datetime.date(1900, 2, 28),
                   datetime.date(2262, 4, 11), None], pa.date32()),
    "b": pa.array([True, False, True, None, False], pa.bool_()),
    "f": pa.array([0.0, -0.0, 1.5, float("nan"), None], pa.float64()),
    "g": pa.array([0.0, -0.0, 0.1, -2.5, None], pa.float32()),
    "n": pa.array([0, 1, 2, 3, 4], pa.int64()),
    "x": pa.array([Decimal("0.00"), Decimal("-1.50"), Decimal("12345678.99"), None, Decimal("-0.01")],
                  pa.decimal128(10, 2)),
    "y": pa.array([Decimal("0.0000"), Decimal("-128.0000"), Decimal("127.0000"),
                   Decimal("123456789012345678901.2345"), None], pa.decimal128(25, 4)),
})


@pytest.mark.parametrize("args", ["i", "l", "s", "d", "b", "f", "g", "i, l, s, d, b, f, g", "s, i",
                                  "l, nullif(concat(IF(i IS NULL, '1', '0')), '0')", "x", "y", "x, y, s",
                                  "x * y", "x + 1", "y - x"])
@pytest.mark.parametrize("typed", [False, True], ids=["by-duckdb-type", "by-spark-type"])
@pytest.mark.parametrize("where", ["output", "inner"])
def test_xxhash64_is_sparks(spark: Any, args: str, typed: bool, where: str, monkeypatch: Any) -> None:
    """Row ids computed by DuckDB must equal those Spark computes (a FULL refresh's), NULLs and -0.0 included;
    decimals by Spark's type of the expression (a long up to 18 digits, bytes past them). Both ways of hashing:
    by DuckDB's type of each value given as text, where Spark's type of the argument is unknown, and by the
    typed steps where it is known (``typed``: every column's Spark type given); and both places: a hash the
    statement outputs, computed after DuckDB in blocks (here of two rows, so that blocks meet inside the
    rows), and one inside it, computed by DuckDB's calls per vector."""
    from pipeline import spark_types

    monkeypatch.setattr(local_engine, "HASH_BLOCK_ROWS", 2)
    spark.createDataFrame(ROWS).createOrReplaceTempView("t")
    sql = (f"SELECT xxhash64({args}) AS h FROM t ORDER BY n" if where == "output" else
           f"SELECT h FROM (SELECT xxhash64({args}) AS h, n FROM t) ORDER BY n")
    expected = [r[0] for r in spark.sql(sql).collect()]
    types = {"x": spark_types.Decimal(10, 2), "y": spark_types.Decimal(25, 4), "n": "BIGINT", "s": "STRING"}
    if typed:
        types.update(i="INT", l="BIGINT", d="DATE", b="BOOLEAN", f="DOUBLE", g="FLOAT")
    assert _duck(sql, ROWS, types) == expected


def test_strings_hash_as_xxh64_of_their_bytes_at_every_length() -> None:
    """The vectorised string hash (per distinct length: stripes, words, a 4-byte word, bytes) equals XXH64 of
    the UTF-8 bytes, for every length up to four stripes and more, NULLs keeping their seed; lengths shared by
    a few strings only are hashed one by one, the others as blocks."""
    import numpy as np
    import xxhash

    rng = random.Random(7)
    values = ["".join(rng.choice("az09 ") for _ in range(n)) for n in range(0, 140)  # as blocks: one byte each
              for _ in range(local_engine._BLOCK_ROWS)]
    values += ["".join(rng.choice("az09 Äß∑€") for _ in range(n)) for n in range(0, 140)]
    values += [None, "", "x" * 1000, None]
    rng.shuffle(values)
    seeds = np.array([rng.getrandbits(64) for _ in values], dtype=np.uint64)
    got = local_engine._hash_vectorised(pa.array(values, pa.string()), "VARCHAR", pa.array(seeds.view(np.int64)))
    want = [int(s.view(np.int64)) if v is None else local_engine._signed(xxhash.xxh64_intdigest(v.encode(), int(s)))
            for v, s in zip(values, seeds, strict=True)]
    assert got.to_pylist() == want


@pytest.mark.parametrize("sql", ["SELECT xxhash64(i) AS h FROM t ORDER BY n",
                                 "SELECT h FROM (SELECT xxhash64(i) AS h, n FROM t) ORDER BY n"],
                         ids=["output", "inner"])
def test_a_spark_type_duckdb_does_not_share_leaves_the_hash_to_spark(sql: str) -> None:
    """Where Spark's type of an argument (here BIGINT) is not DuckDB's (INTEGER), the typed step refuses rather
    than hash 4 bytes where Spark hashes 8: the delta then runs on Spark."""
    with pytest.raises(Exception, match="trickle-unsupported: xxhash64 of a INTEGER that Spark types as BIGINT"):
        _duck(sql, ROWS, {"i": "BIGINT", "n": "BIGINT"})


@pytest.mark.parametrize("expr", ["EXTRACT(YEAR FROM d)", "year(d)", "month(d)", "day(d)", "quarter(d)",
                                  "EXTRACT(MONTH FROM d)", "xxhash64(EXTRACT(YEAR FROM d))", "substring(s, 1, 2)",
                                  "substr(s, 3)", "substring(s, 2, 100)", "xxhash64(substring(s, 1, 4), year(d))"])
def test_date_parts_and_substrings_are_sparks(spark: Any, expr: str) -> None:
    """EXTRACT and its shorthands are INTs in Spark (BIGINTs in DuckDB: the hash differs); SUBSTRING counts
    characters from 1 in both."""
    spark.createDataFrame(ROWS).createOrReplaceTempView("t")
    sql = f"SELECT {expr} AS v FROM t ORDER BY n"
    assert _duck(sql, ROWS) == [r[0] for r in spark.sql(sql).collect()]


@pytest.mark.parametrize("sql", [
    "SELECT bool_or(b), bool_and(b), bit_xor(i), bit_and(l), bit_or(i), xxhash64(bit_xor(i)) FROM t",
    "SELECT n % 2, bool_or(b), bit_xor(l), bit_or(i) FROM t GROUP BY n % 2 ORDER BY 1",
    "SELECT ~i, ~l, ~COALESCE(i, l ^ l), xxhash64(~i) FROM t ORDER BY n",
    "SELECT length(s), xxhash64(length(s)) FROM t ORDER BY n",
    "SELECT upper(s), lower(s), xxhash64(upper(s)) FROM t WHERE n <> 2 ORDER BY n",
    "SELECT n, lag(i) OVER (ORDER BY n), lead(l, 2) OVER (PARTITION BY b ORDER BY n), "
    "lag(s, 1, NULL) OVER (ORDER BY n DESC) FROM t ORDER BY n",
    "SELECT n, ntile(2) OVER (ORDER BY n), ntile(3) OVER (PARTITION BY b ORDER BY n), "
    "xxhash64(ntile(4) OVER (ORDER BY n), row_number() OVER (ORDER BY n), rank() OVER (ORDER BY b), "
    "dense_rank() OVER (ORDER BY b)) FROM t ORDER BY n",
    "SELECT n, e FROM t LATERAL VIEW explode(array(i, 1, NULL)) x AS e ORDER BY n, e",
    "SELECT n FROM t ORDER BY n DESC LIMIT 2 OFFSET 1",
    "SELECT n, percent_rank() OVER (ORDER BY b), cume_dist() OVER (PARTITION BY b ORDER BY i), "
    "nth_value(i, 2) OVER (ORDER BY n), nth_value(s, 1) OVER (PARTITION BY b ORDER BY n) FROM t ORDER BY n",
    "SELECT n, e, xxhash64(e) FROM (SELECT n, n + 1 AS __dw FROM t) LATERAL VIEW explode(sequence(1, __dw)) x AS e "
    "ORDER BY n, e",
    "SELECT t.n, l.m FROM t, LATERAL (SELECT MAX(u.n) AS m FROM t u WHERE u.n < t.n) l ORDER BY t.n",
    # a user's LATERAL explode of an array built per row, as a join (the seed examples' flat_children)
    "SELECT t.n, r.v FROM t CROSS JOIN LATERAL explode(array(t.n, t.n + 1)) AS r(v) ORDER BY 1, 2",
    "SELECT t.n, r.v, xxhash64(r.v) FROM t, LATERAL explode(array(t.l, NULL, t.n * 2)) AS r(v) ORDER BY 1, 2",
    "SELECT t.n, r.v FROM t JOIN LATERAL explode(array(t.n, 3)) AS r(v) ON r.v > t.n ORDER BY 1, 2",
    "SELECT t.n, l.c, l.x FROM t LEFT JOIN LATERAL (SELECT u.n AS c, u.i AS x FROM t u WHERE u.b = t.b "
    "ORDER BY u.n DESC LIMIT 1) l ON TRUE ORDER BY t.n",
    "SELECT t.n, l.c FROM t JOIN LATERAL (SELECT COUNT(*) AS c FROM t u WHERE u.l > t.l) l ON l.c > t.n ORDER BY t.n",
    # window defaults cast to the argument's type, IGNORE NULLS, frames by rows or peers, AVG over a window
    "SELECT n, lag(i, 1, -1) OVER (ORDER BY n), lead(l, 2, 7) OVER (PARTITION BY b ORDER BY n), "
    "lag(g, 1, 0) OVER (ORDER BY n), lag(s, 1, 'none') OVER (ORDER BY n DESC), "
    "xxhash64(lag(i, 1, -1) OVER (ORDER BY n)) FROM t ORDER BY n",
    "SELECT n, first_value(i) IGNORE NULLS OVER (ORDER BY n DESC), last_value(s) IGNORE NULLS OVER (ORDER BY n), "
    "first_value(l) OVER (PARTITION BY b ORDER BY n) FROM t ORDER BY n",
    "SELECT n, sum(i) OVER (ORDER BY n ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING), "
    "max(s) OVER (ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING), "
    "count(i) OVER (ORDER BY b RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING), "
    "avg(i) OVER (PARTITION BY b), sum(l) OVER (ORDER BY nullif(n, 2) RANGE BETWEEN 1 PRECEDING AND CURRENT ROW), "
    "count(*) OVER (ORDER BY nullif(n, 1) DESC RANGE BETWEEN CURRENT ROW AND 2 FOLLOWING), "
    "avg(l) OVER (ORDER BY n ROWS 2 PRECEDING), avg(g) OVER (ORDER BY n ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) FROM t ORDER BY n",
])
def test_functions_and_laterals_are_sparks(spark: Any, sql: str) -> None:
    """Aggregates, string functions, offsets and tiles of windows (ranks are Spark's INTs: hashed as such), and
    lateral subqueries (correlated per row, ordered and limited inside) evaluate in DuckDB as in Spark."""
    spark.createDataFrame(ROWS).createOrReplaceTempView("t")
    got = _duck_rows(sql, ROWS)
    assert got == [tuple(r) for r in spark.sql(sql).collect()], sql


ARRAYS = pa.table({
    "n": pa.array([0, 1, 2, 3, 4], pa.int64()),
    "a": pa.array([[1, 2, None], [], None, [5, 5], [-3]], pa.list_(pa.int32())),
    "s": pa.array([["x", None], None, [], ["", "Grüße"], ["z"]], pa.list_(pa.string())),
    "w": pa.array([1, 0, 2, 4, None], pa.int32()),
})


@pytest.mark.parametrize("sql", [
    "SELECT t.n, e.x FROM t LATERAL VIEW explode(t.a) e AS x ORDER BY 1, 2",
    "SELECT t.n, e.x FROM t LATERAL VIEW OUTER explode(t.s) e AS x ORDER BY 1, 2",
    "SELECT t.n, e.p, e.x FROM t LATERAL VIEW posexplode(t.a) e AS p, x ORDER BY 1, 2",
    "SELECT t.n, e.p, e.x, xxhash64(e.p, e.x) FROM t LATERAL VIEW OUTER posexplode(t.s) e AS p, x ORDER BY 1, 2",
    "SELECT t.n, e.x, f.y FROM t LATERAL VIEW explode(t.a) e AS x LATERAL VIEW explode_outer(array(e.x, t.w)) f AS y "
    "ORDER BY 1, 2, 3",
    "SELECT t.n, e.x FROM t LATERAL VIEW posexplode_outer(t.a) e AS p, x WHERE e.p IS NULL OR e.p > 0 ORDER BY 1, 2",
    "SELECT t.n, r.x FROM t LEFT JOIN LATERAL explode(t.a) AS r(x) ON r.x > t.w ORDER BY 1, 2",
    "SELECT t.n, r.x FROM t JOIN LATERAL explode(t.a) AS r(x) ON r.x >= t.w ORDER BY 1, 2",
    # the rules' own array(...) form, but posexplode (an INT position) and OUTER: converted as a user's is
    "SELECT t.n, e.p, e.x, xxhash64(e.p) FROM t LATERAL VIEW posexplode(array(t.w, 1)) e AS p, x ORDER BY 1, 2",
    "SELECT t.n, e.x FROM t LATERAL VIEW explode_outer(array(t.w)) e AS x ORDER BY 1, 2",
])
def test_explodes_of_arrays_are_sparks(spark: Any, sql: str) -> None:
    """A user's [OUTER] explode / posexplode of an array column: NULL and empty arrays, NULL elements, positions
    (Spark's 0-based INTs), chained views and a LEFT JOIN LATERAL whose condition no element meets."""
    spark.createDataFrame(ARRAYS).createOrReplaceTempView("t")
    assert _duck_rows(sql, ARRAYS) == [tuple(r) for r in spark.sql(sql).collect()], sql


def test_min_by_and_max_by_keys_are_sparks(spark: Any) -> None:
    """MIN_BY / MAX_BY as the rules write them (dvm/operators/aggregates/extremum.py): the struct (o, v) picked by
    the key (o, v IS NOT NULL, v), merged and compared through the key: ties on ``o`` go to a NULL value first in
    both engines, though DuckDB orders a struct's NULL fields last; the struct itself is never compared."""
    table = pa.table({"g": pa.array([1, 1, 1, 2, 2, 3], pa.int64()), "o": pa.array([5, 5, 7, 1, None, None], pa.int32()),
                      "v": pa.array(["b", None, "c", "a", "z", "y"], pa.string())})
    key = "named_struct('o', {o}, 'n', ({v}) IS NOT NULL, 'v', {v})"
    struct = "CASE WHEN o IS NOT NULL THEN named_struct('o', o, 'v', v) END"
    picked = f"CASE WHEN o IS NOT NULL THEN {key.format(o='o', v='v')} END"
    sql = (f"SELECT g, (MIN_BY({struct}, {picked})).v AS mn, (MAX_BY({struct}, {picked})).v AS mx, "
           f"MIN_BY({struct}, {picked}) AS s, "
           f"{key.format(o='(MIN_BY(' + struct + ', ' + picked + ')).o', v='(MIN_BY(' + struct + ', ' + picked + ')).v')}"
           f" <= {key.format(o='5', v='CAST(NULL AS STRING)')} AS le FROM t GROUP BY g ORDER BY g")
    spark.createDataFrame(table).createOrReplaceTempView("t")
    expected = [tuple(r) for r in spark.sql(sql).collect()]
    got = _duck_rows(sql, table)
    assert [r[:3] + r[4:] for r in got] == [r[:3] + r[4:] for r in expected], (got, expected)
    assert [r[3] and (r[3]["o"], r[3]["v"]) for r in got] == [r[3] and (r[3]["o"], r[3]["v"]) for r in expected]
    assert got[0][1:3] == (None, "c"), got  # the NULL value of the tie on o = 5 is the least


@pytest.mark.parametrize("sql, why", [
    ("SELECT min(named_struct('a', i, 'b', s)) FROM t", "a struct other than"),
    ("SELECT max_by(s, i) FROM t", "other than by MIN_BY"),
    ("SELECT var_pop(i) OVER (ORDER BY n) FROM t", "VariancePop as a window function"),
    ("SELECT (named_struct('o', i, 'v', s)).b FROM t", "a struct field other than"),
])
def test_structs_other_than_the_rules_are_refused(sql: str, why: str) -> None:
    with pytest.raises(local_engine.Unsupported, match=why):
        _duck(sql, ROWS)


def test_explodes_of_nested_values_are_refused() -> None:
    """Structs order their NULL fields last in DuckDB, first in Spark: an array of them stays on Spark."""
    import duckdb

    table = pa.table({"a": pa.array([[{"k": 1, "v": None}]], pa.list_(pa.struct([("k", pa.int32()),
                                                                                    ("v", pa.int32())])))})
    with pytest.raises(duckdb.Error, match="explode of a STRUCT"):
        _duck("SELECT e.x FROM t LATERAL VIEW explode(t.a) e AS x", table)


@pytest.mark.parametrize("sql", [
    "SELECT avg(x), avg(y), avg(i), avg(l) FROM t",
    "SELECT n % 2, avg(x), avg(y) FROM t GROUP BY n % 2 ORDER BY 1",
    "SELECT b, avg(x) FROM t WHERE x IS NULL OR n < 2 GROUP BY b ORDER BY 1",  # a group of NULLs only
    "SELECT n FROM t WHERE x > (SELECT avg(x) FROM t WHERE x < 100) ORDER BY n",  # TPC-H Q22's shape
])
def test_avg_of_decimals_is_sparks(spark: Any, sql: str) -> None:
    """Spark averages a DECIMAL(p, s) exactly, SUM / COUNT at DECIMAL(p + 4, s + 4) rounded half up; DuckDB
    in double. The engine divides as Spark does (``_divide``), so the values and their types agree."""
    from pipeline import spark_types

    spark.createDataFrame(ROWS).createOrReplaceTempView("t")
    types = {"x": spark_types.Decimal(10, 2), "y": spark_types.Decimal(25, 4), "n": "BIGINT", "i": "INT",
             "l": "BIGINT", "b": "BOOLEAN"}
    expected = [tuple(r) for r in spark.sql(sql).collect()]
    assert _duck_rows(sql, ROWS, types) == expected, sql


@pytest.mark.parametrize("sql", [
    "SELECT var_pop(x), var_pop(i), stddev_pop(l), covar_pop(x, i), var_pop(i) * COUNT(i), covar_pop(l, g) FROM t",
    "SELECT b, var_pop(y), stddev_pop(x), covar_pop(i, y), stddev_pop(g) FROM t GROUP BY b ORDER BY 1",
])
def test_population_moments_are_sparks(spark: Any, sql: str) -> None:
    """VAR_POP / STDDEV_POP / COVAR_POP (the moment rules' rescans): DOUBLEs in both, by the same streaming
    update, equal to rounding (the order rows arrive in may differ)."""
    from pipeline import spark_types

    spark.createDataFrame(ROWS).createOrReplaceTempView("t")
    types = {"x": spark_types.Decimal(10, 2), "y": spark_types.Decimal(25, 4)}
    expected = [tuple(r) for r in spark.sql(sql).collect()]
    got = _duck_rows(sql, ROWS, types)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert all(a == b or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12))
                   for a, b in zip(g, e, strict=True)), (g, e)


def test_avg_of_a_decimal_rounds_a_tie_as_spark(spark: Any) -> None:
    """Group 2: 0.01 / 32 = 0.0003125, a tie at AVG's scale 6, rounded away from zero in both signs."""
    from pipeline import spark_types

    ties = pa.table({"x": pa.array([Decimal("0.01"), Decimal("0.00")] * 2 + [Decimal("0.00")] * 30,
                                   pa.decimal128(10, 2)), "g": pa.array([1, 1] + [2] * 32, pa.int64())})
    tie_sql = "SELECT g, avg(x), avg(-x) FROM t GROUP BY g ORDER BY g"
    spark.createDataFrame(ties).createOrReplaceTempView("t")
    got = _duck_rows(tie_sql, ties, {"x": spark_types.Decimal(10, 2), "g": "BIGINT"})
    assert got == [tuple(r) for r in spark.sql(tie_sql).collect()]
    assert got[1] == (2, Decimal("0.000313"), Decimal("-0.000313")), got


@pytest.mark.parametrize("sql", [
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT n FROM r ORDER BY n",
    "WITH RECURSIVE h AS (SELECT i FROM t WHERE i IS NOT NULL AND i < 10), "
    "r(a, d) AS (SELECT i, 0 FROM h UNION ALL SELECT r.a, r.d + 1 FROM r JOIN h ON h.i = r.a WHERE r.d < 3) "
    "SELECT xxhash64(a, d) FROM r ORDER BY 1",
])
def test_recursions_are_sparks(spark: Any, sql: str) -> None:
    """Spark's own recursive CTEs run round by round (DuckDB's WITH RECURSIVE has no level limit to stop at)."""
    spark.createDataFrame(ROWS).createOrReplaceTempView("t")
    assert _duck(sql, ROWS) == [r[0] for r in spark.sql(sql).collect()]


@pytest.mark.parametrize("sql, why", [
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r", "level or row limit"),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT CAST(n AS BIGINT) + 1 FROM r WHERE n < 3) SELECT n FROM r",
     "other column types"),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r", "UNION ALL"),
])
def test_recursions_refused(sql: str, why: str) -> None:
    with pytest.raises(local_engine.Unsupported, match=why):
        _duck(sql, ROWS)


@pytest.mark.parametrize("sql, why", [
    ("SELECT x / y FROM t", "division of DECIMAL"),  # t's Spark types unknown here: no exact quotient
    ("SELECT CAST(f AS BIGINT) FROM t", "CAST of a DOUBLE to INT"),
    ("SELECT CAST(x AS BIGINT) FROM t", "CAST of a DECIMAL(10,2) to INT"),
    ("SELECT CAST(f AS STRING) FROM t", "CAST of a DOUBLE to VARCHAR"),
    ("SELECT xxhash64(x) FROM t", "xxhash64 of a DECIMAL"),
    ("SELECT s LIKE 'a\\\\%' FROM t", "LIKE"),
    ("SELECT upper(concat(s, 'ß')) FROM t", "UPPER of a string past ASCII"),
    ("SELECT lag(s, 1, 0) OVER (ORDER BY s) FROM t", "an integer default for a VARCHAR"),
    ("SELECT lag(f, 1, 0.5) OVER (ORDER BY f) FROM t", "LAG other than"),
    ("SELECT avg(x) OVER (ORDER BY f) FROM t", "AVG of a DECIMAL"),
    ("SELECT sum(f) OVER (ORDER BY f RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t", "integer operation on a DOUBLE"),
    ("SELECT sum(f) OVER (ORDER BY f, s RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t", "WindowSpec"),
    ("SELECT CAST(NULL AS ARRAY<DECIMAL>) FROM t", "CAST to ARRAY<DECIMAL"),
    ("SELECT length(f) FROM t", "string function over a DOUBLE"),
    ("SELECT lower(f) FROM t", "string function over a DOUBLE"),
    ("SELECT e FROM t LATERAL VIEW explode(sequence(1, 3)) x AS e", "LATERAL other than"),
    ("SELECT t.n, r.v FROM t LEFT JOIN LATERAL explode(array(t.n)) AS r(v) ON TRUE", "LEFT JOIN LATERAL explode"),
    ("SELECT substr(s, 0, 2) FROM t", "SUBSTRING"),
    ("SELECT substr(s, -2) FROM t", "SUBSTRING"),
    ("SELECT year(s) FROM t", "VARCHAR)"),
    ("SELECT substr(f, 1, 2) FROM t", "substring(DOUBLE"),
    ("SELECT EXTRACT(DAYOFWEEK FROM s) FROM t", "EXTRACT(DAYOFWEEK"),
])
def test_refuses_what_duckdb_evaluates_otherwise(sql: str, why: str) -> None:
    table = pa.table({"x": pa.array([Decimal("1.50")], pa.decimal128(10, 2)),
                      "y": pa.array([Decimal("3.00")], pa.decimal128(10, 2)),
                      "f": pa.array([2.5]), "s": pa.array(["a"])})
    import duckdb

    with pytest.raises((local_engine.Unsupported, duckdb.Error), match=re.escape(why)):
        _duck(sql, table)


def test_integer_division_and_zero_divisor() -> None:
    table = pa.table({"a": pa.array([7, 1], pa.int64()), "z": pa.array([2, 0], pa.int64())})
    assert _duck("SELECT a / 2 FROM t ORDER BY a DESC", table) == [3.5, 0.5]
    import duckdb

    with pytest.raises(duckdb.Error, match="division by zero"):
        _duck("SELECT a / z FROM t", table)


def test_spills_to_the_temp_folder_within_its_limit(tmp_path: Any, monkeypatch: Any) -> None:
    """DuckDB's in-memory default spills into ``./.tmp`` without a limit: a runaway delta (a cross product
    before this was caught) once left 46 GB there. The engine spills under the system's temporary folder, up to
    ``trickle.refresh.localEngineSpillBytes``; past that DuckDB fails (and Spark computes the delta)."""
    import duckdb

    monkeypatch.chdir(tmp_path)
    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000, spill_bytes=8 << 20)  # type: ignore[arg-type]
    try:
        folder, cap = engine.con.execute("SELECT current_setting('temp_directory'), "
                                         "current_setting('max_temp_directory_size')").fetchone()
        assert folder.startswith(tempfile.gettempdir()) and cap.startswith("8.0 MiB"), (folder, cap)
        engine.con.execute("SET memory_limit = '64MB'")
        with pytest.raises(duckdb.Error, match="max_temp_directory_size"):
            engine.con.execute("SELECT COUNT(*) FROM (SELECT * FROM range(30000000) ORDER BY random())").fetchall()
    finally:
        engine.con.close()
    assert not (tmp_path / ".tmp").exists()


def test_a_refresh_computed_by_duckdb(spark: Any, st: Any, tmp_path: Any) -> None:
    """A join + aggregate refreshed over a small change: DuckDB computed it (the history says so), and the
    table equals its query; one over a decimal division stays on Spark and says why."""
    spark.sql(f"CREATE TABLE orders_le (id BIGINT, cust BIGINT, amount DECIMAL(10,2)) USING delta "
              f"LOCATION '{tmp_path}/orders_le' TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"CREATE TABLE cust_le (cust BIGINT, region STRING) USING delta LOCATION '{tmp_path}/cust_le' "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("INSERT INTO cust_le VALUES (1, 'north'), (2, 'south'), (3, NULL)")
    spark.sql("INSERT INTO orders_le VALUES (1, 1, 10.00), (2, 2, 5.50), (3, 3, 1.25), (4, 1, NULL)")
    q = ("SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total FROM orders_le o JOIN cust_le c "
         "ON o.cust = c.cust GROUP BY c.region")
    avg = "SELECT cust, AVG(amount) AS a FROM orders_le GROUP BY cust"
    st.create_stream_table("le_join_agg", q, refresh_mode="DIFFERENTIAL")
    st.create_stream_table("le_avg", avg, refresh_mode="DIFFERENTIAL")
    spark.sql("INSERT INTO orders_le VALUES (5, 2, 7.00), (6, 3, NULL)")
    spark.sql("UPDATE orders_le SET cust = 2 WHERE id = 1")
    spark.sql("UPDATE cust_le SET region = 'east' WHERE cust = 3")
    r = st.refresh_stream_table("le_join_agg")
    assert r.action == "DIFFERENTIAL" and "delta computed by duckdb" in (r.apply or ""), r.apply
    assert_matches(spark, st, "le_join_agg", q)
    r = st.refresh_stream_table("le_avg")  # AVG of a decimal: Spark's exact quotient at Spark's scale
    assert r.action == "DIFFERENTIAL" and "delta computed by duckdb" in (r.apply or ""), r.apply
    assert_matches(spark, st, "le_avg", avg)


def test_decimal_quotients_are_sparks(spark: Any) -> None:
    """DuckDB divides decimals in double; the engine divides them as Spark does, at Spark's result type
    (pipeline.spark_types), near-ties included."""
    from pipeline import spark_types

    rng = random.Random(7)
    cases = [("2.5", "2", 3, 1, 1, 0), ("-2.5", "2", 3, 1, 1, 0), ("1", "3", 1, 0, 1, 0), ("51.003301", "2", 25, 6, 20, 0),
             ("0.0000005", "1", 10, 7, 20, 0)]
    for _ in range(40):
        p1, p2 = rng.randint(1, 38), rng.randint(1, 38)
        s1, s2 = rng.randint(0, p1), rng.randint(0, p2)
        a = rng.randint(-10 ** min(p1, 12), 10 ** min(p1, 12)) / 10 ** s1
        b = rng.choice([1, 2, 3, 7, 8, 16, 3 * 10 ** s2, rng.randint(1, 10 ** min(p2, 9))]) / 10 ** s2 or 1
        cases.append((f"{Decimal(a):.{s1}f}", f"{Decimal(b):.{s2}f}", p1, s1, p2, s2))
    for a, b, p1, s1, p2, s2 in cases:
        if Decimal(b) == 0:
            continue
        result = spark_types.arithmetic("/", spark_types.Decimal(p1, s1), spark_types.Decimal(p2, s2))
        ours = Decimal(local_engine._divide(a, b, result.scale))
        fits = len(str(abs(int(ours)))) <= result.precision - result.scale or int(ours) == 0
        try:
            row = spark.sql(f"SELECT CAST({a} AS DECIMAL({p1},{s1})) / CAST({b} AS DECIMAL({p2},{s2})) AS q").first()
        except Exception as e:  # noqa: BLE001 - Spark's overflow: DuckDB's CAST to the result type fails too
            assert "NUMERIC_VALUE_OUT_OF_RANGE" in str(e) and not fits, (a, b, p1, s1, p2, s2, ours)
            continue
        assert row is not None and ours == row.q and fits, (a, b, p1, s1, p2, s2, ours, row.q)
        assert spark.sql(f"SELECT typeof(CAST(1 AS DECIMAL({p1},{s1})) / CAST(1 AS DECIMAL({p2},{s2})))"
                         ).first()[0] == f"decimal({result.precision},{result.scale})"


# --- strings of files delta-rs' MERGE wrote ----------------------------------------------------------------

def _view_typed(path: str, version: int) -> set[str]:
    """The Arrow view types the Parquet files of the table at ``version`` declare (delta-rs' MERGE writes
    strings and binaries as ``string_view`` / ``binary_view``, nested ones too)."""
    from connectors import delta_rs

    found: set[str] = set()
    for fragment in delta_rs.dataset(path, version).get_fragments():
        found |= {str(t) for t in _types(fragment.physical_schema) if "_view" in str(t)}
    return found


def _types(schema: Any) -> list[Any]:
    """Every Arrow type in ``schema``, nested ones included (a view may sit inside a list or a struct)."""
    out, pending = [], [f.type for f in schema]
    while pending:
        kind = pending.pop()
        out.append(kind)
        pending.extend(kind.field(i).type for i in range(kind.num_fields))
    return out


def test_filters_on_strings_of_delta_rs_merged_files(tmp_path: Any, monkeypatch: Any,
                                                    python_in_scans: list[str]) -> None:
    """A snapshot whose newest files delta-rs' MERGE wrote (mirrors, stream tables) stores strings as views:
    DuckDB's filters pushed into the dataset must still select the rows, for strings, binaries, nested strings
    and other columns alike, and strings come back as DuckDB's VARCHAR (no Spark here)."""
    from deltalake import DeltaTable, write_deltalake

    from connectors import delta_rs

    path = str(tmp_path / "merged")
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("blob", pa.binary()),
                        ("tags", pa.list_(pa.string())), ("info", pa.struct([("city", pa.string())]))])
    # pyarrow fails on a view-typed file's row group whose filtered column holds no NULL (with one, its statistics
    # read "in range or NULL", which pyarrow does not simplify by): the rows the MERGE rewrites hold none
    write_deltalake(path, pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "blob": [b"x", b"y", b"z"],
                                    "tags": [["1"], ["2"], []], "info": [{"city": "a"}, {"city": "b"}, {"city": "c"}]},
                                   schema=schema))
    write_deltalake(path, pa.table({"id": [5, 6], "name": [None, "f"], "blob": [None, b"f"], "tags": [None, ["6"]],
                                    "info": [None, {"city": "f"}]}, schema=schema), mode="append")
    (DeltaTable(path).merge(pa.table({"id": [4, 2], "name": ["d", "bb"], "blob": [b"q", b"r"], "tags": [["4"], ["5"]],
                                      "info": [{"city": "d"}, {"city": "e"}]}, schema=schema),
                            predicate="t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    version = DeltaTable(path).version()
    assert {"string_view", "binary_view"} <= _view_typed(path, version)  # else this test shows nothing

    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000)  # type: ignore[arg-type]
    try:
        engine.con.register("t", delta_rs.dataset(path, version))
        # the view-typed files held in memory and scanned by Arrow alone, and (above delta_rs.READ_WHOLE_BYTES)
        # streamed to it by Python one at a time
        whole_bytes = delta_rs.READ_WHOLE_BYTES
        for held in (True, False):
            monkeypatch.setattr(delta_rs, "READ_WHOLE_BYTES", whole_bytes if held else 0)
            python_in_scans.clear()
            _filter_strings(engine)
            assert bool(python_in_scans) != held, (held, python_in_scans)
    finally:
        engine.con.close()


def _filter_strings(engine: Any) -> None:
    """The filters of :func:`test_filters_on_strings_of_delta_rs_merged_files` over its table ``t``."""
    for sql, expected in [
        ("SELECT id FROM t WHERE name >= 'b'", [2, 3, 4, 6]),
        ("SELECT id FROM t WHERE name IN ('a', 'bb', 'zz')", [1, 2]),
        ("SELECT id FROM t WHERE name = 'OR' OR name = 'c' OR name = 'd'", [3, 4]),
        ("SELECT id FROM t WHERE blob = 'q'::BLOB OR blob > 'y'::BLOB", [4, 3]),
        ("SELECT id FROM t WHERE info.city = 'e'", [2]),
        ("SELECT info.city FROM t WHERE info.city >= 'c'", ["c", "d", "e", "f"]),
        ("SELECT id FROM t WHERE id >= 2 AND name < 'c'", [2]),
        ("SELECT name FROM t WHERE id >= 2 AND name < 'c'", ["bb"]),
        ("SELECT id FROM t WHERE name IS NULL", [5]),
        ("SELECT id FROM t WHERE tags[1] = '5'", [2]),
        ("SELECT id FROM t WHERE id IN (2, 4)", [2, 4]),
    ]:
        got = [r[0] for r in engine.con.execute(sql).fetchall()]
        assert sorted(got) == sorted(expected), (sql, got)
    row = engine.con.execute("SELECT typeof(name), typeof(blob), typeof(tags), typeof(info) FROM t "
                             "WHERE name = 'bb'").fetchone()
    assert row == ("VARCHAR", "BLOB", "VARCHAR[]", "STRUCT(city VARCHAR)"), row


def test_snapshots_are_read_without_python_in_arrows_io_threads(tmp_path: Any) -> None:
    """The datasets DuckDB scans read their files through Arrow's own file system, never through delta-rs'
    Python one: with it, DuckDB opening a scan (holding the GIL) and an Arrow I/O thread (waiting for the GIL
    inside the scan's lock) deadlocked a TPC-H refresh for good. Partition values that are escaped in the log
    (a space, a slash, a percent sign) must still name their files, and filters pushed into the scan still
    select by them."""
    import pyarrow.fs as pafs
    from deltalake import write_deltalake

    from connectors import delta_rs

    path = str(tmp_path / "parts")
    write_deltalake(path, pa.table({"id": [1, 2, 3, 4], "part": ["x y", "y/z", "a%b", "x y"]}), partition_by=["part"])
    write_deltalake(path, pa.table({"id": [5], "part": ["plain"]}), partition_by=["part"], mode="append")
    data = delta_rs.dataset(path, 1)
    assert not isinstance(data.filesystem, pafs.PyFileSystem), type(data.filesystem)
    assert all(not isinstance(f.filesystem, pafs.PyFileSystem) for f in data.get_fragments())
    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000)  # type: ignore[arg-type]
    try:
        engine.con.register("t", data)
        assert sorted(engine.con.execute("SELECT id, part FROM t").fetchall()) == [
            (1, "x y"), (2, "y/z"), (3, "a%b"), (4, "x y"), (5, "plain")]
        assert sorted(r[0] for r in engine.con.execute("SELECT id FROM t WHERE part = 'x y'").fetchall()) == [1, 4]
        assert engine.con.execute("SELECT id FROM t WHERE part = 'a%b' OR id = 5 ORDER BY id").fetchall() == [(3,), (5,)]
    finally:
        engine.con.close()


def test_a_refresh_over_a_delta_rs_merged_table_by_duckdb(spark: Any, st: Any, tmp_path: Any) -> None:
    """Nexmark's q3 shape over a mirror committed by delta-rs' MERGE (its newest files hold string views):
    the delta reads the mirror's snapshot filtered by a string column, and DuckDB computes it."""
    from connectors import delta_rs
    from connectors.delta_log import DeltaLog

    people, auctions = f"{tmp_path}/person_sv", f"{tmp_path}/auction_sv"
    spark.sql(f"CREATE TABLE person_sv (id BIGINT, name STRING, state STRING) USING delta LOCATION '{people}' "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"CREATE TABLE auction_sv (id BIGINT, seller BIGINT, category INT) USING delta "
              f"LOCATION '{auctions}' TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("INSERT INTO person_sv VALUES (1, 'ann', 'OR'), (2, 'bob', 'WA'), (3, 'cy', 'CA')")
    spark.sql("INSERT INTO auction_sv VALUES (10, 1, 10), (11, 2, 10), (12, 3, 9)")

    def upsert(rows: dict[str, list[Any]], txn: int) -> None:  # as a Kafka mirror commits a batch
        names = ["id", "name", "state"]
        table = pa.table({**rows, "__op": ["u"] * len(rows["id"])},
                         schema=pa.schema([("id", pa.int64()), ("name", pa.string()), ("state", pa.string()),
                                           ("__op", pa.string())]))
        version = DeltaLog(spark, people).latest_version()
        assert version is not None
        delta_rs.upsert_keyed(people, table, ["id"], names, {}, {}, version, "test-mirror", txn)

    upsert({"id": [2, 4], "name": ["bob", "dee"], "state": ["ID", "CA"]}, 1)
    latest = DeltaLog(spark, people).latest_version()
    assert latest is not None and "string_view" in _view_typed(people, latest)
    q = ("SELECT p.name, p.state, a.id FROM auction_sv a JOIN person_sv p ON a.seller = p.id "
         "WHERE a.category = 10 AND (p.state = 'OR' OR p.state = 'ID' OR p.state = 'CA')")
    st.create_stream_table("le_q3_sv", q, refresh_mode="DIFFERENTIAL")
    spark.sql("INSERT INTO auction_sv VALUES (13, 4, 10), (14, 2, 10), (15, 1, 9)")
    r = st.refresh_stream_table("le_q3_sv")
    assert r.action == "DIFFERENTIAL" and "delta computed by duckdb" in (r.apply or ""), r.apply
    assert_matches(spark, st, "le_q3_sv", q)
    upsert({"id": [1, 3], "name": ["ann", "cyd"], "state": ["WA", "OR"]}, 2)
    spark.sql("INSERT INTO auction_sv VALUES (16, 3, 10)")
    r = st.refresh_stream_table("le_q3_sv")
    assert r.action == "DIFFERENTIAL" and "delta computed by duckdb" in (r.apply or ""), r.apply
    assert_matches(spark, st, "le_q3_sv", q)


# --- Spark's integral division ------------------------------------------------------------------------------

DIVS = pa.table({"n": pa.array(range(8), pa.int64()),
                 "a": pa.array([7, -7, 7, -7, -2147483648, 0, None, 20240101], pa.int32()),
                 "b": pa.array([2, 2, -2, -2, -1, 5, 3, None], pa.int32()),
                 "l": pa.array([20240101123000, -20240101123000, 1 << 62, -(1 << 62), 9, -1, None, 0], pa.int64())})


@pytest.mark.parametrize("sql", [
    "SELECT n, a DIV b, l DIV 10000, l DIV b, a DIV 3, -l DIV b FROM t ORDER BY n",
    "SELECT n, xxhash64(a DIV b), xxhash64(l DIV 10000) FROM t ORDER BY n",
    "SELECT l DIV 1000000, COUNT(*) FROM t GROUP BY l DIV 1000000 ORDER BY 1",
])
def test_integral_division_is_sparks(spark: Any, sql: str) -> None:
    """``DIV`` (Spark's IntegralDivide): BIGINT operands, truncated toward zero, a BIGINT; hashed as one."""
    spark.createDataFrame(DIVS).createOrReplaceTempView("t")
    expected = [tuple(r) for r in spark.sql(sql).collect()]
    assert _duck_rows(sql, DIVS) == expected, sql


@pytest.mark.parametrize("sql", ["SELECT a DIV 0 FROM t", "SELECT l DIV (b - b) FROM t WHERE n = 0",
                                 "SELECT CAST(-9223372036854775808 AS BIGINT) DIV CAST(-1 AS BIGINT) FROM t"])
def test_integral_division_errors_as_sparks(spark: Any, sql: str) -> None:
    """A zero divisor and BIGINT overflow raise in Spark (ANSI mode, Spark 4's default), and in DuckDB (so Spark
    computes the delta and raises, or returns NULL where ANSI mode is off)."""
    import duckdb

    spark.createDataFrame(DIVS).createOrReplaceTempView("t")
    with pytest.raises(Exception, match="DIVIDE_BY_ZERO|ARITHMETIC_OVERFLOW|overflow"):
        spark.sql(sql).collect()
    with pytest.raises(duckdb.Error, match="division by zero|Overflow"):
        _duck_rows(sql, DIVS)


@pytest.mark.parametrize("sql", ["SELECT CAST(a AS DOUBLE) DIV 2 FROM t", "SELECT CAST(a AS DECIMAL(10, 2)) DIV 2 FROM t"])
def test_integral_division_of_other_types_is_refused(sql: str) -> None:
    import duckdb

    with pytest.raises((local_engine.Unsupported, duckdb.Error), match=r"DIV .* \(only integers\)"):
        _duck_rows(sql, DIVS)


def test_a_refresh_with_integral_division_by_duckdb(spark: Any, st: Any, tmp_path: Any) -> None:
    """Nexmark's ``date_time DIV 10000`` buckets: the delta is DuckDB's, and the table equals its query."""
    spark.sql(f"CREATE TABLE bid_div (auction BIGINT, price BIGINT, date_time BIGINT) USING delta "
              f"LOCATION '{tmp_path}/bid_div' TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("INSERT INTO bid_div VALUES (1, 10, 20240101123000), (2, 20, 20240101125959), (1, 5, -20240101123000)")
    q = ("SELECT auction, date_time DIV 10000 AS bucket, COUNT(*) AS n, MAX(price) AS top FROM bid_div "
         "GROUP BY auction, date_time DIV 10000")
    st.create_stream_table("le_div", q, refresh_mode="DIFFERENTIAL")
    spark.sql("INSERT INTO bid_div VALUES (1, 7, 20240101123500), (3, 1, -20240101129999), (2, 30, 20240101130000)")
    spark.sql("DELETE FROM bid_div WHERE price = 20")
    r = st.refresh_stream_table("le_div")
    assert r.action == "DIFFERENTIAL" and "delta computed by duckdb" in (r.apply or ""), r.apply
    assert_matches(spark, st, "le_div", q)


@pytest.mark.parametrize(("sql", "kept"), [
    ("SELECT a.k, SUM(a.v) AS s FROM global_temp.__trickle_fx_0123456789ab_0 AS a "
     "JOIN global_temp.__trickle_fx_0123456789ab_1 b ON a.k = b.k WHERE a.s <> 'x' GROUP BY a.k", True),
    ("SELECT /*+ BROADCAST(__trickle_fx_0123456789ab_0) */ * FROM global_temp.__trickle_fx_0123456789ab_0", True),
    # the run id elsewhere (a string), or the stand-in itself in the text: parsed as it is, not kept
    ("SELECT * FROM global_temp.__trickle_fx_0123456789ab_0 WHERE s <> '0123456789ab'", False),
    ("SELECT 'trickle0run0id' AS t FROM global_temp.__trickle_fx_0123456789ab_0", False),
    ("SELECT * FROM table_changes_by_path('/p/0123456789ab', 3, 4)", False),
])
def test_parsed_trees_are_fresh_parses(sql: str, kept: bool) -> None:
    """The kept parse of a delta's text (``local_engine._parsed``): each call a tree of its own that equals a
    fresh parse of the text with its own run id, in Spark's and DuckDB's SQL, also after an earlier caller
    changed its copy, and for a text of another run id; kept only where the run id is in the relation names."""
    import sqlglot

    from dvm import SPARK

    other = sql.replace("0123456789ab", "ba9876543210")
    for text, run_id in ((sql, "0123456789ab"), (sql, "0123456789ab"), (other, "ba9876543210")):
        tree, fresh = local_engine._parsed(text, run_id), sqlglot.parse_one(text, read=SPARK)  # noqa: SLF001
        assert tree == fresh and tree.sql(SPARK, comments=True) == fresh.sql(SPARK, comments=True)
        assert tree.sql("duckdb") == fresh.sql("duckdb")
        assert (text.replace(run_id, local_engine._RUN_ID_STAND_IN) in local_engine._PARSED) == kept  # noqa: SLF001
        tree.find(sqlglot.exp.Table).set("this", sqlglot.exp.to_identifier("changed"))


def test_parsed_versions_share_one_kept_parse() -> None:
    """Two refreshes' texts that differ only in their run ids and the versions their snapshots read (``VERSION
    AS OF n``) are parsed once, and each tree reads its own versions; a text that holds a version stand-in
    itself is parsed as it is."""
    import sqlglot

    from dvm import SPARK

    text = ("SELECT * FROM delta.`/p/t` VERSION AS OF {a} AS t JOIN global_temp.__trickle_fx_{r}_0 AS f "
            "ON t.k = f.k WHERE t.v <> 7 UNION ALL SELECT * FROM delta.`/p/u` VERSION AS OF {b}")
    trees = []
    for a, b, r in ((3, 4, "0123456789ab"), (12, 3, "ba9876543210"), (3, 4, "0123456789ab")):
        sql = text.format(a=a, b=b, r=r)
        tree = local_engine._parsed(sql, r)  # noqa: SLF001
        assert tree == sqlglot.parse_one(sql, read=SPARK) and tree.sql(SPARK) == sqlglot.parse_one(sql, read=SPARK).sql(SPARK)
        trees.append(tree)
    assert [t.find(sqlglot.exp.Version).expression.this for t in trees] == ["3", "12", "3"]
    kept = [k for k in local_engine._PARSED if "/p/t" in k]  # noqa: SLF001
    assert len(kept) == 1 and local_engine._VERSION_STAND_IN in kept[0]  # noqa: SLF001
    odd = f"SELECT * FROM delta.`/p/t` VERSION AS OF 2 WHERE v = {local_engine._VERSION_STAND_IN}001"  # noqa: SLF001
    assert local_engine._parsed(odd, "0123456789ab") == sqlglot.parse_one(odd, read=SPARK)  # noqa: SLF001
    # the words in a string: the tree keeps the string as written
    said = ("SELECT 'VERSION AS OF 5' AS s FROM delta.`/p/t` VERSION AS OF 2 JOIN "
            "global_temp.__trickle_fx_0123456789ab_0 f ON TRUE")
    for _ in range(2):
        tree = local_engine._parsed(said, "0123456789ab")  # noqa: SLF001
        assert tree == sqlglot.parse_one(said, read=SPARK) and "'VERSION AS OF 5'" in tree.sql(SPARK)


def test_parsed_run_id_elsewhere_is_parsed_as_is() -> None:
    """A run id of digits only that also occurs inside a number: the number stays a number (the text is not
    kept with a stand-in there)."""
    import sqlglot

    from dvm import SPARK

    sql = "SELECT * FROM global_temp.__trickle_fx_123456789012_0 WHERE id = 91234567890123"
    tree = local_engine._parsed(sql, "123456789012")  # noqa: SLF001
    assert tree == sqlglot.parse_one(sql, read=SPARK) and tree.sql("duckdb").endswith("id = 91234567890123")


def test_threads_follow_the_statements_input() -> None:
    """A statement over little input runs on DuckDB's calling thread alone, one over more with
    ``THREADS``; while a large one runs, a small one does not take its threads away (DuckDB's count is the
    database's, shared by every connection), and the last large one to end sets one thread back itself, so
    that the next small refresh does not wait for DuckDB to wind its second thread down."""
    db = local_engine._Database(1 << 30)  # noqa: SLF001 - a database of its own, not the process's shared one
    small, large = db.con.cursor(), db.con.cursor()

    def threads(c: Any) -> int:
        return int(c.execute("SELECT current_setting('threads')").fetchone()[0])

    try:
        assert local_engine.THREADS > 1
        with db.fitted(small, 20_000):
            assert threads(small) == 1
        with db.fitted(large, local_engine.SMALL_INPUT_BYTES + 1):
            assert threads(large) == local_engine.THREADS
            with db.fitted(small, 20_000):
                assert threads(small) == local_engine.THREADS
            assert threads(large) == local_engine.THREADS
        assert threads(small) == 1  # set back by the large statement's end, not by the next small one
        with db.fitted(small, local_engine.SMALL_INPUT_BYTES):
            assert threads(small) == 1
    finally:
        small.close()
        large.close()
        db.con.close()


# --- snapshots read by DuckDB's own Parquet reader ----------------------------------------------------------

def _scan_rows(engine: Any, path: str, version: int, sql: str = "SELECT * FROM t") -> tuple[list[Any], list[Any]]:
    """``sql`` over the snapshot read by DuckDB's reader and over its Arrow dataset: rows and DuckDB types."""
    from connectors import delta_rs

    scan = delta_rs.parquet_scan(path, version)
    assert scan is not None
    out = []
    for make in (f"CREATE TEMP VIEW t AS {scan}", None):  # DuckDB's reader, then the Arrow dataset
        if make is None:
            engine.con.execute("DROP VIEW t")
            engine.con.register("t", delta_rs.dataset(path, version))
        else:
            engine.con.execute(make)
        rel = engine.con.sql(sql)
        out.append((sorted(map(repr, rel.fetchall())), [str(t) for t in rel.types]))  # repr: NaN equals itself
    engine.con.unregister("t")
    return out[0], out[1]


def test_snapshots_read_by_duckdbs_parquet_reader_are_the_arrow_datasets(spark: Any, tmp_path: Any) -> None:
    """A Spark-written table of every primitive type Delta has (timestamps aside, refused anyway) reads the same
    rows at the same types through DuckDB's reader as through the Arrow dataset, filters pushed into the scan
    included; a column added later reads NULL in the older files; files delta-rs' MERGE wrote (string views)
    read alike; and partitioned tables, nested columns and deletion vectors are left to the Arrow dataset."""
    from deltalake import DeltaTable

    from connectors import delta_rs

    path = f"{tmp_path}/prims"
    spark.sql(f"CREATE TABLE prims (l BIGINT, i INT, sh SMALLINT, b TINYINT, f FLOAT, d DOUBLE, ok BOOLEAN, "
              f"bin BINARY, day DATE, amt DECIMAL(12, 2), big DECIMAL(30, 4), s STRING) USING delta "
              f"LOCATION '{path}' TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("INSERT INTO prims VALUES (1, 2, 3, 4, 1.5, -0.0, true, X'00ff', DATE'1994-01-01', 12.34, "
              "123456789012345678901.2345, 'a'), (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
              "NULL, NULL), (-7, -8, -9, -10, CAST('NaN' AS FLOAT), 1e300, false, X'', DATE'1900-02-28', -0.01, "
              "0, 'Grüße')")
    spark.sql("ALTER TABLE prims ADD COLUMNS (extra STRING)")
    spark.sql("INSERT INTO prims VALUES (9, 9, 9, 9, 9, 9, true, X'09', DATE'2262-04-11', 9, 9, 'n', 'x')")
    version = DeltaTable(path).version()
    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000)  # type: ignore[arg-type]
    try:
        for sql in ("SELECT * FROM t", "SELECT l, s, extra FROM t WHERE extra = 'x'",
                    "SELECT l FROM t WHERE (l BETWEEN -7 AND 0 OR l BETWEEN 5 AND 9) AND s <> 'n'",
                    "SELECT amt, big FROM t WHERE amt > 0", "SELECT day FROM t WHERE day < DATE '1995-01-01'"):
            native, arrow = _scan_rows(engine, path, version, sql)
            assert native == arrow, sql
            assert native[0], sql  # some rows: else this shows nothing
        # as Spark reads them (the Arrow dataset found no row here while it took delta-rs' statistics as given)
        native, arrow = _scan_rows(engine, path, version, "SELECT l FROM t WHERE extra IS NULL")
        assert native == arrow and native[0] == ["(-7,)", "(1,)", "(None,)"]

        merged = str(tmp_path / "merged_plain")
        spark.sql(f"CREATE TABLE merged_plain (id BIGINT, name STRING) USING delta LOCATION '{merged}'")
        spark.sql("INSERT INTO merged_plain VALUES (1, 'a'), (2, 'b')")
        (DeltaTable(merged).merge(pa.table({"id": [2, 3], "name": ["bb", "c"]}), predicate="t.id = s.id",
                                  source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())
        native, arrow = _scan_rows(engine, merged, DeltaTable(merged).version(), "SELECT * FROM t WHERE name >= 'b'")
        assert native == arrow == (["(2, 'bb')", "(3, 'c')"], ["BIGINT", "VARCHAR"])
    finally:
        engine.con.close()

    spark.sql(f"CREATE TABLE parted (id BIGINT, p STRING) USING delta PARTITIONED BY (p) LOCATION '{tmp_path}/parted'")
    spark.sql("INSERT INTO parted VALUES (1, 'x')")
    spark.sql(f"CREATE TABLE nested (id BIGINT, tags ARRAY<STRING>) USING delta LOCATION '{tmp_path}/nested'")
    spark.sql("INSERT INTO nested VALUES (1, array('a'))")
    spark.sql(f"CREATE TABLE vectors (id BIGINT) USING delta LOCATION '{tmp_path}/vectors' "
              "TBLPROPERTIES (delta.enableDeletionVectors = true)")
    spark.sql("INSERT INTO vectors SELECT id FROM range(100)")
    assert delta_rs.parquet_scan(f"{tmp_path}/vectors", 1) is not None  # no vector yet
    spark.sql("DELETE FROM vectors WHERE id = 5")
    for name in ("parted", "nested", "vectors"):
        assert delta_rs.parquet_scan(f"{tmp_path}/{name}", DeltaTable(f"{tmp_path}/{name}").version()) is None, name


def test_a_view_duckdb_cannot_bind_falls_back_to_the_arrow_dataset(tmp_path: Any) -> None:
    """A snapshot whose files lack a column of its schema (none holds it) cannot be read by DuckDB's reader as
    Delta reads it: the engine registers the Arrow dataset instead, and the rows are the same."""
    from deltalake import write_deltalake

    from connectors import delta_rs

    path = str(tmp_path / "fallback")
    write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64())}))
    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000)  # type: ignore[arg-type]
    try:
        made = local_engine._ParquetScan("SELECT no_such_column FROM read_parquet(['/nonexistent.parquet'])",
                                         lambda: delta_rs.dataset(path, 0))
        name = engine._register(("snapshot", path, 0), lambda: made)
        assert sorted(engine.con.execute(f"SELECT id FROM {name}").fetchall()) == [(1,), (2,)]
    finally:
        engine.con.close()


def test_arrow_datasets_skip_no_file_holding_matching_rows(spark: Any, st: Any, tmp_path: Any) -> None:
    """Filters pushed into the Arrow dataset of a partitioned table find every row Spark finds: a BOOLEAN and a
    BINARY column holding NULLs and values in one file (Spark keeps no minimum for them), and a column added
    after a file was written (absent from its statistics). Both once made delta-rs' per-file guarantee skip
    files holding matching rows; a join refreshed by DuckDB over such a table dropped its rows silently."""
    from deltalake import DeltaTable

    from connectors import delta_rs

    path = f"{tmp_path}/dim_pb"
    spark.sql(f"CREATE TABLE dim_pb (k BIGINT, flag BOOLEAN, bin BINARY, p STRING) USING delta PARTITIONED BY (p) "
              f"LOCATION '{path}' TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("INSERT INTO dim_pb SELECT /*+ COALESCE(1) */ * FROM VALUES (1, true, X'01', 'a'), "
              "(2, NULL, NULL, 'a'), (3, false, X'02', 'a'), (4, true, NULL, 'b') AS v(k, flag, bin, p)")
    spark.sql("ALTER TABLE dim_pb ADD COLUMNS (extra STRING)")
    spark.sql("INSERT INTO dim_pb VALUES (5, true, X'01', 'a', 'x')")
    assert len(DeltaTable(path).file_uris()) == 3  # the first insert's rows of partition a share one file
    dataset = delta_rs.dataset(path, DeltaTable(path).version())
    engine = local_engine.LocalEngine(None, _Ctx(), None, 1000)  # type: ignore[arg-type]
    try:
        engine.con.register("t", dataset)
        for where, duck in (("flag", None), ("NOT flag", None), ("flag IS NULL", None),
                            ("bin = X'01'", "bin = '\\x01'::BLOB"), ("bin IS NULL", None), ("extra IS NULL", None),
                            ("extra = 'x'", None), ("flag AND p = 'a'", None)):
            got = sorted(r[0] for r in engine.con.execute(f"SELECT k FROM t WHERE {duck or where}").fetchall())
            want = sorted(r[0] for r in spark.sql(f"SELECT k FROM dim_pb WHERE {where}").collect())
            assert got == want and want, where
    finally:
        engine.con.close()

    spark.sql(f"CREATE TABLE fact_pb (id BIGINT, k BIGINT) USING delta LOCATION '{tmp_path}/fact_pb' "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("INSERT INTO fact_pb VALUES (10, 1)")
    q = "SELECT f.id, d.k, d.extra FROM fact_pb f JOIN dim_pb d ON f.k = d.k WHERE d.flag AND d.extra IS NULL"
    st.create_stream_table("pb_join", q, refresh_mode="DIFFERENTIAL")
    spark.sql("INSERT INTO fact_pb VALUES (11, 1), (12, 2), (13, 3), (14, 4), (15, 5)")
    r = st.refresh_stream_table("pb_join")
    assert r.action == "DIFFERENTIAL" and "delta computed by duckdb" in (r.apply or ""), r.apply
    assert_matches(spark, st, "pb_join", q)
    assert sorted(row.id for row in st.read("pb_join").collect()) == [10, 11, 14]
