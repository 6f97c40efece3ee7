"""Run a Spark Declarative Pipelines (SDP) project as stream tables: the same declarations, refreshed
incrementally.

Spark 4.1 ships SDP: a spec file (``spark-pipeline.yml``) whose ``libraries`` globs name ``.sql`` and ``.py``
files that declare materialized views, streaming tables, flows and temporary views. ``spark-pipelines run``
recomputes every materialized view in full on each run. ``trickle run spark-pipeline.yml`` reads the same
project and keeps each materialized view as a stream table, refreshed DIFFERENTIAL where its query allows.

What is reused from SDP, and why the rest is not called:

- **The spec**: :func:`pyspark.pipelines.cli.load_pipeline_spec` (the fields, their checks, the glob rule of
  :func:`~pyspark.pipelines.cli.validate_patch_glob_pattern`) and
  :func:`~pyspark.pipelines.cli.find_pipeline_spec` (a directory and its parents, as ``spark-pipelines``
  looks). Nothing of it needs Spark.
- **The files**: the same glob over the spec's folder as
  :func:`~pyspark.pipelines.cli.register_definitions`. That function itself is not called: it *imports* every
  Python file (running user code) inside ``add_pipeline_analysis_context``, which needs a Spark Connect
  session and a dataflow graph on the server. We read Python files with :mod:`ast` instead, never running
  them.
- **The SQL**: SDP splits and parses a SQL file on the server, in Scala
  (``SqlGraphRegistrationContext.splitSqlFileIntoQueries``: split at semicolons, parse each statement with
  Spark's SQL parser, record its line). That object ships in pyspark's own jars
  (``spark-pipelines_2.13``), so we call it through py4j on our classic session: the statements, their
  plans (``CreateMaterializedViewAsSelect``, ``CreateViewCommand``, ...) and their lines are exactly SDP's.
  ``SqlGraphRegistrationContext.processSqlFile`` (the step after) is not called: it registers into a
  ``GraphRegistrationContext`` whose flows keep only an unresolved plan, where a stream table needs the SQL
  text; each plan's ``originalText`` gives that text.

How declarations map (anything else is a :class:`~pipeline.errors.ConfigError` naming the file, the line
and the construct):

==========================================================  ===============================================
SDP                                                          spark-trickle
==========================================================  ===============================================
``CREATE MATERIALIZED VIEW m AS SELECT ...``, or a Python    stream table ``m`` (mode and schedule below)
``@dp.materialized_view`` whose body is
``return spark.sql("...")``
``CREATE TEMPORARY VIEW v AS SELECT ...`` (or                a temporary view in the session, inlined into
``@dp.temporary_view`` over ``spark.sql``)                   the stream tables that read it
``CREATE STREAMING TABLE s AS SELECT ... FROM STREAM(t)``,   IMMEDIATE stream table over ``t`` (a Delta
or ``CREATE STREAMING TABLE s`` fed by one                   table with Change Data Feed): a streaming
``CREATE FLOW f AS INSERT INTO s BY NAME SELECT ...          query refreshes it as ``t``'s changes commit
FROM STREAM(t)``, or ``@dp.table`` over such a ``spark.sql``
``CREATE STREAMING TABLE s (col TYPE, ...)                   a Kafka source (a Debezium topic mirrored into
TBLPROPERTIES ('trickle.kafka.topic' = ..., ...)``           the Delta table ``s``), see :data:`KAFKA_PROPS`
==========================================================  ===============================================

Refresh mode and schedule of a materialized view come from its table properties
``trickle.refresh_mode`` (AUTO, DIFFERENTIAL, FULL, IMMEDIATE) and ``trickle.schedule`` (as in a conf file:
``30s``, cron, ``CALCULATED``), else SDP's own ``pipelines.trigger.interval`` (``1 hour``), else the same
words in its COMMENT (``COMMENT 'totals; trickle.schedule=30s'``); by default AUTO every 1m, as in a conf
file. A streaming table is IMMEDIATE.

One difference in meaning: SDP's streaming table appends what its source appends, and its run fails on
an update or delete of the source; the IMMEDIATE stream table keeps the query's result over the source's
current rows, so both agree while the source only grows, and trickle goes on where SDP stops.
"""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.storage import strip_file_scheme
from pipeline import conf_reload
from pipeline.errors import ConfigError, TrickleError, UnsupportedError
from pipeline.modes import RefreshMode

