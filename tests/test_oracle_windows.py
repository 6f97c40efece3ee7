"""Oracle tests of window functions, TopK (ORDER BY ... LIMIT) and DISTINCT ON, every refresh DIFFERENTIAL.

Why these tables: each exercises one maintenance path of :mod:`dvm.operators.window` /
:mod:`dvm.operators.topk`, over a source whose partition key ``grp`` is often NULL and often updated (rows move
between partitions: the partition they leave and the one they join are both recomputed), whose ORDER BY column
``x`` is often NULL, and whose rows holding the least / greatest ``x`` and ``id`` (the first row of a
partition, the top of a TopK) are deleted or moved in many cycles:

* ``rank`` — one PARTITION BY: ROW_NUMBER, RANK, DENSE_RANK, NTILE, PERCENT_RANK, CUME_DIST, LAG / LEAD with
  offsets and defaults, FIRST_VALUE, LAST_VALUE over a whole-partition ROWS frame;
* ``multi`` — three PARTITION BYs (the closure rule), one of them an expression: NTH_VALUE, FIRST_VALUE
  IGNORE NULLS, a named window, SUM / COUNT / AVG / MIN / MAX OVER ROWS and RANGE frames (RANGE with an
  offset, the default RANGE frame with ties);
* ``whole`` — windows without PARTITION BY (whole-input recompute);
* ``topn`` — the top-N-per-group pattern, ``WHERE rn <= 2`` over ROW_NUMBER in a subquery;
* ``over_agg`` — window functions over a GROUP BY (RANK of SUM, SUM of COUNT, LAG of SUM);
* ``topk`` / ``topk_agg`` — ORDER BY ... LIMIT [OFFSET] at the top, over rows and over groups;
* ``don`` — DISTINCT ON, compared with the ROW_NUMBER query it means.

One stream table per path, not one per function: each costs a refresh per cycle.

Determinism: orderings are tie-free where the function is positional (the last key is ``id``), because the
oracle runs the query in Spark, which may break ties differently from the stream table (see the tie-breaker
rule in :mod:`dvm.operators.window`); peer-based functions (RANK, RANGE frames) are tested with ties.

``test_window_corners_differential`` walks fixed data through the corners random data only hits by luck.

``TRICKLE_ORACLE_CYCLES`` and ``TRICKLE_ORACLE_SEED`` (an int or ``random``) override the defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from coverage_rows import Row
from oracle import Col, Extreme, TableSpec, check_steps_differential, run_oracle

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

WT = TableSpec(
    "w",
    (
        Col("grp", "jkey", domain=(1, 4)),
        Col("x", "int", domain=(0, 12)),
        Col("v", "double", domain=(-50, 150)),
        Col("name", "string"),
    ),
    key="id",
    rows=32,
    null_p=0.18,
    max_changes=5,
)

QUERIES: dict[str, str | tuple[str, str]] = {
    "rank": (
        "SELECT id, grp, x, ROW_NUMBER() OVER (PARTITION BY grp ORDER BY x DESC, id) AS rn, "
        "RANK() OVER (PARTITION BY grp ORDER BY x) AS rk, DENSE_RANK() OVER (PARTITION BY grp ORDER BY x DESC) AS drk, "
        "NTILE(3) OVER (PARTITION BY grp ORDER BY id) AS nt, PERCENT_RANK() OVER (PARTITION BY grp ORDER BY x) AS pr, "
        "CUME_DIST() OVER (PARTITION BY grp ORDER BY x NULLS LAST) AS cd, "
        "LAG(x, 1, -1) OVER (PARTITION BY grp ORDER BY id) AS lg, LEAD(name, 2) OVER (PARTITION BY grp ORDER BY id) AS ld, "
        "FIRST_VALUE(name) OVER (PARTITION BY grp ORDER BY x, id) AS fv, "
        "LAST_VALUE(x) OVER (PARTITION BY grp ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS lv "
        "FROM {w}"
    ),
    "multi": (
        "SELECT id, NTH_VALUE(x, 2) OVER (PARTITION BY name ORDER BY id) AS nv, "
        "FIRST_VALUE(x) IGNORE NULLS OVER (PARTITION BY name ORDER BY id DESC) AS fvn, SUM(v) OVER w2 AS sw, "
        "SUM(x) OVER (PARTITION BY grp ORDER BY id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS s3, "
        "COUNT(*) OVER (PARTITION BY grp) AS n, COUNT(x) OVER (PARTITION BY name) AS nx, "
        "AVG(v) OVER (PARTITION BY name ORDER BY x RANGE BETWEEN 5 PRECEDING AND CURRENT ROW) AS ar, "
        "MIN(x) OVER (PARTITION BY grp ORDER BY id ROWS UNBOUNDED PRECEDING) AS rmin, "
        "MAX(v) OVER (PARTITION BY x % 3) AS mx, SUM(x) OVER (PARTITION BY grp ORDER BY x) AS run "
        "FROM {w} WINDOW w2 AS (PARTITION BY grp ORDER BY id)"
    ),
    "whole": (
        "SELECT id, ROW_NUMBER() OVER (ORDER BY v DESC, id) AS r, SUM(x) OVER () AS tot, "
        "LAG(id) OVER (ORDER BY id) AS prev, RANK() OVER (PARTITION BY grp ORDER BY x) AS rk FROM {w}"
    ),
    "topn": (
        "SELECT grp, id, x FROM (SELECT grp, id, x, ROW_NUMBER() OVER (PARTITION BY grp ORDER BY x DESC, id) AS rn "
        "FROM {w}) t WHERE rn <= 2"
    ),
    # QUALIFY (rewritten to a filter over a subquery; the oracle runs that form) and a TopK in a subquery
    # (recomputed on both snapshots) joined back to its source
    "qualify_sub": (
        "SELECT q.grp, q.id, t.x FROM (SELECT grp, id FROM {w} QUALIFY RANK() OVER (PARTITION BY grp ORDER BY id DESC) = 1) q "
        "JOIN (SELECT id, x FROM {w} ORDER BY x DESC NULLS LAST, id LIMIT 6) t ON t.id = q.id",
        "SELECT q.grp, q.id, t.x FROM (SELECT grp, id FROM (SELECT grp, id, RANK() OVER (PARTITION BY grp ORDER BY id DESC) "
        "AS r FROM {w}) z WHERE r = 1) q "
        "JOIN (SELECT id, x FROM {w} ORDER BY x DESC NULLS LAST, id LIMIT 6) t ON t.id = q.id",
    ),
    "over_agg": (
        "SELECT grp, SUM(x) AS s, COUNT(*) AS n, RANK() OVER (ORDER BY SUM(x) DESC) AS r, "
        "SUM(COUNT(*)) OVER () AS total, LAG(SUM(x)) OVER (ORDER BY grp) AS prev FROM {w} GROUP BY grp"
    ),
    "topk": "SELECT id, grp, x FROM {w} WHERE v > -40 ORDER BY x DESC NULLS LAST, id LIMIT 5 OFFSET 1",
    "topk_agg": "SELECT grp, COUNT(*) AS n FROM {w} GROUP BY grp ORDER BY n DESC, grp LIMIT 2",
    "don": (
        "SELECT DISTINCT ON (grp) grp, id, x AS y FROM {w} ORDER BY grp, y DESC NULLS LAST, id",
        "SELECT grp, id, y FROM (SELECT grp, id, x AS y, ROW_NUMBER() OVER (PARTITION BY grp "
        "ORDER BY x DESC NULLS LAST, id) AS rn FROM {w}) t WHERE rn = 1",
    ),
}


def test_window_family_differential(spark: Any, st: Any) -> None:
    """Window functions, TopK and DISTINCT ON equal their queries after each of >= 20 random change batches,
    each refresh DIFFERENTIAL; rows move between partitions, partition keys and ORDER BY values turn NULL, and
    the rows holding the extreme ``x`` / ``id`` (first rows of partitions, tops of the TopKs) are deleted or
    moved in many cycles."""
    run_oracle(
        spark,
        st,
        [WT],
        QUERIES,
        cycles=CYCLES,
        seed=4711,
        extremes=[Extreme("w", "x", p=0.35), Extreme("w", "id", p=0.3), Extreme("w", "v", p=0.25)],
    )


# --------------------------------------------------------------------------------------------------
# Fixed data through the corners
# --------------------------------------------------------------------------------------------------

CORNER_COLUMNS = "id INT, grp INT, x INT, name STRING"
CORNER_ROWS = [
    (1, 1, 10, "a"), (2, 1, 20, "b"), (3, 1, 30, "c"),
    (4, 2, 5, "d"), (5, 2, None, "e"), (6, 2, 7, "f"),
    (7, None, 1, "g"), (8, None, 2, None),  # the NULL partition
    (9, 3, 50, "h"),
]

CORNER_QUERIES: dict[str, tuple[str, str]] = {
    "c_rn": ("SELECT id, grp, ROW_NUMBER() OVER (PARTITION BY grp ORDER BY x NULLS FIRST, id) AS rn, "
             "LEAD(x) OVER (PARTITION BY grp ORDER BY id) AS nx, COUNT(*) OVER (PARTITION BY name IS NULL) AS nn "
             "FROM {src}",) * 2,
    "c_top": ("SELECT id, x FROM {src} ORDER BY x DESC NULLS LAST, id LIMIT 3",) * 2,
    "c_off": ("SELECT id, grp FROM {src} ORDER BY id OFFSET 6",) * 2,
    "c_sub": ("SELECT t.id, t.x, n.name FROM (SELECT id, x FROM {src} ORDER BY x, id LIMIT 2) t "
              "JOIN {src} n ON n.id = t.id + 1",) * 2,
    "c_qual": ("SELECT grp, id FROM {src} QUALIFY ROW_NUMBER() OVER (PARTITION BY grp ORDER BY id DESC) = 1",
               "SELECT grp, id FROM (SELECT grp, id, ROW_NUMBER() OVER (PARTITION BY grp ORDER BY id DESC) AS rn "
               "FROM {src}) t WHERE rn = 1"),
    "c_don": ("SELECT DISTINCT ON (grp) grp, id, name FROM {src} ORDER BY grp, x, id LIMIT 2",
              "SELECT grp, id, name FROM (SELECT grp, id, name, x, ROW_NUMBER() OVER (PARTITION BY grp "
              "ORDER BY x, id) AS rn FROM {src}) t WHERE rn = 1 ORDER BY grp, x, id LIMIT 2"),
}

CORNER_STEPS = [
    ("first row of every partition deleted (NULL partition included)", "DELETE FROM {src} WHERE id IN (1, 5, 7)"),
    ("a row moves between partitions, another into the NULL partition",
     "UPDATE {src} SET grp = CASE id WHEN 2 THEN 2 ELSE NULL END WHERE id IN (2, 9)"),
    ("inserts above the TopK boundary, below it, and into a new partition",
     "INSERT INTO {src} VALUES (10, 4, 99, 'i'), (11, 4, 0, 'j'), (12, 1, NULL, NULL), (13, 2, 31, 'k')"),
    ("deletes inside the top; ORDER BY values turn NULL", "DELETE FROM {src} WHERE id IN (10, 13)"),
    ("an update inside the top and a key update", "UPDATE {src} SET x = x + 100, id = id + 20 WHERE id = 3"),
    ("the table shrinks below LIMIT and OFFSET", "DELETE FROM {src} WHERE id > 6"),
    ("refilled", "INSERT INTO {src} VALUES (30, 1, 3, 'p'), (31, 1, 3, 'q'), (32, NULL, 4, 'r'), (33, 5, 8, 's'), "
     "(34, 5, 9, 't'), (35, 2, 1, 'u')"),
]


def test_window_corners_differential(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """Fixed steps: the first row of every partition deleted, rows moving between partitions and into the NULL
    partition, TopK inserts above / below the boundary, deletes and updates inside the top, a table shrinking
    below LIMIT / OFFSET and refilled, a TopK in a subquery (both snapshots recomputed), DISTINCT ON with a
    LIMIT, QUALIFY. Every refresh is DIFFERENTIAL and every stream table equals its query afterwards."""
    src = make_source("wcorners", CORNER_COLUMNS, rows=CORNER_ROWS)
    names = {n: unique_name(n) for n in CORNER_QUERIES}
    queries = {names[n]: q.format(src=src) for n, (q, _) in CORNER_QUERIES.items()}
    expected = {names[n]: e.format(src=src) for n, (_, e) in CORNER_QUERIES.items()}
    check_steps_differential(spark, st, src, queries, expected, CORNER_STEPS)
    # a TopK stream table holds exactly the top rows: never more than LIMIT
    assert st.read(names["c_top"]).count() == 3


# --------------------------------------------------------------------------------------------------
# Coverage rows (docs/COVERAGE.md)
# --------------------------------------------------------------------------------------------------

_FAMILY = "test_window_family_differential"
_PART = "partition-scoped recompute: the partitions the delta touches, on both snapshots"

COVERAGE: list[Row] = [
    Row("ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)", "recompute-scoped",
        "SELECT id, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v, id) AS rn FROM a", _FAMILY, _PART),
    Row("RANK / DENSE_RANK / PERCENT_RANK / CUME_DIST OVER", "recompute-scoped",
        "SELECT id, RANK() OVER (PARTITION BY k ORDER BY v) AS r, CUME_DIST() OVER (PARTITION BY k ORDER BY v) AS c "
        "FROM a", _FAMILY, _PART),
    Row("NTILE(n) OVER", "recompute-scoped", "SELECT id, NTILE(3) OVER (PARTITION BY k ORDER BY id) AS t FROM a",
        _FAMILY, _PART),
    Row("LAG / LEAD OVER", "recompute-scoped",
        "SELECT id, LAG(v, 1, 0) OVER (PARTITION BY k ORDER BY id) AS p, LEAD(s) OVER (PARTITION BY k ORDER BY id) "
        "AS n FROM a", _FAMILY, _PART),
    Row("FIRST_VALUE / LAST_VALUE / NTH_VALUE OVER", "recompute-scoped",
        "SELECT id, FIRST_VALUE(s) OVER (PARTITION BY k ORDER BY v, id) AS f FROM a", _FAMILY,
        _PART + "; with ties in a RANGE frame the value among tied rows is Spark's pick"),
    Row("aggregate OVER (ROWS / RANGE BETWEEN ...)", "recompute-scoped",
        "SELECT id, SUM(v) OVER (PARTITION BY k ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS s FROM a",
        _FAMILY, _PART),
    Row("several windows with different PARTITION BYs", "recompute-scoped",
        "SELECT id, COUNT(*) OVER (PARTITION BY k) AS n, MAX(v) OVER (PARTITION BY s) AS m FROM a", _FAMILY,
        "rows whose partition under any PARTITION BY was touched, each window over its whole partition"),
    Row("window without PARTITION BY", "recompute-scoped",
        "SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS r FROM a", _FAMILY,
        "one partition: any change recomputes every row (both snapshots)"),
    Row("window function over GROUP BY", "recompute-scoped",
        "SELECT k, SUM(v) AS s, RANK() OVER (ORDER BY SUM(v) DESC) AS r FROM a GROUP BY k", _FAMILY,
        "groups rescanned, then the window's partitions recomputed"),
    Row("top-N per group (ROW_NUMBER in a subquery, WHERE rn <= n)", "recompute-scoped",
        "SELECT * FROM (SELECT k, id, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC, id) AS rn FROM a) t "
        "WHERE rn <= 3", _FAMILY, _PART),
    Row("QUALIFY", "recompute-scoped",
        "SELECT k, id FROM a QUALIFY ROW_NUMBER() OVER (PARTITION BY k ORDER BY id) = 1", _FAMILY,
        "rewritten to a filter over a subquery; " + _PART),
    Row("WINDOW w AS (...) (named windows)", "recompute-scoped",
        "SELECT id, SUM(v) OVER w AS s FROM a WINDOW w AS (PARTITION BY k ORDER BY id)", _FAMILY,
        "inlined into each OVER w; " + _PART),
    Row("ORDER BY ... LIMIT n [OFFSET m] (TopK)", "recompute-scoped",
        "SELECT id, v FROM a ORDER BY v DESC, id LIMIT 10", _FAMILY,
        "the top of the post snapshot merged against the stored rows, when a source changed"),
    Row("ORDER BY ... LIMIT in a subquery", "recompute-scoped",
        "SELECT t.id FROM (SELECT id FROM a ORDER BY v, id LIMIT 5) t JOIN b ON b.id = t.id", _FAMILY,
        "TopK recomputed on both snapshots when a source changed"),
    Row("DISTINCT ON (PostgreSQL)", "recompute-scoped",
        "SELECT DISTINCT ON (k) k, id, v FROM a ORDER BY k, v DESC, id", _FAMILY,
        "rewritten to ROW_NUMBER() OVER (PARTITION BY k ORDER BY ...) = 1; " + _PART),
    Row("LIMIT without ORDER BY", "rejected", "SELECT id FROM a LIMIT 10", None,
        "keeps arbitrary rows; add ORDER BY with a unique key"),
    Row("FETCH FIRST n ROWS WITH TIES", "rejected", "SELECT id FROM a ORDER BY v FETCH FIRST 3 ROWS WITH TIES",
        None, "Spark has no WITH TIES; use RANK() OVER (ORDER BY ...) <= n"),
]
