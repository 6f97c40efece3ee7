"""Small source snapshots read by delta-rs on the driver (``pipeline.fixpoints._read_by_driver``) hold exactly
the rows and types Spark reads (rows marked in deletion vectors left out), or are left to Spark: CHAR padding,
larger tables, change windows whose change only deletion vectors tell."""

from __future__ import annotations

import os
import shutil
from typing import Any

from connectors.storage import local_path
from pipeline import fixpoints
from tests.conftest import local_engine_mode

_engine = local_engine_mode("off")  # this module tests Spark's own delta job

TYPES = ("i INT, b BIGINT, s SMALLINT, t TINYINT, f FLOAT, d DOUBLE, dec DECIMAL(12,3), str STRING, vc VARCHAR(5), "
         "bo BOOLEAN, dt DATE, ts TIMESTAMP, tsn TIMESTAMP_NTZ, bin BINARY, arr ARRAY<INT>, m MAP<STRING,INT>, "
         "st STRUCT<x: INT, y: STRING>, p STRING")
ROWS = ("(1, 2, 3, 4, 1.5, 2.5, 123.456, 'a', 'xyz', true, DATE'2024-02-29', TIMESTAMP'2024-03-10 02:30:00', "
        "TIMESTAMP_NTZ'2024-03-10 02:30:00', X'0102', array(1, NULL), map('k', 1), named_struct('x', 1, 'y', 'q'), "
        "'P1'), "
        "(NULL, NULL, NULL, NULL, CAST('NaN' AS FLOAT), CAST('-Infinity' AS DOUBLE), NULL, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
        "(-1, -9223372036854775808, -32768, -128, -0.0, 1e300, -999999999.999, 'ü€', '', false, DATE'0001-01-01', "
        "TIMESTAMP'1900-01-01 00:00:00', TIMESTAMP_NTZ'9999-12-31 23:59:59.999999', X'', array(), map(), "
        "named_struct('x', NULL, 'y', NULL), 'P2')")


def _path(spark: Any, table: str) -> str:
    return str(spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]["location"])


def _seed(path: str, version: int) -> str:
    return f"SELECT * FROM delta.`{path}` VERSION AS OF {version}"


def test_driver_read_has_spark_rows_and_types(spark: Any, unique_name: Any) -> None:
    name = unique_name("types")
    spark.sql(f"CREATE TABLE {name} ({TYPES}) USING delta PARTITIONED BY (p)")
    spark.sql(f"INSERT INTO {name} VALUES {ROWS}")
    spark.sql(f"DELETE FROM {name} WHERE i = 1")
    seed = _seed(_path(spark, name), 1)
    held, spark_read = fixpoints._read_by_driver(spark, seed), spark.sql(seed)
    assert held is not None, "a small plain table is read on the driver"
    assert held.schema == spark_read.schema
    assert sorted(map(str, held.collect())) == sorted(map(str, spark_read.collect()))
    after_delete = fixpoints._read_by_driver(spark, _seed(_path(spark, name), 2))
    assert after_delete is not None and after_delete.count() == 2


def test_what_delta_rs_might_read_differently_is_left_to_spark(spark: Any, unique_name: Any) -> None:
    padded = unique_name("padded")
    spark.sql(f"CREATE TABLE {padded} (c CHAR(3)) USING delta")
    spark.sql(f"INSERT INTO {padded} VALUES ('ab')")
    assert spark.sql(_seed(_path(spark, padded), 1)).collect()[0]["c"] == "ab "  # Spark pads on read
    assert fixpoints._read_by_driver(spark, _seed(_path(spark, padded), 1)) is None

    dv = unique_name("dv")
    spark.sql(f"CREATE TABLE {dv} (i INT) USING delta TBLPROPERTIES (delta.enableDeletionVectors = true)")
    spark.sql(f"INSERT INTO {dv} VALUES (1), (2), (3)")
    spark.sql(f"DELETE FROM {dv} WHERE i = 2")
    marked = fixpoints._read_by_driver(spark, _seed(_path(spark, dv), 2))  # read, the marked row left out
    assert marked is not None and sorted(r.i for r in marked.collect()) == [1, 3]

    big = unique_name("big")
    spark.sql(f"CREATE TABLE {big} (i BIGINT) USING delta")
    spark.sql(f"INSERT INTO {big} SELECT id FROM range(1000)")
    spark.conf.set(fixpoints.READ_BY_DRIVER_ROWS, "999")
    try:
        assert fixpoints._read_by_driver(spark, _seed(_path(spark, big), 1)) is None
    finally:
        spark.conf.unset(fixpoints.READ_BY_DRIVER_ROWS)
    assert fixpoints._read_by_driver(spark, _seed(_path(spark, big), 1)) is not None
    assert fixpoints._read_by_driver(spark, f"SELECT * FROM table_changes_by_path('{_path(spark, big)}', 1, 1)") is None