if TYPE_CHECKING:
    from pipeline.api import StreamTables
    from pipeline.conf import StreamTableSpec, TrickleConf

__all__ = ["KAFKA_PROPS", "Dataset", "SdpProject", "spec_path", "spec_conf", "load_project", "create"]

#: Table properties of a query-less ``CREATE STREAMING TABLE`` that make it a Kafka source (the rest as in a
#: conf file's ``sources`` entry: columns from the column list, ``key`` a comma-separated list).
KAFKA_PROPS = ("topic", "bootstrap_servers", "key", "dead_letter", "starting_offsets", "transaction_topic")
_MODE_PROP, _SCHEDULE_PROP, _TRIGGER_PROP = "trickle.refresh_mode", "trickle.schedule", "pipelines.trigger.interval"
_COMMENT_SETTING = re.compile(r"\btrickle\.(refresh_mode|schedule)\s*[=:]\s*('[^']*'|\"[^\"]*\"|\S+)", re.I)
_INTERVAL_UNITS = {"second": "s", "seconds": "s", "minute": "m", "minutes": "m", "hour": "h", "hours": "h",
                   "day": "d", "days": "d"}
#: Where a Python definition's decorator comes from: ``pyspark.pipelines`` (``dp``/``sdp`` by custom).
_SDP_MODULE = "pyspark.pipelines"


@dataclass(frozen=True)
class Dataset:
    """One declaration of the project: a stream table (``kind`` mv or st), a temporary view or a Kafka
    source, with ``where`` (``file:line``) and ``construct`` (``CREATE MATERIALIZED VIEW m``) for errors."""

    kind: str  # "mv" | "st" | "view" | "kafka"
    name: str
    query: str
    where: str
    construct: str
    properties: dict[str, str] = field(default_factory=dict)
    comment: str | None = None


@dataclass(frozen=True)
class SdpProject:
    """A loaded SDP project: ``conf`` is what a conf file would have said (its ``path`` the spec), ``views``
    the temporary views to register before the stream tables that read them, ``origins`` name -> where."""

    conf: TrickleConf
    views: list[Dataset]
    origins: dict[str, Dataset]


# -------------------------------------------------------------------------------------------------- spec


def _sdp_cli() -> Any:
    """``pyspark.pipelines.cli``: it imports Spark Connect's client, which needs pyspark's ``connect`` extra."""
    try:
        from pyspark.pipelines import cli
    except ImportError as e:
        raise ConfigError(f"reading a Spark Declarative Pipelines spec needs pyspark's Spark Connect client "
                          f"({e}); install it with: pip install 'pyspark[connect]'") from None
    return cli


def spec_path(path: str | Path) -> Path | None:
    """The SDP spec ``path`` means (a spec file, or a directory holding one or below one, as
    ``spark-pipelines`` finds it), or None when ``path`` is a spark-trickle conf file (decided without
    importing SDP's module, so a conf file never needs the Spark Connect client)."""
    p = Path(path).expanduser()
    if p.is_dir():
        cli = _sdp_cli()
        try:
            return Path(cli.find_pipeline_spec(p.resolve()))
        except Exception as e:  # noqa: BLE001 - PySparkException: no spec in the folder or above it
            raise ConfigError(f"{p}: no Spark Declarative Pipelines spec "
                              f"({' or '.join(cli.PIPELINE_SPEC_FILE_NAMES)}) in this directory or above it "
                              f"({e})") from None
    try:
        import yaml

        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - unreadable or not YAML: load_conf reports it as a conf file
        return None
    # `libraries` and `storage` are SDP keys a conf file never has (pipeline.conf.TOP_LEVEL_KEYS).
    return p.resolve() if isinstance(data, dict) and ("libraries" in data or "storage" in data) else None


def _load_spec(path: Path) -> Any:
    cli = _sdp_cli()
    try:
        return cli.load_pipeline_spec(path)
    except Exception as e:  # noqa: BLE001 - PySparkException / KeyError / YAML errors: say which file
        raise ConfigError(f"{path}: invalid Spark Declarative Pipelines spec: {type(e).__name__}: {e}") from None


