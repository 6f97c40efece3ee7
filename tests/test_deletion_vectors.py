"""Deletion vectors written by spark-trickle (connectors/deletion_vectors.py): the formats against Spark's own,
and the commit's guarantees (one commit per refresh, a lost race retried, Spark reading rows and change feed).

The oracle over random changes runs in test_apply_strategies (variant ``vectors``) and test_plain_rows
(``marked``: every reader, and a downstream stream table over the change feed)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from connectors import deletion_vectors as dv
from connectors.delta_log import DeltaLog
from pipeline import strategy


def rows(df: Any) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def test_vectors_and_names_round_trip() -> None:
    positions = np.array([0, 5, 5, 70_000, 2**32 + 3, 2**33], dtype=np.int64)
    assert dv.decode(dv.encode(positions)).tolist() == sorted(set(positions.tolist()))
    assert dv.decode(dv.encode(np.arange(0, 100_000, 2))).tolist() == list(range(0, 100_000, 2))
    data = bytes(range(16))
    assert dv.unz85(dv.z85(data)) == data and len(dv.z85(data)) == 20
    with pytest.raises(ValueError, match="not a deletion vector"):
        dv.decode(b"\x00" * 12)
    assert dv.decode(dv.encode(np.empty(0, np.int64))).tolist() == []


def test_marking_more_positions_unites_them_with_the_old_vector(tmp_path: Any) -> None:
    """A refresh marks its positions into a file's vector without decoding it to an array: the union holds the
    old and the new positions once each, over both 32-bit halves, and the membership test answers per
    position, for vectors inline and in a file."""
    rng = np.random.default_rng(7)
    old = np.unique(np.concatenate([rng.integers(0, 3_000_000, 200_000), [2**32 + 1, 2**32 + 9]]))
    fresh = np.concatenate([rng.integers(0, 3_000_000, 5_000), old[:100], [2**32 + 9, 2**33]])
    data, count = dv.with_marked(dv.encode(old), fresh)
    want = sorted(set(old.tolist()) | set(fresh.tolist()))
    assert dv.decode(data).tolist() == want and count == len(want)
    assert dv.decode(dv.with_marked(None, fresh)[0]).tolist() == sorted(set(fresh.tolist()))

    asked = np.concatenate([old[::1000], rng.integers(0, 2**33, 2_000), [2**32 + 1, 2**32 + 2]])
    name, (offset,) = dv._write_vectors(str(tmp_path), [data])
    in_file = {"storageType": "u", "pathOrInlineDv": name, "offset": offset, "sizeInBytes": len(data),
               "cardinality": count}
    small = dv.encode(np.array([3, 2**32 + 1]))
    inline = {"storageType": "i", "pathOrInlineDv": dv.z85(small + b"\x00" * (-len(small) % 4)),
              "sizeInBytes": len(small), "cardinality": 2}
    marked = set(want)
    assert dv.marked_among(str(tmp_path), in_file, asked).tolist() == [int(p) in marked for p in asked]
    assert dv.marked_among(str(tmp_path), inline, asked).tolist() == [int(p) in {3, 2**32 + 1} for p in asked]


def test_spark_written_vectors_are_read_as_spark_deleted(spark: Any, tmp_path: Any) -> None:
    """A vector Spark's DELETE wrote (Z85 file name, offsets, CRC, Roaring bytes) names exactly the deleted
    rows' positions, and the live-file replay finds the file's descriptor."""
    path = str(tmp_path / "t")
    (spark.range(0, 600).selectExpr("id", "CAST(id * 2 AS STRING) AS s").repartition(2).write.format("delta")
     .option("delta.enableDeletionVectors", "true").save(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0")
    log = DeltaLog(spark, path)
    files = dv.live_files(log, 1)
    assert len(files) == 2 and all(a.get("deletionVector") for a in files.values())
    for rel, add in files.items():
        ids = pq.read_table(os.path.join(path, rel), columns=["id"])["id"].to_numpy()
        assert dv.read_vector(path, add["deletionVector"]).tolist() == np.flatnonzero(ids % 7 == 0).tolist()


def test_a_commit_that_loses_its_version_is_retried_and_applied_once(
        spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """Another writer commits the version this refresh's commit wanted (put-if-absent refuses the commit
    file): the refresh starts again from the winner's frontier, and the change is applied once."""
    from pipeline import StreamTables

    spark.conf.set(strategy.VECTORS_ABOVE_ROWS, "0")
    try:
        src = make_source("dv_src", "id INT, k STRING", rows=[(i, f"k{i % 3}") for i in range(30)])
        name = unique_name("dv_bag")
        query = f"SELECT k FROM {src} WHERE id > 2"
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        spark.sql(f"DELETE FROM {src} WHERE id < 10")
        assert st.refresh_stream_table(name).apply.startswith("MERGE (vectors)")
        other = StreamTables(spark, root=str(st.catalog.root))
        spark.sql(f"UPDATE {src} SET k = 'moved' WHERE id % 4 = 0")
        raced: list[str] = []

        def other_wins_once(table: str) -> None:
            if not raced:
                raced.append(other.refresh_stream_table(table).apply or "")

        hook, st.refresher.before_commit = st.refresher.before_commit, other_wins_once
        try:
            r = st.refresh_stream_table(name)
        finally:
            st.refresher.before_commit = hook
        assert raced and raced[0].startswith("MERGE (vectors)") and r.action == "NO_DATA", (raced, r)
        assert rows(st.read(name)) == rows(spark.sql(query))
        path = st.catalog.get(name).path
        log = DeltaLog(spark, path)
        first = next(v for v in range(log.latest_version() + 1) if log.trickle_metadata(v) is not None)
        changes = spark.sql(f"SELECT _change_type, k FROM table_changes_by_path('{path}', {first + 1})").collect()
        feed = Counter((r._change_type, r.k) for r in changes)
        gone = [f"k{i % 3}" for i in range(3, 10)] + [f"k{i % 3}" for i in range(12, 30, 4)]
        assert feed == Counter([("delete", k) for k in gone] + [("insert", "moved")] * 5), feed
        log = DeltaLog(spark, path)
        latest = log.latest_version()
        info = log.commit_info(latest)
        assert info["engineInfo"].startswith("spark-trickle") and json.loads(info["userMetadata"])["trickle"]
        assert not [f for f in os.listdir(os.path.join(path, "_delta_log")) if f.endswith(".tmp")]

        # Spark's MERGE (a delta too large to collect) marks rows too, listing each touched file's add before
        # its remove; the next marked commit must still find the rows in those files
        spark.conf.set(strategy.COLLECT_BELOW, "-1")
        try:
            spark.sql(f"DELETE FROM {src} WHERE id IN (11, 13)")
            assert st.refresh_stream_table(name).apply.startswith("SPARK_MERGE")
        finally:
            spark.conf.unset(strategy.COLLECT_BELOW)
        spark_commit = DeltaLog(spark, path)
        actions = spark_commit.actions(spark_commit.latest_version())
        assert str(spark_commit.commit_info(spark_commit.latest_version()).get("engineInfo")).startswith("Apache-Spark")
        assert any((a.get("add") or {}).get("deletionVector") for a in actions), "Spark's MERGE wrote no vector"
        spark.sql(f"DELETE FROM {src} WHERE id > 12")
        assert st.refresh_stream_table(name).apply.startswith("MERGE (vectors)")
        assert rows(st.read(name)) == rows(spark.sql(query))
    finally:
        spark.conf.unset(strategy.VECTORS_ABOVE_ROWS)


