"""End to end with the real client: PostgreSQL -> Debezium (Kafka Connect) -> Kafka -> the job -> stream tables.

Everything is a real process started by the test: PostgreSQL from the Debian packages (``wal_level=logical``),
a Kafka broker in KRaft mode and a Kafka Connect worker with Debezium's PostgreSQL connector (jars from
Maven Central), and the pipeline's :class:`~pipeline.runtime.Runtime` as ``trickle run`` runs it (Kafka
ingestion into Delta mirrors, an IMMEDIATE join + aggregate and a scheduled aggregate). The oracle is
PostgreSQL itself: after each round of inserts, updates (join-key and primary-key changes included),
deletes and a TRUNCATE, every stream table must equal the same query run directly in PostgreSQL, and every
mirror must equal its PostgreSQL table.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from oracle import compare_rows, format_diff

from services.connect import KafkaConnect, debezium_postgres_connector, debezium_topic
from services.kafka import KafkaBroker
from services.postgres import PostgresServer


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory,
             broker: KafkaBroker) -> Iterator[tuple[PostgresServer, KafkaBroker]]:
    """PostgreSQL for the module, and the test process's shared broker (tests/conftest.py): each test's
    Debezium topic prefix and tables are its own."""
    root = tmp_path_factory.mktemp("pg_e2e")
    pg = PostgresServer(root / "pg").start()
    try:
        yield pg, broker
    finally:
        pg.stop()
        pg.destroy()


def _typed(rows: list[tuple[str | None, ...]], types: str) -> list[tuple[Any, ...]]:
    """psql returns text; turn it into what Spark returns (i: int, d: Decimal, s: str)."""
    conv: dict[str, Callable[[str], Any]] = {"i": int, "d": Decimal, "s": str}
    return [tuple(None if v is None else conv[t](v) for v, t in zip(r, types, strict=True)) for r in rows]


def _wait_for_events(bootstrap: str, topic: str, n: int, timeout_s: float = 60) -> None:
    """Block until ``topic`` holds at least ``n`` events. Why: Debezium logs its snapshot's end when it has read
    the rows, while its producer may still be sending them (the topic is created by the first send), and a source
    that takes its columns from the events finds nothing on a topic not yet written."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        deadline, held = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            held = sum(consumer.end_offsets(parts).values()) if parts else 0
            if held >= n:
                return
            time.sleep(0.2)
        raise AssertionError(f"topic {topic} holds {held} events after {timeout_s} s, {n} expected")
    finally:
        consumer.close()


