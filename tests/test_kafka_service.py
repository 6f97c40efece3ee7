"""The local Kafka harness (services/kafka.py) runs a real broker: round trip, clean stop, crash recovery.

Why these tests exist: every Kafka-facing test and the demo rely on this harness, so it must prove that
what goes in comes out (exact keys, values and per-partition order), that stop() leaves no JVM behind,
and that a broker killed with -9 restarts on the same workdir with its data. No Spark is started here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from services.kafka import KafkaBroker

N = 100

Record = tuple[int, bytes, bytes]  # (offset, key, value)


def _produce(bootstrap: str, topic: str, start: int, n: int) -> dict[int, list[Record]]:
    """Send n keyed messages; return what the broker acknowledged, per partition, in send order."""
    # acks=all and one request in flight: every message is acknowledged, and retries cannot reorder.
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_in_flight_requests_per_connection=1
    )
    try:
        sent = []
        for i in range(start, start + n):
            key, value = f"key-{i % 10}".encode(), f"value-{i}".encode()
            sent.append((key, value, producer.send(topic, key=key, value=value)))
        producer.flush(timeout=30)
        acked: dict[int, list[Record]] = {}
        for key, value, future in sent:
            meta = future.get(timeout=30)
            acked.setdefault(meta.partition, []).append((meta.offset, key, value))
        return acked
    finally:
        producer.close(timeout=10)


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> dict[int, list[Record]]:
    """Read every partition from the beginning (no consumer group: nothing to join or commit)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: dict[int, list[Record]] = {}
        count, deadline = 0, time.monotonic() + 30
        while count < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got.setdefault(tp.partition, []).extend((r.offset, r.key, r.value) for r in records)
                count += len(records)
        return got
    finally:
        consumer.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _check_sent(acked: dict[int, list[Record]], start: int, n: int) -> None:
    """Sanity of the acknowledgements themselves: all n messages, offsets dense, one partition per key."""
    assert sum(len(v) for v in acked.values()) == n
    for records in acked.values():
        offsets = [o for o, _, _ in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))  # dense, in send order
    partition_of = {k: p for p, records in acked.items() for _, k, _ in records}
    for p, records in acked.items():
        assert all(partition_of[k] == p for _, k, _ in records)
    values = sorted(int(v.split(b"-")[1]) for records in acked.values() for _, _, v in records)
    assert values == list(range(start, start + n))


def test_round_trip_then_clean_stop(tmp_path: Path) -> None:
    with KafkaBroker(tmp_path / "kafka") as broker:
        assert broker.bootstrap.startswith("127.0.0.1:")
        broker.create_topic("events", partitions=3)
        acked = _produce(broker.bootstrap, "events", 0, N)
        _check_sent(acked, 0, N)
        assert len(acked) > 1  # ten keys over three partitions: the test really covers several

        got = _consume_all(broker.bootstrap, "events", 3, N)
        assert got == acked  # exact keys and values, in order, per partition

        pid = broker.pid
        assert pid is not None and not _gone(pid)
        broker.stop()
        assert not broker.is_running() and broker.pid is None
        assert _gone(pid)
        broker.stop()  # idempotent
    log = (tmp_path / "kafka" / "broker.log").read_text()
    assert "Kafka Server started" in log  # the broker logged to its file (the binding is on the classpath)


def test_data_survives_kill_9_and_restart(tmp_path: Path) -> None:
    workdir = tmp_path / "kafka"
    broker = KafkaBroker(workdir)
    try:
        broker.start()
        broker.create_topic("durable", partitions=2)
        acked = _produce(broker.bootstrap, "durable", 0, N)
        _check_sent(acked, 0, N)
        pid = broker.pid
        assert pid is not None
        broker.kill()
        assert _gone(pid)
        bootstrap = broker.bootstrap
    finally:
        broker.kill()

    # A new harness object on the same workdir: same ports (from broker.json), storage already formatted.
    with KafkaBroker(workdir) as restarted:
        assert restarted.bootstrap == bootstrap
        assert restarted.pid != pid
        assert _consume_all(restarted.bootstrap, "durable", 2, N) == acked

        # The broker keeps appending after the recovered data rather than starting over.
        more = _produce(restarted.bootstrap, "durable", N, 10)
        for p, records in more.items():
            assert records[0][0] == len(acked.get(p, []))
