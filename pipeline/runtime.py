"""The long-running job: one Spark application keeping a conf file's pipeline fresh until stopped.

What runs:

- one ingestion query per Kafka source (:mod:`connectors.kafka_mirror`): Debezium events -> Delta mirror;
  each micro-batch then marks the IMMEDIATE stream tables that read the mirror, and a lane per table
  refreshes them beside the ingestion (the fused path: :mod:`pipeline.fused`, :mod:`pipeline.fused_lanes`);
- a streaming query per IMMEDIATE stream table over the change feeds of its other sources (Delta tables
  written by others, scheduled stream tables; :mod:`pipeline.immediate`), none for a table read only from
  mirrors;
- the scheduler (:mod:`pipeline.scheduler`) for every other stream table: durations, cron, CALCULATED,
  topological waves, concurrent independent refreshes, back-off and the ERROR state.

Every tick re-reads the catalog, so stream tables created, altered, suspended or dropped from the CLI in
another process are picked up without a restart (an IMMEDIATE table created meanwhile gets its query).
Stopping (SIGINT/SIGTERM) lets the refresh wave and each streaming query's current micro-batch finish,
then stops the queries; every write is idempotent, so a hard kill loses nothing either.

Kafka sources are watched, because Spark's Kafka source never fails fast: with no broker answering it
retries for minutes while everything downstream looks healthy (NO_DATA refreshes). So the brokers of every
Kafka source are asked first (:meth:`Runtime.probe_sources`: a source whose brokers do not answer stops the
start with an error), and while running a source whose ingestion query waits for its brokers longer than
:data:`STALL_SECONDS`, or whose query died, is DOWN: an error line repeated with back-off, and the state in
``<checkpoints>/trickle_sources.json`` (shown by ``trickle status``) until the query makes progress again.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.storage import for_uri, location
from pipeline import conf_reload, fused, history
from pipeline.errors import ConfigError, SourceError
from pipeline.fused_lanes import RefreshLanes
from pipeline.modes import RecordStatus, RefreshAction, RefreshMode, TableStatus

if TYPE_CHECKING:
    from pipeline.api import StreamTables
    from pipeline.conf import TrickleConf


#: How long the start-up probe waits for a Kafka source's brokers (unless its kafka_options set
#: ``kafka.default.api.timeout.ms``, which then wins). A reachable broker answers in milliseconds.
PROBE_TIMEOUT_S = 10.0
#: An ingestion query still fetching its topic's offsets after this long has no broker answering: its source
#: is DOWN. Spark's own failure comes later (3 attempts of ``kafka.default.api.timeout.ms``).
STALL_SECONDS = 15.0
#: What a streaming query's status message says while its Kafka source asks the brokers for offsets
#: (Spark's MicroBatchExecution.constructNextBatch); nothing of a batch has been written yet.
GETTING_OFFSETS = "Getting offsets from"
#: Where the run writes the state of its Kafka sources, under the checkpoints folder.
SOURCES_STATUS_FILE = "trickle_sources.json"


@dataclass
class SourceHealth:
    """What the run loop knows about one Kafka source's ingestion (UP, DOWN, or STOPPED at the end)."""

    name: str
    topic: str
    bootstrap_servers: str
    status: str = "UP"
    since: float = field(default_factory=time.time)
    error: str | None = None
    waiting_since: float | None = None  # the ingestion query has been fetching offsets since then
    progress_mark: tuple[str, str] | None = None  # (run id, last progress time) when it went DOWN
    warnings: int = 0
    next_warning: float = 0.0
    #: what the source's events asked of the mirror that it could not do (connectors.kafka_mirror)
    schema_error: str | None = None
    #: lag_offsets, lag_seconds, dead_letters: set by the run's monitor (pipeline.observer)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "since": self.since, "error": self.error,
                "topic": self.topic, "bootstrap_servers": self.bootstrap_servers,
                "schema_error": self.schema_error, **self.extra}


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _first_line(error: Any) -> str:
    """The message of a streaming query's exception without the plan Spark appends to it."""
    text = str(error or "").strip()
    return text.split("\n", 1)[0][:500] if text else "unknown error"


def _progress_mark(q: Any) -> tuple[str, str] | None:
    """Identifies the query's last progress report; a different mark means it made progress since."""
    last = q.lastProgress
    if not last:
        return None
    return (str(last.get("runId")), str(last.get("timestamp")))


