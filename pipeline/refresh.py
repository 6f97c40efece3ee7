"""The refresh executor: decide NO_DATA / DIFFERENTIAL / FULL / REINITIALIZE, run it, record it.

Frontier protocol (why a crash never loses or double-applies a change):

1. The *committed* frontier of a stream table is read from its own Delta log — the newest commit that
   carries a refresh record. The catalog's copy is only a cache.
2. The post frontier is the latest version of every source; upstream stream tables are refreshed first,
   in topological order, so a downstream never reads an upstream that is behind.
3. The data change and the new frontier are written in ONE Delta commit (MERGE or overwrite with the
   refresh record as ``userMetadata``). The commit is checked: it lands only if no other refresh committed
   to the table since the version the frontier was read at (a Delta idempotent transaction, see
   :mod:`connectors.delta_sink`); otherwise the refresh starts again from the winner's frontier.
4. Only then are the history and the catalog updated. If the process dies between 3 and 4, the next
   refresh finds a committed refresh id the history does not know, writes the missing record (marked
   ``recovered``) and continues from the committed frontier.

A delta that changes nothing commits nothing: the table at its current version then equals the query at
the new frontier too, which the catalog records as a *soft frontier* (``StreamTableDef.soft_frontier``),
valid only while the table stays at that version. It saves a commit per empty refresh, and a lost catalog
write only costs re-reading the window.

Every source is identified by its Delta table id as well as its version (``source_ids`` in the record): a
source dropped and re-created under the same name starts a new log whose versions mean nothing to the old
frontier, so the next refresh REINITIALIZEs. A source whose schema changed in the window REINITIALIZEs too,
after checking that the query still analyses over it (else the table goes to ERROR, naming the source).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

import dvm
from connectors import (
    deletion_vectors,
    delta_errors,
    delta_log,
    delta_rs,
    delta_sink,
    log_checkpoints,
    own_commit,
    own_overwrite,
)
from connectors.delta_log import DeltaLog, SourceWindow
from connectors.storage import local_path
from dvm import Context, SourceRef, plain_rows_sql, quote
from pipeline import (
    fixpoints,
    heap,
    history,
    local_engine,
    plain_rows,
    source_schema,
    strata,
    strategy,
    transaction_logs,
)
from pipeline.catalog import Catalog, StreamTableDef
from pipeline.decision import RefreshResult, decide, nothing_moved
from pipeline.errors import RefreshError, SourceChangedError, SourceError, UnsupportedError
from pipeline.modes import RefreshAction, RefreshMode, TableStatus
from pipeline.session_conf import ConfReads, SessionSettings, jvm_session

_log = logging.getLogger(__name__)

#: Spark conf: differential refreshes over less data than this many bytes run interpreted (no codegen).
INTERPRETED_BELOW = "trickle.refresh.interpretedBelowBytes"
#: Spark conf: a stream table smaller than this many bytes is read by delta-rs once per differential refresh
#: and held (see :meth:`Refresher._held_target`); 0 disables.
HOLD_TARGET_BELOW = "trickle.refresh.holdTargetBelowBytes"
HOLD_TARGET_ROWS = "trickle.refresh.holdTargetRows"
#: Spark conf: a source snapshot a differential refresh reads is held once per refresh (instead of
#: scanned at every place its delta rule reads it) when its data files total fewer bytes than this.
HOLD_SNAPSHOTS_BELOW = "trickle.refresh.holdSnapshotsBelowBytes"
#: Spark conf: a collected delta job that reads fewer bytes of Delta files than this (change windows and
#: snapshots together, see :meth:`dvm.context.Context.bytes_read`) runs on one partition; 0 disables.
ONE_PARTITION_BELOW = "trickle.refresh.onePartitionBelowBytes"
#: ... with these settings: one task per shuffle and per local relation (driver-read snapshots, the held
#: target) instead of ``spark.sql.shuffle.partitions`` / ``spark.default.parallelism`` of them
ONE_PARTITION = {"spark.sql.shuffle.partitions": "1", "spark.sql.leafNodeDefaultParallelism": "1"}
#: Spark conf: in a small differential refresh, a join input whose post snapshot's files total at least this many
#: bytes is read only where the join keys of the other input's delta fall (see :mod:`dvm.key_filter`); 0
#: disables. Below it, the job that reads the keys costs more than the files it lets Delta skip.
KEY_FILTER_ABOVE = "trickle.refresh.keyFilterAboveBytes"
#: Spark conf: strict mode (``true``) when the API / CLI leave it unset; see :meth:`Refresher.is_strict`.
STRICT = "trickle.refresh.strict"


def _after_commit(name: str) -> None:
    """Test hook: called between the stream table's commit and the catalog update."""


def _before_commit(name: str) -> None:
    """Test hook: called once a refresh has read its frontier and computed what to write, right before it
    commits (where another writer's commit must be caught)."""


AfterCommit = Callable[[str], None]
#: (refresher, the member asked for, the cycle's members, tables refreshed in this call, base pins, a way to
#: refresh an upstream outside the cycle) -> the member's result
RefreshCycle = Callable[["Refresher", str, list[str], set[str], dict[str, int], Callable[[str], Any]], RefreshResult]


