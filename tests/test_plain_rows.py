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

import pytest

Row = tuple[Any, ...]


def _rows_by_delta_rs(path: str, cols: list[str]) -> tuple[Counter[Row], Any]:
    import pyarrow as pa
    from deltalake import DeltaTable

    # scan() (DataFusion) applies deletion vectors; to_pyarrow_table() refuses tables that have them
    table = pa.RecordBatchReader.from_stream(DeltaTable(path).scan()).read_all()
    rows = Counter(tuple(r[c] for c in cols) for r in table.select(cols).to_pylist())
    return rows, table


def _down_matches(spark: Any, down: str, down_body: str, query: str, when: str) -> None:
    """The downstream table ``down`` (its query ``down_body`` over ``{t}``) holds what its query gives over the
    upstream's own query, as multisets of ``(k, n)``."""
    expected = spark.sql(down_body.format(t=f"({query})"))
    got = spark.table(down).select("k", "n")
    assert got.exceptAll(expected).count() == 0 and expected.exceptAll(got).count() == 0, when


def _check(spark: Any, st: Any, name: str, expected_sql: str, when: str) -> None:
    _check_all(spark, st, {name: expected_sql}, when)


def _check_all(spark: Any, st: Any, tables: dict[str, str], when: str) -> None:
    """Each stream table (name -> its query) read by delta-rs and by Spark by path, against its query. The
    Spark sides of all tables come in one Spark job (two jobs a table before: most of a check's time)."""
    from functools import reduce

    from oracle import decode_row, json_rows

    parts = []
    for name, expected_sql in tables.items():
        d = st.catalog.get(name)
        listed = ", ".join(f"`{c}`" for c in d.names)
        parts += [json_rows(spark.sql(expected_sql), f"e:{name}"),
                  json_rows(spark.sql(f"SELECT {listed} FROM delta.`{d.path}`"), f"s:{name}")]
    read: dict[str, Counter[Row]] = {}
    for r in reduce(lambda a, b: a.unionAll(b), parts).collect():
        read.setdefault(r["tag"], Counter())[decode_row(r["j"])] += 1
    for name in tables:
        _check_read(st, name, read.get(f"e:{name}", Counter()), read.get(f"s:{name}", Counter()), when)


def _check_read(st: Any, name: str, expected: Counter[Row], by_spark: Counter[Row], when: str) -> None:
    d = st.catalog.get(name)
    cols = list(d.names)
    by_rs, table = _rows_by_delta_rs(d.path, cols)
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


@pytest.mark.parametrize("deletions", ["rewritten", "marked"])
def test_bag_tables_hold_the_query_rows_for_every_reader(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str], deletions: str
) -> None:
    """``marked``: deleted copies are marked in deletion vectors by spark-trickle's own commit
    (connectors/deletion_vectors.py) instead of rewritten by delta-rs' MERGE; readers must see the same rows,
    and the downstream table reads the upstream's change feed from the commit's change-data file."""
    from pipeline import strategy

    if deletions == "marked":
        spark.conf.set(strategy.VECTORS_ABOVE_ROWS, "0")
    try:
        _bag_tables_hold_the_query_rows(spark, st, make_source, unique_name)
    finally:
        spark.conf.unset(strategy.VECTORS_ABOVE_ROWS)
    if deletions == "marked":
        applied = {(h.get("apply") or "").split(":")[0] for row in st.status() for h in st.history(row["name"])}
        assert "MERGE (vectors)" in applied, applied


