"""Real Debezium: PostgreSQL (services/postgres.py) -> Kafka Connect + Debezium (services/connect.py) -> Kafka
(services/kafka.py) -> ``connectors.debezium.decode``.

Why these tests exist: the decoder's unit tests use hand-written events; only the real connector shows what
Debezium 3.6 with pgoutput and the JsonConverter really emits for each kind of change -- snapshot reads,
inserts, updates, deletes and their tombstones, primary-key changes (a delete, a tombstone and a create)
and truncates (which Debezium skips unless told not to) -- and that the harness's graceful stop keeps the
offsets, so a restarted worker resumes without a second snapshot and without losing changes made while it
was down. No Spark is started here (no fixture of conftest.py that needs it is requested).

Cost: one broker for the module, one PostgreSQL and one Connect worker per test; about 45 s for the module on
the 2-core test machine, plus about a minute once when the Connect/Debezium jars are fetched with Maven.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from connectors.debezium import ChangeEvent, SourceSchema, decode, decode_key
from services.connect import KafkaConnect, debezium_postgres_connector, debezium_topic
from services.kafka import KafkaBroker
from services.postgres import PostgresServer

COLUMNS = "id int PRIMARY KEY, name text, amount numeric(10,2), created timestamp, active boolean, note text"
SCHEMA = SourceSchema(
    columns=(
        ("id", "INT"),
        ("name", "STRING"),
        ("amount", "DECIMAL(10,2)"),
        ("created", "TIMESTAMP"),
        ("active", "BOOLEAN"),
        ("note", "STRING"),
    ),
    key=("id",),
)
ROW1 = (1, "alpha", Decimal("12.50"), datetime(2024, 1, 31, 10, 15, 30, 123456), True, None)
ROW2 = (2, "beta", Decimal("-3.00"), datetime(2024, 2, 1), False, "x")


def _values(row: tuple[Any, ...]) -> str:
    """A row as a SQL VALUES tuple (the few Python types the tests use)."""

    def lit(v: Any) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | Decimal):
            return str(v)
        return "'" + str(v).replace("'", "''") + "'"

    return "(" + ", ".join(lit(v) for v in row) + ")"


class _TopicReader:
    """Reads one single-partition topic from the start, record by record, with kafka-python.

    No consumer group (nothing to join or commit, so no rebalance delay); the partition is assigned once
    the worker has created the topic."""

    def __init__(self, bootstrap: str, topic: str, timeout_s: float = 60) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        deadline = time.monotonic() + timeout_s
        while not self.consumer.partitions_for_topic(topic):
            if time.monotonic() >= deadline:
                self.consumer.close()
                raise AssertionError(f"topic {topic} was not created within {timeout_s} s")
            time.sleep(0.2)
        tp = TopicPartition(topic, 0)
        self.consumer.assign([tp])
        self.consumer.seek_to_beginning(tp)
        self.pending: list[Any] = []

    def read(self, n: int, timeout_s: float = 60) -> list[Any]:
        """The next n records, in offset order; fails if fewer arrive in time."""
        deadline = time.monotonic() + timeout_s
        while len(self.pending) < n and time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=200).values():
                self.pending.extend(records)
        got, self.pending = self.pending[:n], self.pending[n:]
        assert len(got) == n, f"expected {n} records, got {len(got)}: {[(r.key, r.value) for r in got]}"
        return got

    def assert_no_more(self, wait_s: float = 1.5) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=200).values():
                self.pending.extend(records)
        assert not self.pending, f"unexpected records: {[(r.key, r.value) for r in self.pending]}"

    def close(self) -> None:
        self.consumer.close()


def _decode_all(records: list[Any]) -> list[ChangeEvent | None]:
    """Decode each record; the Kafka key must name the same row as the event (None for a truncate)."""
    events = []
    for r in records:
        e = decode(r.key, r.value, SCHEMA)
        if e is not None and e.op != "t":
            assert decode_key(r.key, SCHEMA) == e.key
        elif e is not None:
            assert r.key is None
        events.append(e)
    return events


def _summary(events: list[ChangeEvent | None]) -> list[tuple[str, Any, Any] | None]:
    return [None if e is None else (e.op, e.key, e.row) for e in events]


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path / "pg", database="shop")
    try:
        yield server.start()
    finally:
        server.destroy()


def test_postgres_server_sql_and_crash_restart(tmp_path: Path) -> None:
    """The harness's own contract: text round trip (NULL apart from ''), a kill -9 keeps committed rows
    (synchronous_commit stays on), a restart on the same workdir keeps the port, destroy() cleans up."""
    workdir = tmp_path / "pg"
    pg = PostgresServer(workdir)
    try:
        pg.start()
        assert pg.query("SELECT current_setting('wal_level')") == [("logical",)]
        pg.execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text);"
            "INSERT INTO t VALUES (1, NULL), (2, ''), (3, E'tab\\there\\nnew line \\\\ back');"
        )
        rows = pg.query("SELECT id, v FROM t ORDER BY id")
        assert rows == [("1", None), ("2", ""), ("3", "tab\there\nnew line \\ back")]
        port, pid = pg.port, pg.pid
        pg.kill()
        assert pg.pid is None
        restarted = PostgresServer(workdir)
        assert restarted.port == port
        pg = restarted
        pg.start()
        assert pg.pid != pid
        assert pg.query("SELECT count(*) FROM t") == [("3",)]
    finally:
        pg.destroy()
    assert not pg.data_dir.exists() and not (workdir / "data").exists()


def test_snapshot_then_every_kind_of_change(tmp_path: Path, pg: PostgresServer, broker: KafkaBroker) -> None:
    pg.execute(f"CREATE TABLE orders ({COLUMNS}); INSERT INTO orders VALUES {_values(ROW1)}, {_values(ROW2)};")
    config = debezium_postgres_connector(pg, "kinds", ["orders"])
    assert config["skipped.operations"] == "none" and config["plugin.name"] == "pgoutput"
    connect = KafkaConnect(tmp_path / "connect", broker.bootstrap, config)
    reader = None
    try:
        connect.start()
        assert connect.status()["connector"]["state"] == "RUNNING"
        assert "COMPLETED" in connect.wait_for_snapshot()
        reader = _TopicReader(broker.bootstrap, debezium_topic("kinds", "orders"))

        snapshot = _decode_all(reader.read(2))
        assert all(e is not None and e.op == "r" for e in snapshot)
        assert sorted(e.row for e in snapshot if e is not None) == [ROW1, ROW2]

        # One transaction per statement, so each change has its own commit.
        row3 = (3, "gamma", Decimal("0.01"), datetime(2024, 3, 1, 12, 0, 0, 500000), None, "y")
        pg.execute(
            f"INSERT INTO orders VALUES {_values(row3)};\n"
            "UPDATE orders SET amount = 13.75, note = 'it''s set' WHERE id = 1;\n"
            "DELETE FROM orders WHERE id = 2;\n"
            "UPDATE orders SET id = 4 WHERE id = 3;\n"
            "TRUNCATE orders;\n"
        )
        events = _decode_all(reader.read(8))
        row1_updated = (*ROW1[:2], Decimal("13.75"), ROW1[3], True, "it's set")
        assert _summary(events) == [
            ("c", (3,), row3),
            ("u", (1,), row1_updated),
            ("d", (2,), None),
            None,  # the delete's tombstone
            ("d", (3,), None),  # a primary-key change: delete of the old key, its tombstone, create of the new
            None,
            ("c", (4,), (4, *row3[1:])),
            ("t", None, None),
        ]
        changes = [e for e in events if e is not None]
        assert all(e.position[0] > 0 and e.ts_ms is not None for e in changes)
        lsns = [e.position[0] for e in changes]
        assert lsns == sorted(lsns)  # Kafka offset order is commit (LSN) order
        reader.assert_no_more()
    finally:
        if reader is not None:
            reader.close()
        connect.stop()
    assert not connect.is_running()
    assert "Kafka Connect started" in connect.log_file.read_text()  # logging binding on the classpath


def test_graceful_restart_resumes_from_offsets(tmp_path: Path, pg: PostgresServer, broker: KafkaBroker) -> None:
    pg.execute(f"CREATE TABLE orders ({COLUMNS}); INSERT INTO orders VALUES {_values(ROW1)};")
    config = debezium_postgres_connector(pg, "restart", ["public.orders"])
    workdir = tmp_path / "connect"
    connect = KafkaConnect(workdir, broker.bootstrap, config)
    reader = None
    try:
        connect.start()
        connect.wait_for_snapshot()
        reader = _TopicReader(broker.bootstrap, debezium_topic("restart", "public.orders"))
        assert _summary(_decode_all(reader.read(1))) == [("r", (1,), ROW1)]
        pg.execute(f"INSERT INTO orders VALUES {_values(ROW2)};")
        assert _summary(_decode_all(reader.read(1))) == [("c", (2,), ROW2)]
        connect.stop()  # SIGTERM: the task stops and its offsets are flushed
        assert connect.offsets_file.is_file()

        # Changes made while the worker is down stay in the replication slot.
        pg.execute("UPDATE orders SET active = NULL WHERE id = 2; DELETE FROM orders WHERE id = 1;")
        restarted = KafkaConnect(workdir, broker.bootstrap, config)
        assert restarted.rest_port == connect.rest_port  # connect.json keeps the address
        connect = restarted
        connect.start()
        assert "SKIPPED" in connect.wait_for_snapshot()  # offsets say the snapshot was done: no second one
        events = _decode_all(reader.read(3))
        assert _summary(events) == [("u", (2,), (*ROW2[:4], None, ROW2[5])), ("d", (1,), None), None]
        reader.assert_no_more()  # nothing delivered twice after a graceful stop
    finally:
        if reader is not None:
            reader.close()
        connect.stop()
