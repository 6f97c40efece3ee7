"""Executors in other processes: the demo and a Kafka-fed IMMEDIATE table through ``spark-submit``.

The master is ``local-cluster[1,2,1024]``: a standalone master and a worker inside the driver's JVM, the
worker starting an executor as a JVM of its own (two cores: the Kafka topic's two partitions are decoded
side by side), with its own Python workers (the Kafka events are decoded by ``mapInArrow`` there). One
executor proves what these tests are about, code that reaches another process only through the shipped
zip; a second one started another JVM, fetched every jar again and proved nothing more (shuffles between
executors are Spark's own business). The code reaches them the way the README's "Deploying on a cluster" says:
the wheel of ``pip wheel .`` given to ``--py-files`` as a zip. Driver, executors and Python workers run an
interpreter that has the dependencies but not spark-trickle (``cluster_env.deps_only_python``), in a
folder outside the repository, with no PYTHONPATH: the job can only import the package from the zip.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_env import (
    PROJECT_ROOT,
    build_wheel,
    clean_env,
    deps_only_python,
    short_lived_jvm,
    spark_home,
    submit_jars,
)
from oracle import compare_rows, format_diff

MASTER = "local-cluster[1,2,1024]"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The zip to ship, the interpreter without the package, a SPARK_HOME and the entry script, all in a
    temporary folder."""
    work = tmp_path_factory.mktemp("cluster")
    wheel = build_wheel(work)
    zipped = work / "spark_trickle.zip"  # Python workers put only .zip/.egg/.jar py-files on sys.path
    shutil.copy(wheel, zipped)
    job = work / "trickle_job.py"
    shutil.copy(PROJECT_ROOT / "trickle_job.py", job)
    python = deps_only_python(work)
    probe = subprocess.run([str(python), "-c", "import pipeline"], cwd=work, env=clean_env(),
                           capture_output=True, text=True)
    assert "No module named 'pipeline'" in probe.stderr, "the executors' interpreter must not see the repo"
    return {"work": work, "zip": zipped, "job": job, "python": python, "home": spark_home(work)}


