"""Change rows of a plain-rows stream table, picked on the driver from the netted delta.

The rule (see :mod:`dvm.plan`): a tuple whose netted weight ``__dw`` is positive gets ``__dw`` new rows with
fresh ``__row_id``s; a tuple whose weight is negative loses ``-__dw`` of its stored copies, found by
``__row_hash`` (which copies does not matter: they are equal).

Why on the driver: picking the copies in Spark (:func:`dvm.plan.bag_changes_sql`) joins the negative tuples
with every stored row's ``(__row_id, __row_hash)``: each refresh scans the whole table, or, for a small table,
carries all of its rows as a local relation planned and shipped with every task (most of a small refresh's
time: figures in docs/BENCHMARKS.md, "Figures behind the code"). When the netted delta is small it is
collected to the driver anyway, so the negative hashes are known before the table is read, and only the stored
rows that carry them are fetched: by delta-rs with the hashes as a filter (no Spark job), or by Spark as a
broadcast semi-join when delta-rs cannot read the table as Spark does. An insert-only delta reads no stored
row.

The result follows the change-row contract of :mod:`dvm.plan`: the stored columns in table order and
``__del``; it is committed like any collected delta (see :mod:`pipeline.strategy`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dvm import DEL, DW, ROW_HASH, ROW_ID


def negative_hashes(delta: pa.Table) -> pa.Array:
    """The ``__row_hash`` of every tuple the delta removes copies of."""
    return delta.filter(pc.less(delta[DW], 0))[ROW_HASH].combine_chunks()


def changes(delta: pa.Table, stored: pa.Table | None, columns: list[str], salt: str) -> pa.Table:
    """Change rows (``columns``, i.e. the table's stored columns, then ``__del``) from the netted ``delta``
    (user columns, ``__row_hash``, ``__dw``) and ``stored``: the table's ``(__row_id, __row_hash)`` of at
    least every negative tuple (None when there is none). A tuple with fewer stored copies than it loses
    loses all of them. ``salt``: the refresh's salt, seeding the fresh ids."""
    inserts, deletes = split(delta, stored, columns, salt)
    inserts = inserts.append_column(DEL, pa.array(np.zeros(inserts.num_rows, dtype=bool)))
    deletes = deletes.select(columns).append_column(DEL, pa.array(np.ones(deletes.num_rows, dtype=bool)))
    return pa.concat_tables([inserts, deletes]).combine_chunks()


def split(delta: pa.Table, stored: pa.Table | None, columns: list[str], salt: str) -> tuple[pa.Table, pa.Table]:
    """The rows to insert (``columns``) and the stored copies to delete (``columns`` with the values of the
    tuple they are a copy of, then any other column of ``stored``, e.g. where the copy is stored)."""
    weights = delta[DW].to_numpy()
    up = np.flatnonzero(weights > 0)
    copies = delta.take(pa.array(np.repeat(up, weights[up]), type=pa.int64()))
    losses = delta.filter(pc.less(delta[DW], 0))
    deleted = _picked(losses, stored) if stored is not None else pa.table({ROW_ID: pa.array([], pa.int64()),
                                                                           ROW_HASH: pa.array([], pa.int64())})
    ids = _fresh_ids(copies.num_rows, deleted[ROW_ID].to_numpy(), salt)
    tuples = losses.take(pc.index_in(deleted[ROW_HASH], value_set=losses[ROW_HASH]))
    inserts, deletes = {}, {}
    for name in columns:
        if name == ROW_ID:
            inserts[name], deletes[name] = pa.array(ids, pa.int64()), deleted[ROW_ID]
        elif name == ROW_HASH:
            inserts[name], deletes[name] = copies[ROW_HASH], deleted[ROW_HASH]
        else:
            inserts[name], deletes[name] = copies[name], tuples[name]
    for name in deleted.column_names:
        if name not in deletes:
            deletes[name] = deleted[name]
    return pa.table(inserts), pa.table(deletes)


def _picked(losses: pa.Table, stored: pa.Table) -> pa.Table:
    """``-__dw`` stored rows (``stored``'s columns: ``__row_id``, ``__row_hash``, maybe where they are) of each
    negative tuple of ``losses`` (the delta's rows of negative ``__dw``), the lowest ids first."""
    # copies lost per hash (two negative tuples of one hash, a 64-bit collision, lose the sum: their stored
    # copies cannot be told apart by hash); by sort and binary search: an Arrow join's plan cost a small
    # refresh 0.6 ms (session 45)
    lost, per = np.unique(losses[ROW_HASH].to_numpy(zero_copy_only=False).astype(np.int64), return_inverse=True)
    need = np.bincount(per, weights=-losses[DW].to_numpy(zero_copy_only=False), minlength=len(lost))
    hashes = stored[ROW_HASH].to_numpy(zero_copy_only=False).astype(np.int64)
    ids = stored[ROW_ID].to_numpy(zero_copy_only=False)
    at_loss = np.minimum(np.searchsorted(lost, hashes), max(len(lost) - 1, 0))
    rows = np.flatnonzero(lost[at_loss] == hashes) if len(lost) else np.empty(0, dtype=np.int64)
    rows = rows[np.lexsort((ids[rows], hashes[rows]))]
    ranked = hashes[rows]
    at = np.arange(len(rows))
    first = np.maximum.accumulate(np.where(np.r_[True, ranked[1:] != ranked[:-1]], at, 0)) if len(rows) else at
    keep = (at - first) < need[at_loss[rows]]
    return stored.take(pa.array(rows[keep], pa.int64())).select(stored.column_names)


def _fresh_ids(n: int, taken: np.ndarray, salt: str) -> np.ndarray:
    """``n`` distinct random 64-bit ids, none in ``taken`` (the ids this change deletes), seeded by the
    refresh's ``salt``: like the FULL refresh's ids, new to the table but by 64-bit chance. Distinct by
    construction: :func:`_mixed` is a bijection of distinct inputs (a seeded generator, then a check for
    repeats, cost 0.24 ms of a 40 ms refresh of the floor's filter table, session 59)."""
    seed = np.uint64(int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little"))
    ids = _mixed(seed + np.arange(n, dtype=np.uint64))
    drawn = n
    while len(taken) and (clash := np.isin(ids, taken)).any():
        k = int(clash.sum())
        ids[clash] = _mixed(seed + np.arange(drawn, drawn + k, dtype=np.uint64))
        drawn += k
    return ids


def _mixed(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over ``x`` (unsigned, wrapping), as signed ids: a bijection of 64-bit
    integers whose outputs look random."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def stored_with_hashes(spark: Any, path: str, version: int, hashes: pa.Array,
                       protocol: dict[str, Any] | None) -> pa.Table:
    """The table's ``(__row_id, __row_hash)`` at ``version`` for rows whose hash is in ``hashes``: read by
    delta-rs when it reads the table as Spark does, else by Spark (the hashes broadcast into a semi-join)."""
    from connectors import delta_rs

    rows = delta_rs.rows_with(path, version, [ROW_ID, ROW_HASH], ROW_HASH, hashes) \
        if delta_rs.unreadable(protocol) is None else None
    if rows is not None:
        return rows
    from pyspark.sql import functions as F

    keys = spark.createDataFrame(pa.table({ROW_HASH: hashes}))
    table = spark.read.format("delta").option("versionAsOf", version).load(path).select(ROW_ID, ROW_HASH)
    return table.join(F.broadcast(keys), ROW_HASH, "left_semi").select(ROW_ID, ROW_HASH).toArrow()
