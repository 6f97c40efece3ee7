"""Kafka (Debezium) -> Delta mirror: each micro-batch of change events becomes ONE idempotent MERGE.

Stream tables never read Kafka. A Kafka source is first applied to a Delta *mirror* of the source table
(Change Data Feed on), and stream tables read the mirror like any Delta table, so there is one source
model and the frontier stays "one Delta version per source".

Per micro-batch:

1. decode every record with :mod:`connectors.debezium` in Spark's Python workers (``mapInArrow``), once
   (the result is checkpointed locally, so the two writes below do not decode twice);
2. records that fail to decode go to the dead-letter Delta table with their raw key, value, topic,
   partition, offset and the error: the pipeline keeps running and nothing is lost;
3. the rest are netted per primary key (the latest by source position - LSN, else ``ts_ms`` - wins,
   ties broken by Kafka offset; a
   primary-key change is a delete of the old key plus an upsert of the new one; a truncate drops every
   earlier event and deletes all rows not re-inserted after it) and MERGEd into the mirror. A column
   PostgreSQL did not resend (unchanged TOAST value) keeps the mirror's current value.

Deletes must reach the topic as events: with the ExtractNewRecordState SMT, use
``delete.tombstone.handling.mode=rewrite`` (or ``rewrite-with-tombstone``); a bare tombstone is skipped
like Kafka's own compaction markers.

Exactly once across restarts: both writes are Delta *idempotent* writes keyed by (application id, batch
id). Spark replays an uncommitted batch with the same id after a crash; Delta then skips a write it already
committed. The application id is created with the checkpoint (a new checkpoint is a new stream: its batch
ids restart at 0 and must not be mistaken for old ones).

Which writer commits a batch: a small batch into a mirror on the local disk is committed by delta-rs on the
driver (:func:`_apply_on_driver`, tens of milliseconds); every other batch, and every batch into a mirror on
an object store or HDFS (``s3a://``, ``abfss://``, ``gs://``, ``hdfs://``), by Spark's MERGE. On such a store
Spark's log store for the scheme makes the commit put-if-absent (on S3
``io.sparktrickle.S3ConditionalLogStore``: ``If-None-Match: *``), with Spark's own store settings;
:mod:`connectors.delta_rs` says why delta-rs is not given them. Both writers use the same (application
id, batch id), so a batch replayed after a switch is still skipped.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors import debezium_schema
from connectors.debezium import DecodeError, SourceSchema, decode
from connectors.delta_sink import create_owned, release_checkpoint
from connectors.storage import clear_unplanned_offsets, for_uri, uncommitted_batch
from dvm import quote

_log = logging.getLogger(__name__)

#: Delta session settings that make the next write idempotent (skipped if this app id already committed
#: this version or a later one).
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"

#: Columns of every dead-letter table.
#: a mirror's table properties naming its transaction table's location and its table as the transaction
#: records name it (see :mod:`connectors.kafka_transactions`, :mod:`pipeline.transaction_logs`)
TABLE_PROPERTY = "trickle.transactions.table"
COLLECTION_PROPERTY = "trickle.transactions.collection"
DEAD_LETTER_DDL = ("source STRING, topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, "
                   "error STRING, batch_id BIGINT, recorded_at TIMESTAMP")

#: Kafka client timeouts of the ingestion query (and of the start-up probe) unless the source's
#: ``kafka_options`` set them. With Kafka's defaults (request 30 s, API calls 60 s) a broker that is down
#: showed only after ~3 minutes (Spark fetches offsets with an admin client and tries 3 times: 3 x 60 s),
#: and stopping the query waited up to 60 s more in the admin client's close() for its call to the dead
#: broker. A healthy broker answers a metadata or offsets request in milliseconds; a fetch returns after
#: ``fetch.max.wait.ms`` (0.5 s), so 10 s leaves a wide margin.
REQUEST_TIMEOUT_MS = 10_000
API_TIMEOUT_MS = 10_000


def client_timeouts(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.request.timeout.ms`` / ``kafka.default.api.timeout.ms`` to add to a source's options.

    Ours only where the user gave none: a user's value always wins. When the user gave one of the two, the
    other is derived from it, because Kafka's admin client refuses an explicit API timeout below the request
    timeout (``ConfigException``)."""
    req, api = options.get("kafka.request.timeout.ms"), options.get("kafka.default.api.timeout.ms")
    if req is None and api is None:
        return {"kafka.request.timeout.ms": str(REQUEST_TIMEOUT_MS), "kafka.default.api.timeout.ms": str(API_TIMEOUT_MS)}
    try:
        if api is None:
            return {"kafka.default.api.timeout.ms": str(max(API_TIMEOUT_MS, int(str(req))))}
        if req is None:
            return {"kafka.request.timeout.ms": str(min(REQUEST_TIMEOUT_MS, int(str(api))))}
    except ValueError:
        pass  # not a number: Kafka's own error names the option
    return {}


