"""Writes to stream tables, each one Delta commit that also carries the refresh record.

The refresh record (frontier, refresh id, action) travels in the commit's ``userMetadata``, so the data and
the frontier it reflects become visible atomically. A crash after the commit and before the catalog is
updated is recovered by reading the record back (see :mod:`pipeline.refresh`), and nothing is applied twice.

Every commit is also *checked*: it is an idempotent Delta transaction (app id :data:`TXN_APP_ID`, version =
the stream table's version the refresh read its frontier at, plus one). Two refreshes of one table that
read the same frontier (two processes, or a manual refresh beside ``trickle run``) therefore cannot both
commit: Delta skips the second write (its transaction version is no longer new) or fails it with a
``ConcurrentTransactionException``, and :class:`CommitLost` tells the refresh to start again from the
winner's frontier. The check lives in the table's own log, so it holds across processes and machines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from connectors.delta_log import TRICKLE_KEY, DeltaLog
from dvm import ROW_HASH, ROW_ID, quote
from dvm.dialect import sql_string

_log = logging.getLogger(__name__)

_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
#: the Delta idempotent-transaction app id of refresh commits (see the module docstring)
TXN_APP_ID = "spark-trickle-refresh"
_TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


class CommitLost(Exception):
    """Another refresh committed to the stream table after this one read its frontier: nothing of this
    refresh was committed (Delta skipped its transaction), and it must start again from the new frontier."""


def _metadata(record: dict[str, Any]) -> str:
    return json.dumps({TRICKLE_KEY: record}, sort_keys=True)


def _session(spark: Any, record: dict[str, Any], read_version: int | None) -> Any:
    """A light-weight session (same SparkContext) whose commits carry ``record`` and are idempotent
    transactions checked against ``read_version`` (see the module docstring). Both are per-session
    settings, so concurrent refreshes of different stream tables never see each other's."""
    session = spark.newSession()
    session.conf.set(_USER_METADATA, _metadata(record))
    session.conf.set(_TXN_APP_ID_CONF, TXN_APP_ID)
    session.conf.set(_TXN_VERSION_CONF, str(txn_version(read_version)))
    return session


def txn_version(read_version: int | None) -> int:
    """The transaction version of a refresh that read the stream table at ``read_version`` (None: the table
    did not exist yet). Always above that of every earlier refresh commit, which sits at or below
    ``read_version``."""
    return 0 if read_version is None else read_version + 1


def committed_version(spark: Any, path: str, record: dict[str, Any], read_version: int | None) -> int | None:
    """The version at which this refresh's commit landed; None when nothing was committed. Raises
    :class:`CommitLost` when another refresh committed since ``read_version`` and ours was skipped."""
    log = DeltaLog(spark, path)
    latest = log.latest_version()
    lost = False
    first = 0 if read_version is None else read_version + 1
    for v in range(first, (latest if latest is not None else -1) + 1):
        meta = log.trickle_metadata(v)
        if meta is None:
            continue
        if meta.get("refresh_id") == record["refresh_id"]:
            return v
        lost = True
    if lost:
        raise CommitLost(f"another refresh committed to {path} after version {read_version}, which this "
                         "refresh read its frontier at; nothing of this refresh was committed")
    return None


#: Session settings of a refresh that runs interpreted (see :func:`merge`).
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def merge(spark: Any, path: str, source_sql: str, statement: Callable[[str], str], record: dict[str, Any],
          read_version: int | None, interpreted: bool = False,
          conf: dict[str, str] | None = None) -> dict[str, int] | None:
    """Apply a delta to the stream table with one checked MERGE; return its row counts, or None when
    nothing was committed (an empty delta, or a MERGE that changed no row): the table then still holds
    the query's rows at the new frontier, with no commit to say so (see :mod:`pipeline.refresh`).

    The delta is computed ONCE, kept, and counted in the same Spark job: Delta's MERGE reads its source
    twice (to find the touched files, then to write them), and a delta query re-run means every source
    snapshot, change feed and join evaluated again. An empty delta skips the MERGE entirely. ``statement``
    turns the name of the materialised delta into the MERGE statement.

    ``interpreted`` turns Spark's code generation off for this refresh. Compiling generated Java is most
    of the driver's CPU time in a small refresh (figures in docs/BENCHMARKS.md, "Figures behind the code"),
    and it only pays off when many rows flow through the plan.

    ``read_version``: the stream table's version the refresh read its frontier at (see the module
    docstring). ``conf``: more settings for this refresh's session."""
    session = _session(spark, record, read_version)
    for k, v in {**(INTERPRETED if interpreted else {}), **(conf or {})}.items():
        session.conf.set(k, v)
    # A local checkpoint, not df.cache(): Delta re-caches every cached plan that reads a table it just
    # wrote, and the delta of an aggregate reads the stream table itself, so a cached delta would be
    # recomputed (with new Spark jobs) right after the MERGE commits. The count fills the checkpoint.
    delta = session.sql(source_sql).localCheckpoint(eager=False)
    try:
        if delta.count() == 0:
            return None
        view = f"__trickle_delta_{record['refresh_id']}"
        delta.createOrReplaceTempView(view)
        session.sql(statement(f"SELECT * FROM {view}"))
        session.catalog.dropTempView(view)
    finally:
        release_checkpoint(delta)
    version = committed_version(spark, path, record, read_version)
    if version is None:
        return None
    return _counts(DeltaLog(spark, path).commit_info(version))


