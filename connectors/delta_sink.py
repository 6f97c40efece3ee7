"""Writes to stream tables, each one Delta commit that also carries the refresh record.

The refresh record (frontier, refresh id, action) travels in the commit's ``userMetadata``, so the data and
the frontier it reflects become visible atomically. A crash after the commit and before the catalog is
updated is recovered by reading the record back (see :mod:`pipeline.refresh`), and nothing is applied twice.
"""

from __future__ import annotations

import json
from typing import Any

from connectors.delta_log import TRICKLE_KEY, DeltaLog
from dvm.context import quote

_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def _metadata(record: dict[str, Any]) -> str:
    return json.dumps({TRICKLE_KEY: record}, sort_keys=True)


def _with_metadata(spark: Any, record: dict[str, Any], statement: str) -> None:
    """Run ``statement`` so that its commit carries ``record``. The userMetadata setting is per session,
    so each commit gets its own light-weight session (same SparkContext): concurrent refreshes of
    different stream tables never see each other's record."""
    session = spark.newSession()
    session.conf.set(_USER_METADATA, _metadata(record))
    session.sql(statement)


def merge(spark: Any, path: str, statement: str, record: dict[str, Any]) -> dict[str, int]:
    """Run a MERGE into the stream table; return its row counts. Records the frontier even when the
    MERGE changed nothing (Delta then writes no commit, so a properties commit carries the record)."""
    log = DeltaLog(spark, path)
    before = log.latest_version()
    _with_metadata(spark, record, statement)
    after = log.latest_version()
    if after == before:
        mark_frontier(spark, path, record)
        return {"inserted": 0, "updated": 0, "deleted": 0}
    m = log.commit_info(after).get("operationMetrics", {}) if after is not None else {}
    return {
        "inserted": int(m.get("numTargetRowsInserted", 0)),
        "updated": int(m.get("numTargetRowsUpdated", 0)),
        "deleted": int(m.get("numTargetRowsDeleted", 0)),
    }


def mark_frontier(spark: Any, path: str, record: dict[str, Any]) -> None:
    """A commit that changes no data, only to record a refresh that found an empty delta."""
    _with_metadata(
        spark, record,
        f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ('trickle.last_refresh' = '{record['refresh_id']}')",
    )


def overwrite(spark: Any, df: Any, path: str, record: dict[str, Any]) -> dict[str, int]:
    """Replace the stream table's contents (FULL / REINITIALIZE); creates it, with CDF on, if missing."""
    log = DeltaLog(spark, path)
    before = log.latest_version()
    old_rows = _row_count(log, before)
    (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
       .option("delta.enableChangeDataFeed", "true").option("userMetadata", _metadata(record)).save(path))
    after = log.latest_version()
    m = log.commit_info(after).get("operationMetrics", {}) if after is not None else {}
    return {"inserted": int(m.get("numOutputRows", 0)), "updated": 0, "deleted": old_rows}


def _row_count(log: DeltaLog, version: int | None) -> int:
    """Rows the table holds before a FULL replaces them (Delta answers COUNT(*) from file statistics)."""
    if version is None:
        return 0
    return int(log.spark.read.format("delta").load(log.path).count())