def _in_batch(q: Any) -> bool:
    """A micro-batch is in flight (planned, being written): worth letting it finish before stopping. A
    query only waiting for its brokers' offsets has written nothing of the batch yet."""
    st = q.status
    return bool(st.get("isTriggerActive")) and not str(st.get("message", "")).startswith(GETTING_OFFSETS)


def read_sources_status(checkpoints: Path) -> dict[str, Any] | None:
    """The Kafka sources' state a running (or the last) ``trickle run`` wrote (None: no file)."""
    from connectors.storage import for_uri, join

    try:
        return json.loads(for_uri(checkpoints).read_text(join(checkpoints, SOURCES_STATUS_FILE)) or "")
    except (OSError, ValueError):
        return None


def _unreachable_message(conf: TrickleConf, specs: list[tuple[int, Any]], error: str) -> str:
    """The start-up error for Kafka sources (``(index, spec)`` sharing one ``bootstrap_servers``) whose
    brokers do not answer: the conf file, the sources, the servers, the topics, the cause, what to check."""
    i, spec = specs[0]
    names = ", ".join(repr(s.name) for _, s in specs)
    topics = ", ".join(repr(s.topic) for _, s in specs)
    return (f"{conf.path}: sources[{i}] {spec.name!r}: no Kafka broker answers at bootstrap_servers "
            f"{spec.bootstrap_servers!r} ({error}), so source {names} cannot read topic {topics}. Check that a "
            "broker is running there and reachable from this machine (host:port of a listener the broker "
            "advertises; 'localhost' in a container is the container itself), and that kafka_options' "
            "kafka.security.protocol / kafka.sasl.* / kafka.ssl.* match that listener.")


def check_kafka_reachable(conf: TrickleConf, timeout_s: float = 3.0) -> None:
    """Before Spark starts (seconds instead of a JVM start-up): fail when no bootstrap address of a Kafka
    source accepts a TCP connection. :meth:`Runtime.probe_sources` asks the brokers themselves later."""
    from connectors import kafka_mirror
    from pipeline.conf import KafkaSourceSpec

    groups: dict[str, list[tuple[int, KafkaSourceSpec]]] = {}
    for i, spec in enumerate(conf.sources):
        if isinstance(spec, KafkaSourceSpec):
            groups.setdefault(spec.bootstrap_servers, []).append((i, spec))
    for servers, specs in groups.items():
        error = kafka_mirror.unreachable(servers, timeout_s)
        if error is not None:
            raise SourceError(_unreachable_message(conf, specs, error))


def transaction_table(topic: str) -> str:
    """The Delta table of a transaction topic's ENDs: ``shop.transaction`` -> ``trickle_tx_shop_transaction``."""
    return "trickle_tx_" + re.sub(r"\W", "_", topic).lower()


