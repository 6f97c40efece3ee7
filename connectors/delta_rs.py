"""Commits small deltas with delta-rs (the ``deltalake`` package) instead of a Spark write.

Why: a Spark write is several Spark jobs and about a second of driver work even for ten rows, while
delta-rs commits the same to the same Spark-created table in milliseconds (figures in docs/BENCHMARKS.md,
"Figures behind the code"). Once Spark has computed a small delta and handed it to the
driver as Arrow, committing it through delta-rs turns the write from most of a refresh into a rounding
error.

Why it is safe:

* The commit carries what a Spark commit carries: the data, the Change Data Feed files (delta-rs writes
  them for tables with ``delta.enableChangeDataFeed``), the refresh record as ``userMetadata`` and the
  idempotent-transaction marker (:data:`connectors.delta_sink.TXN_APP_ID`).
* It is checked like a Spark commit, and more strictly: the table is loaded at the version the refresh
  read its frontier at and committed with no retry, so the commit lands at exactly the next version or
  not at all (any concurrent commit, ours or a user's OPTIMIZE, makes it fail; the refresh then starts
  again). Local files get their atomic put-if-absent from delta-rs' rename without replace.
* :func:`unusable` refuses tables with protocol features delta-rs does not write (deletion vectors, row
  tracking, ...) and stores delta-rs cannot reach by the same URI as Spark; Spark's MERGE takes those.

Local tables only, on purpose (issue 18): a table on ``s3a://``, ``abfss://``, ``gs://``, ``hdfs://`` is
committed and read by Spark. delta-rs could reach S3 given options derived from Spark's Hadoop settings,
but only a subset of them (S3A's credential providers, per-bucket settings, encryption, requester-pays
have no one-to-one delta-rs option, and the other stores' connectors none at all), and a commit is only
as safe as the put-if-absent of its log entry: delta-rs gets it on S3 only when told the store honours
``If-None-Match`` (or with a DynamoDB lock), and a wrong guess loses commits silently. Spark's writer
needs nothing more than Spark itself (its log store for the scheme; on S3
``io.sparktrickle.S3ConditionalLogStore``), so correctness wins over the tens of milliseconds. Every
entry point here checks the path: readers answer None (the caller asks Spark), and a commit or an open
given a non-local path raises :class:`NotLocal` rather than reaching a store with no settings.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from connectors import vector_reads
from connectors.delta_log import TRICKLE_KEY, DeltaLog
from connectors.storage import local_path

#: Writer features delta-rs 1.x writes correctly (a table using any other one is left to Spark).
WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "timestampNtz"})


class CommitFailed(Exception):
    """delta-rs did not commit (the table moved past the version the refresh read, or a conflict)."""


class NotLocal(ValueError):
    """A delta-rs commit or open was asked for a table that is not on the local file system: a caller
    skipped :func:`unusable`. Spark must write (and read) it (see the module docstring)."""


def _local_or_refuse(path: str) -> str:
    """The local path of ``path``; :class:`NotLocal` for any other store, so that no delta-rs writer or reader
    is ever opened on a URI with none of the store's settings (it would reach the wrong endpoint, or AWS)."""
    local = local_path(path)
    if local is None:
        raise NotLocal(f"{path} is not on the local file system: delta-rs is used for local tables only, "
                       "Spark writes this one (see connectors/delta_rs.py)")
    return local


def unusable(path: str, protocol: dict[str, Any] | None) -> str | None:
    """Why delta-rs may not commit to the table at ``path`` (None: it may). ``protocol``: the table's Delta
    ``protocol`` action (from its checksum file, see :meth:`connectors.delta_log.DeltaLog.protocol`); None
    when unknown, and then delta-rs is not used."""
    if local_path(path) is None:
        return "the table is not on a local file system (delta-rs commits are used for local tables only)"
    if protocol is None:
        return "the table's protocol is unknown (no checksum file at its latest version)"
    reader, writer = int(protocol.get("minReaderVersion", 1)), int(protocol.get("minWriterVersion", 2))
    if writer > 7 or reader > 3:
        return f"protocol ({reader}, {writer}) is newer than delta-rs writes"
    features = set(protocol.get("writerFeatures") or ())
    if writer >= 6 and writer < 7:
        return "writer version 6 (identity columns) is left to Spark"
    extra = sorted(features - WRITER_FEATURES)
    if extra:
        return f"table features delta-rs does not write: {', '.join(extra)}"
    return None