def admin_properties(spark: Any, bootstrap_servers: str, options: Mapping[str, str], client_id: str) -> Any:
    """The ``java.util.Properties`` of a Java Kafka admin client for a source: its ``kafka.*`` options (so the
    security settings are the ingestion query's) over our client timeouts, with ``bootstrap_servers``."""
    props = spark.sparkContext._jvm.java.util.Properties()
    for k, v in {**client_timeouts(options), **options}.items():
        if k.startswith("kafka."):
            props.setProperty(k[len("kafka."):], str(v))
    props.setProperty("bootstrap.servers", bootstrap_servers)
    props.setProperty("client.id", client_id)
    return props


@dataclass(frozen=True)
class KafkaSource:
    """A Debezium topic mirrored into a Delta table (from the conf file's ``sources:``)."""

    name: str  # the mirror table stream tables read
    topic: str
    bootstrap_servers: str
    schema: SourceSchema
    dead_letter: str = ""  # table name; default ``<name>_dead_letter``
    starting_offsets: str = "earliest"
    options: dict[str, str] = field(default_factory=dict)  # extra ``kafka.*`` reader options
    #: with Debezium's transaction metadata: the table of its transaction topic's ENDs
    #: (:mod:`connectors.kafka_transactions`) and this topic's table as they name it (``public.orders``)
    transactions: str = ""
    collection: str = ""
    #: the conf file left the column list out: the mirror's columns follow the events' Connect schemas
    #: (:mod:`connectors.debezium_schema`, :func:`_follow_schema`)
    evolve: bool = False

    @property
    def dead_letter_table(self) -> str:
        return self.dead_letter or f"{self.name}_dead_letter"


def create_tables(spark: Any, src: KafkaSource) -> None:
    """The mirror (CDF on, as every stream table source needs) and its dead-letter table, if missing."""
    cols = ", ".join(f"{quote(c)} {t}" for c, t in src.schema.columns)
    key = f", '{KEY_PROPERTY}' = '{','.join(src.schema.key)}'" if src.evolve else ""
    create_owned(spark, src.name, f"({cols}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true{key})")
    create_owned(spark, src.dead_letter_table, f"({DEAD_LETTER_DDL}) USING delta")
    _mark_transactional(spark, src)


def _mark_transactional(spark: Any, src: KafkaSource) -> None:
    """Name the mirror's transaction table and collection in its table properties, which refreshes read
    (:mod:`pipeline.transaction_logs`); unset them when the source no longer has a transaction topic."""
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {src.name}").collect()}
    if src.transactions:
        want = {TABLE_PROPERTY: _location(spark, src.transactions), COLLECTION_PROPERTY: src.collection}
        if any(props.get(k) != v for k, v in want.items()):
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in want.items())
            spark.sql(f"ALTER TABLE {src.name} SET TBLPROPERTIES ({pairs})")
    elif TABLE_PROPERTY in props:
        spark.sql(f"ALTER TABLE {src.name} UNSET TBLPROPERTIES ('{TABLE_PROPERTY}', '{COLLECTION_PROPERTY}')")


def _decoded_schema(spark: Any, schema: SourceSchema) -> Any:
    from pyspark.sql.types import StructType

    cols = ", ".join(f"`{c}` {t}" for c, t in schema.columns)
    meta = ("__op STRING, __pos1 BIGINT, __pos2 BIGINT, __pos3 BIGINT, __unavailable ARRAY<STRING>, "
            "__topic STRING, __partition INT, __offset BIGINT, __error STRING, __key BINARY, __value BINARY, "
            "__txn_id STRING, __txn_dco BIGINT")
    return StructType.fromDDL(f"{cols}, {meta}")