class Runtime:
    """Start the pieces of a conf file's pipeline, then :meth:`run` the scheduler until ``stop`` is set."""

    def __init__(self, st: StreamTables, conf: TrickleConf, log: Any, warehouse: Path) -> None:
        self.st = st
        self.spark = st.spark
        self.conf = conf
        self.log = log  # pipeline.cli._Logger: event(what, **fields), refresh(result), error(message)
        self.checkpoints = location(conf.checkpoints or warehouse / "_checkpoints")  # a Path or a Uri
        self.ingestion: dict[str, Any] = {}
        self.immediate: dict[str, Any] = {}
        self._sources: dict[str, tuple[Any, str, float]] = {}  # Kafka source name -> (source, checkpoint, trigger)
        self._restarts: dict[tuple[str, str], tuple[int, float]] = {}  # (kind, name) -> (restarts, next try)
        self.health: dict[str, SourceHealth] = {}  # Kafka source name -> its ingestion's state
        self._halt = threading.Event()  # ends the watcher thread
        self._watcher: threading.Thread | None = None
        self._follows: dict[str, frozenset[str]] = {}  # IMMEDIATE table -> the sources its query follows
        self._defined: dict[str, str] = {}  # IMMEDIATE table -> the query its streaming query was started for
        self._conf_file = conf_reload.ConfFile(conf.path)  # an edit is applied on the next tick
        self._waiting_topics: set[str] = set()  # transaction tables whose topic is not on the cluster yet
        #: Kafka source -> the IMMEDIATE tables a batch of it marks for their lanes (pipeline.fused.fed_by),
        #: recomputed each tick from the catalog so that a batch reads no catalog
        self._fed: dict[str, list[str]] = {}
        self.observer: Any = None  # pipeline.observer.Observer: metrics, alerts, Kafka lag (see observe())
        rt = conf.runtime
        self.lanes = RefreshLanes(
            lambda name: self.st.refresh_stream_table(name), self._fused_done, self._fused_failed,
            lambda n: min(rt.retry_backoff_max_seconds, rt.retry_backoff_seconds * 2 ** (n - 1)))

    # --- start-up ---

    def start_sources(self) -> None:
        """Kafka sources get their mirror and ingestion query; Delta sources given by path get a name."""
        from connectors import kafka_mirror
        from connectors.debezium import DecodeError, SourceSchema
        from pipeline.conf import KafkaSourceSpec

        self.check_sources()
        self.probe_sources()
        self.observe()
        self._start_transaction_topics()
        for spec in self.conf.sources:
            if isinstance(spec, KafkaSourceSpec):
                try:
                    schema = SourceSchema(spec.columns, spec.key) if spec.columns else kafka_mirror.discover_schema(
                        self.spark, spec.name, spec.topic, spec.bootstrap_servers, dict(spec.kafka_options), spec.key)
                except DecodeError as e:
                    raise ConfigError(f"{self.conf.path}: {e}") from None
                src = kafka_mirror.KafkaSource(
                    spec.name, spec.topic, spec.bootstrap_servers, schema,
                    dead_letter=spec.dead_letter or "", starting_offsets=spec.starting_offsets,
                    options=dict(spec.kafka_options),
                    transactions=transaction_table(spec.transaction_topic) if spec.transaction_topic else "",
                    collection=spec.collection, evolve=not spec.columns)
                ckpt = self.checkpoints / f"mirror_{spec.name}"
                self._sources[spec.name] = (src, str(ckpt), spec.trigger_seconds)
                self.ingestion[spec.name] = kafka_mirror.start(self.spark, src, str(ckpt), spec.trigger_seconds,
                                                               self._after_batch(spec.name))
                self.health[spec.name] = SourceHealth(spec.name, spec.topic, spec.bootstrap_servers)
                self._write_sources_status()
                self.log.event("ingesting", source=spec.name, topic=spec.topic, mirror=spec.name,
                               dead_letter=src.dead_letter_table)
            elif spec.path is not None:
                location = spec.path.as_posix().replace("'", "\\'")
                self.spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.name} USING delta LOCATION '{location}'")
            elif not self.spark.catalog.tableExists(spec.name):
                raise ConfigError(f"{self.conf.path}: Delta source {spec.name!r} does not exist (create it, or "
                                  "give its 'path')")
        if (self.ingestion or self._waiting_topics) and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_loop, name="trickle-ingestion-watch", daemon=True)
            self._watcher.start()

    def observe(self) -> Any:
        """Start the monitor thread (:mod:`pipeline.observer`) once: metrics, alerts and Kafka lag."""
        if self.observer is None:
            from pipeline.observer import Observer

            self.observer = Observer(self).start()
        return self.observer

    def _start_transaction_topics(self) -> None:
        """One ingestion query per transaction topic the Kafka sources name (:mod:`connectors.kafka_transactions`),
        started before the mirrors, which name its table in their properties. Its batches mark the tables
        its connector's mirrors feed: a new END can make a held-back transaction whole."""
        from connectors import kafka_transactions
        from pipeline.conf import KafkaSourceSpec

        for spec in self.conf.sources:
            if not isinstance(spec, KafkaSourceSpec) or not spec.transaction_topic:
                continue
            name = transaction_table(spec.transaction_topic)
            if name in self._sources:
                continue
            tx = kafka_transactions.TransactionTopic(name, spec.transaction_topic, spec.bootstrap_servers,
                                                     spec.starting_offsets, dict(spec.kafka_options))
            self._sources[name] = (tx, str(self.checkpoints / f"transactions_{name}"), spec.trigger_seconds)
            kafka_transactions.create_tables(self.spark, tx)  # the mirrors name it in their properties
            self._waiting_topics.add(name)
        self._start_waiting_topics()

    def _start_waiting_topics(self) -> None:
        """Start the transaction topics' queries whose topic exists. Debezium creates the topic with the
        first transaction it streams, and Spark's Kafka source, started before that, fails while the topic
        is being created ("This server does not host this topic-partition") and backs off for longer each
        time, which held the ENDs, and so every table over the connector's mirrors, back for tens of
        seconds. So a missing topic is asked for again every second (the watcher thread) instead."""
        from connectors import kafka_mirror, kafka_transactions

        for name in sorted(self._waiting_topics):
            tx, ckpt, trigger = self._sources[name]
            found = kafka_mirror.probe(self.spark, tx.bootstrap_servers, tx.options, [tx.topic], PROBE_TIMEOUT_S)
            if found.error is not None or tx.topic in found.missing:
                continue
            self._waiting_topics.discard(name)
            self.ingestion[name] = kafka_transactions.start(self.spark, tx, ckpt, trigger, self._after_batch(name))
            self.log.event("ingesting", source=name, topic=tx.topic, transactions=name)

    def _watch_loop(self) -> None:
        """Watch (and restart) the ingestion queries every second, in a thread of its own: the run loop
        blocks while a refresh wave runs, and creating stream tables at start can take minutes; a broker
        that goes away meanwhile must still be reported."""
        while not self._halt.wait(1.0):
            try:
                if self._waiting_topics:
                    self._start_waiting_topics()
                self._check_queries(("ingestion",))
            except Exception as e:  # noqa: BLE001 - keep watching; say what went wrong
                self.log.error(f"watching the ingestion queries: {type(e).__name__}: {_first_line(e)}")

    def probe_sources(self) -> None:
        """Fail the start, naming the conf file, the source, its brokers and its topic, when a Kafka source's
        brokers do not answer; warn when its topic is not on the cluster yet.

        A broker that does not answer at start is a wrong address, a broker that is down, a network or a
        security mismatch: starting anyway would look healthy for minutes while nothing is ingested. A
        missing topic only warns: Debezium creates a table's topic with its first event (an empty table
        has none yet) and the ingestion query picks the topic up when it appears."""
        from connectors import kafka_mirror
        from pipeline.conf import KafkaSourceSpec

        groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, KafkaSourceSpec]]] = {}
        for i, spec in enumerate(self.conf.sources):
            if isinstance(spec, KafkaSourceSpec):
                key = (spec.bootstrap_servers, tuple(sorted(spec.kafka_options.items())))
                groups.setdefault(key, []).append((i, spec))
        for (servers, options), specs in groups.items():
            opts = dict(options)
            try:
                timeout_s = float(opts["kafka.default.api.timeout.ms"]) / 1000 if "kafka.default.api.timeout.ms" \
                    in opts else PROBE_TIMEOUT_S
            except ValueError:
                timeout_s = PROBE_TIMEOUT_S
            started = time.monotonic()
            found = kafka_mirror.probe(self.spark, servers, opts, [s.topic for _, s in specs], timeout_s)
            if found.error is not None:
                raise SourceError(_unreachable_message(self.conf, specs, f"{found.error}; asked for "
                                                                         f"{time.monotonic() - started:.1f} s"))
            for i, spec in specs:
                if spec.topic in found.missing:
                    similar = found.missing[spec.topic]
                    hint = f" (similar topics: {', '.join(similar)})" if similar else ""
                    self.log.error(
                        f"{self.conf.path}: sources[{i}] {spec.name!r}: topic {spec.topic!r} is not on the Kafka "
                        f"cluster at {servers!r}{hint}; the mirror stays empty until it appears. Check the topic "
                        "name (<topic.prefix>.<schema>.<table> for Debezium) and the client's ACLs; Debezium "
                        "creates the topic with the table's first change event.")

    def check_sources(self) -> None:
        """Fail at start, naming the conf file and key, when a stream table reads a table that is neither
        a conf source, nor a conf or catalog stream table, nor a table Spark knows."""
        from pipeline.conf import query_sources

        known = {s.name.lower() for s in self.conf.sources} | {s.name.lower() for s in self.conf.stream_tables} \
            | {v.lower() for v in self.conf.views}
        for i, spec in enumerate(self.conf.stream_tables):
            for ref in query_sources(spec):
                if ref in known or self.st.catalog.exists(ref) or self.spark.catalog.tableExists(ref):
                    continue
                raise ConfigError(f"{self.conf.path}: stream_tables[{i}] {spec.name!r}.query: unknown source "
                                  f"{ref!r}: declare it under 'sources' (kind: kafka or delta), or create the "
                                  "table first")

    def create_stream_tables(self, stop: threading.Event) -> None:
        from pipeline import strata
        from pipeline.conf import creation_order, query_sources

        self.check_sources()
        existing = {str(r.get("name")) for r in self.st.status()}
        # tables whose conf entry was edited while no run was alive: brought to the conf first
        defined = {d.name.lower(): (d.query, d.schedule, d.refresh_mode, d.dialect) for d in self.st.catalog.all()}
        conf_reload.apply(self.st, conf_reload.at_start(self.conf, defined), self.log)
        declared = {s.name.lower() for s in self.conf.stream_tables}
        closing: list[Any] = []  # cycle members created over part of their query (pipeline.strata.bootstrap_query)
        todo = [s for s in creation_order(self.conf.stream_tables) if s.name.lower() not in existing]
        while todo and not stop.is_set():
            for spec in todo:  # the first that can be created, whole or (a cycle's) over a UNION branch
                missing = {r for r in query_sources(spec) if r in declared and not self.st.catalog.exists(r)}
                query = strata.bootstrap_query(spec.query, missing, spec.dialect) if missing else spec.query
                if query is not None:
                    break
            else:
                raise ConfigError(f"{self.conf.path}: stream table {todo[0].name!r} is in a cycle of stream tables "
                                  "none of which has a UNION branch reading no other member of the cycle to start "
                                  "from; such a cycle has no rows (its least fixpoint is empty)")
            if missing:
                closing.append(spec)
            self.st.create_stream_table(spec.name, query, schedule=spec.schedule, refresh_mode=spec.refresh_mode,
                                        dialect=spec.dialect)
            self.log.event("created", name=spec.name, refresh_mode=spec.refresh_mode, schedule=spec.schedule)
            todo.remove(spec)
        for spec in closing:
            self.st.alter_stream_table(spec.name, query=spec.query)
            self.log.event("cycle_closed", name=spec.name, scc=self.st.catalog.get(spec.name).scc)

    # --- the loop ---

    def run(self, stop: threading.Event) -> None:
        from pipeline.scheduler import Scheduler

        rt = self.conf.runtime
        self.observe()
        sched = Scheduler(self.st.refresh_stream_table, self._set_status, max_consecutive_errors=rt.max_consecutive_errors,
                          backoff_base=rt.retry_backoff_seconds, backoff_max=rt.retry_backoff_max_seconds,
                          threads=rt.scheduler_threads, log=self._decision)
        from pipeline.housekeeping import Housekeeper, describe, mirror_paths

        # Delta housekeeping every trickle.housekeeping.intervalSeconds, between scheduler ticks
        keeper = Housekeeper(self.st, lambda: mirror_paths(self.spark, self.conf))
        with sched:
            self.log.event("running", conf=str(self.conf.path), sources=len(self.conf.sources),
                           stream_tables=len(self.st.status()))
            while not stop.is_set():
                self.conf = conf_reload.reload(self.st, self.conf, self._conf_file, self.log)
                status = self.st.status()
                self._sync_immediate(status)
                sched.sync(status)
                for outcome in sched.tick():
                    if outcome.ok and outcome.result is not None:
                        self.log.refresh(outcome.result, note=self._stale_note(outcome.result))
                self._check_queries(("stream table",))  # ingestion: the watcher thread
                for report in keeper.run_if_due() or []:
                    self.log.event("housekeeping", table=report.name or report.path, done=describe(report))
                wake = sched.next_wakeup()
                wait = rt.tick_seconds if wake is None else min(rt.tick_seconds, max(0.05, wake - time.time()))
                stop.wait(wait)
        self.log.event("stopping")

    def _sync_immediate(self, status: list[dict[str, Any]]) -> None:
        """IMMEDIATE tables get a streaming query over the sources no mirror batch refreshes them for (also
        tables created from the CLI while running; see :mod:`pipeline.fused`); dropped, suspended or re-moded
        ones lose it, and one whose followed sources changed gets a new one."""
        want = {str(r["name"]) for r in status
                if r.get("refresh_mode") == RefreshMode.IMMEDIATE
                and r.get("status", TableStatus.ACTIVE) == TableStatus.ACTIVE}
        defs = {d.name: d for d in self.st.catalog.all()}
        pushed = fused.pushed_sources(defs.values(), self._sources)
        for name in sorted(want):
            d = defs.get(name)
            if d is None:
                continue
            follow = frozenset(fused.followed(d, pushed))
            if (name in self.immediate and self._follows.get(name) == follow
                    and self._defined.get(name, d.maintained_query) == d.maintained_query):
                continue  # else: its followed sources or its query changed (an ALTER): restart it
            if name in self.immediate:
                self.st.stop(name)
            self._follows[name] = follow
            self._defined[name] = d.maintained_query
            if len(follow) < len(d.sources):  # mirror batches mark it for its lane, which refreshes it once now
                self.lanes.open(name)
            else:
                self.lanes.close(name)
            try:
                self.immediate[name] = self.st.start(name, follow=set(follow))
                self.log.event("started", name=name, follows=sorted(follow),
                               refreshed_by_batches_of=sorted(set(d.sources) - follow))
            except Exception as e:  # noqa: BLE001 - report it; the other tables keep running
                self.log.error(f"cannot start IMMEDIATE stream table {name}: {type(e).__name__}: {e}")
                self.immediate[name] = None
        for name in set(self.immediate) - want:
            self.st.stop(name)
            self.lanes.close(name)
            del self.immediate[name]
            self._follows.pop(name, None)
            self._defined.pop(name, None)
            self.log.event("stopped", name=name)
        lanes = [d for d in defs.values() if d.name in self.lanes.names()]
        self._fed = {source: fused.fed_by(lanes, source) for source in self._sources}
        for tx, members in self._transaction_members().items():  # a transaction topic's batch: its mirrors'
            self._fed[tx] = list(dict.fromkeys(n for m in members for n in self._fed.get(m, ())))

    # --- the fused path (pipeline.fused) ---

    def _after_batch(self, source: str) -> Any:
        """What a micro-batch of ``source`` runs after its mirror commit: mark the IMMEDIATE tables it feeds
        for their lanes (:mod:`pipeline.fused_lanes`) and wait for the refreshes that started, at most
        ``runtime.fused_wait_seconds``; a table still refreshing then goes on beside the ingestion. Never
        raises."""

        def mark() -> None:
            self._flag_schema(source)
            budget = self.conf.runtime.fused_wait_seconds
            late = self.lanes.wait(self.lanes.mark(self._fed.get(source, ()), f"a batch of {source}"), budget)
            if late:
                self.log.event("fused_wait_over", source=source, still_refreshing=sorted(late),
                               waited_seconds=budget)

        return mark

    def _flag_schema(self, source: str) -> None:
        """Show a Kafka source's schema problems (dead-lettered type changes) in the sources' status, and log
        them once each."""
        from connectors import kafka_mirror

        h = self.health.get(source)
        problem = kafka_mirror.schema_problem(source)
        if h is None or problem == h.schema_error:
            return
        h.schema_error = problem
        self._write_sources_status()
        self.log.error(f"source {source}: {problem}")

    def _fused_done(self, name: str, result: Any, why: str) -> None:
        if result.action != RefreshAction.NO_DATA:
            self.log.refresh(result, note=self._stale_note(result))

    def _fused_failed(self, name: str, error: BaseException, why: str, failures: int, retry_in: float) -> None:
        self.log.error(f"IMMEDIATE refresh of {name} after {why} failed: {type(error).__name__}: "
                       f"{_first_line(error)}; retrying in {retry_in:.1f} s (attempt {failures})")

    def _transaction_members(self) -> dict[str, list[str]]:
        """Transaction table -> the Kafka sources whose connector writes it."""
        from pipeline.conf import KafkaSourceSpec

        out: dict[str, list[str]] = {}
        for spec in self.conf.sources:
            if isinstance(spec, KafkaSourceSpec) and spec.transaction_topic:
                out.setdefault(transaction_table(spec.transaction_topic), []).append(spec.name)
        return out

    def _check_queries(self, kinds: tuple[str, ...] = ("ingestion", "stream table")) -> None:
        """Restart a streaming query that died, with exponential back-off (the runtime's retry settings).

        Safe because both kinds are exactly-once from their checkpoints: ingestion re-applies a batch
        with the same Delta transaction id (skipped), an IMMEDIATE refresh finds its versions applied.
        Spark 4.1's Kafka source failing the first batch after a stop inside a batch (SPARK-55271) is
        mostly kept from here: :func:`connectors.kafka_mirror.stream` re-runs that batch alone first. When
        that re-run fails too it only logs a warning, and this restart is the fallback."""
        from connectors import kafka_mirror, kafka_transactions

        rt = self.conf.runtime
        now = time.time()
        for kind, queries in (("ingestion", self.ingestion), ("stream table", self.immediate)):
            if kind not in kinds:
                continue
            for name, q in list(queries.items()):
                if q is None:
                    continue
                if q.isActive:
                    if kind == "ingestion":
                        self._watch_ingestion(name, q, now)
                    continue
                n, at = self._restarts.get((kind, name), (0, 0.0))
                if at == 0.0 or at < 0:
                    delay = min(rt.retry_backoff_max_seconds, rt.retry_backoff_seconds * 2 ** n)
                    self._restarts[(kind, name)] = (n, now + delay)
                    error = _first_line(q.exception())
                    self.log.error(f"{kind} query of {name} stopped: {error}; restarting in {delay:.1f} s")
                    if kind == "ingestion":
                        self._source_down(name, f"its ingestion query failed: {error}", now)
                    continue
                if now < at:
                    continue
                try:
                    if kind == "ingestion":
                        src, ckpt, trigger = self._sources[name]
                        module = kafka_transactions if isinstance(src, kafka_transactions.TransactionTopic) \
                            else kafka_mirror
                        queries[name] = module.start(self.spark, src, ckpt, trigger, self._after_batch(name))
                    else:
                        queries[name] = self.st.start(name, follow=set(self._follows.get(name, ())))
                    self._restarts[(kind, name)] = (n + 1, 0.0)
                    self.log.event("restarted", kind=kind, name=name, restarts=n + 1)
                except Exception as e:  # noqa: BLE001 - retried with a longer back-off
                    self._restarts[(kind, name)] = (n + 1, -1.0)
                    self.log.error(f"cannot restart the {kind} query of {name}: {type(e).__name__}: {e}")
                    if kind == "ingestion":
                        self._source_down(name, f"its ingestion query cannot restart: {type(e).__name__}: {e}",
                                          now)

    # --- Kafka sources' health ---

    def _watch_ingestion(self, name: str, q: Any, now: float) -> None:
        """DOWN when the running query has been waiting for its brokers' offsets for STALL_SECONDS; UP again
        once it reports progress made after it went DOWN (a restarted query: any progress)."""
        h = self.health.get(name)
        if h is None:
            return
        st = q.status
        if st.get("isTriggerActive") and str(st.get("message", "")).startswith(GETTING_OFFSETS):
            h.waiting_since = h.waiting_since or now
            if now - h.waiting_since >= STALL_SECONDS:
                self._source_down(name, f"no answer from its brokers for {now - h.waiting_since:.0f} s (the "
                                  "ingestion query is still waiting for the topic's offsets)", now, q)
            return
        h.waiting_since = None
        if h.status == "DOWN":
            mark = _progress_mark(q)
            if mark is not None and mark != h.progress_mark:
                self._source_up(name, now)

    def _source_down(self, name: str, reason: str, now: float, q: Any = None) -> None:
        """Mark a Kafka source DOWN and say so: at once, then again after 15 s, 30 s, 60 s, ... (at most the
        runtime's retry_backoff_max_seconds apart) for as long as it stays DOWN."""
        h = self.health.get(name)
        if h is None:
            return
        if h.status != "DOWN":
            h.status, h.since, h.warnings, h.next_warning = "DOWN", now, 0, 0.0
            h.progress_mark = _progress_mark(q) if q is not None else None
        h.error = reason
        if now < h.next_warning:
            return
        self._write_sources_status()  # DOWN, with the latest reason, for trickle status
        h.warnings += 1
        h.next_warning = now + min(self.conf.runtime.retry_backoff_max_seconds, STALL_SECONDS * 2 ** (h.warnings - 1))
        stale = self._dependents(name)
        self.log.error(
            f"source {name} is DOWN since {_stamp(h.since)}: {reason}. Kafka bootstrap_servers "
            f"{h.bootstrap_servers!r}, topic {h.topic!r}. Nothing is ingested: the mirror {name} "
            + (f"and the stream tables reading it ({', '.join(stale)}) " if stale else "")
            + "stay as they were (their refreshes find NO_DATA). Check that the brokers are up and reachable "
            f"from here; ingestion resumes on its own (warning {h.warnings}, next in "
            f"{h.next_warning - now:.0f} s if still DOWN)")

    def _source_up(self, name: str, now: float) -> None:
        h = self.health[name]
        down_s = now - h.since
        h.status, h.since, h.error, h.warnings, h.next_warning, h.progress_mark = "UP", now, None, 0, 0.0, None
        self._restarts.pop(("ingestion", name), None)  # the next outage starts its back-off afresh
        self._write_sources_status()
        self.log.event("source_up", source=name, down_seconds=round(down_s, 1))

    def _dependents(self, source: str) -> list[str]:
        """Stream tables that read ``source``, directly or through other stream tables."""
        try:
            out: list[str] = []
            todo = [source.lower()]
            while todo:
                for d in self.st.catalog.dependents(todo.pop()):
                    if d not in out:
                        out.append(d)
                        todo.append(d.lower())
            return out
        except Exception:  # noqa: BLE001 - only decorates a warning
            return []

    def _stale_note(self, result: Any) -> str | None:
        """For a refresh line of a stream table that reads a DOWN source: say its input is stale."""
        down = [n for n, h in self.health.items() if h.status == "DOWN"]
        name = result.get("name") if isinstance(result, dict) else getattr(result, "name", None)
        if not down or name is None:
            return None
        stale = [n for n in down if str(name) in self._dependents(n)]
        return f"source {', '.join(stale)} DOWN: input not updated" if stale else None

    def _write_sources_status(self) -> None:
        """Publish the Kafka sources' state for ``trickle status`` (another process): one JSON file, replaced
        atomically."""
        if not self.health:
            return
        doc = {"pid": os.getpid(), "conf": str(self.conf.path), "updated_at": time.time(),
               "sources": [h.as_json() for h in self.health.values()]}
        try:
            for_uri(self.checkpoints, self.spark).write_text(str(self.checkpoints / SOURCES_STATUS_FILE),
                                                             json.dumps(doc, indent=1))
        except Exception as e:  # noqa: BLE001 - OSError on a disk, a py4j error on a store
            self.log.error(f"cannot write {self.checkpoints / SOURCES_STATUS_FILE}: {e}")

    def _set_status(self, name: str, status: str, reason: str) -> None:
        d = self.st.catalog.get(name)
        d.status = status
        d.last_error = reason
        self.st.catalog.put(d)
        self._history(name, status, reason, error=reason)

    def _history(self, name: str, status: str, reason: str, action: str | None = None, error: str | None = None,
                 retry_at: float | None = None) -> None:
        """A scheduler decision as a refresh-history record (no refresh ran: no rows, no frontier)."""
        if not self.st.catalog.exists(name):
            return
        history.write(self.st.catalog, history.scheduled(name, status, reason, action, error, retry_at))

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
                self._history(name, RecordStatus.RETRY, f"attempt {fields.get('consecutive_errors')} failed; "
                              f"retry in {float(fields.get('retry_in') or 0):.1f} s (exponential back-off)",
                              error=fields.get("error"), retry_at=fields.get("retry_at"))
            elif event == "skipped":
                self._history(name, RecordStatus.SKIPPED, str(fields.get("reason")),
                              action=RefreshAction.SKIP, retry_at=fields.get("next_attempt"))
            elif event == "invalid_schedule":
                self._history(name, RecordStatus.SKIPPED, f"schedule {fields.get('schedule')!r} cannot be "
                              f"used: {fields.get('error')}", action=RefreshAction.SKIP)
            elif event == "table_changed" and "status" in fields:
                old, new = fields["status"]
                self._history(name, str(new), f"status changed from {old} to {new}")
        except Exception as e:  # noqa: BLE001 - history is best effort; the schedule goes on
            self.log.error(f"cannot record {event} of {name} in the history: {type(e).__name__}: {e}")

    # --- shutdown ---

    def stop(self, timeout_s: float = 120.0) -> None:
        """Let each streaming query finish the micro-batch in flight (at most ``timeout_s``), then stop them.

        A query only waiting for its brokers' offsets has nothing in flight and is stopped at once: waiting
        would last as long as the broker is away. The queries are stopped in parallel, because stopping a
        Kafka source waits for its admin client's pending call (up to ``kafka.default.api.timeout.ms``)."""
        self._halt.set()
        if self.observer is not None:
            self.observer.stop()
        if self._watcher is not None:
            self._watcher.join()  # it may be restarting a query: let it finish, so that one is stopped too
        queries = [q for q in (*self.immediate.values(), *self.ingestion.values()) if q is not None]
        deadline = time.time() + timeout_s
        for q in queries:
            while q.isActive and _in_batch(q) and time.time() < deadline:
                time.sleep(0.1)
        errors: list[str] = []

        def stop_one(q: Any) -> None:
            try:
                if q.isActive:
                    q.stop()
            except Exception as e:  # noqa: BLE001 - the others must still be stopped
                errors.append(f"{type(e).__name__}: {_first_line(e)}")

        threads = [threading.Thread(target=stop_one, args=(q,), daemon=True) for q in queries]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for h in self.health.values():
            h.status, h.since, h.error = "STOPPED", time.time(), None
        self._write_sources_status()
        self.lanes.stop(max(0.0, deadline - time.time()))
        self.st.stop_all()
        for e in errors:
            self.log.error(f"stopping a streaming query: {e}")
