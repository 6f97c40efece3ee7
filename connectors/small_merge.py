"""A small stream table's MERGE written by spark-trickle: the files its change rows touch are rewritten whole, in
one commit with the change-data file.

The rule (that of delta-rs' MERGE in :func:`connectors.delta_rs.merge`): a change row (``__row_id``, ``__del``
and the stored columns, see :mod:`dvm.plan`) that matches a stored row by ``__row_id`` deletes it when
``__del``, and replaces it otherwise when the table is keyed (its rows carry state); one that matches no row
is inserted unless ``__del``. Every file holding a matched row is read; its other rows, the replacements and
the inserted rows become one new file; the change feed is one change-data file (``delete``,
``update_preimage`` / ``update_postimage``, ``insert``), as Spark's MERGE writes it. An insert-only change
adds one file and no change-data file (its added file is the change feed).

Why: for a few changed rows delta-rs' MERGE costs 22-28 ms of its own (planning and running a DataFusion
join; measured outside the project the same), most of what a small aggregate's refresh adds to its delta,
while reading and rewriting a file of a few thousand rows costs a few milliseconds. Bounded by the table's
size (``trickle.apply.ownMergeRowsBelow``, see :mod:`pipeline.strategy`): the touched files are read into the
driver. Written by :mod:`connectors.own_commit` (local file systems only).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from connectors import own_commit
from connectors.deletion_vectors import Unusable, files_bounding, read_vector
from connectors.storage import local_path

ROW_ID, DEL = "__row_id", "__del"


def merge(path: str, read_version: int, files: dict[str, dict[str, Any]], schema: pa.Schema, changes: pa.Table,
          update: bool, record: dict[str, Any], txn_version: int, app_id: str,
          configuration: dict[str, str] | None = None) -> dict[str, int]:
    """Commit ``changes`` as version ``read_version + 1``. ``files``: the live ``add`` actions at
    ``read_version`` (:func:`connectors.deletion_vectors.live_files`); ``schema``: the table's Arrow schema
    (its columns are the stored columns). Unusable when the change cannot be written here (the caller
    commits it another way)."""
    root = local_path(path)
    if root is None:
        raise Unusable(f"{path} is not on a local file system")
    names = schema.names
    try:  # a removed row's change row is NULL in every stored column, NOT NULL ones included: checked when written
        incoming = changes.select(names)
        if incoming.schema != (loose := _loose(schema)):  # compared without metadata, as Arrow compares schemas
            incoming = incoming.cast(loose)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError, ValueError) as e:
        raise Unusable(f"the change rows do not fit the table's schema here: {e}") from e
    ids = incoming[ROW_ID].to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    # the matching in numpy, by sorted ids and a binary search: each Arrow kernel call (is_in, index_in, filter)
    # cost 20-50 us of its own, a dozen of them 0.5 ms beside a change of a hundred rows
    order = np.argsort(ids, kind="stable")
    wanted = ids[order]
    if len(wanted) > 1 and bool(np.any(wanted[1:] == wanted[:-1])):
        raise Unusable("several change rows share a __row_id")
    deleting = changes[DEL].to_numpy(zero_copy_only=False).astype(bool)
    touched = {rel: rows for rel in files_bounding(files, ROW_ID, wanted)
               if (rows := _live_rows(root, files[rel], schema)) is not None
               and _matching(rows[ROW_ID].to_numpy(zero_copy_only=False), wanted).any()}
    stored = (pa.concat_tables(list(touched.values())) if touched
              else schema.empty_table())
    stored_ids = stored[ROW_ID].to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    matched = _matching(stored_ids, wanted)
    at = np.flatnonzero(matched)  # the matched stored rows, in stored order
    change_of = order[np.searchsorted(wanted, stored_ids[at])]  # each one's change row
    found = np.zeros(len(ids), dtype=bool)
    found[change_of] = True
    gone = deleting[change_of]
    kept_at = np.flatnonzero(~matched)
    if update:
        replaced_at, replacing = at[~gone], change_of[~gone]
    else:  # a matched row that is not deleted stays as it is
        replaced_at, replacing = np.empty(0, np.int64), np.empty(0, np.int64)
        kept_at = np.sort(np.concatenate([kept_at, at[~gone]]))
    # one take of the stored rows (deleted, replaced, kept) and one of the change rows (replacements, inserted),
    # then slices: each Arrow call cost 20-70 us right after the delta, and there were five takes
    n_gone, n_pre = int(gone.sum()), len(replaced_at)
    old_rows = stored.take(np.concatenate([at[gone], replaced_at, kept_at]))
    deleted_rows, kept = old_rows.slice(0, n_gone), old_rows.slice(n_gone + n_pre)
    try:  # the replacements, then the inserted rows: one cast checks both
        written_new = incoming.take(np.concatenate([replacing, np.flatnonzero(~found & ~deleting)])).cast(schema)
    except (pa.ArrowInvalid, ValueError) as e:  # e.g. a NULL for a NOT NULL column: Spark's MERGE says which
        raise Unusable(f"the written rows do not fit the table's schema here: {e}") from e
    post, inserted = written_new.slice(0, len(replacing)), written_new.slice(len(replacing))

    now = own_commit.now_ms()
    actions: list[dict[str, Any]] = []
    written = pa.concat_tables([kept, written_new]).combine_chunks()
    if written.num_rows:
        actions.append(own_commit.add_action(root, written, now, configuration)[0])
    for rel in touched:
        add = files[rel]
        remove = {"path": rel, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                  "partitionValues": add.get("partitionValues") or {}, "size": add["size"]}
        if add.get("deletionVector"):
            remove["deletionVector"] = add["deletionVector"]
        actions.append({"remove": remove})
    if touched:  # the change feed: the deleted and replaced rows (one slice), then the written ones
        kinds = np.repeat(np.array(["delete", "update_preimage", "update_postimage", "insert"]),
                          [n_gone, n_pre, post.num_rows, inserted.num_rows])
        changed = pa.concat_tables([old_rows.slice(0, n_gone + n_pre), written_new]).combine_chunks()
        actions.append(own_commit.cdc_action(root, changed.append_column("_change_type", pa.array(kinds, pa.string())),
                                             configuration))
    metrics = {"numTargetRowsInserted": inserted.num_rows, "numTargetRowsUpdated": post.num_rows,
               "numTargetRowsDeleted": deleted_rows.num_rows, "numTargetRowsCopied": kept.num_rows,
               "numTargetFilesAdded": int(written.num_rows > 0), "numTargetFilesRemoved": len(touched)}
    own_commit.commit(root, read_version, actions, "MERGE", {"predicate": f"t.{ROW_ID} = s.{ROW_ID}"}, metrics,
                      record, txn_version, app_id, "small merge", blind_append=False, now=now)
    own_commit.forget_written([os.path.join(root, unquote(rel)) for rel in touched])
    return {"inserted": inserted.num_rows, "updated": post.num_rows, "deleted": deleted_rows.num_rows}


def _matching(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Which of ``ids`` are in ``wanted`` (sorted ascending, distinct)."""
    if not len(wanted):
        return np.zeros(len(ids), dtype=bool)
    i = np.minimum(np.searchsorted(wanted, ids), len(wanted) - 1)
    return wanted[i] == ids


def _live_rows(root: str, add: dict[str, Any], schema: pa.Schema) -> pa.Table | None:
    """A data file's rows not deleted by its vector, in the table's schema (None: none left)."""
    if add.get("partitionValues"):
        raise Unusable("the table is partitioned")
    full = os.path.join(root, unquote(add["path"]))
    try:
        kept = own_commit.written_rows(full)
        rows = kept if kept is not None else pq.read_table(full, columns=schema.names)
        if rows.schema != schema:  # a file written here has the table's schema (as the merge that wrote it had)
            rows = rows.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError, ValueError) as e:
        raise Unusable(f"a data file does not read as the table's schema here: {e}") from e
    if add.get("deletionVector"):
        gone = read_vector(root, add["deletionVector"]).astype(np.int64)
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[gone[gone < rows.num_rows]] = False
        rows = rows.filter(pa.array(keep))
    return rows if rows.num_rows else None


def _loose(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every top-level field nullable."""
    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