def spec_conf(path: Path) -> TrickleConf:
    """What the spec alone says, before Spark starts: Spark settings (its ``configuration``), the warehouse
    (``spark.sql.warehouse.dir`` there, relative to the spec's folder) and the checkpoints (``<storage>/
    trickle``, beside SDP's own). No stream tables yet: their SQL is parsed by Spark (:func:`load_project`)."""
    from pipeline.conf import TrickleConf, _path_value

    spec = _load_spec(path)
    if spec.catalog not in (None, "spark_catalog") or (spec.database or "default").lower() != "default":
        raise ConfigError(f"{path}: catalog {spec.catalog!r} / database {spec.database!r}: spark-trickle keeps "
                          "stream tables in the session's default database; remove 'catalog' and 'database' "
                          "(or set them to spark_catalog / default)")
    settings = {str(k): str(v) for k, v in spec.configuration.items()}
    warehouse = _path_value(path, "spark.sql.warehouse.dir", settings.get("spark.sql.warehouse.dir"))
    storage = strip_file_scheme(str(spec.storage))
    checkpoints = _path_value(path, "storage", storage)
    return TrickleConf(path=path, spark=settings, warehouse=warehouse,
                       checkpoints=None if checkpoints is None else checkpoints / "trickle")


def _library_files(path: Path, spec: Any) -> list[Path]:
    """The definition files, found as :func:`pyspark.pipelines.cli.register_definitions` finds them."""
    root = path.parent.resolve()
    files: list[Path] = []
    for lib in spec.libraries:
        for f in sorted(root.glob(lib.include)):
            if f.is_file() and "__pycache__" not in f.parts and f not in files:
                if f.suffix not in (".sql", ".py"):
                    raise ConfigError(f"{f}: not a definition file: SDP reads .sql and .py files (glob "
                                      f"{lib.include!r} of {path})")
                files.append(f)
    return files


# ------------------------------------------------------------------------------------------------- parse


def load_project(path: Path, spark: Any) -> SdpProject:
    """Read the spec and every definition file into a conf (sources, stream tables) and views; raise
    :class:`ConfigError` naming the file, the line and the construct for what does not map."""
    from pipeline.conf import DeltaSourceSpec, _check_graph, _check_names, _sources, _stream_tables

    spec = _load_spec(path)
    conf = spec_conf(path)
    datasets: list[Dataset] = []
    for f in _library_files(path, spec):
        rel = f.relative_to(path.parent.resolve())
        text = f.read_text(encoding="utf-8")
        datasets += _sql_datasets(spark, text, str(rel)) if f.suffix == ".sql" else _python_datasets(text, str(rel))
    datasets = _attach_flows([_read_streams(spark, d) for d in datasets])
    seen: dict[str, Dataset] = {}
    for d in datasets:
        other = seen.get(d.name.lower())
        if other is not None:
            raise ConfigError(f"{d.where}: {d.construct}: {d.name} is already declared at {other.where}")
        seen[d.name.lower()] = d
    specs: list[StreamTableSpec] = []
    sources: list[Any] = []
    for d in datasets:
        try:
            if d.kind in ("mv", "st"):
                specs += _stream_tables(path, [_table_item(d)])
            elif d.kind == "kafka":
                sources += _sources(path, [_kafka_item(d)])
        except ConfigError as e:
            raise ConfigError(f"{d.where}: {d.construct}: {_without_prefix(str(e), path)}") from None
    # What the declarations read and do not declare: the project's Delta sources, by name (a qualified
    # name or a path is read as written, without a source entry).
    defined = {d.name.lower() for d in datasets}
    readers = {ref: d for d in reversed(datasets) if d.kind in ("mv", "st", "view") for ref in _reads(d.query)}
    for ref in sorted(set(readers) - defined):
        if "." not in ref and not _table_exists(spark, ref):
            d = readers[ref]
            raise ConfigError(f"{d.where}: {d.construct}: reads {ref}, which the project does not declare and no "
                              "table is: create it as a Delta table (with delta.enableChangeDataFeed = true) in "
                              "the warehouse, or declare it")
    sources += [DeltaSourceSpec(name=ref) for ref in sorted(set(readers) - defined) if "." not in ref]
    origins = {d.name.lower(): d for d in datasets}
    try:
        _check_names(path, sources, specs)
        _check_graph(path, specs)
    except ConfigError as e:  # name the declaration, not a conf file's stream_tables[i]
        raise ConfigError(re.sub(r"stream_tables\[\d+\] '(\w+)'(\.query)?", lambda m: (
            f"{origins[m.group(1).lower()].where}: {origins[m.group(1).lower()].construct}"), str(e))) from None
    conf = replace(conf, stream_tables=specs, sources=sources,
                   views=tuple(d.name for d in datasets if d.kind == "view"))
    return SdpProject(conf, [d for d in datasets if d.kind == "view"], origins)


