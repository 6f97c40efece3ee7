"""Structure checks of docker-compose.yml and the files it uses (pure Python: no Docker, no Spark).

The machines that run the test suite have no Docker engine, so the compose file is never started here.
What can be checked without running it is checked: that the services exist and wait for each other the
right way, and above all that the pieces that must agree across files do agree, because that is where a
compose setup breaks silently:

* PostgreSQL's init SQL creates every table the Debezium connector captures, with a primary key and the
  columns (and compatible types) that the pipeline conf declares for the mirror;
* the connector's topics (``topic.prefix`` + table) are exactly the topics the conf's Kafka sources read,
  from the broker address the Kafka service advertises;
* the pipeline container runs a conf file that exists in the repository, loads with
  :func:`pipeline.conf.load_conf`, and keeps its warehouse and checkpoints on a named volume.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from pipeline.conf import KafkaSourceSpec, TrickleConf, load_conf

PROJECT_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"

KAFKA, POSTGRES, CONNECT, REGISTRAR, PIPELINE = "kafka", "postgres", "connect", "register-connector", "pipeline"
INIT_DIR = "/docker-entrypoint-initdb.d"


# ------------------------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class Mount:
    """One entry of a service's ``volumes``: a bind mount (``source`` a path) or a named volume."""

    source: str
    target: str
    read_only: bool
    bind: bool


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), "no 'services' mapping"
    return data


def service(name: str) -> dict[str, Any]:
    services = compose()["services"]
    assert name in services, f"service {name!r} missing from {COMPOSE_FILE.name} (has: {sorted(services)})"
    return services[name]


def default_value(value: Any) -> str:
    """A value as compose would see it with an empty environment: ``${VAR:-default}`` -> ``default``."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", str(value))


def raw_env(name: str) -> dict[str, str]:
    """A service's ``environment`` as written (mapping or ``KEY=VALUE`` list form)."""
    raw = service(name).get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def env(name: str) -> dict[str, str]:
    """A service's ``environment`` with ``${VAR:-default}`` replaced by the default."""
    return {k: default_value(v) for k, v in raw_env(name).items()}


def mounts(name: str) -> list[Mount]:
    out: list[Mount] = []
    for item in service(name).get("volumes") or []:
        if isinstance(item, dict):  # long syntax
            source, target = str(item.get("source", "")), str(item["target"])
            read_only = bool(item.get("read_only", False))
            bind = item.get("type") == "bind"
        else:  # short syntax: SOURCE:TARGET[:MODE]
            parts = str(item).split(":")
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
            bind = source.startswith((".", "/", "~"))
        out.append(Mount(source, target, read_only, bind))
    return out


def host_path(source: str) -> Path:
    """The repository file or folder a relative bind-mount source names."""
    return (COMPOSE_FILE.parent / source).resolve()


def container_to_host(name: str, container_path: str) -> Path:
    """Map a path inside service ``name`` back to the repository file it comes from (through a bind mount)."""
    p = PurePosixPath(container_path)
    for m in mounts(name):
        if m.bind and (p == PurePosixPath(m.target) or p.is_relative_to(m.target)):
            return host_path(m.source) / p.relative_to(m.target)
    raise AssertionError(f"{name}: {container_path} is not inside any bind mount of the service")


def depends_on(name: str) -> dict[str, str]:
    """Dependency -> condition (the list form means ``service_started``)."""
    raw = service(name).get("depends_on") or {}
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {k: (v or {}).get("condition", "service_started") for k, v in raw.items()}


def command_args(name: str) -> list[str]:
    cmd = service(name).get("command")
    if cmd is None:
        return []
    return [str(c) for c in cmd] if isinstance(cmd, list) else shlex.split(str(cmd))


def seconds(duration: Any) -> float:
    """A compose duration (``90s``, ``2m``, ``1m30s``, a bare number of seconds) in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)} (an empty host means every interface)."""
    out: dict[str, tuple[str, int]] = {}
    for item in value.split(","):
        m = re.fullmatch(r"\s*([A-Za-z0-9_]+)://([^:,]*):(\d+)\s*", item)
        assert m, f"cannot read listener {item!r}"
        out[m.group(1)] = (m.group(2), int(m.group(3)))
    return out