def test_postgres_debezium_kafka_to_stream_tables(spark: Any, services: Any, unique_name: Any,
                                                  tmp_path: Path) -> None:
    from pipeline import StreamTables
    from pipeline.cli import _Logger
    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime

    pg, broker = services
    rng = random.Random(17)
    customers, orders = unique_name("pg_customers"), unique_name("pg_orders")
    pg.execute(f"CREATE TABLE {customers} (id int PRIMARY KEY, name text, region text)")
    pg.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY, customer_id int, amount numeric(10,2), status text)")
    regions = ["north", "south", "east", None]
    statuses = ["new", "paid", "shipped", None]
    pg.execute(f"INSERT INTO {customers} VALUES " + ", ".join(
        f"({i}, 'c{i}', {_lit(rng.choice(regions))})" for i in range(1, 9)))
    next_order = 1

    def order_values(n: int) -> str:
        nonlocal next_order
        out = []
        for _ in range(n):
            amount = None if rng.random() < 0.1 else Decimal(rng.randrange(-1000, 90000)) / 100
            out.append(f"({next_order}, {_lit(rng.choice([*range(1, 11), None]))}, {_lit(amount)}, "
                       f"{_lit(rng.choice(statuses))})")
            next_order += 1
        return ", ".join(out)

    pg.execute(f"INSERT INTO {orders} VALUES {order_values(40)}")
    connector = debezium_postgres_connector(pg, "shop", [customers, orders])
    connect = KafkaConnect(tmp_path / "connect", broker.bootstrap, connector)
    connect.start()
    runtime: Runtime | None = None
    stop = threading.Event()
    loop: threading.Thread | None = None
    try:
        connect.wait_for_snapshot()
        by_region, by_status = unique_name("pg_by_region"), unique_name("pg_by_status")
        q_region = (f"SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total FROM {orders} o "
                    f"JOIN {customers} c ON o.customer_id = c.id GROUP BY c.region")
        q_status = f"SELECT status, COUNT(*) AS n, MAX(amount) AS top FROM {orders} GROUP BY status"
        conf_file = tmp_path / "pipeline.yaml"
        conf_file.write_text(f"""
sources:
  - name: {customers}
    kind: kafka
    topic: {debezium_topic("shop", customers)}
    bootstrap_servers: "{broker.bootstrap}"
    columns: {{id: INT, name: STRING, region: STRING}}
    key: id
    trigger_seconds: 0.5
  - name: {orders}
    kind: kafka
    topic: {debezium_topic("shop", orders)}
    bootstrap_servers: "{broker.bootstrap}"
    columns: {{id: INT, customer_id: INT, amount: "DECIMAL(10,2)", status: STRING}}
    key: id
    trigger_seconds: 0.5
checkpoints: ckpt
stream_tables:
  - name: {by_region}
    refresh_mode: IMMEDIATE
    query: {q_region}
  - name: {by_status}
    refresh_mode: DIFFERENTIAL
    schedule: 1s
    query: {q_status}
runtime:
  tick_seconds: 0.5
""")
        st = StreamTables(spark, root=str(tmp_path / "trickle"))
        runtime = Runtime(st, load_conf(conf_file), _Logger(json_lines=False), tmp_path)
        runtime.start_sources()
        runtime.create_stream_tables(stop)
        loop = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
        loop.start()

        checks = [
            (customers, f"SELECT id, name, region FROM {customers}", "iss", True),
            (orders, f"SELECT id, customer_id, amount, status FROM {orders}", "iids", True),
            (by_region, q_region, "sid", False),
            (by_status, q_status, "sid", False),
        ]

        def converged(where: str, timeout_s: float = 150) -> None:
            """Wait until every table equals PostgreSQL's answer; fail with the last difference."""
            deadline = time.time() + timeout_s
            pending = list(checks)
            last = ""
            while pending and time.time() < deadline:
                name, sql, types, is_mirror = pending[0]
                want = _typed(pg.query(sql), types)
                df = spark.table(name) if is_mirror else st.read(name)
                got = [tuple(r) for r in df.collect()]
                missing, extra = compare_rows(want, got)
                if not missing and not extra:
                    pending.pop(0)
                    continue
                last = format_diff(name, list(df.columns), missing, extra, len(want), len(got))
                time.sleep(1)
            assert not pending, f"{where}: not equal to PostgreSQL after {timeout_s} s\n{last}"

        converged("after the snapshot")
        for rnd in range(1, 4):
            pg.execute(f"INSERT INTO {orders} VALUES {order_values(10)}")
            pg.execute(f"UPDATE {orders} SET amount = amount + 1, status = 'paid' WHERE id % 5 = {rnd}")
            pg.execute(f"UPDATE {orders} SET customer_id = {rnd + 2} WHERE id % 7 = {rnd}")  # join key
            pg.execute(f"UPDATE {orders} SET id = id + 1000 WHERE id % 11 = {rnd}")  # primary key
            pg.execute(f"DELETE FROM {orders} WHERE id % 9 = {rnd}")
            pg.execute(f"UPDATE {customers} SET region = {_lit(regions[rnd])} WHERE id = {rnd}")
            pg.execute(f"DELETE FROM {customers} WHERE id = {rnd + 5}")
            pg.execute(f"INSERT INTO {customers} VALUES ({rnd + 20}, 'new{rnd}', 'west')")
            converged(f"round {rnd}")
        pg.execute(f"TRUNCATE {orders}")
        pg.execute(f"INSERT INTO {orders} VALUES {order_values(12)}")
        converged("after TRUNCATE and new orders")
        full = [h for h in st.history(by_status, limit=50) + st.history(by_region, limit=50)
                if h.get("action") == "FULL" and "truncated" in (h.get("reason") or "")]
        assert full, "the truncate did not re-base the dependents with a FULL refresh"
        for name in (by_region, by_status):
            acts = {h.get("action") for h in st.history(name, limit=100)}
            assert "DIFFERENTIAL" in acts, (name, acts)
    finally:
        stop.set()
        if loop is not None:
            loop.join(60)
        if runtime is not None:
            runtime.stop()
        connect.stop()