#: reader features the readers here read exactly as Spark does (anything else, e.g. column mapping, leaves the
#: read to Spark): deletion vectors are applied by :mod:`connectors.vector_reads` (delta-rs decodes them, the
#: readers here drop the marked rows), and a change window whose deletions only vectors tell is refused there
READER_FEATURES = frozenset({"deletionVectors", "timestampNtz"})


def unreadable(protocol: dict[str, Any] | None) -> str | None:
    """Why a table with this ``protocol`` action is left to Spark to read (None: delta-rs reads it as Spark
    would). Reader version 2 is column mapping; version 3 lists its features."""
    if protocol is None:
        return "its protocol is unknown"
    reader = int(protocol.get("minReaderVersion", 1))
    if reader == 1:
        return None
    extra = sorted(set(protocol.get("readerFeatures") or ()) - READER_FEATURES) if reader == 3 else ["columnMapping"]
    return f"reader features {', '.join(extra)}" if extra or reader > 3 else None


def _unreadable_opened(table: Any) -> str | None:
    """:func:`unreadable` for a table delta-rs opened (column mapping: its files name columns otherwise)."""
    protocol = table.protocol()
    return unreadable({"minReaderVersion": protocol.min_reader_version,
                       "readerFeatures": list(protocol.reader_features or ())})


#: what delta-rs opened at a version for reading, most recently used last (see :func:`opened`)
_OPENED: OrderedDict[tuple[str, str, int], tuple[tuple[int, int, int], Any]] = OrderedDict()
_OPENED_MAX = 64
_OPENED_LOCK = threading.Lock()


def opened(path: str, version: int) -> Any:
    """The table at ``path`` as of ``version``, opened by delta-rs for reading only, shared with other readers of
    the same version. Why: opening replays the log from the last checkpoint (milliseconds that grow with
    the log), and one refresh opens a source at one version for its snapshot, its change window
    and its sizes, while every stream table over that source opens it again at the same version. A version is
    immutable, but a path can be a new table after a drop and re-create: the cached copy is used only while
    the version's commit file is the same file (inode, size, mtime). Callers must not write through it."""
    from deltalake import DeltaTable

    return _cached("table", path, version, lambda local: _forward(local, version) or DeltaTable(local, version=version))


#: references to a cached table while :func:`_forward` looks at it: the cache's entry, the local name, and
#: ``sys.getrefcount``'s own argument. One more means a reader holds it.
_ONLY_CACHED = 3


def _forward(local: str, version: int) -> Any | None:
    """The table at ``version``, made by moving the newest cached table of the same path that is older forward
    (delta-rs replays only the commits in between), or None. Why: a refresh opens each source at its new
    version, and opening from scratch replays the log from the last checkpoint: 4.7 ms against 1.3 ms for
    the floor benchmark's 1M-row source (docs/BENCHMARKS.md, "Session 47"), twice per small aggregate refresh.

    Safe because the older table is taken out of the cache first, and only when no one else holds it (its
    reference count: a cached table is shared by the readers of its version, and moving it would change what
    they read), and only while its own commit file is the one it was opened at (the same table, not one
    dropped and re-created under the path)."""
    root = os.path.abspath(local)
    with _OPENED_LOCK:
        older = max((k for k in _OPENED if k[0] == "table" and k[1] == root and k[2] < version),
                    key=lambda k: k[2], default=None)
        if older is None or _OPENED[older][0] != _stamp(local, older[2]):
            return None
        table = _OPENED[older][1]
        if sys.getrefcount(table) > _ONLY_CACHED:
            return None
        del _OPENED[older]
    try:
        table.load_as_version(version)
    except Exception:  # noqa: BLE001 - e.g. a commit in between is gone: the caller opens it afresh
        return None
    return table if table.version() == version else None


def dataset(path: str, version: int) -> Any:
    """The table's rows at ``version`` as a lazily scanned ``pyarrow.dataset`` (shared like :func:`opened`:
    building it casts every file's partition values and statistics, a few milliseconds per refresh), which a
    filter on a string column scans correctly also over files delta-rs' MERGE wrote (see
    :func:`_plain_strings_dataset`)."""
    def make(local: str) -> Any:
        table = opened(path, version)
        root = os.path.abspath(local)
        if why := _unreadable_opened(table):
            raise ValueError(f"{path} at version {version} is read by Spark: {why}")
        if vector_reads.table_enabled(table):  # delta-rs' pyarrow readers refuse the table: see vector_reads
            fragments, schema, file_format, filesystem = vector_reads.fragments(table, root)
            named = {os.path.normpath(os.path.join(root, f.path)): f.path for f in fragments}
            deleted = vector_reads.deleted_positions(table)
            unknown = sorted(set(deleted) - set(named))
            if unknown:
                raise ValueError(f"deletion vectors of files that are not live in {path} at version {version}: "
                                 f"{unknown[:3]}")
            return _plain_strings_dataset()(fragments, schema, file_format, filesystem, root=root,
                                            deleted={named[file]: at for file, at in deleted.items()})
        return _plain_strings_dataset()(*vector_reads.fragments(table, root), root=root)

    return _cached("dataset", path, version, make)