def collect(spark: Any, source_sql: str, record: dict[str, Any], read_version: int | None,
            interpreted: bool = False, conf: dict[str, str] | None = None) -> Any:
    """Compute the change rows and hand them to the driver as Arrow, in one Spark job: the delta of a small
    window is then committed without another job (see :func:`apply_collected`)."""
    session = _session(spark, record, read_version)
    for k, v in {**(INTERPRETED if interpreted else {}), **(conf or {})}.items():
        session.conf.set(k, v)
    return session.sql(source_sql).toArrow()


def apply_collected(spark: Any, path: str, rows: Any, strategy: str, engine: str, stored: list[str], update: bool,
                    statement: Callable[[str], str], record: dict[str, Any],
                    read_version: int | None) -> dict[str, int] | None:
    """Commit collected change rows (``rows``, Arrow) with ``strategy`` (APPEND or MERGE, see
    :mod:`pipeline.strategy`) on ``engine`` (``delta-rs`` or ``spark``); None when nothing was committed.
    ``stored``: the table's columns in order; ``update``: matched rows are updated (keyed layout)."""
    from connectors import delta_rs

    if engine in ("delta-rs", "own"):
        assert read_version is not None
        kwargs = {"record": record, "read_version": read_version, "txn_version": txn_version(read_version),
                  "app_id": TXN_APP_ID}
        try:
            if strategy == "APPEND":
                delta_rs.append(path, rows.select(stored), **kwargs)
            elif engine == "own" and (counts := _merged_here(spark, path, rows, update, record, read_version)):
                return counts  # committed as read_version + 1 (or CommitFailed): nothing to look up
            else:
                delta_rs.merge(path, rows, stored, update, **kwargs)
        except delta_rs.CommitFailed as e:
            committed_version(spark, path, record, read_version)  # CommitLost when another refresh won
            raise CommitLost(f"delta-rs did not commit to {path} at version {txn_version(read_version)}: {e}; "
                             "the table moved on since this refresh read it") from e
    else:  # spark, or spark-dv (the same MERGE; the table has deletion vectors on)
        session = _session(spark, record, read_version)
        frame = session.createDataFrame(rows)
        if strategy == "APPEND":
            (frame.select(*[f"`{c}`" for c in stored]).write.format("delta").mode("append")
             .option("txnAppId", TXN_APP_ID).option("txnVersion", str(txn_version(read_version)))
             .option("userMetadata", _metadata(record)).save(path))
        else:
            view = f"__trickle_delta_{record['refresh_id']}"
            frame.createOrReplaceTempView(view)
            try:
                session.sql(statement(f"SELECT * FROM {view}"))
            finally:
                session.catalog.dropTempView(view)
    version = committed_version(spark, path, record, read_version)
    if version is None:
        return None
    return _counts(DeltaLog(spark, path).commit_info(version))


def applied(commit: str, record: dict[str, Any]) -> str:
    """The refresh record's ``apply``: how the delta is committed (``commit``), and which engine computed it
    (the record's ``delta_engine``, see :mod:`pipeline.local_engine`)."""
    engine = record.get("delta_engine")
    return commit + (f"; delta computed by {engine}" if engine else "")


def _merged_here(spark: Any, path: str, rows: Any, update: bool, record: dict[str, Any],
                 read_version: int) -> dict[str, int] | None:
    """Commit a MERGE with spark-trickle's own commit (:mod:`connectors.small_merge`) and return its counts; None
    when it cannot write this change: delta-rs' MERGE takes it then, and the record's ``apply`` (written into
    that commit) says so."""
    from connectors import deletion_vectors, small_merge

    log = DeltaLog(spark, path)
    meta = log.metadata(read_version)
    try:
        if meta is None:
            raise deletion_vectors.Unusable("the table's metadata is unknown")
        return small_merge.merge(path, read_version, deletion_vectors.live_files(log, read_version),
                                 deletion_vectors.arrow_schema(meta), rows, update, record,
                                 txn_version(read_version), TXN_APP_ID, meta.configuration)
    except deletion_vectors.Unusable as e:
        record["apply"] = applied(f"MERGE (delta-rs): the own merge cannot write this change ({e})", record)
        return None


