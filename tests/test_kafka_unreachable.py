"""``trickle run`` against Kafka brokers that do not answer must say so, not look healthy (issue 15 item 5).

Spark's Kafka source does not fail when no broker answers: it retries its offset fetch (3 x 60 s with
Kafka's default timeouts) while the pipeline logs "ingesting" and NO_DATA refreshes, and stopping it then
waited minutes, ending with an uncaught py4j exception in a JVM shutdown hook. These tests run the CLI as
users run it, as a subprocess in its own process group, and check:

* a Kafka source whose port nobody listens on fails ``trickle run`` at once, naming the source, the servers
  and the topic (exit status 2);
* a "broker" that accepts connections but never answers fails it once the start-up probe's timeout passed;
* a real broker (``services/kafka.py``) killed while the pipeline runs makes its source DOWN within seconds
  (an error line, and ``trickle_sources.json`` for ``trickle status``), and SIGINT to the process group
  (Ctrl-C) then stops the job within the bound README gives (30 s), exit 0, without a traceback or a py4j
  error.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_env import short_lived_jvm

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: pipeline.runtime's PROBE_TIMEOUT_S and STALL_SECONDS, as README documents them (spelled out, so that
#: these tests also run, and fail on their assertions, against code without them).
PROBE_TIMEOUT_S = 10.0
STALL_SECONDS = 15.0
#: README ("Stopping"): the wait after a stop signal is bounded by Hadoop's shutdown-hook timeout, 30 s.
STOP_BOUND_S = 30.0
#: What must never show in the output of a job stopped cleanly.
CRASH_MARKERS = ("Traceback", "Py4JException", "Py4JError", "Py4JJavaError", "Uncaught exception")


def _free_port() -> int:
    """A port nothing listens on (bound, then released: connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(tmp: Path, bootstrap: str, topic: str) -> Path:
    conf = tmp / "pipeline.yaml"
    conf.write_text(f"""
spark:
  spark.sql.shuffle.partitions: 1
  spark.default.parallelism: 1
  spark.driver.memory: 1g
warehouse: warehouse
checkpoints: checkpoints
sources:
  - name: ku_orders
    kind: kafka
    topic: {topic}
    bootstrap_servers: "{bootstrap}"
    columns: {{id: BIGINT, amount: INT}}
    key: id
    trigger_seconds: 0.5
stream_tables:
  - name: ku_totals
    refresh_mode: DIFFERENTIAL
    schedule: 2s
    query: SELECT COUNT(*) AS n, SUM(amount) AS total FROM ku_orders
runtime:
  tick_seconds: 0.5
""")
    return conf


def _env() -> dict[str, str]:
    return short_lived_jvm({**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *args]


def _run_to_exit(conf: Path, timeout_s: float) -> tuple[int, str, float]:
    """Run ``trickle run conf`` until it exits; its status, output and duration."""
    started = time.monotonic()
    p = subprocess.Popen(_cli("run", str(conf)), cwd=PROJECT_ROOT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"trickle run still running after {timeout_s:.0f} s:\n{out.decode(errors='replace')[-3000:]}")
    return p.returncode, out.decode(errors="replace"), time.monotonic() - started


def test_port_nobody_listens_on_fails_at_once(tmp_path: Path) -> None:
    servers = f"127.0.0.1:{_free_port()}"
    rc, out, took = _run_to_exit(_conf(tmp_path, servers, "shop.public.ku_orders"), timeout_s=60)
    assert rc == 2, f"exit status {rc}, want 2:\n{out[-3000:]}"
    assert took < 60, took
    for what in ("ku_orders", servers, "shop.public.ku_orders", "pipeline.yaml", "Connection refused"):
        assert what in out, f"{what!r} missing from:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A port that accepts TCP connections and never answers (a hung broker, or a non-Kafka service)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    done.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_broker_that_does_not_answer_fails_at_start(tmp_path: Path, silent_broker: str) -> None:
    """The TCP check passes; the start-up probe (Kafka's admin client, in the JVM) must fail the start. The
    bound includes the JVM's start-up on a loaded 2-core machine; the probe's own share is checked apart."""
    rc, out, took = _run_to_exit(_conf(tmp_path, silent_broker, "shop.public.ku_orders"), timeout_s=150)
    assert rc == 2, f"exit status {rc}, want 2:\n{out[-3000:]}"
    for what in ("ku_orders", silent_broker, "shop.public.ku_orders", "TimeoutException"):
        assert what in out, f"{what!r} missing from:\n{out[-3000:]}"
    asked = re.search(r"asked for ([0-9.]+) s", out)
    assert asked is not None and float(asked.group(1)) <= PROBE_TIMEOUT_S + 5, out[-3000:]
    assert "ingesting" not in out, "no ingestion query may start before the brokers answered"
    assert "Traceback" not in out, out[-3000:]


def test_broker_going_away_is_reported_and_sigint_stops_promptly(tmp_path: Path) -> None:
    """Two checks on one run (a JVM start costs ~30 s here), both reported when both fail: the source goes
    DOWN soon after its broker is killed, and Ctrl-C then stops the job within the bound, cleanly."""
    from services.kafka import KafkaBroker

    broker = KafkaBroker(tmp_path / "kafka").start()
    job: subprocess.Popen[bytes] | None = None
    log = tmp_path / "job.log"
    problems: list[str] = []
    try:
        topic = "shop.public.ku_orders"
        broker.create_topic(topic)
        conf = _conf(tmp_path, broker.bootstrap, topic)
        with open(log, "wb") as out:
            job = subprocess.Popen(_cli("run", str(conf)), cwd=PROJECT_ROOT, env=_env(), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def seen(pattern: str, timeout_s: float) -> bool:
            deadline = time.monotonic() + timeout_s
            while not re.search(pattern, log.read_text(errors="replace")):
                assert job is not None and job.poll() is None, f"the job exited:\n{log.read_text()[-3000:]}"
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
            return True

        assert seen(r" running conf=", 240), f"the job did not start:\n{log.read_text()[-3000:]}"
        time.sleep(3)  # a few micro-batches against the live broker
        assert "is DOWN" not in log.read_text()
        broker.kill()
        if not seen(r"source ku_orders is DOWN", STALL_SECONDS + 30):
            problems.append(f"no 'source ku_orders is DOWN' within {STALL_SECONDS + 30:.0f} s of killing the broker")
        else:
            state = json.loads((tmp_path / "checkpoints" / "trickle_sources.json").read_text())
            if [(s["name"], s["status"]) for s in state["sources"]] != [("ku_orders", "DOWN")]:
                problems.append(f"trickle_sources.json does not say DOWN: {state}")

        signalled = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)  # Ctrl-C: the whole process group
        try:
            rc: int | None = job.wait(STOP_BOUND_S + 30)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - signalled
        text = log.read_text(errors="replace")
        if rc != 0:
            problems.append(f"exit status {rc} after SIGINT, want 0")
        if took > STOP_BOUND_S:
            problems.append(f"{took:.1f} s to stop after SIGINT, bound {STOP_BOUND_S:.0f} s")
        problems += [f"{m!r} in the output" for m in CRASH_MARKERS if m in text]
        if rc == 0:
            final = json.loads((tmp_path / "checkpoints" / "trickle_sources.json").read_text())
            if [s["status"] for s in final["sources"]] != ["STOPPED"]:
                problems.append(f"trickle_sources.json not STOPPED after the stop: {final}")
        assert not problems, "; ".join(problems) + f"\n{text[-4000:]}"
    finally:
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
        broker.stop()


class _Reader:
    """A Kafka batch read whose first ``failures`` loads fail as Spark's does while the broker does not serve a
    fresh topic's partition yet (the CI race: Debezium had just created the topic)."""

    def __init__(self, failures: int, error: str = "UnknownTopicOrPartitionException: This server does not "
                 "host this topic-partition.") -> None:
        self.failures, self.error, self.loads = failures, error, 0

    def load(self) -> _Reader:
        self.loads += 1
        if self.loads <= self.failures:
            raise RuntimeError(f"An error occurred while calling o1.collectToPython.\n: {self.error}")
        return self

    def selectExpr(self, *_: str) -> _Reader:  # noqa: N802 - Spark's name
        return self

    def where(self, _: str) -> _Reader:
        return self

    def orderBy(self, *_: Any, **__: Any) -> _Reader:  # noqa: N802 - Spark's name
        return self

    def first(self) -> dict[str, str]:
        return {"k": "key", "v": "value"}


def test_schema_discovery_waits_for_a_topic_the_broker_does_not_serve_yet(monkeypatch: Any) -> None:
    from connectors import kafka_mirror
    from connectors.debezium import DecodeError

    monkeypatch.setattr(kafka_mirror.time, "sleep", lambda _: None)
    reader = _Reader(failures=2)
    assert kafka_mirror._newest_with_schema(reader, "t") == {"k": "key", "v": "value"} and reader.loads == 3
    with pytest.raises(RuntimeError, match="SomethingElse"):  # any other failure is not waited out
        kafka_mirror._newest_with_schema(_Reader(1, "SomethingElse"), "t")
    monkeypatch.setattr(kafka_mirror, "NOT_SERVED_WAIT_S", 0.0)
    with pytest.raises(DecodeError, match=r"within 0 s \(UnknownTopicOrPartitionException: This server does not host"):
        kafka_mirror._newest_with_schema(_Reader(5), "t")