def test_a_snapshot_read_before_is_reused_until_its_table_is_recreated(spark: Any, unique_name: Any) -> None:
    """The driver reads a version once (its rows never change); a table dropped and re-created at the same
    path writes that version's commit anew, and its rows are read again, not served from before."""
    name = unique_name("again")
    spark.sql(f"CREATE TABLE {name} (id INT, v STRING) USING delta")
    spark.sql(f"INSERT INTO {name} VALUES (1, 'old'), (2, 'old')")
    path = _path(spark, name)
    seed = _seed(path, 1)
    first = fixpoints._read_by_driver(spark, seed)
    assert first is not None and fixpoints._read_by_driver(spark, seed) is first
    spark.sql(f"DROP TABLE {name}")
    spark.sql(f"CREATE TABLE {name} (id INT, v STRING) USING delta LOCATION '{path}'")
    spark.sql(f"INSERT INTO {name} VALUES (3, 'new')")  # version 1 again, other rows
    again = fixpoints._read_by_driver(spark, seed)
    assert again is not None and again is not first
    assert sorted(tuple(r) for r in again.collect()) == [(3, "new")] == sorted(
        tuple(r) for r in spark.sql(seed).collect())


def _changes_seed(path: str, first: int, last: int) -> str:
    from dvm.context import HELD_SEED, sql_string

    return f"{HELD_SEED}table_changes_by_path({sql_string(path)}, {first}, {last})"


def _spark_changes(spark: Any, path: str, first: int, last: int) -> Any:
    return spark.sql(f"SELECT * FROM table_changes_by_path('{path}', {first}, {last})")