class Refresher:
    def __init__(self, spark: Any, catalog: Catalog, strict: bool | None = None) -> None:
        self.spark = spark
        self.catalog = catalog
        self.strict = strict
        self._plans: dict[tuple[str, str], dvm.Plan | None] = {}
        self.after_commit: AfterCommit = _after_commit
        self.before_commit: AfterCommit = _before_commit
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        #: why DuckDB cannot compute a table's delta, by (name, defining query): no second try (a reason that
        #: depends on the data, e.g. a change window too large, is not kept)
        self._local_refused: dict[tuple[str, str, str], str] = {}
        #: the same for the whole result of a FULL refresh (:meth:`_local_full`)
        self._local_full_refused: dict[tuple[str, str, str], str] = {}
        self._thread = threading.local()
        #: the session's trickle.* settings, read again only when they changed (see pipeline.session_conf)
        self._settings: SessionSettings | None = None
        #: how a member of a cycle of stream tables is refreshed: with its whole cycle, to a fixpoint
        #: (:func:`pipeline.cycles.refresh_component`, installed by :class:`pipeline.api.StreamTables`, which
        #: creates cycles; the refresh path itself knows only this contract)
        self.refresh_cycle: RefreshCycle | None = None

    @property
    def conf(self) -> Any:
        """The Spark conf, read once per key during a refresh (see :mod:`pipeline.session_conf`)."""
        reads = getattr(self._thread, "conf", None)
        return reads if reads is not None else self.spark.conf

    @contextmanager
    def _conf_reads(self) -> Iterator[None]:
        outer = getattr(self._thread, "conf", None)
        if self._settings is None and (jsession := jvm_session(self.spark)) is not None:
            self._settings = SessionSettings(jsession)
        self._thread.conf = ConfReads(self.spark.conf, self._settings)
        try:
            with own_commit.synced(self._thread.conf):
                yield
        finally:
            self._thread.conf = outer

    def is_strict(self) -> bool:
        """Strict mode: a refresh that would fall back from DIFFERENTIAL to FULL fails instead (and AUTO
        refuses at create a query it could only refresh FULL). The constructor's flag when given, else the
        Spark conf ``trickle.refresh.strict`` (read per refresh, so a conf file or ``spark-submit --conf``
        turns it on). FULL by nature stays allowed: the initial population, REINITIALIZE, a source truncate,
        and ``refresh_mode='FULL'``."""
        if self.strict is not None:
            return self.strict
        return str(self.conf.get(STRICT, "false")).strip().lower() == "true"

    def lock(self, name: str) -> threading.Lock:
        """One refresh at a time per stream table (manual calls, the scheduler and streaming batches)."""
        with self._locks_guard:
            return self._locks.setdefault(name, threading.Lock())

    # --- plans ---

    def plan(self, d: StreamTableDef, windows: dict[str, SourceWindow] | None = None) -> dvm.Plan | None:
        """The compiled query, or None when it can only be refreshed FULL. Compiled against the sources'
        schemas at the refresh's post frontier (``windows``; else as they are now), and again whenever one
        changes."""
        if d.full_reason is not None:
            return None
        schemas = self.source_schemas(d, windows)
        # the dialect too: the same text compiles to another plan in another dialect (an ALTER of it)
        key = (d.name, d.maintained_query, d.dialect, tuple(d.names), repr(sorted(schemas.items())))
        if key not in self._plans:
            self._plans = {k: v for k, v in self._plans.items() if k[0] != d.name}
            plan = dvm.compile_query(d.maintained_query, schemas, d.dialect)
            plan.names = list(d.names)
            self._plans[key] = plan
        return self._plans[key]

    def source_schemas(self, d: StreamTableDef,
                       windows: dict[str, SourceWindow] | None = None) -> dict[str, list[tuple[str, str]]]:
        """Each source's columns: a stream table's from the catalog, a base table's from its Delta log (the
        ``metaData`` a refresh read anyway; no Spark job)."""
        out = {}
        for key, src in d.sources.items():
            if src.kind == "stream_table":
                up = self.catalog.get(key)
                out[key] = list(zip(up.names, up.types, strict=True))
                continue
            window = windows.get(key) if windows else None
            meta = window.meta if window is not None else None
            if meta is None:
                log = DeltaLog(self.spark, src.path)
                latest = log.latest_version()
                meta = log.metadata(latest) if latest is not None else None
            if meta is None:
                raise SourceError(f"source {key} of stream table {d.name} no longer exists at {src.path}")
            out[key] = meta.columns()
        return out

    # --- refresh ---

    def refresh(self, name: str) -> RefreshResult:
        """Refresh ``name``, refreshing its stale upstream stream tables first (topological order).

        Delayed View Semantics across diamonds: every base source is read at ONE version for the whole
        call (the *pin*, taken lazily at first read), so two upstream stream tables that both read the same
        base table reach the same version of it before the downstream combines them. If another process
        moved an upstream past the pin meanwhile, the downstream's consistency check (see
        :meth:`base_frontier`) fails and the call is retried with the base table pinned at the newer of
        the two versions, which brings the lagging upstream forward instead of chasing the latest."""
        pin: dict[str, int] = {}
        conflicts = inconsistent = 0
        while True:
            try:
                with delta_log.one_read_per_refresh():
                    return self._refresh_tree(name, set(), pin, retry_conflicts=conflicts < CONFLICT_RETRIES)
            except _WriteConflict:
                # another writer committed to a stream table first (two processes refreshing it, or one
                # populating it while another's scheduler picked it up): nothing of ours was committed, and
                # the next attempt starts from the frontier the winner recorded
                conflicts += 1
                time.sleep(0.2 * conflicts)
            except _Inconsistent as e:
                inconsistent += 1
                pin = {e.path: e.version}
                if inconsistent == CONSISTENCY_ATTEMPTS:
                    raise RefreshError(f"stream table {name}: upstream stream tables stayed inconsistent "
                                       f"after {inconsistent} attempts ({e}); they are refreshed concurrently "
                                       "by another process; retry later") from None

    def _refresh_tree(self, name: str, seen: set[str], pin: dict[str, int],
                      retry_conflicts: bool = False) -> RefreshResult:
        d = self.catalog.get(name)
        if d.scc is not None and self.refresh_cycle is not None:  # a cycle member refreshes with its cycle
            if members := strata.component_of(self.catalog, name):
                started, t0 = time.time(), time.perf_counter()
                try:
                    return self.refresh_cycle(self, name, members, seen, pin,
                                              lambda up: self._refresh_tree(up, seen, pin, retry_conflicts))
                except Exception as e:
                    # a member's commit lost to another writer: the cycle is recomputed to its fixpoint from
                    # scratch at every refresh, and a member committed before the loss holds those rows
                    # already, so starting again is safe (its second write is a no-op record)
                    if not _is_write_conflict(e):
                        raise
                    if retry_conflicts:
                        raise _WriteConflict(_first_line(e)) from e
                    lost = _races_lost(f"stream table {name}: its cycle ({', '.join(members)})", e)
                    for m in members:
                        self._record_error(self.catalog.get(m), started, t0, lost)
                    raise lost from None
        stale = False
        for key, src in d.sources.items():
            if src.kind == "stream_table" and key not in seen:
                self._refresh_tree(key, seen, pin, retry_conflicts)
                seen.add(key)
                stale = True
        lock = self.lock(name)
        # read again only when upstream refreshes ran since, or another refresh of it held the lock: else the
        # definition just read is as fresh as a second read would be (either can meet a concurrent ALTER a moment
        # later), for 0.1 ms less
        if not lock.acquire(blocking=False):
            lock.acquire()
            stale = True
        try:
            if stale:
                d = self.catalog.get(name)
            started = time.time()
            t0 = time.perf_counter()
            try:
                with self._conf_reads():
                    result = self._refresh(d, started, t0, pin)
                    heap.settle(self.conf)
                    return result
            except _Inconsistent:
                raise
            except Exception as e:
                if _is_write_conflict(e):
                    if retry_conflicts:
                        raise _WriteConflict(_first_line(e)) from e
                    e = _races_lost(f"stream table {name}", e)
                    self._record_error(d, started, t0, e)
                    raise e from None
                self._record_error(d, started, t0, e)
                raise
        finally:
            lock.release()

    def _committed(self, d: StreamTableDef) -> _Committed:
        """What the stream table holds now: the refresh record of its newest refresh commit, the version
        the table is at (which the next commit is checked against), and the soft frontier when it still
        applies (see the module docstring)."""
        log = DeltaLog(self.spark, d.path)
        version = log.latest_version()
        found = log.last_trickle_commit()
        if found is None:
            return _Committed(version, None, None)
        meta = found[1]
        soft = d.soft_frontier_over(version, meta)
        if soft is not None:
            meta = {**meta, **{k: soft[k] for k in ("frontier", "base_frontier", "source_ids", "transactions")
                               if k in soft}}
        return _Committed(version, {k: int(v) for k, v in meta.get("frontier", {}).items()}, meta)

    def latest_frontier(self, d: StreamTableDef, pin: dict[str, int] | None = None,
                        pre: dict[str, int] | None = None) -> tuple[dict[str, int], dict[str, str]]:
        """The post frontier: each source's latest version, except that a base source already read in
        this refresh call keeps the version it was read at (``pin``, filled here); never behind ``pre``.
        Also: the base sources whose log is now *behind* ``pre`` (key -> why), which only a table dropped and
        re-created under the same name explains."""
        out, replaced = {}, {}
        for key, src in d.sources.items():
            v = pin.get(src.path) if pin is not None and src.kind != "stream_table" else None
            if v is None:
                v = DeltaLog(self.spark, src.path).latest_version()
                if v is None:
                    raise SourceError(f"source {key} of stream table {d.name} no longer exists at {src.path}; "
                                      "re-create it, or drop the stream table")
                if pin is not None and src.kind != "stream_table":
                    pin[src.path] = v
                if pre is not None and key in pre and pre[key] > v and src.kind != "stream_table":
                    replaced[key] = (f"source {key} was dropped and re-created: its log ends at version {v}, "
                                     f"before version {pre[key]} this table reflects")
            if pre is not None and key in pre and pre[key] > v and key not in replaced:
                v = pre[key]  # moved by a refresh outside this call; the consistency check decides
            out[key] = v
        return out, replaced

    def windows(self, d: StreamTableDef, pre: dict[str, int] | None, post: dict[str, int]) -> dict[str, SourceWindow]:
        """Each source's log read once for this refresh: identity, schema, truncates, insert-only, sizes."""
        out = {}
        for key, src in d.sources.items():
            before = None if pre is None else pre.get(key)
            w = DeltaLog(self.spark, src.path).window(before, post[key])
            if before is not None and post[key] not in w.sizes and (size := delta_rs.table_bytes(src.path, post[key])):
                w = dataclasses.replace(w, sizes={**w.sizes, post[key]: size})
            out[key] = w
        return out

    def base_frontier(self, d: StreamTableDef, post: dict[str, int]) -> dict[str, int]:
        """The version of every *base* table (not stream table) that the stream table reflects at ``post``,
        transitively through upstream stream tables (each records its own in its refresh commit).

        Raises :class:`_Inconsistent` when two inputs reflect different versions of one base table: the
        diamond case, A -> B, A -> C, (B, C) -> D with B and C refreshed to different versions of A."""
        out: dict[str, int] = {}
        origin: dict[str, str] = {}

        def add(path: str, version: int, via: str) -> None:
            if path in out and out[path] != version:
                raise _Inconsistent(f"{via} reflects version {version} of {path} but {origin[path]} reflects "
                                    f"version {out[path]}", path, max(version, out[path]))
            out[path] = version
            origin.setdefault(path, via)

        for key, src in d.sources.items():
            if src.kind != "stream_table":
                add(src.path, post[key], key)
                continue
            meta = DeltaLog(self.spark, src.path).trickle_metadata_at(post[key]) or {}
            soft = self.catalog.get(key).soft_frontier_over(post[key], meta) if self.catalog.exists(key) else None
            if soft is not None:
                meta = soft  # the upstream's empty refreshes since its last commit moved it along
            for path, version in (meta.get("base_frontier") or {}).items():
                add(path, int(version), key)
        return out

    def _refresh(self, d: StreamTableDef, started: float, t0: float, pin: dict[str, int]) -> RefreshResult:
        committed = self._committed(d)
        pre, meta = committed.frontier, committed.meta
        recovered = False
        if meta is not None and meta.get("refresh_id") != d.last_refresh_id:
            recovered = self._recover(d, meta, pre)
        # mirrors of a connector with transaction metadata: read at versions holding whole transactions
        txns = transaction_logs.pin_whole_transactions(self.spark, d, pre, (meta or {}).get("transactions"), pin)
        post, replaced = self.latest_frontier(d, pin, pre)
        windows = self.windows(d, pre, post)
        ids = {k: w.meta.id for k, w in windows.items() if w.meta is not None}
        known = (meta or {}).get("source_ids") or {}
        for key, new_id in ids.items():
            if known.get(key) not in (None, new_id) and key not in replaced:
                replaced[key] = f"source {key} was dropped and re-created (Delta table id {known[key]} -> {new_id})"
        base = self.base_frontier(d, post)
        # the schema verdict only when something moved: a NO_DATA refresh stays a few file reads
        verdict = (self._schema_verdict(d, windows) if pre is not None and not nothing_moved(d, pre, windows, replaced)
                   else None)
        decision = decide(d, pre, windows, replaced, verdict, self.is_strict())
        if decision.action == RefreshAction.NO_DATA:
            result = RefreshResult(d.name, RefreshAction.NO_DATA, decision.reason, duration_ms=(time.perf_counter() - t0) * 1000,
                                   frontier=post, refresh_id=d.last_refresh_id, recovered=recovered)
            history.write(self.catalog, history.no_data(d.name, result.reason, started, result.duration_ms, post))
            return result
        if decision.action != RefreshAction.REINITIALIZE and (quiet := strata.quiet_refresh(
                self, d, committed, post, windows, replaced, {"base_frontier": base, "source_ids": ids,
                                                              "transactions": txns}, started, t0)):
            return quiet  # every move of a source nets to no row: NO_DATA without a Spark job
        action, reason, ratio = decision.action, decision.reason, decision.change_ratio
        refresh_id = uuid.uuid4().hex[:16]
        record = {"refresh_id": refresh_id, "frontier": post, "action": action, "name": d.name,
                  "base_frontier": base, "source_ids": ids}
        if txns is not None:
            record["transactions"] = txns
        counts: dict[str, int] | None
        learn_t0 = t0  # where the time AUTO's cost model learns from starts
        dear: float | None = None  # AUTO's budget, when it cancelled the delta
        if action == RefreshAction.DIFFERENTIAL:
            limit = self._auto_budget(d)
            over = threading.Event()
            try:
                with _cancelled_after(self.spark, limit, over), delta_errors.typed():
                    _check_commits_kept(d, windows)
                    counts = self._differential(d, pre, post, windows, record,  # type: ignore[arg-type]
                                                committed.version)
            except delta_sink.CommitLost:
                raise
            except Exception as e:  # noqa: BLE001 - decide below whether a FULL may replace it
                if over.is_set():  # AUTO's budget: a FULL at the same frontier replaces whatever it did
                    dear = limit
                    action = RefreshAction.FULL
                    reason = (f"{reason}; the DIFFERENTIAL refresh was cancelled after {limit:.0f} s (AUTO's "
                              f"budget, {strategy.AUTO_BUDGET}), recomputed instead")
                    record["action"] = action
                    learn_t0 = time.perf_counter()  # what FULL costs, not the cancelled delta before it
                    counts = self._full(d, post, record, committed.version, windows)
                else:
                    gone = _history_gone(e, d, pre, post)  # type: ignore[arg-type]
                    unreadable = isinstance(e, delta_errors.ChangesUnreadable)
                    if gone is None and not (d.refresh_mode == RefreshMode.AUTO and unreadable):
                        raise
                    why = gone or f"change feed unreadable for the window ({_first_line(e)})"
                    if d.refresh_mode != RefreshMode.AUTO or self.is_strict():
                        mode = "strict mode" if d.refresh_mode == RefreshMode.AUTO else f"refresh_mode={d.refresh_mode}"
                        raise SourceChangedError(
                            f"stream table {d.name}: {why}; {mode} does not fall back to FULL. To recompute it once, "
                            f"alter it to refresh_mode='AUTO' (its next refresh falls back to FULL) or 'FULL', "
                            "refresh, and set the mode back; to keep the history longer, VACUUM the source with a "
                            "RETAIN longer than the refresh interval") from e
                    action, reason = RefreshAction.FULL, f"{why}; recomputed at the post frontier"
                    record["action"] = action
                    counts = self._full(d, post, record, committed.version, windows)
        else:
            counts = self._full(d, post, record, committed.version, windows,
                                check_output=bool(replaced) or action == RefreshAction.REINITIALIZE)
        self.after_commit(d.name)
        committed_nothing = counts is None
        if not committed_nothing and committed.version is not None:
            self._checkpoint(d, committed.version + 1)
        counts = counts or {"inserted": 0, "updated": 0, "deleted": 0}
        if action == RefreshAction.DIFFERENTIAL and record.get("notes"):
            reason = f"{reason}; {'; '.join(record['notes'])}"
        if committed_nothing:
            reason = f"{reason}; the delta changed no row, so nothing was committed"
        duration = (time.perf_counter() - t0) * 1000
        result = RefreshResult(d.name, action, reason, counts["inserted"], counts["deleted"], counts["updated"],
                               duration, post, refresh_id, recovered, record.get("apply"), ratio)
        soft = None
        if committed_nothing:
            soft = {"table_version": committed.version, "refresh_id": (meta or {}).get("refresh_id"),
                    "frontier": post, "base_frontier": base, "source_ids": ids}
            if txns is not None:
                soft["transactions"] = txns
        learn_s, schemas = time.perf_counter() - learn_t0, self._source_schemas(d, windows)

        def bookkeeping() -> None:  # after the commit, read by no part of this refresh: see pipeline.bookkeeping
            self._record_ok(d, started, result, soft, learn_s=learn_s, source_schema=schemas)

        self.catalog.later(d.name, bookkeeping)
        if dear is not None:
            self._learn_dear_delta(d, ratio, dear)
        return result

    def _checkpoint(self, d: StreamTableDef, made: int) -> None:
        """A log checkpoint at the version this refresh's commit made, when one is due (see
        :func:`connectors.delta_rs.checkpoint_due`) and the table's features are ones spark-trickle writes
        itself, queued for a background worker (:mod:`connectors.log_checkpoints`: it cost one refresh in ten
        17-25 ms). The commit has landed: a checkpoint that cannot be written is left to the next one, or to
        housekeeping."""
        if local_path(d.path) is None:  # Spark commits it, and checkpoints it
            return
        try:
            log = DeltaLog(self.spark, d.path)
            # the interval as this refresh read it: reading back the commit it just made cost every refresh
            # 0.1 ms, nine times in ten for nothing (an interval changed by this very commit is met next time)
            before = log.metadata(made - 1)
            if before is not None and not delta_rs.checkpoint_due(made, before.configuration):
                return
            meta = log.metadata(made)
            if meta is None or not delta_rs.checkpoint_due(made, meta.configuration):
                return
            if own_commit.unusable(d.path, log.protocol(made), meta.configuration, bool(meta.partition_columns),
                                   meta.schema_json) is None:  # else Spark commits it, and checkpoints it
                log_checkpoints.write_later(d.path, made)
        except Exception as e:  # noqa: BLE001 - see the docstring
            _log.warning("stream table %s: no checkpoint at version %d (%s)", d.name, made, _first_line(e))

    def _auto_budget(self, d: StreamTableDef) -> float | None:
        """How long an AUTO table's DIFFERENTIAL refresh may run (see :func:`strategy.budget`); None for the
        other modes and in strict mode, which never fall back."""
        if d.refresh_mode != RefreshMode.AUTO or self.is_strict():
            return None
        return strategy.budget(strategy.CostModel.from_dict(d.cost_model), self.conf.get(strategy.AUTO_BUDGET, None))

    def _learn_dear_delta(self, d: StreamTableDef, ratio: float | None, seconds: float) -> None:
        """Record a cancelled DIFFERENTIAL refresh as plainly dearer than the query (its budget, and at least
        :data:`strategy.RETRY_BELOW_FULLS` of the FULL refreshes learned, the one that replaced it included):
        AUTO then recomputes, and does not try it again."""
        fresh = self.catalog.get(d.name)
        model = strategy.CostModel.from_dict(fresh.cost_model)
        cost = max(seconds, strategy.RETRY_BELOW_FULLS * (model.full_s or 0.0))
        fresh.cost_model = model.learn(RefreshAction.DIFFERENTIAL, ratio if ratio is not None else 0.0, cost,
                                       certain=True).to_dict()
        self.catalog.put(fresh)

    def _schema_verdict(self, d: StreamTableDef, windows: dict[str, SourceWindow]) -> source_schema.Verdict:
        """What the base sources' schemas at the post frontier mean for the table, against the schemas it
        was last refreshed against (see :mod:`pipeline.source_schema`); sources without a record are left
        to the window's own schema-change check."""
        verdict = source_schema.Verdict()
        for key, seen in (d.source_schema or {}).items():
            w = windows.get(key)
            if w is None or w.meta is None or key not in d.sources or d.sources[key].kind == "stream_table":
                continue
            if source_schema.compare(d.name, key, seen, w.meta.schema_json, verdict) or w.schema_changed_at is None:
                verdict.checked.add(key)  # else changed and changed back inside the window: REINITIALIZE below
        return verdict

    def _source_schemas(self, d: StreamTableDef, windows: dict[str, SourceWindow]) -> dict[str, Any] | None:
        """The base sources' schemas this refresh ran against, and the columns the query reads, when they are
        not what ``d`` records (None: as recorded; written with the refresh's state, once per schema change)."""
        try:
            plan = self.plan(d, windows)
        except Exception:  # noqa: BLE001 - unknown: every column counts as read
            plan = None
        read = source_schema.read_columns(plan.root) if plan is not None else {}
        star = source_schema.selects_star(d.maintained_query, d.dialect)
        seen = {key: source_schema.record(w.meta.schema_json, read.get(key), star)
                for key, w in windows.items()
                if w.meta is not None and key in d.sources and d.sources[key].kind != "stream_table"}
        return None if seen == (d.source_schema or {}) else seen

    def context(self, d: StreamTableDef, pre: dict[str, int] | None, post: dict[str, int],
                windows: dict[str, SourceWindow] | None = None, salt: str | None = None,
                target_relation: str | None = None, small_delta: bool = False) -> Context:
        """The sources of one refresh, from its windows (see :meth:`windows`; read here when not given): which
        only inserted rows (rules that can use it: recursive CTEs) and how large each source is (holding, code
        generation). ``salt``
        (see :attr:`Context.salt`; e.g. the refresh id) makes the ids of rows this refresh inserts into a
        plain-rows table new to it; None draws a fresh random one, so every context gets its own."""
        if windows is None and pre is not None:
            windows = self.windows(d, pre, post)
        refs = {}
        for key, src in d.sources.items():
            before = None if pre is None else pre.get(key)
            w = windows.get(key) if windows is not None else None
            only = bool(w is not None and before is not None and post[key] > before and w.insert_only)
            # sizes for a differential refresh only: its SQL is unshared after rendering (see Context.table)
            sizes = dict(w.sizes) if w is not None and before is not None else {}
            refs[key] = SourceRef(src.path, post[key], before, insert_only=only, sizes=sizes,
                                  change_bytes=w.change_bytes if w is not None else None)
        hold_below = int(self.conf.get(HOLD_SNAPSHOTS_BELOW, str(8 << 20)))
        by_driver = int(self.conf.get(fixpoints.READ_BY_DRIVER_BELOW, str(1 << 20)))
        return Context(refs, target_path=d.path, materialize_changes=True, hold_below=hold_below,
                       driver_below=min(hold_below, by_driver),
                       changes_driver_below=int(self.conf.get(fixpoints.READ_CHANGES_BY_DRIVER_BELOW,
                                                                    str(by_driver))),
                       salt=salt if salt is not None else uuid.uuid4().hex, target_relation=target_relation,
                       small_delta=small_delta, float_identity=d.float_identity,
                       key_filter_above=int(self.conf.get(KEY_FILTER_ABOVE, str(32 << 20))))

    def _differential(self, d: StreamTableDef, pre: dict[str, int], post: dict[str, int],
                      windows: dict[str, SourceWindow], record: dict[str, Any],
                      read_version: int | None) -> dict[str, int] | None:
        """Apply the delta of (pre, post]; None when it changes nothing (nothing committed)."""
        plan = self.plan(d, windows)
        assert plan is not None
        small = strategy.collect_first(sum(w.change_bytes for w in windows.values()),
                                       strategy.Limits.from_conf(self.conf))
        if small and read_version is not None and plan.nets_on_driver():
            ctx = self.context(d, pre, post, windows, salt=record["refresh_id"], small_delta=small)
            return self._apply_netted(d, plan, ctx, record, read_version)
        if small and read_version is not None and self._local_wanted(d, record):
            ctx = self.context(d, pre, post, windows, salt=record["refresh_id"], small_delta=small)
            src = _rendered(ctx, plan.merge_source_sql(ctx, d.types), record, for_spark=False)
            if src is None:
                return None
            rows = self._local_delta(d, ctx, src, record, read_version)
            if rows is not None:
                protocol = DeltaLog(self.spark, d.path).protocol(read_version)
                return self._commit_collected(d, plan, rows, protocol, record, read_version)
        with self._held_target(d, read_version, record["refresh_id"]) as target_relation:
            ctx = self.context(d, pre, post, windows, salt=record["refresh_id"], target_relation=target_relation,
                               small_delta=small)
            return self._apply_delta(d, plan, ctx, windows, record, read_version)

    def _apply_netted(self, d: StreamTableDef, plan: dvm.Plan, ctx: Context, record: dict[str, Any],
                      read_version: int) -> dict[str, int] | None:
        """A plain-rows table's small delta: one Spark job collects it netted per tuple, and the stored copies
        it deletes are picked on the driver from the rows carrying its negative hashes (see
        :mod:`pipeline.plain_rows`), so the refresh never scans nor holds the whole table."""
        src = _rendered(ctx, plan.netted_delta_sql(ctx, d.types), record, for_spark=False)
        if src is None:
            return None
        delta = self._local_delta(d, ctx, src, record, read_version)
        if delta is None:
            delta = self._spark_delta(ctx, ctx.unshare_single_reads(src), record, read_version)
        log = DeltaLog(self.spark, d.path)
        protocol = log.protocol(read_version)
        hashes = plain_rows.negative_hashes(delta)
        marking = self._marking(d, log, protocol, read_version, delta.num_rows, len(hashes))
        if marking is not None:
            try:
                return self._commit_marked(d, plan, ctx, delta, hashes, marking, log, protocol, record,
                                           read_version)
            except deletion_vectors.Unusable as e:  # e.g. a V2 checkpoint: the paths below take the table
                record["apply_note"] = f"deletion vectors not written: {e}"
                protocol = DeltaLog(self.spark, d.path).protocol(read_version)
        stored = (plain_rows.stored_with_hashes(self.spark, d.path, read_version, hashes, protocol)
                  if len(hashes) else None)
        rows = plain_rows.changes(delta, stored, plan.stored_columns(), ctx.salt)
        return self._commit_collected(d, plan, rows, protocol, record, read_version)

    def _marking(self, d: StreamTableDef, log: DeltaLog, protocol: dict[str, Any] | None, read_version: int,
                 tuples: int, losing: int) -> strategy.Choice | None:
        """The choice to commit a plain-rows table's netted delta with deletion vectors (see
        :func:`strategy.marks`); None for the other paths."""
        if tuples == 0:
            return None
        meta = log.metadata(read_version)
        if meta is None:
            return None
        has = "deletionVectors" in ((protocol or {}).get("writerFeatures") or [])
        with_vectors = protocol if has else deletion_vectors.with_vectors(protocol)
        why_not = deletion_vectors.unusable(d.path, with_vectors, meta.configuration, bool(meta.partition_columns))
        # rows per file only decide whether to turn vectors on: opening the table for them costs ~6 ms
        rows = None if has else delta_rs.file_rows(d.path, read_version)
        return strategy.marks(has, losing, rows, why_not, strategy.Limits.from_conf(self.conf))

    def _commit_marked(self, d: StreamTableDef, plan: dvm.Plan, ctx: Context, delta: Any, hashes: Any,
                       choice: strategy.Choice, log: DeltaLog, protocol: dict[str, Any] | None,
                       record: dict[str, Any], read_version: int) -> dict[str, int] | None:
        """Commit the netted delta as inserted rows and deletion vectors (see :mod:`connectors.deletion_vectors`):
        the stored copies it deletes are found by their hash in the live files and marked, never rewritten."""
        if "deletionVectors" not in ((protocol or {}).get("writerFeatures") or []):
            delta_sink.enable_deletion_vectors(self.spark, d.path)  # once per table, a commit of no rows
            read_version = deletion_vectors.after_enabling(log, read_version)
        meta = log.metadata(read_version)
        assert meta is not None
        files = deletion_vectors.live_files(log, read_version)
        index_bytes = strategy.Limits.from_conf(self.conf).hash_index_bytes
        stored = deletion_vectors.locate(log.path, files, hashes, index_bytes) if len(hashes) else None
        inserts, deletes = plain_rows.split(delta, stored, plan.stored_columns(), ctx.salt)
        record["apply"] = delta_sink.applied(choice.describe(), record)
        self.before_commit(d.name)
        try:
            return deletion_vectors.commit(d.path, read_version, files, deletion_vectors.arrow_schema(meta),
                                           inserts, deletes, record, delta_sink.txn_version(read_version),
                                           delta_sink.TXN_APP_ID, meta.configuration)
        except delta_rs.CommitFailed as e:
            delta_sink.committed_version(self.spark, d.path, record, read_version)  # CommitLost: another won
            raise delta_sink.CommitLost(f"the commit to {d.path} at version {read_version + 1} failed: {e}; the "
                                        "table moved on since this refresh read it") from e

    def _spark_delta(self, ctx: Context, src: str, record: dict[str, Any], read_version: int | None) -> Any:
        """The collected delta computed by Spark, as Arrow."""
        conf = self._job_conf(ctx, src)
        with fixpoints.evaluated(self.spark, ctx, conf) as bind:
            return delta_sink.collect(self.spark, bind(src), record, read_version,
                                      interpreted=self._interpreted(ctx, src), conf=conf)

    def _local_delta(self, d: StreamTableDef, ctx: Context, src: str, record: dict[str, Any],
                     read_version: int) -> Any | None:
        """The collected delta computed by DuckDB on the driver (see :mod:`pipeline.local_engine`); None when it
        must run on Spark (the reason goes into the refresh record). In ``verify`` mode Spark computes it too,
        and a difference fails the refresh."""
        if not self._local_wanted(d, record):
            return None
        mode = local_engine.mode(self.conf)
        key = (d.name, d.maintained_query, d.dialect)
        try:
            rows = local_engine.collect(self.spark, ctx, src, read_version, self.conf)
        except local_engine.Unsupported as e:
            if e.lasting:
                self._local_refused[key] = str(e)
            record["delta_engine"] = f"spark: {e}"
            return None
        record["delta_engine"] = "duckdb"
        if mode == "verify":
            spark_rows = self._spark_delta(ctx, ctx.unshare_single_reads(src), record, read_version)
            if (diff := local_engine.same_rows(spark_rows, rows)) is not None:
                raise RefreshError(f"stream table {d.name}: DuckDB's delta differs from Spark's: {diff}")
        return rows

    def _local_wanted(self, d: StreamTableDef, record: dict[str, Any]) -> bool:
        """Whether DuckDB should try this table's delta: the engine is on, and it did not refuse the query."""
        mode = local_engine.mode(self.conf)
        refused = self._local_refused.get((d.name, d.maintained_query, d.dialect))
        if refused is not None and mode == "auto":
            record["delta_engine"] = f"spark: {refused}"
        return mode != "off" and (refused is None or mode == "verify")

    @contextmanager
    def _held_target(self, d: StreamTableDef, read_version: int | None, refresh_id: str) -> Iterator[str | None]:
        """The stream table's rows at ``read_version`` as a global temporary view when the table is small
        (``trickle.refresh.holdTargetBelowBytes``, default 32 MiB, and ``trickle.refresh.holdTargetRows``, default
        100,000), read by delta-rs with no Spark job; None
        otherwise (the delta reads the Delta table). See :func:`connectors.delta_rs.read_small` for why."""
        limit = int(self.conf.get(HOLD_TARGET_BELOW, str(32 << 20)))
        max_rows = int(self.conf.get(HOLD_TARGET_ROWS, "100000"))
        rows = delta_rs.read_small(d.path, read_version, limit, max_rows) if read_version is not None else None
        meta = DeltaLog(self.spark, d.path).metadata(read_version) if rows is not None else None
        if rows is None or meta is None:
            yield None
            return
        name = f"__trickle_target_{refresh_id}"
        types = dict(meta.columns())
        if rows.num_rows:
            frame = self.spark.createDataFrame(rows)
        else:  # pyspark cannot convert an Arrow table without chunks
            frame = self.spark.createDataFrame([], ", ".join(f"{quote(c)} {t}" for c, t in meta.columns()))
        frame = frame.selectExpr(*[f"CAST({quote(c)} AS {types[c]}) AS {quote(c)}" if c in types else quote(c)
                               for c in frame.columns])
        frame.createOrReplaceGlobalTempView(name)
        try:
            yield f"global_temp.{name}"
        finally:
            self.spark.catalog.dropGlobalTempView(name)

    def _apply_delta(self, d: StreamTableDef, plan: dvm.Plan, ctx: Context, windows: dict[str, SourceWindow],
                     record: dict[str, Any], read_version: int | None) -> dict[str, int] | None:
        src = _rendered(ctx, plan.merge_source_sql(ctx, d.types), record)
        if src is None:
            return None
        target = f"delta.{quote(d.path)}"
        statement = lambda rows: plan.merge_statement(target, rows)  # noqa: E731
        limits = strategy.Limits.from_conf(self.conf)
        change_bytes = sum(w.change_bytes for w in windows.values())
        collected = strategy.collect_first(change_bytes, limits)
        conf = self._job_conf(ctx, src) if collected else fixpoints.read_conf(ctx)
        interpreted = self._interpreted(ctx, src)
        with fixpoints.evaluated(self.spark, ctx, conf) as bind:
            src = bind(src)
            if not collected:
                choice = strategy.uncollected(change_bytes, limits)
                record["apply"] = choice.describe()
                self.before_commit(d.name)
                return delta_sink.merge(self.spark, d.path, src, statement, record, read_version,
                                        interpreted=interpreted, conf=conf)
            rows = delta_sink.collect(self.spark, src, record, read_version, interpreted=interpreted, conf=conf)
        protocol = DeltaLog(self.spark, d.path).protocol(read_version) if read_version is not None else None
        return self._commit_collected(d, plan, rows, protocol, record, read_version)

    def _commit_collected(self, d: StreamTableDef, plan: dvm.Plan, rows: Any, protocol: dict[str, Any] | None,
                          record: dict[str, Any], read_version: int | None) -> dict[str, int] | None:
        """Commit collected change rows with the strategy chosen for them (see :mod:`pipeline.strategy`)."""
        limits = strategy.Limits.from_conf(self.conf)
        stored, update, appendable = _change_rows(plan)
        statement = lambda src: plan.merge_statement(f"delta.{quote(d.path)}", src)  # noqa: E731
        deletes = int(pc.sum(rows.column("__del")).as_py() or 0) if rows.num_rows else 0
        target_rows = self._stored_rows(d, read_version) if read_version is not None else None
        choice = strategy.choose(rows.num_rows, deletes, appendable, delta_rs.unusable(d.path, protocol), limits,
                                 target_rows, self._own_unusable(d, protocol, read_version))
        record["apply"] = delta_sink.applied(choice.describe(), record)
        if choice.strategy == strategy.NONE:
            return None
        if choice.engine == "spark-dv" and "deletionVectors" not in ((protocol or {}).get("writerFeatures") or []):
            # a one-time protocol upgrade, outside the refresh's commit: it changes no row, and a commit of
            # another refresh meanwhile is still caught by the transaction check of ours
            delta_sink.enable_deletion_vectors(self.spark, d.path)
        self.before_commit(d.name)
        return delta_sink.apply_collected(self.spark, d.path, rows, choice.strategy, choice.engine, stored, update,
                                          statement, record, read_version)

    def _own_unusable(self, d: StreamTableDef, protocol: dict[str, Any] | None,
                      read_version: int | None) -> str | None:
        """Why spark-trickle's own commit may not write this table (see :mod:`connectors.own_commit`)."""
        meta = DeltaLog(self.spark, d.path).metadata(read_version) if read_version is not None else None
        if meta is None:
            return "the table's metadata is unknown"
        return own_commit.unusable(d.path, protocol, meta.configuration, bool(meta.partition_columns),
                                   meta.schema_json)

    def _job_conf(self, ctx: Context, sql: str) -> dict[str, str]:
        """Settings for the session of a collected delta job (and the fixpoints it reads): those of
        :func:`pipeline.fixpoints.read_conf`, and :data:`ONE_PARTITION` when the job reads fewer bytes than
        ``trickle.refresh.onePartitionBelowBytes`` (default 16 MiB). Why: on a few MiB each shuffle's tasks
        and each local relation's broadcast tasks cost more than they parallelise (figures in
        docs/BENCHMARKS.md, "Figures behind the code")."""
        conf = fixpoints.read_conf(ctx)
        limit = int(self.conf.get(ONE_PARTITION_BELOW, str(16 << 20)))
        read = ctx.bytes_read(sql) if limit > 0 else None
        return {**conf, **ONE_PARTITION} if read is not None and read < limit else conf

    def _interpreted(self, ctx: Context, sql: str) -> bool:
        """Whether the delta job runs with code generation off: when it reads fewer bytes of Delta files than
        ``trickle.refresh.interpretedBelowBytes`` (default 256 KiB; 0 disables), counted as
        :meth:`_job_conf` counts them (change windows and the snapshots Spark scans; the relations the driver
        read are bounded by their own limits). Compiling generated code costs a small refresh about 0.1 s,
        interpreting costs per row, so the two break even at a few hundred KB of change data (figures in
        docs/BENCHMARKS.md, "Figures behind the code"). The rule before (the tables read, whole, under 64
        MiB) ran a 1M-row window interpreted, and never applied once delta-rs, which writes no checksum file,
        had committed to the table."""
        limit = int(self.conf.get(INTERPRETED_BELOW, str(256 << 10)))
        read = ctx.bytes_read(sql) if limit > 0 else None
        return read is not None and read < limit

    def full_sql(self, d: StreamTableDef, post: dict[str, int], ctx: Context | None = None,
                 windows: dict[str, SourceWindow] | None = None) -> str:
        """The stream table's rows at ``post``. Fixpoints it reads are registered in ``ctx`` (see
        :mod:`pipeline.fixpoints`): pass one and evaluate them around the query."""
        plan = self.plan(d, windows)
        ctx = ctx if ctx is not None else self.context(d, None, post)
        if plan is not None:
            return plan.full_sql(ctx, d.types)
        pinned = dvm.pin_sources(d.maintained_query, self.from_items(d, post), d.dialect)
        return plain_rows_sql(pinned, d.names, d.types, ctx.salt, ctx.float_identity)

    def from_items(self, d: StreamTableDef, post: dict[str, int]) -> dict[str, str]:
        """FROM items reading each source at ``post``; stream tables show only their user columns (they store
        plain rows: one physical row per copy, nothing to expand)."""
        out = {}
        for key, src in d.sources.items():
            table = f"delta.{quote(src.path)} VERSION AS OF {post[key]}"
            if src.kind == "stream_table":
                up = self.catalog.get(key)
                cols = ", ".join(quote(n) for n in up.names)
                out[key] = f"(SELECT {cols} FROM {table})"
            else:
                out[key] = table
        return out

    def _full(self, d: StreamTableDef, post: dict[str, int], record: dict[str, Any], read_version: int | None,
              windows: dict[str, SourceWindow], check_output: bool = False) -> dict[str, int]:
        """Recompute the table at ``post``. ``check_output`` (a source was replaced or changed its schema):
        first make sure the query still analyses over the sources and still has the table's columns; a query
        that lost a column fails with :class:`SourceChangedError`, and changed output types are adopted."""
        if check_output:
            self._check_output(d, post, windows)
        ctx = self.context(d, None, post)
        sql = self.full_sql(d, post, ctx, windows)
        if not check_output and (local := self._local_full(d, ctx, sql, record, read_version)) is not None:
            return local
        small = None if check_output else self._small_full(d, read_version)
        with fixpoints.evaluated(self.spark, ctx):
            rows = collected_full(fixpoints.reader(self.spark, ctx).sql(sql)) if small is not None else None
            if rows is None:
                record["apply"] = strategy.Choice("OVERWRITE", "spark",
                                                  "the query's whole result replaces the table").describe()
                self.before_commit(d.name)
                return delta_sink.overwrite(self.spark, fixpoints.reader(self.spark, ctx).sql(sql), d.path, record,
                                            read_version)
        assert read_version is not None and small is not None
        engine, why = small
        record["apply"] = strategy.Choice("OVERWRITE", engine, f"{why}; the result's {rows.num_rows} rows were "
                                          "collected and replace it").describe()
        rows = rows.select(self._stored_order(d, read_version, rows.column_names))
        if engine == "delta-rs":
            return self._overwrite_by_delta_rs(d, rows, record, read_version)
        return self._overwrite_by_own_commit(d, rows, record, read_version)

    def _local_full(self, d: StreamTableDef, ctx: Context, sql: str, record: dict[str, Any],
                    read_version: int | None) -> dict[str, int] | None:
        """A FULL refresh (a creation's first one too) computed by DuckDB on the driver and committed without
        Spark, with no Spark job; None when Spark must do it (the reason, when DuckDB refused, in
        ``delta_engine``). Two cases:

        * the sources' snapshots total at most ``trickle.refresh.localFullBelowBytes``, the result holds at most
          ``trickle.apply.fullCollectRowsBelow`` rows, and delta-rs may write the table: delta-rs commits it.
          Why: on a small table a FULL is Spark's fixed cost, a job and a write: creating a stream table over a
          40-row source took 1.8 s, 0.67 s this way (warm, on the 2-core test machine), most of it now Spark's
          CREATE of the empty table;
        * a plain-rows table that spark-trickle's own commit may write, its sources at most
          ``trickle.refresh.localPlainFullBelowBytes`` (0: never): the own commit replaces it with the rows however many
          (:mod:`connectors.own_overwrite`, files written in parallel); a new one too, once Spark has created it
          empty (delta-rs writes it when the own commit may not). Why: the rows are the query's as they are, and
          Spark's writer costs them a row and a field at a time (docs/BENCHMARKS.md, session 81); and AUTO learns
          what a FULL costs from the first population, which, by Spark, was up to 8x what a later FULL costs
          here (session 81's 1M x 50% filter)."""
        limits = strategy.Limits.from_conf(self.conf)
        max_bytes = int(self.conf.get(local_engine.MAX_FULL_BYTES, str(4 << 20)))
        key = (d.name, d.maintained_query, d.dialect)
        mode = local_engine.mode(self.conf)
        if (mode == "off" or max_bytes <= 0 or not limits.delta_rs or local_path(d.path) is None
                or (key in self._local_full_refused and mode == "auto")
                or (read_version is None and ctx.fixpoints)):  # a new table's schema is Spark's analysis of sql
            return None
        log = DeltaLog(self.spark, d.path)
        small_ok = limits.full_collect_rows > 0
        plain_bytes = int(self.conf.get(local_engine.MAX_PLAIN_FULL_BYTES, str(256 << 20)))
        own_ok = False
        if read_version is not None:
            meta = log.metadata(read_version)
            if meta is None:
                return None
            protocol = log.protocol(read_version)
            small_ok = small_ok and delta_rs.unusable(d.path, protocol) is None
            own_ok = d.layout == "bag" and plain_bytes > 0 and self._own_unusable(d, protocol, read_version) is None
        # a new plain-rows table: whether the own commit may write it is known once Spark has created it; if not,
        # delta-rs writes it whatever its rows, as it writes a small one
        creating_plain = read_version is None and d.layout == "bag" and plain_bytes > 0
        if not (small_ok or own_ok or creating_plain):
            return None
        limit = max(max_bytes, plain_bytes) if own_ok or creating_plain else max_bytes
        try:
            rows = local_engine.collect(self.spark, ctx, sql, None, self.conf, limit)
        except local_engine.Unsupported as e:
            if e.lasting:
                self._local_full_refused[key] = str(e)
            record["delta_engine"] = f"spark: {e}"
            return None
        small_ok = small_ok and rows.num_rows <= limits.full_collect_rows
        if not (small_ok or own_ok or creating_plain):
            return None
        if mode == "verify":
            with fixpoints.evaluated(self.spark, ctx):
                spark_rows = fixpoints.reader(self.spark, ctx).sql(sql).toArrow()
            if d.layout == "bag":  # plain rows: ids number the rows in any order, only unique ones count
                ids = rows.column(dvm.ROW_ID)
                if pc.count_distinct(ids).as_py() != rows.num_rows or ids.null_count:
                    raise RefreshError(f"stream table {d.name}: DuckDB's FULL gave rows equal {dvm.ROW_ID}s")
                spark_rows, compared = spark_rows.drop_columns([dvm.ROW_ID]), rows.drop_columns([dvm.ROW_ID])
            else:
                compared = rows
            if (diff := local_engine.same_rows(spark_rows, compared)) is not None:
                raise RefreshError(f"stream table {d.name}: DuckDB's FULL result differs from Spark's: {diff}")
        if read_version is None:  # created here, with the properties Spark's CREATE gives it, then overwritten
            if not delta_sink.create(self.spark, self.spark.sql(sql), d.path):
                return None
            read_version = log.latest_version()
            meta = log.metadata(read_version) if read_version is not None else None
            if meta is None:
                return None
            if creating_plain and not small_ok:
                own_ok = self._own_unusable(d, log.protocol(read_version), read_version) is None
                small_ok = not own_ok
        try:
            stored = rows.select([c for c, _ in meta.columns()]).cast(deletion_vectors.arrow_schema(meta))
        except (KeyError, ValueError, TypeError, NotImplementedError) as e:  # pyarrow's ArrowInvalid is a ValueError
            record["delta_engine"] = f"spark: DuckDB's result does not fit the table's types ({_first_line(e)})"
            return None
        record["delta_engine"] = "duckdb"
        if small_ok:
            record["apply"] = strategy.Choice("OVERWRITE", "delta-rs", f"the sources' snapshots total at most "
                                              f"{limit} bytes; DuckDB computed the {rows.num_rows} rows on the "
                                              "driver and they replace the table").describe()
            return self._overwrite_by_delta_rs(d, stored, record, read_version)
        record["apply"] = strategy.Choice("OVERWRITE", "own", f"the sources' snapshots total at most {limit} bytes; "
                                          f"DuckDB computed the {rows.num_rows} plain rows on the driver and they "
                                          "replace the table").describe()
        return self._overwrite_by_own_commit(d, stored, record, read_version)

    def _overwrite_by_delta_rs(self, d: StreamTableDef, rows: Any, record: dict[str, Any],
                               read_version: int) -> dict[str, int]:
        """Replace the table's rows with ``rows`` (in its column order) in one checked delta-rs commit."""
        self.before_commit(d.name)
        try:
            counts = delta_rs.overwrite(d.path, rows, record, read_version, delta_sink.txn_version(read_version),
                                        delta_sink.TXN_APP_ID)
        except delta_rs.CommitFailed as e:
            raise delta_sink.CommitLost(f"delta-rs did not overwrite {d.path}: {e}") from e
        if delta_sink.committed_version(self.spark, d.path, record, read_version) is None:
            raise delta_sink.CommitLost(f"the overwrite of {d.path} committed nothing")
        return counts

    def _overwrite_by_own_commit(self, d: StreamTableDef, rows: Any, record: dict[str, Any],
                                 read_version: int) -> dict[str, int]:
        """Replace the table's rows with ``rows`` (in its column order) in one checked commit of spark-trickle's
        own (:mod:`connectors.own_overwrite`: a table delta-rs does not write, deletion vectors on)."""
        log = DeltaLog(self.spark, d.path)
        meta = log.metadata(read_version)
        if meta is None:
            raise delta_sink.CommitLost(f"the metadata of {d.path} at version {read_version} is gone")
        self.before_commit(d.name)
        try:
            counts = own_overwrite.overwrite(log, rows.cast(deletion_vectors.arrow_schema(meta)), record,
                                             read_version, delta_sink.txn_version(read_version), delta_sink.TXN_APP_ID)
        except delta_rs.CommitFailed as e:
            raise delta_sink.CommitLost(f"the overwrite of {d.path} lost its version: {e}") from e
        if delta_sink.committed_version(self.spark, d.path, record, read_version) is None:
            raise delta_sink.CommitLost(f"the overwrite of {d.path} committed nothing")
        return counts

    def _small_full(self, d: StreamTableDef, read_version: int | None) -> tuple[str, str] | None:
        """The engine (delta-rs, else spark-trickle's own commit) and the reason when a FULL refresh may collect
        its result and commit it without Spark: the table exists, the engine may write it, and it held at most
        ``trickle.apply.fullCollectRowsBelow`` rows or its files at most ``trickle.apply.fullCollectBytesBelow``
        bytes (:func:`pipeline.strategy.collect_full`); None otherwise."""
        limits = strategy.Limits.from_conf(self.conf)
        if read_version is None or not limits.delta_rs or limits.full_collect_rows <= 0:
            return None
        log = DeltaLog(self.spark, d.path)
        protocol = log.protocol(read_version)
        engine = "delta-rs"
        if delta_rs.unusable(d.path, protocol) is not None:
            if self._own_unusable(d, protocol, read_version) is not None:
                return None
            engine = "own"
        size = deletion_vectors.live_bytes(log, read_version) if local_path(d.path) is not None else None
        why = strategy.collect_full(self._stored_rows(d, read_version), size, limits)
        return None if why is None else (engine, why)

    def _stored_rows(self, d: StreamTableDef, version: int) -> int | None:
        """Rows of the stream table at ``version`` (None when unknown): from the log this process replays
        (:func:`connectors.deletion_vectors.live_rows`), else from delta-rs."""
        if local_path(d.path) is not None:
            try:
                return deletion_vectors.live_rows(DeltaLog(self.spark, d.path), version)
            except deletion_vectors.Unusable:
                pass
        return delta_rs.table_rows(d.path, version)

    def _stored_order(self, d: StreamTableDef, version: int, names: list[str]) -> list[str]:
        """``names`` in the stored table's column order (delta-rs writes by position)."""
        meta = DeltaLog(self.spark, d.path).metadata(version)
        order = [c for c, _ in meta.columns()] if meta is not None else []
        return order if sorted(order) == sorted(names) else names

    def _check_output(self, d: StreamTableDef, post: dict[str, int], windows: dict[str, SourceWindow]) -> None:
        changed = [f"{k} (version {w.schema_changed_at})" for k, w in windows.items() if w.schema_changed_at]
        why = f"source {', '.join(changed)} changed its schema" if changed else "a source was re-created"
        pinned = dvm.pin_sources(dvm.analyzable(d.maintained_query, d.dialect), self.from_items(d, post),
                                 d.dialect)
        try:
            schema = self.spark.sql(pinned).schema
        except Exception as e:  # noqa: BLE001 - AnalysisException: a column or table the query reads is gone
            raise SourceChangedError(
                f"stream table {d.name} no longer matches its sources: {why}, and its query fails over them: "
                f"{_first_line(e)}. Restore the column, or drop and re-create the stream table with a query "
                "that matches the new schema") from None
        names = [f.name for f in schema.fields]
        types = [f.dataType.simpleString() for f in schema.fields]
        if [n.lower() for n in names] != [n.lower() for n in d.names]:
            raise SourceChangedError(
                f"stream table {d.name}: {why}, and its query's output columns changed from {d.names} to "
                f"{names}; drop and re-create the stream table (or list its columns instead of *)")
        if types != d.types:
            fresh = self.catalog.get(d.name)
            fresh.types = d.types = types
            self.catalog.put(fresh)

    # --- bookkeeping ---

    def _recover(self, d: StreamTableDef, meta: dict[str, Any], frontier: dict[str, int] | None) -> bool:
        """The last commit's refresh never reached the catalog: record it now, from the commit itself."""
        if self.catalog.has_history(d.name, meta["refresh_id"]):
            d.last_refresh_id = meta["refresh_id"]
            self.catalog.put(d)
            return False
        history.write(self.catalog, history.recovered(d.name, meta["refresh_id"], meta.get("action"), frontier))
        d.last_refresh_id = meta["refresh_id"]
        d.frontier = frontier
        d.last_action = meta.get("action")
        self.catalog.put(d)
        return True

    def _record_ok(self, d: StreamTableDef, started: float, r: RefreshResult,
                   soft: dict[str, Any] | None = None, learn_s: float | None = None,
                   source_schema: dict[str, Any] | None = None) -> None:
        assert r.refresh_id is not None
        history.write(self.catalog, history.refreshed(
            d.name, r.refresh_id, r.action, r.reason, started, r.duration_ms,
            (r.rows_inserted, r.rows_deleted, r.rows_updated), r.frontier, r.recovered, r.apply, r.change_ratio))
        fresh = self.catalog.get(d.name)  # keep concurrent ALTERs (status, schedule) intact
        fresh.frontier = r.frontier
        fresh.soft_frontier = soft
        fresh.cost_model = strategy.CostModel.from_dict(fresh.cost_model).learn(
            r.action, r.change_ratio, learn_s if learn_s is not None else r.duration_ms / 1000).to_dict()
        if soft is None:
            fresh.last_refresh_id = r.refresh_id
        fresh.last_refresh_at = time.time()
        fresh.last_action = r.action
        fresh.consecutive_errors = 0
        fresh.last_error = None
        if d.reinitialize is not None and fresh.maintained_query == d.maintained_query:
            fresh.reinitialize = None  # this refresh replaced the contents by the current definition's
        if fresh.status == TableStatus.ERROR:
            fresh.status = TableStatus.ACTIVE
        if source_schema is not None:
            fresh.source_schema = source_schema
        self.catalog.put(fresh)

    def _record_error(self, d: StreamTableDef, started: float, t0: float, e: BaseException) -> None:
        try:
            fresh = self.catalog.get(d.name)
        except Exception:  # noqa: BLE001 - dropped meanwhile
            return
        history.write(self.catalog, history.failed(d.name, started, (time.perf_counter() - t0) * 1000, e))
        fresh.consecutive_errors += 1
        fresh.last_error = _first_line(e)
        if isinstance(e, SourceChangedError) and fresh.status == TableStatus.ACTIVE:
            fresh.status = TableStatus.ERROR  # retrying cannot help: stop scheduling it until a user acts
        self.catalog.put(fresh)


