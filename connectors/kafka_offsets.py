"""The end offsets of a Kafka topic, asked of the brokers with Kafka's Java admin client (the one Spark's
Kafka source uses, with the source's ``kafka.*`` options, so the security settings match).

The run's monitor (:mod:`pipeline.observer`) compares them with the offsets the ingestion query has
consumed, for the Kafka lag ``trickle status`` and the metrics show. A Spark progress report alone cannot
tell: it states the topic's end as it was when the last micro-batch was planned, not now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connectors.kafka_mirror import admin_properties


class EndOffsets:
    """One admin client per Kafka source, kept open between calls (creating one costs a connection)."""

    def __init__(self, spark: Any, bootstrap_servers: str, options: Mapping[str, str], timeout_s: float = 5.0) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(
            admin_properties(spark, bootstrap_servers, options, "trickle-lag"))
        self._ms = max(1, int(timeout_s * 1000))

    def __call__(self, topic: str) -> dict[int, int]:
        """Partition -> end offset (the offset the next message will get); raises when the brokers do not
        answer within the timeout."""
        jvm, ms = self._jvm, self._ms
        admin_pkg = jvm.org.apache.kafka.clients.admin
        unit = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
        topics = jvm.java.util.ArrayList()
        topics.add(topic)
        desc = self._admin.describeTopics(topics).allTopicNames().get(ms, unit).get(topic)
        wanted = jvm.java.util.HashMap()
        for p in desc.partitions():
            wanted.put(jvm.org.apache.kafka.common.TopicPartition(topic, p.partition()),
                       admin_pkg.OffsetSpec.latest())
        listed = self._admin.listOffsets(wanted).all().get(ms, unit)
        return {int(tp.partition()): int(info.offset()) for tp, info in listed.items()}

    def close(self) -> None:
        try:
            self._admin.close(self._jvm.java.time.Duration.ofMillis(0))
        except Exception:  # noqa: BLE001 - the JVM may be stopping already
            pass
