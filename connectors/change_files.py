"""A small change window of a local Delta table read straight from the files its commits name: the Change Data
Feed as the protocol defines it, without opening the table.

The rule (Delta's): a commit that wrote change-data (``cdc``) files changed exactly the rows in them, each with
its ``_change_type``; a commit without any changed the rows of the data files it added (``insert``) and of those
it removed (``delete``), counting only files marked ``dataChange``. Rows carry the commit's version as
``_commit_version`` (``uint64``, as delta-rs gives it).

Why: a small refresh's delta on DuckDB read its window through delta-rs' change feed reader, which opens the
table at the window's end and plans a DataFusion query: 8.4 ms of a 30 ms delta for one commit of 100 changed
rows (docs/BENCHMARKS.md, session 49), while the window's few small files read in well under a millisecond.

Only the plain case is read here; anything else answers None and the caller reads the window through delta-rs:
a partitioned table or one with column mapping (files hold physical names and no partition values), a
``metaData`` action inside the window, a commit without change-data files that removed data (its deleted rows
are the removed files' rows less their vectors) or added a file with a deletion vector, a missing commit, or
a file that does not read as the table's schema, and a window whose files hold more than :data:`SMALL_BYTES`
(delta-rs reads those faster).
"""

from __future__ import annotations

import functools
import os
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.delta_log import DeltaLog
from connectors.storage import local_path

CHANGE_TYPE, COMMIT_VERSION = "_change_type", "_commit_version"


def read(path: str, first: int, last: int) -> pa.Table | None:
    """The change rows of commits ``first``..``last`` of the local table at ``path``: its columns, then
    ``_change_type`` and ``_commit_version``; None when the window is not the plain case (see the module
    docstring)."""
    root = local_path(path)
    if root is None or first < 1:
        return None
    log = DeltaLog(None, root)
    meta, before = log.metadata(last), log.metadata(first - 1)
    if (meta is None or before is None or meta.schema_json != before.schema_json or meta.partition_columns
            or (meta.configuration.get("delta.columnMapping.mode") or "none") != "none"):
        return None
    try:
        schema = _loose_schema(meta.schema_json)
    except Exception:  # noqa: BLE001 - a type pyspark's Arrow conversion refuses: delta-rs reads the window
        return None
    named: list[tuple[int, str | None, dict[str, Any]]] = []
    for version in range(first, last + 1):
        files = _files(log.actions(version))
        if files is None:
            return None
        named.extend((version, kind, f) for kind, f in files)
    sizes = [f.get("size") for _, _, f in named]
    if not all(isinstance(size, int) for size in sizes) or sum(sizes) > SMALL_BYTES:
        return None
    with_type = pa.schema([*schema, pa.field(CHANGE_TYPE, pa.string())])
    parts = [with_type.empty_table().append_column(COMMIT_VERSION, pa.array([], pa.uint64()))]
    for version, kind, f in named:
        if (table := _file(root, f, with_type if kind is None else schema)) is None:
            return None
        parts.append(_labelled(table, kind, version))
    return pa.concat_tables(parts)


#: the most bytes of files a window read here may have: above it delta-rs' reader, which reads its files in
#: parallel, is faster (one 160 KB file of 10K rows: 2.2 ms here, 2.8 ms there; three such files: 4.8 vs 4.2 ms;
#: three of 100K rows: 25 vs 18 ms)
SMALL_BYTES = 256 << 10


@functools.lru_cache(maxsize=64)
def _loose_schema(schema_json: str) -> pa.Schema:
    """The table's Arrow schema (as Spark reads its files), every field nullable: a change row of a deleted row
    may be NULL where the table is NOT NULL."""
    from connectors.deletion_vectors import arrow_schema
    from connectors.delta_log import TableMeta

    return pa.schema([f.with_nullable(True) for f in arrow_schema(TableMeta("", schema_json))])


def _files(actions: list[dict[str, Any]]) -> list[tuple[str | None, dict[str, Any]]] | None:
    """(change type, file action) of one commit's changed rows; the type None for change-data files (their rows
    carry their own)."""
    if not actions or any("metaData" in a for a in actions):
        return None
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    if cdc:
        return [(None, f) for f in cdc]
    removed = [a["remove"] for a in actions if "remove" in a and (a["remove"] or {}).get("dataChange", True)]
    added = [a["add"] for a in actions if "add" in a and (a["add"] or {}).get("dataChange", True)]
    if removed or any(f.get("deletionVector") for f in added):
        return None
    return [("insert", f) for f in added]


def _file(root: str, action: dict[str, Any], schema: pa.Schema) -> pa.Table | None:
    """A change or data file's rows in ``schema`` (by name, cast safely); None when it does not read so."""
    if action.get("partitionValues"):
        return None
    full = os.path.join(root, unquote(str(action["path"])))
    try:
        # ParquetFile, not read_table: read_table builds a dataset per call, twice the time for a small file
        with pq.ParquetFile(full) as f:
            table = f.read(columns=schema.names)
        return table.select(schema.names).cast(schema)
    except (OSError, KeyError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _labelled(table: pa.Table, kind: str | None, version: int) -> pa.Table:
    # pa.repeat, not a Python list: a 100K-row file's labels cost 6 ms as lists, 0.4 ms repeated
    if kind is not None:
        table = table.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(kind, pa.string()), table.num_rows))
    return table.append_column(COMMIT_VERSION, pa.repeat(pa.scalar(version, pa.uint64()), table.num_rows))