def kafka_addresses() -> set[str]:
    """``host:port`` the broker advertises to clients; each host must be a compose service name."""
    return {f"{h}:{p}" for h, p in listeners(env(KAFKA)["KAFKA_ADVERTISED_LISTENERS"]).values()}


def registrar_script() -> str:
    args = command_args(REGISTRAR)
    entry = service(REGISTRAR).get("entrypoint")
    entry_args = [str(e) for e in entry] if isinstance(entry, list) else shlex.split(str(entry or ""))
    return " ".join(entry_args + args)


def connector_file() -> Path:
    """The connector JSON the registrar sends: ``--data[-binary] @PATH``, mapped back to the repository."""
    m = re.search(r"--data(?:-binary|-raw)?\s+@(\S+)", registrar_script())
    assert m, f"{REGISTRAR}: its command sends no file with curl --data-binary @FILE"
    return container_to_host(REGISTRAR, m.group(1))


@cache
def connector() -> dict[str, str]:
    path = connector_file()
    assert path.is_file(), f"connector config {path} does not exist"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path}: must be a JSON object of connector settings"
    if "config" in data and isinstance(data["config"], dict):  # the {"name", "config"} form of POST
        data = {"name": data.get("name"), **data["config"]}
    return {str(k): str(v) for k, v in data.items()}


def included_tables() -> list[str]:
    """``table.include.list`` as ``schema.table`` names (plain names only: no regular expressions)."""
    tables = [t.strip() for t in connector()["table.include.list"].split(",") if t.strip()]
    for t in tables:
        assert re.fullmatch(r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*", t), (
            f"table.include.list entry {t!r}: use plain schema.table names so the topics are known"
        )
    return tables


def pipeline_conf_path() -> Path:
    args = command_args(PIPELINE)
    assert "run" in args and args.index("run") + 1 < len(args), (
        f"{PIPELINE}: command {args} does not run a conf file (expected: run /conf/FILE.yaml)"
    )
    return container_to_host(PIPELINE, args[args.index("run") + 1])


@cache
def pipeline_conf() -> TrickleConf:
    return load_conf(pipeline_conf_path())


def kafka_sources() -> list[KafkaSourceSpec]:
    return [s for s in pipeline_conf().sources if isinstance(s, KafkaSourceSpec)]


# -------------------------------------------------------------------------------------- PostgreSQL schema


@dataclass(frozen=True)
class SqlTable:
    name: str  # schema.table
    columns: dict[str, str]  # column -> PostgreSQL type (lower case, as written)
    primary_key: tuple[str, ...]


_CONSTRAINT_WORDS = ("not", "null", "default", "primary", "references", "generated", "unique", "check",
                     "constraint", "collate")


