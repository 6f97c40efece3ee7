"""What an operator sees of a running pipeline: staleness, refresh times, refresh counts, errors, Kafka lag.

``trickle status``, the Prometheus metrics (:mod:`pipeline.metrics`) and the alerts (:mod:`pipeline.alerts`)
all read these numbers from here, so the three never disagree. Everything is read from files other
processes write (the catalog's definitions and refresh history, the sources' Delta logs, the run's
``trickle_sources.json``): no Spark job, so a ``trickle status --watch`` every two seconds costs file reads.

Staleness (the definition the README repeats)
---------------------------------------------
A stream table reflects one version of every base table it reads, directly or through upstream stream
tables: its *base frontier*, recorded in its newest refresh commit (or in the catalog's soft frontier after
a refresh that changed nothing). Per base table, the first commit *after* that version that changed data
(a commit with ``dataChange`` false, e.g. OPTIMIZE, changes nothing a query sees) is a change the table
does not reflect yet.

- ``staleness_s`` = now - the commit time of the *oldest* source change the table does not reflect yet;
  0 when it reflects every committed change of every source. That is how long the table has been behind
  its sources: its contents equal its query over the sources as they were at ``now - staleness_s``.
- ``data_age_s`` = now - the commit time of the *newest* source change it reflects (the newest commit time
  among the frontier's versions). This grows while the sources are quiet even though nothing is missing,
  which is why alerts (``max_staleness``) use ``staleness_s``.

Commit times are the Delta commits' ``commitInfo.timestamp`` (the writer's clock). For a Kafka source the
base table is its mirror, so staleness starts when an event reached the mirror; the time it spent in Kafka
before is the source's lag (``lag_seconds`` of the sources' status, see :class:`KafkaLag`).
"""

from __future__ import annotations

import ast
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.modes import REFRESH_ACTIONS, WRITING_ACTIONS, RecordStatus, RefreshAction

#: refresh counts by action cover this many seconds back
COUNT_WINDOW_S = 3600.0
#: p95 is taken over at most this many of the newest refreshes that did work (not NO_DATA)
P95_SAMPLE = 100
#: how many commits after a frontier version are read to find one that changed data
SCAN_COMMITS = 50
#: history records that are refreshes, and the name errors are counted under
ERROR_ACTION = RefreshAction.ERROR


# ------------------------------------------------------------------------------------------- staleness


@dataclass(frozen=True)
class Staleness:
    """A stream table's staleness (see the module docstring). ``behind``: base table path -> the commit
    time of its oldest change the table does not reflect."""

    staleness_s: float | None
    data_age_s: float | None
    behind: dict[str, float] = field(default_factory=dict)


def staleness(now: float, reflected: Mapping[str, float | None], pending: Mapping[str, float | None]) -> Staleness:
    """Staleness from per-base-table commit times: ``reflected[path]`` is the commit time of the version the
    table reflects, ``pending[path]`` the commit time of the oldest data change after it (None: none yet).
    None fields: nothing known (a table never refreshed, a log without timestamps)."""
    behind = {p: t for p, t in pending.items() if t is not None}
    known = [t for t in reflected.values() if t is not None]
    if not reflected:
        return Staleness(None, None)
    lag = max(0.0, now - min(behind.values())) if behind else 0.0
    age = max(0.0, now - max(known)) if known else None
    return Staleness(lag, age, behind)


def commit_time(log: Any, version: int) -> float | None:
    """The commit time of ``version`` in seconds since the epoch (``commitInfo.timestamp``, else the
    in-commit timestamp), None when the commit file is gone (cleaned up) or has neither."""
    info = log.commit_info(version)
    ts = info.get("timestamp") or info.get("inCommitTimestamp")
    return float(ts) / 1000.0 if ts else None