def _decode_records(d: dict[str, list[Any]], schema: SourceSchema, out_names: list[str],
                    conflicts: Conflicts | None = None) -> dict[str, list[Any]]:
    """Decode one Arrow batch of Kafka records (as columns) into the decoded rows' columns.

    A delete keeps only the key columns (the mirror MERGE matches on them); a primary-key change becomes a
    delete of the old key followed by the new row; a record that fails to decode, or whose Connect schema
    carries a column type the mirror cannot take (``conflicts``), keeps its raw bytes and the error for the
    dead-letter table."""
    names = [c for c, _ in schema.columns]
    key_idx = [names.index(k) for k in schema.key]
    out: dict[str, list[Any]] = {n: [] for n in out_names}

    def keyed(values: tuple[Any, ...] | list[Any] | None) -> tuple[Any, ...]:
        row: list[Any] = [None] * len(names)
        for k, v in zip(key_idx, values or (), strict=True):
            row[k] = v
        return tuple(row)

    def emit(i: int, row: tuple[Any, ...] | None, op: str, pos: tuple[int, int, int],
             error: str | None = None, unavailable: tuple[str, ...] = (),
             txn: tuple[str, int] | None = None) -> None:
        for n, v in zip(names, row or (None,) * len(names), strict=True):
            out[n].append(v)
        raw = error is not None
        for col, v in (("__op", op), ("__pos1", pos[0]), ("__pos2", pos[1]), ("__pos3", pos[2]),
                       ("__unavailable", list(unavailable)), ("__topic", d["topic"][i]),
                       ("__partition", d["partition"][i]), ("__offset", d["offset"][i]), ("__error", error),
                       ("__key", d["key"][i] if raw else None), ("__value", d["value"][i] if raw else None),
                       ("__txn_id", txn[0] if txn else None), ("__txn_dco", txn[1] if txn else None)):
            out[col].append(v)

    for i in range(len(d["offset"])):
        try:
            if conflicts and (why := _conflict_of(d["value"][i], conflicts)) is not None:
                raise DecodeError(why)
            e = decode(d["key"][i], d["value"][i], schema)
            if e is None:  # tombstone: Kafka log compaction's marker, not a change
                continue
            pos, txn = e.position, e.txn
            if e.op == "t":
                emit(i, None, "t", pos, txn=txn)
            elif e.op == "d":
                emit(i, keyed(e.key), "d", pos, txn=txn)
            else:
                if e.before_key is not None and tuple(e.before_key) != tuple(e.key or ()):
                    emit(i, keyed(e.before_key), "d", pos, txn=txn)
                emit(i, e.row, "u", pos, unavailable=e.unavailable, txn=txn)
        except DecodeError as err:
            emit(i, None, "!", (0, 0, 0), str(err))
    return out


def _conflict_of(value: Any, conflicts: Conflicts) -> str | None:
    """Why this record's schema makes it a dead letter (a column type the mirror cannot take), else None."""
    try:
        doc = json.loads(value) if value else None
    except ValueError:
        return None  # the decoder says what is wrong with it
    return debezium_schema.conflicting(doc.get("schema") if isinstance(doc, dict) else None, conflicts)


def _decode_batches(schema: SourceSchema, arrow_schema: Any, conflicts: Conflicts | None = None) -> Any:
    """The ``mapInArrow`` function: Kafka records in, decoded rows (or errors) out."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        names = [f.name for f in arrow_schema]
        for batch in batches:
            yield pa.RecordBatch.from_pydict(_decode_records(batch.to_pydict(), schema, names, conflicts),
                                             schema=arrow_schema)

    return run


def _keep_unavailable(col: str, name: str) -> str:
    """An update keeps the mirror's value of a column the database did not send (unchanged TOAST)."""
    return f"t.{col} = CASE WHEN array_contains(s.__unavailable, '{name}') THEN t.{col} ELSE s.{col} END"


def _app_id(checkpoint: str) -> str:
    """A stable id for this stream's idempotent writes, created with (and stored next to) its checkpoint."""
    from connectors.storage import Exists, for_uri, join

    store, path = for_uri(checkpoint), join(checkpoint, "trickle_app_id")  # any store Spark writes (s3a://...)
    known = store.read_text(path)
    if known is not None:
        return known.strip()
    app = f"trickle-mirror-{uuid.uuid4()}"
    try:
        store.put_if_absent(path, app)
    except Exists:  # created meanwhile: the first one wins
        return (store.read_text(path) or app).strip()
    return app


#: Spark conf: a micro-batch of at most this many Kafka records is decoded on the driver and committed to
#: the mirror by delta-rs (0 turns this off: every batch takes Spark's MERGE)
DRIVER_BELOW_ROWS = "trickle.ingest.driverBelowRows"

#: the mirror's location, by table name (looked up once: ``DESCRIBE DETAIL`` is a query of its own)
_LOCATIONS: dict[str, str] = {}


def _location(spark: Any, name: str) -> str:
    if name not in _LOCATIONS:
        _LOCATIONS[name] = str(spark.sql(f"DESCRIBE DETAIL {name}").first()["location"])
    return _LOCATIONS[name]


def _net(cols: dict[str, list[Any]], keys: list[str]) -> list[int]:
    """The indexes of the rows that survive netting: per key, the latest event by source position, then Kafka
    partition and offset (the order of the Spark path's ``row_number``)."""
    latest: dict[tuple[Any, ...], int] = {}
    order = list(zip(cols["__pos1"], cols["__pos2"], cols["__pos3"], cols["__partition"], cols["__offset"],
                     strict=True))
    for i, key in enumerate(zip(*(cols[k] for k in keys), strict=True)):
        j = latest.get(key)
        if j is None or order[i] > order[j]:
            latest[key] = i
    return sorted(latest.values())


