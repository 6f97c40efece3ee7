"""Crash test: the whole job killed with SIGKILL at random points, restarted, and nothing lost or doubled.

The job runs as users run it, in its own process group: ``spark-submit trickle_job.py conf.yaml`` for the
runs that get killed (so the spark-submit entry point is exercised too), ``trickle run conf.yaml`` for the
last one, which is stopped with SIGTERM and must exit 0. Debezium events (creates, updates, primary-key
changes, deletes with tombstones, redelivered duplicates, malformed events, a truncate) are produced
while the job runs, so kills land in ingestion micro-batches (the mirror commit, decoded on the driver and committed by
delta-rs or by Spark's MERGE, and the IMMEDIATE refresh the same batch runs after it: the fused path), in
scheduled refreshes and in start-up. At the end the Delta mirror must equal the model of the source table, each
stream table must equal its query over the mirror (an aggregate whose delta was applied twice, or lost,
would differ), and the dead-letter table must hold each malformed event exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_env import short_lived_jvm, submit_jars
from oracle import assert_matches, compare_rows, format_diff
from test_kafka_e2e import COLUMNS, Model

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _spark_submit() -> list[str]:
    # the jars as a deployment passes them, the AWS SDK bundle on the class path rather than copied into
    # each run's scratch folder (cluster_env.submit_jars)
    return [str(Path(sys.executable).parent / "spark-submit"), *submit_jars(), str(PROJECT_ROOT / "trickle_job.py")]


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = short_lived_jvm({**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})
    out = open(log, "ab")  # noqa: SIM115 - closed with the process by the caller's reap
    return subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(30)


def _conf(tmp: Path, mirror: str, topic: str, bootstrap: str, totals: str, by_qty: str) -> Path:
    conf = tmp / "pipeline.yaml"
    conf.write_text(f"""
spark:
  spark.sql.shuffle.partitions: 1
  spark.default.parallelism: 1
  spark.databricks.delta.snapshotPartitions: 1
  spark.driver.memory: 1g
warehouse: warehouse
checkpoints: checkpoints
sources:
  - name: {mirror}
    kind: kafka
    topic: {topic}
    bootstrap_servers: "{bootstrap}"
    columns: {{id: BIGINT, customer: STRING, amount: "DECIMAL(10,2)", qty: INT}}
    key: id
    trigger_seconds: 0.5
stream_tables:
  - name: {totals}
    refresh_mode: IMMEDIATE
    query: SELECT customer, SUM(amount) AS total, COUNT(*) AS n, MAX(qty) AS top FROM {mirror} GROUP BY customer
  - name: {by_qty}
    refresh_mode: DIFFERENTIAL
    schedule: 1s
    query: SELECT qty, COUNT(*) AS n, SUM(amount) AS total FROM {mirror} WHERE customer IS NOT NULL GROUP BY qty
runtime:
  tick_seconds: 0.5