def enable_deletion_vectors(spark: Any, path: str) -> None:
    """Turn deletion vectors on for a stream table (see :data:`pipeline.strategy.DV_ABOVE_ROWS`)."""
    spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")


def _counts(info: dict[str, Any]) -> dict[str, int]:
    """Rows inserted / updated / deleted, from a commit's metrics (Spark's or delta-rs' names)."""
    m = info.get("operationMetrics") or {}

    def get(*keys: str) -> int:
        return next((int(m[k]) for k in keys if k in m), 0)

    if str(info.get("operation", "")).upper() == "WRITE":
        return {"inserted": get("numOutputRows", "num_added_rows"), "updated": 0, "deleted": 0}
    return {"inserted": get("numTargetRowsInserted", "num_target_rows_inserted"),
            "updated": get("numTargetRowsUpdated", "num_target_rows_updated"),
            "deleted": get("numTargetRowsDeleted", "num_target_rows_deleted")}


def release_checkpoint(checkpointed: Any) -> None:
    """Free a local checkpoint's blocks now instead of whenever the JVM garbage-collects its RDD (shared by
    every writer that checkpoints a DataFrame: a refresh's delta, a fixpoint's held rows, a mirror batch)."""
    try:
        checkpointed._jdf.queryExecution().analyzed().rdd().unpersist(False)
    except Exception:  # noqa: BLE001 - only an optimisation; the context cleaner frees them eventually
        pass


#: Spark conf: create stream tables with deletion vectors, so a MERGE that touches a few rows of a large
#: file marks them deleted instead of rewriting the whole file (copy-on-write).
DELETION_VECTORS = "trickle.streamTable.deletionVectors"


#: Delta's default number of leaf columns it keeps statistics for (``delta.dataSkippingNumIndexedCols``)
_INDEXED_BY_DEFAULT = 32

#: Spark conf: the Parquet writer version of the files Spark writes into new stream tables: ``v2`` (the
#: default) or ``v1`` (Parquet's first page format and encodings, for a reader that cannot read v2)
PARQUET_WRITER = "trickle.streamTable.parquetWriterVersion"


def creation_options(schema: Any) -> dict[str, str]:
    """Table properties a new stream table of Spark ``schema`` is created with: its change feed, and no
    statistics for the last column when that is plain rows' ``__row_hash``. Why: a random 64-bit hash spans
    the whole range in any file of more than a few rows, so its min/max skip nothing (stored copies are
    found by per-file hash indexes, :mod:`connectors.hash_index`), while collecting them cost a FULL refresh
    of 10M rows 0.55 s of its 4.3 s (docs/BENCHMARKS.md, "FULL against the user's CTAS"). Delta applies
    these only when it creates the table; a later schema (an altered query) keeps the count, which then
    costs statistics, never rows."""
    options = {"delta.enableChangeDataFeed": "true"}
    names = schema.fieldNames()
    if names and names[-1] == ROW_HASH and (before := _leaves(schema) - 1) < _INDEXED_BY_DEFAULT:
        options["delta.dataSkippingNumIndexedCols"] = str(before)
    return options


def table_properties(spark: Any, schema: Any) -> dict[str, str]:
    """Every table property a new stream table is created with: :func:`creation_options`, deletion vectors
    when :data:`DELETION_VECTORS` asks, and how Spark writes its Parquet files. Delta hands a table's
    properties to the Parquet writer of every Spark write into it (a writer option does not reach it), so
    they hold whatever session writes, ``spark-submit``'s included, and for no other table:

    * ``parquet.writer.version`` (:data:`PARQUET_WRITER`, default ``v2``): delta-encoded integers and
      strings. ``__row_id`` is a counter within a FULL refresh, one delta bit-packed in a few bits instead of
      8 bytes; a 10M-row plain-rows table's files shrank from 189 to 117 MB and its FULL refresh from 4.1 to
      3.35 s (the user's CTAS: 2.9 s); Spark read it faster too (docs/BENCHMARKS.md, session 41). Spark,
      delta-rs, DuckDB and Polars read v2 pages.
    * no Parquet dictionary for ``__row_hash`` and ``__row_id``: values unique per row fill one for nothing."""
    version = spark.conf.get(PARQUET_WRITER, "v2").strip().lower()
    if version not in ("v1", "v2"):
        raise ValueError(f"{PARQUET_WRITER} = {version!r}: use v2 (the default) or v1")
    props = {**creation_options(schema), "parquet.writer.version": version,
             **{f"parquet.enable.dictionary#{c}": "false" for c in (ROW_HASH, ROW_ID) if c in schema.fieldNames()}}
    if spark.conf.get(DELETION_VECTORS, "false").lower() == "true":
        props["delta.enableDeletionVectors"] = "true"
    return props