def transaction_marks(events: Iterable[tuple[str | None, int | None, int, int]]) -> list[list[Any]]:
    """What a mirror commit records of the transactions whose events it applied: ``[[id, highest
    data_collection_order], ...]`` in the order their first events came (partition, offset), from the
    decoded events' ``(txn id, data_collection_order, partition, offset)``. With the transaction topic's END
    counts this says whether a version holds all of a transaction's events of this table
    (:mod:`pipeline.transactions`). Events without transaction metadata are left out."""
    first: dict[str, tuple[int, int]] = {}
    top: dict[str, int] = {}
    for txn, dco, partition, offset in events:
        if txn is None or dco is None:
            continue
        if txn not in first or (partition, offset) < first[txn]:
            first[txn] = (partition, offset)
        top[txn] = max(top.get(txn, 0), int(dco))
    return [[t, top[t]] for t in sorted(first, key=first.__getitem__)]


def _apply_on_driver(batch: Any, batch_id: int, src: KafkaSource, app_id: str, meta: dict[str, Any],
                     followed: list[tuple[KafkaSource, Conflicts]] | None = None) -> dict[str, int] | None:
    """Apply a small micro-batch without Spark's MERGE: one job hands its Kafka records to the driver, which
    decodes and nets them and commits them to the mirror with delta-rs, in one idempotent commit. Why: Spark's
    MERGE costs a second or more of jobs even for ten events, which was half of the time from producer to
    stream table (docs/BENCHMARKS.md); delta-rs commits the same in tens of milliseconds. None when the batch
    is left to the Spark path: too many records, a record that does not decode (the dead letters are written
    by Spark), a truncate, a NULL key, or a mirror delta-rs may not write (a table feature it does not
    write, or a mirror not on the local disk: :func:`connectors.delta_rs.unusable`)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from connectors import delta_rs
    from connectors.delta_log import DeltaLog

    spark = batch.sparkSession
    limit = int(spark.conf.get(DRIVER_BELOW_ROWS, "100000"))
    if limit <= 0:
        return None
    path = _location(spark, src.name)
    log = DeltaLog(spark, path)
    version = log.latest_version()
    if version is None or delta_rs.unusable(path, log.protocol(version)) is not None:
        return None
    raw = batch.select("key", "value", "topic", "partition", "offset").limit(limit + 1).toArrow()
    if raw.num_rows > limit:
        return None
    conflicts: Conflicts = {}
    if src.evolve:  # the events' schemas from the records in hand: no job of its own
        before = src.schema.columns
        src, conflicts = _follow_schema(batch, src, raw.column("value").to_pylist())
        if followed is not None:
            followed.append((src, conflicts))
        if src.schema.columns != before:  # the mirror has a new version, maybe new table features
            version = log.latest_version()
            if version is None or delta_rs.unusable(path, log.protocol(version)) is not None:
                return None
    arrow_schema = to_arrow_schema(_decoded_schema(spark, src.schema))
    cols = _decode_records(raw.to_pydict(), src.schema, [f.name for f in arrow_schema], conflicts)
    if any(op in ("!", "t") for op in cols["__op"]):
        return None
    keys = list(src.schema.key)
    if any(v is None for k in keys for v in cols[k]):
        return None
    n = len(cols["__op"])
    if n == 0:
        return {"events": 0, "dead_letters": 0}
    picked = _net(cols, keys)
    names = [c for c, _ in src.schema.columns]
    kept = {c: f"__keep_{i}" for i, c in enumerate(names)
            if any(c in (cols["__unavailable"][j] or ()) for j in picked)}
    data = {c: [cols[c][j] for j in picked] for c in names}
    data["__op"] = [cols["__op"][j] for j in picked]
    for c, flag in kept.items():
        data[flag] = [c in (cols["__unavailable"][j] or ()) for j in picked]
    fields = [arrow_schema.field(c) for c in names] + [pa.field("__op", pa.string())] + [
        pa.field(flag, pa.bool_()) for flag in kept.values()]
    rows = pa.Table.from_pydict(data, schema=pa.schema(fields))
    mirror = {**meta["trickle_mirror"], "truncate": False}
    if marks := transaction_marks(zip(cols["__txn_id"], cols["__txn_dco"], cols["__partition"], cols["__offset"],
                                      strict=True)):
        mirror["transactions"] = marks
    delta_rs.upsert_keyed(path, rows, keys, names, kept, {**meta, "trickle_mirror": mirror}, version, app_id,
                          batch_id)
    return {"events": n, "dead_letters": 0}


def apply_batch(batch: Any, batch_id: int, src: KafkaSource, app_id: str) -> dict[str, int]:
    """Apply one micro-batch of Kafka records to the mirror (and its dead letters); idempotent per id.
    Small batches are decoded and committed on the driver (:func:`_apply_on_driver`), the rest by Spark."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name
    from pyspark.sql.pandas.types import to_arrow_schema

    meta: dict[str, Any] = {"trickle_mirror": {"source": src.name, "batch_id": batch_id}}
    followed: list[tuple[KafkaSource, Conflicts]] = []
    done = _apply_on_driver(batch, batch_id, src, app_id, meta, followed)
    if done is not None:
        return done
    conflicts: Conflicts = {}
    if src.evolve:
        src, conflicts = followed[0] if followed else _follow_schema(batch, src)
    spark = batch.sparkSession
    out_schema = _decoded_schema(spark, src.schema)
    decoded = (batch.select("key", "value", "topic", "partition", "offset")
               .mapInArrow(_decode_batches(src.schema, to_arrow_schema(out_schema), conflicts), out_schema)
               .localCheckpoint(eager=True))
    # The MERGE must see the temp view of the netted events, so it runs in the batch's own session (a
    # streaming query's session is its own clone); the idempotency and metadata settings are unset after.
    session = spark
    try:
        # one job sizes the batch: dead letters, good events, and the position of the last truncate
        stats = decoded.selectExpr(
            "count_if(__op = '!') AS bad", "count_if(__op <> '!') AS n",
            "max(CASE WHEN __op = 't' THEN named_struct('p1', __pos1, 'p2', __pos2, 'p3', __pos3, "
            "'o', __offset) END) AS t", "count_if(__txn_id IS NOT NULL AND __op <> '!') AS txns",
        ).first()
        n_bad = int(stats["bad"])
        if n_bad:
            (decoded.where("__op = '!'")
             .selectExpr(f"'{src.name}' AS source", "__topic AS topic", "__partition AS partition",
                         "__offset AS offset", "__key AS key", "__value AS value", "__error AS error",
                         f"CAST({batch_id} AS BIGINT) AS batch_id", "current_timestamp() AS recorded_at")
             .write.format("delta").mode("append").option("txnAppId", f"{app_id}-dead-letter")
             .option("txnVersion", batch_id).saveAsTable(src.dead_letter_table))
        good = decoded.where("__op <> '!'")
        if stats["n"] == 0:
            return {"events": 0, "dead_letters": n_bad}
        truncated = stats["t"] is not None
        if truncated:
            t = stats["t"]
            good = good.where(f"named_struct('p1', __pos1, 'p2', __pos2, 'p3', __pos3, 'o', __offset) > "
                              f"named_struct('p1', {t['p1']}L, 'p2', {t['p2']}L, 'p3', {t['p3']}L, "
                              f"'o', {t['o']}L)")
        keys = ", ".join(quote(k) for k in src.schema.key)
        net = (good.where("__op <> 't'")
               .selectExpr("*", f"row_number() OVER (PARTITION BY {keys} ORDER BY __pos1 DESC, __pos2 DESC, "
                                "__pos3 DESC, __partition DESC, __offset DESC) AS __rn")
               .where("__rn = 1"))
        view = f"__trickle_mirror_{abs(hash((src.name, batch_id)))}"
        net.createOrReplaceTempView(view)
        names = [c for c, _ in src.schema.columns]
        cols = [quote(c) for c in names]
        on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in src.schema.key)
        meta["trickle_mirror"]["truncate"] = truncated
        if stats["txns"]:
            first = (decoded.where("__txn_id IS NOT NULL AND __op <> '!'").groupBy("__txn_id")
                     .agg(F.max("__txn_dco").alias("dco"), F.min(F.struct("__partition", "__offset")).alias("at"))
                     .collect())
            meta["trickle_mirror"]["transactions"] = transaction_marks(
                (r["__txn_id"], r["dco"], r["at"]["__partition"], r["at"]["__offset"]) for r in first)
        session.conf.set(USER_METADATA, json.dumps(meta))
        session.conf.set(TXN_APP_ID, app_id)
        session.conf.set(TXN_VERSION, str(batch_id))
        session.sql(f"""
            MERGE INTO {src.name} t USING {view} s ON {on}
            WHEN MATCHED AND s.__op = 'd' THEN DELETE
            WHEN MATCHED THEN UPDATE SET {", ".join(_keep_unavailable(c, n) for c, n in zip(cols, names, strict=True))}
            WHEN NOT MATCHED AND s.__op <> 'd' THEN INSERT ({", ".join(cols)}) VALUES ({", ".join(f"s.{c}" for c in cols)})
            {"WHEN NOT MATCHED BY SOURCE THEN DELETE" if truncated else ""}
        """)
        spark.catalog.dropTempView(view)
        return {"events": int(stats["n"]), "dead_letters": n_bad}
    finally:
        for k in (USER_METADATA, TXN_APP_ID, TXN_VERSION):
            session.conf.unset(k)
        release_checkpoint(decoded)