#: How often one refresh call retries when upstream stream tables reflect different base versions.
#: how often a refresh is retried after losing a commit race to another writer
CONFLICT_RETRIES = 3
CONSISTENCY_ATTEMPTS = 5


class _Inconsistent(Exception):
    """Inputs of a refresh reflect different versions of one base table: ``path`` at up to ``version``."""

    def __init__(self, message: str, path: str, version: int) -> None:
        super().__init__(message)
        self.path, self.version = path, version


#: this thread's job tag for AUTO's budget and the SparkContext it was added to (see :func:`_budget_tag`)
_BUDGET_TAG = threading.local()


def _budget_tag(sc: Any) -> str:
    """This thread's job tag for AUTO's budget, added to the SparkContext once per thread and kept. Why: adding
    and removing a tag around every refresh were two py4j round trips, 1-1.7 ms of an AUTO table's 30-50 ms
    refresh that its DIFFERENTIAL twin did not pay (cProfile of 24 refreshes side by side, docs/BENCHMARKS.md,
    session 79), for a watcher that fires only after :data:`pipeline.strategy.BUDGET_MIN_S`. Jobs this thread
    runs outside AUTO's refreshes carry the tag too, but only a watcher armed inside one cancels by it, and
    the watcher stops when its refresh's block ends. A caller that clears its thread's tags
    (``SparkContext.clearJobTags``) takes the budget's means of cancelling with them."""
    kept = getattr(_BUDGET_TAG, "kept", None)
    if kept is not None and kept[0] is sc:
        return kept[1]
    tag = f"trickle-auto-{uuid.uuid4().hex[:12]}"
    sc.addJobTag(tag)
    _BUDGET_TAG.kept = (sc, tag)
    return tag