def create(spark: Any, df: Any, path: str) -> bool:
    """Create an empty stream table of ``df``'s schema at ``path`` with :func:`table_properties` (its own
    commit, without a refresh record). False when a table exists there (another writer created it first),
    or when Spark refuses the CREATE (a column type its DDL does not take): the first overwrite then creates
    the table with the properties a write option can set (``delta.*``) and Spark's Parquet defaults."""
    props = table_properties(spark, df.schema)  # a bad setting is refused before anything is written
    if DeltaLog(spark, path).latest_version() is not None:
        return False
    listed = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in props.items())
    try:  # a schema, no data file (an empty DataFrame written would leave one behind the first overwrite)
        spark.sql(f"CREATE TABLE delta.{quote(path)} ({nullable(df.schema).toDDL()}) USING delta "
                  f"TBLPROPERTIES ({listed})")
    except Exception as e:  # noqa: BLE001 - see above: created by the overwrite instead
        if DeltaLog(spark, path).latest_version() is not None:
            return False  # another writer created it meanwhile
        _log.warning("stream table at %s: created without its Parquet properties (%s)", path,
                    (str(e).strip().splitlines() or [type(e).__name__])[0][:200])
        return False
    return True


def create_owned(spark: Any, name: str, definition: str) -> None:
    """``CREATE TABLE IF NOT EXISTS <name> <definition>`` for a managed table that only this job creates (a
    Kafka mirror, its dead-letter table, a transaction table). A creation a kill cut short is cleared first
    (:func:`connectors.storage.clear_interrupted_create`): Delta would refuse this CREATE at that location for
    good."""
    from connectors.storage import clear_interrupted_create, for_uri

    if not spark.catalog.tableExists(name):
        state = spark._jsparkSession.sessionState()
        where = str(state.catalog().defaultTablePath(state.sqlParser().parseTableIdentifier(name)).toString())
        if clear_interrupted_create(for_uri(where, spark), where):
            _log.warning("%s: deleted %s, the Delta log of a creation cut short (it held no commit)", name, where)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name} {definition}")


def nullable(schema: Any) -> Any:
    """``schema`` with every field, element and map value nullable, as Delta stores a DataFrame written into it.
    Why: a query's schema marks ``COUNT(*)`` and the like NOT NULL, and a table created with them keeps them
    until a Spark write replaces the schema. A run killed between the CREATE and the first overwrite left such
    a table, whose later commits by delta-rs and spark-trickle's own writer kept the constraint, and a removed
    group's change row (NULL in every stored column) then failed every refresh."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(schema, StructType):
        return StructType([StructField(f.name, nullable(f.dataType), True, f.metadata) for f in schema.fields])
    if isinstance(schema, ArrayType):
        return ArrayType(nullable(schema.elementType), True)
    if isinstance(schema, MapType):
        return MapType(nullable(schema.keyType), nullable(schema.valueType), True)
    return schema


def write_options(spark: Any, schema: Any) -> dict[str, str]:
    """The :func:`table_properties` a write option can set (``delta.*``), which Delta applies only when that
    write creates the table: a table :func:`create` could not make is still created with them."""
    return {k: v for k, v in table_properties(spark, schema).items() if k.startswith("delta.")}


def _leaves(schema: Any) -> int:
    """Leaf columns of a Spark struct type, as Delta counts them for its statistics."""
    from pyspark.sql.types import StructType

    return sum(_leaves(f.dataType) if isinstance(f.dataType, StructType) else 1 for f in schema.fields)


def overwrite(spark: Any, df: Any, path: str, record: dict[str, Any], read_version: int | None) -> dict[str, int]:
    """Replace the stream table's contents (FULL / REINITIALIZE) in one checked commit (see the module
    docstring); creates the table first (:func:`create`) when the refresh found none."""
    if read_version is None:  # a new table: created first, with its properties, which no write option sets
        create(spark, df, path)
    (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .options(**write_options(spark, df.schema))
     .option("userMetadata", _metadata(record)).option("txnAppId", TXN_APP_ID)
     .option("txnVersion", str(txn_version(read_version))).save(path))
    after = committed_version(spark, path, record, read_version)
    if after is None:
        raise CommitLost(f"the overwrite of {path} committed nothing (Delta skipped it)")
    actions = DeltaLog(spark, path).actions(after)
    m = next((a["commitInfo"] for a in actions if "commitInfo" in a), {}).get("operationMetrics", {})
    return {"inserted": int(m.get("numOutputRows", 0)), "updated": 0, "deleted": _removed_rows(actions)}


def _removed_rows(actions: list[dict[str, Any]]) -> int:
    """Rows the overwrite removed, from the statistics its remove actions carry: no Spark job."""
    total = 0
    for a in actions:
        stats = (a.get("remove") or {}).get("stats")
        if stats:
            total += int(json.loads(stats).get("numRecords", 0))
    return total
