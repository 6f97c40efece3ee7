"""A change window read straight from its commits' files (connectors/change_files.py) holds exactly the rows of
Spark's ``table_changes`` for it, duplicates and NULLs included, and anything but the plain case is left to
delta-rs (None)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from connectors import change_files
from connectors.delta_log import DeltaLog


def _bag(rows: Any) -> Counter:
    return Counter(tuple(r) for r in rows)


def _table_path(spark: Any, name: str) -> str:
    return spark.sql(f"DESCRIBE DETAIL {name}").collect()[0].location


def test_windows_read_from_their_files_equal_spark_change_feed(spark: Any, make_source: Any) -> None:
    src = make_source("cf_src", "id INT, k STRING, v DOUBLE",
                      rows=[(i, f"k{i % 3}", float(i)) for i in range(20)])  # v1
    spark.sql(f"MERGE INTO {src} t USING (SELECT id, id * 2.0 AS v FROM range(15, 25)) s ON t.id = s.id "
              "WHEN MATCHED AND s.id % 2 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET v = s.v "
              "WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (s.id, NULL, s.v)")  # v2: cdc files
    spark.sql(f"UPDATE {src} SET k = 'moved' WHERE id < 4")  # v3
    spark.sql(f"INSERT INTO {src} VALUES (1, 'k1', 1.0), (1, 'k1', 1.0), (NULL, NULL, NULL)")  # v4: duplicates
    spark.sql(f"DELETE FROM {src} WHERE id = 7")  # v5
    path = _table_path(spark, src)
    latest = DeltaLog(spark, path).latest_version()
    assert latest == 5

    def feed(first: int, last: int) -> Counter:
        return _bag(spark.sql(f"SELECT id, k, v, _change_type, CAST(_commit_version AS BIGINT) FROM "
                              f"table_changes_by_path('{path}', {first}, {last})").collect())

    read_here = 0
    for first, last in [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (1, 5), (2, 4), (3, 5)]:
        got = change_files.read(path, first, last)
        if got is None:  # not the plain case (e.g. a DELETE marked in deletion vectors): delta-rs reads it
            continue
        read_here += 1
        assert got.column_names == ["id", "k", "v", "_change_type", "_commit_version"]
        assert _bag(zip(*[got.column(c).to_pylist() for c in got.column_names], strict=True)) == feed(first, last), \
            (first, last)
    assert change_files.read(path, 2, 2) is not None and change_files.read(path, 4, 4) is not None
    assert read_here >= 4, read_here


def test_windows_beyond_the_plain_case_are_left_to_delta_rs(spark: Any, make_source: Any, unique_name: Any) -> None:
    parted = unique_name("cf_parted")
    spark.sql(f"CREATE TABLE {parted} (id INT, p STRING) USING delta PARTITIONED BY (p) "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {parted} VALUES (1, 'a')")
    assert change_files.read(_table_path(spark, parted), 1, 1) is None
    mapped = unique_name("cf_mapped")
    spark.sql(f"CREATE TABLE {mapped} (id INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true, "
              "delta.columnMapping.mode = 'name', delta.minReaderVersion = 2, delta.minWriterVersion = 5)")
    spark.sql(f"INSERT INTO {mapped} VALUES (1)")
    assert change_files.read(_table_path(spark, mapped), 1, 1) is None
    altered = make_source("cf_altered", "id INT", rows=[(1,)])  # v1
    spark.sql(f"ALTER TABLE {altered} ADD COLUMN x INT")  # v2: a metaData action
    spark.sql(f"INSERT INTO {altered} VALUES (2, 3)")  # v3
    path = _table_path(spark, altered)
    assert change_files.read(path, 2, 3) is None and change_files.read(path, 1, 3) is None
    assert change_files.read(path, 3, 3) is not None
    assert change_files.read(path, 0, 1) is None  # from version 0: the caller's rule, kept here too


def test_a_window_of_larger_files_is_left_to_delta_rs(spark: Any, make_source: Any, monkeypatch: Any) -> None:
    src = make_source("cf_large", "id INT, s STRING", rows=[(1, "a")])  # v1
    spark.sql(f"INSERT INTO {src} VALUES (2, 'b')")  # v2
    path = _table_path(spark, src)
    files = [a["add"] for a in DeltaLog(spark, path).actions(2) if "add" in a]
    size = sum(f["size"] for f in files)
    monkeypatch.setattr(change_files, "SMALL_BYTES", size)
    assert change_files.read(path, 2, 2) is not None  # at the bound: read here
    monkeypatch.setattr(change_files, "SMALL_BYTES", size - 1)
    assert change_files.read(path, 2, 2) is None  # above it: delta-rs'
    assert change_files.read(path, 1, 2) is None
