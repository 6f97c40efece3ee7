"""Bag-layout stream tables store plain rows: the Delta files hold exactly the query's rows.

Why this matters: users (and tools that are not Spark) read a stream table by path. A layout that stores one
row per distinct tuple with a count would show two equal rows of the query as one, to every reader that does
not know to expand the count. So, after every DIFFERENTIAL refresh through inserts, deletes of one of several
copies, updates and NULLs, the user columns read with delta-rs (``deltalake``) and with Spark by path must
equal ``spark.sql(query)`` as multisets, and the hidden columns must be the documented ones: ``__row_hash``
(equal for every copy of a tuple) and ``__row_id`` (unique per physical row), no count column.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

Row = tuple[Any, ...]


def _rows_by_delta_rs(path: str, cols: list[str]) -> tuple[Counter[Row], Any]:
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table()
    rows = Counter(tuple(r[c] for c in cols) for r in table.select(cols).to_pylist())
    return rows, table


def _check(spark: Any, st: Any, name: str, expected_sql: str, when: str) -> None:
    d = st.catalog.get(name)
    cols = list(d.names)
    expected = Counter(tuple(r) for r in spark.sql(expected_sql).collect())
    by_rs, table = _rows_by_delta_rs(d.path, cols)
    listed = ", ".join(f"`{c}`" for c in cols)
    by_spark = Counter(tuple(r) for r in spark.sql(f"SELECT {listed} FROM delta.`{d.path}`").collect())
    context = f"{name} {when}: expected {sorted(expected.items(), key=repr)}"
    assert by_rs == expected, f"{context}, delta-rs read {sorted(by_rs.items(), key=repr)}"
    assert by_spark == expected, f"{context}, Spark read {sorted(by_spark.items(), key=repr)}"
    assert sorted(table.column_names) == sorted([*cols, "__row_id", "__row_hash"]), table.column_names
    ids = table.column("__row_id").to_pylist()
    assert len(set(ids)) == len(ids) == sum(expected.values()), f"{name} {when}: __row_id not unique per row"
    hashes: dict[Row, set[int]] = {}
    for r in table.to_pylist():
        hashes.setdefault(tuple(r[c] for c in cols), set()).add(r["__row_hash"])
    assert all(len(h) == 1 for h in hashes.values()), f"{name} {when}: copies of a row with different __row_hash"
    assert len({next(iter(h)) for h in hashes.values()}) == len(hashes), f"{name} {when}: __row_hash collision"


def test_bag_tables_hold_the_query_rows_for_every_reader(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    src = make_source("pr_src", "id INT, k INT, v STRING, x DOUBLE",
                      rows=[(1, 1, "a", 1.5), (2, 1, "a", 1.5), (3, 2, "b", None), (4, None, None, 2.0),
                            (5, 3, "c", -0.5)])
    other = make_source("pr_other", "k INT, v STRING, x DOUBLE", rows=[(1, "a", 1.5), (1, "a", 1.5), (9, None, 0.0)])
    plain, union, down = unique_name("pr_plain"), unique_name("pr_union"), unique_name("pr_down")
    plain_q = f"SELECT k, v, x FROM {src}"
    union_q = f"SELECT k, v, x FROM {src} WHERE k IS NULL OR k < 3 UNION ALL SELECT k, v, x FROM {other}"
    down_body = "SELECT k, v FROM {t} WHERE v IS NOT NULL OR k IS NULL"
    tables = {plain: plain_q, union: union_q, down: down_body.format(t=f"({plain_q})")}
    st.create_stream_table(plain, plain_q, refresh_mode="DIFFERENTIAL")
    st.create_stream_table(union, union_q, refresh_mode="DIFFERENTIAL")
    # a stream table over a plain-rows stream table: each physical row of the upstream is one copy
    st.create_stream_table(down, down_body.format(t=plain), refresh_mode="DIFFERENTIAL")
    for name, q in tables.items():
        _check(spark, st, name, q, "after the initial FULL refresh")

    steps = [
        ("inserts of more copies", [f"INSERT INTO {src} VALUES (6, 1, 'a', 1.5), (7, 2, 'b', NULL), (8, 3, 'c', -0.5)",
                                    f"INSERT INTO {other} VALUES (1, 'a', 1.5)"]),
        ("a delete of one of several copies", [f"DELETE FROM {src} WHERE id = 2",
                                               f"DELETE FROM {other} WHERE k = 9"]),
        ("an update of one copy", [f"UPDATE {src} SET v = 'z' WHERE id = 6"]),
        ("NULLs in and out", [f"UPDATE {src} SET k = NULL, v = NULL, x = 2.0 WHERE id = 3",
                              f"INSERT INTO {src} VALUES (9, NULL, NULL, 2.0), (10, NULL, 'n', NULL)",
                              f"UPDATE {src} SET x = NULL WHERE id = 4"]),
        ("every copy of a row deleted and one back", [f"DELETE FROM {other} WHERE k = 1",
                                                      f"INSERT INTO {other} VALUES (1, 'a', 1.5)"]),
        ("rows made equal to others", [f"UPDATE {src} SET k = 1, v = 'a', x = 1.5 WHERE id IN (7, 9)",
                                       f"DELETE FROM {src} WHERE id = 1"]),
        ("everything deleted but one copy", [f"DELETE FROM {src} WHERE id <> 7"]),
    ]
    for when, statements in steps:
        for s in statements:
            spark.sql(s)
        for name, q in tables.items():
            r = st.refresh_stream_table(name)
            assert r.action in ("DIFFERENTIAL", "NO_DATA"), (name, when, r.action, r.reason)
            _check(spark, st, name, q, f"after {when}")
