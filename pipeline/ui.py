"""The pipeline's web page: ``trickle ui`` (against a warehouse, read-only) and ``trickle run --ui PORT``
(beside the running pipeline).

One static page (``pipeline/ui_static/``: HTML, CSS and a small script that draws the DAG and the
sparklines as plain SVG) over two JSON endpoints:

``GET /api/pipeline``
    the DAG (:mod:`pipeline.dag`), one row per stream table with the fields of ``trickle status --json``
    (:func:`pipeline.monitor.table_row`: status, mode, staleness, last refresh, p95, errors...) plus its
    newest refreshes (action, duration) for the sparkline, and the Kafka sources of the running pipeline
    (the ``trickle_sources.json`` that ``trickle run`` keeps, as ``trickle status`` shows them)
``GET /api/history/<name>?limit=N``
    one table's refresh history, newest first (default :data:`HISTORY_LIMIT` records)

Why the standard library's ``http.server``: the page is read-only and polled every few seconds by a few
people at most, the server must run in a thread beside the pipeline (as the Prometheus endpoint of
:mod:`pipeline.metrics` does) and on machines without internet access; a threaded ``http.server`` does
that with nothing to install, and the page needs no framework, no CDN, nothing vendored.

Everything is read through the catalog's storage (so any store) and the stream tables' Delta logs; nothing
is ever written. A history record never changes once written (one file per refresh, see
:meth:`pipeline.catalog.Catalog.append_history`), so each is read once per server and kept.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pipeline import dag, monitor
from pipeline.errors import TrickleError

STATIC_DIR = Path(__file__).with_name("ui_static")
#: the files the page is made of: URL path -> (file under STATIC_DIR, content type)
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui.js": ("ui.js", "text/javascript; charset=utf-8"),
    "/ui.css": ("ui.css", "text/css; charset=utf-8"),
}
#: refreshes drawn in a table's sparkline (the newest ones)
SPARK_POINTS = 40
#: history records per table shown when it is clicked (``?limit=`` up to HISTORY_MAX)
HISTORY_LIMIT = 50
HISTORY_MAX = 1000
#: a snapshot is recomputed at most this often, however many pages poll
SNAPSHOT_TTL_S = 1.0
DEFAULT_PORT = 8421
DEFAULT_HOST = "127.0.0.1"


class _HistoryCache:
    """The catalog's history seen through a cache of its records (the duck type :mod:`pipeline.monitor`
    reads: ``history_files``, ``history_record``). Records are immutable once written, so a page polled
    every few seconds lists the history folder each time but reads each record file once."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog
        self._records: dict[str, dict[str, dict[str, Any]]] = {}  # table -> file -> record
        self._lock = threading.Lock()

    def history_files(self, name: str) -> list[str]:
        files = self.catalog.history_files(name)
        with self._lock:
            cached = self._records.get(name.lower())
            if cached:  # forget the records pruned meanwhile
                listed = set(files)
                for f in [f for f in cached if f not in listed]:
                    del cached[f]
        return files

    def history_record(self, name: str, file: str) -> dict[str, Any] | None:
        key = name.lower()
        with self._lock:
            hit = self._records.get(key, {}).get(file)
        if hit is not None:
            return hit
        record = self.catalog.history_record(name, file)
        if record is not None:  # None: pruned or being written; read again next time
            with self._lock:
                self._records.setdefault(key, {})[file] = record
        return record

    def newest(self, name: str, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` records, newest first."""
        out = []
        for f in reversed(self.history_files(name)[-limit:] if limit > 0 else []):
            record = self.history_record(name, f)
            if record is not None:
                out.append(record)
        return out


@dataclass
class PipelineView:
    """What the page shows and where it is read from: a catalog (and the Spark session its Delta logs are
    read through when they are not on a local disk; None: local files only, no JVM), the Kafka topics of
    the conf file, and the folder where ``trickle run`` writes its Kafka sources' state."""

    catalog: Any
    spark: Any = None
    kafka_topics: Mapping[str, str] = field(default_factory=dict)
    sources_dir: Any = None
    mode: str = "warehouse"  # "warehouse" (trickle ui, read-only) or "run" (trickle run --ui)
    title: str = ""
    _history: _HistoryCache = field(init=False, repr=False)
    _cached: tuple[float, dict[str, Any]] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._history = _HistoryCache(self.catalog)

    @classmethod
    def for_warehouse(cls, warehouse: Any, conf: Any = None, spark: Any = None) -> PipelineView:
        """``trickle ui``: the catalog under ``warehouse`` (``<warehouse>/_trickle``), read-only."""
        from connectors.storage import is_local, join
        from pipeline.catalog import Catalog

        root = join(warehouse, "_trickle")
        if is_local(root) and not Path(root).is_dir():
            raise TrickleError(f"no spark-trickle catalog at {root}: give the warehouse of a pipeline "
                               "(--warehouse DIR, or --conf CONF.yaml naming it)")
        checkpoints = conf.checkpoints if conf is not None and conf.checkpoints else join(warehouse, "_checkpoints")
        return cls(Catalog(root), spark, _kafka_topics(conf), checkpoints, "warehouse", str(warehouse))

    @classmethod
    def for_runtime(cls, runtime: Any) -> PipelineView:
        """``trickle run --ui``: the running pipeline's catalog, Spark session and sources."""
        return cls(runtime.st.catalog, runtime.spark, _kafka_topics(runtime.conf), runtime.checkpoints, "run",
                   str(runtime.conf.path))

    # --- what the endpoints answer ---

    def snapshot(self) -> dict[str, Any]:
        """``/api/pipeline``, recomputed at most every :data:`SNAPSHOT_TTL_S`."""
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < SNAPSHOT_TTL_S:
                return self._cached[1]
            doc = self._compute(time.time())
            self._cached = (time.monotonic(), doc)
            return doc

    def _compute(self, now: float) -> dict[str, Any]:
        defs = self.catalog.all()
        g = dag.build(defs, self.kafka_topics)
        depth = dag.layers(g)
        tables = []
        for d in defs:
            row = monitor.table_row(self.spark, self._history, d, now)
            points = [{"action": monitor.action_of(r), "ms": r.get("duration_ms"), "at": r.get("started_at")}
                      for r in self._history.newest(d.name, SPARK_POINTS * 2)]
            points = [p for p in points if p["action"] is not None][:SPARK_POINTS]
            tables.append({**row, "query": d.query, "full_reason": d.full_reason, "last_action": d.last_action,
                           "latest": points[0] if points else None, "recent": points[::-1]})
        from pipeline.runtime import read_sources_status

        doc = read_sources_status(self.sources_dir) if self.sources_dir is not None else None
        return {
            "now": now, "mode": self.mode, "title": self.title,
            "dag": {"nodes": [{"id": key, "name": n.name, "kind": n.kind, "label": n.label, "depth": depth[key]}
                              for key, n in sorted(g.nodes.items())],
                    "edges": [{"source": s, "reader": r} for s, r in g.edges]},
            "tables": tables,
            "sources": monitor.source_rows(doc),
            "sources_pid": (doc or {}).get("pid"),
        }

    def history(self, name: str, limit: int = HISTORY_LIMIT) -> list[dict[str, Any]] | None:
        """``/api/history/<name>``; None when there is no such stream table."""
        if not self.catalog.exists(name):
            return None
        return self._history.newest(name, max(1, min(limit, HISTORY_MAX)))


def _kafka_topics(conf: Any) -> dict[str, str]:
    from pipeline.conf import KafkaSourceSpec

    return {s.name: s.topic for s in (conf.sources if conf is not None else ()) if isinstance(s, KafkaSourceSpec)}


# ------------------------------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "trickle-ui"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        try:
            if url.path in STATIC_FILES:
                file, ctype = STATIC_FILES[url.path]
                self._send(HTTPStatus.OK, (STATIC_DIR / file).read_bytes(), ctype)
            elif url.path == "/api/pipeline":
                self._json(HTTPStatus.OK, self.server.view.snapshot())
            elif url.path.startswith("/api/history/"):
                name = unquote(url.path[len("/api/history/"):])
                limit = _int(parse_qs(url.query).get("limit", [None])[0], HISTORY_LIMIT)
                records = self.server.view.history(name, limit)
                if records is None:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"stream table {name!r} does not exist"})
                else:
                    self._json(HTTPStatus.OK, {"name": name, "records": records})
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {url.path}"})
        except Exception as e:  # noqa: BLE001 - one failed look must not stop the server; the page shows it
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

    def _refuse(self) -> None:
        self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "the pipeline page is read-only: GET only"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _json(self, status: HTTPStatus, doc: Any) -> None:
        self._send(status, json.dumps(doc, default=str, allow_nan=False).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # the page loads nothing from anywhere else (no CDN): say so, and refuse it if ever tried
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # a page polled every few seconds would flood the pipeline's log


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], view: PipelineView) -> None:
        self.view = view
        if ":" in addr[0]:  # an IPv6 address ([::1]:8421)
            self.address_family = socket.AF_INET6
        super().__init__(addr, _Handler)


@dataclass
class UiServer:
    """A page being served in a thread; :meth:`close` stops it."""

    server: _Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        shown = "localhost" if host in ("0.0.0.0", "127.0.0.1", "::") else host
        return f"http://{shown}:{port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)


def parse_address(text: str | int, default_host: str = DEFAULT_HOST) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (``0.0.0.0:8421`` to be reached from other machines); port 0: any free one."""
    text = str(text).strip()
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise TrickleError(f"web page address {text!r}: give PORT or HOST:PORT, the port a number from 0 to 65535")
    return (host.strip("[]") or default_host), number


def serve(view: PipelineView, address: str | int = DEFAULT_PORT) -> UiServer:
    """Serve the page of ``view`` at ``address`` (see :func:`parse_address`) in a daemon thread."""
    host, port = parse_address(address)
    try:
        server = _Server((host, port), view)
    except OSError as e:
        raise TrickleError(f"cannot serve the web page on {host}:{port}: {e.strerror or e} (choose another "
                           "port, or 0 for any free one)") from None
    thread = threading.Thread(target=server.serve_forever, name="trickle-ui", daemon=True)
    thread.start()
    return UiServer(server, thread)
