"""A real Apache Kafka broker as a local process, in KRaft mode, for tests and for the local demo.

Why not Docker: the project must run on machines without a container engine, but it already needs a JDK
and Maven (for the Spark jars). So the broker is Kafka's own server code, fetched once from Maven Central
by ``services/kafka/pom.xml`` into ``services/kafka/lib`` and run as ``java -cp 'lib/*' kafka.Kafka``.
A fake or embedded broker would not exercise the real wire protocol, offsets or crash recovery.

Usage::

    with KafkaBroker(tmp_path / "kafka") as broker:      # start(): format storage once, launch, wait
        broker.create_topic("orders", partitions=3)
        ...  # produce / consume against broker.bootstrap ("127.0.0.1:<port>")

Everything the broker writes lives in ``workdir``: ``server.properties``, ``log4j2.properties``,
``broker.log`` (the broker's log4j output), ``broker.out`` (the JVM's own stdout/stderr), ``data/``
(log.dirs) and ``broker.json`` (the ports, so a restart on the same workdir keeps the same address).

Only the standard library is needed to start and stop the broker; ``kafka-python`` is imported lazily
for the readiness check and ``create_topic``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.process import LOG_TAIL_LINES, ManagedProcess, free_ports, tail

__all__ = ["KafkaBroker", "KafkaServiceError", "ensure_kafka_jars", "ensure_maven_lib"]

HOST = "127.0.0.1"  # loopback only: tests must never expose a broker or depend on host names
PROJECT_ROOT = Path(__file__).resolve().parent.parent
KAFKA_DIR_REL = Path("services") / "kafka"  # holds pom.xml; lib/ (git-ignored) is fetched next to it
STAMP_NAME = ".trickle-pom.sha256"  # same stamp name as ./dev uses for jars/lib
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"  # Kafka 4.1: still the Scala tool in kafka_2.13
# Small heap and the serial collector: the broker shares a 2-core machine with Spark and the test runner.
# C1-only JIT (TieredStopAtLevel=1) roughly halves the CPU burnt at start-up; test traffic is tiny.
# The env variables of Kafka's own kafka-run-class.sh override these, as they would for bin/*.sh.
DEFAULT_HEAP_OPTS = "-Xmx512m -Xms256m"
DEFAULT_JVM_PERFORMANCE_OPTS = (
    "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Djava.awt.headless=true"
)


class KafkaServiceError(RuntimeError):
    """The local Kafka broker could not be provisioned, started or used."""


# --------------------------------------------------------------------------------------------- jars


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _lib_stamp(pom: Path, fetches: Mapping[str, Sequence[str]] | None) -> str:
    """What the stamp of a complete ``lib/`` holds: the pom's sha256, plus the fetch layout when one is given.

    The layout (which Maven arguments fill which sub-folder) lives in the caller's Python code, so it is part
    of the stamp: changing it must refetch. Without one, the stamp is the pom's plain sha256, as ``./dev``
    writes for ``jars/lib`` (a ``lib/`` fetched before this function existed stays valid).
    """
    if fetches is None:
        return _sha256(pom)
    layout = json.dumps({k: list(v) for k, v in fetches.items()}, sort_keys=True)
    return hashlib.sha256(pom.read_bytes() + b"\0" + layout.encode()).hexdigest()


def _jars_complete(lib: Path, want: str, subdirs: Sequence[str] = ("",)) -> bool:
    stamp = lib / STAMP_NAME
    try:
        return stamp.read_text().strip() == want and all(any((lib / d).glob("*.jar")) for d in subdirs)
    except OSError:
        return False


def ensure_maven_lib(
    service_dir: Path, what: str, fetches: Mapping[str, Sequence[str]] | None = None
) -> Path:
    """Return ``<service_dir>/lib``, filling it first from ``<service_dir>/pom.xml`` with Maven if needed.

    Why shared: every local JVM service (the Kafka broker, Kafka Connect) is a pom whose dependencies are
    copied once from Maven Central, and each must get the same guarantees. Mirrors ``ensure_jars`` in
    ``./dev``: the fetch runs only when ``lib/`` is missing or its stamp does not match the pom (so later
    runs are offline), Maven downloads into ``lib.tmp`` which is renamed into place only when complete (an
    interrupted fetch never looks done), and concurrent callers are serialised with a lock on the pom so
    they do not fetch over each other.

    ``fetches`` maps a folder relative to ``lib/`` ("" is ``lib/`` itself) to extra Maven arguments (say
    ``["-Pdebezium"]``): one ``mvn dependency:copy-dependencies`` per entry, so a service can keep jars that
    must not share a classpath in separate folders, each resolved on its own. ``what`` names the jars in
    messages. Errors are :class:`KafkaServiceError`.
    """
    service_dir = Path(service_dir).resolve()  # -f and the cwd below must not stack relative paths
    pom = service_dir / "pom.xml"
    lib = service_dir / "lib"
    tmp = service_dir / "lib.tmp"
    runs: dict[str, list[str]] = {k: list(v) for k, v in (fetches or {"": []}).items()}
    if not pom.is_file():
        raise KafkaServiceError(f"{pom} not found; it lists the {what} jars to fetch.")
    want = _lib_stamp(pom, fetches)
    if _jars_complete(lib, want, tuple(runs)):
        return lib
    with open(pom, "rb") as lock:  # flock on the pom itself: no extra lock file to clean up or ignore
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _jars_complete(lib, want, tuple(runs)):  # another process fetched them while we waited
                return lib
            mvn = shutil.which("mvn")
            if mvn is None:
                raise KafkaServiceError(
                    f"mvn (Apache Maven) not found on PATH; it is needed once to fetch the {what} jars "
                    f"into {lib}."
                )
            shutil.rmtree(tmp, ignore_errors=True)
            for sub, extra in runs.items():
                out_dir = (Path("lib.tmp") / sub).as_posix()
                # A relative -DoutputDirectory is resolved against the pom's folder, not the cwd.
                cmd = [
                    mvn,
                    "-B",
                    "-q",
                    "-f",
                    str(pom),
                    *extra,
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={out_dir}",
                ]
                proc = subprocess.run(
                    cmd, cwd=service_dir, capture_output=True, text=True, stdin=subprocess.DEVNULL
                )
                if proc.returncode != 0:
                    out = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
                    raise KafkaServiceError(
                        f"Maven could not fetch the {what} jars (exit {proc.returncode}); it needs network "
                        f"access once. Last lines of its output:\n{out}"
                    )
                if not any((tmp / sub).glob("*.jar")):
                    raise KafkaServiceError(f"Maven ran but put no jars into {tmp / sub}.")
            (tmp / STAMP_NAME).write_text(want + "\n")
            shutil.rmtree(lib, ignore_errors=True)
            tmp.rename(lib)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return lib


def ensure_kafka_jars(project_root: Path | None = None) -> Path:
    """Return ``services/kafka/lib``, fetching the broker's jars with Maven first if needed.

    See :func:`ensure_maven_lib`; the broker's jars all go on one classpath, so one fetch into ``lib/``.
    """
    root = Path(project_root) if project_root is not None else PROJECT_ROOT
    return ensure_maven_lib(root / KAFKA_DIR_REL, "Kafka broker")


# ------------------------------------------------------------------------------------------- broker


def _java() -> str:
    """The java executable: $JAVA_HOME/bin/java if set (like Kafka's scripts), else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaServiceError("java not found on PATH (or JAVA_HOME); the Kafka broker needs Java 17+.")
    return java


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (what `random-uuid` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def _error_lines(path: Path, n: int = 10) -> str:
    """The first n ERROR/FATAL records, each with the first line after it (the exception's message)."""
    found: list[str] = []
    take_next = False
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if "] ERROR " in line or "] FATAL " in line:
                    if len(found) >= 2 * n:
                        break
                    found.append(line)
                    take_next = True
                elif take_next:
                    if not line.startswith("["):
                        found.append("    " + line.lstrip())
                    take_next = False
    except OSError:
        return ""
    return "".join(found)


def _log4j2_properties(log_file: Path, quiet: Mapping[str, str]) -> str:
    """A JVM service's log4j2 configuration: INFO to ``log_file`` in its workdir, never to the console of
    the test run, and WARN only for the ``quiet`` loggers (id -> logger name). The shutdown hook is off
    because Kafka and Connect log during their own shutdown hooks; with log4j's hook on, those last lines
    are lost and log4j complains on stderr."""
    log = str(log_file).replace("\\", "/")
    return (
        "status = warn\n"
        "shutdownHook = disable\n"
        "appender.file.type = File\n"
        "appender.file.name = FILE\n"
        f"appender.file.fileName = {log}\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.file.ref = FILE\n"
        + "".join(f"logger.{key}.name = {name}\nlogger.{key}.level = WARN\n" for key, name in quiet.items())
    )


def _jvm_diagnostics(log_file: Path, out_file: Path) -> str:
    """What a JVM service's start-up error carries: the cause (say "Address already in use") usually
    precedes a long shutdown sequence, so the first ERROR/FATAL lines come before the plain tail."""
    errors = _error_lines(log_file)
    text = f"--- first ERROR/FATAL lines of {log_file} ---\n{errors}" if errors else ""
    text += f"--- last {LOG_TAIL_LINES} lines of {log_file} ---\n{tail(log_file)}"
    if out_file.is_file() and out_file.stat().st_size:
        text += f"--- last lines of {out_file} (JVM stdout/stderr) ---\n{tail(out_file)}"
    return text


class KafkaBroker(ManagedProcess):
    """One single-node Kafka broker (combined broker + KRaft controller) running as a child process.

    Use it as a context manager, or call ``start()`` / ``stop()``. The JVM runs in its own process group,
    so signals sent to the test runner's terminal do not hit it and ``stop()``/``kill()`` reach all of it.
    ``kill()`` is a real ``kill -9`` for crash tests; a later ``start()`` on the same workdir recovers the
    data like a restarted production broker. A broker still running when the interpreter exits is
    killed by an ``atexit`` hook so failed tests do not leak JVMs.

    Cost on a busy 2-core machine: about 2 s to format the storage (first start only), 5-8 s to start,
    under 1 s to stop. A restart after ``kill()`` takes about 4 s more, because the controller rejects
    the new incarnation until the dead one's broker session (``broker.session.timeout.ms``) expires.
    """

    def __init__(self, workdir: Path, port: int | None = None, controller_port: int | None = None) -> None:
        super().__init__(workdir)
        # Reuse the ports of an earlier run on this workdir: clients (and a demo's saved config) keep
        # working across restarts, and the KRaft voter record keeps its endpoint.
        saved = self._saved_ports()
        want = port if port is not None else saved.get("port")
        want_controller = controller_port if controller_port is not None else saved.get("controller_port")
        free: list[int] = []
        if want is None or want_controller is None:
            free = [p for p in free_ports(3) if p not in (want, want_controller)]
        self.port: int = want if want is not None else free.pop(0)
        self.controller_port: int = want_controller if want_controller is not None else free.pop(0)
        if self.port == self.controller_port:
            raise ValueError(f"port and controller_port must differ (both {self.port})")
        self.bootstrap: str = f"{HOST}:{self.port}"
        self.data_dir = self.workdir / "data"
        self.log_file = self.workdir / "broker.log"
        self.out_file = self.workdir / "broker.out"
        self._admin: Any = None

    def __repr__(self) -> str:
        return f"KafkaBroker(bootstrap={self.bootstrap!r}, pid={self.pid}, workdir={str(self.workdir)!r})"

    # -- state ----------------------------------------------------------------------------------

    def _saved_ports(self) -> dict[str, int]:
        try:
            raw = json.loads((self.workdir / "broker.json").read_text())
            return {k: int(raw[k]) for k in ("port", "controller_port") if k in raw}
        except (OSError, ValueError, TypeError):
            return {}

    # -- configuration --------------------------------------------------------------------------

    def _server_properties(self) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # Kafka 4.x dynamic quorum (KIP-853): the storage is formatted with --standalone, which makes
            # this node the only voter; bootstrap.servers tells it where the controller listens.
            "controller.quorum.bootstrap.servers": f"{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # A single node: every internal topic must make do with one replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",  # default 50: creating them costs seconds on 2 cores
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",  # consumers in tests should not wait 3 s to join
            "num.partitions": "1",
            # After a kill -9 the controller refuses the restarted broker (DUPLICATE_BROKER_REGISTRATION)
            # until the dead incarnation's session expires: 9 s by default, 4 s here. Not lower: a
            # starved 2-core machine must not fence a live broker for missing heartbeats.
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "4000",
            "auto.create.topics.enable": "false",  # a typo in a topic name should fail, not create a topic
            # Fewer threads than the defaults (3 network, 8 I/O): light on a 2-core machine.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _log4j2_properties(self) -> str:
        # Per-request and state-change chatter is not useful when reading a failed test's log.
        return _log4j2_properties(self.log_file,
                                  {"request": "kafka.request.logger", "state": "state.change.logger"})

    def _jvm_cmd(self, lib: Path, main: str, *args: str) -> list[str]:
        opts = [
            *shlex.split(os.environ.get("KAFKA_HEAP_OPTS", DEFAULT_HEAP_OPTS)),
            *shlex.split(os.environ.get("KAFKA_JVM_PERFORMANCE_OPTS", DEFAULT_JVM_PERFORMANCE_OPTS)),
            *shlex.split(os.environ.get("KAFKA_OPTS", "")),
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
        ]
        return [_java(), *opts, "-cp", str(lib / "*"), main, *args]

    def _write_config(self) -> Path:
        server_props = self.workdir / "server.properties"
        server_props.write_text(self._server_properties())
        (self.workdir / "log4j2.properties").write_text(self._log4j2_properties())
        ports = {"port": self.port, "controller_port": self.controller_port}
        (self.workdir / "broker.json").write_text(json.dumps(ports) + "\n")
        return server_props

    def _format_storage(self, lib: Path, server_props: Path, timeout_s: float) -> None:
        """Format log.dirs once (KRaft refuses to start on unformatted storage); later starts reuse it."""
        if (self.data_dir / "meta.properties").is_file():
            return
        cmd = self._jvm_cmd(
            lib,
            STORAGE_TOOL_CLASS,
            "format",
            "--standalone",
            f"--cluster-id={_new_cluster_id()}",  # "=": an id may start with "-", which argparse takes for an option
            "-c",
            str(server_props),
        )
        try:
            proc = subprocess.run(
                cmd,
                cwd=self.workdir,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=max(timeout_s, 1.0),
            )
        except subprocess.TimeoutExpired as e:
            raise KafkaServiceError(f"formatting Kafka storage in {self.data_dir} timed out") from e
        if proc.returncode != 0:
            raise KafkaServiceError(
                f"formatting Kafka storage failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
                f"--- last lines of {self.log_file.name} ---\n{tail(self.log_file)}"
            )

    # -- lifecycle ------------------------------------------------------------------------------

    def _launch(self, deadline: float) -> None:
        lib = ensure_kafka_jars()
        server_props = self._write_config()
        self._format_storage(lib, server_props, deadline - time.monotonic())
        self._spawn(self._jvm_cmd(lib, MAIN_CLASS, str(server_props)), cwd=self.workdir, output=self.out_file)

    def _wait_ready(self, deadline: float) -> None:
        """Ready means the PLAINTEXT port accepts connections AND a kafka-python admin client can list the
        topics: the port opens a little before the broker serves metadata, and tests that start
        producing at that moment would see spurious errors."""
        last_error: BaseException | None = None
        while True:
            self._check_alive(KafkaServiceError, "the Kafka broker")
            if _port_open(self.port):
                try:
                    self.admin().list_topics()
                    return
                except Exception as e:  # noqa: BLE001 - not ready yet; keep the error for the report
                    last_error = e
                    self._close_admin()
            if time.monotonic() >= deadline:
                why = f" (last client error: {last_error!r})" if last_error else ""
                raise KafkaServiceError(
                    f"the Kafka broker on {self.bootstrap} was not ready in time{why}.\n"
                    + self._diagnostics()
                )
            time.sleep(0.2)

    def _diagnostics(self) -> str:
        return _jvm_diagnostics(self.log_file, self.out_file)

    def _close_clients(self) -> None:
        self._close_admin()

    # -- clients --------------------------------------------------------------------------------

    def admin(self) -> Any:
        """A cached kafka-python ``KafkaAdminClient`` for this broker (closed by stop/kill)."""
        if self._admin is None:
            from kafka.admin import KafkaAdminClient

            wanted = {
                "bootstrap_servers": self.bootstrap,
                "client_id": "trickle-kafka-harness",
                "request_timeout_ms": 10_000,
                "bootstrap_timeout_ms": 5_000,  # kafka-python 3.x
                "api_version_auto_timeout_ms": 5_000,  # kafka-python 2.x
            }
            # Only the settings this kafka-python version knows: unknown ones raise a config error.
            config = {k: v for k, v in wanted.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
            self._admin = KafkaAdminClient(**config)
        return self._admin

    def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def create_topic(
        self, name: str, partitions: int = 1, *, exist_ok: bool = False, timeout_s: float = 30
    ) -> None:
        """Create a topic (replication factor 1) and wait until every partition has a leader.

        Waiting for leaders matters: right after CreateTopics returns, producers may briefly get
        LEADER_NOT_AVAILABLE, which turns into flaky tests. ``exist_ok`` lets a demo re-run on a kept
        workdir.
        """
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        try:
            self.admin().create_topics([NewTopic(name=name, num_partitions=partitions, replication_factor=1)])
        except TopicAlreadyExistsError:
            if not exist_ok:
                raise
        deadline = time.monotonic() + timeout_s
        while True:
            topics = self.admin().describe_topics([name])
            t = next((t for t in topics if t.get("name", t.get("topic")) == name), None)
            parts = t.get("partitions", []) if t and not t.get("error_code") else []
            # kafka-python 3.x names the field leader_id, 2.x leader.
            if parts and all(
                p.get("leader_id", p.get("leader", -1)) >= 0 and not p.get("error_code") for p in parts
            ):
                return
            if time.monotonic() >= deadline:
                raise KafkaServiceError(f"topic {name!r} has no leader for every partition yet: {t!r}")
            time.sleep(0.1)