def _lit(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, (int, Decimal)):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def test_a_transaction_over_two_tables_is_never_half_applied(spark: Any, services: Any, unique_name: Any,
                                                            tmp_path: Path) -> None:
    """Issue [F] point 3. With Debezium's transaction metadata (``provide.transaction.metadata``) and the
    sources' ``transaction_topic``, an order and its lines written in one PostgreSQL transaction reach two
    topics and two mirrors at different moments (the two ingestion queries run on different triggers), but
    every version the IMMEDIATE stream tables commit holds each transaction whole: no order whose line count
    differs from its lines, no line without its order. At the end both equal PostgreSQL's answer."""
    from pipeline import StreamTables
    from pipeline.cli import _Logger
    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime

    pg, broker = services
    rng = random.Random(23)
    orders, lines = unique_name("tx_orders"), unique_name("tx_lines")
    pg.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY, n_lines int)")
    pg.execute(f"CREATE TABLE {lines} (id int PRIMARY KEY, order_id int, qty int)")
    state: dict[int, list[int]] = {}  # order -> its line ids
    next_line = 1

    def transactions(n: int) -> str:
        """``n`` transactions, each keeping every order's n_lines equal to its lines: a new order with its
        lines (lines first or order first), a line added to an order, an order deleted with its lines."""
        nonlocal next_line
        out = []
        for _ in range(n):
            p = rng.random()
            if p < 0.5 or not state:
                oid = max(state, default=0) + 1
                ids = list(range(next_line, next_line + rng.randrange(1, 4)))
                next_line += len(ids)
                state[oid] = ids
                stmts = [f"INSERT INTO {lines} VALUES " + ", ".join(f"({i}, {oid}, {rng.randrange(1, 9)})" for i in ids),
                         f"INSERT INTO {orders} VALUES ({oid}, {len(ids)})"]
                if rng.random() < 0.5:
                    stmts.reverse()
            elif p < 0.8:
                oid = rng.choice(sorted(state))
                state[oid].append(next_line)
                stmts = [f"UPDATE {orders} SET n_lines = n_lines + 1 WHERE id = {oid}",
                         f"INSERT INTO {lines} VALUES ({next_line}, {oid}, {rng.randrange(1, 9)})"]
                next_line += 1
            else:
                oid = rng.choice(sorted(state))
                del state[oid]
                stmts = [f"DELETE FROM {lines} WHERE order_id = {oid}", f"DELETE FROM {orders} WHERE id = {oid}"]
            out.append("BEGIN;\n" + ";\n".join(stmts) + ";\nCOMMIT;")
        return "\n".join(out)

    pg.execute(transactions(5))
    prefix = unique_name("txshop")
    connector = debezium_postgres_connector(pg, prefix, [orders, lines],
                                            overrides={"provide.transaction.metadata": "true"})
    connect = KafkaConnect(tmp_path / "connect", broker.bootstrap, connector)
    connect.start()
    runtime: Runtime | None = None
    stop = threading.Event()
    loop: threading.Thread | None = None
    try:
        connect.wait_for_snapshot()
        whole, orphans = unique_name("tx_whole"), unique_name("tx_orphans")
        q_whole = (f"SELECT o.id, o.n_lines, COUNT(l.id) AS got FROM {orders} o "
                   f"LEFT JOIN {lines} l ON l.order_id = o.id GROUP BY o.id, o.n_lines")
        q_orphans = (f"SELECT l.order_id, COUNT(*) AS n FROM {lines} l LEFT JOIN {orders} o ON o.id = l.order_id "
                     "WHERE o.id IS NULL GROUP BY l.order_id")
        conf_file = tmp_path / "pipeline.yaml"
        conf_file.write_text(f"""
sources:
  - name: {orders}
    kind: kafka
    topic: {debezium_topic(prefix, orders)}
    transaction_topic: {prefix}.transaction
    bootstrap_servers: "{broker.bootstrap}"
    columns: {{id: INT, n_lines: INT}}
    key: id
    trigger_seconds: 0.4
  - name: {lines}
    kind: kafka
    topic: {debezium_topic(prefix, lines)}
    transaction_topic: {prefix}.transaction
    bootstrap_servers: "{broker.bootstrap}"
    columns: {{id: INT, order_id: INT, qty: INT}}
    key: id
    trigger_seconds: 1.3
checkpoints: ckpt
stream_tables:
  - name: {whole}
    refresh_mode: IMMEDIATE
    query: {q_whole}
  - name: {orphans}
    refresh_mode: IMMEDIATE
    query: {q_orphans}
runtime:
  tick_seconds: 0.5
""")
        st = StreamTables(spark, root=str(tmp_path / "trickle"))
        runtime = Runtime(st, load_conf(conf_file), _Logger(json_lines=False), tmp_path)
        runtime.start_sources()
        # the initial snapshot carries no transaction metadata (README): create the tables once both mirrors
        # hold it, so that their first version is whole too
        deadline = time.time() + 120
        while any(spark.table(t).count() != int(pg.query(f"SELECT count(*) FROM {t}")[0][0] or 0)
                  for t in (orders, lines)):
            assert time.time() < deadline, "the snapshot did not reach the mirrors"
            time.sleep(0.5)
        runtime.create_stream_tables(stop)
        loop = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
        loop.start()

        def converged(where: str, timeout_s: float = 150) -> None:
            deadline = time.time() + timeout_s
            want = _typed(pg.query(q_whole.replace("COUNT(l.id)", "COUNT(l.id)::int")), "iii")
            while True:
                got = [tuple(r) for r in st.read(whole).collect()]
                missing, extra = compare_rows(want, got)
                if not missing and not extra and not st.read(orphans).collect():
                    return
                assert time.time() < deadline, f"{where}: not equal to PostgreSQL after {timeout_s} s\n" + \
                    format_diff(whole, ["id", "n_lines", "got"], missing, extra, len(want), len(got))
                time.sleep(1)

        converged("after the snapshot")
        for rnd in range(1, 5):
            for _ in range(4):
                pg.execute(transactions(6))
                time.sleep(rng.uniform(0.1, 0.9))
            converged(f"round {rnd}")
        checked = 0
        for name, bad in ((whole, "got <> n_lines"), (orphans, "true")):
            path = st.catalog.get(name).path
            versions = [int(r["version"]) for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
            for v in sorted(versions):
                rows = (spark.read.format("delta").option("versionAsOf", v).load(path).where(bad).collect())
                assert not rows, f"{name}@{v} shows a transaction half-applied: {rows[:5]}"
                checked += 1
        assert checked >= 8, f"only {checked} versions to check: the test saw too few refreshes to show anything"
        hist = st.history(whole, limit=200)
        assert any(h.get("action") == "DIFFERENTIAL" for h in hist), [h.get("action") for h in hist]
    finally:
        stop.set()
        if loop is not None:
            loop.join(60)
        if runtime is not None:
            runtime.stop()
        connect.stop()


def test_a_source_without_columns_follows_its_table_ddl(spark: Any, services: Any, unique_name: Any,
                                                        tmp_path: Path) -> None:
    """Issue 19 point 3. A Kafka source declared without columns or key takes both from the events' Connect
    schemas. PostgreSQL's ``ADD COLUMN`` reaches the mirror as a new column, the stream table over it carries
    on (its refresh notes the column); ``ALTER COLUMN ... TYPE bigint`` widens the mirror's column and
    re-initializes the stream table; a change to ``text`` cannot be merged: its events go to the dead-letter
    table with the reason and the source is flagged in the sources' status. Mirror and stream table equal
    PostgreSQL's own rows after each step."""
    from pipeline import StreamTables
    from pipeline.cli import _Logger
    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime, read_sources_status

    pg, broker = services
    items = unique_name("ev_items")
    pg.execute(f"CREATE TABLE {items} (id int PRIMARY KEY, qty int, label text)")
    pg.execute(f"INSERT INTO {items} SELECT i, i * 3, 'l' || (i % 3) FROM generate_series(1, 12) AS i")
    prefix = unique_name("evshop")
    connect = KafkaConnect(tmp_path / "connect", broker.bootstrap, debezium_postgres_connector(pg, prefix, [items]))
    connect.start()
    runtime: Runtime | None = None
    stop = threading.Event()
    loop: threading.Thread | None = None
    try:
        connect.wait_for_snapshot()
        _wait_for_events(broker.bootstrap, debezium_topic(prefix, items), 12)  # the 12 rows' snapshot events
        by_label = unique_name("ev_by_label")
        q_label = f"SELECT label, COUNT(*) AS n, SUM(qty) AS total FROM {items} GROUP BY label"
        conf_file = tmp_path / "pipeline.yaml"
        conf_file.write_text(f"""
sources:
  - name: {items}
    kind: kafka
    topic: {debezium_topic(prefix, items)}
    bootstrap_servers: "{broker.bootstrap}"
    trigger_seconds: 0.5
checkpoints: ckpt
stream_tables:
  - name: {by_label}
    refresh_mode: DIFFERENTIAL
    schedule: 1s
    query: {q_label}
runtime:
  tick_seconds: 0.5
""")
        st = StreamTables(spark, root=str(tmp_path / "trickle"))
        runtime = Runtime(st, load_conf(conf_file), _Logger(json_lines=False), tmp_path)
        runtime.start_sources()
        assert runtime._sources[items][0].schema.key == ("id",)  # from the Kafka key's Connect schema
        runtime.create_stream_tables(stop)
        loop = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
        loop.start()

        def converged(where: str, columns: str, types: str, timeout_s: float = 150) -> None:
            checks = [(f"SELECT {columns} FROM {items}", types, lambda: spark.table(items).select(*columns.split(", "))),
                      (q_label, "sii", lambda: st.read(by_label))]
            deadline = time.time() + timeout_s
            for sql, kinds, read in checks:
                while True:
                    want = _typed(pg.query(sql), kinds)
                    try:
                        got = [tuple(r) for r in read().collect()]
                    except Exception as e:  # noqa: BLE001 - the new column is not in the mirror yet
                        got, last = [], str(e).split("\n")[0]
                    else:
                        missing, extra = compare_rows(want, got)
                        if not missing and not extra:
                            break
                        last = format_diff(sql, columns.split(", "), missing, extra, len(want), len(got))
                    assert time.time() < deadline, f"{where}: not equal to PostgreSQL after {timeout_s} s\n{last}"
                    time.sleep(1)

        converged("after the snapshot", "id, qty, label", "iis")
        assert [c for c, _ in runtime._sources[items][0].schema.columns] == ["id", "qty", "label"]
        pg.execute(f"UPDATE {items} SET qty = qty + 1 WHERE id % 4 = 0; DELETE FROM {items} WHERE id = 5")
        pg.execute(f"ALTER TABLE {items} ADD COLUMN note text")
        pg.execute(f"INSERT INTO {items} VALUES (20, 7, 'l1', 'added'), (21, 8, 'l9', NULL)")
        pg.execute(f"UPDATE {items} SET note = 'n' || id, label = 'l2' WHERE id % 5 = 1")
        converged("after ADD COLUMN", "id, qty, label, note", "iiss")
        noted = [h for h in st.history(by_label, limit=100) if "added column note" in (h["reason"] or "")]
        assert noted and noted[-1]["action"] == "DIFFERENTIAL", noted
        assert "REINITIALIZE" not in {h["action"] for h in st.history(by_label, limit=100)}

        pg.execute(f"ALTER TABLE {items} ALTER COLUMN qty TYPE bigint")
        pg.execute(f"UPDATE {items} SET qty = {2 ** 40} WHERE id = 2")
        converged("after ALTER COLUMN TYPE bigint", "id, qty, label, note", "iiss")
        assert dict(spark.table(items).dtypes)["qty"] == "bigint"
        reinit = [h for h in st.history(by_label, limit=100) if h["action"] == "REINITIALIZE"]
        assert reinit and "qty widened from int to bigint" in reinit[0]["reason"], reinit

        pg.execute(f"ALTER TABLE {items} ALTER COLUMN qty TYPE text")
        pg.execute(f"UPDATE {items} SET qty = 'many' WHERE id = 3")
        deadline = time.time() + 120
        dead_letters = f"{items}_dead_letter"
        while not (spark.catalog.tableExists(dead_letters) and spark.table(dead_letters).count()):
            assert time.time() < deadline, "the event of the changed type did not reach the dead-letter table"
            time.sleep(1)
        error = spark.table(dead_letters).first()["error"]
        assert f"column qty of source {items} changed its type" in error and "BIGINT" in error, error
        while not (read_sources_status(tmp_path / "ckpt") or {}).get("sources", [{}])[0].get("schema_error"):
            assert time.time() < deadline, "the source was not flagged in the sources' status"
            time.sleep(0.5)
        assert spark.table(items).where("id = 3").first()["qty"] == 9  # the mirror kept the last good value
    finally:
        stop.set()
        if loop is not None:
            loop.join(60)
        if runtime is not None:
            runtime.stop()
        connect.stop()
