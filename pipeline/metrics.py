"""Prometheus metrics of ``trickle run`` (``runtime.metrics_port`` / ``trickle run --metrics-port``).

Served with ``prometheus_client`` on ``http://<host>:<port>/metrics``. The names (``conf/grafana-dashboard.json``
uses them; the README lists them):

==========================================  =========  =================  ===============================================
metric                                      type       labels             what
==========================================  =========  =================  ===============================================
``trickle_refresh_duration_seconds``        histogram  table, action      refresh times (NO_DATA, DIFFERENTIAL, FULL,
                                                                          REINITIALIZE)
``trickle_refreshes_total``                 counter    table, action      refreshes; action ERROR counts failures
``trickle_refresh_errors_total``            counter    table              failed refreshes
``trickle_rows_applied_total``              counter    table, kind        rows inserted / deleted / updated
``trickle_staleness_seconds``               gauge      table              see :mod:`pipeline.monitor`
``trickle_consecutive_errors``              gauge      table              failures in a row (ERROR at the limit)
``trickle_table_status``                    gauge      table, status      1 for the table's status (ACTIVE, ERROR...)
``trickle_kafka_lag_offsets``               gauge      source             offsets the mirror is behind the topic
``trickle_kafka_lag_seconds``               gauge      source             how long it is behind (see monitor.KafkaLag)
``trickle_dead_letter_rows``                gauge      source             rows in the source's dead-letter table
==========================================  =========  =================  ===============================================

Refreshes are counted from the catalog's refresh history, whoever ran them (the scheduler, a fused lane, an
IMMEDIATE table's streaming query, a ``trickle refresh`` from another process), from the moment the run
started. Each run has its own registry, so several runtimes in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.modes import RefreshAction, TableStatus
from pipeline.monitor import action_of

#: refresh-time buckets, seconds: NO_DATA takes milliseconds, a FULL refresh of a big table minutes
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    600.0, 1800.0)
STATUSES = tuple(TableStatus)


class Metrics:
    """The metric families of one run, in a registry of their own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.refresh_duration = Histogram("trickle_refresh_duration_seconds", "Refresh duration by table and action",
                                          ["table", "action"], buckets=DURATION_BUCKETS, registry=r)
        self.refreshes = Counter("trickle_refreshes", "Refreshes by table and action (ERROR: failed)",
                                 ["table", "action"], registry=r)
        self.errors = Counter("trickle_refresh_errors", "Failed refreshes", ["table"], registry=r)
        self.rows = Counter("trickle_rows_applied", "Rows applied to stream tables", ["table", "kind"], registry=r)
        self.staleness = Gauge("trickle_staleness_seconds", "Seconds the table is behind its sources' oldest "
                               "change it does not reflect (0: caught up)", ["table"], registry=r)
        self.consecutive_errors = Gauge("trickle_consecutive_errors", "Failed refreshes in a row", ["table"],
                                        registry=r)
        self.status = Gauge("trickle_table_status", "1 for the stream table's current status", ["table", "status"],
                            registry=r)
        self.lag_offsets = Gauge("trickle_kafka_lag_offsets", "Offsets the mirror's ingestion is behind the topic",
                                 ["source"], registry=r)
        self.lag_seconds = Gauge("trickle_kafka_lag_seconds", "Seconds the mirror's ingestion is behind the topic",
                                 ["source"], registry=r)
        self.dead_letters = Gauge("trickle_dead_letter_rows", "Rows in the source's dead-letter table", ["source"],
                                  registry=r)
        self._server: Any = None
        self._tables: set[str] = set()

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``port`` in a thread; returns the port bound."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def observe_history(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Count new refresh-history records (scheduler notes such as RETRY or SKIPPED are not refreshes)."""
        for rec in records:
            action = action_of(rec)
            if action is None:
                continue
            table = str(rec.get("name"))
            self.refreshes.labels(table, action).inc()
            if action == RefreshAction.ERROR:
                self.errors.labels(table).inc()
                continue
            self.refresh_duration.labels(table, action).observe(float(rec.get("duration_ms") or 0.0) / 1000)
            for kind in ("inserted", "deleted", "updated"):
                n = rec.get(f"rows_{kind}") or 0
                if n:
                    self.rows.labels(table, kind).inc(int(n))

    def set_table(self, row: Mapping[str, Any]) -> None:
        """Gauges of one ``trickle status`` row (:func:`pipeline.monitor.table_row`)."""
        table = str(row["name"])
        self._tables.add(table)
        stale = row.get("staleness_s")
        if stale is not None:
            self.staleness.labels(table).set(float(stale))
        self.consecutive_errors.labels(table).set(int(row.get("consecutive_errors") or 0))
        for s in STATUSES:
            self.status.labels(table, s).set(1.0 if row.get("status") == s else 0.0)

    def drop_tables(self, keep: Iterable[str]) -> None:
        """Remove the gauges of tables dropped meanwhile (counters keep their totals, as Prometheus expects)."""
        keep = set(keep)
        for table in self._tables - keep:
            for gauge in (self.staleness, self.consecutive_errors):
                try:
                    gauge.remove(table)
                except KeyError:
                    pass
            for s in STATUSES:
                try:
                    self.status.remove(table, s)
                except KeyError:
                    pass
        self._tables &= keep

    def set_source(self, name: str, lag_offsets: int | None, lag_seconds: float | None,
                   dead_letters: int | None) -> None:
        if lag_offsets is not None:
            self.lag_offsets.labels(name).set(lag_offsets)
        if lag_seconds is not None:
            self.lag_seconds.labels(name).set(lag_seconds)
        if dead_letters is not None:
            self.dead_letters.labels(name).set(dead_letters)