def _bag_tables_hold_the_query_rows(
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
    _check_all(spark, st, tables, "after the initial FULL refresh")

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
        for name in tables:
            r = st.refresh_stream_table(name)
            assert r.action in ("DIFFERENTIAL", "NO_DATA"), (name, when, r.action, r.reason)
        _check_all(spark, st, tables, f"after {when}")


def test_a_full_refresh_of_a_table_of_few_bytes_is_collected_and_written_by_delta_rs(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """A FULL refresh of a table whose files held at most ``trickle.apply.fullCollectBytesBelow`` bytes collects
    its result and delta-rs replaces the table, though it held more than ``fullCollectRowsBelow`` rows (Spark's
    writer costs a fixed second); with the bytes limit off, Spark writes it. Duplicates stay copies either way."""
    from pipeline import strategy
    from pipeline.local_engine import MAX_FULL_BYTES
    from tests.oracle import session_conf

    src = make_source("fc_src", "id INT, k INT, v STRING", rows=[(i, i % 7, f"s{i % 3}") for i in range(300)])
    name, query = unique_name("fc_full"), f"SELECT k, v FROM {src}"
    with session_conf(spark, {MAX_FULL_BYTES: "0", strategy.FULL_COLLECT_ROWS: "10"}):  # not DuckDB, not by rows
        st.create_stream_table(name, query, refresh_mode="FULL")
        spark.sql(f"INSERT INTO {src} VALUES (900, 1, 's1'), (901, NULL, NULL), (902, NULL, NULL)")
        spark.sql(f"DELETE FROM {src} WHERE id < 20")
        st.refresh_stream_table(name)
        applied = st.history(name, 1)[0]["apply"]
        assert applied.startswith("OVERWRITE (delta-rs)") and "bytes" in applied, applied
        _check(spark, st, name, query, "after a collected FULL")
        spark.sql(f"UPDATE {src} SET v = 'z' WHERE id BETWEEN 20 AND 40")
        with session_conf(spark, {strategy.FULL_COLLECT_BYTES: "0"}):
            st.refresh_stream_table(name)
        applied = st.history(name, 1)[0]["apply"]
        assert applied.startswith("OVERWRITE (spark)"), applied
        _check(spark, st, name, query, "after Spark's FULL")


def test_a_collected_full_replaces_a_table_with_deletion_vectors_by_the_own_commit(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain-rows table gets deletion vectors when a refresh marks deleted copies; delta-rs writes no such
    table, so a FULL refresh's collected result replaces it by spark-trickle's own commit (OVERWRITE (own)).
    Every reader sees the query's rows after it, the downstream table that reads its change feed (the live rows
    of the removed files, vectors applied, as deletions) stays equal to its query, and a later refresh marks
    deleted copies in the new file. Every file the own commits write here takes the table's Parquet layout
    (``LEAN_BELOW_ROWS`` lowered: ``__row_id`` delta bit-packed, no dictionary for the hidden columns), which
    every reader reads."""
    import pyarrow.parquet as pq

    from connectors import own_commit
    from connectors.delta_log import DeltaLog
    from connectors.storage import local_path
    from pipeline import strategy

    monkeypatch.setattr(own_commit, "LEAN_BELOW_ROWS", 0)
    from pipeline.local_engine import MAX_FULL_BYTES
    from tests.oracle import session_conf

    src = make_source("fo_src", "id INT, k INT, v STRING", rows=[(i, i % 5, f"s{i % 2}") for i in range(200)])
    name, down = unique_name("fo_st"), unique_name("fo_down")
    query, down_body = f"SELECT k, v FROM {src}", "SELECT k, count(*) AS n FROM {t} WHERE v = 's1' GROUP BY k"
    tables = {name: query}
    with session_conf(spark, {MAX_FULL_BYTES: "0", strategy.FULL_COLLECT_ROWS: "10",
                              strategy.VECTORS_ABOVE_ROWS: "0"}):
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        st.create_stream_table(down, down_body.format(t=name), refresh_mode="DIFFERENTIAL")

        spark.sql(f"DELETE FROM {src} WHERE id < 30")
        assert st.refresh_stream_table(name).action == "DIFFERENTIAL"
        assert (st.history(name, 1)[0]["apply"] or "").startswith("MERGE (vectors)"), st.history(name, 1)
        st.refresh_stream_table(down)
        spark.sql(f"INSERT INTO {src} VALUES (500, 1, 's1'), (501, 1, 's1'), (502, NULL, NULL)")
        spark.sql(f"UPDATE {src} SET v = 's1' WHERE id BETWEEN 40 AND 60")
        st.alter_stream_table(name, refresh_mode="FULL")
        st.refresh_stream_table(name)
        applied = st.history(name, 1)[0]["apply"]
        assert applied.startswith("OVERWRITE (own)") and "bytes" in applied, applied
        log = DeltaLog(spark, st.catalog.get(name).path)
        added = [a["add"]["path"] for a in log.actions(log.latest_version()) if "add" in a]
        assert len(added) == 1, added
        md = pq.ParquetFile(f"{local_path(st.catalog.get(name).path)}/{added[0]}").metadata
        kinds = {md.row_group(0).column(i).path_in_schema: set(md.row_group(0).column(i).encodings)
                 for i in range(md.num_columns)}
        assert "DELTA_BINARY_PACKED" in kinds["__row_id"], kinds
        assert not (kinds["__row_id"] | kinds["__row_hash"]) & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}, kinds
        _check_all(spark, st, tables, "after the own overwrite")
        assert st.refresh_stream_table(down).action == "DIFFERENTIAL"  # from the overwrite's change feed
        _down_matches(spark, down, down_body, query, "after the upstream's own overwrite")
        st.alter_stream_table(name, refresh_mode="DIFFERENTIAL")
        spark.sql(f"DELETE FROM {src} WHERE k = 2 OR id = 501")
        st.refresh_stream_table(name)
        assert (st.history(name, 1)[0]["apply"] or "").startswith("MERGE (vectors)"), st.history(name, 1)
        _check_all(spark, st, tables, "after marking copies in the overwritten table")
        assert st.refresh_stream_table(down).action == "DIFFERENTIAL"
        _down_matches(spark, down, down_body, query, "after the upstream marked copies again")


def test_a_full_of_many_plain_rows_is_computed_by_duckdb_and_written_by_the_own_commit(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain-rows table's FULL refresh whose result has more rows than delta-rs is given
    (``fullCollectRowsBelow``) is computed by DuckDB, its ``__row_hash`` after DuckDB in blocks
    (``HASH_BLOCK_ROWS`` lowered, so that blocks meet inside the rows), and written by the own commit as several
    files side by side (``PART_ROWS`` lowered). Every reader sees the query's rows, duplicates, NULLs and -0.0
    included (NaN: the hash tests; this check's row counts cannot hold one); the downstream table that reads its change feed stays equal to its query; and a later
    DIFFERENTIAL refresh computed by Spark finds the stored copies it deletes by the hashes DuckDB stored. The
    table's first population goes the same way, once Spark has created it empty."""
    from connectors import own_overwrite
    from connectors.delta_log import DeltaLog
    from pipeline import local_engine, strategy
    from tests.oracle import session_conf

    monkeypatch.setattr(own_overwrite, "PART_ROWS", 40)
    monkeypatch.setattr(local_engine, "HASH_BLOCK_ROWS", 16)
    rows = [(i, i % 5, None if i % 11 == 0 else f"s{i % 2}", [-0.0, 0.0, 1.5, None][i % 4], i % 3 * (1 << 40))
            for i in range(200)]
    src = make_source("fd_src", "id INT, k INT, v STRING, x DOUBLE, b BIGINT", rows=rows)
    spark.sql(f"INSERT INTO {src} VALUES (300, 1, 's1', 2.5, 7), (301, 1, 's1', 2.5, 7)")
    name, down = unique_name("fd_st"), unique_name("fd_down")
    query, down_body = f"SELECT k, v, x, b FROM {src}", "SELECT k, count(*) AS n FROM {t} WHERE v = 's1' GROUP BY k"
    tables = {name: query}
    with session_conf(spark, {strategy.FULL_COLLECT_ROWS: "10", strategy.VECTORS_ABOVE_ROWS: "0"}):
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        first = st.history(name, 1)[0]
        assert first["apply"].startswith("OVERWRITE (own)") and "DuckDB computed" in first["apply"], first
        _check_all(spark, st, tables, "after DuckDB's first population")
        st.create_stream_table(down, down_body.format(t=name), refresh_mode="DIFFERENTIAL")

        spark.sql(f"INSERT INTO {src} VALUES (500, 1, 's1', -0.0, 7), (501, 1, 's1', -0.0, 7), (502, NULL, NULL, NULL, NULL)")
        spark.sql(f"UPDATE {src} SET v = 's1' WHERE id BETWEEN 40 AND 60")
        st.alter_stream_table(name, refresh_mode="FULL")
        st.refresh_stream_table(name)
        last = st.history(name, 1)[0]
        assert last["apply"].startswith("OVERWRITE (own)") and "DuckDB computed" in last["apply"], last
        log = DeltaLog(spark, st.catalog.get(name).path)
        added = [a["add"]["path"] for a in log.actions(log.latest_version()) if "add" in a]
        assert len(added) > 1, added
        _check_all(spark, st, tables, "after DuckDB's FULL")
        assert st.refresh_stream_table(down).action == "DIFFERENTIAL"  # from the overwrite's change feed
        _down_matches(spark, down, down_body, query, "after the upstream's FULL by DuckDB")
        spark.sql(f"INSERT INTO {src} VALUES (600, 3, 's0', 1.5, 7)")
        with session_conf(spark, {local_engine.MAX_PLAIN_FULL_BYTES: "0"}):  # off: more than 10 rows go by Spark
            st.refresh_stream_table(name)
        last = st.history(name, 1)[0]
        assert last["action"] == "FULL" and "DuckDB" not in (last["apply"] or ""), last
        _check_all(spark, st, tables, "after Spark's FULL with the DuckDB case off")
        st.alter_stream_table(name, refresh_mode="DIFFERENTIAL")
        spark.sql(f"DELETE FROM {src} WHERE k = 2 OR id IN (300, 501, 502) OR x IS NULL")
        spark.sql(f"UPDATE {src} SET b = b + 1 WHERE id % 7 = 0")
        with session_conf(spark, {local_engine.MODE: "off"}):  # the delta's hashes by Spark
            r = st.refresh_stream_table(name)
        assert r.action == "DIFFERENTIAL", (r.action, r.reason)
        _check_all(spark, st, tables, "after Spark's delta deleted copies DuckDB stored")
        assert st.refresh_stream_table(down).action == "DIFFERENTIAL"
        _down_matches(spark, down, down_body, query, "after the upstream's DIFFERENTIAL")


def test_float_identities_meet_recomputed_sums_and_keep_values_apart(spark: Any) -> None:
    """Both forms of ``dvm.context.FLOAT_IDENTITIES`` evaluated by Spark: sums of the same terms in another
    order get one identity, values that differ in their 11th digit keep two, and the edge values (NaN,
    infinities, -0.0, the largest and the smallest doubles, NULL) neither fail nor merge with others."""
    from dvm.context import FLOAT_IDENTITIES
    from dvm.plan import _canonical

    pairs = [("0.1D + 0.2D", "0.3D"), ("0.1D + 0.1D + 0.1D + 0.1D + 0.1D + 0.1D + 0.1D + 0.1D + 0.1D + 0.1D", "1.0D"),
             ("1e16D + 1.0D - 1e16D", "0.0D"), ("-0.0D", "0.0D")]
    apart = [("1.0D", "1.00000000002D"), ("123456.789D", "123456.788D"), ("-2.5D", "2.5D"), ("1e-300D", "2e-300D"),
             ("double('NaN')", "double('inf')"), ("double('-inf')", "double('inf')"), ("1.7976931348623157e308D", "0.0D"),
             ("4.9e-324D", "0.0D")]
    for identity in FLOAT_IDENTITIES:
        def ident(v: str, identity: str = identity) -> str:
            return _canonical(f"({v})", "double", identity)

        same = [f"{ident(a)} <=> {ident(b)}" for a, b in pairs]
        differ = [f"NOT ({ident(a)} <=> {ident(b)})" for a, b in apart]
        if identity == "bits37":  # digits12 formats NULL as 'null': row_hash's NULL marker tells it apart
            differ.append(f"{ident('CAST(NULL AS DOUBLE)')} IS NULL")
        got = spark.sql(f"SELECT {', '.join(same + differ)}").collect()[0]
        assert all(got), (identity, [c for c, ok in zip(same + differ, got, strict=True) if not ok])


def test_row_hash_keeps_the_hashes_stored_before_the_lazy_null_marker(spark: Any) -> None:
    """``row_hash`` builds its NULL marker only for rows with a NULL key; the hashes must stay those of the
    marker built for every row (``nullif(concat(flags), '000')``), which tables refreshed before store and
    their deltas must still find: NULLs in every position, none, all, and ('a', NULL) apart from (NULL, 'a')."""
    from dvm.plan import row_hash

    keys = ["a", "b", "c"]
    flags = ", ".join(f"IF(({k}) IS NULL, '1', '0')" for k in keys)
    before = f"xxhash64(a, b, c, nullif(concat({flags}), '000'))"
    rows = ("('x', 'y', 1), ('x', NULL, 1), (NULL, 'x', 1), ('x', 'y', NULL), (NULL, NULL, NULL), "
            "(NULL, NULL, 2), ('', '', 0)")
    got = spark.sql(f"SELECT {row_hash(keys)} AS now, {before} AS before FROM VALUES {rows} AS t(a, b, c)").collect()
    assert [r.now for r in got] == [r.before for r in got]
    assert len({r.now for r in got}) == len(got)


def test_a_table_declared_before_bits37_keeps_its_float_identity(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """A catalog file written before ``float_identity`` existed loads as ``digits12``, and such a table's
    refreshes keep hashing floats that way: its deltas find the copies its FULL refresh stored (deleting one
    of two equal DOUBLE rows, updating another), read the same by delta-rs and Spark as by the query."""
    import json

    from pipeline.catalog import StreamTableDef

    src = make_source("fi_src", "id INT, x DOUBLE", rows=[(1, 0.1), (2, 0.1), (3, 2.5), (4, None), (5, 1e300)])
    name = unique_name("fi_legacy")
    q = f"SELECT x FROM {src}"
    st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL", initialize=False)
    doc = json.loads(st.catalog.get(name).to_json())
    assert doc.pop("float_identity") == "bits37+nested"
    legacy = StreamTableDef.from_json(json.dumps(doc))
    assert legacy.float_identity == "digits12"
    st.catalog.put(legacy)
    assert st.refresh_stream_table(name).action == "FULL"
    stored = spark.sql(f"SELECT __row_hash FROM delta.`{legacy.path}` WHERE x = 0.1").collect()
    expected = spark.sql("SELECT xxhash64(format_string('%.12g', 0.1D + 0.0))").collect()[0][0]
    assert {r[0] for r in stored} == {expected}
    for s in [f"DELETE FROM {src} WHERE id = 2", f"UPDATE {src} SET x = 0.1 WHERE id = 3",
              f"UPDATE {src} SET x = NULL WHERE id = 5"]:
        spark.sql(s)
        r = st.refresh_stream_table(name)
        assert r.action == "DIFFERENTIAL", (s, r.action, r.reason)
        _check(spark, st, name, q, f"after {s}")
    assert st.catalog.get(name).float_identity == "digits12"


def test_plain_rows_keep_no_statistics_for_their_hash(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """Delta's min/max of a random hash skip nothing and cost a FULL refresh about an eighth of its time
    (delta_sink.creation_options): plain-rows tables are created without statistics for ``__row_hash``,
    every other column keeps them, and a keyed table (no hash column) keeps all of its own."""
    import json

    from connectors.delta_log import DeltaLog

    src = make_source("ns_src", "id INT, k INT, v STRING", rows=[(1, 1, "a"), (2, 1, "a"), (3, 2, None)])
    plain, keyed = unique_name("ns_plain"), unique_name("ns_keyed")
    st.create_stream_table(plain, f"SELECT k, v FROM {src}", refresh_mode="FULL")
    st.create_stream_table(keyed, f"SELECT k, COUNT(*) AS n FROM {src} GROUP BY k", refresh_mode="FULL")
    spark.sql(f"INSERT INTO {src} VALUES (4, 3, 'c')")
    for name in (plain, keyed):
        assert st.refresh_stream_table(name).action == "FULL"
    for name, unindexed in ((plain, {"__row_hash"}), (keyed, set())):
        path = st.catalog.get(name).path
        log = DeltaLog(spark, path)
        adds = [a["add"] for a in log.actions(log.latest_version()) if "add" in a]
        assert adds, name
        stored = [f.name for f in spark.read.format("delta").load(path).schema.fields]
        for add in adds:
            bounds = json.loads(add["stats"])["minValues"]
            assert set(stored) - set(bounds) == unindexed, (name, stored, bounds)
    _check(spark, st, plain, f"SELECT k, v FROM {src}", "after a FULL refresh")


def test_stream_tables_write_parquet_v2_without_dictionaries_for_hidden_columns(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """New stream tables carry how Spark writes their Parquet files as table properties (delta_sink.
    table_properties), which reach every Spark write into them and no other table's: v2 pages and
    encodings (``__row_id`` delta-packed), no dictionary for ``__row_hash`` / ``__row_id``. With
    ``trickle.streamTable.parquetWriterVersion=v1`` the files are v1; a value other than v1/v2 is refused
    before anything is created. Every reader still sees the query's rows (``_check``). A small table's first
    population is written by delta-rs (``trickle.refresh.localFullBelowBytes``), which follows the same
    properties as far as it can: ``__row_id`` delta bit-packed and no dictionaries, in v1 pages."""
    import glob
    import os

    import pyarrow.parquet as pq

    from connectors.delta_sink import PARQUET_WRITER
    from tests.oracle import session_conf

    src = make_source("pq_src", "id INT, k INT, v STRING", rows=[(i, i % 3, f"s{i % 5}") for i in range(200)])

    def encodings(name: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for f in glob.glob(os.path.join(st.catalog.get(name).path, "*.parquet")):
            md = pq.ParquetFile(f).metadata
            for g in range(md.num_row_groups):
                for i in range(md.num_columns):
                    c = md.row_group(g).column(i)
                    out.setdefault(c.path_in_schema, set()).update(c.encodings)
        return out

    from pipeline.local_engine import MAX_FULL_BYTES

    v2, v1, by_rs = unique_name("pq_v2"), unique_name("pq_v1"), unique_name("pq_rs")
    with session_conf(spark, {MAX_FULL_BYTES: "0"}):  # Spark's writer
        st.create_stream_table(v2, f"SELECT k, v FROM {src}", refresh_mode="FULL")
        with session_conf(spark, {PARQUET_WRITER: "v1"}):
            st.create_stream_table(v1, f"SELECT k, v FROM {src}", refresh_mode="FULL")
    st.create_stream_table(by_rs, f"SELECT k, v FROM {src}", refresh_mode="FULL")
    applied = st.history(by_rs, 1)[0]["apply"]
    assert applied.startswith("OVERWRITE (delta-rs)") and "DuckDB computed" in applied, applied
    assert "DuckDB" not in st.history(v2, 1)[0]["apply"], st.history(v2, 1)
    rs = encodings(by_rs)
    assert "DELTA_BINARY_PACKED" in rs["__row_id"] and not rs["__row_id"] & {"PLAIN", "PLAIN_DICTIONARY",
                                                                           "RLE_DICTIONARY"}, rs
    assert not rs["__row_hash"] & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}, rs
    _check(spark, st, by_rs, f"SELECT k, v FROM {src}", "after delta-rs created it")
    props = {r[0]: r[1] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{st.catalog.get(v2).path}`").collect()}
    assert props["parquet.writer.version"] == "v2" and props["delta.enableChangeDataFeed"] == "true", props
    assert props["parquet.enable.dictionary#__row_hash"] == props["parquet.enable.dictionary#__row_id"] == "false"
    got = encodings(v2)
    assert got["__row_id"] == {"DELTA_BINARY_PACKED"}, got  # neither PLAIN nor a dictionary
    assert not got["__row_hash"] & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}, got
    old = encodings(v1)
    assert "PLAIN" in old["__row_id"] and "DELTA_BINARY_PACKED" not in old["__row_id"], old
    spark.sql(f"INSERT INTO {src} VALUES (500, 1, 's1'), (501, NULL, NULL)")
    for name in (v2, v1):
        assert st.refresh_stream_table(name).action == "FULL"
        _check(spark, st, name, f"SELECT k, v FROM {src}", "after a FULL refresh")
    bad = unique_name("pq_bad")
    with session_conf(spark, {PARQUET_WRITER: "v3"}), pytest.raises(Exception, match="parquetWriterVersion"):
        st.create_stream_table(bad, f"SELECT k, v FROM {src}", refresh_mode="FULL")
    assert bad not in st.catalog.names()


def test_bag_tables_of_maps_arrays_and_structs_hold_the_query_rows(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """A MAP column can be neither grouped nor hashed by Spark (``xxhash64`` and GROUP BY refuse it), yet a
    plain-rows table hashes and nets its rows by every column. Maps are identified by their entries sorted by
    key, so equal maps written in another entry order are one tuple (and compare equal here: which of
    several equal copies a delete takes is free)."""
    src = make_source("pr_nested", "id INT, m MAP<STRING, INT>, a ARRAY<DOUBLE>, s STRUCT<p: INT, q: STRING>",
                      rows=None)
    spark.sql(f"INSERT INTO {src} VALUES (1, map('x', 1, 'y', 2), array(1.5D, NULL), named_struct('p', 1, 'q', 'a')), "
              f"(2, map('x', 1, 'y', 2), array(1.5D, NULL), named_struct('p', 1, 'q', 'a')), (3, NULL, NULL, NULL), "
              f"(4, map(), array(), named_struct('p', NULL, 'q', NULL))")
    name = unique_name("pr_maps")
    q = f"SELECT m, a, s FROM {src}"
    st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL")

    def value(v: Any) -> Any:  # a map as its entries sorted, so entry order does not tell equal maps apart
        if isinstance(v, dict):
            return ("map", tuple(sorted(((k, value(x)) for k, x in v.items()), key=repr)))
        return tuple(value(x) for x in v) if isinstance(v, list | tuple) else v

    def check(when: str) -> None:
        d = st.catalog.get(name)
        got = Counter(repr(value(r)) for r in spark.sql(f"SELECT m, a, s FROM delta.`{d.path}`").collect())
        want = Counter(repr(value(r)) for r in spark.sql(q).collect())
        assert got == want, f"{when}: stored {sorted(got.items())}, query {sorted(want.items())}"

    check("after the initial FULL refresh")
    steps = [
        ("a copy of an equal map in another entry order", f"INSERT INTO {src} VALUES (5, map('y', 2, 'x', 1), "
                                                          f"array(1.5D, NULL), named_struct('p', 1, 'q', 'a'))"),
        ("a delete of one copy", f"DELETE FROM {src} WHERE id = 1"),
        ("an array with its NULL moved", f"INSERT INTO {src} VALUES (7, map('x', 1, 'y', 2), array(NULL, 1.5D), "
                                         f"named_struct('p', 1, 'q', 'a'))"),
        ("every copy of the array before the move deleted", f"DELETE FROM {src} WHERE id IN (2, 5)"),
        ("an update into a map", f"UPDATE {src} SET m = map('z', NULL) WHERE id = 3"),
        ("NULLs out", f"UPDATE {src} SET m = NULL, a = NULL, s = NULL WHERE id = 4"),
    ]
    for when, statement in steps:
        spark.sql(statement)
        r = st.refresh_stream_table(name)
        assert r.action == "DIFFERENTIAL", (when, r.action, r.reason)
        check(f"after {when}")
    st.alter_stream_table(name, refresh_mode="FULL")
    spark.sql(f"INSERT INTO {src} VALUES (6, map('x', 1), array(double('NaN')), named_struct('p', 2, 'q', NULL))")
    assert st.refresh_stream_table(name).action == "FULL"
    check("after a FULL refresh")


def test_nested_identities_tell_nulls_apart_and_sort_maps(spark: Any) -> None:
    """``bits37+nested`` evaluated by Spark, hashed by ``row_hash`` as a one-column table hashes: values that
    Spark's own hash confuses (a NULL element moved, a NULL struct and a struct of NULLs, an empty and a NULL
    map, a NULL map value and no entry) get distinct hashes; a map's entries in another order, and floats
    inside summed in another order, get one."""
    from dvm.plan import _canonical, row_hash

    def h(v: str, ty: str) -> str:
        return row_hash([_canonical(f"CAST({v} AS {ty})", ty, "bits37+nested")])

    apart = [("array(1, NULL)", "array(NULL, 1)", "array<int>"), ("array()", "array(NULL)", "array<int>"),
             ("NULL", "named_struct('p', NULL, 'q', NULL)", "struct<p:int,q:string>"),
             ("named_struct('p', 1, 'q', NULL)", "named_struct('p', NULL, 'q', '1')", "struct<p:int,q:string>"),
             ("map()", "NULL", "map<string,int>"), ("map('a', NULL)", "map()", "map<string,int>"),
             ("map('a', 1)", "map('a', 2)", "map<string,int>"), ("array(map('a', 1))", "array(map('b', 1))",
                                                                  "array<map<string,int>>"),
             # keywords as field names: sqlglot's type parser read this type as a struct of `end` alone
             ("named_struct('end', 1, 'select', 1)", "named_struct('end', 1, 'select', 2)",
              "struct<end:int,select:int>")]
    same = [("map('a', 1, 'b', 2)", "map('b', 2, 'a', 1)", "map<string,int>"),
            ("array(0.1D + 0.2D, NULL)", "array(0.3D, NULL)", "array<double>"),
            ("map('k', array(map(2, 'x', 1, 'y')))", "map('k', array(map(1, 'y', 2, 'x')))",
             "map<string,array<map<int,string>>>")]
    checks = [f"{h(a, ty)} <> {h(b, ty)}" for a, b, ty in apart] + [f"{h(a, ty)} = {h(b, ty)}" for a, b, ty in same]
    got = spark.sql(f"SELECT {', '.join(checks)}").collect()[0]
    assert all(got), [c for c, ok in zip(checks, got, strict=True) if not ok]


def test_deleting_an_array_keeps_the_copies_of_its_nulls_moved(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """Copies to delete are picked by ``__row_hash`` alone. Spark's hash skips NULL elements, so under the
    ``bits37`` identity ``[1, NULL]`` and ``[NULL, 1]`` shared one, and deleting the one ``[1, NULL]`` among
    twenty ``[NULL, 1]`` removed a ``[NULL, 1]`` (measured before ``bits37+nested``: 21 and 1 left instead
    of 22 and 0). Four more rounds insert and delete ``[1, NULL]`` again, each a fresh pick."""
    src = make_source("la_src", "id INT, a ARRAY<INT>")
    spark.sql(f"INSERT INTO {src} VALUES (1, array(1, NULL)), (2, array(NULL, 1)), (3, array(NULL, 1))")
    name = unique_name("la")
    q = f"SELECT a FROM {src}"
    st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} SELECT 10 + id, array(NULL, 1) FROM range(20)")
    stmts = [f"DELETE FROM {src} WHERE id = 1"]
    for _ in range(4):
        stmts += [f"INSERT INTO {src} VALUES (4, array(1, NULL))", f"DELETE FROM {src} WHERE id = 4"]
    for s in stmts:
        spark.sql(s)
        r = st.refresh_stream_table(name)
        d = st.catalog.get(name)
        got = Counter(repr(row) for row in spark.sql(f"SELECT a FROM delta.`{d.path}`").collect())
        want = Counter(repr(row) for row in spark.sql(q).collect())
        assert r.action == "DIFFERENTIAL", (s, r.action, r.reason)
        assert got == want, f"after {s}: stored {got}, query {want}"
