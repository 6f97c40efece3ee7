"""One typed record per refresh-history entry, built in one place.

A stream table's history (``<catalog>/history/<name>/<started>-<refresh id>.json``, see
:mod:`pipeline.catalog`) holds what each refresh decided and did, what a failed one said, and what the
scheduler decided instead of refreshing (a retry, a skip, a status change). Readers (``trickle history``,
status, the web UI, AUTO's cost model, the benchmarks) read every record with the same keys, so every writer
builds a :class:`HistoryRecord` through one of the constructors below and writes it with :func:`write`.
"""

from __future__ import annotations

import time
import traceback as tb
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.modes import RecordStatus, RefreshAction


@dataclass(frozen=True)
class HistoryRecord:
    """One history entry. ``status`` is OK, ERROR, or a scheduler decision (RETRY, SKIPPED, a table status);
    ``action`` what ran (NO_DATA, FULL, DIFFERENTIAL, REINITIALIZE; SKIP; None when nothing was decided)."""

    refresh_id: str
    name: str
    status: str
    action: str | None
    reason: str | None
    started_at: float
    finished_at: float
    duration_ms: float | None = 0.0
    rows_inserted: int | None = 0
    rows_deleted: int | None = 0
    rows_updated: int | None = 0
    #: the source versions the table reflects after this refresh; None when it did not move
    frontier: dict[str, int] | None = None
    error: str | None = None
    #: the refresh committed, but its record was written by the next one (a crash in between)
    recovered: bool = False
    #: how the delta was applied and why (:mod:`pipeline.strategy`)
    apply: str | None = None
    #: the sources' change bytes over their sizes, what AUTO decides on
    change_ratio: float | None = None
    traceback: str | None = None
    #: who asked: None for a refresh (manual, scheduled or streaming), SCHEDULER for its own decisions
    initiated_by: str | None = None
    #: when the scheduler tries again (RETRY, SKIPPED)
    retry_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def refreshed(name: str, refresh_id: str, action: str, reason: str, started_at: float, duration_ms: float,
              counts: tuple[int, int, int], frontier: dict[str, int], recovered: bool = False,
              apply: str | None = None, change_ratio: float | None = None) -> HistoryRecord:
    """A refresh that ran (counts: rows inserted, deleted, updated)."""
    inserted, deleted, updated = counts
    return HistoryRecord(refresh_id, name, RecordStatus.OK, action, reason, started_at, time.time(),
                         round(duration_ms, 1), inserted, deleted, updated, frontier, recovered=recovered,
                         apply=apply, change_ratio=change_ratio)


def no_data(name: str, reason: str, started_at: float, duration_ms: float, frontier: dict[str, int]) -> HistoryRecord:
    """A NO_DATA decision: history too (pg_trickle records it), with a refresh id of its own."""
    return HistoryRecord(_fresh_id("nodata"), name, RecordStatus.OK, RefreshAction.NO_DATA, reason, started_at, time.time(),
                         round(duration_ms, 1), frontier=frontier)


def recovered(name: str, refresh_id: str, action: str | None, frontier: dict[str, int] | None) -> HistoryRecord:
    """A refresh whose commit landed but whose record was lost: written by the next refresh, from the commit."""
    now = time.time()
    return HistoryRecord(refresh_id, name, RecordStatus.OK, action,
                         "recovered: the refresh committed its data but its catalog record was lost", now, now,
                         None, None, None, None, frontier)


def failed(name: str, started_at: float, duration_ms: float, error: BaseException) -> HistoryRecord:
    return HistoryRecord(uuid.uuid4().hex[:16], name, RecordStatus.ERROR, None, None, started_at, time.time(),
                         round(duration_ms, 1), error=first_line(error),
                         traceback="".join(tb.format_exception(error))[-4000:])


def scheduled(name: str, status: str, reason: str, action: str | None = None, error: str | None = None,
              retry_at: float | None = None) -> HistoryRecord:
    """A scheduler decision in place of a refresh (no rows, no frontier)."""
    now = time.time()
    return HistoryRecord(_fresh_id(status), name, status, action, reason, now, now, error=error,
                         initiated_by="SCHEDULER", retry_at=retry_at)


def write(catalog: Any, record: HistoryRecord) -> None:
    catalog.append_history(record.name, record.to_json())


def first_line(e: BaseException) -> str:
    """An error as history and status show it: its type and first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:500]


def _fresh_id(kind: str) -> str:
    return f"{kind.lower()}-{uuid.uuid4().hex[:12]}"
