"""IMMEDIATE mode: a Structured Streaming query per stream table, over its sources' Change Data Feeds.

Each micro-batch only signals "these sources committed new versions"; ``foreachBatch`` then runs an
ordinary refresh, which reads whole commits from the CDF up to the sources' latest versions and writes the
frontier into the stream table's own commit. So the streaming checkpoint decides only *when* to refresh,
never *what*: a batch replayed after a crash finds its versions already applied (NO_DATA), and a restart
resumes exactly. This is near-immediate (one micro-batch after the source commit), not same-transaction.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from connectors.delta_log import DeltaLog
from connectors.storage import clear_unplanned_offsets
from pipeline.errors import CatalogError

if TYPE_CHECKING:
    from connectors.storage import Storage
    from pipeline.catalog import Catalog
    from pipeline.refresh import Refresher


def start_immediate(spark: Any, catalog: Catalog, refresher: Refresher, name: str,
                    trigger_seconds: float = 0.5, follow: set[str] | None = None) -> Any:
    """Start the table's streaming query over the change feeds of its sources, or of ``follow`` only (the
    others are refreshed for it by the fused path, see :mod:`pipeline.fused`); None when it follows none.
    Each micro-batch runs ``refresher.refresh(name)``."""
    d = catalog.get(name)
    if d.full_reason is not None:
        raise CatalogError(f"stream table {name} cannot run in IMMEDIATE mode: {d.full_reason}")
    committed = DeltaLog(spark, d.path).last_trickle_commit()
    frontier = {k: int(v) for k, v in committed[1].get("frontier", {}).items()} if committed else {}
    streams = []
    for key, src in d.sources.items():
        if follow is not None and key not in follow:
            continue
        reader = spark.readStream.format("delta").option("readChangeFeed", "true")
        # A version number, never "latest": the query resolves "latest" only once it runs, after start()
        # returned, and a commit made in between would then never trigger a refresh (seen under load: the
        # stream table stayed stale). Starting at the frontier's own version costs one NO_DATA refresh.
        # A restart from the checkpoint ignores this.
        start = frontier.get(key)
        latest = DeltaLog(spark, src.path).latest_version()
        if start is None:
            first = latest
        else:
            first = start + 1 if latest is not None and start < latest else start
        reader = reader.option("startingVersion", "latest" if first is None else str(first))
        streams.append(reader.load(src.path).selectExpr(f"'{key}' AS source", "_commit_version"))
    if not streams:
        return None
    fresh_checkpoint(catalog.storage, catalog.checkpoint_path(name),
                     {k: s.path for k, s in d.sources.items() if follow is None or k in follow})
    union = streams[0]
    for s in streams[1:]:
        union = union.unionByName(s)

    def apply(batch: Any, batch_id: int) -> None:
        # whole commits are read by the refresh itself, from the frontier up to the latest versions
        refresher.refresh(name)

    return (union.writeStream.foreachBatch(apply).queryName(f"trickle_{name}")
            .option("checkpointLocation", catalog.checkpoint_path(name))
            .trigger(processingTime=f"{trigger_seconds} seconds").start())


def fresh_checkpoint(storage: Storage, checkpoint: str, followed: dict[str, str]) -> None:
    """Start the checkpoint afresh when the sources the query follows changed since it was written (an ALTER
    of the query, or a source now refreshed by mirror batches): Spark cannot restart a query from a
    checkpoint of other sources. Nothing is lost: the checkpoint only decides *when* to refresh, and the
    new query starts at the table's own frontier. The followed sources are noted beside the checkpoint (a
    checkpoint without that note, from before, is kept). Both go through the catalog's ``storage``, since the
    checkpoint may be on an object store (``s3a://...``) that the OS cannot reach.

    A checkpoint kept whose ``offsets/`` holds files but no planned batch (a temporary file left by a query
    stopped, or a tree deleted, in the middle of a write; seen after an ALTER under load) is made startable
    as a Kafka query's is (:func:`connectors.storage.clear_unplanned_offsets`): Spark refuses to start on it
    ("should be empty on batch 0"), and would refuse on every restart."""
    marker = f"{checkpoint}.follows.json"
    text = json.dumps(followed, sort_keys=True)
    before = storage.read_text(marker)
    if before is not None and before != text:
        storage.delete_tree(checkpoint)
    else:
        clear_unplanned_offsets(storage, checkpoint)
    if before != text:
        storage.write_text(marker, text)