@contextmanager
def _cancelled_after(spark: Any, seconds: float | None, fired: threading.Event) -> Iterator[None]:
    """Cancel the Spark jobs this thread starts inside the block once ``seconds`` have passed (None: never),
    and every half second after that until the block ends (a job started later is cancelled too), setting
    ``fired``. A job tag, not a job group: callers (the benchmarks) may have set a group of their own."""
    if seconds is None:
        yield
        return
    sc = spark.sparkContext
    tag = _budget_tag(sc)
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        fired.set()
        while not done.is_set():
            sc.cancelJobsWithTag(tag)
            done.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        # the tag stays on this thread: no cancel may land once the block is left, or it would stop what runs
        # next under the same tag (the FULL that replaces a cancelled delta)
        watcher.join()


def _rendered(ctx: Context, sql: str | None, record: dict[str, Any], for_spark: bool = True) -> str | None:
    """A delta query as it runs: for Spark, snapshots read once are inlined again (see
    :meth:`Context.unshare_single_reads`; DuckDB reads each registered relation where it is referenced, so
    the local engine skips that parse of the whole query), and the notes its rules left go into the refresh
    record. None when provably nothing changed."""
    if sql is not None and for_spark:
        sql = ctx.unshare_single_reads(sql)
    if ctx.notes:
        record["notes"] = list(ctx.notes)
    return sql


