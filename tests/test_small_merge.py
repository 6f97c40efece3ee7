"""spark-trickle's own MERGE of a small table (connectors/small_merge.py): an aggregate's groups created,
updated and removed over random changes stay equal to the query, the change feed Spark reads from the
commits carries each group's pre- and post-image, and a stream table downstream of it, reading that feed,
stays equal to its query too."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from connectors import log_checkpoints
from connectors.delta_log import DeltaLog


def rows(df: Any) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def test_own_merge_keeps_an_aggregate_and_its_change_feed(spark: Any, st: Any, make_source: Any,
                                                        unique_name: Any) -> None:
    rng = random.Random(16)
    src = make_source("sm_src", "id INT, k STRING, v INT",
                      rows=[(i, rng.choice(["a", "b", None]), rng.randint(-5, 9)) for i in range(40)])
    agg, top = unique_name("sm_agg"), unique_name("sm_top")
    agg_query = f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {src} GROUP BY k"
    st.create_stream_table(agg, agg_query, refresh_mode="DIFFERENTIAL")
    top_query = f"SELECT k, total FROM {agg} WHERE n > 1"
    st.create_stream_table(top, top_query, refresh_mode="DIFFERENTIAL")
    path = st.catalog.get(agg).path
    applied, next_id = Counter(), 40
    for cycle in range(5):
        keys = ["a", "b", "c", f"new{cycle}", None]
        spark.sql(f"UPDATE {src} SET v = v + 1, k = {_lit(rng.choice(keys))} WHERE id % 7 = {cycle}")
        spark.sql(f"DELETE FROM {src} WHERE id % 11 = {cycle}")
        inserted = [(next_id + i, rng.choice(keys), rng.choice([None, 1, 2])) for i in range(3)]
        next_id += 3
        spark.sql(f"INSERT INTO {src} VALUES " + ", ".join(f"({i}, {_lit(k)}, {_lit(v)})" for i, k, v in inserted))
        before = rows(spark.read.format("delta").load(path).select("k", "total", "n"))
        result = st.refresh_stream_table(agg)
        applied[(result.apply or "").split(":")[0]] += 1
        assert rows(st.read(agg)) == rows(spark.sql(agg_query)), f"cycle {cycle}"
        st.refresh_stream_table(top)
        assert rows(st.read(top)) == rows(spark.sql(top_query)), f"cycle {cycle}"
        # the commit's change feed turns the table before into the table after, as Spark reads it
        version = DeltaLog(spark, path).latest_version()
        feed = spark.sql(f"SELECT k, total, n, _change_type FROM table_changes_by_path('{path}', {version}, "
                         f"{version})").collect()
        after = Counter(before)
        for r in feed:
            sign = 1 if r._change_type in ("insert", "update_postimage") else -1
            after[(r.k, r.total, r.n)] += sign
        assert +after == rows(st.read(agg).select("k", "total", "n")), f"cycle {cycle}: {feed}"
        assert {r._change_type for r in feed} <= {"insert", "delete", "update_preimage", "update_postimage"}
    assert applied["MERGE (own)"] >= 3, applied
    info = DeltaLog(spark, path).commit_info(DeltaLog(spark, path).latest_version())
    assert str(info.get("engineInfo")).startswith("spark-trickle")


def _lit(value: Any) -> str:
    return "NULL" if value is None else f"'{value}'" if isinstance(value, str) else str(value)


def test_own_merge_survives_a_crash_after_its_commit_and_a_lost_race(spark: Any, st: Any, make_source: Any,
                                                                   unique_name: Any) -> None:
    """A failure after the own commit and before the catalog update is recovered (NO_DATA, the commit holds
    the frontier), not applied twice; a commit whose version another refresh took first is retried from the
    winner's frontier and applied once."""
    from pipeline import StreamTables

    src = make_source("smc_src", "id INT, k STRING, v INT", rows=[(i, f"k{i % 3}", i) for i in range(12)])
    name, query = unique_name("smc"), f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {src} GROUP BY k"
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"UPDATE {src} SET v = v + 10 WHERE id < 4")

    def boom(table: str) -> None:
        raise RuntimeError("injected crash after commit")

    st.refresher.after_commit = boom
    try:
        with pytest.raises(RuntimeError, match="injected"):
            st.refresh_stream_table(name)
    finally:
        st.refresher.after_commit = lambda table: None
    assert rows(st.read(name)) == rows(spark.sql(query))
    r = st.refresh_stream_table(name)
    assert r.action == "NO_DATA" and r.recovered, r
    assert rows(st.read(name)) == rows(spark.sql(query))

    other = StreamTables(spark, root=str(st.catalog.root))
    spark.sql(f"DELETE FROM {src} WHERE k = 'k1'")
    raced: list[str] = []

    def other_wins_once(table: str) -> None:
        if not raced:
            raced.append(other.refresh_stream_table(table).apply or "")

    hook, st.refresher.before_commit = st.refresher.before_commit, other_wins_once
    try:
        r = st.refresh_stream_table(name)
    finally:
        st.refresher.before_commit = hook
    assert raced and raced[0].startswith("MERGE (own)") and r.action == "NO_DATA", (raced, r)
    assert rows(st.read(name)) == rows(spark.sql(query))