def _without_prefix(message: str, path: Path) -> str:
    """A conf error without its ``<path>: stream_tables[0] 'x':`` lead: the SDP origin replaces it."""
    message = message.removeprefix(f"{path}: ")
    return re.sub(r"^(stream_tables|sources)\[\d+\]( '[^']*')?:?\s*", "", message)


def _table_exists(spark: Any, name: str) -> bool:
    try:
        return bool(spark.catalog.tableExists(name))
    except Exception:  # noqa: BLE001 - not a name the catalog can look up
        return False


def _reads(query: str) -> list[str]:
    import dvm

    try:
        return dvm.source_keys(query)
    except Exception:  # noqa: BLE001 - create reports the query's own error, with its origin
        return []


def _table_item(d: Dataset) -> dict[str, Any]:
    """A conf file's ``stream_tables`` entry for ``d``, so that the conf's checks apply unchanged."""
    if d.kind == "st":
        return {"name": d.name, "query": d.query, "refresh_mode": RefreshMode.IMMEDIATE}
    settings = {k.lower(): v.strip("'\"") for k, v in _COMMENT_SETTING.findall(d.comment or "")}
    mode = d.properties.get(_MODE_PROP) or settings.get("refresh_mode")
    schedule = d.properties.get(_SCHEDULE_PROP) or _interval(d.properties.get(_TRIGGER_PROP)) \
        or settings.get("schedule")
    item: dict[str, Any] = {"name": d.name, "query": d.query}
    if mode is not None:
        item["refresh_mode"] = mode
    if schedule is not None:
        item["schedule"] = schedule
    return item


def _interval(text: str | None) -> str | None:
    """SDP's ``pipelines.trigger.interval`` (``1 hour``, ``30 seconds``, ``10m``) as a schedule (``1h``)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+)\s*", text, re.I)
    if m and m.group(2).lower() in _INTERVAL_UNITS:
        return f"{m.group(1)}{_INTERVAL_UNITS[m.group(2).lower()]}"
    return text  # the conf's schedule check says what is accepted


def _kafka_item(d: Dataset) -> dict[str, Any]:
    props = {k[len("trickle.kafka."):]: v for k, v in d.properties.items() if k.startswith("trickle.kafka.")}
    unknown = sorted(set(props) - set(KAFKA_PROPS))
    if unknown:
        raise ConfigError(f"unknown table properties {', '.join('trickle.kafka.' + k for k in unknown)} "
                          f"(known: {', '.join('trickle.kafka.' + k for k in KAFKA_PROPS)})")
    item: dict[str, Any] = {"name": d.name, "kind": "kafka", **props}
    if "key" in props:
        item["key"] = [k.strip() for k in props["key"].split(",") if k.strip()]
    columns = [c.split(" ", 1) for c in d.query.split("\n") if c]  # "name TYPE" lines (see _sql_dataset)
    if columns:
        item["columns"] = {n: t for n, t in columns}
    return item


# --- SQL: SDP's own splitter and parser, in the JVM


def _sql_datasets(spark: Any, text: str, file: str) -> list[Dataset]:
    """The declarations of one SQL file, split and parsed by SDP's ``splitSqlFileIntoQueries``."""
    graph = spark._jvm.org.apache.spark.sql.pipelines.graph
    try:
        statements = graph.SqlGraphRegistrationContext.splitSqlFileIntoQueries(spark._jsparkSession, text, file)
    except Exception as e:  # noqa: BLE001 - a ParseException: Spark's message names line and position
        raise ConfigError(f"{file}: {_java_message(e)}") from None
    out: list[Dataset] = []
    it = statements.iterator()
    while it.hasNext():
        s = it.next()
        origin = s.queryOrigin()
        line = origin.line().get() if origin.line().isDefined() else 1
        out.append(_sql_dataset(s.plan(), f"{file}:{line}", origin.sqlText().get() if origin.sqlText().isDefined()
                                else ""))
    return out


