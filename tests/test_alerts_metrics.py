"""Metrics and alerts of ``trickle run`` (issue 19 point 5), against real parts: a running Runtime over a real
Kafka broker and Delta sources, its ``/metrics`` scraped over HTTP and parsed with prometheus_client's
parser, and its alerts received by a local ``http.server``: a table going to ERROR, a staleness breach and
a dead-lettered event, each exactly once."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pipeline.alerts import DEAD_LETTER, STALENESS, TABLE_ERROR, Alerter, table_alerts


class Hook:
    """A local webhook: every POSTed JSON body is kept, in order."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.cond:
                    hook.received.append(json.loads(body))
                    hook.cond.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kinds(self) -> list[tuple[str, str]]:
        with self.cond:
            return [(a["alert"], a["subject"]) for a in self.received]

    def wait_for(self, wanted: set[tuple[str, str]], timeout_s: float) -> set[tuple[str, str]]:
        """The wanted (alert, subject) pairs still missing after at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                missing = wanted - {(a["alert"], a["subject"]) for a in self.received}
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self.cond.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------- without Spark


def test_alerts_fire_once_per_transition_and_a_dead_webhook_stops_nothing(hook: Hook) -> None:
    lines: list[str] = []
    alerter = Alerter(hook.url, write=lines.append)
    row = {"name": "t", "status": "ERROR", "consecutive_errors": 3, "last_error": "boom", "staleness_s": 0.0}
    assert [a["alert"] for a in table_alerts(alerter, row, 60.0)] == [TABLE_ERROR]
    assert table_alerts(alerter, row, 60.0) == []  # still ERROR: no second alert
    assert table_alerts(alerter, {**row, "status": "ACTIVE", "staleness_s": 61.0}, 60.0)[0]["alert"] == STALENESS
    assert [a["alert"] for a in table_alerts(alerter, row, 60.0)] == [TABLE_ERROR]  # re-armed, fired again
    assert table_alerts(alerter, {**row, "name": "s", "status": "SUSPENDED", "staleness_s": 99.0}, 60.0) == []
    assert not hook.wait_for({(TABLE_ERROR, "t"), (STALENESS, "t")}, 10)
    alerter.flush()
    assert hook.kinds() == [(TABLE_ERROR, "t"), (STALENESS, "t"), (TABLE_ERROR, "t")]
    logged = [json.loads(line) for line in lines]  # structured: one JSON object per line
    assert [(d["event"], d["alert"], d["table"]) for d in logged] == [
        ("alert", TABLE_ERROR, "t"), ("alert", STALENESS, "t"), ("alert", TABLE_ERROR, "t")]
    assert "trickle alter t --status ACTIVE" in logged[0]["message"]

    errors: list[str] = []
    dead = Alerter(f"http://127.0.0.1:{_free_port()}/nobody", write=lines.append, error=errors.append)
    assert dead.check(TABLE_ERROR, "u", True, table="u") is not None  # returns at once; delivery fails aside
    dead.flush()
    assert len(errors) == 1 and "cannot deliver alert table_error of u" in errors[0], errors


# ------------------------------------------------------------------------------------------ with Spark


def _flat_event(i: int) -> tuple[bytes, bytes]:
    value = {"id": i, "customer": f"c{i % 2}", "__op": "c", "__lsn": 1000 + i, "__source_ts_ms": 1_700_000_000_000,
             "__deleted": "false"}
    return json.dumps({"id": i}).encode(), json.dumps(value).encode()


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_run_serves_metrics_and_posts_alerts(spark: Any, broker: Any, hook: Hook, make_source: Any,
                                             unique_name: Any, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    from pipeline import StreamTables
    from pipeline.cli import _Logger
    from pipeline.conf import load_conf
    from pipeline.runtime import SOURCES_STATUS_FILE, Runtime

    topic, mirror = unique_name("shop.public.orders"), unique_name("orders")
    items, gone = make_source("items", "id INT, v INT", rows=[(1, 1)]), make_source("gone", "id INT", rows=[(1,)])
    counts, stale, broken = unique_name("counts"), unique_name("stale"), unique_name("broken")
    broker.create_topic(topic, partitions=2)  # two partitions: the lag sums them
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(1, 4):
        producer.send(topic, key=_flat_event(i)[0], value=_flat_event(i)[1])
    producer.send(topic, key=b'{"id": 9}', value=b"this is no change event")  # -> the dead-letter table
    producer.flush()
    port = _free_port()
    conf_file = tmp_path / "pipeline.yaml"
    conf_file.write_text(f"""
sources:
  - name: {mirror}
    kind: kafka
    topic: {topic}
    bootstrap_servers: "{broker.bootstrap}"
    columns: {{id: BIGINT, customer: STRING}}
    key: id
    trigger_seconds: 0.5
  - {{name: {items}, kind: delta}}
  - {{name: {gone}, kind: delta}}
