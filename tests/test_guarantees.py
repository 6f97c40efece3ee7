"""The guarantees of README "What spark-trickle guarantees", each provoked on purpose.

- Two refreshes of one stream table that read the same frontier never both commit (the commit is checked
  against the table version the frontier was read at), in one process or two.
- A source dropped and re-created under the same name is noticed (its Delta table id is part of the
  frontier) and the stream table is re-initialized.
- A change history removed by VACUUM falls back to FULL in AUTO, and fails with a SourceChangedError that
  names the source and the versions in DIFFERENTIAL and strict mode.
- A source whose schema changed is re-initialized when the query still fits it, and sends the stream table
  to ERROR with the column named when it does not.

Every test compares the stream table with its query recomputed from scratch, as multisets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from connectors import delta_sink
from pipeline import RefreshError, SourceChangedError, StreamTables

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def rows(df: Any) -> Counter:
    return Counter(tuple(r) for r in df.collect())


class _Paused:
    """Pauses one StreamTables' refreshes right before they commit: after they read the stream table's
    frontier and computed their delta, which is where another writer's commit must be caught."""

    def __init__(self, tables: StreamTables) -> None:
        self.reached, self.release = threading.Event(), threading.Event()

        def before_commit(name: str) -> None:
            if not self.release.is_set():
                self.reached.set()
                assert self.release.wait(300), "the paused refresh was never released"

        tables.refresher.before_commit = before_commit

    def run(self, fn: Any) -> tuple[threading.Thread, list[Any]]:
        out: list[Any] = []

        def target() -> None:
            try:
                out.append(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the test
                out.append(e)

        thread = threading.Thread(target=target, name="paused-refresh")
        thread.start()
        assert self.reached.wait(300), "the refresh never reached its commit"
        return thread, out


def test_two_refreshes_straddling_a_commit_apply_the_window_once(
        spark: Any, tmp_path: Path, make_source: Any, unique_name: Any) -> None:
    """Two StreamTables over one catalog (each with its own per-table locks, as two processes have): the
    first is paused after reading the frontier, the second refreshes and commits meanwhile; the first must
    then not apply the same window again (it did: ('ap', 14, 2) where the query gives ('ap', 7, 1), and a
    bag row twice)."""
    src = make_source("src", "id INT, k STRING, v INT", rows=[(1, "ap", 7)])
    root = str(tmp_path / "trickle")
    first, second = StreamTables(spark, root=root), StreamTables(spark, root=root)
    queries = {unique_name("agg"): f"SELECT k, SUM(v) AS s, COUNT(*) AS n FROM {src} GROUP BY k",
               unique_name("bag"): f"SELECT k, v FROM {src}"}
    for name, query in queries.items():
        first.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} VALUES (2, 'ap', 7), (3, 'zz', NULL)")
    for name, query in queries.items():
        paused = _Paused(first)
        thread, out = paused.run(lambda n=name: first.refresh_stream_table(n))
        won = second.refresh_stream_table(name)
        assert won.action == "DIFFERENTIAL"
        paused.release.set()
        thread.join(300)
        first.refresher.before_commit = lambda n: None
        late = out[0]
        assert not isinstance(late, BaseException), late
        assert late.action == "NO_DATA", late  # retried from the winner's frontier: nothing left to apply
        assert rows(first.read(name)) == rows(spark.sql(query)), name
        spark.sql(f"INSERT INTO {src} VALUES (4, 'ap', 1)")  # and later refreshes build on a correct state
        assert first.refresh_stream_table(name).action == "DIFFERENTIAL"
        assert rows(second.read(name)) == rows(spark.sql(query)), name
        spark.sql(f"DELETE FROM {src} WHERE id = 4")
        second.refresh_stream_table(name)


