"""Stream tables on an object store (issue 18, points 1 and 4): everything on ``s3a://`` against a real
S3-compatible server started here (moto's server, :mod:`services.s3`), through Hadoop's S3A connector.

* A create / refresh / oracle cycle and NO_DATA with the catalog, the history, the stream table and its
  source all in the bucket (nothing on the local disk).
* Put-if-absent and the run lease on the store: racing creates, one winner; a held lease refuses, an expired
  one is taken over, and the run that lost it learns so on its next renewal.
* ``trickle run`` of a conf file whose warehouse is ``s3a://``: it refreshes on schedule while this process
  refreshes the same stream table too (two processes, one store; the oracle compares), and a second
  ``trickle run`` of the same file is refused with a clear error while the first one lives.
* A Kafka source (a real broker, :mod:`services.kafka`) whose mirror, checkpoint and stream table are in the
  bucket: inserts, updates, deletes and key changes reach the stream table (oracle), a restart of the
  ingestion query from its checkpoint on S3 loses and repeats nothing, and a transaction topic's table in
  the bucket is committed by Spark, once per batch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_env import short_lived_jvm
from oracle import assert_matches

from services.s3 import LOG_STORE, LOG_STORE_KEY, S3Server

BUCKET = f"trickle-{os.getpid()}"


@pytest.fixture(scope="module")
def s3(spark: Any) -> Iterator[S3Server]:
    """A local S3 server, and the shared session's Hadoop configuration pointed at it."""
    with S3Server() as server:
        server.create_bucket(BUCKET)
        hadoop = spark._jsc.hadoopConfiguration()
        for k, v in server.hadoop_conf().items():
            hadoop.set(k, v)
        # Delta reads its log store from the SparkContext's conf when it first opens an s3a:// table
        spark._jsc.sc().conf().set(LOG_STORE_KEY, LOG_STORE)
        yield server


