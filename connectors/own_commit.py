"""Delta commits written by spark-trickle itself, without Spark or delta-rs: new data and change-data files,
their statistics, and the commit file, created put-if-absent.

Why: a refresh whose change is small pays mostly for its commit, and each engine's commit has a cost of its
own that the change does not need: Spark's is a job and a second of planning, delta-rs' MERGE 22-28 ms for a
few rows and a rewrite of every file a deleted row is in. Two commits are written here instead: deleted rows
marked in deletion vectors (:mod:`connectors.deletion_vectors`) and a small keyed table's MERGE
(:mod:`connectors.small_merge`). Both carry what a Spark MERGE's commit carries (data, change-data files,
``commitInfo`` with the refresh record as ``userMetadata``, the idempotent-transaction marker), so readers
and the frontier protocol cannot tell them apart.

The commit file is created by put-if-absent (a hard link of a finished temporary file), so it lands at exactly
the version after the one the refresh read, or not at all (:class:`~connectors.delta_rs.CommitFailed`). That
is atomic on a local file system only; each caller refuses other stores.

Durability (``trickle.commit.fsync``, default false): a process that dies loses nothing either way, since its
writes are in the kernel's page cache; only a power loss or a kernel crash can lose what was not on the disk.
Off, the files are left to the kernel, as Spark's and delta-rs' commits leave them on a local disk. On, every
file is on the disk before the log entry names it: data, change-data and vector files and their folders are
synced, then the entry, then the log folder after the link, so a commit that survives a power loss is whole.
Syncing the entry alone (what was done before the setting) left the files it names unsynced, a table that
could lose its data under a durable entry, for 0.3-0.6 ms a refresh.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors.delta_log import TRICKLE_KEY
from connectors.delta_rs import CommitFailed, parquet_layout
from connectors.storage import local_path, write_new, write_whole

ENGINE = "spark-trickle"
#: writer features honoured here: change data and vectors are written as Spark writes them, timestamps without
#: time zone are Arrow's, and :func:`unusable` checks that no append-only flag, invariant or constraint is set
WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "deletionVectors",
                             "timestampNtz"})
READER_FEATURES = frozenset({"deletionVectors", "timestampNtz"})


#: the Spark setting that syncs commits written here to the disk (see the module docstring)
FSYNC = "trickle.commit.fsync"
#: the settings of the refresh writing a commit (None: not inside :func:`synced`)
_SETTINGS: ContextVar[Any] = ContextVar("settings", default=None)


@contextmanager
def synced(conf: Any) -> Iterator[None]:
    """Commits written inside the block are synced to the disk when ``conf``'s :data:`FSYNC` is true, asked
    only when a commit is written (a refresh that commits nothing reads no setting for it)."""
    token = _SETTINGS.set(conf)
    try:
        yield
    finally:
        _SETTINGS.reset(token)


def syncing() -> bool:
    """Whether the commit being written is synced (see :func:`synced`)."""
    conf = _SETTINGS.get()
    return conf is not None and str(conf.get(FSYNC, "false")).strip().lower() == "true"


def unusable(path: str, protocol: dict[str, Any] | None, configuration: dict[str, str], partitioned: bool,
             schema_json: str = "") -> str | None:
    """Why a commit written here may not go to this table (None: it may): a store without an atomic
    put-if-absent, partitions, a protocol feature not honoured here, or a rule a writer must enforce."""
    if local_path(path) is None:
        return "the table is not on a local file system (the commit file's put-if-absent is local only)"
    if protocol is None:
        return "the table's protocol is unknown"
    if partitioned:
        return "the table is partitioned"
    reader, writer = int(protocol.get("minReaderVersion", 1)), int(protocol.get("minWriterVersion", 2))
    if reader not in (1, 3) or writer in (5, 6) or writer > 7 or (reader == 3 and writer != 7):
        return f"protocol ({reader}, {writer}) is not written here (column mapping, identity columns)"
    if writer == 7:
        extra = sorted((set(protocol.get("writerFeatures") or ()) - WRITER_FEATURES)
                       | (set(protocol.get("readerFeatures") or ()) - READER_FEATURES))
        if extra:
            return f"table features not written here: {', '.join(extra)}"
    if str(configuration.get("delta.appendOnly", "false")).lower() == "true":
        return "the table is append-only"
    if any(k.startswith("delta.constraints.") for k in configuration):
        return "the table has CHECK constraints"
    if "delta.invariants" in schema_json or "delta.generationExpression" in schema_json:
        return "the table has invariants or generated columns"
    return None


def now_ms() -> int:
    return int(time.time() * 1000)


def file_stats(table: pa.Table) -> str:
    """Delta statistics of a new file: rows, nulls of top-level columns, bounds of integer and date columns."""
    doc: dict[str, Any] = {"numRecords": table.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for name in table.column_names:
        column, kind = table[name], table.schema.field(name).type
        if pa.types.is_nested(kind):
            continue
        doc["nullCount"][name] = column.null_count
        if (pa.types.is_integer(kind) or pa.types.is_date32(kind)) and column.null_count < len(column):
            bounds = pc.min_max(column).as_py()
            doc["minValues"][name], doc["maxValues"][name] = (
                (str(bounds["min"]), str(bounds["max"])) if pa.types.is_date32(kind) else (bounds["min"], bounds["max"]))
    return json.dumps(doc, separators=(",", ":"))


#: files of fewer rows are written without Parquet's own column statistics and dictionaries. Why: a small table's
#: MERGE writes two files of a few rows a refresh, and the two cost 0.1 of their 0.45 ms (session 61, right after
#: the delta); a file of one row group this small skips nothing by them (Delta's statistics in the log skip files,
#: :func:`file_stats`), and a dictionary saves no bytes
LEAN_BELOW_ROWS = 10_000


def write_parquet(root: str, folder: str, prefix: str, table: pa.Table,
                  configuration: dict[str, str] | None = None) -> tuple[str, int]:
    """Write ``table`` as a new uniquely named file under ``root``/``folder``: its path relative to the root
    (as the log names it) and its size. A file of at least :data:`LEAN_BELOW_ROWS` rows follows the Parquet
    layout of the table's properties (``configuration``), as Spark's writer and delta-rs' do. Why: with
    Arrow's defaults (a dictionary for every column, ``__row_id`` plain) a FULL's 1.5M rows of the scan
    benchmark took 39 MiB against 26 MiB, and crossed :data:`pipeline.strategy.FULL_COLLECT_BYTES`, so the
    next FULL of that table went back to Spark's writer (docs/BENCHMARKS.md, session 78)."""
    rel = f"{folder}{prefix}-{uuid.uuid4()}.c000.snappy.parquet"
    full = os.path.join(root, rel)
    # encoded in memory, then written by the OS: Arrow's own file output cost a small file about half of its
    # write (0.1 of 0.23 ms)
    sink = pa.BufferOutputStream()
    lean = table.num_rows < LEAN_BELOW_ROWS
    options = {"use_dictionary": False} if lean else _layout_options(table.schema, configuration or {})
    pq.write_table(table, sink, compression="snappy", write_statistics=not lean, **options)
    data = sink.getvalue()
    write_new(full, data, sync=syncing())
    return rel, data.size