checkpoints: ckpt
stream_tables:
  - {{name: {counts}, query: "SELECT customer, COUNT(*) AS n FROM {mirror} GROUP BY customer", schedule: 1s}}
  - {{name: {stale}, query: "SELECT SUM(v) AS total FROM {items}", schedule: 1h, max_staleness: 1s}}
  - {{name: {broken}, query: "SELECT id FROM {gone}", schedule: 1s}}
runtime:
  tick_seconds: 0.5
  max_consecutive_errors: 1
  retry_backoff_seconds: 0.2
  metrics_port: {port}
  alert_webhook: {hook.url}
""")
    st = StreamTables(spark, root=str(tmp_path / "trickle"))
    runtime = Runtime(st, load_conf(conf_file), _Logger(json_lines=False), tmp_path)
    stop = threading.Event()
    loop = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
    try:
        runtime.start_sources()
        runtime.create_stream_tables(stop)
        loop.start()
        spark.sql(f"INSERT INTO {items} VALUES (2, 2)")  # the 1h table is behind from now on
        spark.sql(f"DROP TABLE {gone}")  # the next refresh of `broken` fails: ERROR (max_consecutive_errors 1)
        wanted = {(TABLE_ERROR, broken), (STALENESS, stale), (DEAD_LETTER, mirror)}
        missing = hook.wait_for(wanted, 300)
        assert not missing, (missing, hook.received)

        # more looks: the conditions still hold, yet each alert came once
        runtime.observer.look()
        runtime.observer.look()
        runtime.observer.alerter.flush()
        assert sorted(hook.kinds()) == sorted(wanted), hook.received
        by_kind = {a["alert"]: a for a in hook.received}
        assert by_kind[DEAD_LETTER]["rows"] == 1 and by_kind[DEAD_LETTER]["dead_letter_table"].endswith("dead_letter")
        assert by_kind[STALENESS]["staleness_seconds"] >= 1 and by_kind[STALENESS]["max_staleness_seconds"] == 1.0  # rounded to 0.1 s
        assert "no longer exists" in str(by_kind[TABLE_ERROR]["error"]), by_kind[TABLE_ERROR]

        # the mirror's three events reach `counts`: then its refreshes and rows show in the metrics
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            m = _scrape(port)
            if m.get(("trickle_rows_applied_total", (("kind", "inserted"), ("table", counts))), 0) >= 2 and \
                    m.get(("trickle_kafka_lag_offsets", (("source", mirror),))) == 0:
                break
            time.sleep(0.5)
        assert m[("trickle_rows_applied_total", (("kind", "inserted"), ("table", counts)))] >= 2, m
        assert m[("trickle_kafka_lag_offsets", (("source", mirror),))] == 0  # four messages, all consumed
        assert m[("trickle_kafka_lag_seconds", (("source", mirror),))] == 0
        assert m[("trickle_dead_letter_rows", (("source", mirror),))] == 1
        assert m[("trickle_table_status", (("status", "ERROR"), ("table", broken)))] == 1
        assert m[("trickle_table_status", (("status", "ACTIVE"), ("table", counts)))] == 1
        assert m[("trickle_refresh_errors_total", (("table", broken),))] >= 1
        assert m[("trickle_staleness_seconds", (("table", stale),))] > 1
        assert m[("trickle_staleness_seconds", (("table", counts),))] >= 0
        refreshed = [k for k in m if k[0] == "trickle_refresh_duration_seconds_count" and ("table", counts) in k[1]]
        assert refreshed and sum(m[k] for k in refreshed) >= 1, sorted(k for k in m if "duration" in k[0])

        # the sources' status file (trickle status) carries the lag and the dead letters
        doc = json.loads((tmp_path / "ckpt" / SOURCES_STATUS_FILE).read_text())
        (src,) = doc["sources"]
        assert (src["lag_offsets"], src["lag_seconds"], src["dead_letters"]) == (0, 0.0, 1), src
    finally:
        stop.set()
        loop.join(60)
        runtime.stop()
    with pytest.raises(OSError):  # the metrics server stopped with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_the_grafana_dashboard_uses_the_metrics_the_run_serves() -> None:
    """conf/grafana-dashboard.json queries only metric names pipeline.metrics defines, and each family once."""
    import re

    from pipeline.metrics import Metrics

    m = Metrics()
    m.observe_history([{"name": "t", "action": "DIFFERENTIAL", "status": "OK", "duration_ms": 5.0, "rows_inserted": 1},
                       {"name": "t", "action": None, "status": "ERROR"}])
    m.set_table({"name": "t", "status": "ACTIVE", "staleness_s": 1.0, "consecutive_errors": 0})
    m.set_source("s", 0, 0.0, 0)
    served = {s.name for fam in m.registry.collect() for s in fam.samples}
    doc = json.loads((Path(__file__).resolve().parents[1] / "conf" / "grafana-dashboard.json").read_text())
    used = {name for p in doc["panels"] for t in p["targets"] for name in re.findall(r"trickle_[a-z_]+", t["expr"])}
    assert used and used <= served, used - served
    families = {fam.name for fam in m.registry.collect()}
    assert {n for n in families if not any(u.startswith(n) for u in used)} == set()  # every family has a panel