#: Delta's primitive types, as DuckDB names them; a table with a column of any other type is scanned as an Arrow
#: dataset (:func:`dataset`)
_DUCKDB_TYPES = {"string": "VARCHAR", "long": "BIGINT", "integer": "INTEGER", "short": "SMALLINT",
                 "byte": "TINYINT", "float": "FLOAT", "double": "DOUBLE", "boolean": "BOOLEAN", "binary": "BLOB",
                 "date": "DATE"}


def _duckdb_type(kind: Any) -> str | None:
    if not isinstance(kind, str):
        return None  # struct, array, map
    if kind.startswith("decimal(") and kind.endswith(")"):
        return f"DECIMAL{kind[len('decimal'):]}"
    return _DUCKDB_TYPES.get(kind)


def parquet_scan(path: str, version: int) -> str | None:
    """DuckDB SQL that reads the table's rows at ``version`` with DuckDB's own Parquet reader, or None where
    only :func:`dataset` reads them as Spark does: columns of other types than Delta's primitive ones,
    partition columns (their values live in the log), deletion vectors on live files, no file at all, file
    names DuckDB would read as a glob.

    Why: a differential refresh computed by DuckDB (:mod:`pipeline.local_engine`) reads a large source's
    snapshot through its key filters, and a Spark-written file is often one row group of 1.5M rows. pyarrow
    then evaluates the key filter's ranges row by row (one kernel pass per bound: 160 ms for TPC-H Q4's
    lineitem, 760 ms for Q21's whole scan), where DuckDB's reader filters the same rows in a fraction of
    that, on its own threads (docs/BENCHMARKS.md, "Session 66").

    Safe because every column is cast to the type Spark reads it as (a no-op where the file holds that type,
    removed by DuckDB's optimiser, so filters still reach the reader); files written before a column was
    added have it read as NULL (``union_by_name``), as Delta reads them; a column no file holds fails when
    the view is made, and the caller scans the Arrow dataset instead."""
    def make(local: str) -> str | None:
        table = opened(path, version)
        if _unreadable_opened(table) or table.metadata().partition_columns:
            return None
        if vector_reads.table_enabled(table):
            import pyarrow as pa

            if pa.table(table.deletion_vectors()).num_rows:
                return None
        columns = []
        for field in json.loads(table.schema().to_json())["fields"]:
            kind = _duckdb_type(field["type"])
            if kind is None:
                return None
            name = '"' + field["name"].replace('"', '""') + '"'
            columns.append(f"CAST({name} AS {kind}) AS {name}")
        files = table.file_uris()
        if not files or any(c in f for f in files for c in "*?[{'"):
            return None
        listed = ", ".join(f"'{os.path.abspath(f)}'" for f in files)
        return f"SELECT {', '.join(columns)} FROM read_parquet([{listed}], union_by_name = true)"

    return _cached("parquet_scan", path, version, make)