def _layout_options(schema: pa.Schema, configuration: dict[str, str]) -> dict[str, Any]:
    """``pyarrow.parquet.write_table``'s options for the layout the table's properties ask
    (:func:`connectors.delta_rs.parquet_layout`): a dictionary for every leaf column but those of the columns
    listed without one, the delta-packed columns so encoded (in v1 pages, as delta-rs writes them)."""
    plain, packed = parquet_layout(configuration)
    options: dict[str, Any] = {"use_dictionary": True}
    if plain & set(schema.names):
        options["use_dictionary"] = [p for p in _leaf_paths(schema) if p.split(".", 1)[0] not in plain]
        if packed & set(schema.names):
            options["column_encoding"] = {c: "DELTA_BINARY_PACKED" for c in schema.names if c in packed}
    return options


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet leaf columns of ``schema`` by path (``s.a``, ``l.list.element``, ...): pyarrow takes a
    per-column dictionary setting by leaf, so a nested column named by its top level would lose its dictionary.
    Read off an empty file of the schema, as pyarrow itself names them."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    md = pq.ParquetFile(pa.BufferReader(sink.getvalue())).metadata
    return tuple(md.schema.column(i).path for i in range(md.num_columns))


#: rows of the data files written here, by absolute path, newest last (see :func:`written_rows`), with their
#: bytes; and the bytes of all kept. Why a running total: summing every kept table's ``nbytes`` per commit cost
#: 4 us per file kept, which grows with the refreshes a process made (thousands of small files fit the bound)
_WRITTEN: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()
_WRITTEN_LOCK = threading.Lock()
_written_bytes = 0
#: how many bytes of Arrow rows :data:`_WRITTEN` keeps in all, the oldest files going first: a bound on memory
#: whatever the row width (a small table's MERGE rewrites files of at most ``trickle.apply.ownMergeRowsBelow``
#: rows; the vectors' inserted rows are kept too, and are dropped first when they are large)
WRITTEN_BYTES_KEPT = 64 << 20


