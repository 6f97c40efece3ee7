"""Reads what :func:`pipeline.transactions.cut` needs from the Delta logs, and pins its versions for a refresh.

A mirror takes part when its table properties name a transaction mirror (set by
:func:`connectors.kafka_mirror.create_tables` for a source with ``transaction_topic``):
``trickle.transactions.table`` (its location) and ``trickle.transactions.collection`` (the mirror's table as
the END records name it, e.g. ``public.orders``). Everything is read from commit files: the marks of each
mirror commit after the stream table's frontier, and the ENDs of each transaction-mirror commit after the
version the stream table last read (no Spark job).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connectors.delta_log import DeltaLog
from connectors.kafka_mirror import COLLECTION_PROPERTY, TABLE_PROPERTY
from connectors.kafka_transactions import ends_in
from pipeline.catalog import StreamTableDef
from pipeline.transactions import MirrorWindow, TxnState, cut, relevant


def _groups(spark: Any, d: StreamTableDef) -> dict[str, dict[str, tuple[str, DeltaLog, int]]]:
    """Transaction mirror location -> {source key: (collection, its log, latest version)} of ``d``'s mirrors."""
    out: dict[str, dict[str, tuple[str, DeltaLog, int]]] = {}
    for key, src in d.sources.items():
        if src.kind == "stream_table":
            continue
        log = DeltaLog(spark, src.path)
        latest = log.latest_version()
        meta = log.metadata(latest) if latest is not None else None
        conf = meta.configuration if meta is not None else {}
        if conf.get(TABLE_PROPERTY) and conf.get(COLLECTION_PROPERTY) and latest is not None:
            out.setdefault(conf[TABLE_PROPERTY], {})[key] = (conf[COLLECTION_PROPERTY], log, latest)
    return out


def pin_whole_transactions(spark: Any, d: StreamTableDef, pre: Mapping[str, int] | None,
                           states: Mapping[str, Any] | None, pin: dict[str, int]) -> dict[str, Any] | None:
    """Pin ``d``'s transactional mirrors (``pin``: path -> version, as :meth:`Refresher.refresh` uses it) at
    the latest cut holding whole transactions; returns the new state per transaction mirror, for the refresh
    record (None: ``d`` reads no such mirror). A mirror already pinned in this refresh call (by an upstream
    stream table read in the same call) keeps its version."""
    groups = _groups(spark, d)
    if not groups:
        return None
    out: dict[str, Any] = {}
    for tx_path, members in groups.items():
        state = TxnState.from_json((states or {}).get(tx_path))
        tx_log = DeltaLog(spark, tx_path)
        tx_latest = tx_log.latest_version()
        collections = {c for c, _, _ in members.values()}
        first = -1 if state.version is None else state.version
        for v in range(first + 1, (tx_latest if tx_latest is not None else -1) + 1):
            state.pending.update(relevant(ends_in(tx_log.commit_info(v)), collections))
        windows: dict[str, MirrorWindow] = {}
        for key, (collection, log, latest) in members.items():
            path = d.sources[key].path
            top = pin.get(path, latest)
            low = (pre or {}).get(key)
            marks = {}
            for v in range((low if low is not None else -1) + 1, top + 1):
                batch = log.mirror_batch(v) or {}
                if batch.get("transactions"):
                    marks[v] = [(str(t), int(n)) for t, n in batch["transactions"]]
            windows[key] = MirrorWindow(collection, low, top, marks)
        versions, done = cut(windows, state.pending)
        for key, version in versions.items():
            pin.setdefault(d.sources[key].path, version)
        for t in done:
            state.pending.pop(t, None)
        state.version = tx_latest
        out[tx_path] = state.as_json()
    return out