def _java_message(e: Exception) -> str:
    text = str(getattr(e, "java_exception", None) or e)
    return text.split("\n\tat ")[0].strip()


def _sql_dataset(plan: Any, where: str, text: str) -> Dataset:
    kind = plan.getClass().getSimpleName()
    head = " ".join(text.split())[:60]
    if kind == "CreateMaterializedViewAsSelect":
        name = _name(plan.name(), where)
        construct = f"CREATE MATERIALIZED VIEW {name}"
        _no_layout(plan, where, construct)
        return Dataset("mv", name, plan.originalText(), where, construct, _props(plan.tableSpec()),
                       _option(plan.tableSpec().comment()))
    if kind == "CreateStreamingTableAsSelect":
        name = _name(plan.name(), where)
        construct = f"CREATE STREAMING TABLE {name}"
        _no_layout(plan, where, construct)
        return Dataset("st", name, plan.originalText(), where, construct, _props(plan.tableSpec()))
    if kind == "CreateStreamingTable":
        name = _name(plan.name(), where)
        construct = f"CREATE STREAMING TABLE {name}"
        if plan.partitioning().size():
            raise ConfigError(f"{where}: {construct}: PARTITIONED BY is not mapped (stream tables are not "
                              "partitioned); remove it")
        cols = plan.columns()
        columns = "\n".join(f"{cols.apply(i).name()} {cols.apply(i).dataType().sql()}" for i in range(cols.size()))
        return Dataset("st_target", name, columns, where, construct, _props(plan.tableSpec()))
    if kind == "CreateFlowCommand":
        op = plan.flowOperation()
        construct = f"CREATE FLOW {_name(plan.name(), where)}"
        target = ".".join(_seq(op.table().multipartIdentifier())) if op.getClass().getSimpleName() == \
            "InsertIntoStatement" else ""
        m = re.search(r"\bBY\s+NAME\b(.*)\Z", text, re.I | re.S)
        if not target or m is None:
            raise ConfigError(f"{where}: {construct}: only INSERT INTO <table> BY NAME flows are mapped")
        return Dataset("flow", target, m.group(1).strip(), where, construct)
    if kind == "CreateViewCommand" and "Temp" in plan.viewType().toString():
        name = ".".join(_seq(plan.name().nameParts()))
        construct = f"CREATE TEMPORARY VIEW {name}"
        if plan.userSpecifiedColumns().size():
            raise ConfigError(f"{where}: {construct}: a column list is not mapped; name the columns in the query "
                              "(SELECT a AS x, ...)")
        query = _option(plan.originalText()) or ""
        return Dataset("view", name, query, where, construct)
    why = {
        "CreateView": "a persisted view is published to the catalog by SDP; spark-trickle only inlines temporary "
                      "views: use CREATE TEMPORARY VIEW, or a materialized view",
        "SetCommand": "per-flow Spark settings are not mapped: put the setting in the spec's 'configuration'",
        "SetNamespaceCommand": "stream tables live in the session's default database: qualify names instead",
        "SetCatalogCommand": "stream tables live in the session's default catalog",
    }.get(kind, f"SDP parses it as {kind}, which is no dataset declaration spark-trickle maps")
    raise ConfigError(f"{where}: {head!r}: not supported: {why}")


