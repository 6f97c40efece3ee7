"""The refresh scheduler: which stream tables are due, in which order, and what happens when one fails.

Pure logic over an injected clock and injected callables (``refresh``, ``set_status``, ``log``), so that it
can be tested without Spark and wired to :class:`pipeline.api.StreamTables` by the run loop::

    sched = Scheduler(st.refresh_stream_table, set_error_status, log=history_writer)
    while not stop.is_set():
        sched.sync(st.status())      # tables created / altered / dropped by other processes
        sched.tick()                 # refresh what is due, wave by wave
        stop.wait(tick_seconds)

Decisions, each reported to ``log(event, fields)``:

- ``refreshed``: the refresh returned; the next one is due per the (effective) schedule, anchored on the
  start of the wave that ran it, so a slow refresh does not push every later slot back.
- ``refresh_failed``: the refresh raised; the next attempt waits ``min(backoff_max, backoff_base *
  2**(n-1)) * jitter`` (n = failures in a row, jitter uniform in [0.5, 1.5): tables that failed together,
  e.g. on a shared source, do not retry in lockstep) instead of the schedule.
- ``error_state``: the n-th failure in a row with n >= ``max_consecutive_errors``: ``set_status(name,
  "ERROR", reason)`` is called once and the table is no longer scheduled, so one broken table stops burning
  the cluster. ``ALTER ... status=ACTIVE`` (which resets the catalog's error count) brings it back.
- ``skipped``: a due table is not refreshed because an upstream stream table (direct or transitive) failed
  its last attempt (in this tick or earlier, still in back-off) or is SUSPENDED/ERROR. Refreshing it would
  either publish results over a stale upstream, or — since a refresh first refreshes stale upstream tables —
  hit the failing or paused upstream outside its back-off. It is retried with the upstream's next attempt
  (or at its own next slot when the upstream is not scheduled); skips do not count as its failures.
- ``table_added`` / ``table_removed`` / ``table_changed``: what :meth:`Scheduler.sync` saw in the catalog.

SUSPENDED and ERROR tables are simply not due (their status change is logged once, by ``sync``).
IMMEDIATE tables are never scheduled here: their streaming query keeps them fresh.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.modes import RefreshMode, TableStatus
from pipeline.schedule import (
    DEFAULT_SCHEDULE,
    effective_schedules,
    is_calculated,
    next_due,
    schedule_interval,
)

ACTIVE, SUSPENDED, ERROR = TableStatus.ACTIVE, TableStatus.SUSPENDED, TableStatus.ERROR

_log = logging.getLogger(__name__)


@dataclass
class TableState:
    """What the scheduler knows about one stream table.

    ``schedule`` is the effective schedule (CALCULATED resolved), None when the scheduler does not run the
    table (IMMEDIATE). ``declared_schedule`` is the catalog's. ``upstream``: stream tables it reads directly.
    ``last_ok``: start of the last successful refresh (the schedule's anchor). ``next_attempt``: when it is
    due; None = not scheduled (no schedule, SUSPENDED, ERROR). ``last_finished``: when our own last refresh
    returned, so that ``sync`` can tell a refresh made by another process (a newer ``last_refresh_at``) from
    our own.
    """

    name: str
    schedule: str | None
    upstream: set[str] = field(default_factory=set)
    status: str = ACTIVE
    consecutive_errors: int = 0
    last_ok: float | None = None
    next_attempt: float | None = None
    declared_schedule: str | None = None
    last_finished: float | None = None


@dataclass
class Outcome:
    """Result of one due table in one tick: refreshed (``ok``), failed (``error``) or skipped
    (``skipped_reason``). ``result`` is whatever ``refresh`` returned (a RefreshResult when wired to
    StreamTables); ``duration`` is wall seconds spent in ``refresh``."""

    name: str
    ok: bool
    error: str | None = None
    duration: float = 0.0
    skipped_reason: str | None = None
    result: Any = None


class Scheduler:
    """Decides and runs due refreshes; see the module docstring for the semantics.

    ``refresh(name)`` refreshes one table (raising on failure); ``set_status(name, status, reason)``
    persists the ERROR status; ``clock()`` returns epoch seconds (the catalog's ``last_refresh_at`` and cron
    are in epoch/UTC, so keep the default :func:`time.time` in production). ``threads``: how many tables of
    one wave refresh at the same time. ``default_schedule``: what a CALCULATED table without a scheduled
    consumer runs on. ``max_consecutive_errors <= 0`` never puts a table in ERROR.

    Not thread safe: call ``sync``/``tick`` from one thread. All state changes and ``log``/``set_status``
    calls happen on that thread; only ``refresh`` runs on the pool.
    """

    def __init__(
        self,
        refresh: Callable[[str], Any],
        set_status: Callable[[str, str, str], None],
        clock: Callable[[], float] = time.time,
        max_consecutive_errors: int = 3,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        threads: int = 2,
        rng: random.Random | None = None,
        log: Callable[[str, dict[str, Any]], None] | None = None,
        default_schedule: str = DEFAULT_SCHEDULE,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        schedule_interval(default_schedule)  # fail now, not at the first CALCULATED table
        self._refresh = refresh
        self._set_status = set_status
        self._clock = clock
        self.max_consecutive_errors = max_consecutive_errors
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.threads = threads
        self._rng = rng if rng is not None else random.Random()
        self._log_fn = log
        self.default_schedule = default_schedule
        self._tables: dict[str, TableState] = {}
        self._invalid: dict[str, str] = {}  # schedules already reported as unusable
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # --- state ------------------------------------------------------------------------------------------

    def tables(self) -> dict[str, TableState]:
        """Copies of the current states, by name (for status displays and tests)."""
        return {n: replace(s, upstream=set(s.upstream)) for n, s in self._tables.items()}

    def next_wakeup(self) -> float | None:
        """Earliest ``next_attempt`` of a schedulable table: the run loop may sleep until then."""
        times = [s.next_attempt for s in self._tables.values() if self._schedulable(s)]
        return min((t for t in times if t is not None), default=None)

    def close(self) -> None:
        """Stop the worker threads (waits for refreshes in flight)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sync -------------------------------------------------------------------------------------------

    def sync(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Make the scheduler's view match the catalog rows (``StreamTables.status()``).

        Called every tick, so tables created, altered (schedule, mode, status) or dropped by another process
        are picked up. Rows need ``name``; optional ``status``, ``schedule``, ``refresh_mode``,
        ``consecutive_errors``, ``last_refresh_at``, and ``upstream`` (else: ``sources`` that are themselves
        stream tables in ``rows``).

        While a table is known, the scheduler's own error count and back-off win over the catalog's (the
        catalog lags by a tick and is also bumped by refreshes we did not schedule), except when the catalog
        shows a successful refresh newer than ours — someone else brought it up to date, so its schedule
        restarts from there — or a user re-activated a table we had put in ERROR.
        """
        now = self._clock()
        rows = [r for r in rows if r.get("name")]
        names = {str(r["name"]) for r in rows}
        upstream: dict[str, set[str]] = {}
        declared: dict[str, str | None] = {}
        for r in rows:
            name = str(r["name"])
            explicit = r.get("upstream")
            ups = explicit if explicit is not None else [s for s in r.get("sources") or () if s in names]
            upstream[name] = {str(u) for u in ups if str(u) != name}
            declared[name] = self._declared(name, r)
        consumers: dict[str, set[str]] = {n: set() for n in names}
        for name, ups in upstream.items():
            for u in ups:
                consumers.setdefault(u, set()).add(name)
        effective = effective_schedules(declared, consumers, self.default_schedule)

        for name in sorted(set(self._tables) - names):
            del self._tables[name]
            self._emit("table_removed", name=name)

        for r in rows:
            name = str(r["name"])
            status = str(r.get("status") or ACTIVE).upper()
            errors = int(r.get("consecutive_errors") or 0)
            refreshed_at = _float_or_none(r.get("last_refresh_at"))
            sched = effective[name]
            s = self._tables.get(name)
            if s is None:
                s = TableState(name, sched, upstream[name], status, errors, refreshed_at,
                               declared_schedule=declared[name], last_finished=refreshed_at)
                s.next_attempt = self._next_slot(s, now) if self._schedulable(s) else None
                self._tables[name] = s
                self._emit("table_added", name=name, status=status, schedule=sched,
                           declared_schedule=declared[name], upstream=sorted(s.upstream),
                           next_attempt=s.next_attempt)
                continue
            s.upstream = upstream[name]
            changes: dict[str, Any] = {}
            if refreshed_at is not None and (s.last_finished is None or refreshed_at > s.last_finished):
                # A refresh we did not run (CLI, another job): restart the schedule from it.
                s.last_ok = s.last_finished = refreshed_at
                s.consecutive_errors = errors
                changes["refreshed_elsewhere_at"] = refreshed_at
            new_status = self._reconcile_status(s, status, errors)
            if new_status != s.status:
                changes["status"] = [s.status, new_status]
                if new_status == ACTIVE:
                    s.consecutive_errors = errors
                s.status = new_status
            if sched != s.schedule or declared[name] != s.declared_schedule:
                changes["schedule"] = [s.schedule, sched]
                s.schedule, s.declared_schedule = sched, declared[name]
            if changes:
                in_backoff = s.consecutive_errors > 0 and s.next_attempt is not None
                if not self._schedulable(s):
                    s.next_attempt = None
                elif not in_backoff or "status" in changes:
                    s.next_attempt = self._next_slot(s, now)
                self._emit("table_changed", name=name, next_attempt=s.next_attempt, **changes)

    def _declared(self, name: str, row: Mapping[str, Any]) -> str | None:
        """The schedule this scheduler should honour: None for IMMEDIATE and for unusable strings."""
        if str(row.get("refresh_mode") or "").upper() == RefreshMode.IMMEDIATE:
            return None
        sched = row.get("schedule")
        if sched is None:
            return None
        sched = str(sched)
        if is_calculated(sched):
            return sched
        try:
            schedule_interval(sched)
        except ValueError as e:
            if self._invalid.get(name) != sched:  # once per bad value, not once per tick
                self._invalid[name] = sched
                self._emit("invalid_schedule", name=name, schedule=sched, error=str(e))
            return None
        self._invalid.pop(name, None)
        return sched

    def _reconcile_status(self, s: TableState, catalog_status: str, catalog_errors: int) -> str:
        """The status to adopt from the catalog.

        We may have put the table in ERROR before the catalog shows it (set_status is the caller's write);
        an ACTIVE row then only means "resumed" when its error count was reset below the limit, as
        ``alter_stream_table(status="ACTIVE")`` and a successful refresh do.
        """
        if s.status == ERROR and catalog_status == ACTIVE and not self._below_limit(catalog_errors):
            return ERROR
        return catalog_status

    def _below_limit(self, errors: int) -> bool:
        return self.max_consecutive_errors <= 0 or errors < self.max_consecutive_errors

    # --- due --------------------------------------------------------------------------------------------

    def due(self, now: float) -> list[list[str]]:
        """Due tables grouped in waves, in topological order.

        A due table goes in a later wave than every due table it reads directly or transitively (through
        tables that are not due), so upstream tables are refreshed first; independent tables share a wave
        and refresh concurrently. Within a wave: most overdue first, then by name.
        """
        due = {n for n, s in self._tables.items()
               if self._schedulable(s) and s.next_attempt is not None and s.next_attempt <= now}
        level: dict[str, int] = {}  # waves of due tables strictly above this table

        def above(name: str, path: frozenset[str]) -> int:
            if name in level:
                return level[name]
            best = 0
            for u in self._tables[name].upstream:
                if u in self._tables and u not in path:
                    best = max(best, above(u, path | {name}) + (1 if u in due else 0))
            level[name] = best
            return best

        waves: dict[int, list[str]] = {}
        for n in due:
            waves.setdefault(above(n, frozenset()), []).append(n)

        def order(n: str) -> tuple[float, str]:
            return self._tables[n].next_attempt or 0.0, n

        return [sorted(waves[k], key=order) for k in sorted(waves)]

    # --- tick -------------------------------------------------------------------------------------------

    def tick(self) -> list[Outcome]:
        """Refresh every due table, wave after wave; returns one Outcome per due table."""
        outcomes: list[Outcome] = []
        for wave in self.due(self._clock()):
            wave_start = self._clock()
            runnable: list[str] = []
            for name in wave:
                s = self._tables.get(name)
                if s is None:
                    continue
                reason, retry_at = self._blocked(name)
                if reason is not None:
                    # Anchored on now, not on last_ok: an old anchor would make it due again every tick.
                    if retry_at is None or retry_at <= wave_start:
                        retry_at = next_due(s.schedule, wave_start, wave_start) if s.schedule else None
                    s.next_attempt = retry_at
                    outcomes.append(Outcome(name, ok=False, skipped_reason=reason))
                    self._emit("skipped", name=name, reason=reason, next_attempt=s.next_attempt)
                else:
                    runnable.append(name)
            results = self._run(runnable)
            wave_end = self._clock()
            for name in runnable:
                outcomes.append(self._settle(name, results[name], wave_start, wave_end))
        return outcomes

    def _blocked(self, name: str) -> tuple[str | None, float | None]:
        """Why ``name`` must not refresh now (an upstream failed or is paused) and when to try again."""
        failed: list[str] = []
        paused: list[str] = []
        for a in self._ancestors(name):
            s = self._tables[a]
            if s.status in (SUSPENDED, ERROR):
                paused.append(f"{a} is {s.status}")
            elif s.consecutive_errors > 0:
                failed.append(a)
        if not failed and not paused:
            return None, None
        parts = [f"upstream {a} failed its last refresh" for a in sorted(failed)] + [
            f"upstream {p}" for p in sorted(paused)]
        retries = [self._tables[a].next_attempt for a in failed]
        retry_at = max((t for t in retries if t is not None), default=None)
        return "; ".join(parts), retry_at

    def _ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        stack = list(self._tables[name].upstream)
        while stack:
            u = stack.pop()
            if u in seen or u not in self._tables or u == name:
                continue
            seen.add(u)
            stack.extend(self._tables[u].upstream)
        return seen

    def _run(self, names: list[str]) -> dict[str, tuple[bool, Any, float]]:
        """Run ``refresh`` for each name, concurrently up to ``threads``: name -> (ok, result|error, secs)."""
        if not names:
            return {}
        if len(names) == 1 or self.threads == 1:
            return {n: self._call(n) for n in names}
        pool = self._executor()
        futures: dict[str, Future[tuple[bool, Any, float]]] = {n: pool.submit(self._call, n) for n in names}
        return {n: f.result() for n, f in futures.items()}

    def _call(self, name: str) -> tuple[bool, Any, float]:
        t0 = time.perf_counter()
        try:
            result = self._refresh(name)
        except Exception as e:  # noqa: BLE001 - one failing table must not stop the others
            return False, e, time.perf_counter() - t0
        return True, result, time.perf_counter() - t0

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="trickle-refresh")
            return self._pool

    def _settle(self, name: str, res: tuple[bool, Any, float], wave_start: float, wave_end: float) -> Outcome:
        """Apply one refresh's result to the table's state and report the decision."""
        ok, value, secs = res
        s = self._tables[name]
        s.last_finished = wave_end
        if ok:
            s.consecutive_errors = 0
            s.last_ok = wave_start
            s.next_attempt = self._next_slot(s, wave_end) if self._schedulable(s) else None
            self._emit("refreshed", name=name, duration=secs, next_attempt=s.next_attempt)
            return Outcome(name, ok=True, duration=secs, result=value)
        error = _describe(value)
        s.consecutive_errors += 1
        n = s.consecutive_errors
        if not self._below_limit(n):
            s.status = ERROR
            s.next_attempt = None
            reason = f"{n} consecutive refresh failures; last: {error}"
            self._emit("error_state", name=name, consecutive_errors=n, reason=reason, duration=secs)
            try:
                self._set_status(name, ERROR, reason)
            except Exception as e:  # noqa: BLE001 - it stays out of this process's schedule regardless
                self._emit("set_status_failed", name=name, status=ERROR, error=_describe(e))
            return Outcome(name, ok=False, error=error, duration=secs)
        delay = min(self.backoff_max, self.backoff_base * 2 ** (n - 1)) * (0.5 + self._rng.random())
        s.next_attempt = wave_end + delay
        self._emit("refresh_failed", name=name, error=error, consecutive_errors=n, retry_in=delay,
                   retry_at=s.next_attempt, duration=secs,
                   traceback="".join(traceback.format_exception(value))[-4000:])
        return Outcome(name, ok=False, error=error, duration=secs)

    # --- helpers ----------------------------------------------------------------------------------------

    @staticmethod
    def _schedulable(s: TableState) -> bool:
        return s.status == ACTIVE and s.schedule is not None

    @staticmethod
    def _next_slot(s: TableState, now: float) -> float | None:
        return next_due(s.schedule, s.last_ok, now) if s.schedule is not None else None

    def _emit(self, event: str, **fields: Any) -> None:
        if self._log_fn is None:
            return
        try:
            self._log_fn(event, fields)
        except Exception:  # noqa: BLE001 - a broken log sink must not stop refreshes
            _log.exception("scheduler log callback failed for event %s", event)


def _describe(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:500]


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


__all__ = ["Outcome", "Scheduler", "TableState", "ACTIVE", "SUSPENDED", "ERROR"]
