"""A Kafka Connect standalone worker running the Debezium PostgreSQL connector, as a local process.

Why: the pipeline's Kafka sources read topics written by Debezium; the only honest test of that path is the
real connector reading a real PostgreSQL's WAL (``services/postgres.py``) into a real broker
(``services/kafka.py``). Why not Docker: as for the broker, the project must run without a container engine;
a JDK and Maven are already required. So the worker is Kafka's own code plus Debezium's, fetched once from
Maven Central by ``services/connect/pom.xml`` into ``services/connect/lib`` (git-ignored) and run as
``java -cp 'lib/*' org.apache.kafka.connect.cli.ConnectStandalone worker.properties connector.properties``.

Why standalone mode: one connector, offsets in a local file, no internal topics to create, configure or
wait for; the REST API still answers ``/connectors/<name>/status``, which is what readiness means here.

Classpath layout (the pom has the versions and the exact jar sets): the worker's jars are on the classpath;
Debezium's are in ``lib/plugins/debezium-connector-postgres`` and reach Connect through ``plugin.path``,
the same jars as Debezium's own plugin archive. Why not all on one classpath: Debezium brings its own
PostgreSQL JDBC driver and protobuf, and plugins are meant to be isolated from the worker and from each
other (a second connector later must not fight over versions); on one classpath Maven would mediate
every shared library to one version for both sides, or two versions would sit side by side and jar order
would decide. In the plugin folder Connect loads them in their own class loader, while what worker and
connector must share -- ``org.apache.kafka.*``, ``org.slf4j.*`` (always taken from the worker) and Jackson
(Debezium hands Jackson objects to the worker's JsonConverter) -- is left out of the folder, as Debezium's
archive leaves it out. Plugins are found with ``plugin.discovery=service_load`` (the jars' ServiceLoader
manifests) instead of a reflective scan of every class: the same plugins, less start-up time.

Usage::

    with PostgresServer(tmp / "pg") as pg, KafkaBroker(tmp / "kafka") as broker:
        pg.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
        config = debezium_postgres_connector(pg, "shop", ["public.orders"])
        with KafkaConnect(tmp / "connect", broker.bootstrap, config) as connect:   # waits for RUNNING
            ...  # consume debezium_topic("shop", "public.orders") == "shop.public.orders"

Everything the worker writes lives in ``workdir``: ``worker.properties``, ``connector.properties``,
``log4j2.properties``, ``connect.log`` (Connect's and Debezium's log), ``connect.out`` (the JVM's own
stdout/stderr), ``offsets.dat`` (source offsets: where Debezium resumes after a restart) and
``connect.json`` (the REST port, kept across restarts). Events are written with the JsonConverter,
``schemas.enable=true`` for keys and values: exactly what ``connectors/debezium.py`` decodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.kafka import (
    HOST,
    PROJECT_ROOT,
    KafkaServiceError,
    _java,
    _jvm_diagnostics,
    _log4j2_properties,
    _port_open,
    ensure_maven_lib,
)
from services.process import ManagedProcess, free_ports

if TYPE_CHECKING:
    from services.postgres import PostgresServer

__all__ = [
    "ConnectServiceError",
    "KafkaConnect",
    "debezium_postgres_connector",
    "debezium_topic",
    "ensure_connect_jars",
]

CONNECT_DIR_REL = Path("services") / "connect"  # holds pom.xml; lib/ (git-ignored) is fetched next to it
PLUGINS_REL = "plugins"  # under lib/: Connect's plugin.path
DEBEZIUM_POSTGRES_PLUGIN_REL = f"{PLUGINS_REL}/debezium-connector-postgres"
# Which pom profile fills which folder of lib/ (see services/connect/pom.xml for why two resolutions).
FETCHES: dict[str, list[str]] = {"": ["-Pruntime"], DEBEZIUM_POSTGRES_PLUGIN_REL: ["-Pdebezium"]}
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
DEBEZIUM_POSTGRES_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
# Like the broker: a small heap, the serial collector and C1 only, for a 2-core machine shared with Spark
# and the broker. 384 MiB is plenty for one connector and test traffic. TRICKLE_CONNECT_HEAP_OPTS /
# TRICKLE_CONNECT_JVM_OPTS override them (not KAFKA_HEAP_OPTS: that one sizes the broker).
DEFAULT_HEAP_OPTS = "-Xmx384m -Xms64m"
DEFAULT_JVM_PERFORMANCE_OPTS = (
    "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Djava.awt.headless=true"
)


class ConnectServiceError(KafkaServiceError):
    """The local Kafka Connect worker could not be provisioned or started, or its connector failed."""


def ensure_connect_jars(project_root: Path | None = None) -> Path:
    """Return ``services/connect/lib``, fetching the worker's and Debezium's jars with Maven first if needed.

    Once per change of the pom (or of :data:`FETCHES`), with network access; offline afterwards. See
    ``services.kafka.ensure_maven_lib`` for the stamp, lock and ``lib.tmp`` swap.
    """
    root = Path(project_root) if project_root is not None else PROJECT_ROOT
    return ensure_maven_lib(root / CONNECT_DIR_REL, "Kafka Connect / Debezium", FETCHES)


def debezium_topic(topic_prefix: str, table: str) -> str:
    """The topic Debezium writes ``table`` (``schema.table``, or a bare name in ``public``) to."""
    return f"{topic_prefix}.{_qualified(table)}"


def _qualified(table: str) -> str:
    return table if "." in table else f"public.{table}"


def _identifier(text: str, suffix: str) -> str:
    """A replication slot / publication name from free text: Debezium accepts only [a-z0-9_], <= 63 chars."""
    base = re.sub(r"[^a-z0-9_]", "_", text.lower())
    return f"{base[: 63 - len(suffix)]}{suffix}"


def debezium_postgres_connector(
    pg: PostgresServer,
    topic_prefix: str,
    tables: Sequence[str],
    *,
    name: str | None = None,
    database: str | None = None,
    slot_name: str | None = None,
    publication_name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """A Debezium PostgreSQL connector config for ``tables`` (``schema.table``; a bare name means ``public``)
    of ``pg``, writing to ``<topic_prefix>.<schema>.<table>``.

    Why each non-default choice:

    * ``plugin.name=pgoutput``: PostgreSQL's built-in logical decoding plugin, nothing to install.
    * ``publication.autocreate.mode=filtered``: the connector creates a publication of exactly these tables
      (they must exist before the connector starts), so other tables' changes are not even decoded.
    * ``skipped.operations=none``: Debezium skips truncates by default (``t``); the mirror must see them.
    * ``snapshot.mode=initial``: existing rows first (op ``r``), then streaming; after a restart the
      offsets say where to resume and no snapshot is taken again.
    * ``tombstones.on.delete=true``: a delete is followed by a null-valued record for log compaction (the
      decoder returns None for it). A primary-key update arrives as a delete of the old key, its tombstone
      and a create of the new key.
    * ``topic.creation.default.*``: the worker creates the topics (the test broker does not auto-create),
      with ONE partition each: a truncate must stay ordered with every row event of its table.
    * ``poll.interval.ms=100``: the task waits 0.1 s, not 0.5 s, for more changes; tests see events sooner.
    * ``database.sslmode=disable``: the test server has no TLS; skips a failed TLS handshake per connection.

    ``decimal.handling.mode`` stays ``precise`` (Connect Decimal, exact) and ``time.precision.mode``
    ``adaptive`` (``timestamp`` as MicroTimestamp), the defaults the decoder expects with schemas on.
    ``overrides`` are applied last (any key, any value; values are turned into strings).
    """
    if not tables:
        raise ValueError("debezium_postgres_connector needs at least one table")
    qualified = [_qualified(t) for t in tables]
    config: dict[str, Any] = {
        "name": name or f"{topic_prefix}-postgres",
        "connector.class": DEBEZIUM_POSTGRES_CLASS,
        "tasks.max": 1,  # the PostgreSQL connector runs one task whatever this says
        "database.hostname": pg.host,
        "database.port": pg.port,
        "database.user": pg.user,
        "database.dbname": database or pg.database,
        "database.sslmode": "disable",
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot_name or _identifier(topic_prefix, "_slot"),
        "publication.name": publication_name or _identifier(topic_prefix, "_pub"),
        "publication.autocreate.mode": "filtered",
        # Include lists are Java regular expressions matched against the whole "schema.table".
        "table.include.list": ",".join(re.escape(t) for t in qualified),
        "skipped.operations": "none",
        "snapshot.mode": "initial",
        "tombstones.on.delete": "true",
        "topic.creation.default.replication.factor": 1,
        "topic.creation.default.partitions": 1,
        "poll.interval.ms": 100,
    }
    config.update(overrides or {})
    return {k: _prop_value(v) for k, v in config.items()}


def _prop_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _escape_property(text: str, key: bool) -> str:
    """java.util.Properties escaping: backslashes always, separators in keys, leading blanks, controls."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if key:
        out = re.sub(r"([=: #!])", r"\\\1", out)
    elif out.startswith((" ", "#", "!")):
        out = "\\" + out
    return out