def _split_top_level(body: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_create_tables(sql: str) -> dict[str, SqlTable]:
    """The CREATE TABLE statements of an init script (enough SQL for a demo schema, not a parser)."""
    sql = re.sub(r"--[^\n]*", "", sql)
    tables: dict[str, SqlTable] = {}
    for m in re.finditer(r"create\s+table\s+(?:if\s+not\s+exists\s+)?([\w.\"]+)\s*\(", sql, re.IGNORECASE):
        name = m.group(1).replace('"', "").lower()
        if "." not in name:
            name = f"public.{name}"
        depth, i = 1, m.end()
        while depth:
            assert i < len(sql), f"unbalanced parentheses in CREATE TABLE {name}"
            depth += {"(": 1, ")": -1}.get(sql[i], 0)
            i += 1
        columns: dict[str, str] = {}
        pk: tuple[str, ...] = ()
        for item in _split_top_level(sql[m.end() : i - 1]):
            words = item.split()
            head = words[0].lower()
            table_pk = re.match(r"(?:constraint\s+\S+\s+)?primary\s+key\s*\(([^)]*)\)", item, re.IGNORECASE)
            if table_pk:
                pk = tuple(c.strip().strip('"').lower() for c in table_pk.group(1).split(","))
                continue
            if head in ("constraint", "unique", "check", "foreign", "exclude"):
                continue
            col = head.strip('"')
            type_words = []
            for w in words[1:]:
                if w.lower() in _CONSTRAINT_WORDS:
                    break
                type_words.append(w.lower())
            columns[col] = " ".join(type_words)
            if re.search(r"\bprimary\s+key\b", item, re.IGNORECASE):
                pk = (col,)
        tables[name] = SqlTable(name, columns, pk)
    return tables


#: PostgreSQL type (as written in the init SQL) -> the Spark types of a conf column that hold it, as
#: Debezium (decimal.handling.mode=precise, time.precision.mode=adaptive) sends it.
_PG_TO_SPARK: tuple[tuple[str, frozenset[str]], ...] = (
    (r"smallint|int2|smallserial", frozenset({"SMALLINT", "INT", "BIGINT"})),
    (r"integer|int|int4|serial", frozenset({"INT", "BIGINT"})),
    (r"bigint|int8|bigserial", frozenset({"BIGINT"})),
    (r"real|float4", frozenset({"FLOAT", "DOUBLE"})),
    (r"double precision|float8", frozenset({"DOUBLE"})),
    (r"boolean|bool", frozenset({"BOOLEAN"})),
    (r"text|uuid|(?:character varying|varchar|character|char)(?:\(\d+\))?", frozenset({"STRING"})),
    (r"date", frozenset({"DATE"})),
    (r"timestamptz|timestamp(?:\(\d\))? with time zone", frozenset({"TIMESTAMP"})),
    (r"timestamp(?:\(\d\))?(?: without time zone)?", frozenset({"TIMESTAMP", "TIMESTAMP_NTZ"})),
    (r"bytea", frozenset({"BINARY"})),
)


def spark_types_for(pg_type: str) -> frozenset[str]:
    t = re.sub(r"\s+", " ", pg_type.strip().lower())
    t = re.sub(r"\s*\(\s*", "(", re.sub(r"\s*,\s*", ",", re.sub(r"\s*\)", ")", t)))
    m = re.fullmatch(r"(?:numeric|decimal)\((\d+),(\d+)\)", t)
    if m:
        return frozenset({f"DECIMAL({m.group(1)},{m.group(2)})"})
    for pattern, spark in _PG_TO_SPARK:
        if re.fullmatch(pattern, t):
            return spark
    raise AssertionError(f"PostgreSQL type {pg_type!r} has no mapping in tests/test_compose.py; add one")


def init_sql_files() -> list[Path]:
    files = []
    for m in mounts(POSTGRES):
        if m.bind and PurePosixPath(m.target).is_relative_to(INIT_DIR):
            p = host_path(m.source)
            files += sorted(p.glob("*.sql")) if p.is_dir() else [p]
    return files


def init_tables() -> dict[str, SqlTable]:
    tables: dict[str, SqlTable] = {}
    for f in init_sql_files():
        tables.update(parse_create_tables(f.read_text(encoding="utf-8")))
    return tables


# ----------------------------------------------------------------------------------------------- services


def test_services_exist() -> None:
    services = compose()["services"]
    missing = {KAFKA, POSTGRES, CONNECT, REGISTRAR, PIPELINE} - set(services)
    assert not missing, f"{COMPOSE_FILE.name} lacks services {sorted(missing)}"


def test_images_are_pinned() -> None:
    for name, svc in compose()["services"].items():
        image = svc.get("image")
        if "build" in svc:
            continue
        assert image, f"{name}: needs an image or a build"
        repo, _, tag = str(image).rpartition(":")
        assert repo and "/" not in tag and tag not in ("", "latest"), f"{name}: pin an image tag, got {image!r}"
    assert service(KAFKA)["image"] == "apache/kafka:4.1.1"
    assert str(service(POSTGRES)["image"]).startswith("postgres:")
    assert re.fullmatch(r"quay\.io/debezium/connect:3\.\d+(\.\d+\.Final)?", str(service(CONNECT)["image"]))


def test_kafka_is_single_node_kraft_reachable_by_service_name() -> None:
    e = env(KAFKA)
    assert not any("ZOOKEEPER" in k for k in e), "KRaft mode: no ZooKeeper settings"
    assert set(e["KAFKA_PROCESS_ROLES"].replace(" ", "").split(",")) == {"broker", "controller"}
    bound = listeners(e["KAFKA_LISTENERS"])
    advertised = listeners(e["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(p.split(":") for p in e["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    controller = e["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert controller in bound and controller not in advertised, "the controller listener is bound, not advertised"
    assert set(bound) <= set(protocols), f"listeners without a security protocol: {set(bound) - set(protocols)}"
    for name, (host, port) in advertised.items():
        assert name in bound and bound[name][1] == port, f"advertised listener {name} is not bound on {port}"
        assert host in compose()["services"], (
            f"advertised listener {name}://{host}:{port}: other containers need a compose service name, not {host!r}"
        )
    node, _, voter = e["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert node == str(e["KAFKA_NODE_ID"]), "the single voter must be this node"
    assert voter.rpartition(":")[2] == str(bound[controller][1]), "the voter must be the controller listener"
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
        assert e.get(key) == "1", f"{key} must be 1 on a single broker (Kafka's default of 3 cannot be met)"
    assert "healthcheck" in service(KAFKA), "kafka needs a healthcheck (others wait for service_healthy)"


def test_postgres_has_logical_decoding_and_a_healthcheck() -> None:
    cmd = " ".join(command_args(POSTGRES))
    assert re.search(r"\bwal_level=logical\b", cmd), f"postgres must run with -c wal_level=logical, got {cmd!r}"
    assert command_args(POSTGRES)[0] == "postgres", "the command replaces the image's: start with 'postgres'"
    test = service(POSTGRES).get("healthcheck", {}).get("test")
    assert test and "pg_isready" in " ".join(test if isinstance(test, list) else [test])
    assert init_sql_files(), f"postgres: mount an init SQL file into {INIT_DIR}"


def test_connect_waits_for_healthy_kafka_and_postgres() -> None:
    deps = depends_on(CONNECT)
    for dep in (KAFKA, POSTGRES):
        assert deps.get(dep) == "service_healthy", f"connect must wait for {dep} with condition service_healthy"
        assert "healthcheck" in service(dep), f"{dep} has no healthcheck, so service_healthy never holds"
    e = env(CONNECT)
    assert e.get("BOOTSTRAP_SERVERS") in kafka_addresses(), (
        f"connect BOOTSTRAP_SERVERS {e.get('BOOTSTRAP_SERVERS')!r} is not an advertised Kafka address "
        f"{sorted(kafka_addresses())}"
    )
    topics = [e.get(k) for k in ("CONFIG_STORAGE_TOPIC", "OFFSET_STORAGE_TOPIC", "STATUS_STORAGE_TOPIC")]
    assert e.get("GROUP_ID") and all(topics) and len(set(topics)) == 3, "GROUP_ID and 3 distinct storage topics"


def test_registrar_puts_the_connector_once_connect_is_up() -> None:
    deps = depends_on(REGISTRAR)
    assert deps.get(CONNECT) in ("service_healthy", "service_started"), "the registrar must depend on connect"
    if deps[CONNECT] == "service_healthy":
        assert "healthcheck" in service(CONNECT)
    script = registrar_script()
    m = re.search(r"https?://([\w-]+):(\d+)/connectors/([\w.-]+)/config", script)
    assert m, "the registrar must PUT the config to http://connect:8083/connectors/NAME/config (idempotent)"
    assert re.search(r"-X\s*PUT\b", script), "PUT /connectors/NAME/config creates or updates; POST fails on rerun"
    assert m.group(1) == CONNECT and m.group(2) == "8083"
    assert m.group(3) == connector().get("name", m.group(3)), "connector name in the URL and the JSON differ"
    assert str(service(REGISTRAR).get("restart", "no")) == "no", "a one-shot service must not restart"


# -------------------------------------------------------------------------------------------- connector


def test_connector_config() -> None:
    c = connector()
    assert c["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert c["plugin.name"] == "pgoutput"
    assert c["skipped.operations"] == "none", "TRUNCATE events are skipped unless skipped.operations=none"
    for side in ("key", "value"):
        assert c.get(f"{side}.converter") == "org.apache.kafka.connect.json.JsonConverter"
        assert c.get(f"{side}.converter.schemas.enable") == "true", "the decoder reads Connect schemas"
    assert c["database.hostname"] == POSTGRES and c.get("database.port", "5432") == "5432"
    pg = env(POSTGRES)
    assert c["database.dbname"] == pg["POSTGRES_DB"], "the connector reads another database than postgres creates"
    assert c["database.user"] == pg.get("POSTGRES_USER", "postgres")


def test_connector_password_is_not_in_the_file() -> None:
    password = connector()["database.password"]
    m = re.fullmatch(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}", password)
    assert m, "database.password must be a ${env:VAR} reference, not a literal password"
    e = env(CONNECT)
    assert e.get("CONNECT_CONFIG_PROVIDERS") == "env"
    assert e.get("CONNECT_CONFIG_PROVIDERS_ENV_CLASS") == (
        "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
    )
    assert m.group(1) in e, f"connect has no {m.group(1)} in its environment"
    assert e[m.group(1)] == env(POSTGRES)["POSTGRES_PASSWORD"], "connect and postgres get different passwords"


def test_passwords_come_from_the_environment() -> None:
    for name in compose()["services"]:
        for key, value in raw_env(name).items():
            if "PASSWORD" in key:
                assert re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*:-[^}]+\}", value), (
                    f"{name}: {key} must come from the environment with a dev default (${{VAR:-default}})"
                )


def test_connector_topics_are_the_pipeline_sources() -> None:
    prefix = connector()["topic.prefix"]
    topics = {f"{prefix}.{t}" for t in included_tables()}
    read = {s.topic for s in kafka_sources()}
    assert topics == read, (
        f"connector topics {sorted(topics)} != topics of {pipeline_conf_path().name} {sorted(read)}"
    )
    for s in kafka_sources():
        for server in s.bootstrap_servers.split(","):
            assert server.strip() in kafka_addresses(), (
                f"source {s.name!r}: bootstrap server {server!r} is not an advertised Kafka address "
                f"{sorted(kafka_addresses())}"
            )


def test_init_sql_creates_every_captured_table_like_the_conf() -> None:
    tables = init_tables()
    by_topic = {s.topic: s for s in kafka_sources()}
    prefix = connector()["topic.prefix"]
    for qualified in included_tables():
        assert qualified in tables, f"the init SQL does not create {qualified} (has: {sorted(tables)})"
        table = tables[qualified]
        assert table.primary_key, f"{qualified} needs a primary key (the Kafka key and the mirror's key)"
        source = by_topic.get(f"{prefix}.{qualified}")
        if source is None:  # reported by test_connector_topics_are_the_pipeline_sources
            continue
        conf_cols = {n.lower(): t for n, t in source.columns}
        assert set(conf_cols) == set(table.columns), (
            f"source {source.name!r} columns {sorted(conf_cols)} != {qualified} columns {sorted(table.columns)}"
        )
        for col, pg_type in table.columns.items():
            allowed = spark_types_for(pg_type)
            assert conf_cols[col] in allowed, (
                f"source {source.name!r}: column {col} is {conf_cols[col]} but {qualified}.{col} is "
                f"{pg_type} (use one of {sorted(allowed)})"
            )
        assert tuple(k.lower() for k in source.key) == table.primary_key, (
            f"source {source.name!r}: key {source.key} is not the primary key {table.primary_key} of {qualified}"
        )


# --------------------------------------------------------------------------------------------- pipeline


def test_pipeline_runs_a_conf_from_the_repo_that_loads() -> None:
    conf_mounts = [m for m in mounts(PIPELINE) if m.bind and host_path(m.source) == PROJECT_ROOT / "conf"]
    assert conf_mounts, "the pipeline must mount the repository's conf folder"
    assert all(m.read_only for m in conf_mounts), "mount the conf folder read-only (:ro)"
    path = pipeline_conf_path()
    assert path.is_file(), f"the pipeline runs {path}, which is not in the repository"
    assert path.is_relative_to(PROJECT_ROOT / "conf")
    conf = pipeline_conf()  # raises ConfigError with the key and the problem if the file is invalid
    modes = [t.refresh_mode for t in conf.stream_tables]
    assert "IMMEDIATE" in modes, "the demo should show an IMMEDIATE stream table"
    assert any(t.refresh_mode != "IMMEDIATE" and t.schedule for t in conf.stream_tables), (
        "the demo should show a scheduled stream table"
    )
    assert kafka_sources(), "the compose pipeline should read Kafka"


def test_stream_table_queries_compile_incrementally() -> None:
    """What ``create_stream_table`` checks first, without Spark: every query resolves against the mirrors'
    columns, and IMMEDIATE / DIFFERENTIAL ones are differentiable (AUTO and FULL may fall back to FULL)."""
    import dvm

    conf = pipeline_conf()
    schemas = {s.name: [(n, t.lower()) for n, t in s.columns] for s in kafka_sources()}
    for table in conf.stream_tables:
        try:
            dvm.compile_query(table.query, schemas)  # QueryError: unknown table or column, bad SQL
        except dvm.UnsupportedError:
            if table.refresh_mode in ("IMMEDIATE", "DIFFERENTIAL"):
                raise


def test_pipeline_state_lives_on_a_named_volume() -> None:
    conf = pipeline_conf()
    declared = set(compose().get("volumes") or {})
    named = [PurePosixPath(m.target) for m in mounts(PIPELINE) if not m.bind and m.source in declared]
    for key, path in (("warehouse", conf.warehouse), ("checkpoints", conf.checkpoints)):
        assert path is not None, f"{pipeline_conf_path().name}: set '{key}' (a path on the pipeline's volume)"
        assert any(PurePosixPath(path.as_posix()).is_relative_to(t) for t in named), (
            f"{key} {path} is not on a named volume of the pipeline ({[str(t) for t in named]}): "
            "it would be lost when the container is recreated"
        )


def test_pipeline_stops_gracefully() -> None:
    svc = service(PIPELINE)
    assert svc.get("stop_signal", "SIGTERM") == "SIGTERM", "the job finishes its micro-batches on SIGTERM"
    grace = seconds(svc.get("stop_grace_period", "10s"))
    assert grace >= 60, f"stop_grace_period {grace:g}s is too short to finish a refresh wave and micro-batch"
    deps = depends_on(PIPELINE)
    assert deps.get(KAFKA) == "service_healthy"


def test_every_build_context_has_a_dockerfile() -> None:
    builds = {n: s["build"] for n, s in compose()["services"].items() if "build" in s}
    assert PIPELINE in builds, "the pipeline is built from the repository's Dockerfile"
    for name, build in builds.items():
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        ctx = host_path(context)
        assert ctx.is_dir() and ctx.is_relative_to(PROJECT_ROOT), f"{name}: build context {context!r}"
        assert (ctx / dockerfile).is_file(), f"{name}: no {dockerfile} in build context {context!r}"


def test_dockerfile_bootstraps_like_a_fresh_clone() -> None:
    text = (PROJECT_ROOT / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert re.match(r"FROM python:3\.11\b", instructions[0]), "base image: Python 3.11"
    assert re.search(r"openjdk-17-jdk|temurin-17", text) and re.search(r"\bmaven\b", text)
    assert re.search(r"^RUN .*\./dev setup", text, re.MULTILINE), "the image bootstraps with ./dev setup"
    entry = [line for line in instructions if line.startswith("ENTRYPOINT")]
    assert entry and ".venv/bin/trickle" in entry[-1], "the entrypoint is the venv's trickle"
    ignored = {line.strip().rstrip("/") for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()}
    for local in (".venv", "jars/lib", "warehouse", ".git"):
        assert local in ignored, f".dockerignore must exclude {local} (the image builds its own)"


# --------------------------------------------------------------------------------------------- hygiene


def test_no_privileges_and_no_host_paths_outside_the_repo() -> None:
    declared = set(compose().get("volumes") or {})
    for name, svc in compose()["services"].items():
        assert not svc.get("privileged"), f"{name}: privileged is not needed"
        for key in ("network_mode", "pid", "ipc"):
            assert svc.get(key) != "host", f"{name}: {key}: host ties the file to one machine"
        assert not svc.get("cap_add"), f"{name}: no extra capabilities"
        for m in mounts(name):
            if not m.bind:
                assert m.source in declared, f"{name}: named volume {m.source!r} is not declared under volumes:"
                continue
            assert m.source.startswith("./"), f"{name}: bind mount {m.source!r} must be relative to the repo (./...)"
            p = host_path(m.source)
            assert p.is_relative_to(PROJECT_ROOT), f"{name}: {m.source} points outside the repository"
            assert p.exists(), f"{name}: bind mount source {m.source} does not exist in the repository"


@pytest.mark.parametrize(
    ("pg_type", "spark"),
    [("integer", "INT"), ("bigint", "BIGINT"), ("numeric(10, 2)", "DECIMAL(10,2)"), ("timestamptz", "TIMESTAMP"),
     ("varchar(20)", "STRING"), ("timestamp without time zone", "TIMESTAMP_NTZ")],
)
def test_type_mapping_helper(pg_type: str, spark: str) -> None:
    assert spark in spark_types_for(pg_type)