#: a mirror's table property naming its primary key, when its columns come from the events (``evolve``)
KEY_PROPERTY = "trickle.mirror.key"
#: column (lower case) -> (Connect type signatures the mirror cannot take, why)
Conflicts = dict[str, tuple[set[str], str]]
#: source name -> what its events asked of the mirror that it could not do (dead-lettered or not mirrored),
#: since the process started; the runtime shows it in the sources' status
SCHEMA_PROBLEMS: dict[str, list[str]] = {}


def schema_problem(name: str) -> str | None:
    """The schema problems of a Kafka source's events so far in this process (None: none)."""
    found = SCHEMA_PROBLEMS.get(name)
    return "; ".join(found) if found else None


def mirror_columns(spark: Any, name: str) -> list[tuple[str, str]]:
    """The mirror's columns now, from its Delta log (no Spark job)."""
    from connectors.delta_log import DeltaLog

    log = DeltaLog(spark, _location(spark, name))
    version = log.latest_version()
    meta = log.metadata(version) if version is not None else None
    if meta is None:
        raise DecodeError(f"the mirror {name} has no Delta log at {_location(spark, name)}")
    return meta.columns()


def _distinct_schemas(values: Iterable[bytes | None]) -> list[Any]:
    """The distinct Connect schemas of JsonConverter records, each parsed once: the converter writes the
    schema first (``{"schema":...,"payload":...}``), so records are told apart by the bytes before their
    payload; a record laid out otherwise is parsed whole."""
    marker = b',"payload":'
    heads: set[bytes] = set()
    out: list[Any] = []
    for v in values:
        if not v:
            continue
        at = v.find(marker)
        head = v[:at] if at > 0 else v
        if head in heads:
            continue
        heads.add(head)
        try:
            doc = json.loads(head + b"}" if at > 0 else head)
        except ValueError:
            try:
                doc = json.loads(v)
            except ValueError:
                continue  # the decoder dead-letters it
        if isinstance(doc, dict) and isinstance(doc.get("schema"), dict):
            out.append(doc["schema"])
    return out