def test_the_rows_kept_of_a_written_file_are_the_files_rows(tmp_path: Any, monkeypatch: Any) -> None:
    """A small table's MERGE reads the files it touches from what this process wrote instead of the disk
    (own_commit.written_rows): those must be exactly what a read of the file returns, types included, and
    the oldest files are forgotten beyond the bytes kept, and so is a file a commit removed."""
    import datetime
    import decimal
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from connectors import own_commit

    table = pa.table({"__row_id": pa.array([3, -1, 7], pa.int64()), "k": ["a", None, "é"],
                      "d": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-2.25")], pa.decimal128(10, 2)),
                      "day": pa.array([datetime.date(2026, 1, 2), None, datetime.date(1999, 12, 31)]),
                      "x": pa.array([0.1, float("nan"), None], pa.float64())})
    root = str(tmp_path)
    monkeypatch.setattr(own_commit, "WRITTEN_BYTES_KEPT", 2 * table.nbytes + table.nbytes // 2)
    paths = [os.path.join(root, own_commit.add_action(root, table, own_commit.now_ms())[1]) for _ in range(3)]
    assert own_commit.written_rows(paths[0]) is None  # three tables' bytes > the bound: the oldest went
    for p in paths[1:]:
        kept = own_commit.written_rows(os.path.join(os.path.dirname(p), ".", os.path.basename(p)))
        read = pq.read_table(p)
        assert kept is not None and kept.schema.equals(read.schema), (kept.schema, read.schema)
        assert repr(kept.to_pylist()) == repr(read.to_pylist()), (kept, read)  # NaN != NaN for equals()
    assert own_commit.written_rows(os.path.join(root, "part-00000-elsewhere.c000.snappy.parquet")) is None
    own_commit.forget_written(paths[1:2])  # a file a commit removed
    assert own_commit.written_rows(paths[1]) is None and own_commit.written_rows(paths[2]) is not None
    assert own_commit._written_bytes == sum(size for _, size in own_commit._WRITTEN.values())  # noqa: SLF001


@pytest.mark.parametrize(("created_by", "merged_by"), [("this release", "own"), ("an older release", "own"),
                                                      ("an older release", "delta-rs")])
def test_a_group_removed_from_a_table_created_before_its_first_refresh(
        spark: Any, st: Any, make_source: Any, unique_name: Any, monkeypatch: Any, created_by: str,
        merged_by: str) -> None:
    """A stream table created empty (``initialize=False``, or a run killed between the CREATE and the first
    overwrite) and filled by delta-rs / the own commit keeps the schema of its CREATE. Older releases created
    it with the query's NOT NULL columns (``COUNT(*)``); a removed group's change row, NULL in every stored
    column, then failed every refresh ("Casting field 'n' with null values to non-nullable", seen in the crash
    test). Now the CREATE makes every column nullable, as Spark's writes do, and the own MERGE checks only the
    rows it writes against NOT NULL."""
    from connectors import delta_sink
    from pipeline import strategy

    if created_by == "an older release":
        monkeypatch.setattr(delta_sink, "nullable", lambda schema: schema)
    if merged_by == "delta-rs":
        spark.conf.set(strategy.OWN_MERGE_ROWS, "0")
    try:
        _remove_a_group(spark, st, make_source, unique_name, created_by, merged_by)
    finally:
        spark.conf.unset(strategy.OWN_MERGE_ROWS)


def _remove_a_group(spark: Any, st: Any, make_source: Any, unique_name: Any, created_by: str, merged_by: str) -> None:
    src = make_source("smn_src", "id INT, k STRING, v INT", rows=[(i, f"k{i % 3}", i) for i in range(9)])
    name, query = unique_name("smn"), f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {src} GROUP BY k"
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL", initialize=False)
    path = st.catalog.get(name).path
    created = json.loads(DeltaLog(spark, path).metadata(0).schema_json)
    not_null = {f["name"] for f in created["fields"] if not f["nullable"]}
    assert (not not_null) if created_by == "this release" else {"n", "__row_id"} <= not_null, not_null
    st.refresh_stream_table(name)
    assert rows(st.read(name)) == rows(spark.sql(query))
    for change in (f"DELETE FROM {src} WHERE k = 'k1'", f"UPDATE {src} SET k = 'k9' WHERE k = 'k2'",
                   f"INSERT INTO {src} VALUES (20, 'k1', 5)"):
        spark.sql(change)
        r = st.refresh_stream_table(name)
        assert r.action == "DIFFERENTIAL" and (r.apply or "").startswith(f"MERGE ({merged_by})"), (change, r)
        assert rows(st.read(name)) == rows(spark.sql(query)), change


def test_own_commits_checkpoint_the_log_every_interval(spark: Any, st: Any, make_source: Any,
                                                       unique_name: Any) -> None:
    """spark-trickle's own commits write a log checkpoint every ``delta.checkpointInterval`` (10) versions, as
    Spark's commits do. Without one, every reader replays the stream table's log from its first commit: a
    refresh opening the table (its held target) took 10-15 ms after 40 own commits, growing with each. The
    checkpoint must read back as the table: Spark and delta-rs see the query's rows, and the next refresh
    still applies its delta on the own path."""
    import os

    from deltalake import DeltaTable

    src = make_source("smk_src", "id INT, k STRING, v INT", rows=[(i, f"k{i % 4}", i) for i in range(12)])
    name, query = unique_name("smk"), f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {src} GROUP BY k"
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    path = st.catalog.get(name).path
    log = os.path.join(path, "_delta_log")
    cycle = 0
    while DeltaLog(spark, path).latest_version() < 12:
        cycle += 1
        assert cycle <= 15, "the stream table did not reach version 12"
        spark.sql(f"UPDATE {src} SET v = v + 1 WHERE id % 3 = {cycle % 3}")
        r = st.refresh_stream_table(name)
        assert (r.apply or "").startswith("MERGE (own)"), r
    log_checkpoints.settle(path)  # written in the background, off the refresh's path
    assert os.path.exists(os.path.join(log, f"{10:020d}.checkpoint.parquet")), sorted(os.listdir(log))
    assert json.loads(open(os.path.join(log, "_last_checkpoint")).read())["version"] == 10
    assert rows(spark.read.format("delta").load(path).select("k", "total", "n")) == rows(spark.sql(query))
    by_rs = DeltaTable(path).to_pyarrow_table(columns=["k", "total", "n"]).to_pylist()
    assert Counter(tuple(r.values()) for r in by_rs) == rows(spark.sql(query))
    spark.sql(f"DELETE FROM {src} WHERE k = 'k1'")
    r = st.refresh_stream_table(name)
    assert (r.apply or "").startswith("MERGE (own)"), r
    assert rows(st.read(name)) == rows(spark.sql(query))


def test_a_checkpoint_is_due_every_interval_as_for_spark() -> None:
    from connectors import delta_rs

    assert [v for v in range(31) if delta_rs.checkpoint_due(v, {})] == [10, 20, 30]
    assert [v for v in range(13) if delta_rs.checkpoint_due(v, {"delta.checkpointInterval": "4"})] == [4, 8, 12]
    assert not delta_rs.checkpoint_due(10, {"delta.checkpointInterval": "0"})
    assert delta_rs.checkpoint_due(10, {"delta.checkpointInterval": "ten"})  # unreadable: Spark's default


def test_file_statistics_bound_every_integer_and_date_column() -> None:
    """The ``add`` action's statistics (Delta's data skipping reads them): rows, null counts, and exact
    bounds of integer and date columns, over several chunks, with NULLs, all NULL, and empty."""
    import datetime

    import pyarrow as pa

    from connectors.own_commit import file_stats

    ints = pa.chunked_array([pa.array([5, -3], pa.int64()), pa.array([1 << 40], pa.int64())])
    small = pa.chunked_array([pa.array([7, None, -2], pa.int32())])
    days = pa.chunked_array([pa.array([datetime.date(2001, 5, 1), None, datetime.date(1999, 1, 2)])])
    table = pa.Table.from_arrays([ints, small, days], names=["l", "i", "d"])
    doc = json.loads(file_stats(table))
    assert doc == {"numRecords": 3, "nullCount": {"l": 0, "i": 1, "d": 1},
                   "minValues": {"l": -3, "i": -2, "d": "1999-01-02"},
                   "maxValues": {"l": 1 << 40, "i": 7, "d": "2001-05-01"}}
    nulls = pa.table({"l": pa.array([None, None], pa.int64()), "s": pa.array(["a", None])})
    assert json.loads(file_stats(nulls)) == {"numRecords": 2, "nullCount": {"l": 2, "s": 1}, "minValues": {},
                                             "maxValues": {}}
    empty = pa.table({"l": pa.array([], pa.int64())})
    assert json.loads(file_stats(empty)) == {"numRecords": 0, "nullCount": {"l": 0}, "minValues": {},
                                             "maxValues": {}}
