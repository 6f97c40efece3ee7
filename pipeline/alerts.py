"""Alerts of ``trickle run``: a stream table going to ERROR, a table staler than its ``max_staleness``, and a
Kafka source's dead-letter table holding rows.

Each alert is one JSON object, logged as one line on stdout (``{"ts": ..., "event": "alert", "alert":
"table_error", ...}``) and, when ``runtime.alert_webhook`` is set, POSTed to that URL as
``application/json``. An alert fires once per transition into its condition (not on every tick of the
monitor) and is re-armed when the condition clears: a table that leaves ERROR and fails again alerts again.
The first look at a condition counts as a transition, so a run started over a table already in ERROR says
so once.

Delivery never stops the pipeline: POSTs run in a thread of their own, one after the other in the order the
alerts fired, each with a timeout, and a webhook that fails or does not answer gives an error line (and
nothing else).
"""

from __future__ import annotations

import datetime as dt
import json
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.modes import TableStatus

#: how long one POST to the webhook may take
WEBHOOK_TIMEOUT_S = 5.0

TABLE_ERROR = "table_error"
STALENESS = "staleness"
DEAD_LETTER = "dead_letter"


@dataclass
class Alerter:
    """Edge-triggered alerts: :meth:`check` a condition on every look; it fires when it turns true."""

    webhook: str | None = None
    #: writes one line (default: stdout); a test or the CLI's logger may pass its own
    write: Callable[[str], None] | None = None
    #: reports a delivery failure (default: stderr)
    error: Callable[[str], None] | None = None
    _active: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _queue: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    _worker: threading.Thread | None = None

    def check(self, kind: str, subject: str, condition: bool, **fields: Any) -> dict[str, Any] | None:
        """Fire ``kind`` for ``subject`` (a table or source name) when ``condition`` became true since the
        last look; returns the alert sent, or None."""
        key = (kind, subject)
        with self._lock:
            if not condition:
                self._active.discard(key)
                return None
            if key in self._active:
                return None
            self._active.add(key)
        return self.send(kind, subject, **fields)

    def forget(self, subject: str) -> None:
        """Drop the state of a table or source that is gone (a new one of the same name alerts afresh)."""
        with self._lock:
            self._active = {k for k in self._active if k[1] != subject}

    def send(self, kind: str, subject: str, **fields: Any) -> dict[str, Any]:
        alert = {"ts": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "event": "alert", "alert": kind,
                 "subject": subject, **fields}
        line = json.dumps(alert, default=str, sort_keys=False)
        if self.write is not None:
            self.write(line)
        else:
            print(line, flush=True)
        if self.webhook:
            with self._lock:
                if self._worker is None or not self._worker.is_alive():
                    self._worker = threading.Thread(target=self._deliver, name="trickle-alerts", daemon=True)
                    self._worker.start()
            self._queue.put(alert)
        return alert

    def _deliver(self) -> None:
        while True:
            alert = self._queue.get()
            try:
                self._post(alert)
            finally:
                self._queue.task_done()

    def _post(self, alert: Mapping[str, Any]) -> None:
        try:
            post_json(str(self.webhook), alert)
        except Exception as e:  # noqa: BLE001 - an alert that cannot be delivered must not stop anything
            message = (f"cannot deliver alert {alert.get('alert')} of {alert.get('subject')} to "
                       f"runtime.alert_webhook {self.webhook}: {type(e).__name__}: {e}")
            if self.error is not None:
                self.error(message)
            else:
                print(f"error: {message}", file=sys.stderr, flush=True)

    def flush(self, timeout_s: float = 2 * WEBHOOK_TIMEOUT_S) -> None:
        """Wait (at most ``timeout_s``) for the POSTs queued, at stop, so the last alerts are not cut off."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)


def post_json(url: str, doc: Mapping[str, Any], timeout_s: float = WEBHOOK_TIMEOUT_S) -> int:
    """POST ``doc`` as JSON; returns the HTTP status, raises on a network error or a status >= 400."""
    body = json.dumps(doc, default=str).encode("utf-8")
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "spark-trickle"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the operator's own URL
        return int(resp.status)


def table_alerts(alerter: Alerter, row: Mapping[str, Any], max_staleness_s: float | None) -> list[dict[str, Any]]:
    """The alerts of one ``trickle status`` row (:func:`pipeline.monitor.table_row`): ERROR, and staleness
    above ``max_staleness_s`` (None: no threshold; a SUSPENDED table is stale on purpose and does not alert)."""
    name = str(row["name"])
    out = []
    a = alerter.check(TABLE_ERROR, name, row.get("status") == TableStatus.ERROR, table=name,
                      consecutive_errors=row.get("consecutive_errors"), error=row.get("last_error"),
                      message=f"stream table {name} is in ERROR and no longer refreshed: {row.get('last_error')}; "
                              f"fix the cause, then: trickle alter {name} --status ACTIVE")
    if a:
        out.append(a)
    stale = row.get("staleness_s")
    if max_staleness_s is not None:
        paused = row.get("status") == TableStatus.SUSPENDED
        breached = stale is not None and stale > max_staleness_s and not paused
        a = alerter.check(STALENESS, name, breached, table=name,
                          staleness_seconds=None if stale is None else round(float(stale), 1),
                          max_staleness_seconds=max_staleness_s,
                          message=f"stream table {name} is {stale and round(float(stale))} s behind its sources, "
                                  f"above its max_staleness of {max_staleness_s:g} s")
        if a:
            out.append(a)
    return out


def dead_letter_alert(alerter: Alerter, source: str, table: str, rows: int | None) -> dict[str, Any] | None:
    """Alert when a Kafka source's dead-letter table holds rows (events that could not be decoded)."""
    return alerter.check(DEAD_LETTER, source, bool(rows), source=source, dead_letter_table=table,
                         rows=rows, message=f"{rows} change event(s) of source {source} could not be decoded and "
                                            f"are in {table}: read them there (error column), fix the producer "
                                            "or the conf's columns, then replay them")