def _no_layout(plan: Any, where: str, construct: str) -> None:
    """Columns, partitioning and format belong to SDP's table writer; a stream table has none of them."""
    if plan.columns().size():
        raise ConfigError(f"{where}: {construct}: a column list is not mapped: a stream table's columns are its "
                          "query's; name them in the query (SELECT a AS x, ...)")
    if plan.partitioning().size():
        raise ConfigError(f"{where}: {construct}: PARTITIONED BY is not mapped (stream tables are not "
                          "partitioned); remove it")
    provider = _option(plan.tableSpec().provider())
    if provider is not None and provider.lower() != "delta":
        raise ConfigError(f"{where}: {construct}: USING {provider} is not mapped: stream tables are Delta tables")


def _read_streams(spark: Any, d: Dataset) -> Dataset:
    """``d`` with ``STREAM(t)`` read as ``t`` where the declaration streams (a streaming table, a flow); a
    materialized view or a view that reads a stream does not map (SDP refuses it too). Which relations
    stream is Spark's parser's answer (an ``UnresolvedRelation`` with ``isStreaming``, CTEs included in
    the plan's tree string), so a column named ``stream`` is never taken for one."""
    if d.kind not in ("mv", "st", "view", "flow"):
        return d
    try:
        tree = spark._jsparkSession.sessionState().sqlParser().parsePlan(d.query).treeString()
    except Exception as e:  # noqa: BLE001 - ParseException: Spark names the position
        raise ConfigError(f"{d.where}: {d.construct}: {_java_message(e)}") from None
    streams = sorted({m.replace(", ", ".") for m in re.findall(r"UnresolvedRelation \[([^\]]*)\], \[[^\]]*\], true",
                                                               tree)})
    if streams and d.kind in ("mv", "view"):
        raise ConfigError(f"{d.where}: {d.construct}: reads STREAM({', '.join(streams)}): a materialized view or "
                          "a view reads tables, not streams; read the table without STREAM, or declare a "
                          "streaming table")
    if not streams and d.kind in ("st", "flow"):
        raise ConfigError(f"{d.where}: {d.construct}: its query reads no STREAM(source): only a streaming table "
                          "over STREAM(<Delta table>) maps (to an IMMEDIATE stream table); use a materialized "
                          "view for a batch query")
    query = d.query
    for name in streams:
        ident = r"\s*\.\s*".join(rf"`?{re.escape(p)}`?" for p in name.split("."))
        query = re.sub(rf"\bSTREAM\s*\(\s*({ident})\s*\)|\bSTREAM\s+({ident})\b",
                       lambda m: m.group(1) or m.group(2), query, flags=re.I)
    return replace(d, query=query.strip())


def _attach_flows(datasets: list[Dataset]) -> list[Dataset]:
    """A query-less streaming table takes the query of the one flow that feeds it (an IMMEDIATE stream
    table), or is a Kafka source with ``trickle.kafka.*`` properties; flows go away."""
    flows: dict[str, list[Dataset]] = {}
    for d in datasets:
        if d.kind == "flow":
            flows.setdefault(d.name.lower(), []).append(d)
    out: list[Dataset] = []
    for d in datasets:
        if d.kind == "flow":
            if not any(t.kind in ("st_target", "st") and t.name.lower() == d.name.lower() for t in datasets):
                raise ConfigError(f"{d.where}: {d.construct}: its target {d.name} is no streaming table declared "
                                  "in the project (CREATE STREAMING TABLE)")
            continue
        if d.kind != "st_target":
            if d.kind == "st" and d.name.lower() in flows:
                f = flows[d.name.lower()][0]
                raise ConfigError(f"{f.where}: {f.construct}: {d.name} already has its query ({d.where}); a "
                                  "streaming table fed by several flows is not mapped")
            out.append(d)
            continue
        feeding = flows.get(d.name.lower(), [])
        kafka = any(k.startswith("trickle.kafka.") for k in d.properties)
        if kafka and not feeding:
            out.append(replace(d, kind="kafka"))
        elif len(feeding) == 1 and not kafka:
            out.append(replace(d, kind="st", query=feeding[0].query, where=feeding[0].where))
        elif kafka:
            raise ConfigError(f"{d.where}: {d.construct}: a Kafka source (trickle.kafka.* properties) is filled "
                              f"by trickle from its topic; remove the flow at {feeding[0].where}")
        elif not feeding:
            raise ConfigError(f"{d.where}: {d.construct}: no flow writes it and it has no trickle.kafka.topic "
                              "property: give it a query (AS SELECT ... FROM STREAM(t)), one flow, or the "
                              f"properties of a Kafka source ({', '.join('trickle.kafka.' + k for k in KAFKA_PROPS)})")
        else:
            raise ConfigError(f"{feeding[1].where}: {feeding[1].construct}: {d.name} is fed by "
                              f"{len(feeding)} flows ({', '.join(f.where for f in feeding)}): a streaming table fed "
                              "by several flows is not mapped; write one query (UNION ALL) instead")
    return out