def written_rows(full_path: str) -> pa.Table | None:
    """The rows of a data file this process wrote with :func:`add_action`, without reading it; None when it
    was not written here or is no longer kept. Why: a small table's MERGE (:mod:`connectors.small_merge`)
    reads back every file its change touches, which its previous commit usually wrote: 1.3 ms of a 55 ms
    refresh (docs/BENCHMARKS.md, session 41). A Delta data file never changes after it is written and its
    name is unique, so the rows kept are the file's for as long as it exists."""
    key = os.path.normpath(full_path)
    with _WRITTEN_LOCK:
        kept = _WRITTEN.get(key)
        if kept is None:
            return None
        _WRITTEN.move_to_end(key)
        return kept[0]


def _remember_written(full_path: str, table: pa.Table) -> None:
    global _written_bytes
    size = table.nbytes
    if size > WRITTEN_BYTES_KEPT:
        return
    with _WRITTEN_LOCK:
        key = os.path.normpath(full_path)
        old = _WRITTEN.pop(key, None)
        _written_bytes += size - (old[1] if old is not None else 0)
        _WRITTEN[key] = (table, size)
        while _written_bytes > WRITTEN_BYTES_KEPT:
            _written_bytes -= _WRITTEN.popitem(last=False)[1][1]


def forget_written(full_paths: list[str]) -> None:
    """Drop the kept rows of files a commit removed: no later MERGE reads them."""
    global _written_bytes
    with _WRITTEN_LOCK:
        for path in full_paths:
            old = _WRITTEN.pop(os.path.normpath(path), None)
            if old is not None:
                _written_bytes -= old[1]


def add_action(root: str, table: pa.Table, now: int,
               configuration: dict[str, str] | None = None) -> tuple[dict[str, Any], str, int]:
    """A new data file holding ``table``, and its ``add`` action (with its path and size). ``configuration``:
    the table's properties, whose Parquet layout the file follows (:func:`write_parquet`)."""
    rel, size = write_parquet(root, "", "part-00000", table, configuration)
    _remember_written(os.path.join(root, rel), table)
    return ({"add": {"path": rel, "partitionValues": {}, "size": size, "modificationTime": now,
                     "dataChange": True, "stats": file_stats(table)}}, rel, size)


def cdc_action(root: str, changes: pa.Table, configuration: dict[str, str] | None = None) -> dict[str, Any]:
    """A change-data file holding ``changes`` (the table's columns, then ``_change_type``) and its action."""
    rel, size = write_parquet(root, "_change_data/", "cdc-00000", changes, configuration)
    return {"cdc": {"path": rel, "partitionValues": {}, "size": size, "dataChange": False}}


def with_change_type(rows: pa.Table, kind: str) -> pa.Table:
    return rows.append_column("_change_type", pa.repeat(pa.scalar(kind, pa.string()), rows.num_rows))


def commit(root: str, read_version: int, actions: list[dict[str, Any]], operation: str,
           parameters: dict[str, str], metrics: dict[str, int], record: dict[str, Any], txn_version: int,
           app_id: str, engine: str, blind_append: bool = False, now: int | None = None) -> None:
    """Create commit ``read_version + 1`` holding ``actions``, preceded by its ``commitInfo`` (the refresh
    record as ``userMetadata``) and the idempotent-transaction marker; CommitFailed when another writer made
    that version first."""
    now = now_ms() if now is None else now
    info = {"timestamp": now, "operation": operation, "operationParameters": parameters,
            "readVersion": read_version, "isolationLevel": "Serializable", "isBlindAppend": blind_append,
            "operationMetrics": {k: str(v) for k, v in metrics.items()},
            "userMetadata": json.dumps({TRICKLE_KEY: record}, sort_keys=True),
            "engineInfo": f"{ENGINE} {engine}"}
    lines = [{"commitInfo": info}, {"txn": {"appId": app_id, "version": txn_version, "lastUpdated": now}},
             *actions]
    sync = syncing()
    if sync:  # the new files' names on the disk before the entry that names them
        for folder in {os.path.dirname(os.path.join(root, unquote(a[k]["path"])))
                       for a in actions for k in ("add", "cdc") if k in a}:
            sync_folder(folder)
    put_if_absent(os.path.join(root, "_delta_log", f"{read_version + 1:020d}.json"),
                  "\n".join(json.dumps(a, separators=(",", ":")) for a in lines) + "\n", sync)


def put_if_absent(target: str, text: str, sync: bool = False) -> None:
    """Create ``target`` with ``text`` unless it exists (another writer's commit), whole or not at all (see
    :func:`connectors.storage.write_whole`). ``sync``: the file, then its folder, on the disk."""
    try:
        write_whole(target, text.encode("utf-8"), sync=sync)
    except FileExistsError as e:
        raise CommitFailed(f"version {os.path.basename(target)[:20].lstrip('0') or '0'} was committed by "
                           "another writer") from e
    if sync:
        sync_folder(os.path.dirname(target))


def sync_folder(folder: str) -> None:
    """The folder's entries (names created, linked or removed in it) on the disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