def test_change_windows_read_on_the_driver_have_spark_rows_and_types(spark: Any, unique_name: Any) -> None:
    """Every window of a table changed by INSERT, MERGE (update, delete, insert), UPDATE, DELETE of rows, of a
    whole partition (file removes, no cdc file) and of everything reads as ``table_changes`` reads it."""
    name = unique_name("cdf_types")
    spark.sql(f"CREATE TABLE {name} ({TYPES}) USING delta PARTITIONED BY (p) "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {name} VALUES {ROWS}")
    spark.sql(f"MERGE INTO {name} t USING (SELECT 1 AS k UNION ALL SELECT -1 UNION ALL SELECT 7) s ON t.i = s.k "
              "WHEN MATCHED AND s.k = 1 THEN UPDATE SET str = 'merged', arr = array(7) "
              "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (i, p) VALUES (s.k, 'P3')")
    spark.sql(f"UPDATE {name} SET dec = dec + 1, m = map('u', 2) WHERE i = 1")
    spark.sql(f"INSERT INTO {name} (i, str, p) VALUES (8, 'same', 'P2'), (8, 'same', 'P2')")  # duplicate rows
    spark.sql(f"DELETE FROM {name} WHERE p = 'P2'")  # a whole partition: its files removed
    spark.sql(f"DELETE FROM {name}")
    path = _path(spark, name)
    last = 6
    for first in range(1, last + 1):
        for end in range(first, last + 1):
            held = fixpoints._changes_by_driver(spark, _changes_seed(path, first, end))
            # not _commit_timestamp: see fixpoints._CHANGE_COLUMNS
            expected = _spark_changes(spark, path, first, end).drop("_commit_timestamp")
            if held is None:
                # delta-rs 1.6.6 fails on the DELETE of everything in a partitioned table ("expected Utf8 but
                # found Null" for the partition column): Spark reads such a window
                assert end == last, f"window {first}..{end} of a small plain table is read on the driver"
                continue
            assert held.schema == expected.schema, (first, end)
            assert sorted(map(str, held.collect())) == sorted(map(str, expected.collect())), (first, end)


def test_change_windows_delta_rs_might_read_differently_are_left_to_spark(spark: Any, unique_name: Any) -> None:
    dv = unique_name("cdf_dv")
    spark.sql(f"CREATE TABLE {dv} (i INT) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true, delta.enableDeletionVectors = true)")
    spark.sql(f"INSERT INTO {dv} VALUES (1), (2), (3)")
    spark.sql(f"DELETE FROM {dv} WHERE i = 2")  # marks the row in a vector and writes no change-data file
    assert fixpoints._changes_by_driver(spark, _changes_seed(_path(spark, dv), 2, 2)) is None

    widened = unique_name("cdf_schema")
    spark.sql(f"CREATE TABLE {widened} (i INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {widened} VALUES (1)")
    spark.sql(f"ALTER TABLE {widened} ADD COLUMN j INT")
    spark.sql(f"INSERT INTO {widened} VALUES (2, 3)")
    path = _path(spark, widened)
    assert fixpoints._changes_by_driver(spark, _changes_seed(path, 1, 3)) is None, "the schema changed inside"
    assert fixpoints._changes_by_driver(spark, _changes_seed(path, 3, 3)) is not None

    many = unique_name("cdf_many")
    spark.sql(f"CREATE TABLE {many} (i BIGINT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {many} SELECT id FROM range(1000)")
    spark.conf.set(fixpoints.READ_BY_DRIVER_ROWS, "999")
    try:
        assert fixpoints._changes_by_driver(spark, _changes_seed(_path(spark, many), 1, 1)) is None
    finally:
        spark.conf.unset(fixpoints.READ_BY_DRIVER_ROWS)


def _merge(path: str, read_version: int, rows: list[tuple[int, str, bool]]) -> None:
    import pyarrow as pa

    from connectors import delta_rs

    changes = pa.table({"__row_id": pa.array([r[0] for r in rows], pa.int64()), "v": [r[1] for r in rows],
                        "__del": [r[2] for r in rows]})
    delta_rs.merge(path, changes, ["__row_id", "v"], True, {"refresh_id": f"r{read_version}"}, read_version,
                   read_version + 1, "test")


def test_commits_go_through_the_table_committed_before_only_while_it_is_that_table(spark: Any,
                                                                                  unique_name: Any) -> None:
    """delta-rs commits through the table object its previous commit left at the new version (no log replay),
    but opens the table again when anything else committed meanwhile, or when the path holds a table dropped
    and re-created since: the rows are always those of the table as it is."""
    from connectors import delta_rs

    name = unique_name("writer")
    create = (f"CREATE TABLE {name} (__row_id BIGINT, v STRING) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(create)
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b')")  # version 1
    path = _path(spark, name)

    def rows() -> list[tuple[int, str]]:
        return sorted(tuple(r) for r in spark.sql(f"SELECT * FROM delta.`{path}`").collect())

    def kept() -> Any:
        return delta_rs._WRITERS.get(os.path.abspath(local_path(path) or path), (None, None))[1]

    _merge(path, 1, [(1, "a2", False), (3, "c", False)])  # version 2
    first = kept()
    assert first is not None and first.version() == 2
    _merge(path, 2, [(2, "", True)])  # version 3, through the same object
    assert kept() is first and first.version() == 3
    assert rows() == [(1, "a2"), (3, "c")]
    spark.sql(f"INSERT INTO {name} VALUES (4, 'd')")  # version 4, by Spark
    _merge(path, 4, [(4, "d2", False)])  # version 5: opened again, sees Spark's row
    assert kept() is not first and rows() == [(1, "a2"), (3, "c"), (4, "d2")]
    second = kept()
    spark.sql(f"DROP TABLE {name}")
    shutil.rmtree(local_path(path) or path, ignore_errors=True)  # a managed table leaves nothing
    spark.sql(create.replace("USING delta", f"USING delta LOCATION '{path}'"))
    for i in range(5):  # versions 1-5 again, other rows
        spark.sql(f"INSERT INTO {name} VALUES ({10 + i}, 'n')")
    _merge(path, 5, [(10, "n2", False)])
    assert kept() is not second
    assert rows() == [(10, "n2"), (11, "n"), (12, "n"), (13, "n"), (14, "n")]
    changes = spark.sql(f"SELECT _change_type FROM table_changes_by_path('{path}', 6, 6)").collect()
    assert sorted(r[0] for r in changes) == ["update_postimage", "update_preimage"]


def test_the_protocol_of_a_table_delta_rs_kept_committing_to_is_found_in_its_checkpoint(spark: Any,
                                                                                        unique_name: Any) -> None:
    """delta-rs writes no checksum file: 60 commits after Spark's last one, a process that never read the
    table before finds its protocol in the checkpoint delta-rs wrote (it used to be 'unknown' after 50,
    which sent the commit to Spark's MERGE)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from connectors import delta_log

    name = unique_name("proto")
    spark.sql(f"CREATE TABLE {name} (i INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true, "
              "delta.checkpointInterval = 10)")
    path = _path(spark, name)
    local = local_path(path) or path
    for i in range(60):
        write_deltalake(local, pa.table({"i": pa.array([i], pa.int32())}), mode="append")
    log = delta_log.DeltaLog(spark, path)
    latest = log.latest_version()
    assert latest == 60 and any(n.endswith(".checkpoint.parquet") for n in os.listdir(f"{local}/_delta_log"))
    delta_log._PROTOCOL_SEEN.pop(log.path, None)  # as a new process would
    found = log.protocol(latest)
    detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
    assert found is not None
    assert (found["minReaderVersion"], found["minWriterVersion"]) == (detail["minReaderVersion"],
                                                                      detail["minWriterVersion"])