def _name(identifier: Any, where: str) -> str:
    parts = _seq(identifier.nameParts())
    if len(parts) != 1:
        raise ConfigError(f"{where}: qualified name {'.'.join(parts)}: stream tables live in the session's "
                          "default database; use a bare name")
    return parts[0]


def _seq(seq: Any) -> list[str]:
    return [str(seq.apply(i)) for i in range(seq.size())]


def _option(opt: Any) -> str | None:
    return str(opt.get()) if opt is not None and opt.isDefined() else None


def _props(table_spec: Any) -> dict[str, str]:
    it = table_spec.properties().iterator()
    out: dict[str, str] = {}
    while it.hasNext():
        kv = it.next()
        out[str(kv._1())] = str(kv._2())
    return out


# --- Python: read with ast, never run


_PY_KINDS = {"materialized_view": "mv", "temporary_view": "view", "table": "st"}


def _python_datasets(text: str, file: str) -> list[Dataset]:
    """The ``@dp.materialized_view`` / ``@dp.temporary_view`` / ``@dp.table`` functions of a Python file
    whose body is ``return spark.sql("<SQL>")``. SDP runs such a function to get a DataFrame; a DataFrame
    built by Python code has no SQL text to maintain, so only a literal SQL string maps."""
    try:
        tree = ast.parse(text, filename=file)
    except SyntaxError as e:
        raise ConfigError(f"{file}:{e.lineno}: not valid Python: {e.msg}") from None
    modules, names = _sdp_aliases(tree)

    def sdp_api(node: ast.expr) -> str | None:
        target = node.func if isinstance(node, ast.Call) else node
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in modules:
            return target.attr
        if isinstance(target, ast.Name) and target.id in names:
            return names[target.id]
        return None

    out: list[Dataset] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and sdp_api(node) in ("create_streaming_table", "create_sink"):
            raise ConfigError(f"{file}:{node.lineno}: dp.{sdp_api(node)}(...): not supported: a streaming table "
                              "or sink filled by Python flows has no SQL query to maintain; declare it in SQL "
                              "(CREATE STREAMING TABLE ... AS SELECT ... FROM STREAM(t))")
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for deco in node.decorator_list:
            api = sdp_api(deco)
            if api is None:
                continue
            where = f"{file}:{deco.lineno}"
            if api not in _PY_KINDS:
                raise ConfigError(f"{where}: @dp.{api} on {node.name}(): not supported: only "
                                  "@dp.materialized_view, @dp.temporary_view and @dp.table functions that return "
                                  "spark.sql(\"...\") map to stream tables")
            out.append(_python_dataset(node, deco, api, where))
    return out