def _submit(shipped: dict[str, Any], args: list[str], log: Path) -> subprocess.Popen[bytes]:
    home = shipped["home"]
    cmd = [str(home / "bin" / "spark-submit"), "--master", MASTER,
           "--driver-memory", "2g", "--executor-memory", "1g",
           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
           "--conf", "spark.driver.extraJavaOptions=-Xss16m",
           # tens of rows: one partition per shuffle and snapshot, no code generation (as tests/conftest.py)
           "--conf", "spark.sql.shuffle.partitions=1", "--conf", "spark.default.parallelism=2",
           "--conf", "spark.databricks.delta.snapshotPartitions=1",
           "--conf", "spark.sql.codegen.wholeStage=false", "--conf", "spark.sql.codegen.factoryMode=NO_CODEGEN",
           *submit_jars(), "--py-files", str(shipped["zip"]), str(shipped["job"]), *args]
    env = short_lived_jvm(clean_env(SPARK_HOME=str(home), PYSPARK_PYTHON=str(shipped["python"]),
                                    PYSPARK_DRIVER_PYTHON=str(shipped["python"])))
    with log.open("wb") as sink:  # the child keeps its own handle
        return subprocess.Popen(cmd, cwd=shipped["work"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _executors_started(log_text: str) -> int:
    """How many executors the standalone worker launched (each one a JVM of its own)."""
    return log_text.count("Launching executor")


def test_demo_through_spark_submit_on_a_cluster(shipped: dict[str, Any], tmp_path: Path) -> None:
    from deltalake import DeltaTable

    log = tmp_path / "demo.log"
    proc = _submit(shipped, ["demo", "--warehouse", str(tmp_path / "wh"), "--log-level", "INFO"], log)
    rc = proc.wait(timeout=600)
    out = log.read_text(errors="replace")
    assert rc == 0, f"the demo failed on {MASTER} (exit {rc}):\n{out[-4000:]}"
    assert _executors_started(out) >= 1, f"no executors in other processes:\n{out[-2000:]}"
    # the demo's own oracle: each stream table against its query recomputed over the sources
    verdicts = [ln for ln in out.splitlines() if ln.startswith(("department_tree:", "department_stats:",
                                                                 "department_report:"))]
    assert verdicts == ["department_tree: yes", "department_stats: yes", "department_report: yes"], verdicts
    # and the tutorial's final numbers, read back from the Delta table by another engine (delta-rs)
    report = DeltaTable(str(tmp_path / "wh" / "_trickle" / "tables" / "department_report")).to_pyarrow_table()
    rows = {(r["division"], r["total_headcount"], Decimal(r["total_payroll"]))
            for r in report.select(["division", "total_headcount", "total_payroll"]).to_pylist()}
    assert rows == {("R&D", 4, Decimal("465000.00")), ("Sales", 2, Decimal("185000.00")),
                    ("Operations", 1, Decimal("100000.00"))}


QUERY = "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders WHERE qty IS NOT NULL GROUP BY customer"


def _expected(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """QUERY over the source rows (id, customer, amount, qty), computed in Python: the oracle."""
    total: dict[Any, Any] = {}
    n: Counter[Any] = Counter()
    for _id, customer, amount, qty in rows:
        if qty is None:
            continue
        n[customer] += 1
        if amount is not None:
            total[customer] = total.get(customer, Decimal(0)) + amount
    return [(c, total.get(c), n[c]) for c in n]


def _table_rows(path: Path, columns: list[str]) -> list[tuple[Any, ...]] | None:
    """The table's rows read with delta-rs (no Spark in the test process), None before its first commit."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(path)).to_pyarrow_table(columns=columns)
    except TableNotFoundError:
        return None
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


def _wait_for(path: Path, columns: list[str], expected: list[tuple[Any, ...]], proc: subprocess.Popen[bytes],
              log: Path, what: str, limit_s: float = 420) -> None:
    """Wait until the table equals ``expected`` (as multisets); fail with the difference if the job dies
    or ``limit_s`` passes first (a hung job, not a performance bound)."""
    deadline = time.monotonic() + limit_s
    actual: list[tuple[Any, ...]] | None = None
    while time.monotonic() < deadline:
        actual = _table_rows(path, columns)
        if actual is not None and not any(compare_rows(expected, actual)):
            return
        assert proc.poll() is None, f"the job exited ({proc.returncode}) {what}:\n{log.read_text()[-4000:]}"
        time.sleep(2)
    missing, extra = compare_rows(expected, actual or [])
    pytest.fail(f"{what}: {path.name} differs after {limit_s:.0f} s\n"
                + format_diff(path.name, columns, missing, extra, len(expected), len(actual or [])))


def test_kafka_immediate_table_through_spark_submit_on_a_cluster(
    shipped: dict[str, Any], broker: Any, tmp_path: Path
) -> None:
    from kafka import KafkaProducer
    from test_kafka_e2e import COLUMNS, Model

    topic = f"shop.public.orders_{os.getpid()}"
    broker.create_topic(topic, partitions=2)
    model = Model(seed=11, topic=topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    model.snapshot(30)
    model.round(40)
    model.flush(producer)

    warehouse = tmp_path / "wh"
    conf = {
        # every micro-batch is decoded by mapInArrow in the executors' Python workers, none on the driver
        # (by default a small batch is decoded on the driver, and the executors would import nothing)
        "spark": {"trickle.ingest.driverBelowRows": 0},
        "warehouse": str(warehouse),
        "checkpoints": str(tmp_path / "checkpoints"),
        "sources": [{"name": "orders", "kind": "kafka", "topic": topic, "bootstrap_servers": broker.bootstrap,
                     "columns": [{"name": c, "type": t} for c, t in COLUMNS], "key": ["id"],
                     "starting_offsets": "earliest", "trigger_seconds": 1}],
        "stream_tables": [{"name": "customer_totals", "refresh_mode": "IMMEDIATE", "query": QUERY}],
    }
    conf_file = tmp_path / "pipeline.yaml"
    conf_file.write_text(yaml.safe_dump(conf, sort_keys=False))
    log = tmp_path / "run.log"
    proc = _submit(shipped, [str(conf_file), "--log-level", "INFO"], log)
    mirror, table = warehouse / "orders", warehouse / "_trickle" / "tables" / "customer_totals"
    names = [c for c, _ in COLUMNS]
    try:
        _wait_for(mirror, names, list(model.rows.values()), proc, log, "after the first events")
        _wait_for(table, ["customer", "total", "n"], _expected(list(model.rows.values())), proc, log,
                  "after the first events")
        model.round(60)  # changes while the job runs: updates, deletes, key changes, a redelivery
        model.flush(producer)
        _wait_for(mirror, names, list(model.rows.values()), proc, log, "after the second round")
        _wait_for(table, ["customer", "total", "n"], _expected(list(model.rows.values())), proc, log,
                  "after the second round")
    finally:
        producer.close()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # the JVM of spark-submit: trickle stops, then exits 143
        rc = proc.wait(timeout=120)
    out = log.read_text(errors="replace")
    assert rc in (0, 143), f"the job did not stop cleanly on SIGTERM (exit {rc}):\n{out[-3000:]}"
    assert _executors_started(out) >= 1, f"no executors in other processes:\n{out[-2000:]}"
    assert "spark_trickle.zip" in out, "the zip was not shipped with the job"
    # the events were decoded in the executors' Python workers (mapInArrow), which import connectors from
    # the zip: their interpreter has no other copy
    (app,) = re.findall(r"Connected to Spark cluster with app ID (app-[\d-]+)", out)
    logs = sorted((shipped["home"] / "work" / app).glob("*/stderr"))
    decoded = [p for p in logs if "MapInBatchEvaluator" in p.read_text(errors="replace")]
    assert decoded, f"no executor of {app} ran a Python worker: {logs}"