def _change_rows(plan: dvm.Plan) -> tuple[list[str], bool, bool]:
    """How the plan's change rows (see :mod:`dvm.plan`) are applied: the stored columns in table order,
    whether a matched row is updated (keyed layout: rows carry state), and whether inserted rows carry fresh
    ids, so that a delta without deletions is an append (the plain-rows layout)."""
    return plan.stored_columns(), plan.keyed is not None, plan.keyed is None


class _WriteConflict(Exception):
    """Delta refused our commit because another writer committed to the same table first."""


@dataclass(frozen=True)
class _Committed:
    """The stream table as a refresh finds it: its latest version (the next commit is checked against it),
    the frontier its contents reflect and the refresh record (None: never populated)."""

    version: int | None
    frontier: dict[str, int] | None
    meta: dict[str, Any] | None


def collected_full(df: Any) -> Any | None:
    """A FULL's result collected to the driver as Arrow; None when it outgrew ``spark.driver.maxResultSize``
    (the table it replaces was small, its new result is not: Spark writes it instead)."""
    try:
        return df.toArrow()
    except Exception as e:  # noqa: BLE001 - only the driver's result limit; anything else is the query's
        if "maxResultSize" not in str(e):
            raise
        _log.warning("a FULL result outgrew spark.driver.maxResultSize; written by Spark instead")
        return None