def _follow_schema(batch: Any, src: KafkaSource, values: list[bytes | None] | None = None
                   ) -> tuple[KafkaSource, Conflicts]:
    """Bring the mirror's columns up to the batch's event schemas (from the raw ``values`` when the caller
    holds them, else one small job reads their distinct Connect schemas): add the columns PostgreSQL added,
    widen the ones it widened (Delta type widening); return the source with the mirror's columns, and the
    column types the mirror cannot take (those events become dead letters). Idempotent: a replayed batch
    finds the columns already there."""
    spark = batch.sparkSession
    if values is not None:
        schemas = _distinct_schemas(values)
    else:
        found = (batch.selectExpr("get_json_object(CAST(value AS STRING), '$.schema') AS s")
                 .where("s IS NOT NULL").distinct().collect())
        schemas = [json.loads(r["s"]) for r in found]
    columns = mirror_columns(spark, src.name)
    ev = debezium_schema.evolve(columns, schemas, src.name)
    if ev.widened:
        spark.sql(f"ALTER TABLE {src.name} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        for name, _, new in ev.widened:
            spark.sql(f"ALTER TABLE {src.name} ALTER COLUMN {quote(name)} TYPE {new}")
    if ev.added:
        spark.sql(f"ALTER TABLE {src.name} ADD COLUMNS ({', '.join(f'{quote(n)} {t}' for n, t in ev.added)})")
    if ev.changes:
        columns = mirror_columns(spark, src.name)
    problems = SCHEMA_PROBLEMS.setdefault(src.name, [])
    problems.extend(p for p in ev.problems() if p not in problems)
    schema = SourceSchema(tuple(columns), src.schema.key, src.schema.decimal_handling)
    return dataclasses.replace(src, schema=schema), ev.conflicts


#: errors of a topic that exists but whose partitions are not served yet (just created, a leader being elected)
_NOT_SERVED_YET = ("UnknownTopicOrPartitionException", "LeaderNotAvailableException", "NotLeaderOrFollowerException")
#: how long :func:`discover_schema` waits for a topic's partitions to be served before giving up
NOT_SERVED_WAIT_S = 30.0


def _newest_with_schema(reader: Any, topic: str) -> Any:
    """The topic's newest record whose value carries a Connect schema (None when there is none). Retried while
    the broker does not serve the topic's partitions yet: Debezium creates a topic with its first event, and a
    runtime started right after meets the partition before its leader is known ("This server does not host
    this topic-partition"), which is a matter of seconds, not a wrong topic."""
    deadline = time.monotonic() + NOT_SERVED_WAIT_S
    while True:
        try:
            return (reader.load().selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "offset")
                    .where("get_json_object(v, '$.schema') IS NOT NULL").orderBy("offset", ascending=False).first())
        except Exception as e:  # noqa: BLE001 - Py4J wraps the Kafka client's exception; matched by name below
            # Py4J's first line names only the Java call; the Kafka client's error is a later line
            cause = next((line.strip().lstrip(": ") for line in str(e).splitlines() if any(n in line for n in _NOT_SERVED_YET)), None)
            if cause is None:
                raise
            if time.monotonic() >= deadline:
                raise DecodeError(f"topic {topic!r}: the Kafka cluster did not serve its partitions within "
                                  f"{NOT_SERVED_WAIT_S:.0f} s ({cause}); check the broker's health and start "
                                  "again") from None
            time.sleep(1.0)