def _holds(kind: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``test`` holds for the Arrow type ``kind`` or any type nested in it."""
    pending = [kind]
    while pending:
        k = pending.pop()
        if test(k):
            return True
        pending.extend(k.field(i).type for i in range(k.num_fields))
    return False


def _is_view(kind: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_string_view(kind) or pa.types.is_binary_view(kind) or pa.types.is_list_view(kind)
            or pa.types.is_large_list_view(kind))


def _is_bytes(kind: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind) or _is_view(kind))


#: bytes of files (as stored) up to which a scan reads the files it must read whole (those with a deletion
#: vector; those with view types, for a filter on strings) into memory at once, and scans them beside the others
#: as one Arrow dataset. Why: read one at a time instead, their batches reach the scan through a Python
#: generator, so every batch of the whole scan waits for the GIL (40x slower beside a busy Python thread,
#: docs/BENCHMARKS.md "Session 51"), and Arrow threads that wait for the GIL inside a scan's lock are the
#: pattern that once deadlocked DuckDB's scans (see :func:`dataset`). Larger sets are still streamed that way,
#: one file in memory at a time.
READ_WHOLE_BYTES = 16 << 20

#: whether a table's Parquet file declares Arrow view types, by (table folder, file path); a file never changes
_VIEWS: OrderedDict[tuple[str, str], bool] = OrderedDict()
_VIEWS_MAX = 1 << 16
_VIEWS_LOCK = threading.Lock()


@functools.cache
def _plain_strings_dataset() -> type:
    """The ``FileSystemDataset`` class :func:`dataset` returns (made on first use: pyarrow is imported only
    when needed).

    Why: delta-rs' MERGE (:func:`merge`, :func:`upsert_keyed`: stream tables and Kafka mirrors) writes strings
    and binaries into Parquet as Arrow's ``string_view`` / ``binary_view``, nested ones too (DataFusion reads
    the target so, and delta-rs 1.x writes what it read; its MERGE takes no session setting to stop it), and
    pyarrow (26) tests a filter against a row group's statistics in the file's own types: a string filter,
    typed by the dataset's plain ``string``, meets a ``string_view`` minimum and fails ("Function 'equal' has
    no kernel matching input types (string, string_view)"; only where the column holds no NULL in the row
    group, else its statistics read "in range or NULL", which pyarrow does not simplify by). DuckDB pushes its
    filters into the scan (calling the dataset's own ``scanner``), so every delta filtering such a table by a
    string went to Spark. Files written so stay in a table until rewritten, so the read adapts: a filter on a
    column holding strings or binaries skips files by their Delta statistics as before; files with view
    types are read unfiltered (pyarrow casts their batches to the dataset's plain types, which DuckDB reads as
    it reads any other) and filtered after, the others are scanned as before (their row groups skipped by
    statistics). A file delta-rs' MERGE wrote holds the rows it rewrote in one row group, so little skipping
    is lost. Filters on other columns, which pyarrow tests only against their own columns' statistics, are
    scanned as before. Files with a deletion vector are read whole too, in file order, their marked rows
    dropped, and filtered after. Files read whole are held in memory, with the columns the scan does not ask for
    left NULL, and scanned with the others as one Arrow dataset (up to :data:`READ_WHOLE_BYTES`)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    class PlainStrings(pads.FileSystemDataset):
        def __init__(self, fragments: list[Any], schema: Any, format: Any, filesystem: Any, root: str,
                     deleted: dict[str, Any] | None = None) -> None:
            super().__init__(fragments, schema, format, filesystem)
            self.root = root
            self.deleted = deleted or {}

        def scanner(self, columns: Any = None, filter: Any = None, **options: Any) -> Any:  # noqa: A002
            named = self._named(filter, self.schema) if filter is not None else []
            by_bytes = any(_holds(f.type, _is_bytes) for f in named)
            if not self.deleted and not by_bytes:
                return super().scanner(columns=columns, filter=filter, **options)
            kept = list(self.get_fragments(filter=filter) if filter is not None else self.get_fragments())
            whole = [f for f in kept if f.path in self.deleted or (by_bytes and self._views(f))]
            taken = {f.path for f in whole}
            scanned = self._part([f for f in kept if f.path not in taken])
            if not whole:
                return scanned.scanner(columns=columns, filter=filter, **options)
            # the scan's columns and the filter's; all of them when the filter names a field by position, since a
            # column it reads that was not read here would be held as NULL
            wanted = None if columns is None or "FieldPath" in str(filter) else [
                *columns, *(f.name for f in named if f.name not in columns)]
            stored = sum(i.size or 0 for i in self.filesystem.get_file_info([f.path for f in whole]))
            if stored <= READ_WHOLE_BYTES:
                rows = pa.concat_tables([self._live_rows(f, wanted) for f in whole])
                held = pa.table({f.name: rows[f.name] if f.name in rows.column_names
                                 else pa.nulls(rows.num_rows, f.type) for f in self.schema}, schema=self.schema)
                return pads.dataset([scanned, pads.dataset(held)]).scanner(columns=columns, filter=filter,
                                                                            **options)
            first = scanned.scanner(columns=columns, filter=filter, **options)
            schema = self.schema if wanted is None else pa.schema([self.schema.field(c) for c in wanted])
            read = pa.RecordBatchReader.from_batches(
                schema, (b for f in whole for b in self._live_rows(f, wanted).to_batches()))
            after = pads.Scanner.from_batches(read, columns=columns, filter=filter)

            def batches() -> Any:
                yield from first.to_batches()
                yield from after.to_batches()

            return pads.Scanner.from_batches(pa.RecordBatchReader.from_batches(first.projected_schema, batches()))

        def _part(self, fragments: list[Any]) -> Any:
            return pads.FileSystemDataset(fragments, self.schema, self.format, self.filesystem)

        def _live_rows(self, fragment: Any, columns: list[str] | None) -> Any:
            """A file's ``columns`` in the dataset's types, in file order, without the rows its vector marks."""
            import numpy as np

            rows = self._part([fragment]).to_table(columns=columns)
            at = self.deleted.get(fragment.path)
            if at is None:
                return rows
            keep = np.ones(rows.num_rows, dtype=bool)
            keep[at[at < rows.num_rows]] = False
            return rows.filter(pa.array(keep))

        @staticmethod
        def _named(expression: Any, schema: Any) -> list[Any]:
            """The columns of ``schema`` whose names appear in the text of the pyarrow ``expression`` (which
            offers no list of the fields it reads): every column it reads (its text names them verbatim), and
            any other whose name happens to appear in it (read for nothing)."""
            text = str(expression)
            return [f for f in schema if f.name in text]

        def _views(self, fragment: Any) -> bool:
            """Whether the fragment's file declares view types (its footer read once per file and process)."""
            key = (self.root, fragment.path)
            with _VIEWS_LOCK:
                known = _VIEWS.get(key)
            if known is None:
                known = any(_holds(f.type, _is_view) for f in fragment.physical_schema)
                with _VIEWS_LOCK:
                    _VIEWS[key] = known
                    while len(_VIEWS) > _VIEWS_MAX:
                        _VIEWS.popitem(last=False)
            return known

    return PlainStrings


def _stamp(local: str, version: int) -> tuple[int, int, int] | None:
    """Which file the commit of ``version`` is (inode, size, mtime): a table dropped and re-created under the
    same path reuses version numbers, never this. None when the commit file is gone (only a checkpoint)."""
    try:
        st = os.stat(os.path.join(local, "_delta_log", f"{version:020d}.json"))
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _cached(kind: str, path: str, version: int, make: Any) -> Any:
    local = _local_or_refuse(path)
    stamp = _stamp(local, version)
    if stamp is None:  # only a checkpoint left for this version, or none: no cache
        return make(local)
    key = (kind, os.path.abspath(local), version)
    with _OPENED_LOCK:
        hit = _OPENED.get(key)
        if hit is not None and hit[0] == stamp:
            _OPENED.move_to_end(key)
            return hit[1]
    value = make(local)
    with _OPENED_LOCK:
        _OPENED[key] = (stamp, value)
        _OPENED.move_to_end(key)
        while len(_OPENED) > _OPENED_MAX:
            _OPENED.popitem(last=False)
    return value


def read_small(path: str, version: int, max_bytes: int, max_rows: int) -> Any | None:
    """The table's rows at ``version`` as Arrow when its data files total at most ``max_bytes`` and hold at
    most ``max_rows`` rows (None when larger, or when delta-rs cannot read it). Rows matter as much as bytes:
    the rows become a local relation inside Spark's plan, which is planned and shipped with every task. Why: a refresh whose delta reads the stream table's own rows
    (an aggregate's stored state) otherwise has Spark load a snapshot of a table delta-rs committed to,
    which writes no checksum file, so Spark replays the log with two Spark jobs first; a small table read
    here costs milliseconds and no job (figures in docs/BENCHMARKS.md, "Figures behind the code")."""
    if local_path(path) is None or max_bytes <= 0:
        return None
    try:
        table = opened(path, version)
        adds = table.get_add_actions(flatten=True)
        if sum(adds.column("size_bytes").to_pylist()) > max_bytes:
            return None
        if "num_records" not in adds.column_names or sum(n or 0 for n in adds.column("num_records").to_pylist()) > max_rows:
            return None  # (a file's records count its rows marked deleted too: the limit errs on the safe side)
        return _rows(path, version)
    except Exception:  # noqa: BLE001 - an optimisation only: Spark reads the table instead
        return None


def read_changes(path: str, first: int, last: int, max_rows: int) -> Any | None:
    """The Change Data Feed of commits ``first``..``last`` as Arrow (the table's columns, then
    ``_change_type``, ``_commit_version``, ``_commit_timestamp``, as Spark's ``table_changes`` gives them);
    None when it holds more than ``max_rows`` rows, or when delta-rs cannot read it. The caller has checked
    the protocol (:func:`unreadable`) and the window's bytes. Why: Spark plans a change feed as a query of its
    own (the window's commits listed and read, its files scanned by tasks) inside every delta job; a small
    window read here costs milliseconds. Compared with ``table_changes`` on every window of a table changed by
    INSERT, MERGE, UPDATE, DELETE of rows, of whole partitions and of everything: the same rows. A window
    holding a commit whose change only its deletion vectors tell is left to Spark
    (:meth:`connectors.delta_log.DeltaLog.marked_without_changes_between`)."""
    local = local_path(path)
    if local is None:
        return None
    import pyarrow as pa

    try:
        table = opened(path, last)
        # DeltaLog reads a local log without Spark, through the refresh's one read of each commit file
        if vector_reads.table_enabled(table) and DeltaLog(None, local).marked_without_changes_between(
                first - 1, last) is not None:
            return None
        table = pa.table(table.load_cdf(starting_version=first, ending_version=last))
    except Exception:  # noqa: BLE001 - an optimisation only: Spark reads the change feed instead
        return None
    return table if table.num_rows <= max_rows else None


def rows_with(path: str, version: int, columns: list[str], key: str, values: Any) -> Any | None:
    """``columns`` of the table's rows at ``version`` whose ``key`` is in ``values`` (an Arrow array), read
    without Spark; None when the table is not local or delta-rs cannot read it (the caller asks Spark). The
    caller has checked the protocol (:func:`unreadable`)."""
    if local_path(path) is None:
        return None
    import pyarrow.compute as pc

    try:
        return _rows(path, version, columns, pc.field(key).isin(values))
    except Exception:  # noqa: BLE001 - Spark reads the table instead
        return None


def _rows(path: str, version: int, columns: list[str] | None = None, where: Any = None) -> Any:
    """The table's rows at ``version`` (``columns`` of those matching the pyarrow expression ``where``) as Arrow,
    through :func:`dataset` rather than delta-rs' ``to_pyarrow_table``: files read by Arrow's own file system
    (delta-rs' is Python, every read waiting for the GIL; see :func:`connectors.vector_reads.local_filesystem`),
    files with deletion vectors read as Spark reads them (delta-rs' pyarrow readers refuse them), and a filter
    on strings of files delta-rs' MERGE wrote scanned correctly."""
    return dataset(path, version).to_table(columns=columns, filter=where)


def file_rows(path: str, version: int) -> list[int] | None:
    """Rows of each live data file at ``version``, from the files' statistics (None when unknown)."""
    if local_path(path) is None:
        return None
    try:
        counts = opened(path, version).get_add_actions(flatten=True).column("num_records").to_pylist()
    except Exception:  # noqa: BLE001 - only an estimate
        return None
    return None if any(n is None for n in counts) else [int(n) for n in counts]


#: ``delta.checkpointInterval`` when the table does not set it (Spark's default)
CHECKPOINT_INTERVAL = 10


def checkpoint_due(version: int, configuration: dict[str, str]) -> bool:
    """Whether a commit that made ``version`` is one a log checkpoint follows: a multiple of the table's
    ``delta.checkpointInterval``, as for Spark's commits. Why: spark-trickle's own commits write none, and
    delta-rs' only every 100 commits, while every reader (delta-rs opening the table for a refresh's
    snapshot, Spark, a DeltaLog without this process's state) replays the log from the last checkpoint:
    opening a stream table after 40 own commits took 10-15 ms, a cost that grew with every refresh."""
    try:
        interval = int(configuration.get("delta.checkpointInterval") or CHECKPOINT_INTERVAL)
    except ValueError:
        interval = CHECKPOINT_INTERVAL
    return interval > 0 and version > 0 and version % interval == 0


def checkpoint(path: str, version: int, shared: bool = True) -> bool:
    """Write a classic checkpoint of the local table at ``version`` unless one is there (Spark writes its own
    commits'); whether it wrote one. The caller checked that the table's features are ones written here:
    delta-rs keeps deletion vectors and change data settings in it, and Spark reads it. ``shared=False``
    opens a table of its own rather than :func:`opened`'s, for a thread other than the readers' (see
    :mod:`connectors.log_checkpoints`)."""
    from deltalake import DeltaTable

    local = _local_or_refuse(path)
    if os.path.exists(os.path.join(local, "_delta_log", f"{version:020d}.checkpoint.parquet")):
        return False
    (opened(path, version) if shared else DeltaTable(local, version=version)).create_checkpoint()
    return True


def table_rows(path: str, version: int) -> int | None:
    """Rows of the table at ``version`` from its files' statistics (None when unknown)."""
    counts = file_rows(path, version)
    return None if counts is None else sum(counts)


def table_bytes(path: str, version: int) -> int | None:
    """Bytes of the table's data files at ``version`` (None when delta-rs cannot tell): the size of a table
    whose latest commits came from delta-rs, which writes no checksum file to read it from."""
    if local_path(path) is None:
        return None
    try:
        return int(sum(opened(path, version).get_add_actions(flatten=True).column("size_bytes").to_pylist()))
    except Exception:  # noqa: BLE001 - only an estimate
        return None


def _properties(record: dict[str, Any], txn_version: int, app_id: str) -> Any:
    from deltalake import CommitProperties, Transaction

    meta = json.dumps({TRICKLE_KEY: record}, sort_keys=True)
    return CommitProperties(custom_metadata={"userMetadata": meta}, max_commit_retries=0,
                            app_transactions=[Transaction(app_id, txn_version)])


def _normalized(rows: Any) -> Any:
    """``rows`` with freshly built buffers. Spark's ``toArrow`` gives an empty string array inside a list an
    offsets buffer of length 0, which the Arrow format allows for empty arrays but delta-rs' MERGE (arrow-rs
    59) slices past: it panics ("range start index ... out of range for slice of length 0"; seen with an
    aggregate state holding ``array()``). ``take`` rebuilds every array in canonical form."""
    import pyarrow as pa

    return rows.take(pa.array(range(rows.num_rows), type=pa.int64()))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def merge(path: str, changes: Any, stored: list[str], update: bool, record: dict[str, Any], read_version: int,
          txn_version: int, app_id: str) -> dict[str, int]:
    """Apply change rows (``__row_id``, ``__del`` and the stored columns; see :mod:`dvm.plan`) in one commit:
    matched and ``__del`` -> delete, matched -> update (``update``: keyed tables, whose rows carry state),
    not matched and not ``__del`` -> insert."""
    with _committing(path, read_version) as table:
        builder = table.merge(_normalized(changes), predicate="t.__row_id = s.__row_id", source_alias="s",
                              target_alias="t", commit_properties=_properties(record, txn_version, app_id),
                              writer_properties=writer_properties(table.metadata().configuration))
        builder = builder.when_matched_delete(predicate="s.__del")
        if update:
            builder = builder.when_matched_update(
                updates={_quote(c): f"s.{_quote(c)}" for c in stored if c != "__row_id"})
        builder = builder.when_not_matched_insert(updates={_quote(c): f"s.{_quote(c)}" for c in stored},
                                                  predicate="NOT s.__del")
        metrics = _execute(builder.execute)
    return {"inserted": int(metrics.get("num_target_rows_inserted", 0)),
            "updated": int(metrics.get("num_target_rows_updated", 0)),
            "deleted": int(metrics.get("num_target_rows_deleted", 0))}


def upsert_keyed(path: str, rows: Any, keys: list[str], columns: list[str], kept: dict[str, str],
                 metadata: dict[str, Any], read_version: int, app_id: str, txn_version: int) -> bool:
    """Apply netted change events to a mirror in one commit: ``rows`` holds the mirror's ``columns``, ``__op``
    (``d``: delete the key; anything else: upsert it) and, for each column in ``kept``, a boolean column
    (``kept[column]``) true where the update must keep the mirror's value (a value the database did not
    send). False when the commit of this ``txn_version`` of ``app_id`` is already in the table (a replayed
    batch: nothing is written), True once committed. The commit carries ``metadata`` as ``userMetadata``."""
    from deltalake import CommitProperties, Transaction

    with _committing(path, read_version) as table:
        done = table.transaction_version(app_id)
        if done is not None and done >= txn_version:
            return False
        props = CommitProperties(custom_metadata={"userMetadata": json.dumps(metadata, sort_keys=True)},
                                 max_commit_retries=0, app_transactions=[Transaction(app_id, txn_version)])
        on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in keys)
        builder = table.merge(_normalized(rows), predicate=on, source_alias="s", target_alias="t",
                              commit_properties=props)
        builder = builder.when_matched_delete(predicate="s.__op = 'd'")
        updates = {_quote(c): (f"CASE WHEN s.{_quote(kept[c])} THEN t.{_quote(c)} ELSE s.{_quote(c)} END"
                               if c in kept else f"s.{_quote(c)}") for c in columns if c not in keys}
        if updates:
            builder = builder.when_matched_update(updates=updates)
        builder = builder.when_not_matched_insert(updates={_quote(c): f"s.{_quote(c)}" for c in columns},
                                                  predicate="s.__op <> 'd'")
        _execute(builder.execute)
    return True