def _sdp_aliases(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names bound to ``pyspark.pipelines`` (``from pyspark import pipelines as dp``) and to its functions
    (``from pyspark.pipelines import materialized_view``)."""
    modules: set[str] = set()
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == _SDP_MODULE and a.asname:
                    modules.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if node.module == "pyspark" and a.name == "pipelines":
                    modules.add(a.asname or a.name)
                elif node.module == _SDP_MODULE:
                    names[a.asname or a.name] = a.name
    return modules, names


def _python_dataset(fn: ast.FunctionDef | ast.AsyncFunctionDef, deco: ast.expr, api: str, where: str) -> Dataset:
    kind = _PY_KINDS[api]
    construct = f"@dp.{api} {fn.name}()"
    kwargs: dict[str, Any] = {}
    if isinstance(deco, ast.Call):
        for kw in deco.keywords:
            try:
                kwargs[str(kw.arg)] = ast.literal_eval(kw.value)
            except ValueError:
                raise ConfigError(f"{where}: {construct}: argument {kw.arg}= must be a literal to be read without "
                                  "running the file") from None
    unmapped = sorted(set(kwargs) - {"name", "comment", "table_properties"})
    if unmapped:
        raise ConfigError(f"{where}: {construct}: argument(s) {', '.join(unmapped)} not mapped: a stream table's "
                          "columns, layout and format are its own (Delta, the query's columns)")
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                       and isinstance(s.value.value, str))]  # the docstring
    sql = None
    if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call):
        call = body[0].value
        if isinstance(call.func, ast.Attribute) and call.func.attr == "sql" and len(call.args) == 1 \
                and not call.keywords and isinstance(call.args[0], ast.Constant) \
                and isinstance(call.args[0].value, str):
            sql = call.args[0].value
    if sql is None:
        raise ConfigError(f"{where}: {construct}: not supported: its body must be a single `return "
                          "spark.sql(\"<SQL>\")` with a literal string. spark-trickle maintains SQL queries and "
                          "reads Python files without running them, so a DataFrame built by Python code (or SQL "
                          "built at run time, an f-string) cannot be maintained incrementally; write the query "
                          "as SQL")
    name = str(kwargs.get("name") or fn.name)
    construct = f"@dp.{api} {name}"
    props = {str(k): str(v) for k, v in (kwargs.get("table_properties") or {}).items()}
    return Dataset(kind, name, sql, where, construct, props, kwargs.get("comment"))


# ------------------------------------------------------------------------------------------------ create


def create(st: StreamTables, project: SdpProject, log: Any, stop: threading.Event | None = None) -> None:
    """Register the temporary views and create the stream tables (each after what it reads), or bring an
    existing one to the project's definition (a changed query is an ALTER: re-initialized, see
    :mod:`pipeline.alter`). Errors name the declaration's file and line."""
    tables = {s.name.lower(): s for s in project.conf.stream_tables}
    views = {v.name.lower(): v for v in project.views}
    done: set[str] = set()
    existing = {d.name: d for d in st.catalog.all()}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in done or (stop is not None and stop.is_set()):
            return
        if name in trail:
            raise ConfigError(f"{project.origins[name].where}: {project.origins[name].construct}: cycle "
                              f"{' -> '.join(trail + (name,))}")
        done.add(name)
        query = tables[name].query if name in tables else views[name].query
        for ref in _reads(query):
            if ref in tables or ref in views:
                visit(ref, trail + (name,))
        origin = project.origins[name]
        try:
            if name in views:
                st.spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {origin.name} AS {origin.query}")
            else:
                _create_table(st, tables[name], existing.get(name), log)
        except UnsupportedError as e:
            raise UnsupportedError(e.construct, f"{origin.where}: {origin.construct}: {e}") from None
        except TrickleError as e:
            raise type(e)(f"{origin.where}: {origin.construct}: {e}") from None
        except Exception as e:  # noqa: BLE001 - Spark's AnalysisException for a view: name the declaration
            raise ConfigError(f"{origin.where}: {origin.construct}: {_java_message(e)}") from None

    for name in [*views, *tables]:
        visit(name, ())


def _create_table(st: StreamTables, spec: StreamTableSpec, current: Any, log: Any) -> None:
    if current is None:
        st.create_stream_table(spec.name, spec.query, schedule=spec.schedule, refresh_mode=spec.refresh_mode,
                               dialect=spec.dialect)
        log.event("created", name=spec.name, refresh_mode=spec.refresh_mode, schedule=spec.schedule)
        return
    was = replace(spec, query=current.query, schedule=current.schedule, refresh_mode=current.refresh_mode,
                  dialect=current.dialect)
    a = conf_reload.alter_to(was, spec, current.query, current.dialect)
    if a is not None:  # raised, not logged as conf_reload.apply does: the caller names the declaration
        st.alter_stream_table(spec.name, schedule=a.schedule, refresh_mode=a.refresh_mode, query=a.query,
                              dialect=a.dialect)
        log.event("altered", name=spec.name, query_changed=a.query is not None, schedule=a.schedule,
                  refresh_mode=a.refresh_mode)