def _properties(props: Mapping[str, str]) -> str:
    return "".join(f"{_escape_property(k, True)}={_escape_property(v, False)}\n" for k, v in props.items())


class KafkaConnect(ManagedProcess):
    """One Kafka Connect standalone worker running one connector, as a child process.

    ``start()`` returns once the REST API reports the connector and all its tasks ``RUNNING`` (for
    Debezium: connected, slot and publication in place; the snapshot then runs in the background).
    ``stop()`` is SIGTERM: Connect stops the task and flushes its offsets to ``offsets.dat``, so a later
    ``start()`` on the same workdir resumes where it stopped. ``kill()`` is ``kill -9``: offsets flushed
    up to ``offset.flush.interval.ms`` earlier survive, so events after them are delivered again after a
    restart (Debezium is at-least-once; the decoder's positions let consumers drop the repeats).

    Cost on a busy 2-core machine: about 10-15 s to start (JVM, plugin loading, Debezium's connection
    checks), 1-3 s to stop. A worker still running when the interpreter exits is killed by ``atexit``.
    """

    start_timeout_s = 120.0
    stop_timeout_s = 60.0  # SIGTERM: Connect stops the task and flushes its offsets

    def __init__(
        self,
        workdir: Path,
        bootstrap: str,
        connector: Mapping[str, Any],
        *,
        rest_port: int | None = None,
        offset_flush_interval_ms: int = 1000,
    ) -> None:
        if not connector.get("name") or not connector.get("connector.class"):
            raise ValueError("the connector config needs 'name' and 'connector.class'")
        super().__init__(workdir)
        self.bootstrap = bootstrap
        self.connector: dict[str, str] = {k: _prop_value(v) for k, v in connector.items()}
        self.name: str = self.connector["name"]
        saved = self._saved_port()
        self.rest_port: int = rest_port or saved or free_ports(1)[0]
        self.rest_url = f"http://{HOST}:{self.rest_port}"
        self.offset_flush_interval_ms = offset_flush_interval_ms
        self.log_file = self.workdir / "connect.log"
        self.out_file = self.workdir / "connect.out"
        self.offsets_file = self.workdir / "offsets.dat"
        self._log_offset = 0  # size of connect.log when the current run started: where its lines begin

    def __repr__(self) -> str:
        return f"KafkaConnect(connector={self.name!r}, rest={self.rest_url!r}, pid={self.pid})"

    # -- state ----------------------------------------------------------------------------------

    def _saved_port(self) -> int | None:
        try:
            return int(json.loads((self.workdir / "connect.json").read_text())["rest_port"])
        except (OSError, ValueError, TypeError, KeyError):
            return None

    # -- configuration --------------------------------------------------------------------------

    def _worker_properties(self, lib: Path) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap,
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(self.offsets_file),
            # Offsets reach offsets.dat at most this long after their events reach Kafka; a kill -9
            # re-delivers what came after the last flush.
            "offset.flush.interval.ms": str(self.offset_flush_interval_ms),
            "listeners": f"http://{HOST}:{self.rest_port}",
            "rest.advertised.host.name": HOST,
            "rest.advertised.port": str(self.rest_port),
            "plugin.path": str(lib / PLUGINS_REL),
            "plugin.discovery": "service_load",
        }

    def _log4j2_properties(self) -> str:
        # Every client and config object logs all its settings at INFO: pages per start, no insight.
        return _log4j2_properties(self.log_file, {"config": "org.apache.kafka.common.config.AbstractConfig",
                                                  "appinfo": "org.apache.kafka.common.utils.AppInfoParser"})

    def _jvm_cmd(self, lib: Path, *args: str) -> list[str]:
        opts = [
            *shlex.split(os.environ.get("TRICKLE_CONNECT_HEAP_OPTS", DEFAULT_HEAP_OPTS)),
            *shlex.split(os.environ.get("TRICKLE_CONNECT_JVM_OPTS", DEFAULT_JVM_PERFORMANCE_OPTS)),
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
        ]
        return [_java(), *opts, "-cp", str(lib / "*"), MAIN_CLASS, *args]

    def _write_config(self, lib: Path) -> tuple[Path, Path]:
        worker = self.workdir / "worker.properties"
        worker.write_text(_properties(self._worker_properties(lib)))
        connector = self.workdir / "connector.properties"
        connector.write_text(_properties(self.connector))
        (self.workdir / "log4j2.properties").write_text(self._log4j2_properties())
        (self.workdir / "connect.json").write_text(json.dumps({"rest_port": self.rest_port}) + "\n")
        return worker, connector

    # -- lifecycle ------------------------------------------------------------------------------

    def _launch(self, deadline: float) -> None:
        lib = ensure_connect_jars()
        worker, connector = self._write_config(lib)
        self._log_offset = self.log_file.stat().st_size if self.log_file.is_file() else 0
        self._spawn(self._jvm_cmd(lib, str(worker), str(connector)), cwd=self.workdir, output=self.out_file)

    def status(self) -> dict[str, Any]:
        """``GET /connectors/<name>/status``: ``{"connector": {"state": ...}, "tasks": [{"state": ...,
        "trace"?: ...}], ...}``. Raises ``urllib.error.URLError`` when the REST API does not answer and
        ``urllib.error.HTTPError`` (404) before the connector exists."""
        url = f"{self.rest_url}/connectors/{urllib.parse.quote(self.name, safe='')}/status"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body: dict[str, Any] = json.loads(resp.read())
        return body

    def _wait_ready(self, deadline: float) -> None:
        """Ready means the connector and its tasks are RUNNING. A connector or task that FAILS, or a worker
        that exits, raises at once with Connect's stack trace and the end of the log."""
        last: str = "the REST API never answered"
        while True:
            self._check_alive(ConnectServiceError, "the Kafka Connect worker")
            if _port_open(self.rest_port):
                try:
                    st = self.status()
                except (urllib.error.URLError, OSError, ValueError) as e:
                    last = f"status request failed: {e!r}"
                else:
                    last = f"status: {json.dumps(st)}"
                    states = [st.get("connector", {}).get("state")] + [t.get("state") for t in st.get("tasks", [])]
                    if "FAILED" in states:
                        traces = [x.get("trace") for x in [st.get("connector", {}), *st.get("tasks", [])]]
                        trace = "\n".join(t for t in traces if t)
                        raise ConnectServiceError(
                            f"connector {self.name!r} FAILED during start-up:\n{trace}\n" + self._diagnostics()
                        )
                    if len(states) > 1 and all(s == "RUNNING" for s in states):
                        return
            if time.monotonic() >= deadline:
                raise ConnectServiceError(
                    f"connector {self.name!r} on {self.rest_url} was not RUNNING in time ({last}).\n"
                    + self._diagnostics()
                )
            time.sleep(0.25)

    def wait_for_snapshot(self, timeout_s: float = 60) -> str:
        """Block until Debezium's initial snapshot of this run has ended; return its status line.

        Why: ``start()`` returns when the task runs, but the snapshot (op ``r`` events) is then read in the
        background, and a ``TRUNCATE`` that commits before the snapshot's SELECT makes the snapshot see an
        empty table (TRUNCATE is not MVCC-safe), so tests must not truncate captured tables before this.
        Changes other than TRUNCATE made meanwhile are safe: streaming starts at the snapshot's LSN.
        Debezium reports the end only in its log ("Snapshot ended with SnapshotResult [status=COMPLETED"
        or "status=SKIPPED" when offsets say it was done before), so the log of this run is watched.
        Raises :class:`ConnectServiceError` on timeout, on an aborted snapshot or if the worker exits.
        """
        deadline = time.monotonic() + timeout_s
        marker = "Snapshot ended with SnapshotResult [status="
        while True:
            text = ""
            with contextlib.suppress(OSError), open(self.log_file, errors="replace") as f:
                f.seek(self._log_offset)
                text = f.read()
            at = text.find(marker)
            if at >= 0:
                line = text[at : text.find("\n", at) if "\n" in text[at:] else len(text)]
                if not line[len(marker) :].startswith(("COMPLETED", "SKIPPED")):
                    raise ConnectServiceError(
                        f"Debezium's snapshot did not complete: {line[:300]}\n" + self._diagnostics()
                    )
                return line[:200]
            if not self.is_running():
                raise ConnectServiceError("the Kafka Connect worker is not running.\n" + self._diagnostics())
            if time.monotonic() >= deadline:
                raise ConnectServiceError(
                    f"Debezium's snapshot did not end within {timeout_s} s.\n" + self._diagnostics()
                )
            time.sleep(0.2)

    def _diagnostics(self) -> str:
        return _jvm_diagnostics(self.log_file, self.out_file)