""")
    return conf


def _run_crash_test(spark: Any, broker: Any, unique_name: Any, tmp_path: Path, kills: int, seed: int) -> None:
    from kafka import KafkaProducer

    from pipeline import StreamTables

    rng = random.Random(seed)
    mirror, totals, by_qty = unique_name("cr_orders"), unique_name("cr_totals"), unique_name("cr_by_qty")
    topic = f"shop.public.{mirror}"
    broker.create_topic(topic, partitions=1)
    conf = _conf(tmp_path, mirror, topic, broker.bootstrap, totals, by_qty)
    warehouse = tmp_path / "warehouse"
    log = tmp_path / "job.log"
    model = Model(seed=seed, topic=topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    model.snapshot(30)
    model.flush(producer)
    rounds = 0
    produce_errors: list[BaseException] = []

    def produce(stop: threading.Event) -> None:
        nonlocal rounds
        try:
            while not stop.wait(rng.uniform(0.5, 2.0)):
                rounds += 1
                model.round(12)
                if rounds % 4 == 2:
                    model.garbage()
                if rounds == 7:
                    model.truncate()
                    model.round(8)
                model.flush(producer)
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread after the join
            produce_errors.append(e)

    try:
        for i in range(kills):
            stop = threading.Event()
            feeder = threading.Thread(target=produce, args=(stop,))
            started = log.read_text().count(" ingesting ") if log.exists() else 0
            job = _start(_spark_submit() + [str(conf)], log)
            feeder.start()
            try:
                if i == 0:  # once during start-up (JVM, session, streaming queries starting)
                    time.sleep(rng.uniform(2.0, 8.0))
                else:  # the others while it works: ingesting, refreshing, committing
                    _wait_for(lambda n=started: log.read_text().count(" ingesting ") > n, job, log)
                    time.sleep(rng.uniform(0.5, 15.0))
                assert job.poll() is None, f"the job exited on its own (run {i}): {log.read_text()[-3000:]}"
            finally:
                _kill_group(job)
                stop.set()
                feeder.join()
            assert not produce_errors, f"the producer failed: {produce_errors[0]!r}"
        assert rounds >= kills, "the producer did not run during the kills"
        # One last event, a new row: the model is then never empty, so "caught up" cannot be an empty mirror
        # before its first batch equalling an emptied model (seen: the last run's recovered batch 0, planned
        # by an earlier run, committed rows deleted by later events while the check had already passed).
        model.snapshot(1)
        model.flush(producer)
        # the last run: let it catch up, then stop it as an operator would
        job = _start([sys.executable, "-m", "pipeline.cli", "run", str(conf)], log)
        try:
            _wait_caught_up(spark, warehouse, mirror, model, totals, by_qty, job, log, broker)
            job.send_signal(signal.SIGTERM)
            rc = job.wait(120)
        finally:
            if job.poll() is None:
                _kill_group(job)
        assert rc == 0, f"SIGTERM must stop the job cleanly (exit 0), got {rc}: {log.read_text()[-3000:]}"
        assert "stopping" in log.read_text()
        # the IMMEDIATE table ran on the fused path (refreshed inside the mirror's micro-batches, so the kills
        # landed in those refreshes too), with no streaming query of its own
        assert f"started name={totals} follows=[] refreshed_by_batches_of=['{mirror}']" in log.read_text()
    finally:
        producer.close()

    st = StreamTables(spark, root=str(warehouse / "_trickle"))
    _check(spark, st, warehouse, mirror, model, totals, by_qty, "after the SIGTERM stop")
    dead = spark.read.format("delta").load(str(warehouse / f"{mirror}_dead_letter")).collect()
    assert len(dead) == model.malformed, (len(dead), model.malformed)
    assert len({(r["partition"], r["offset"]) for r in dead}) == len(dead), "a dead letter was recorded twice"


def _wait_for(cond: Any, job: subprocess.Popen[bytes], log: Path, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while not cond():
        assert job.poll() is None, f"the job exited: {log.read_text()[-3000:]}"
        assert time.time() < deadline, f"timed out waiting for the job: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def _register(spark: Any, warehouse: Path, mirror: str) -> None:
    """Name the job's mirror in the test's session, once the job created it (a CREATE TABLE ... LOCATION
    over a path without a Delta log would create an empty table there, under the job's feet)."""
    from connectors.delta_log import DeltaLog

    if DeltaLog(spark, str(warehouse / mirror)).latest_version() is None:
        raise AssertionError(f"the job has not created the mirror {mirror} yet")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {mirror} USING delta LOCATION '{(warehouse / mirror).as_posix()}'")


def _check(spark: Any, st: Any, warehouse: Path, mirror: str, model: Model, totals: str, by_qty: str,
           where: str) -> None:
    _register(spark, warehouse, mirror)
    actual = [tuple(r) for r in spark.read.format("delta").load(str(warehouse / mirror)).collect()]
    missing, extra = compare_rows(list(model.rows.values()), actual)
    assert not missing and not extra, f"{where}: mirror differs from the source\n" + format_diff(
        mirror, [c for c, _ in COLUMNS], missing, extra, len(model.rows), len(actual))
    for name in (totals, by_qty):
        assert_matches(spark, st, name, st.catalog.get(name).query, where)


def _wait_caught_up(spark: Any, warehouse: Path, mirror: str, model: Model, totals: str, by_qty: str,
                    job: subprocess.Popen[bytes], log: Path, kafka: Any, timeout_s: float = 240) -> None:
    """Poll until mirror and both stream tables are equal to the model / their queries (or fail with the
    last difference): the job is eventually consistent, and only its own log says when it is done."""
    from pipeline import StreamTables

    deadline = time.time() + timeout_s
    last: AssertionError | None = None
    while time.time() < deadline:
        assert job.poll() is None, f"the job exited: {log.read_text()[-3000:]}"
        try:
            st = StreamTables(spark, root=str(warehouse / "_trickle"))
            _check(spark, st, warehouse, mirror, model, totals, by_qty, "catching up")
            return
        except (AssertionError, Exception) as e:  # noqa: BLE001 - tables may not exist yet
            last = e if isinstance(e, AssertionError) else AssertionError(f"{type(e).__name__}: {e}")
        time.sleep(2)
    state = "running" if kafka.is_running() else f"NOT running:\n{kafka._diagnostics()}"  # noqa: SLF001
    raise AssertionError(f"the job did not catch up in {timeout_s} s: {last}\n{_events(log)}\nthe broker is {state}")


def _events(log: Path, n: int = 80) -> str:
    """The job's own lines without the NO_DATA refreshes that fill a stalled run's log, so a failure shows
    what the job did (starts, errors, restarts, sources going DOWN and UP, refreshes that wrote rows)."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines()
             if ln[:4].isdigit() and "-" in ln[:8] and ": NO_DATA (" not in ln]
    return "\n".join(ln[:400] for ln in lines[-n:])


def test_kill_9_at_random_points_loses_and_doubles_nothing(spark: Any, broker: Any, unique_name: Any,  # noqa: F811
                                                           tmp_path: Path) -> None:
    _run_crash_test(spark, broker, unique_name, tmp_path, kills=5, seed=int(os.environ.get("TRICKLE_CRASH_SEED",
                                                                                             "5")))


@pytest.mark.slow
def test_kill_9_many_times(spark: Any, broker: Any, unique_name: Any, tmp_path: Path) -> None:  # noqa: F811
    _run_crash_test(spark, broker, unique_name, tmp_path, kills=15, seed=int(os.environ.get("TRICKLE_CRASH_SEED",
                                                                                              "55")))