def _is_write_conflict(e: BaseException) -> bool:
    """Another writer committed first: Delta's own conflict, by its class (:mod:`connectors.delta_errors`), or a
    commit of ours found lost (:class:`delta_sink.CommitLost`). Only the question is asked here: any other
    error, an OSError of the catalog's files included, reaches the caller as it was raised."""
    return isinstance(e, delta_sink.CommitLost | delta_errors.CommitConflict) or isinstance(
        delta_errors.classified(e), delta_errors.CommitConflict)


_first_line = history.first_line


def _races_lost(who: str, e: BaseException) -> RefreshError:
    """The error of a refresh that lost every commit race it was allowed to retry (``who``: what lost)."""
    return RefreshError(f"{who} lost {CONFLICT_RETRIES + 1} commit races in a row to another writer refreshing "
                        f"it ({_first_line(e)}); nothing was applied twice; retry later, or refresh it from one "
                        "process only")


def _history_gone(e: BaseException, d: StreamTableDef, pre: dict[str, int], post: dict[str, int]) -> str | None:
    """When files of the change window are gone (:class:`delta_errors.ChangesGone`): which source(s) and
    versions, for the reason or the error; None for any other error. The source is the one whose path the
    message names (else all that changed)."""
    if not isinstance(e, delta_errors.ChangesGone):
        return None
    text = str(e.__cause__ or e)
    changed = [k for k in d.sources if pre.get(k) != post.get(k)]
    named = [k for k in changed if d.sources[k].path.rstrip("/") + "/" in text] or changed
    parts = [f"{k} between versions {pre.get(k)} and {post[k]}" for k in named]
    return (f"the change history of source {', '.join(parts)} is no longer readable (files it needs were "
            f"removed, e.g. by VACUUM: {_first_line(e.__cause__ or e)[:200]})")


def _check_commits_kept(d: StreamTableDef, windows: dict[str, SourceWindow]) -> None:
    """Raise when a commit of a source's window is gone from its log (log retention removed it after a
    checkpoint): the window's change feed can no longer be read. The window's own pass over its commits
    found it (:attr:`SourceWindow.commit_gone_at`); no extra read."""
    for key, w in windows.items():
        if w.commit_gone_at is not None and key in d.sources:
            raise delta_errors.ChangesGone(f"the commit of version {w.commit_gone_at} is gone from "
                                           f"{d.sources[key].path.rstrip('/')}/_delta_log/ (removed by log retention)")


__all__ = ["Refresher", "RefreshResult", "UnsupportedError"]