def _changes_data(actions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a commit changed what a query reads: an add/remove/cdc with ``dataChange`` (default true),
    or a schema change (``metaData``)."""
    for a in actions:
        for kind in ("add", "remove", "cdc"):
            if kind in a and (a[kind] or {}).get("dataChange", True):
                return True
        if "metaData" in a:
            return True
    return False


def first_change_after(log: Any, version: int, latest: int | None) -> tuple[int, float | None] | None:
    """The first commit after ``version`` (up to ``latest``) that changed data and its commit time; None when
    the table holds none. After :data:`SCAN_COMMITS` commits without one the next commit counts, to keep the
    read bounded."""
    if latest is None or latest <= version:
        return None
    for v in range(version + 1, min(latest, version + SCAN_COMMITS) + 1):
        actions = log.actions(v)
        if not actions or _changes_data(actions):
            return v, commit_time(log, v)
    v = min(latest, version + SCAN_COMMITS + 1)
    return v, commit_time(log, v)


def reflected_base_frontier(spark: Any, d: Any) -> dict[str, int] | None:
    """Base table path -> the version a stream table reflects: the soft frontier's when it still applies,
    else its newest refresh commit's ``base_frontier`` (None: never refreshed)."""
    from connectors.delta_log import DeltaLog

    log = DeltaLog(spark, d.path)
    found = log.last_trickle_commit()
    if found is None:
        return None
    meta = found[1]
    soft = d.soft_frontier_over(log.latest_version(), meta)
    if soft is not None and soft.get("base_frontier"):
        meta = soft
    base = meta.get("base_frontier")
    if not base:  # an older record: its direct sources are base tables
        base = {d.sources[k].path: v for k, v in (meta.get("frontier") or {}).items() if k in d.sources}
    return {str(p): int(v) for p, v in base.items()}


def table_staleness(spark: Any, d: Any, now: float | None = None) -> Staleness:
    """:func:`staleness` of a catalog definition, read from its own log and its base tables' logs."""
    from connectors.delta_log import DeltaLog

    now = time.time() if now is None else now
    base = reflected_base_frontier(spark, d)
    if base is None:
        return Staleness(None, None)
    reflected: dict[str, float | None] = {}
    pending: dict[str, float | None] = {}
    for path, version in base.items():
        log = DeltaLog(spark, path)
        reflected[path] = commit_time(log, version)
        nxt = first_change_after(log, version, log.latest_version())
        pending[path] = None if nxt is None else (nxt[1] if nxt[1] is not None else now)
    return staleness(now, reflected, pending)


# ------------------------------------------------------------------------------------ refresh history


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by the nearest-rank method (an observed value, no interpolation)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def action_of(record: Mapping[str, Any]) -> str | None:
    """The refresh action of a history record, ``ERROR`` for a failed refresh, None for scheduler notes
    (RETRY, SKIPPED, status changes), which are decisions, not refreshes."""
    if record.get("status") == RecordStatus.ERROR and not record.get("action"):
        return ERROR_ACTION
    if record.get("status") == RecordStatus.OK and record.get("action") in REFRESH_ACTIONS:
        return str(record["action"])
    return None


@dataclass(frozen=True)
class HistoryStats:
    """From a table's refresh history: the newest refresh that did work (not NO_DATA) and how long it took,
    the p95 duration over the newest :data:`P95_SAMPLE` such refreshes, and the refreshes of the last hour
    by action (``ERROR`` for failures)."""

    last_refresh_ms: float | None = None
    last_refresh_action: str | None = None
    p95_refresh_ms: float | None = None
    refreshes_last_hour: dict[str, int] = field(default_factory=dict)


def history_stats(records: Iterable[Mapping[str, Any]], now: float, window_s: float = COUNT_WINDOW_S) -> HistoryStats:
    """:class:`HistoryStats` of history records in any order."""
    recs = sorted(records, key=lambda r: float(r.get("started_at") or 0.0), reverse=True)
    worked = [r for r in recs if action_of(r) in WRITING_ACTIONS]
    durations = [float(r.get("duration_ms") or 0.0) for r in worked[:P95_SAMPLE]]
    counts: Counter[str] = Counter()
    for r in recs:
        a = action_of(r)
        if a is not None and now - float(r.get("started_at") or 0.0) <= window_s:
            counts[a] += 1
    return HistoryStats(
        last_refresh_ms=durations[0] if durations else None,
        last_refresh_action=str(worked[0]["action"]) if worked else None,
        p95_refresh_ms=percentile(durations, 0.95),
        refreshes_last_hour=dict(sorted(counts.items())),
    )


def _record_started(name: str) -> float | None:
    """A history file's start time from its name (``<16 digits: epoch microseconds>-<id>.json``)."""
    head = name.split("-", 1)[0]
    return int(head) / 1e6 if head.isdigit() else None


def recent_history(catalog: Any, name: str, now: float, window_s: float = COUNT_WINDOW_S,
                   keep: int = P95_SAMPLE) -> list[dict[str, Any]]:
    """The history records of the last ``window_s`` plus at least the newest ``keep`` (for p95), newest
    first; selected by file name, so only those files are read (through the catalog's storage: any store)."""
    out: list[dict[str, Any]] = []
    for i, f in enumerate(reversed(catalog.history_files(name))):
        started = _record_started(f)
        if i >= keep and (started is None or now - started > window_s):
            break
        record = catalog.history_record(name, f)
        if record is not None:  # pruned or being replaced meanwhile
            out.append(record)
    return out


# ------------------------------------------------------------------------------------------- Kafka lag


@dataclass
class KafkaLag:
    """A Kafka source's lag: how many offsets the mirror's ingestion is behind the topic's end, and for how
    long, in seconds.

    Seconds are estimated the way kafka-lag-exporter does: the run samples the topic's end offsets over time
    (:meth:`observe`); the first unconsumed message was produced no earlier than the last sample at which
    the topic's end was still at (or before) the consumed position, so ``lag_seconds`` = now - the time of
    the first sample whose end lies beyond it. Its precision is the sampling interval (about a second); a
    caught-up source has lag 0."""

    samples: list[tuple[float, int]] = field(default_factory=list)  # (time, total end offset), oldest first
    keep_s: float = 6 * 3600.0

    def observe(self, now: float, end_total: int) -> None:
        if not self.samples or self.samples[-1][1] != end_total:
            self.samples.append((now, end_total))
        while len(self.samples) > 2 and now - self.samples[1][0] > self.keep_s:
            self.samples.pop(0)

    def lag(self, now: float, consumed_total: int, end_total: int) -> tuple[int, float]:
        """(offsets behind, seconds behind) for a consumer at ``consumed_total`` (summed over partitions)."""
        behind = max(0, end_total - consumed_total)
        if behind == 0:
            return 0, 0.0
        for t, end in self.samples:
            if end > consumed_total:
                return behind, max(0.0, now - t)
        return behind, 0.0


def offsets_total(offsets: Any, topic: str | None = None) -> int | None:
    """Sum of per-partition offsets in Spark's Kafka progress form ``{topic: {partition: offset}}`` (JSON
    text, a Python dict's repr, or parsed); None when absent."""
    if offsets is None:
        return None
    if isinstance(offsets, str):
        try:
            offsets = json.loads(offsets)
        except ValueError:
            try:  # pyspark 4.1's SourceProgress.endOffset is a Python dict's repr, not JSON
                offsets = ast.literal_eval(offsets)
            except (ValueError, SyntaxError):
                return None
    if not isinstance(offsets, Mapping):
        return None
    total = 0
    for t, parts in offsets.items():
        if topic is not None and t != topic:
            continue
        if isinstance(parts, Mapping):
            total += sum(int(v) for v in parts.values() if isinstance(v, int | float) and v >= 0)
    return total


# -------------------------------------------------------------------------------------------- the rows


#: Columns of ``trickle status`` (text mode), in this order; ``--json`` prints every key.
STATUS_COLUMNS = (
    "name",
    "status",
    "refresh_mode",
    "schedule",
    "staleness",
    "data_age",
    "last_refresh",
    "p95_refresh",
    "refreshes_1h",
    "consecutive_errors",
    "last_error",
)
#: Columns of the Kafka sources under it.
SOURCE_COLUMNS = ("name", "status", "since", "topic", "lag_offsets", "lag", "dead_letters", "error")


def fmt_seconds(s: float | None) -> str:
    """``0.4s``, ``12s``, ``3m05s``, ``2h10m``, ``3d4h``: short, for a terminal column."""
    if s is None:
        return ""
    if s < 10:
        return f"{s:.1f}s"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def table_row(spark: Any, catalog: Any, d: Any, now: float, history: bool = True) -> dict[str, Any]:
    """One ``trickle status`` row: the catalog's columns plus staleness, refresh times and counts
    (``history=False``: without the last three, which read the refresh history).

    Machine fields (``staleness_s``, ``p95_refresh_ms``, ``refreshes_last_hour``...) are what ``--json``,
    the metrics and the alerts use; ``staleness``, ``last_refresh``... are the same, formatted."""
    try:
        stale = table_staleness(spark, d, now)
    except Exception:  # noqa: BLE001 - a log being replaced; the row still shows the rest
        stale = Staleness(None, None)
    stats = history_stats(recent_history(catalog, d.name, now), now) if history else HistoryStats()
    counts = stats.refreshes_last_hour
    return {
        "name": d.name, "status": d.status, "refresh_mode": d.refresh_mode, "schedule": d.schedule,
        "staleness_s": stale.staleness_s, "data_age_s": stale.data_age_s,
        "staleness": fmt_seconds(stale.staleness_s), "data_age": fmt_seconds(stale.data_age_s),
        "last_refresh_ms": stats.last_refresh_ms, "last_refresh_action": stats.last_refresh_action,
        "p95_refresh_ms": stats.p95_refresh_ms,
        "last_refresh": (f"{fmt_seconds(stats.last_refresh_ms / 1000)} {stats.last_refresh_action}"
                         if stats.last_refresh_ms is not None else ""),
        "p95_refresh": fmt_seconds(None if stats.p95_refresh_ms is None else stats.p95_refresh_ms / 1000),
        "refreshes_last_hour": counts,
        "refreshes_1h": " ".join(f"{_short(a)}={n}" for a, n in counts.items()) or "0",
        "consecutive_errors": d.consecutive_errors, "last_error": d.last_error,
        "last_refresh_at": d.last_refresh_at, "frontier": d.frontier,
    }


def _short(action: str) -> str:
    return {RefreshAction.NO_DATA: "nodata", RefreshAction.DIFFERENTIAL: "diff", RefreshAction.FULL: "full",
            RefreshAction.REINITIALIZE: "reinit", RefreshAction.ERROR: "error"}.get(action, action.lower())


def status_rows(spark: Any, catalog: Any, now: float | None = None) -> list[dict[str, Any]]:
    """:func:`table_row` of every stream table in the catalog, by name."""
    now = time.time() if now is None else now
    return [table_row(spark, catalog, d, now) for d in catalog.all()]


def source_rows(doc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The Kafka sources of a ``trickle_sources.json`` (see :func:`pipeline.runtime.read_sources_status`),
    with the lag formatted."""
    if not doc:
        return []
    rows = []
    for r in doc.get("sources") or []:
        rows.append({**r, "lag": fmt_seconds(r.get("lag_seconds"))})
    return rows
