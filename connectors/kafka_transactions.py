"""A Debezium transaction topic (``<topic.prefix>.transaction``, written when the connector has
``provide.transaction.metadata=true``) mirrored as a Delta table of its END records.

Why: a PostgreSQL transaction that changes several tables reaches Kafka as events on several topics, which
separate ingestion queries commit to separate mirrors at separate moments. A stream table joining two of
those mirrors could show an order without its lines. Each END record says how many events the transaction
wrote to each table; with the marks each mirror commit records (:func:`connectors.kafka_mirror.transaction_marks`)
a refresh can pick mirror versions that hold every transaction whole or not at all
(:mod:`pipeline.transactions`).

Layout: one row per END (``id``, ``event_count``, ``data_collections`` as a map table -> count, ``ts_ms``, and
its Kafka partition and offset), and the same ENDs in each commit's metadata (``{"trickle":
{"trickle_transactions": {"batch_id": n, "ends": [[id, {table: count}], ...]}}}``), so a refresh reads new
ENDs from the Delta log's commit files without a scan. One commit per micro-batch that holds an END,
idempotent by the batch id: delta-rs on the driver for a table on the local disk (an END is a few hundred
bytes), Spark's writer for one on any other store (``s3a://``, ...; see :mod:`connectors.delta_rs` for
why delta-rs is kept to local tables), with the same application id, version and metadata, so either
commit makes a replayed batch a no-op. BEGIN records and tombstones are skipped; a record that is not a
transaction boundary goes to ``<name>_dead_letter`` with the reason, like a mirror's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.debezium import DecodeError, decode_transaction_end
from connectors.delta_log import TRICKLE_KEY
from connectors.delta_sink import create_owned
from connectors.kafka_mirror import DEAD_LETTER_DDL, _app_id, _location, stream
from connectors.storage import is_local

#: the commit-metadata key of a transaction mirror's batch
META_KEY = "trickle_transactions"
DDL = ("id STRING, event_count BIGINT, data_collections MAP<STRING, BIGINT>, ts_ms BIGINT, kafka_partition INT, "
       "kafka_offset BIGINT")


@dataclass(frozen=True)
class TransactionTopic:
    """The transaction topic of one Debezium connector and the table its ENDs go to."""

    name: str  # the Delta table of END records
    topic: str
    bootstrap_servers: str
    starting_offsets: str = "earliest"
    options: dict[str, str] = field(default_factory=dict)

    @property
    def dead_letter_table(self) -> str:
        return f"{self.name}_dead_letter"


def create_tables(spark: Any, tx: TransactionTopic) -> None:
    create_owned(spark, tx.name, f"({DDL}) USING delta")
    create_owned(spark, tx.dead_letter_table, f"({DEAD_LETTER_DDL}) USING delta")


def decode_ends(records: Mapping[str, list[Any]]) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The END rows of one batch of Kafka records (as columns), and ``(index, error)`` of the bad ones."""
    rows: list[dict[str, Any]] = []
    bad: list[tuple[int, str]] = []
    for i, value in enumerate(records["value"]):
        try:
            end = decode_transaction_end(value)
        except DecodeError as e:
            bad.append((i, str(e)))
            continue
        if end is not None:
            rows.append({"id": end.id, "event_count": end.event_count, "data_collections": end.collections,
                         "ts_ms": end.ts_ms, "kafka_partition": records["partition"][i],
                         "kafka_offset": records["offset"][i]})
    return rows, bad


def apply_batch(batch: Any, batch_id: int, tx: TransactionTopic, app_id: str) -> int:
    """Append one micro-batch's ENDs (idempotent per batch id); returns how many."""
    import pyarrow as pa

    from connectors import delta_rs
    from connectors.delta_log import DeltaLog

    spark = batch.sparkSession
    raw = batch.select("key", "value", "topic", "partition", "offset").toArrow()
    records = raw.to_pydict()
    rows, bad = decode_ends(records)
    if bad:
        dead = [(tx.name, records["topic"][i], records["partition"][i], records["offset"][i], records["key"][i],
                 records["value"][i], error, batch_id) for i, error in bad]
        (spark.createDataFrame(dead, "source STRING, topic STRING, partition INT, offset BIGINT, key BINARY, "
                                     "value BINARY, error STRING, batch_id BIGINT")
         .selectExpr("*", "current_timestamp() AS recorded_at")
         .write.format("delta").mode("append").option("txnAppId", f"{app_id}-dead-letter")
         .option("txnVersion", batch_id).saveAsTable(tx.dead_letter_table))
    if not rows:
        return 0
    path = _location(spark, tx.name)
    version = DeltaLog(spark, path).latest_version()
    schema = pa.schema([("id", pa.string()), ("event_count", pa.int64()),
                        ("data_collections", pa.map_(pa.string(), pa.int64())), ("ts_ms", pa.int64()),
                        ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())])
    table = pa.Table.from_pylist([{**r, "data_collections": list(r["data_collections"].items())} for r in rows],
                                 schema=schema)
    record = {META_KEY: {"batch_id": batch_id, "ends": [[r["id"], r["data_collections"]] for r in rows]}}
    if is_local(path):
        # delta-rs records the (app id, batch id) but, unlike Spark's writer, does not skip a write it already
        # committed: a batch replayed after a crash would append its ENDs twice
        done = delta_rs.opened(path, int(version or 0)).transaction_version(app_id)
        if done is None or done < batch_id:
            delta_rs.append(path, table, record, int(version or 0), batch_id, app_id)
    else:  # Spark's log store for the scheme makes the commit put-if-absent (see connectors/storage.py)
        (spark.createDataFrame(table).write.format("delta").mode("append").option("txnAppId", app_id)
         .option("txnVersion", batch_id).option("userMetadata", json.dumps({TRICKLE_KEY: record}, sort_keys=True))
         .save(path))
    return len(rows)


def ends_in(commit_info: Mapping[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """The ENDs a transaction mirror's commit recorded (see the module docstring); [] for any other commit."""
    meta = commit_info.get("userMetadata")
    if not meta or META_KEY not in meta:
        return []
    try:
        doc = json.loads(meta)
    except ValueError:
        return []
    batch = ((doc.get("trickle") or {}).get(META_KEY) or {}) if isinstance(doc, dict) else {}
    return [(str(i), {str(k): int(v) for k, v in c.items()}) for i, c in batch.get("ends") or ()]


def start(spark: Any, tx: TransactionTopic, checkpoint: str, trigger_seconds: float = 1.0,
          after_batch: Callable[[], None] | None = None) -> Any:
    """Start the ingestion query of one transaction topic; returns the StreamingQuery."""
    create_tables(spark, tx)
    app_id = _app_id(checkpoint)
    return stream(spark, tx.topic, tx.bootstrap_servers, tx.starting_offsets, tx.options,
                  lambda batch, batch_id: apply_batch(batch, batch_id, tx, app_id), f"trickle_transactions_{tx.name}",
                  checkpoint, trigger_seconds, after_batch)