def _keys(s3: S3Server, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    # keys ending in "/" are S3A's directory markers (kept when a folder's last file goes), not files
    return [o["Key"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")]


def _s3_source(spark: Any, name: str, location: str, rows: str) -> None:
    spark.sql(f"CREATE TABLE {name} (id INT, customer STRING, amount INT) USING delta LOCATION '{location}' "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {name} VALUES {rows}")


def test_create_refresh_oracle_and_no_data_on_s3(spark: Any, s3: S3Server, unique_name: Any) -> None:
    from pipeline import StreamTables

    root = f"s3a://{BUCKET}/cycle/_trickle"
    st = StreamTables(spark, root=root)
    src, name = unique_name("orders"), unique_name("totals")
    _s3_source(spark, src, f"s3a://{BUCKET}/cycle/{src}", "(1, 'a', 10), (2, 'b', 20), (3, 'a', 5)")
    query = f"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM {src} GROUP BY customer"
    st.create_stream_table(name, query, schedule="1m", refresh_mode="DIFFERENTIAL")
    d = st.catalog.get(name)
    assert d.path == f"{root}/tables/{name}" and d.sources[src].path.startswith(f"s3a://{BUCKET}/cycle/")
    assert_matches(spark, st, name, query, "after create")

    spark.sql(f"INSERT INTO {src} VALUES (4, 'c', 7), (5, 'a', 1)")
    spark.sql(f"UPDATE {src} SET amount = amount + 100 WHERE id = 2")
    spark.sql(f"DELETE FROM {src} WHERE id = 3")
    result = st.refresh_stream_table(name)
    assert result.action == "DIFFERENTIAL", result
    assert_matches(spark, st, name, query, "after a differential refresh")
    assert st.refresh_stream_table(name).action == "NO_DATA"
    assert_matches(spark, st, name, query, "after NO_DATA")

    # the catalog, the history and the table are objects in the bucket, and a new process's catalog reads them
    keys = _keys(s3, "cycle/_trickle/")
    assert f"cycle/_trickle/stream_tables/{name}.json" in keys
    assert sum(k.startswith(f"cycle/_trickle/history/{name}/") for k in keys) == 3, keys
    assert any(k.startswith(f"cycle/_trickle/tables/{name}/_delta_log/") for k in keys)
    reopened = StreamTables(spark, root=root)
    assert [h["action"] for h in reopened.history(name, limit=3)][:2] == ["NO_DATA", "DIFFERENTIAL"]

    st.drop_stream_table(name)
    assert not [k for k in _keys(s3, "cycle/_trickle/") if f"/{name}" in k]


def test_immediate_table_with_its_checkpoint_on_s3(spark: Any, s3: S3Server, unique_name: Any) -> None:
    """An IMMEDIATE table whose Structured Streaming checkpoint is in the bucket: it follows changes, and
    after a stop, changes made meanwhile are applied exactly once on restart (the checkpoint's offsets and
    commits were read back from S3)."""
    from oracle import check_many

    from pipeline import StreamTables

    root = f"s3a://{BUCKET}/immediate/_trickle"
    st = StreamTables(spark, root=root)
    src, name = unique_name("clicks"), unique_name("per_customer")
    _s3_source(spark, src, f"s3a://{BUCKET}/immediate/{src}", "(1, 'a', 10), (2, 'b', 20)")
    query = f"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM {src} GROUP BY customer"
    st.create_stream_table(name, query, refresh_mode="IMMEDIATE")

    def caught_up(context: str) -> None:
        deadline = time.monotonic() + 180  # a hung query, not a performance bound
        while check_many(spark, st, {name: query}, context):
            assert time.monotonic() < deadline, check_many(spark, st, {name: query}, context)[name]
            time.sleep(1)

    st.start(name)
    try:
        spark.sql(f"INSERT INTO {src} VALUES (3, 'a', 5), (4, 'c', 7)")
        caught_up("after a change while running")
    finally:
        st.stop(name)
    keys = _keys(s3, "immediate/")
    assert any(k.startswith(f"immediate/_trickle/checkpoints/{name}/offsets/") for k in keys)
    # the note of the followed sources beside the checkpoint is in the bucket too, not in a local folder named
    # after the URI (which the OS would make of "s3a://...", relative to the working directory)
    assert f"immediate/_trickle/checkpoints/{name}.follows.json" in keys, keys
    assert not Path(root.replace("s3a://", "s3a:/")).exists()
    spark.sql(f"DELETE FROM {src} WHERE customer = 'b'")
    spark.sql(f"UPDATE {src} SET amount = amount + 1 WHERE id = 1")
    st.start(name)
    try:
        caught_up("after a restart from the checkpoint on S3")
    finally:
        st.stop(name)
    st.drop_stream_table(name)


def test_put_if_absent_has_one_winner_on_s3(spark: Any, s3: S3Server) -> None:
    """Eight threads create the same object at once: S3's conditional write (``If-None-Match: *``) lets
    exactly one through, whatever the interleaving of their existence checks."""
    from connectors.storage import Exists, HadoopStorage

    store, path = HadoopStorage(spark), f"s3a://{BUCKET}/race/one.json"
    outcome: list[str] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        start.wait()
        try:
            store.put_if_absent(path, f"writer {i}")
            outcome.append(f"writer {i}")
        except Exists:
            outcome.append("exists")

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcome if o != "exists"]
    assert len(outcome) == 8 and len(winners) == 1, outcome
    assert store.read_text(path) == winners[0]


class _Racing:
    """A Hadoop FileSystem whose ``open`` runs the next of ``between`` (another process's write) after S3A's
    HEAD and before the stream's first read: the race placed exactly."""

    def __init__(self, fs: Any, between: list[Any]) -> None:
        self.fs, self.between = fs, between

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def open(self, hpath: Any) -> Any:
        stream = self.fs.open(hpath)
        if self.between:
            self.between.pop(0)()
        return stream


def test_an_object_replaced_or_deleted_while_read_on_s3(spark: Any, s3: S3Server) -> None:
    """S3A opens with a HEAD and reads with a GET pinned to its ETag, so a state file another process
    rewrote in between (a lease renewal) failed the read with RemoteFileChangedException: a second
    ``trickle run`` in CI died of it instead of saying who holds the lease. The other writer's PUT is placed
    exactly there: the read returns the new version whole; an object deleted there reads as missing; one
    replaced at every attempt fails after a bounded number of them."""
    from connectors.storage import HadoopStorage

    store, path = HadoopStorage(spark), f"s3a://{BUCKET}/race/replaced.json"
    between: list[Any] = []  # what another process does between the next opens and their reads
    real_fs = store._fs
    store.write_text(path, "a" * 100)
    store._fs = lambda p: (_Racing(real_fs(p)[0], between), real_fs(p)[1])  # type: ignore[method-assign]
    between.append(lambda: store.write_text(path, "b" * 300))
    assert store.read_text(path) == "b" * 300 and not between

    between.append(lambda: real_fs(path)[0].delete(real_fs(path)[1], False))
    assert store.read_text(path) is None

    store.write_text(path, "c")
    between.extend(lambda i=i: store.write_text(path, f"version {i}") for i in range(100))
    with pytest.raises(Exception, match="RemoteFileChangedException"):
        store.read_text(path)
    assert 80 <= len(between) < 100, "a few attempts, then the error"


def test_a_delta_log_file_rewritten_or_deleted_while_read_on_s3(spark: Any, s3: S3Server) -> None:
    """``_last_checkpoint`` is rewritten in place by every checkpoint, and log cleanup deletes old files: the
    log reader reads the new one whole, and a file deleted under it as missing."""
    from connectors.delta_log import DeltaLog
    from connectors.storage import HadoopStorage

    store, log = HadoopStorage(spark), DeltaLog(spark, f"s3a://{BUCKET}/race/table")
    store.write_text(f"{log.log_dir}/_last_checkpoint", '{"version":10,"size":3}')
    between: list[Any] = [lambda: store.write_text(f"{log.log_dir}/_last_checkpoint", '{"version":20,"size":4}')]
    real_fs = log._fs
    log._fs = lambda name: (_Racing(real_fs(name)[0], between), real_fs(name)[1])  # type: ignore[method-assign]
    assert log._fetch("_last_checkpoint") == b'{"version":20,"size":4}' and not between
    between.append(lambda: store.delete(f"{log.log_dir}/_last_checkpoint"))
    assert log._fetch("_last_checkpoint") is None
    assert log._fetch("00000000000000000099.json") is None


def test_lease_on_s3_refuses_expires_and_is_lost(spark: Any, s3: S3Server) -> None:
    from connectors.storage import HadoopStorage
    from pipeline.lease import Lease, LeaseHeld, LeaseLost

    now = [1000.0]
    store, folder = HadoopStorage(spark), f"s3a://{BUCKET}/leases"
    first = Lease(store, folder, "run-conf.yaml", ttl=30, clock=lambda: now[0])
    second = Lease(store, folder, "run-conf.yaml", ttl=30, clock=lambda: now[0])
    first.acquire()
    with pytest.raises(LeaseHeld, match=r"another 'trickle run' of run-conf.yaml is running .*pid"):
        second.acquire()
    now[0] += 20
    first.renew()  # renewed: 30 s from now again
    now[0] += 20
    with pytest.raises(LeaseHeld):
        second.acquire()
    now[0] += 31  # the first run stalled (or crashed): its lease expired
    second.acquire()
    with pytest.raises(LeaseLost, match="taken over"):
        first.renew()
    second.release()
    assert not _keys(s3, "leases/run-conf.yaml/")
    first.acquire()  # a released lease is free at once
    first.release()


def _conf(tmp: Path, s3: S3Server, warehouse: str, src: str, name: str, query: str) -> Path:
    import yaml

    spark_conf = {**s3.spark_conf(), "spark.master": "local[1]", "spark.sql.shuffle.partitions": "1",
                  "spark.ui.enabled": "false"}
    doc = {"spark": spark_conf, "warehouse": warehouse,
           "sources": [{"name": src, "kind": "delta", "path": f"{warehouse}/{src}"}],
           "stream_tables": [{"name": name, "query": query, "schedule": "1s", "refresh_mode": "DIFFERENTIAL"}],
           "runtime": {"tick_seconds": 0.5}}
    path = tmp / "s3_pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", str(conf)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=short_lived_jvm(dict(os.environ)))


def _job_said(log: Path) -> str:
    """What a failed job's log says, Python's part first: its traceback or ``error:`` line can be followed by
    pages of JVM stack traces (an AWS SDK timeout filled the last 3000 characters once, hiding the cause)."""
    text = log.read_text(errors="replace")
    return f"{_python_said(text)}\n--- the log's end ---\n{text[-3000:]}"


def _python_said(text: str) -> str:
    """Python's traceback or ``error:`` line in a process's output, without the JVM frames between them."""
    start = max(text.rfind("Traceback (most recent call last)"), text.rfind("\nerror: "))
    if start < 0:
        return "(no Python traceback or error line)\n" + text[-3000:]
    return "\n".join(line for line in text[start:].splitlines() if not line.startswith("\tat "))[:4000]


def test_trickle_run_on_s3_with_a_second_process_and_a_second_run(
        spark: Any, s3: S3Server, unique_name: Any, tmp_path: Path) -> None:
    from pipeline import StreamTables

    warehouse = f"s3a://{BUCKET}/run"
    src, name = unique_name("orders"), unique_name("totals")
    _s3_source(spark, src, f"{warehouse}/{src}", "(1, 'a', 10), (2, 'b', 20)")
    query = f"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM {src} GROUP BY customer"
    conf = _conf(tmp_path, s3, warehouse, src, name, query)
    log = tmp_path / "run.log"
    job = _start(conf, log)
    try:
        st = StreamTables(spark, root=f"{warehouse}/_trickle")
        deadline = time.time() + 240
        while not (st.catalog.exists(name) and st.catalog.history(name, limit=1)):
            assert job.poll() is None, f"the job exited: {_job_said(log)}"
            assert time.time() < deadline, f"the job did not create {name}: {_job_said(log)}"
            time.sleep(0.5)
        assert any(k.startswith("run/_trickle/leases/run-s3_pipeline.yaml/") for k in _keys(s3, "run/_trickle/"))

        # a second run of the same conf file, while the first lives: refused, with who holds it
        second = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(conf)], capture_output=True,
                                text=True, timeout=300, env=short_lived_jvm(dict(os.environ)))
        assert second.returncode == 2, _python_said(second.stdout + second.stderr)
        assert "another 'trickle run' of run-s3_pipeline.yaml is running" in second.stderr, second.stderr[-2000:]

        # this process refreshes the same stream table while the job refreshes it every second (each round
        # of changes and refresh costs ~20 s of S3 commits and Spark deltas beside the job: one round)
        spark.sql(f"INSERT INTO {src} VALUES (10, 'c0', 0), (11, 'a', 1), (12, 'c1', 2)")
        spark.sql(f"UPDATE {src} SET amount = amount + 1 WHERE id IN (1, 10)")
        spark.sql(f"DELETE FROM {src} WHERE id = 11")
        st.refresh_stream_table(name)
        assert job.poll() is None, f"the job exited: {_job_said(log)}"
        st.refresh_stream_table(name)
        assert_matches(spark, st, name, query, "after concurrent refreshes from two processes")
        actions = {h["action"] for h in st.history(name, limit=200)}
        assert "DIFFERENTIAL" in actions, actions
        job.send_signal(signal.SIGTERM)
        rc = job.wait(120)
        assert rc == 0, f"SIGTERM must stop the job cleanly, it exited with {rc}: {_job_said(log)}"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert not _keys(s3, "run/_trickle/leases/"), "a clean stop releases the lease"
    assert_matches(spark, st, name, query, "after the job stopped")


