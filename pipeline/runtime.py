"""The long-running job: one Spark application keeping a conf file's pipeline fresh until stopped.

What runs:

- one ingestion query per Kafka source (:mod:`connectors.kafka_mirror`): Debezium events -> Delta mirror;
- one streaming query per IMMEDIATE stream table (:mod:`pipeline.immediate`);
- the scheduler (:mod:`pipeline.scheduler`) for every other stream table: durations, cron, CALCULATED,
  topological waves, concurrent independent refreshes, back-off and the ERROR state.

Every tick re-reads the catalog, so stream tables created, altered, suspended or dropped from the CLI in
another process are picked up without a restart (an IMMEDIATE table created meanwhile gets its query).
Stopping (SIGINT/SIGTERM) lets the refresh wave and each streaming query's current micro-batch finish,
then stops the queries; every write is idempotent, so a hard kill loses nothing either.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.api import StreamTables
    from pipeline.conf import TrickleConf


class Runtime:
    """Start the pieces of a conf file's pipeline, then :meth:`run` the scheduler until ``stop`` is set."""

    def __init__(self, st: StreamTables, conf: TrickleConf, log: Any, warehouse: Path) -> None:
        self.st = st
        self.spark = st.spark
        self.conf = conf
        self.log = log  # pipeline.cli._Logger: event(what, **fields), refresh(result), error(message)
        self.checkpoints = Path(conf.checkpoints or warehouse / "_checkpoints")
        self.ingestion: dict[str, Any] = {}
        self.immediate: dict[str, Any] = {}
        self._sources: dict[str, tuple[Any, str, float]] = {}  # Kafka source name -> (source, checkpoint, trigger)
        self._restarts: dict[tuple[str, str], tuple[int, float]] = {}  # (kind, name) -> (restarts, next try)

    # --- start-up ---

    def start_sources(self) -> None:
        """Kafka sources get their mirror and ingestion query; Delta sources given by path get a name."""
        from connectors import kafka_mirror
        from connectors.debezium import SourceSchema
        from pipeline.conf import KafkaSourceSpec

        self.check_sources()
        for spec in self.conf.sources:
            if isinstance(spec, KafkaSourceSpec):
                src = kafka_mirror.KafkaSource(
                    spec.name, spec.topic, spec.bootstrap_servers, SourceSchema(spec.columns, spec.key),
                    dead_letter=spec.dead_letter or "", starting_offsets=spec.starting_offsets,
                    options=dict(spec.kafka_options))
                ckpt = self.checkpoints / f"mirror_{spec.name}"
                self._sources[spec.name] = (src, str(ckpt), spec.trigger_seconds)
                self.ingestion[spec.name] = kafka_mirror.start(self.spark, src, str(ckpt), spec.trigger_seconds)
                self.log.event("ingesting", source=spec.name, topic=spec.topic, mirror=spec.name,
                               dead_letter=src.dead_letter_table)
            elif spec.path is not None:
                location = spec.path.as_posix().replace("'", "\\'")
                self.spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.name} USING delta LOCATION '{location}'")
            elif not self.spark.catalog.tableExists(spec.name):
                raise ConfigError(f"{self.conf.path}: Delta source {spec.name!r} does not exist (create it, or "
                                  "give its 'path')")

    def check_sources(self) -> None:
        """Fail at start, naming the conf file and key, when a stream table reads a table that is neither
        a conf source, nor a conf or catalog stream table, nor a table Spark knows."""
        from pipeline.conf import query_sources

        known = {s.name.lower() for s in self.conf.sources} | {s.name.lower() for s in self.conf.stream_tables}
        for i, spec in enumerate(self.conf.stream_tables):
            for ref in query_sources(spec):
                if ref in known or self.st.catalog.exists(ref) or self.spark.catalog.tableExists(ref):
                    continue
                raise ConfigError(f"{self.conf.path}: stream_tables[{i}] {spec.name!r}.query: unknown source "
                                  f"{ref!r}: declare it under 'sources' (kind: kafka or delta), or create the "
                                  "table first")

    def create_stream_tables(self, stop: threading.Event) -> None:
        from pipeline.conf import creation_order

        self.check_sources()
        existing = {str(r.get("name")) for r in self.st.status()}
        for spec in creation_order(self.conf.stream_tables):
            if spec.name.lower() in existing or stop.is_set():
                continue
            self.st.create_stream_table(spec.name, spec.query, schedule=spec.schedule,
                                        refresh_mode=spec.refresh_mode)
            self.log.event("created", name=spec.name, refresh_mode=spec.refresh_mode, schedule=spec.schedule)

    # --- the loop ---

    def run(self, stop: threading.Event) -> None:
        from pipeline.scheduler import Scheduler

        rt = self.conf.runtime
        sched = Scheduler(self.st.refresh_stream_table, self._set_status, max_consecutive_errors=rt.max_consecutive_errors,
                          backoff_base=rt.retry_backoff_seconds, backoff_max=rt.retry_backoff_max_seconds,
                          threads=rt.scheduler_threads, log=self._decision)
        with sched:
            self.log.event("running", conf=str(self.conf.path), sources=len(self.conf.sources),
                           stream_tables=len(self.st.status()))
            while not stop.is_set():
                status = self.st.status()
                self._sync_immediate(status)
                sched.sync(status)
                for outcome in sched.tick():
                    if outcome.ok and outcome.result is not None:
                        self.log.refresh(outcome.result)
                self._check_queries()
                wake = sched.next_wakeup()
                wait = rt.tick_seconds if wake is None else min(rt.tick_seconds, max(0.05, wake - time.time()))
                stop.wait(wait)
        self.log.event("stopping")

    def _sync_immediate(self, status: list[dict[str, Any]]) -> None:
        """IMMEDIATE tables get a streaming query (also ones created from the CLI while running); dropped,
        suspended or re-moded ones lose it."""
        want = {str(r["name"]) for r in status
                if r.get("refresh_mode") == "IMMEDIATE" and r.get("status", "ACTIVE") == "ACTIVE"}
        for name in want - set(self.immediate):
            try:
                self.immediate[name] = self.st.start(name)
                self.log.event("started", name=name)
            except Exception as e:  # noqa: BLE001 - report it; the other tables keep running
                self.log.error(f"cannot start IMMEDIATE stream table {name}: {type(e).__name__}: {e}")
                self.immediate[name] = None
        for name in set(self.immediate) - want:
            self.st.stop(name)
            del self.immediate[name]
            self.log.event("stopped", name=name)

    def _check_queries(self) -> None:
        """Restart a streaming query that died, with exponential back-off (the runtime's retry settings).

        Safe because both kinds are exactly-once from their checkpoints: ingestion re-applies a batch
        with the same Delta transaction id (skipped), an IMMEDIATE refresh finds its versions applied.
        One known cause besides broker or storage outages: Spark 4.1.1's Kafka source throws a
        NullPointerException while reporting progress of the first batch after a crash (SPARK-55271,
        fixed upstream after 4.1.1), after that batch committed; the restarted query continues."""
        from connectors import kafka_mirror

        rt = self.conf.runtime
        now = time.time()
        for kind, queries in (("ingestion", self.ingestion), ("stream table", self.immediate)):
            for name, q in list(queries.items()):
                if q is None or q.isActive:
                    continue
                n, at = self._restarts.get((kind, name), (0, 0.0))
                if at == 0.0 or at < 0:
                    delay = min(rt.retry_backoff_max_seconds, rt.retry_backoff_seconds * 2 ** n)
                    self._restarts[(kind, name)] = (n, now + delay)
                    self.log.error(f"{kind} query of {name} stopped: {q.exception()}; restarting in {delay:.1f} s")
                    continue
                if now < at:
                    continue
                try:
                    if kind == "ingestion":
                        src, ckpt, trigger = self._sources[name]
                        queries[name] = kafka_mirror.start(self.spark, src, ckpt, trigger)
                    else:
                        queries[name] = self.st.start(name)
                    self._restarts[(kind, name)] = (n + 1, 0.0)
                    self.log.event("restarted", kind=kind, name=name, restarts=n + 1)
                except Exception as e:  # noqa: BLE001 - retried with a longer back-off
                    self._restarts[(kind, name)] = (n + 1, -1.0)
                    self.log.error(f"cannot restart the {kind} query of {name}: {type(e).__name__}: {e}")

    def _set_status(self, name: str, status: str, reason: str) -> None:
        d = self.st.catalog.get(name)
        d.status = status
        d.last_error = reason
        self.st.catalog.put(d)
        self._history(name, status, reason, error=reason)

    def _history(self, name: str, status: str, reason: str, action: str | None = None, **extra: Any) -> None:
        """A scheduler decision as a refresh-history record (no refresh ran: no rows, no frontier)."""
        if not self.st.catalog.exists(name):
            return
        now = time.time()
        self.st.catalog.append_history(name, {
            "refresh_id": f"{status.lower()}-{uuid.uuid4().hex[:12]}", "name": name, "action": action,
            "reason": reason, "status": status, "started_at": now, "finished_at": now, "duration_ms": 0.0,
            "rows_inserted": 0, "rows_deleted": 0, "rows_updated": 0, "frontier": None,
            "initiated_by": "SCHEDULER", "error": extra.pop("error", None), **extra})

    def _decision(self, event: str, fields: dict[str, Any]) -> None:
        """Log every scheduler decision, and record the ones that change what happens to a table.

        History gets: a retry scheduled after a failure (the failure itself is recorded by the refresh),
        a skip because an upstream failed or is paused, a schedule that cannot be used, and a status change
        seen in the catalog. ERROR is recorded by :meth:`_set_status`; refreshes record themselves."""
        if event == "refreshed":
            return  # logged with its result by run()
        if event in ("refresh_failed", "error_state", "set_status_failed", "invalid_schedule"):
            brief = {k: v for k, v in fields.items() if k != "traceback"}
            self.log.error(f"{event} {brief}")
        else:
            self.log.event(event, **{k: v for k, v in fields.items() if k != "traceback"})
        name = str(fields.get("name", ""))
        try:
            if event == "refresh_failed":
                self._history(name, "RETRY", f"attempt {fields.get('consecutive_errors')} failed; retry in "
                              f"{float(fields.get('retry_in') or 0):.1f} s (exponential back-off)",
                              error=fields.get("error"), retry_at=fields.get("retry_at"))
            elif event == "skipped":
                self._history(name, "SKIPPED", str(fields.get("reason")), action="SKIP",
                              retry_at=fields.get("next_attempt"))
            elif event == "invalid_schedule":
                self._history(name, "SKIPPED", f"schedule {fields.get('schedule')!r} cannot be used: "
                              f"{fields.get('error')}", action="SKIP")
            elif event == "table_changed" and "status" in fields:
                old, new = fields["status"]
                self._history(name, str(new), f"status changed from {old} to {new}")
        except Exception as e:  # noqa: BLE001 - history is best effort; the schedule goes on
            self.log.error(f"cannot record {event} of {name} in the history: {type(e).__name__}: {e}")

    # --- shutdown ---

    def stop(self, timeout_s: float = 120.0) -> None:
        """Let each streaming query finish the micro-batch in flight, then stop it."""
        queries = [q for q in (*self.immediate.values(), *self.ingestion.values()) if q is not None]
        deadline = time.time() + timeout_s
        for q in queries:
            while q.isActive and q.status.get("isTriggerActive") and time.time() < deadline:
                time.sleep(0.1)
            if q.isActive:
                q.stop()
        self.st.stop_all()