def discover_schema(spark: Any, name: str, topic: str, bootstrap_servers: str, options: Mapping[str, str],
                    key: Iterable[str] = ()) -> SourceSchema:
    """The columns and key of a Kafka source whose conf lists no columns: the existing mirror's (its key from
    the conf or the mirror's ``trickle.mirror.key`` property), else those of the newest change event on the
    topic that carries a Connect schema (the key from the Kafka key's schema unless the conf names it).
    Raises :class:`DecodeError` when there is neither."""
    key = tuple(key)
    if spark.catalog.tableExists(name):
        props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
        key = key or tuple(k for k in props.get(KEY_PROPERTY, "").split(",") if k)
        if key:
            return SourceSchema(tuple(mirror_columns(spark, name)), key)
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", "earliest").option("endingOffsets", "latest"))
    for k, v in {**client_timeouts(options), **options}.items():
        reader = reader.option(k, v)
    row = _newest_with_schema(reader, topic)
    if row is None:
        raise DecodeError(f"Kafka source {name} lists no columns, and topic {topic!r} holds no change event with a "
                          "Connect schema to take them from: list the columns in the conf file, or enable "
                          "value.converter.schemas.enable=true on the connector and start once it wrote an event")
    value = json.loads(row["v"])
    columns = debezium_schema.columns(value["schema"])
    if not key and row["k"]:
        key_doc = json.loads(row["k"])
        key = tuple(debezium_schema.key_columns(key_doc.get("schema") if isinstance(key_doc, dict) else {}))
    if not key:
        raise DecodeError(f"Kafka source {name}: no primary key in the conf file, and the events' Kafka key carries "
                          "no Connect schema naming it: give the source a 'key'")
    return SourceSchema(tuple(columns), key)


def start(spark: Any, src: KafkaSource, checkpoint: str, trigger_seconds: float = 1.0,
          after_batch: Callable[[], None] | None = None) -> Any:
    """Start the ingestion query of one Kafka source; returns the StreamingQuery. ``after_batch`` runs after
    every micro-batch's mirror commit, inside the batch (the fused path: see :mod:`pipeline.fused`); it must
    not raise, or the batch fails and is replayed."""
    create_tables(spark, src)
    app_id = _app_id(checkpoint)
    return stream(spark, src.topic, src.bootstrap_servers, src.starting_offsets, src.options,
                  lambda batch, batch_id: apply_batch(batch, batch_id, src, app_id), f"trickle_mirror_{src.name}",
                  checkpoint, trigger_seconds, after_batch)


def stream(spark: Any, topic: str, bootstrap_servers: str, starting_offsets: str, options: Mapping[str, str],
           apply: Callable[[Any, int], Any], query_name: str, checkpoint: str, trigger_seconds: float,
           after_batch: Callable[[], None] | None = None) -> Any:
    """A ``foreachBatch`` query over one Kafka topic: ``apply(batch, batch_id)``, then ``after_batch()``. A
    checkpoint whose first batch was cut short before Spark planned it is made startable first
    (:func:`connectors.storage.clear_unplanned_offsets`), and a batch planned but not committed is re-run
    alone first (:func:`_replay_alone`)."""
    storage = for_uri(checkpoint, spark)
    clear_unplanned_offsets(storage, checkpoint)
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", starting_offsets))
    for k, v in {**client_timeouts(options), **options}.items():
        reader = reader.option(k, v)

    def run(batch: Any, batch_id: int) -> None:
        apply(batch, batch_id)
        if after_batch is not None:
            after_batch()

    def writer() -> Any:
        return (reader.load().writeStream.foreachBatch(run).queryName(query_name)
                .option("checkpointLocation", checkpoint))

    if (pending := uncommitted_batch(storage, checkpoint)) is not None:
        _replay_alone(writer(), storage, checkpoint, pending, query_name)
    return writer().trigger(processingTime=f"{trigger_seconds} seconds").start()


#: seconds a query re-running its uncommitted batch alone may take before the ingestion query starts anyway
REPLAY_TIMEOUT_S = 300.0


