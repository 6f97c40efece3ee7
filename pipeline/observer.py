"""The monitor thread of ``trickle run``: every :data:`INTERVAL_S` it looks at the catalog, the refresh
history, the sources' logs and the Kafka topics, and feeds the Prometheus metrics (:mod:`pipeline.metrics`),
the alerts (:mod:`pipeline.alerts`) and the Kafka lag of the sources' status file (``trickle status``).

It runs beside the scheduler, the lanes and the ingestion queries, reads only what they write (files, the
queries' progress, one admin call per Kafka source) and never writes the catalog, so it cannot slow or
break a refresh; an error in one look is logged (once until it changes) and the next look tries again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pipeline import monitor
from pipeline.alerts import Alerter, dead_letter_alert, table_alerts
from pipeline.metrics import Metrics

#: seconds between two looks
INTERVAL_S = 2.0


def _history_cursor(t: float) -> str:
    """A history file name (``<epoch microseconds, 16 digits>-<id>.json``) that sorts before every record
    started after ``t`` (see :meth:`pipeline.catalog.Catalog.append_history`)."""
    return f"{t:017.6f}".replace(".", "")


class Observer:
    """Looks at one :class:`pipeline.runtime.Runtime` (duck-typed: ``st``, ``spark``, ``conf``, ``log``,
    ``health``, ``ingestion``, ``_sources``, ``_write_sources_status``)."""

    def __init__(self, runtime: Any, interval_s: float = INTERVAL_S) -> None:
        self.rt = runtime
        self.interval_s = interval_s
        conf = runtime.conf
        self.metrics = Metrics()
        self.alerter = Alerter(conf.runtime.alert_webhook, error=runtime.log.error)
        self.max_staleness = {s.name.lower(): s.max_staleness_seconds for s in conf.stream_tables
                              if getattr(s, "max_staleness_seconds", None)}
        self.port: int | None = None
        self._cursor: dict[str, str] = {}
        self._since = _history_cursor(time.time())
        self._lag: dict[str, monitor.KafkaLag] = {}
        self._end_offsets: dict[str, Any] = {}
        self._dead: dict[str, tuple[int | None, int | None]] = {}  # source -> (log version, rows)
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self._lag_failing: set[str] = set()  # Kafka sources whose end offsets could not be read
        self.rows: list[dict[str, Any]] = []  # the newest look's table rows

    def start(self) -> Observer:
        port = self.rt.conf.runtime.metrics_port
        if port:
            self.port = self.metrics.serve(port)
            self.rt.log.event("metrics", url=f"http://0.0.0.0:{self.port}/metrics")
        self._thread = threading.Thread(target=self._loop, name="trickle-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop looking; does not wait for a look stuck on brokers that went away (closing its admin client
        below aborts that call), so a run with a dead broker still stops at once."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self.alerter.flush()
        self.metrics.close()
        for probe in self._end_offsets.values():
            probe.close()
        self._end_offsets.clear()

    def _loop(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.look()

    def look(self, now: float | None = None) -> None:
        """One look at everything; errors are reported, never raised."""
        now = time.time() if now is None else now
        for part in (self._tables, self._sources):
            try:
                part(now)
            except Exception as e:  # noqa: BLE001 - the next look tries again
                message = f"monitor: {part.__name__.strip('_')}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                if message != self._last_error:
                    self.rt.log.error(message)
                    self._last_error = message

    # --- stream tables ---

    def _new_history(self, catalog: Any, name: str) -> list[dict[str, Any]]:
        """The records ``name`` appended since the last look (by file name, which sorts by start time)."""
        after = self._cursor.get(name, self._since)
        new = [f for f in catalog.history_files(name) if f > after]
        if new:
            self._cursor[name] = new[-1]
        return [r for r in (catalog.history_record(name, f) for f in new) if r is not None]

    def _tables(self, now: float) -> None:
        catalog = self.rt.st.catalog
        rows = []
        for d in catalog.all():
            self.metrics.observe_history(self._new_history(catalog, d.name))
            row = monitor.table_row(self.rt.spark, catalog, d, now, history=False)
            rows.append(row)
            self.metrics.set_table(row)
            table_alerts(self.alerter, row, self.max_staleness.get(d.name.lower()))
        names = {r["name"] for r in rows}
        self.metrics.drop_tables(names)
        for gone in {r["name"] for r in self.rows} - names:
            self.alerter.forget(gone)
        self.rows = rows

    # --- Kafka sources ---

    def _sources(self, now: float) -> None:
        changed = False
        for name, health in list(self.rt.health.items()):
            entry = self.rt._sources.get(name)
            if entry is None:
                continue
            src = entry[0]
            lag_offsets, lag_seconds = self._kafka_lag(name, src, now)
            dead = self._dead_letters(name, src)
            extra = {"lag_offsets": lag_offsets, "lag_seconds": None if lag_seconds is None else round(lag_seconds, 1),
                     "dead_letters": dead}
            if getattr(health, "extra", None) != extra:
                health.extra = extra
                changed = True
            self.metrics.set_source(name, lag_offsets, lag_seconds, dead)
            table = getattr(src, "dead_letter_table", None)
            if table is not None:
                dead_letter_alert(self.alerter, name, table, dead)
        if changed:
            self.rt._write_sources_status()

    def _kafka_lag(self, name: str, src: Any, now: float) -> tuple[int | None, float | None]:
        """(offsets, seconds) the ingestion query of ``name`` is behind its topic; (None, None) before its
        first progress report or when the brokers do not answer."""
        q = self.rt.ingestion.get(name)
        last = q.lastProgress if q is not None else None
        if not last or not last.get("sources"):
            return None, None
        consumed = monitor.offsets_total(last["sources"][0].get("endOffset"), src.topic)
        if consumed is None:
            return None, None
        probe = self._end_offsets.get(name)
        if probe is None:
            from connectors.kafka_offsets import EndOffsets

            probe = self._end_offsets[name] = EndOffsets(self.rt.spark, src.bootstrap_servers, src.options)
        try:
            end = sum(probe(src.topic).values())
        except Exception as e:  # noqa: BLE001 - brokers away: the source's DOWN state says it too
            if name not in self._lag_failing:  # once per outage
                from connectors.kafka_mirror import _java_error

                self._lag_failing.add(name)
                self.rt.log.error(f"monitor: no Kafka lag for source {name} until its brokers answer: cannot read "
                                  f"the end offsets of topic {src.topic} ({_java_error(e)[:300]})")
            return None, None
        self._lag_failing.discard(name)
        clock = self._lag.setdefault(name, monitor.KafkaLag())
        clock.observe(now, end)
        offsets, seconds = clock.lag(now, consumed, end)
        return offsets, seconds

    def _dead_letters(self, name: str, src: Any) -> int | None:
        """Rows in the source's dead-letter table, re-counted only when its log has a new version."""
        table = getattr(src, "dead_letter_table", None)
        if table is None:
            return None
        from connectors import delta_rs, kafka_mirror
        from connectors.delta_log import DeltaLog

        location = kafka_mirror._location(self.rt.spark, table)
        version = DeltaLog(self.rt.spark, location).latest_version()
        seen = self._dead.get(name)
        if seen is not None and seen[0] == version:
            return seen[1]
        rows = delta_rs.table_rows(location, version) if version is not None else 0
        if rows is None:  # not a store delta-rs reads: one small Spark job, only when the table changed
            rows = self.rt.spark.read.format("delta").load(location).count()
        self._dead[name] = (version, rows)
        return rows