def test_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path: Path) -> None:
    """A job killed on this host (kill -9, OOM) leaves its lease behind; the supervisor's restart takes it
    over without waiting for the expiry, while a live holder still refuses."""
    from connectors.storage import LocalStorage
    from pipeline.lease import Lease, LeaseHeld

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    crashed = Lease(LocalStorage(), str(tmp_path), "run-x.yaml", ttl=600)
    crashed.owner["pid"] = gone
    crashed.acquire()
    restarted = Lease(LocalStorage(), str(tmp_path), "run-x.yaml", ttl=600)
    restarted.acquire()
    assert restarted.generation == 1 and sorted(os.listdir(tmp_path / "run-x.yaml")) == ["000000000001.json"]
    with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
        Lease(LocalStorage(), str(tmp_path), "run-x.yaml", ttl=600).acquire()
    restarted.release()


def test_catalog_views_over_the_catalog_files(spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """``register_catalog_views`` shows the definitions as the catalog reads them, their refresh state (kept in
    the state slots, not in the definition files) included, and the history files it finds through the
    catalog's storage (a local root here; the same Spark JSON read on a URI)."""
    src, name = make_source("orders", "id INT, v INT", rows=[(1, 10), (2, 20)]), unique_name("sums")
    st.create_stream_table(name, f"SELECT SUM(v) AS total FROM {src}", schedule="1m")
    st.register_catalog_views()
    d = st.catalog.get(name)
    assert d.last_refresh_id is not None and d.last_action is not None
    assert [tuple(r) for r in spark.sql("SELECT name, last_refresh_id, last_action FROM trickle_stream_tables")
            .collect()] == [(name, d.last_refresh_id, d.last_action)]
    assert spark.sql(f"SELECT count(*) FROM trickle_history WHERE name = '{name}'").collect()[0][0] == 1


def _s3_database(spark: Any, unique_name: Any, prefix: str) -> str:
    """A database whose tables are created in the bucket: a Kafka source's mirror and dead-letter table are
    managed tables, created where their database lives (as with ``warehouse: s3a://...`` in a conf file)."""
    db = unique_name(prefix)
    spark.sql(f"CREATE DATABASE {db} LOCATION 's3a://{BUCKET}/{db}'")
    return db


def _mirror_commits(spark: Any, table: str, local: bool = False) -> list[dict[str, Any]]:
    """The commit infos of a table's commits after its creation (checking it is where it should be)."""
    from connectors.delta_log import DeltaLog

    location = str(spark.sql(f"DESCRIBE DETAIL {table}").first()["location"])
    assert location.startswith("file:/" if local else f"s3a://{BUCKET}/"), location
    log = DeltaLog(spark, location)
    return [log.commit_info(v) for v in range(1, (log.latest_version() or 0) + 1)]


def test_kafka_source_with_its_mirror_and_stream_table_on_s3(
        spark: Any, s3: S3Server, broker: Any, unique_name: Any) -> None:
    """Debezium events from a real broker, mirrored into the bucket by Spark's MERGE (delta-rs is kept to local
    tables), read by a stream table in the bucket: after every round the mirror equals the source and the
    stream table its query; the ingestion query is stopped, events arrive meanwhile, and the restart from
    its checkpoint on S3 applies them, each micro-batch committed once."""
    from kafka import KafkaProducer
    from test_kafka_e2e import COLUMNS, Model, _check_mirror, _wait

    from connectors import kafka_mirror
    from connectors.debezium import SourceSchema
    from pipeline import StreamTables

    db = _s3_database(spark, unique_name, "kafka_s3")
    mirror, topic = f"{db}.orders", f"shop.public.{db}"
    broker.create_topic(topic, partitions=1)
    src = kafka_mirror.KafkaSource(mirror, topic, broker.bootstrap, SourceSchema(COLUMNS, ("id",)))
    ckpt = f"s3a://{BUCKET}/{db}/_checkpoints/mirror"
    st = StreamTables(spark, root=f"s3a://{BUCKET}/{db}/_trickle")
    query = f"SELECT customer, SUM(amount) AS total, COUNT(*) AS n, MAX(qty) AS top_qty FROM {mirror} GROUP BY customer"
    name = unique_name("kafka_totals")
    model = Model(seed=5, topic=topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    ingest = None
    try:
        model.snapshot(20)
        model.flush(producer)
        ingest = kafka_mirror.start(spark, src, ckpt, trigger_seconds=0.2)
        _wait(ingest, "ingestion")
        _check_mirror(spark, mirror, model, "after the snapshot")
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        for rnd in (1, 2, 3):
            model.round(15)
            if rnd == 2:  # stopped while events arrive: the restart must resume from the offsets on S3
                ingest.stop()
                model.flush(producer)
                ingest = kafka_mirror.start(spark, src, ckpt, trigger_seconds=0.2)
            else:
                model.flush(producer)
            _wait(ingest, "ingestion")
            _check_mirror(spark, mirror, model, f"round {rnd}")
            st.refresh_stream_table(name)
            assert_matches(spark, st, name, query, f"round {rnd}")
    finally:
        if ingest is not None:
            ingest.stop()
        producer.close()
    assert "DIFFERENTIAL" in {h["action"] for h in st.history(name, limit=20)}
    commits = _mirror_commits(spark, mirror)
    batches = [json.loads(c["userMetadata"])["trickle_mirror"]["batch_id"] for c in commits if c.get("userMetadata")]
    assert batches and len(batches) == len(set(batches)), f"a micro-batch was committed twice: {batches}"
    engines = {str(c.get("engineInfo") or c.get("clientVersion")) for c in commits}
    assert not any("delta-rs" in e for e in engines), engines
    keys = _keys(s3, f"{db}/")
    assert any(k.startswith(f"{db}/_checkpoints/mirror/offsets/") for k in keys)
    assert any(k.startswith(f"{db}/_trickle/tables/{name}/_delta_log/") for k in keys)
    st.drop_stream_table(name)


@pytest.mark.parametrize("store", ["s3", "local"])
def test_transaction_topic_table_commits_each_batch_once(spark: Any, s3: S3Server, unique_name: Any,
                                                         tmp_path: Path, store: str) -> None:
    """A transaction topic's table in the bucket: its ENDs are committed by Spark's writer (delta-rs, which
    would reach S3 without its settings, is not asked), with the ENDs in the commit's metadata, and a replayed
    batch commits nothing. The same on the local disk, where delta-rs commits them."""
    from connectors import kafka_transactions as kt
    from connectors.kafka_mirror import _app_id

    if store == "s3":
        db = _s3_database(spark, unique_name, "txn_s3")
        checkpoint = f"s3a://{BUCKET}/{db}/_checkpoints/transactions"
    else:
        db = unique_name("txn_local")
        spark.sql(f"CREATE DATABASE {db} LOCATION '{tmp_path / db}'")
        checkpoint = str(tmp_path / "_checkpoints" / "transactions")
    tx = kt.TransactionTopic(f"{db}.transactions", "shop.transaction", "127.0.0.1:1")
    kt.create_tables(spark, tx)
    end = {"status": "END", "id": "571:53195829", "event_count": 3, "ts_ms": 1,
           "data_collections": [{"data_collection": "public.orders", "event_count": 2},
                                {"data_collection": "public.lines", "event_count": 1}]}
    records = [(None, json.dumps({"status": "BEGIN", "id": "571:53195829"}).encode(), "shop.transaction", 0, 0),
               (None, json.dumps(end).encode(), "shop.transaction", 0, 1)]
    batch = spark.createDataFrame(records, "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT")
    app = _app_id(checkpoint)
    assert kt.apply_batch(batch, 0, tx, app) == 1
    assert kt.apply_batch(batch, 0, tx, app) == 1  # a replay after a crash: Delta skips the write
    rows = spark.table(tx.name).collect()
    assert [(r["id"], r["event_count"], dict(r["data_collections"])) for r in rows] == [
        ("571", 3, {"public.orders": 2, "public.lines": 1})]  # PostgreSQL's <xid>:<LSN> is named by its xid
    commits = _mirror_commits(spark, tx.name, local=store == "local")
    ends = [e for c in commits for e in kt.ends_in(c)]
    assert ends == [("571", {"public.orders": 2, "public.lines": 1})], ends
    engines = {"delta-rs" in str(c.get("engineInfo") or c.get("clientVersion")) for c in commits}
    assert engines == {store == "local"}, commits


def test_delta_rs_never_opens_a_table_that_is_not_local() -> None:
    """Every delta-rs entry point of mirrors and stream tables, given an ``s3a://`` path: the readers answer
    None (their callers ask Spark), the openers and writers refuse; none reaches a store without its settings."""
    from connectors import delta_rs

    path = f"s3a://{BUCKET}/not_local"
    assert "not on a local file system" in (delta_rs.unusable(path, {"minReaderVersion": 1, "minWriterVersion": 2})
                                            or "")
    readers = {"read_small": lambda: delta_rs.read_small(path, 0, 1 << 20, 100),
               "read_changes": lambda: delta_rs.read_changes(path, 0, 1, 100),
               "rows_with": lambda: delta_rs.rows_with(path, 0, ["a"], "a", []),
               "table_rows": lambda: delta_rs.table_rows(path, 0),
               "table_bytes": lambda: delta_rs.table_bytes(path, 0)}
    assert {name: read() for name, read in readers.items()} == dict.fromkeys(readers)
    record, txn = {"refresh": 1}, {"txn_version": 1, "app_id": "a"}
    writers = [lambda: delta_rs.opened(path, 0), lambda: delta_rs.dataset(path, 0),
               lambda: delta_rs.append(path, None, record, 0, **txn),
               lambda: delta_rs.overwrite(path, None, record, 0, **txn),
               lambda: delta_rs.merge(path, None, ["a"], False, record, 0, **txn),
               lambda: delta_rs.upsert_keyed(path, None, ["a"], ["a"], {}, {}, 0, "a", 1)]
    for write in writers:
        with pytest.raises(delta_rs.NotLocal, match="delta-rs is used for local tables only"):
            write()