def _replay_alone(writer: Any, storage: Any, checkpoint: str, batch_id: int, query_name: str) -> None:
    """Re-run the checkpoint's planned, uncommitted batch ``batch_id`` in a query of one batch, before the
    ingestion query starts. Why: Spark 4.1's Kafka source fails every query whose first batch is such a
    re-run, right after that batch commits, with a NullPointerException while it reports the batch's
    progress (``KafkaMicroBatchStream.metrics``: the latest offsets it reports against are only read when
    a batch is planned; SPARK-55271, not fixed in 4.1.2). Every ingestion query stopped or killed
    inside a batch then failed once at its next start, and its source showed DOWN until a restart. Run
    alone, the batch commits (exactly once, as always) and the failure it then reports is dropped; the
    ingestion query then starts on a checkpoint whose batches all committed. Any other outcome is left to
    the ingestion query, which re-runs the batch itself."""
    try:
        query = writer.trigger(once=True).start()
    except Exception as e:  # noqa: BLE001 - the ingestion query started next meets the same problem and reports it
        _log.warning("%s: re-running uncommitted batch %d alone did not start: %s", query_name, batch_id,
                     _java_error(e))
        return
    try:
        finished = query.awaitTermination(REPLAY_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - see below: the batch's commit decides
        finished, error = True, _java_error(e)
    else:
        error = None
    if not finished:
        query.stop()
    if uncommitted_batch(storage, checkpoint) == batch_id:
        _log.warning("%s: re-running uncommitted batch %d alone did not commit it (%s); the ingestion query "
                     "re-runs it", query_name, batch_id, "timed out" if not finished else error or "no error")
    else:
        _log.info("%s: re-ran uncommitted batch %d alone%s", query_name, batch_id,
                  f" (Spark then reported: {error})" if error else "")


# --- start-up probe ---


@dataclass(frozen=True)
class Probe:
    """What a short admin-client check of one Kafka cluster found, before any ingestion query starts.

    Why: Spark's Kafka source does not fail when no broker answers; it retries for minutes while the
    pipeline looks healthy (stream tables refresh with NO_DATA). Asking first turns a wrong address, a
    broker that is down or a security mismatch into an error at start-up."""

    bootstrap_servers: str
    error: str | None  # why the brokers did not answer (None: they did)
    missing: dict[str, list[str]]  # topic not listed by the cluster -> existing topics with similar names


def _java_error(e: BaseException) -> str:
    """The innermost cause of a py4j error as ``ExceptionClass: message`` (Kafka wraps the useful one in an
    ExecutionException)."""
    cause = getattr(e, "java_exception", None)
    if cause is None:
        return f"{type(e).__name__}: {e}"
    while cause.getCause() is not None:
        cause = cause.getCause()
    return f"{cause.getClass().getSimpleName()}: {cause.getMessage()}"


def unreachable(bootstrap_servers: str, timeout_s: float) -> str | None:
    """Why no bootstrap address accepts a TCP connection (None: at least one does).

    A plain connect tells a refused port, an unknown host and a silent network apart at once, where
    Kafka's client retries for its whole timeout and then reports only that it timed out."""
    import socket

    errors = []
    for addr in (a.strip() for a in bootstrap_servers.split(",") if a.strip()):
        host, _, port = addr.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or addr, int(port)), timeout=timeout_s):
                return None
        except (OSError, ValueError) as e:
            reason = "timed out" if isinstance(e, TimeoutError) else (
                e.strerror or str(e) if isinstance(e, OSError) else f"not host:port ({e})")
            errors.append(f"{addr}: {reason}")
    return "; ".join(errors) or "no address given"


def probe(spark: Any, bootstrap_servers: str, options: Mapping[str, str], topics: list[str],
          timeout_s: float) -> Probe:
    """Ask the cluster at ``bootstrap_servers`` for its brokers and topics, waiting at most ``timeout_s``.

    Uses Kafka's Java admin client, the one Spark's Kafka source uses, with the source's ``kafka.*``
    options: the security settings (``kafka.security.protocol``, ``kafka.sasl.*``, ``kafka.ssl.*``) are
    checked exactly as the ingestion query will use them."""
    from py4j.protocol import Py4JError

    refused = unreachable(bootstrap_servers, min(timeout_s, 3.0))
    if refused is not None:
        return Probe(bootstrap_servers, refused, {})
    jvm = spark.sparkContext._jvm
    admin_pkg = jvm.org.apache.kafka.clients.admin
    props = admin_properties(spark, bootstrap_servers, options, "trickle-probe")
    ms = max(1, int(timeout_s * 1000))
    unit = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    try:
        admin = admin_pkg.AdminClient.create(props)
    except Py4JError as e:  # a bad kafka.* option (ConfigException), a JAAS file that is missing...
        return Probe(bootstrap_servers, _java_error(e), {})
    try:
        admin.describeCluster(admin_pkg.DescribeClusterOptions().timeoutMs(ms)).nodes().get(ms + 2000, unit)
        names = {str(t) for t in admin.listTopics(admin_pkg.ListTopicsOptions().timeoutMs(ms)).names()
                 .get(ms + 2000, unit)}
    except Py4JError as e:
        return Probe(bootstrap_servers, _java_error(e), {})
    finally:
        try:
            admin.close(jvm.java.time.Duration.ofMillis(0))  # abandon calls still pending: nothing to wait for
        except Py4JError:
            pass
    missing = {t: difflib.get_close_matches(t, sorted(names), n=3, cutoff=0.6) for t in topics if t not in names}
    return Probe(bootstrap_servers, None, missing)
