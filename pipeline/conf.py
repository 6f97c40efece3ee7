"""Load a spark-trickle conf file (YAML) into small dataclasses, with strict validation.

One file describes a whole pipeline so that ``trickle run CONF`` (or spark-submit) can bring it up
without code: the Spark settings, the warehouse, the sources (Kafka topics in Debezium format, existing
Delta tables), the stream tables and the runtime knobs. Everything is checked here, before Spark starts,
because a mistake found after a 20 s JVM start (or, worse, after hours of running) is expensive: unknown
keys, wrong types, schedules, Spark types of Kafka columns, name clashes. Every error is a
:class:`~pipeline.errors.ConfigError` whose message starts with the conf file's path, says where the
problem is (``sources[1] 'orders'``), what the value was and what is accepted.

Relative paths (``warehouse``, ``checkpoints``, a Delta source's ``path``, ``query_file``) are resolved
against the conf file's folder so that a conf file works no matter where the command is started from.
An explicit ``null`` means the same as leaving the key out.

Example::

    spark:
      spark.sql.shuffle.partitions: 4
    warehouse: ../warehouse          # relative to this file's folder
    checkpoints: ../checkpoints      # default: <warehouse>/_checkpoints
    sources:
      - name: orders
        kind: kafka
        topic: shop.public.orders
        bootstrap_servers: 127.0.0.1:9092
        columns: {id: BIGINT, customer: STRING, amount: "DECIMAL(10,2)"}
        key: id
      - name: departments
        kind: delta
    stream_tables:
      - name: order_totals
        query: SELECT customer, SUM(amount) AS total FROM orders GROUP BY customer
        refresh_mode: IMMEDIATE      # no schedule needed
      - name: big_customers
        query_file: sql/big_customers.sql   # relative to this file's folder
        schedule: "*/5 * * * *"      # quoted: a plain YAML scalar cannot start with '*'
      - name: recent_orders
        query: SELECT id, amount::INT AS amount FROM orders WHERE customer ILIKE 'a%'
        dialect: postgres            # the SQL dialect of the query (a sqlglot name); default spark
    runtime:
      tick_seconds: 1
      max_consecutive_errors: 3
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from connectors.column_types import SUPPORTED_TYPES, normalize_type
from pipeline.errors import ConfigError
from pipeline.modes import RefreshMode
from pipeline.schedule import DEFAULT_SCHEDULE, SCHEDULE_FORMS, normalize_schedule, parse_duration
from pipeline.strata import ALLOW_CIRCULAR, MAX_ITERATIONS

__all__ = [
    "TOP_LEVEL_KEYS",
    "STREAM_TABLE_KEYS",
    "RUNTIME_KEYS",
    "KAFKA_SOURCE_KEYS",
    "DELTA_SOURCE_KEYS",
    "COLUMN_KEYS",
    "SOURCE_KINDS",
    "REFRESH_MODES",
    "STARTING_OFFSETS",
    "KAFKA_READER_OPTIONS",
    "SUPPORTED_TYPES",
    "StreamTableSpec",
    "RuntimeSpec",
    "KafkaSourceSpec",
    "DeltaSourceSpec",
    "SourceSpec",
    "TrickleConf",
    "load_conf",
    "normalize_type",
]

TOP_LEVEL_KEYS = frozenset({"spark", "warehouse", "checkpoints", "sources", "stream_tables", "runtime",
                            "allow_circular", "max_fixpoint_iterations"})
STREAM_TABLE_KEYS = frozenset({"name", "query", "query_file", "schedule", "refresh_mode", "max_staleness",
                               "dialect"})
RUNTIME_KEYS = frozenset(
    {
        "tick_seconds",
        "max_consecutive_errors",
        "retry_backoff_seconds",
        "retry_backoff_max_seconds",
        "scheduler_threads",
        "fused_wait_seconds",
        "metrics_port",
        "alert_webhook",
    }
)
KAFKA_SOURCE_KEYS = frozenset(
    {
        "name",
        "kind",
        "topic",
        "bootstrap_servers",
        "columns",
        "key",
        "dead_letter",
        "starting_offsets",
        "kafka_options",
        "trigger_seconds",
        "transaction_topic",
    }
)
DELTA_SOURCE_KEYS = frozenset({"name", "kind", "path"})
COLUMN_KEYS = frozenset({"name", "type"})
SOURCE_KINDS = ("kafka", "delta")
REFRESH_MODES = tuple(RefreshMode)
STARTING_OFFSETS = ("earliest", "latest")

#: Spark Kafka reader options that may be given without the ``kafka.`` prefix (the prefixed ones go to the
#: Kafka consumer). Value checks keep a typo such as ``failOnDataLoss: flase`` from reaching Spark.
KAFKA_READER_OPTIONS = frozenset(
    {"maxOffsetsPerTrigger", "minOffsetsPerTrigger", "failOnDataLoss", "includeHeaders"}
)
_BOOL_OPTIONS = frozenset({"failOnDataLoss", "includeHeaders"})
#: ``kafka.*`` options that another key already sets or that Spark refuses; the hint says what to do.
_FORBIDDEN_KAFKA_OPTIONS = {
    "kafka.bootstrap.servers": "use the source's 'bootstrap_servers' key",
    "kafka.auto.offset.reset": "use the source's 'starting_offsets' key",
    "kafka.key.deserializer": "Spark always reads keys as bytes",
    "kafka.value.deserializer": "Spark always reads values as bytes",
    "kafka.enable.auto.commit": "Spark keeps offsets in its checkpoint, not in Kafka",
    "kafka.interceptor.classes": "Spark does not support consumer interceptors",
}

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUALIFIED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?$")
_SERVER_RE = re.compile(r"^[^\s,:]+:\d{1,5}$")

#: Same defaults as ``StreamTables.create_stream_table`` (and ``DEFAULT_SCHEDULE``, from
#: :mod:`pipeline.schedule`) so that a conf entry and an API call without options mean the same thing.
DEFAULT_REFRESH_MODE = RefreshMode.AUTO
DEFAULT_TICK_SECONDS = 1.0
DEFAULT_MAX_CONSECUTIVE_ERRORS = 3
DEFAULT_RETRY_BACKOFF_SECONDS = 1.0
DEFAULT_RETRY_BACKOFF_MAX_SECONDS = 300.0
DEFAULT_SCHEDULER_THREADS = 2
DEFAULT_FUSED_WAIT_SECONDS = 10.0
DEFAULT_STARTING_OFFSETS = "earliest"
DEFAULT_TRIGGER_SECONDS = 1.0


@dataclass(frozen=True)
class StreamTableSpec:
    """One stream table declared in a conf file (the query text is already read from ``query_file``).

    ``schedule`` is normalised (durations lower case, ``CALCULATED`` upper case, cron as written with single
    spaces); it is None only for an IMMEDIATE stream table that gave none (it is kept fresh by its
    streaming query, not by the scheduler).
    """

    name: str
    query: str
    schedule: str | None = DEFAULT_SCHEDULE
    refresh_mode: str = DEFAULT_REFRESH_MODE
    #: ``max_staleness`` in seconds: above it, ``trickle run`` alerts (:mod:`pipeline.alerts`); None: never
    max_staleness_seconds: float | None = None
    #: the SQL dialect ``query`` is written in (a sqlglot dialect name, lower case), as the API's ``dialect``
    dialect: str = "spark"


@dataclass(frozen=True)
class RuntimeSpec:
    """Knobs of the long-running job.

    ``tick_seconds``: how often the run loop looks for due refreshes. ``max_consecutive_errors``: failed
    refreshes in a row before a stream table is put in ERROR state (so one broken table stops burning the
    cluster). ``retry_backoff_seconds`` / ``retry_backoff_max_seconds``: after the n-th failure in a row the
    next attempt waits ``min(base * 2**(n-1), max)``, so a flapping source is not hammered.
    ``scheduler_threads``: how many independent stream tables are refreshed at the same time.
    ``fused_wait_seconds``: how long a Kafka source's micro-batch waits for the IMMEDIATE refreshes it
    started before its ingestion moves on (:mod:`pipeline.fused_lanes`): serial is fastest on few cores,
    and a slow table must not hold ingestion back for longer than this.
    """

    tick_seconds: float = DEFAULT_TICK_SECONDS
    max_consecutive_errors: int = DEFAULT_MAX_CONSECUTIVE_ERRORS
    retry_backoff_seconds: float = DEFAULT_RETRY_BACKOFF_SECONDS
    retry_backoff_max_seconds: float = DEFAULT_RETRY_BACKOFF_MAX_SECONDS
    scheduler_threads: int = DEFAULT_SCHEDULER_THREADS
    fused_wait_seconds: float = DEFAULT_FUSED_WAIT_SECONDS
    #: ``metrics_port``: the port ``trickle run`` serves Prometheus metrics on (0: none, :mod:`pipeline.metrics`);
    #: ``alert_webhook``: the URL alerts are POSTed to as JSON (None: alerts are only logged)
    metrics_port: int = 0
    alert_webhook: str | None = None


@dataclass(frozen=True)
class KafkaSourceSpec:
    """A Kafka topic of Debezium change events, mirrored into the Delta table ``name``.

    ``columns`` are ``(name, canonical Spark SQL type)`` pairs in table order (the shape
    :class:`connectors.debezium.SourceSchema` takes); empty when the conf leaves them out: the columns (and,
    without ``key``, the key) then come from the events' Connect schemas and follow the source's ADD COLUMN
    (:mod:`connectors.debezium_schema`); ``key`` is the primary key the mirror is maintained by;
    ``dead_letter`` is the table that receives events that cannot be decoded (None: the runtime's default);
    ``kafka_options`` are extra Spark Kafka reader options, values as strings.
    ``transaction_topic``: the connector's transaction topic (``<topic.prefix>.transaction``, with
    ``provide.transaction.metadata=true``): stream tables then read this mirror and its siblings at versions
    holding whole source transactions (:mod:`pipeline.transactions`); ``collection`` is this topic's table as
    the transaction records name it (``<schema>.<table>``, from the topic name).
    """

    kind: ClassVar[str] = "kafka"

    name: str
    topic: str
    bootstrap_servers: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    dead_letter: str | None = None
    starting_offsets: str = DEFAULT_STARTING_OFFSETS
    kafka_options: dict[str, str] = field(default_factory=dict)
    trigger_seconds: float = DEFAULT_TRIGGER_SECONDS
    transaction_topic: str | None = None
    collection: str = ""


@dataclass(frozen=True)
class DeltaSourceSpec:
    """An existing Delta table used as a source: by catalog ``name``, or the one at ``path`` as ``name``."""

    kind: ClassVar[str] = "delta"

    name: str
    path: Path | None = None


SourceSpec = KafkaSourceSpec | DeltaSourceSpec


@dataclass(frozen=True)
class TrickleConf:
    """A loaded conf file. ``path`` is kept so that later errors can name the file.

    ``checkpoints`` is None when the file gives none: the runtime then uses ``<warehouse>/_checkpoints``.
    """

    path: Path
    spark: dict[str, str] = field(default_factory=dict)
    warehouse: Path | None = None
    stream_tables: list[StreamTableSpec] = field(default_factory=list)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    sources: list[KafkaSourceSpec | DeltaSourceSpec] = field(default_factory=list)
    checkpoints: Path | None = None
    #: temporary views its loader registers before the stream tables (an SDP project's, pipeline/sdp.py)
    views: tuple[str, ...] = ()


def load_conf(path: str | os.PathLike[str]) -> TrickleConf:
    """Read and check a conf file; raise :class:`ConfigError` naming the file and the offending key."""
    import yaml  # a light import, but only commands that take a conf file need it

    p = Path(path).expanduser().resolve()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read conf file ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping (keys: {', '.join(sorted(TOP_LEVEL_KEYS))})")
    if "libraries" in data or "storage" in data:  # edited under a running `trickle run SPEC` (conf_reload)
        raise ConfigError(f"{p}: a Spark Declarative Pipelines spec, not a conf file: run it with trickle run "
                          f"{p.name}; edits to its definitions are applied when trickle run starts again")
    _reject_unknown(p, data, TOP_LEVEL_KEYS, where="top level")

    spark = {**_spark_settings(p, data.get("spark")), **_cycle_settings(p, data)}
    warehouse = _path_value(p, "warehouse", data.get("warehouse"))
    checkpoints = _path_value(p, "checkpoints", data.get("checkpoints"))
    specs = _stream_tables(p, data.get("stream_tables"))
    sources = _sources(p, data.get("sources"))
    _check_names(p, sources, specs)
    _check_graph(p, specs, allow_circular=spark.get(ALLOW_CIRCULAR) == "true")
    runtime = _runtime(p, data.get("runtime"))
    return TrickleConf(
        path=p,
        spark=spark,
        warehouse=warehouse,
        stream_tables=specs,
        runtime=runtime,
        sources=sources,
        checkpoints=checkpoints,
    )


# ----------------------------------------------------------------------------------------------- helpers


def _reject_unknown(path: Path, mapping: dict[Any, Any], allowed: frozenset[str], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(
                f"{path}: unknown key {key!r} at {where} (allowed: {', '.join(sorted(allowed))})"
            )


def _positive_number(path: Path, where: str, key: str, value: Any, default: float) -> float:
    """A positive int or float; bools are refused because YAML's ``yes`` would otherwise mean 1."""
    if value is None:
        return float(default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{path}: {where}.{key} must be a positive number, got {value!r}")
    return float(value)


def _positive_int(path: Path, where: str, key: str, value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{path}: {where}.{key} must be a positive integer, got {value!r}")
    return value


def _spark_settings(path: Path, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: 'spark' must be a mapping of Spark settings, got {type(value).__name__}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, dict | list) or v is None:
            raise ConfigError(f"{path}: spark setting {k!r} must be a scalar value")
        out[str(k)] = _scalar_text(v)
    return out


def _scalar_text(v: Any) -> str:
    # YAML turns `true` into a bool; Spark wants the lower-case string.
    return str(v).lower() if isinstance(v, bool) else str(v)


def _path_value(path: Path, key: str, value: Any, where: str | None = None) -> Path | None:
    """A path relative to the conf file's folder (or absolute, or ``~``), resolved."""
    if value is None:
        return None
    label = f"{where}: '{key}'" if where else f"'{key}'"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: {label} must be a non-empty path string, got {value!r}")
    from connectors.storage import Uri, is_local

    if not is_local(value.strip()):  # s3a://..., hdfs://...: taken as written (see connectors.storage.Uri)
        return Uri(value.strip())  # type: ignore[return-value]
    p = Path(value.strip()).expanduser()
    return (p if p.is_absolute() else path.parent / p).resolve()


# ------------------------------------------------------------------------------------------ stream tables


def _stream_tables(path: Path, value: Any) -> list[StreamTableSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: 'stream_tables' must be a list of mappings")
    specs: list[StreamTableSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"stream_tables[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: {where} must be a mapping with keys name and query (or query_file)")
        name = item.get("name")
        if isinstance(name, str) and name:
            where = f"stream_tables[{i}] {name!r}"
        _reject_unknown(path, item, STREAM_TABLE_KEYS, where=where)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{path}: {where}: 'name' is required and must be a string")
        if not _IDENT_RE.match(name):
            raise ConfigError(
                f"{path}: {where}: invalid name {name!r}: use letters, digits and underscores, "
                "not starting with a digit"
            )
        # The catalog lower-cases names, so Orders and orders would be the same stream table.
        if name.lower() in seen:
            raise ConfigError(f"{path}: stream table {name!r} is declared twice")
        seen.add(name.lower())
        query = _query(path, where, item)
        mode = item.get("refresh_mode")
        mode = DEFAULT_REFRESH_MODE if mode is None else mode
        if not isinstance(mode, str) or mode.strip().upper() not in REFRESH_MODES:
            raise ConfigError(
                f"{path}: {where}: 'refresh_mode' must be one of {', '.join(REFRESH_MODES)}, got {mode!r}"
            )
        mode = RefreshMode(mode.strip().upper())
        schedule = _schedule(path, where, item.get("schedule"), mode)
        specs.append(StreamTableSpec(name=name, query=query, schedule=schedule, refresh_mode=mode,
                                     max_staleness_seconds=_max_staleness(path, where, item.get("max_staleness")),
                                     dialect=_dialect(path, where, item.get("dialect"))))
    return specs


def _dialect(path: Path, where: str, value: Any) -> str:
    """The dialect a stream table's query is written in, checked as the API checks it
    (:func:`dvm.check_dialect`), as a ConfigError: every refresh parses the query in it, so a misspelt name
    fails ``trickle run`` before Spark starts, not at the table's creation."""
    import dvm

    if value is None:
        return "spark"
    try:
        return dvm.check_dialect(value)
    except dvm.QueryError as e:
        raise ConfigError(f"{path}: {where}: 'dialect': {e}") from None


def _schedule(path: Path, where: str, value: Any, mode: str) -> str | None:
    """Normalise a schedule with the API's grammar (:func:`pipeline.schedule.normalize_schedule`), as a
    ConfigError. Checked here (not only by the catalog) so that ``trickle run`` fails before Spark starts."""
    if value is None:
        # An IMMEDIATE stream table is kept fresh by its streaming query; it needs no schedule.
        return None if mode == RefreshMode.IMMEDIATE else DEFAULT_SCHEDULE
    try:
        return normalize_schedule(value)
    except ValueError:
        raise ConfigError(f"{path}: {where}: invalid 'schedule' {value!r}: use {SCHEDULE_FORMS} (quote a "
                          "cron expression in YAML)") from None


def _max_staleness(path: Path, where: str, value: Any) -> float | None:
    """``max_staleness``: a duration (``30s``, ``5m``, ``1h30m``) or a number of seconds; None: no alert."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    seconds = parse_duration(value) if isinstance(value, str) else None
    if not seconds or seconds <= 0:
        raise ConfigError(f"{path}: {where}: invalid 'max_staleness' {value!r}: use a positive duration such as "
                          "30s, 5m or 1h30m, or a number of seconds")
    return float(seconds)


def _query(path: Path, where: str, item: dict[str, Any]) -> str:
    has_query, has_file = "query" in item, "query_file" in item
    if has_query == has_file:
        raise ConfigError(f"{path}: {where}: give exactly one of 'query' and 'query_file'")
    if has_query:
        q = item["query"]
        if not isinstance(q, str) or not q.strip():
            raise ConfigError(f"{path}: {where}: 'query' must be a non-empty SQL string")
        return q.strip()
    f = item["query_file"]
    if not isinstance(f, str) or not f.strip():
        raise ConfigError(f"{path}: {where}: 'query_file' must be a path string")
    qp = Path(f).expanduser()
    qp = qp if qp.is_absolute() else path.parent / qp
    try:
        q = qp.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{path}: {where}: cannot read query_file {f!r} ({exc.strerror or exc})") from exc
    if not q:
        raise ConfigError(f"{path}: {where}: query_file {f!r} is empty")
    return q


# ------------------------------------------------------------------------------------------------ sources


def _sources(path: Path, value: Any) -> list[KafkaSourceSpec | DeltaSourceSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: 'sources' must be a list of mappings (each with name and kind)")
    out: list[KafkaSourceSpec | DeltaSourceSpec] = []
    for i, item in enumerate(value):
        where = f"sources[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: {where} must be a mapping with keys name and kind")
        name = item.get("name")
        if isinstance(name, str) and name:
            where = f"sources[{i}] {name!r}"
        kind = item.get("kind")
        if kind is None:
            raise ConfigError(f"{path}: {where}: 'kind' is required: one of {', '.join(SOURCE_KINDS)}")
        if not isinstance(kind, str) or kind.strip().lower() not in SOURCE_KINDS:
            raise ConfigError(
                f"{path}: {where}: 'kind' must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}"
            )
        kind = kind.strip().lower()
        _reject_unknown(path, item, KAFKA_SOURCE_KEYS if kind == "kafka" else DELTA_SOURCE_KEYS, where=where)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{path}: {where}: 'name' is required and must be a string")
        if kind == "kafka":
            # The mirror is a table the runtime creates (with a checkpoint folder named after it): one name.
            if not _IDENT_RE.match(name):
                raise ConfigError(
                    f"{path}: {where}: invalid name {name!r}: use letters, digits and underscores, "
                    "not starting with a digit"
                )
            out.append(_kafka_source(path, where, name, item))
        else:
            if not _QUALIFIED_RE.match(name):
                raise ConfigError(
                    f"{path}: {where}: invalid name {name!r}: use a table name such as departments or "
                    "db.departments (letters, digits and underscores)"
                )
            out.append(DeltaSourceSpec(name=name, path=_path_value(path, "path", item.get("path"), where)))
    return out


def _kafka_source(path: Path, where: str, name: str, item: dict[str, Any]) -> KafkaSourceSpec:
    for required in ("topic", "bootstrap_servers"):
        if item.get(required) is None:
            raise ConfigError(f"{path}: {where}: '{required}' is required for a kafka source")
    if item.get("columns") is not None and item.get("key") is None:
        raise ConfigError(f"{path}: {where}: 'key' is required for a kafka source that lists its columns")
    topic = item["topic"]
    if not isinstance(topic, str) or not topic.strip():
        raise ConfigError(f"{path}: {where}: 'topic' must be a non-empty string, got {topic!r}")
    servers = _bootstrap_servers(path, where, item["bootstrap_servers"])
    if item.get("columns") is None:  # from the events' Connect schemas (connectors/debezium_schema.py)
        columns: tuple[tuple[str, str], ...] = ()
        key = () if item.get("key") is None else _key(path, where, item["key"], None)
    else:
        columns = _columns(path, where, item["columns"])
        key = _key(path, where, item["key"], columns)

    dead_letter = item.get("dead_letter")
    if dead_letter is not None and (not isinstance(dead_letter, str) or not _IDENT_RE.match(dead_letter)):
        raise ConfigError(
            f"{path}: {where}: 'dead_letter' must be a table name (letters, digits and underscores), "
            f"got {dead_letter!r}"
        )
    offsets = item.get("starting_offsets")
    offsets = DEFAULT_STARTING_OFFSETS if offsets is None else offsets
    if not isinstance(offsets, str) or offsets.strip().lower() not in STARTING_OFFSETS:
        raise ConfigError(
            f"{path}: {where}: 'starting_offsets' must be one of {', '.join(STARTING_OFFSETS)}, "
            f"got {offsets!r}"
        )
    options = _kafka_options(path, where, item.get("kafka_options"))
    trigger = _positive_number(
        path, where, "trigger_seconds", item.get("trigger_seconds"), DEFAULT_TRIGGER_SECONDS
    )
    tx_topic, collection = _transaction_topic(path, where, topic.strip(), item.get("transaction_topic"))
    return KafkaSourceSpec(
        name=name,
        topic=topic.strip(),
        bootstrap_servers=servers,
        columns=columns,
        key=key,
        dead_letter=dead_letter,
        starting_offsets=offsets.strip().lower(),
        kafka_options=options,
        trigger_seconds=trigger,
        transaction_topic=tx_topic,
        collection=collection,
    )


def _transaction_topic(path: Path, where: str, topic: str, value: Any) -> tuple[str | None, str]:
    """``(transaction topic, collection)``: Debezium names a table's topic ``<prefix>.<schema>.<table>`` and
    the transaction topic ``<prefix>.transaction``, and its END records name the table ``<schema>.<table>``."""
    if value is None:
        return None, ""
    if not isinstance(value, str) or not value.strip().endswith(".transaction"):
        raise ConfigError(f"{path}: {where}: 'transaction_topic' must be the connector's transaction topic, "
                          f"'<topic.prefix>.transaction', got {value!r}")
    prefix = value.strip().removesuffix(".transaction")
    if not topic.startswith(prefix + ".") or len(topic) == len(prefix) + 1:
        raise ConfigError(f"{path}: {where}: topic {topic!r} is not a topic of the connector whose transaction "
                          f"topic is {value.strip()!r} (expected '{prefix}.<schema>.<table>')")
    return value.strip(), topic[len(prefix) + 1:]


def _bootstrap_servers(path: Path, where: str, value: Any) -> str:
    """``host:port[,host:port...]`` (a YAML list of them is joined): Kafka's own format, checked early."""
    items = value if isinstance(value, list) else [value]
    parts: list[str] = []
    for v in items:
        if not isinstance(v, str):
            parts = []
            break
        parts.extend(s.strip() for s in v.split(",") if s.strip())
    if not parts or not all(_SERVER_RE.match(s) for s in parts):
        raise ConfigError(
            f"{path}: {where}: 'bootstrap_servers' must be host:port, or several separated by commas, "
            f'e.g. "127.0.0.1:9092"; got {value!r}'
        )
    return ",".join(parts)


def _columns(path: Path, where: str, value: Any) -> tuple[tuple[str, str], ...]:
    """Both ``{id: BIGINT, ...}`` (order kept) and ``[{name: id, type: BIGINT}, ...]`` give the same tuple."""
    pairs: list[tuple[Any, Any, str]] = []  # (name, type, where of this column)
    if isinstance(value, dict):
        pairs = [(k, v, f"{where} columns.{k}") for k, v in value.items()]
    elif isinstance(value, list):
        for j, col in enumerate(value):
            cw = f"{where} columns[{j}]"
            if not isinstance(col, dict):
                raise ConfigError(f"{path}: {cw} must be a mapping with keys name and type, got {col!r}")
            _reject_unknown(path, col, COLUMN_KEYS, where=cw)
            for k in ("name", "type"):
                if col.get(k) is None:
                    raise ConfigError(f"{path}: {cw}: '{k}' is required")
            pairs.append((col["name"], col["type"], cw))
    else:
        raise ConfigError(
            f"{path}: {where}: 'columns' must be a mapping {{name: TYPE}} or a list of {{name, type}}, "
            f"got {type(value).__name__}"
        )
    if not pairs:
        raise ConfigError(f"{path}: {where}: 'columns' must list at least one column")
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for col_name, col_type, cw in pairs:
        if not isinstance(col_name, str):
            # YAML 1.1 reads on/off/yes/no as booleans and 1 as an int: the usual cause.
            raise ConfigError(
                f"{path}: {cw}: column name {col_name!r} is not a string; "
                "quote it in YAML (e.g. 'on': BOOLEAN)"
            )
        if col_name.startswith("__"):
            raise ConfigError(
                f"{path}: {cw}: column name {col_name!r} starts with '__', "
                "which is reserved for hidden columns"
            )
        if not _IDENT_RE.match(col_name):
            raise ConfigError(
                f"{path}: {cw}: invalid column name {col_name!r}: use letters, digits and underscores, "
                "not starting with a digit"
            )
        if col_name.lower() in seen:
            raise ConfigError(
                f"{path}: {cw}: duplicate column {col_name!r} (same as {seen[col_name.lower()]!r}: "
                "Spark column names are case-insensitive)"
            )
        seen[col_name.lower()] = col_name
        if not isinstance(col_type, str):
            raise ConfigError(
                f"{path}: {cw}: type of column {col_name!r} must be a string, got {col_type!r} "
                f"(supported: {SUPPORTED_TYPES})"
            )
        try:
            canonical = normalize_type(col_type)
        except ValueError as exc:
            raise ConfigError(f"{path}: {cw}: column {col_name!r}: {exc}") from None
        out.append((col_name, canonical))
    return tuple(out)


def _key(path: Path, where: str, value: Any, columns: tuple[tuple[str, str], ...] | None) -> tuple[str, ...]:
    """The primary key, spelled as in ``columns`` (matched case-insensitively, as Spark resolves names); with
    ``columns`` None (they come from the events) as given."""
    keys = [value] if isinstance(value, str) else value
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(
            f"{path}: {where}: 'key' must be a column name or a non-empty list of column names, got {value!r}"
        )
    by_lower = {n.lower(): n for n, _ in columns} if columns is not None else None
    out: list[str] = []
    for k in keys:
        col = by_lower.get(k.lower()) if by_lower is not None else k
        if col is None:
            raise ConfigError(
                f"{path}: {where}: key column {k!r} is not in 'columns' ({', '.join(n for n, _ in columns)})"
            )
        if col in out:
            raise ConfigError(f"{path}: {where}: key column {k!r} is listed twice")
        out.append(col)
    return tuple(out)


def _kafka_options(path: Path, where: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    allowed = f"keys starting with 'kafka.' or one of {', '.join(sorted(KAFKA_READER_OPTIONS))}"
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {where}: 'kafka_options' must be a mapping ({allowed})")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not (
            (k.startswith("kafka.") and len(k) > len("kafka.")) or k in KAFKA_READER_OPTIONS
        ):
            raise ConfigError(f"{path}: {where}: unknown key {k!r} in kafka_options (allowed: {allowed})")
        if k in _FORBIDDEN_KAFKA_OPTIONS:
            raise ConfigError(
                f"{path}: {where}: kafka_options {k!r} is not allowed: {_FORBIDDEN_KAFKA_OPTIONS[k]}"
            )
        if v is None or isinstance(v, dict | list):
            raise ConfigError(f"{path}: {where}: kafka_options {k!r} must be a scalar value, got {v!r}")
        if k in _BOOL_OPTIONS and _scalar_text(v) not in ("true", "false"):
            raise ConfigError(f"{path}: {where}: kafka_options {k!r} must be true or false, got {v!r}")
        if k in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger") and (
            isinstance(v, bool) or not isinstance(v, int) or v <= 0
        ):
            raise ConfigError(f"{path}: {where}: kafka_options {k!r} must be a positive integer, got {v!r}")
        out[k] = _scalar_text(v)
    return out


def _check_names(
    path: Path, sources: list[KafkaSourceSpec | DeltaSourceSpec], specs: list[StreamTableSpec]
) -> None:
    """Source, dead-letter and stream table names share one catalog namespace (case-insensitive)."""
    owners: dict[str, str] = {}
    for i, spec in enumerate(specs):
        owners[spec.name.lower()] = f"stream_tables[{i}] {spec.name!r}"
    for i, src in enumerate(sources):
        where = f"sources[{i}] {src.name!r}"
        if src.name.lower() in owners:
            raise ConfigError(
                f"{path}: {where}: name {src.name!r} is already used by {owners[src.name.lower()]}; "
                "source and stream table names must be unique"
            )
        owners[src.name.lower()] = where
    for i, src in enumerate(sources):
        if isinstance(src, KafkaSourceSpec) and src.dead_letter is not None:
            other = owners.get(src.dead_letter.lower())
            if other is not None:
                raise ConfigError(
                    f"{path}: sources[{i}] {src.name!r}: 'dead_letter' {src.dead_letter!r} is the name of "
                    f"{other}; give the dead-letter table its own name"
                )


def query_sources(spec: StreamTableSpec) -> list[str]:
    """The tables a stream table's query reads (lower case, ``db.table`` or ``table``)."""
    import dvm

    return dvm.source_keys(spec.query, spec.dialect)


def _cycle_settings(path: Path, data: dict[str, Any]) -> dict[str, str]:
    """``allow_circular`` and ``max_fixpoint_iterations`` (top level) as the Spark conf the API reads them
    from (:class:`pipeline.cycles.Settings`): the pipeline's session carries them to every command."""
    out: dict[str, str] = {}
    if "allow_circular" in data:
        value = data["allow_circular"]
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: 'allow_circular' must be true or false, got {value!r}")
        out[ALLOW_CIRCULAR] = "true" if value else "false"
    if "max_fixpoint_iterations" in data:
        value = data["max_fixpoint_iterations"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10000:
            raise ConfigError(f"{path}: 'max_fixpoint_iterations' must be an integer from 1 to 10000, got {value!r}")
        out[MAX_ITERATIONS] = str(value)
    return out


def _check_graph(path: Path, specs: list[StreamTableSpec], allow_circular: bool = False) -> None:
    """Each query must parse, and stream tables must not read themselves, directly or through others
    (through others they may, when the pipeline allows cycles: ``allow_circular``; create and alter then
    check that every edge of a cycle is monotone, see :mod:`pipeline.strata`)."""
    from dvm import TrickleError as DvmError

    index = {s.name.lower(): i for i, s in enumerate(specs)}
    reads: dict[str, list[str]] = {}
    for i, spec in enumerate(specs):
        try:
            reads[spec.name.lower()] = [r for r in query_sources(spec) if r in index]
        except DvmError as exc:
            raise ConfigError(f"{path}: stream_tables[{i}] {spec.name!r}.query: {exc}") from None
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = trail[trail.index(name):] + [name]
            if allow_circular and len(cycle) > 2:
                return
            first = specs[index[cycle[0]]]
            raise ConfigError(f"{path}: stream_tables[{index[cycle[0]]}] {first.name!r}.query: cycle "
                              f"{' -> '.join(cycle)}; a stream table cannot read itself, directly or "
                              "through other stream tables")
        state[name] = 1
        for up in reads[name]:
            visit(up, trail + [name])
        state[name] = 2

    for name in reads:
        visit(name, [])


def creation_order(specs: list[StreamTableSpec]) -> list[StreamTableSpec]:
    """Stream tables in an order where each comes after the conf's stream tables it reads."""
    index = {s.name.lower(): s for s in specs}
    out: list[StreamTableSpec] = []
    done: set[str] = set()

    def add(spec: StreamTableSpec) -> None:
        if spec.name.lower() in done:
            return
        done.add(spec.name.lower())
        for up in query_sources(spec):
            if up in index:
                add(index[up])
        out.append(spec)

    for spec in specs:
        add(spec)
    return out


# ------------------------------------------------------------------------------------------------ runtime


def _runtime(path: Path, value: Any) -> RuntimeSpec:
    if value is None:
        return RuntimeSpec()
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: 'runtime' must be a mapping (keys: {', '.join(sorted(RUNTIME_KEYS))})")
    _reject_unknown(path, value, RUNTIME_KEYS, where="runtime")
    w = "runtime"
    tick = _positive_number(path, w, "tick_seconds", value.get("tick_seconds"), DEFAULT_TICK_SECONDS)
    errors = _positive_int(
        path, w, "max_consecutive_errors", value.get("max_consecutive_errors"), DEFAULT_MAX_CONSECUTIVE_ERRORS
    )
    base = _positive_number(
        path, w, "retry_backoff_seconds", value.get("retry_backoff_seconds"), DEFAULT_RETRY_BACKOFF_SECONDS
    )
    cap = _positive_number(
        path,
        w,
        "retry_backoff_max_seconds",
        value.get("retry_backoff_max_seconds"),
        DEFAULT_RETRY_BACKOFF_MAX_SECONDS,
    )
    if cap < base:
        given = "" if value.get("retry_backoff_max_seconds") is not None else ", the default"
        raise ConfigError(
            f"{path}: runtime.retry_backoff_max_seconds ({cap:g}{given}) must be >= "
            f"runtime.retry_backoff_seconds ({base:g})"
        )
    threads = _positive_int(
        path, w, "scheduler_threads", value.get("scheduler_threads"), DEFAULT_SCHEDULER_THREADS
    )
    fused_wait = _positive_number(
        path, w, "fused_wait_seconds", value.get("fused_wait_seconds"), DEFAULT_FUSED_WAIT_SECONDS
    )
    port = value.get("metrics_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise ConfigError(f"{path}: runtime.metrics_port must be a port number (1-65535; 0 or absent: no "
                          f"metrics), got {port!r}")
    hook = value.get("alert_webhook")
    if hook is not None and (not isinstance(hook, str) or not re.match(r"^https?://[^\s/]+", hook)):
        raise ConfigError(f"{path}: runtime.alert_webhook must be an http:// or https:// URL, got {hook!r}")
    return RuntimeSpec(
        metrics_port=port or 0,
        alert_webhook=hook,
        tick_seconds=tick,
        max_consecutive_errors=errors,
        retry_backoff_seconds=base,
        retry_backoff_max_seconds=cap,
        scheduler_threads=threads,
        fused_wait_seconds=fused_wait,
    )