def test_housekeeping_purges_a_table_whose_vectors_mark_many_rows(
        spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """Marked rows are skipped by readers but still stored: past ``purgeDeletedShare`` housekeeping rewrites
    the marked files without them, and the table still answers its query (and refreshes on)."""
    from pipeline import housekeeping

    spark.conf.set(strategy.VECTORS_ABOVE_ROWS, "0")
    try:
        src = make_source("dvp_src", "id INT, v INT", rows=[(i, i % 5) for i in range(40)])
        name, query = unique_name("dvp"), f"SELECT v FROM {src}"
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        path = st.catalog.get(name).path
        spark.sql(f"DELETE FROM {src} WHERE id < 5")
        assert st.refresh_stream_table(name).apply.startswith("MERGE (vectors)")
        settings = housekeeping.Settings(compact_min_files=10**6)
        report = housekeeping.maintain_table(spark, path, None, None, settings)
        assert report.purged_rows is None, "5 of 40 rows marked: below the share"
        spark.sql(f"DELETE FROM {src} WHERE id < 20")
        assert st.refresh_stream_table(name).apply.startswith("MERGE (vectors)")
        report = housekeeping.maintain_table(spark, path, None, None, settings)
        assert report.purged_rows == 20 and not report.skipped, report
        log = DeltaLog(spark, path)
        assert not [a for a in dv.live_files(log, log.latest_version()).values() if a.get("deletionVector")]
        assert rows(st.read(name)) == rows(spark.sql(query))
        spark.sql(f"UPDATE {src} SET v = 9 WHERE id > 35")
        assert st.refresh_stream_table(name).action == "DIFFERENTIAL"
        assert rows(st.read(name)) == rows(spark.sql(query))
    finally:
        spark.conf.unset(strategy.VECTORS_ABOVE_ROWS)


def test_a_crash_after_the_marked_commit_is_recovered_not_applied_twice(
        spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """A failure after the vectors' commit and before the catalog update: the commit holds the frontier, so
    the next refresh recovers (NO_DATA) instead of marking the same rows again."""
    spark.conf.set(strategy.VECTORS_ABOVE_ROWS, "0")
    try:
        src = make_source("dvc_src", "id INT, v INT", rows=[(i, i % 3) for i in range(12)])
        name, query = unique_name("dvc"), f"SELECT v FROM {src}"
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        spark.sql(f"DELETE FROM {src} WHERE id < 4")
        spark.sql(f"INSERT INTO {src} VALUES (20, 1), (21, 1)")

        def boom(table: str) -> None:
            raise RuntimeError("injected crash after commit")

        st.refresher.after_commit = boom
        with pytest.raises(RuntimeError, match="injected"):
            st.refresh_stream_table(name)
        st.refresher.after_commit = lambda table: None
        assert rows(st.read(name)) == rows(spark.sql(query))
        r = st.refresh_stream_table(name)
        assert r.action == "NO_DATA" and r.recovered, r
        assert rows(st.read(name)) == rows(spark.sql(query))
        spark.sql(f"DELETE FROM {src} WHERE v = 1")
        assert st.refresh_stream_table(name).apply.startswith("MERGE (vectors)")
        assert rows(st.read(name)) == rows(spark.sql(query))
    finally:
        spark.conf.unset(strategy.VECTORS_ABOVE_ROWS)
