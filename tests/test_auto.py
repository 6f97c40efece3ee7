"""AUTO's inputs read from real Delta logs: the change ratio of a window (pipeline/strategy.py decides from
it; its pure decisions are tested in test_strategy.py)."""

from __future__ import annotations

from typing import Any


def test_window_counts_change_data_files(spark: Any, unique_name: Any) -> None:
    """The change ratio AUTO decides by counts a MERGE's cdc files (marked dataChange=false by the protocol:
    they were once skipped, so every window looked empty and AUTO never chose FULL), and an append's data
    files."""
    from connectors.delta_log import DeltaLog

    name = unique_name("ratio")
    spark.sql(f"CREATE TABLE {name} (id BIGINT, v INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {name} SELECT id, 0 FROM range(500)")
    spark.sql(f"INSERT INTO {name} SELECT id, 0 FROM range(500, 1000)")
    spark.sql(f"UPDATE {name} SET v = 1 WHERE id % 2 = 0")
    spark.sql(f"INSERT INTO {name} SELECT id, 2 FROM range(1000, 1010)")
    log = DeltaLog(spark, str(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"]))
    ops = {v: log.commit_info(v).get("operation") for v in log.versions()}
    at = {op: v for v, op in sorted(ops.items())}
    update, append = (log.window(at[op] - 1, at[op]).change_bytes for op in ("UPDATE", "WRITE"))
    assert update > 0 and append > 0, (update, append)
    assert update > append


def test_a_merge_that_only_inserts_is_an_insert_only_window(spark: Any, unique_name: Any) -> None:
    """delta-rs' MERGE writes change data files for its inserts too; a window of such commits is still
    insert-only (no data file removed), which the semi-naive recursion and the quiet-window check read.
    Its MERGE that updates a row is not."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from connectors.delta_log import DeltaLog

    name = unique_name("ins_merge")
    spark.sql(f"CREATE TABLE {name} (id BIGINT, v INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {name} SELECT id, 0 FROM range(10)")
    path = str(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"])
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int32())])

    def merge(rows: list[tuple[int, int]]) -> int:
        table = DeltaTable(path)
        source = pa.Table.from_pylist([{"id": i, "v": v} for i, v in rows], schema=schema)
        (table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update(updates={"v": "s.v"}).when_not_matched_insert_all().execute())
        return DeltaTable(path).version()

    log = DeltaLog(spark, path)
    first = log.latest_version()
    inserted = merge([(100, 1), (101, 2)])
    assert any("cdc" in a for a in DeltaLog(spark, path).actions(inserted)), "delta-rs wrote no cdc file: vacuous"
    log = DeltaLog(spark, path)
    assert log.window(first, inserted).insert_only
    updated = merge([(1, 5), (102, 3)])
    log = DeltaLog(spark, path)
    assert not log.window(inserted, updated).insert_only
    assert not log.window(first, updated).insert_only
    changes = spark.sql(f"SELECT id, _change_type FROM table_changes('{name}', {inserted}, {inserted})").collect()
    assert sorted((r.id, r._change_type) for r in changes) == [(100, "insert"), (101, "insert")]


def test_auto_recomputes_when_most_of_the_source_changed(spark: Any, st: Any, make_source: Any,
                                                          unique_name: Any) -> None:
    """Half the source rewritten in one MERGE: AUTO recomputes, says why with the ratio, and equals the query."""
    src = make_source("half", "id BIGINT, g INT, v INT")
    spark.sql(f"INSERT INTO {src} SELECT id, CAST(id % 10 AS INT), 0 FROM range(20000)")
    name = unique_name("half_auto")
    query = f"SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {src} GROUP BY g"
    st.create_stream_table(name, query, refresh_mode="AUTO")
    spark.sql(f"UPDATE {src} SET v = v + 1 WHERE id % 2 = 0")
    r = st.refresh_stream_table(name)
    assert r.action == "FULL" and "of the sources changed" in r.reason, r
    assert r.change_ratio is not None and r.change_ratio > 0.3, r
    got = sorted(tuple(x) for x in st.read(name).collect())
    assert got == sorted(tuple(x) for x in spark.sql(query).collect())


def test_auto_cancels_a_differential_refresh_over_its_budget(spark: Any, st: Any, make_source: Any,
                                                            unique_name: Any, monkeypatch: Any) -> None:
    """AUTO tries a delta before it knows what one costs; one far dearer than the query (TPC-H Q17's: minutes
    against seconds) is cancelled at the budget and the table recomputed in the same refresh, and the cost
    model then keeps AUTO on FULL. The slowness is a real Spark job run before the delta (the budget is
    what is tested, not a query that happens to be slow on this machine)."""
    from pipeline.refresh import Refresher

    src = make_source("budget", "id BIGINT, g INT, v INT")
    spark.sql(f"INSERT INTO {src} SELECT id, CAST(id % 10 AS INT), 0 FROM range(1000)")
    name = unique_name("budget_auto")
    query = f"SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {src} GROUP BY g"
    st.create_stream_table(name, query, refresh_mode="AUTO")
    original = Refresher._differential

    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.spark.range(0, 1 << 40).selectExpr("sum(id)").collect()  # hours, unless cancelled
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Refresher, "_differential", slow)
    spark.conf.set("trickle.refresh.autoBudgetSeconds", "2")
    try:
        spark.sql(f"UPDATE {src} SET v = 1 WHERE id < 5")
        r = st.refresh_stream_table(name)
    finally:
        spark.conf.unset("trickle.refresh.autoBudgetSeconds")
    assert r.action == "FULL" and "cancelled after 2 s" in r.reason, r
    got = sorted(tuple(x) for x in st.read(name).collect())
    assert got == sorted(tuple(x) for x in spark.sql(query).collect())
    monkeypatch.undo()
    spark.sql(f"UPDATE {src} SET v = 2 WHERE id < 5")
    r = st.refresh_stream_table(name)
    assert r.action == "FULL" and "threshold" in r.reason, (r.reason, st.catalog.get(name).cost_model)
    got = sorted(tuple(x) for x in st.read(name).collect())
    assert got == sorted(tuple(x) for x in spark.sql(query).collect())


def test_auto_budget_tags_its_thread_once(spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """AUTO's budget cancels by a job tag that its thread gets once and keeps (two py4j round trips fewer per
    refresh): two refreshes on one thread leave exactly one such tag on it, and the thread's own jobs after a
    refresh still run under it. (That a fired watcher stops before the FULL replacing its delta starts is what
    ``test_auto_cancels_a_differential_refresh_over_its_budget`` exercises; a stray late cancel there is a race
    this test cannot provoke.)"""
    from pipeline.refresh import _budget_tag
    from tests.oracle import session_conf

    sc = spark.sparkContext
    src = make_source("budget_tag", "id BIGINT, g INT, v INT")
    spark.sql(f"INSERT INTO {src} SELECT id, CAST(id % 10 AS INT), 0 FROM range(5000)")
    name = unique_name("budget_tag_auto")
    query = f"SELECT g, SUM(v) AS s FROM {src} GROUP BY g"
    st.create_stream_table(name, query, refresh_mode="AUTO")
    with session_conf(spark, {"trickle.refresh.autoBudgetSeconds": "60"}):
        for v in (1, 2):
            spark.sql(f"UPDATE {src} SET v = {v} WHERE id = 3")
            r = st.refresh_stream_table(name)
            assert r.action == "DIFFERENTIAL", r.reason
            assert spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500
    tags = [t for t in sc.getJobTags() if t.startswith("trickle-auto-")]
    assert tags == [_budget_tag(sc)], tags
    got = sorted(tuple(x) for x in st.read(name).collect())
    assert got == sorted(tuple(x) for x in spark.sql(query).collect())
