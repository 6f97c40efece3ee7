"""A table delta-rs moved forward from an older cached version (``connectors.delta_rs._forward``) against the
same version opened from scratch.

* a Spark-written table with Change Data Feed and deletion vectors, through inserts, MERGE (updates, deletes,
  inserts), DELETE marking rows in vectors, OPTIMIZE (files removed and added), a schema change and log
  checkpoints every three commits: at every version the moved table is the very object cached one version
  before (so the forward path ran), and its files, their row counts and deletion vectors, its schema,
  configuration and protocol, its marked rows and its change feed equal a fresh open's;
* a table some reader holds is never moved: the reader keeps its version;
* a table dropped and re-created under the same path: the cached table of the old one is not moved onto the
  new log.
"""

from __future__ import annotations

import shutil
from collections import Counter
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from connectors import delta_rs, vector_reads


def _adds(table: Any) -> list[tuple[Any, ...]]:
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return sorted((a["path"], a["size_bytes"], a.get("num_records"), a.get("deletionVector.pathOrInlineDv"))
                  for a in adds)


def _same(moved: Any, fresh: Any, version: int) -> None:
    assert moved.version() == fresh.version() == version
    assert _adds(moved) == _adds(fresh), version
    assert moved.schema().to_json() == fresh.schema().to_json(), version
    assert moved.metadata().configuration == fresh.metadata().configuration, version
    p, q = moved.protocol(), fresh.protocol()
    assert (p.min_reader_version, p.min_writer_version, p.reader_features, p.writer_features) == \
        (q.min_reader_version, q.min_writer_version, q.reader_features, q.writer_features), version
    assert {k: v.tolist() for k, v in vector_reads.deleted_positions(moved).items()} == \
        {k: v.tolist() for k, v in vector_reads.deleted_positions(fresh).items()}, version
    if version > 0:
        feed = [pa.table(t.load_cdf(starting_version=version, ending_version=version)) for t in (moved, fresh)]
        cols = [c for c in feed[0].column_names if c != "_commit_timestamp"]
        assert Counter(zip(*(feed[0].column(c).to_pylist() for c in cols), strict=True)) == \
            Counter(zip(*(feed[1].column(c).to_pylist() for c in cols), strict=True)), version


def test_moved_forward_equals_fresh(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, s STRING) USING delta TBLPROPERTIES ("
              "'delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true', "
              "'delta.checkpointInterval' = '3')")
    steps = [
        f"INSERT INTO delta.`{path}` SELECT id, CAST(id % 7 AS STRING) FROM range(0, 200)",
        f"INSERT INTO delta.`{path}` VALUES (1000, NULL), (1001, 'x')",
        f"MERGE INTO delta.`{path}` t USING (SELECT id, CAST(id AS STRING) AS s, id % 3 = 0 AS gone FROM range(0, 60)) "
        "c ON t.id = c.id WHEN MATCHED AND c.gone THEN DELETE WHEN MATCHED THEN UPDATE SET s = c.s",
        f"DELETE FROM delta.`{path}` WHERE id BETWEEN 100 AND 120",
        f"UPDATE delta.`{path}` SET s = 'u' WHERE id % 11 = 0",
        f"INSERT INTO delta.`{path}` SELECT id, 'late' FROM range(2000, 2050)",
        f"OPTIMIZE delta.`{path}`",
        f"DELETE FROM delta.`{path}` WHERE s = 'late' AND id % 2 = 0",
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (n INT)",
        f"INSERT INTO delta.`{path}` VALUES (3000, 'n', 7)",
    ]
    previous = delta_rs.opened(path, 0)
    _same(previous, DeltaTable(path, version=0), 0)
    for version, step in enumerate(steps, start=1):
        spark.sql(step)
        previous_id = id(previous)
        del previous  # no reader holds it now: the next open moves it
        previous = delta_rs.opened(path, version)
        assert id(previous) == previous_id, f"version {version} was opened from scratch"
        _same(previous, DeltaTable(path, version=version), version)


def test_held_table_keeps_its_version(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1)")
    held = delta_rs.opened(path, 1)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (2)")
    later = delta_rs.opened(path, 2)
    assert later is not held and held.version() == 1 and later.version() == 2
    assert sorted(held.to_pyarrow_table().column("id").to_pylist()) == [1]
    assert delta_rs.opened(path, 1) is held  # still the cached table of version 1


def test_recreated_table_is_not_moved_onto(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1)")
    old = delta_rs.opened(path, 1)
    old_id = id(old)
    del old
    shutil.rmtree(path)
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (5)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (6)")
    table = delta_rs.opened(path, 2)
    assert id(table) != old_id
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [5, 6]