def test_a_refresh_from_another_process_is_not_applied_twice(
        spark: Any, tmp_path: Path, make_source: Any, unique_name: Any) -> None:
    """The same race with the winner in another process (the CLI, as `trickle refresh` beside `trickle
    run`): the check is in the table's own Delta log, not in a lock of this process."""
    src = make_source("src", "id INT, k STRING, v INT", rows=[(1, "ap", 7)])
    warehouse = tmp_path / "wh"
    st = StreamTables(spark, root=str(warehouse / "_trickle"))
    query = f"SELECT k, SUM(v) AS s, COUNT(*) AS n FROM {src} GROUP BY k"
    totals = unique_name("totals")
    st.create_stream_table(totals, query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} VALUES (2, 'ap', 7)")
    paused = _Paused(st)
    thread, out = paused.run(lambda: st.refresh_stream_table(totals))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    cli = subprocess.run([str(Path(sys.executable).parent / "trickle"), "--warehouse", str(warehouse), "refresh",
                          totals], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "DIFFERENTIAL" in cli.stdout, cli.stdout
    paused.release.set()
    thread.join(300)
    assert not isinstance(out[0], BaseException), out[0]
    assert out[0].action == "NO_DATA", out[0]
    assert rows(st.read(totals)) == rows(spark.sql(query)) == Counter({("ap", 14, 2): 1})


def test_source_dropped_and_recreated_is_reinitialized(spark: Any, st: Any, unique_name: Any) -> None:
    """Re-created with a shorter log (its versions fall behind the frontier) and with a log exactly as long
    (only the table id tells): both REINITIALIZE, and the table equals its query afterwards."""
    mirror = unique_name("mirror")
    src = unique_name("src")
    make = f"CREATE TABLE {src} (id INT, v STRING) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    spark.sql(make)
    spark.sql(f"INSERT INTO {src} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"INSERT INTO {src} VALUES (3, 'c')")
    query = f"SELECT id, v FROM {src}"
    st.create_stream_table(mirror, query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"DROP TABLE {src}")
    spark.sql(make)
    spark.sql(f"INSERT INTO {src} VALUES (10, 'new')")  # version 1, behind the frontier (2)
    r = st.refresh_stream_table(mirror)
    assert r.action == "REINITIALIZE" and "re-created" in r.reason, r
    assert rows(st.read(mirror)) == rows(spark.sql(query))
    spark.sql(f"INSERT INTO {src} VALUES (11, 'x')")
    assert st.refresh_stream_table(mirror).action == "DIFFERENTIAL"
    assert rows(st.read(mirror)) == rows(spark.sql(query)) == Counter({(10, "new"): 1, (11, "x"): 1})
    spark.sql(f"DROP TABLE {src}")
    spark.sql(make)
    spark.sql(f"INSERT INTO {src} VALUES (20, 'p')")
    spark.sql(f"INSERT INTO {src} VALUES (21, 'q')")  # version 2 again, as the frontier: only the id differs
    r = st.refresh_stream_table(mirror)
    assert r.action == "REINITIALIZE" and "table id" in r.reason, r
    assert rows(st.read(mirror)) == rows(spark.sql(query)) == Counter({(20, "p"): 1, (21, "q"): 1})


def _churn_and_vacuum(spark: Any, src: str) -> None:
    spark.sql(f"UPDATE {src} SET v = 5 WHERE id = 1")
    spark.sql(f"DELETE FROM {src} WHERE id = 2")
    spark.sql(f"INSERT INTO {src} VALUES (3, 3)")
    spark.sql(f"OPTIMIZE {src}")
    # VACUUM lists the table in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks (10,000 by
    # default: 35 s for this tiny table on 2 cores; 1 s with one)
    settings = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                "spark.sql.sources.parallelPartitionDiscovery.parallelism": "1"}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        spark.sql(f"VACUUM {src} RETAIN 0 HOURS")
    finally:
        for k in settings:
            spark.conf.unset(k)


def test_vacuumed_change_history(spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """AUTO recomputes with the reason recorded; DIFFERENTIAL and strict mode fail with an error naming
    the source, the versions and the remedy, and the table goes to ERROR (retrying cannot help)."""
    auto_t = unique_name("auto_t")
    diff_t = unique_name("diff_t")
    # enough rows that the churn is a small share of the source: AUTO then tries a delta (and finds the
    # history gone) rather than recomputing by cost without reading the window
    src = make_source("src", "id INT, v INT")
    spark.sql(f"INSERT INTO {src} SELECT CAST(id AS INT), CAST(id % 7 AS INT) FROM range(1, 5001)")
    query = f"SELECT v, COUNT(*) AS n FROM {src} GROUP BY v"
    st.create_stream_table(auto_t, query, refresh_mode="AUTO")
    st.create_stream_table(diff_t, query, refresh_mode="DIFFERENTIAL")
    strict = StreamTables(spark, root=str(st.catalog.root), strict=True)
    _churn_and_vacuum(spark, src)
    with pytest.raises(SourceChangedError, match=rf"source {src} between versions 1 and \d+.*VACUUM") as e:
        strict.refresh_stream_table(auto_t)
    assert "strict mode" in str(e.value) and "refresh_mode" in str(e.value)
    r = st.refresh_stream_table(auto_t)
    assert r.action == "FULL" and "no longer readable" in r.reason and src in r.reason, r
    assert st.history(auto_t)[0]["reason"] == r.reason
    assert rows(st.read(auto_t)) == rows(spark.sql(query))
    with pytest.raises(SourceChangedError, match=rf"source {src} between versions 1 and \d+"):
        st.refresh_stream_table(diff_t)
    status = {s["name"]: s for s in st.status()}
    assert status[diff_t]["status"] == "ERROR" and src in status[diff_t]["last_error"]
    assert status[auto_t]["status"] == "ACTIVE"


def test_source_schema_change(spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """A renamed column the query reads: ERROR at once, naming the column, no wrong rows. The same change
    seen by a table that does not read the column, and a source overwritten with another type: both
    REINITIALIZE and equal their queries."""
    reads_v = unique_name("reads_v")
    reads_w = unique_name("reads_w")
    typed = unique_name("typed")
    src = unique_name("src")
    spark.sql(f"CREATE TABLE {src} (id INT, v INT, w INT) USING delta TBLPROPERTIES "
              "(delta.enableChangeDataFeed = true, 'delta.columnMapping.mode' = 'name')")
    spark.sql(f"INSERT INTO {src} VALUES (1, 1, 1), (2, 2, 2)")
    st.create_stream_table(reads_v, f"SELECT id, v FROM {src}", refresh_mode="AUTO")
    st.create_stream_table(reads_w, f"SELECT id, w FROM {src}", refresh_mode="AUTO")
    spark.sql(f"ALTER TABLE {src} RENAME COLUMN v TO vv")
    spark.sql(f"INSERT INTO {src} VALUES (3, 3, 3)")
    before = rows(st.read(reads_v))
    renamed = r"reads_v.*column v of source \w+ was renamed to vv.*re-create"
    with pytest.raises(SourceChangedError, match=renamed) as e:
        st.refresh_stream_table(reads_v)
    assert src in str(e.value)
    assert {s["name"]: s["status"] for s in st.status()}[reads_v] == "ERROR"
    assert rows(st.read(reads_v)) == before  # nothing half-applied
    r = st.refresh_stream_table(reads_w)
    assert r.action == "REINITIALIZE" and "schema" in r.reason, r
    assert rows(st.read(reads_w)) == rows(spark.sql(f"SELECT id, w FROM {src}"))

    other = make_source("other", "id INT, v INT", rows=[(1, 1), (2, 2)])
    st.create_stream_table(typed, f"SELECT id, v FROM {other}", refresh_mode="DIFFERENTIAL")
    (spark.createDataFrame([(5, "x")], "id INT, v STRING").write.format("delta").mode("overwrite")
     .option("overwriteSchema", "true").saveAsTable(other))
    r = st.refresh_stream_table(typed)
    assert r.action == "REINITIALIZE", r
    assert rows(st.read(typed)) == rows(spark.sql(f"SELECT id, v FROM {other}")) == Counter({(5, "x"): 1})
    spark.sql(f"INSERT INTO {other} VALUES (6, 'y')")
    assert st.refresh_stream_table(typed).action == "DIFFERENTIAL"
    assert rows(st.read(typed)) == rows(spark.sql(f"SELECT id, v FROM {other}"))


def test_losing_every_commit_race_is_a_clear_error(spark: Any, st: Any, make_source: Any,
                                                    monkeypatch: pytest.MonkeyPatch, unique_name: Any) -> None:
    ids = unique_name("ids")
    src = make_source("src", "id INT", rows=[(1,)])
    st.create_stream_table(ids, f"SELECT id FROM {src}", refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} VALUES (2)")

    def lose(*args: Any, **kwargs: Any) -> Any:
        raise delta_sink.CommitLost("injected")

    monkeypatch.setattr(delta_sink, "merge", lose)
    monkeypatch.setattr(delta_sink, "apply_collected", lose)
    with pytest.raises(RefreshError, match="commit races"):
        st.refresh_stream_table(ids)


def test_delta_failures_are_typed_where_they_enter(spark: Any, make_source: Any) -> None:
    """Retry and fallback decide on types (connectors/delta_errors.py), not on message text: a read of a version
    whose history is gone becomes ChangesGone, whichever way pyspark captured Delta's exception; any other
    error passes through unchanged."""
    from pyspark.errors import AnalysisException

    from connectors import delta_errors

    src = make_source("typed", "id INT, v INT", rows=[(1, 1)])
    with pytest.raises(delta_errors.ChangesGone) as gone:
        with delta_errors.typed():
            spark.sql(f"SELECT * FROM {src} VERSION AS OF 99").collect()
    assert gone.value.__cause__ is not None
    with pytest.raises(AnalysisException), delta_errors.typed():
        spark.sql(f"SELECT no_such_column FROM {src}").collect()
    with pytest.raises(delta_errors.ChangesGone), delta_errors.typed():
        raise FileNotFoundError("part-00000.parquet")
    with pytest.raises(ValueError), delta_errors.typed():
        raise ValueError("DELTA_CONCURRENT_APPEND in a message is not a conflict")
