"""A FULL refresh's collected result replacing a table by spark-trickle's own commit: every live file removed,
the new files added (one, or one per processor for many rows), in one commit.

Why: a FULL refresh of a small table collects its result to the driver and has delta-rs replace the table,
about twice as fast as Spark's writer at a million rows (:data:`pipeline.strategy.FULL_COLLECT_BYTES`). delta-rs
writes no table with the ``deletionVectors`` feature, which a plain-rows table gets as soon as a refresh marks
deleted copies (:mod:`connectors.deletion_vectors`), so an AUTO table that alternates DIFFERENTIAL and FULL
refreshes paid Spark's writer on every FULL: at 1M rows x 50% change 1.4 s against 1.0 s for the FULL table
beside it (docs/BENCHMARKS.md, session 78). A plain-rows table's FULL computed by DuckDB comes here too,
whatever its rows (:meth:`pipeline.refresh.Refresher._local_full`): Spark's writer costs them a row and a field
at a time.

The commit is what Spark's overwrite of such a table writes: a ``remove`` of each live file (with its deletion
vector, so the change feed reads its live rows as deleted), an ``add`` of each new file, ``commitInfo`` with the
refresh record as ``userMetadata`` and the idempotent-transaction marker, created put-if-absent at the version
after the one the refresh read (:func:`connectors.own_commit.commit`). No change-data file: the change feed of
an overwrite is its added and removed files.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from connectors import deletion_vectors, own_commit
from connectors.delta_log import DeltaLog
from connectors.storage import local_path


def overwrite(log: DeltaLog, rows: pa.Table, record: dict[str, Any], read_version: int, txn_version: int,
              app_id: str) -> dict[str, int]:
    """Replace the table's rows at ``read_version`` with ``rows`` (its columns, in its types) in one commit;
    the counts of rows inserted and deleted. CommitFailed when another writer committed first."""
    root = local_path(log.path)
    assert root is not None, log.path  # callers check own_commit.unusable, which refuses other stores
    files = deletion_vectors.live_files(log, read_version)
    before = deletion_vectors.live_rows(log, read_version)
    now = own_commit.now_ms()
    removes = [{"remove": _removed(add, now)} for add in files.values()]
    meta = log.metadata(read_version)
    added = _added(root, rows, now, meta.configuration if meta else None)
    own_commit.commit(root, read_version, [*removes, *added], "WRITE", {"mode": "Overwrite", "partitionBy": "[]"},
                      {"numFiles": len(added), "numOutputRows": rows.num_rows, "numRemovedFiles": len(removes)},
                      record, txn_version, app_id, "overwrite")
    own_commit.forget_written([os.path.join(root, unquote(a["path"])) for a in files.values()])
    return {"inserted": rows.num_rows, "updated": 0, "deleted": before or 0}


#: rows per file from which the new rows are written as several files, one per processor at most. Why: pyarrow
#: encodes a file on one thread; the 10M rows of the scan benchmark took 1.0-1.1 s as one file, 0.5 s as two
#: written side by side (session 81)
PART_ROWS = 1_000_000


def _added(root: str, rows: pa.Table, now: int, configuration: dict[str, str] | None) -> list[dict[str, Any]]:
    """The ``add`` actions of new files holding ``rows``: none for no row, one file below twice
    :data:`PART_ROWS`, else one per processor (at most one per :data:`PART_ROWS`), written in parallel."""
    if not rows.num_rows:
        return []
    parts = max(1, min(os.cpu_count() or 1, rows.num_rows // PART_ROWS))
    if parts == 1:
        return [own_commit.add_action(root, rows, now, configuration)[0]]
    from concurrent.futures import ThreadPoolExecutor

    size = -(-rows.num_rows // parts)
    with ThreadPoolExecutor(parts, thread_name_prefix="trickle-overwrite") as pool:
        return list(pool.map(lambda at: own_commit.add_action(root, rows.slice(at, size), now, configuration)[0],
                             range(0, rows.num_rows, size)))


def _removed(add: dict[str, Any], now: int) -> dict[str, Any]:
    """The ``remove`` of a live file, as Spark writes it: the file with its vector, its size and statistics."""
    removed = {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
               "partitionValues": add.get("partitionValues") or {}, "size": add["size"]}
    for key in ("stats", "tags", "deletionVector", "baseRowId", "defaultRowCommitVersion"):
        if add.get(key) is not None:
            removed[key] = add[key]
    return removed