def writer_properties(configuration: dict[str, str]) -> Any:
    """How delta-rs writes a stream table's Parquet files, from the table properties Spark's writer reads
    (:func:`connectors.delta_sink.table_properties`), so files of either writer are alike: no dictionary for
    a column ``parquet.enable.dictionary#<column>`` turns it off for, and ``__row_id`` delta bit-packed when
    ``parquet.writer.version`` is ``v2`` (delta-rs writes v1 pages, in which the encoding is just as valid).
    None for a table without them (a mirror, a table created by another release)."""
    return _writer_properties(tuple(sorted((k, v) for k, v in configuration.items() if k.startswith("parquet."))))


def parquet_layout(configuration: dict[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """The Parquet layout a stream table's properties ask of every writer, as far as delta-rs and Arrow follow
    it: the columns written without a dictionary (``parquet.enable.dictionary#<column>`` = false), and those
    delta bit-packed (``__row_id`` among them when ``parquet.writer.version`` is ``v2``: a counter within a FULL
    refresh packs into a few bits; both write it in v1 pages, in which the encoding is just as valid). Shared
    by delta-rs' writes here and spark-trickle's own (:func:`connectors.own_commit.write_parquet`), so that
    files of every writer are alike."""
    prefix = "parquet.enable.dictionary#"
    plain = frozenset(k[len(prefix):] for k, v in configuration.items()
                      if k.startswith(prefix) and v.lower() == "false")
    v2 = configuration.get("parquet.writer.version", "").lower() == "v2"
    return plain, frozenset({"__row_id"} & plain if v2 else ())


@functools.lru_cache(maxsize=64)
def _writer_properties(props: tuple[tuple[str, str], ...]) -> Any:
    from deltalake import ColumnProperties, WriterProperties

    plain, packed = parquet_layout(dict(props))
    if not plain:
        return None
    return WriterProperties(column_properties={
        c: ColumnProperties(dictionary_enabled=False, **({"encoding": "DELTA_BINARY_PACKED"} if c in packed else {}))
        for c in sorted(plain)})


def append(path: str, rows: Any, record: dict[str, Any], read_version: int, txn_version: int,
           app_id: str) -> dict[str, int]:
    """Append rows in one commit (an insert-only delta into a table whose rows have unique ids)."""
    from deltalake import write_deltalake

    with _committing(path, read_version) as table:
        _execute(lambda: write_deltalake(table, _normalized(rows), mode="append",
                                         commit_properties=_properties(record, txn_version, app_id),
                                         writer_properties=writer_properties(table.metadata().configuration)))
    return {"inserted": rows.num_rows, "updated": 0, "deleted": 0}


def overwrite(path: str, rows: Any, record: dict[str, Any], read_version: int, txn_version: int,
              app_id: str) -> dict[str, int]:
    """Replace the table's rows in one commit (a FULL refresh whose result is small)."""
    from deltalake import write_deltalake

    with _committing(path, read_version) as table:
        before = table.count()
        _execute(lambda: write_deltalake(table, _normalized(rows), mode="overwrite",
                                         commit_properties=_properties(record, txn_version, app_id),
                                         writer_properties=writer_properties(table.metadata().configuration)))
    return {"inserted": rows.num_rows, "updated": 0, "deleted": before}


#: the table each stream table was last committed through, at the version that commit made, by path (see
#: :func:`_committing`); never shared with readers
_WRITERS: OrderedDict[str, tuple[tuple[int, int, int] | None, Any]] = OrderedDict()
_WRITERS_LOCK = threading.Lock()


@contextmanager
def _committing(path: str, version: int) -> Iterator[Any]:
    """The table at ``version`` to commit through: the one the previous commit went through, when that commit
    made ``version`` (the same commit file), else freshly opened; kept for the next commit when the block
    ends normally (a failed commit's table is dropped). Why: delta-rs updates a table to the version it
    committed, while opening one replays the log from its last checkpoint (a cost of every refresh that
    grows with the commits since the checkpoint). The caller holds the stream table's refresh
    lock, and the table is taken out while in use, so no two commits go through one object."""
    from deltalake import DeltaTable

    local = _local_or_refuse(path)
    key = os.path.abspath(local)
    with _WRITERS_LOCK:
        kept = _WRITERS.pop(key, None)
    table = kept[1] if kept is not None and kept[0] is not None and kept[0] == _stamp(local, version) else \
        DeltaTable(path, version=version)
    yield table
    stamp = _stamp(local, table.version())
    with _WRITERS_LOCK:
        _WRITERS[key] = (stamp, table)
        _WRITERS.move_to_end(key)
        while len(_WRITERS) > _OPENED_MAX:
            _WRITERS.popitem(last=False)


def _execute(fn: Any) -> Any:
    from deltalake.exceptions import CommitFailedError

    try:
        return fn()
    except CommitFailedError as e:
        raise CommitFailed(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
