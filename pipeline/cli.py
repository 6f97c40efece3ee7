"""The ``trickle`` command line: the public API (:class:`pipeline.StreamTables`) from a shell.

Every subcommand maps to one API call so that what works in Python works from a shell script or a cron
job, and the long-running job (``trickle run CONF``) is the same code path users test interactively.
Starting Spark takes seconds, so pyspark and the API are imported only inside the commands: ``trickle
--help`` and argument errors stay instant.

Errors the product raises on purpose (:class:`pipeline.errors.TrickleError`: bad SQL, unknown table,
invalid conf...) are printed as ``error: <message>`` and exit with status 2, without a traceback, because
the message already says what to do. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import CatalogError, TrickleError
from pipeline.formatting import (
    HISTORY_COLUMNS,
    STATUS_COLUMNS,
    describe_refresh,
    epoch_to_datetime,
    format_table,
)
from pipeline.modes import USER_STATUSES, RefreshMode

if TYPE_CHECKING:  # only for type hints; importing these at runtime would start nothing but costs time
    from pyspark.sql import SparkSession

    from pipeline.api import StreamTables
    from pipeline.conf import TrickleConf

__all__ = ["main", "build_parser", "format_table", "resolve_warehouse", "register_warehouse_tables"]

EXIT_OK = 0
EXIT_ERROR = 2

#: the words ``--mode`` and ``--status`` take, as plain strings (argparse's error message shows their repr)
MODES = tuple(m.value for m in RefreshMode)
STATUSES = tuple(s.value for s in USER_STATUSES)

# --------------------------------------------------------------------------------------------- parser


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Add the options every subcommand understands.

    They are added both to the main parser and to each subparser so that ``trickle --warehouse W status``
    and ``trickle status --warehouse W`` both work. Subparsers use ``SUPPRESS`` defaults so that an
    option given before the subcommand is not overwritten by the subparser's default.
    """
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--warehouse",
        metavar="DIR",
        default=default,
        help="warehouse root (default: the conf file's warehouse, else $TRICKLE_WAREHOUSE, else ./warehouse)",
    )
    parser.add_argument(
        "--conf",
        metavar="CONF.yaml",
        default=default,
        help="conf file: Spark settings and warehouse (and stream tables for 'run')",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default if suppress else False,
        help="print machine-readable JSON instead of text tables",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        default=default if suppress else None,
        help="strict mode: a refresh that would fall back from DIFFERENTIAL to FULL fails instead, and "
        "AUTO refuses at create a query it could only refresh FULL (default: the Spark conf "
        "trickle.refresh.strict, false)",
    )
    parser.add_argument(
        "--allow-circular",
        action="store_true",
        default=default if suppress else None,
        help="let stream tables read each other in cycles through monotone edges, evaluated to their least "
        "fixpoint (default: the conf file's allow_circular, else the Spark conf trickle.cycles.allowCircular, "
        "false)",
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        default=default if suppress else "ERROR",
        help="Spark log level (default ERROR)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree; kept separate from :func:`main` so tests and docs can introspect it."""
    parser = argparse.ArgumentParser(
        prog="trickle",
        description="Stream tables for Apache Spark: SQL-defined Delta tables kept fresh incrementally.",
    )
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _global_options(p, suppress=True)
        return p

    p = add("create", "create a stream table from a SQL query")
    p.add_argument("name")
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--query", metavar="SQL", help="the defining query (Spark SQL)")
    q.add_argument("--query-file", metavar="FILE", help="read the defining query from FILE ('-' = stdin)")
    p.add_argument("--schedule", help="refresh interval such as 30s, 5m, 1h30m (API default: 1m)")
    p.add_argument("--mode", type=str.upper, choices=MODES, help="refresh mode (API default: AUTO)")
    p.add_argument("--dialect", help="the SQL dialect the query is written in, a sqlglot name such as postgres "
                   "(default: spark)")
    p.add_argument(
        "--no-initialize",
        action="store_true",
        help="register only; the first refresh populates the table",
    )
    _progress_option(p)

    p = add("alter", "change a stream table's schedule, refresh mode, status or defining query")
    p.add_argument("name")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--query", metavar="SQL", help="a new defining query: checked first, then the table is "
                   "re-initialized (REINITIALIZE) and its dependents re-checked")
    q.add_argument("--query-file", metavar="FILE", help="read the new defining query from FILE ('-' = stdin)")
    p.add_argument("--schedule")
    p.add_argument("--mode", type=str.upper, choices=MODES)
    p.add_argument("--status", type=str.upper, choices=STATUSES)
    p.add_argument("--dialect", help="the SQL dialect the (new) query is written in, a sqlglot name such as "
                   "postgres; a change of dialect re-initializes the table like a new query")

    p = add("drop", "drop a stream table (fails if other stream tables read it)")
    p.add_argument("name")

    p = add("refresh", "refresh a stream table now (its stale upstream stream tables first)")
    p.add_argument("name")
    _progress_option(p)

    p = add("status", "list stream tables: status, staleness, refresh times and counts, errors, Kafka lag")
    p.add_argument("--watch", metavar="SECONDS", nargs="?", type=float, const=2.0, default=None,
                   help="redraw the view in place every SECONDS (default 2) until Ctrl-C")

    p = add("dag", "draw the dependency graph of sources and stream tables")
    p.add_argument("--out", metavar="FILE", help="also write it: FILE.dot (Graphviz DOT), FILE.png/.svg/.pdf "
                   "(with Graphviz's dot, else matplotlib)")

    p = add("history", "show a stream table's refresh history, newest first")
    p.add_argument("name")
    p.add_argument("--limit", type=int, default=20, help="number of refreshes to show (default 20)")

    p = add("explain", "show the operator tree and delta SQL of a stream table or a query")
    p.add_argument("name", help="stream table name, or a SQL query")

    p = add("maintain", "Delta housekeeping now: compact, checkpoint, VACUUM and clean the logs of stream "
                        "tables (and of a conf file's Kafka mirrors), keeping what frontiers still read")
    p.add_argument("names", nargs="*", metavar="NAME", help="stream tables to maintain (default: all)")
    p.add_argument("--sources", action="store_true",
                   help="also maintain the base Delta tables the stream tables read (your own tables)")

    p = add("run", "run the pipeline of a conf file, or of a Spark Declarative Pipelines project (its "
                   "spark-pipeline.yml, or its folder), until SIGINT/SIGTERM")
    p.add_argument("run_conf", metavar="CONF.yaml|SPEC", help="a conf file, or an SDP spec or project folder: its "
                   "materialized views become stream tables (see pipeline/sdp.py)")
    p.add_argument("--metrics-port", metavar="PORT", type=int, default=None,
                   help="serve Prometheus metrics on PORT (default: the conf's runtime.metrics_port; 0: off)")
    p.add_argument("--ui", metavar="[HOST:]PORT", default=None,
                   help="also serve the pipeline's web page on PORT (host 127.0.0.1 unless given, e.g. "
                   "0.0.0.0:8421; port 0: any free one)")

    p = add("ui", "serve the pipeline's web page for a warehouse, read-only, until Ctrl-C: the DAG, each "
                  "table's status, staleness and refresh times, errors, and a table's history")
    p.add_argument("--port", metavar="[HOST:]PORT", default=None,
                   help="where to serve it (default 127.0.0.1:8421; 0.0.0.0:PORT for other machines)")

    add("demo", "run the org-chart tutorial on a local warehouse (no servers needed)")
    _add_compat_commands(add)
    return parser


def _progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true",
                   help="show the progress bar of long refreshes even when stderr is not a terminal")


# ------------------------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``trickle`` command and return its exit status (0 ok, 2 error).

    Argument errors exit through argparse (status 2 with a usage line), like every other CLI.
    """
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except TrickleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _dispatch(args: argparse.Namespace) -> int:
    conf_path = args.run_conf if args.command == "run" else args.conf
    sdp_spec = _sdp_spec(conf_path) if args.command == "run" else None
    conf = _sdp_conf(sdp_spec) if sdp_spec else _load_conf(conf_path) if conf_path else None
    warehouse = resolve_warehouse(args.warehouse, conf)

    if args.command == "demo":
        from pipeline.demo import run_demo

        run_demo(str(warehouse), spark_conf=conf.spark if conf else None, log_level=args.log_level)
        return EXIT_OK
    if args.command == "dag":  # the catalog alone: no Spark
        return _cmd_dag(args, warehouse, conf)
    if args.command == "ui":  # the catalog and Delta logs, read as files: Spark only for a remote store
        return _cmd_ui(args, warehouse, conf)

    handlers: dict[str, Callable[[argparse.Namespace, StreamTables, TrickleConf | None], int]] = {
        "create": _cmd_create,
        "alter": _cmd_alter,
        "drop": _cmd_drop,
        "refresh": _cmd_refresh,
        "status": _cmd_status,
        "history": _cmd_history,
        "explain": _cmd_explain,
        "run": _cmd_run,
        "maintain": _cmd_maintain,
        **_COMPAT_HANDLERS,
    }
    handler = handlers[args.command]
    # Validate everything that needs no Spark before paying for its start-up.
    if args.command == "alter" and args.schedule is None and args.mode is None and args.status is None \
            and args.query is None and args.query_file is None and args.dialect is None:
        raise TrickleError("alter: give at least one of --query (or --query-file), --dialect, --schedule, --mode, "
                           "--status")
    if args.command == "create" or (args.command == "alter" and (args.query, args.query_file) != (None, None)):
        args.query_text = _read_query(args)
    if args.command in ("create", "alter") and args.dialect is not None:
        import dvm

        args.dialect = dvm.check_dialect(args.dialect)  # a misspelt dialect fails before Spark starts
    if args.command == "run" and conf is not None:
        from pipeline.runtime import check_kafka_reachable

        check_kafka_reachable(conf)  # a Kafka source nobody listens for fails before Spark starts
    if args.command == "run" and args.ui is not None:
        from pipeline.ui import parse_address

        parse_address(args.ui)  # a bad address fails before Spark starts
    args.warehouse_path = warehouse

    spark, st = _open(
        warehouse,
        conf,
        app_name=f"trickle-{args.command}",
        log_level=args.log_level,
        register_sources=args.command in ("create", "explain", "run", "alter", "create-immv", "wait-for"),
        strict=args.strict,
        allow_circular=args.allow_circular,
    )
    try:
        if sdp_spec is not None:  # its SQL is parsed by SDP's parser, in Spark: only now
            from pipeline.runtime import check_kafka_reachable
            from pipeline.sdp import load_project

            args.sdp_project = load_project(sdp_spec, spark)
            conf = args.sdp_project.conf
            check_kafka_reachable(conf)
        return handler(args, st, conf)
    finally:
        _quiet_stop(spark)


def resolve_warehouse(cli_value: str | None, conf: TrickleConf | None) -> Path:
    """Warehouse precedence: ``--warehouse``, then the conf file, then ``$TRICKLE_WAREHOUSE``, then ./warehouse."""
    from connectors.storage import location  # a URI (s3a://...) is kept as written

    if cli_value:
        return location(cli_value)  # type: ignore[return-value]
    if conf is not None and conf.warehouse is not None:
        return conf.warehouse
    return location(os.environ.get("TRICKLE_WAREHOUSE") or "warehouse")  # type: ignore[return-value]


def _sdp_spec(path: str) -> Path | None:
    """The Spark Declarative Pipelines spec ``trickle run PATH`` means, or None for a conf file."""
    from pipeline.sdp import spec_path

    return spec_path(path)


def _sdp_conf(spec: Path) -> TrickleConf:
    from pipeline.sdp import spec_conf

    return spec_conf(spec)


def _load_conf(path: str) -> TrickleConf:
    from pipeline.conf import load_conf

    return load_conf(path)


def _open(
    warehouse: Path, conf: TrickleConf | None, app_name: str, log_level: str, register_sources: bool,
    strict: bool | None = None, allow_circular: bool | None = None,
) -> tuple[SparkSession, StreamTables]:
    """Start Spark (the slow part) and open the catalog rooted under the warehouse.

    ``register_sources``: also make the warehouse's plain Delta tables resolvable by name (needed by
    commands that analyse a query: create, explain, run). ``strict``: ``--strict`` (None: the Spark conf).
    """
    from pipeline.api import StreamTables
    from pipeline.session import spark_session

    spark = spark_session(
        app_name=app_name, warehouse=warehouse, conf=conf.spark if conf else None, log_level=log_level
    )
    _quiet_query_context_loggers(log_level)
    st = StreamTables(spark, strict=strict, allow_circular=allow_circular)
    if register_sources:
        register_warehouse_tables(spark, warehouse)
    return spark, st


def _quiet_query_context_loggers(log_level: str) -> None:
    """Silence pyspark's query-context loggers unless the user asked for INFO/DEBUG.

    pyspark logs every AnalysisException (with the JVM stack, as one JSON line) the moment it is raised,
    even when the API catches it and raises a clean QueryError. The CLI prints that QueryError as
    ``error: ...``; a screenful of JSON before it would bury the message.
    """
    if log_level.upper() in ("ALL", "TRACE", "DEBUG", "INFO"):
        return
    import logging

    from pyspark.logger import PySparkLogger

    # Created through PySparkLogger so that pyspark's own calls (which pass extra keyword arguments)
    # still find a PySparkLogger under these names.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def register_warehouse_tables(spark: SparkSession, warehouse: Path) -> list[str]:
    """Make the Delta tables stored directly under the warehouse resolvable by name in this session.

    The embedded default has no metastore: ``CREATE TABLE orders ... USING delta`` in one process (for
    example ``trickle demo``) leaves a folder ``<warehouse>/orders``, but the next process's session
    catalog starts empty, so a defining query that says ``FROM orders`` would not resolve. Each such
    folder is registered under its own name unless the name is already taken (stream tables are
    registered by :class:`StreamTables` and live under ``_trickle``). Returns the names registered.
    """
    import re

    registered: list[str] = []
    from connectors.storage import is_local

    if not is_local(warehouse):
        return _register_store_tables(spark, str(warehouse))
    if not warehouse.is_dir():
        return registered
    for folder in sorted(warehouse.iterdir()):
        name = folder.name
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) or not (folder / "_delta_log").is_dir():
            continue
        if spark.catalog.tableExists(name):
            continue
        if _register(spark, name, folder.resolve().as_posix()):
            registered.append(name)
    return registered


def _register(spark: SparkSession, name: str, location: str) -> bool:
    """Name the Delta table at ``location``; False for a folder whose first commit never landed (a kill inside
    ``CREATE TABLE``): it is no table yet, Delta refuses to name it, and whoever creates it clears it
    (:func:`connectors.delta_sink.create_owned`)."""
    quoted = location.replace("\\", "\\\\").replace("'", "\\'")
    try:
        spark.sql(f"CREATE TABLE IF NOT EXISTS `{name}` USING delta LOCATION '{quoted}'")
    except Exception as e:  # noqa: BLE001 - only this one refusal is expected; anything else is raised
        if "DELTA_CREATE_EXTERNAL_TABLE_WITHOUT_TXN_LOG" not in str(e):
            raise
        return False
    return True


def _register_store_tables(spark: SparkSession, warehouse: str) -> list[str]:
    """:func:`register_warehouse_tables` for a warehouse on a Hadoop file system (``s3a://...``): the same
    folders, listed through Spark's FileSystem."""
    import re

    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(warehouse)
    fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(root):
        return []
    registered: list[str] = []
    for status in fs.listStatus(root):
        name = status.getPath().getName()
        if not status.isDirectory() or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            continue
        if not fs.exists(jvm.org.apache.hadoop.fs.Path(status.getPath(), "_delta_log")) or spark.catalog.tableExists(name):
            continue
        if _register(spark, name, str(status.getPath().toString())):
            registered.append(name)
    return registered


def _quiet_stop(spark: SparkSession) -> None:
    """Stop Spark so the JVM exits promptly; a failure here must not hide the command's own result."""
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - shutting down; nothing useful to report
        pass


# -------------------------------------------------------------------------------------------- commands


def _read_query(args: argparse.Namespace) -> str:
    if args.query is not None:
        text = args.query
    elif args.query_file == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(args.query_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise TrickleError(
                f"cannot read --query-file {args.query_file!r}: {exc.strerror or exc}"
            ) from exc
    if not text.strip():
        raise TrickleError("the defining query is empty")
    return text.strip()


def _cmd_create(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    from pipeline.progress import progress, wanted

    kwargs: dict[str, Any] = {"initialize": not args.no_initialize}
    if args.schedule is not None:
        kwargs["schedule"] = args.schedule
    if args.mode is not None:
        kwargs["refresh_mode"] = args.mode
    if args.dialect is not None:
        kwargs["dialect"] = args.dialect
    with progress(st.spark, f"populating {args.name}", wanted(args.progress) and not args.no_initialize):
        st.create_stream_table(args.name, args.query_text, **kwargs)
    row = _status_of(st, args.name)
    if args.json:
        _print_json(row if row is not None else {"name": args.name})
    else:
        extra = f" ({row.get('refresh_mode')}, schedule {row.get('schedule')})" if row else ""
        print(f"created stream table {args.name}{extra}")
    return EXIT_OK


def _cmd_alter(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    st.alter_stream_table(args.name, schedule=args.schedule, refresh_mode=args.mode, status=args.status,
                          query=getattr(args, "query_text", None), dialect=args.dialect)
    row = _status_of(st, args.name)
    if args.json:
        _print_json(row if row is not None else {"name": args.name})
    else:
        print(f"altered stream table {args.name}")
        if row is not None:
            print(format_table([row], STATUS_COLUMNS))
    return EXIT_OK


def _cmd_drop(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    st.drop_stream_table(args.name)
    if args.json:
        _print_json({"name": args.name, "dropped": True})
    else:
        print(f"dropped stream table {args.name}")
    return EXIT_OK


def _cmd_refresh(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    from pipeline.progress import progress, wanted

    with progress(st.spark, f"refreshing {args.name}", wanted(args.progress)):
        result = st.refresh_stream_table(args.name)
    if args.json:
        _print_json(result)
    else:
        print(describe_refresh(result))
    return EXIT_OK


def _cmd_status(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    """The status view (:mod:`pipeline.monitor`); ``--watch``: redrawn in place until Ctrl-C."""
    if args.watch is None:
        _print_status(args, st, conf)
        return EXIT_OK
    if args.watch <= 0:
        raise TrickleError(f"status --watch: SECONDS must be positive, got {args.watch:g}")
    try:
        while True:
            sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: the view is redrawn in place
            print(f"trickle status  {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC  (every {args.watch:g} s; "
                  "Ctrl-C stops)\n")
            _print_status(args, st, conf)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        print()
    return EXIT_OK


def _print_status(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> None:
    from pipeline import monitor

    extra = {r["name"]: r for r in monitor.status_rows(st.spark, st.catalog)}
    rows = [{**r, **extra.get(str(r.get("name")), {})} for r in st.status()]
    if args.json:
        _print_json(rows)
    elif not rows:
        print("no stream tables")
    else:
        print(format_table(rows, monitor.STATUS_COLUMNS))
    if not args.json:
        _print_sources_status(conf, args.warehouse_path)


def _cmd_dag(args: argparse.Namespace, warehouse: Path, conf: TrickleConf | None) -> int:
    """``trickle dag``: the graph from the catalog (no Spark), and ``--out`` a DOT or PNG file."""
    from pipeline import dag
    from pipeline.catalog import Catalog
    from pipeline.conf import KafkaSourceSpec

    root = warehouse / "_trickle"
    defs = Catalog(root).all() if root.is_dir() else []
    topics = {s.name: s.topic for s in (conf.sources if conf else ()) if isinstance(s, KafkaSourceSpec)}
    g = dag.build(defs, topics)
    if args.json:
        _print_json({"nodes": [dataclasses.asdict(n) for n in g.nodes.values()],
                     "edges": [{"source": s, "reader": r} for s, r in g.edges]})
    else:
        print(dag.render_text(g))
    if args.out:
        how = dag.write(g, Path(args.out))
        if not args.json:
            print(f"\nwrote {args.out} ({how})")
    return EXIT_OK


def _cmd_ui(args: argparse.Namespace, warehouse: Path, conf: TrickleConf | None) -> int:
    """``trickle ui``: the web page (:mod:`pipeline.ui`) of a warehouse's pipeline, read-only, until Ctrl-C.
    A local warehouse needs no Spark (the catalog and the Delta logs are files); one on an object store
    is read through a Spark session, whose settings say how to reach it."""
    from connectors.storage import is_local
    from pipeline import ui

    address = args.port if args.port is not None else ui.DEFAULT_PORT
    ui.parse_address(address)
    spark = None
    if not is_local(warehouse):
        from pipeline.session import spark_session

        spark = spark_session(app_name="trickle-ui", warehouse=warehouse, conf=conf.spark if conf else None,
                              log_level=args.log_level)
    stop = threading.Event()
    try:
        page = ui.serve(ui.PipelineView.for_warehouse(warehouse, conf, spark), address)
        print(f"serving the pipeline page of {warehouse} at {page.url} (read-only; Ctrl-C stops)", flush=True)
        restore = _install_stop_handlers(stop)
        try:
            while not stop.wait(0.5):
                pass
        finally:
            restore()
            page.close()
    finally:
        if spark is not None:
            _quiet_stop(spark)
    return EXIT_OK


#: Columns of the Kafka sources' table under ``trickle status`` (written by ``trickle run``).
SOURCE_COLUMNS = ("name", "status", "since", "topic", "bootstrap_servers", "error", "schema_error")


def _print_sources_status(conf: TrickleConf | None, warehouse: Path) -> None:
    """The Kafka sources' state as the running (or last) ``trickle run`` of this warehouse wrote it: a
    source whose brokers stopped answering shows DOWN here, while its stream tables still look ACTIVE."""
    from pipeline.monitor import SOURCE_COLUMNS as MONITOR_SOURCE_COLUMNS
    from pipeline.monitor import source_rows
    from pipeline.runtime import read_sources_status

    doc = read_sources_status(conf.checkpoints if conf and conf.checkpoints else warehouse / "_checkpoints")
    if not doc or not doc.get("sources"):
        return
    print(f"\nKafka sources (trickle run, pid {doc.get('pid')}):")
    rows = [{**r, "since": epoch_to_datetime(r.get("since"))} for r in source_rows(doc)]
    print(format_table(rows, [*MONITOR_SOURCE_COLUMNS, *(c for c in SOURCE_COLUMNS if c not in MONITOR_SOURCE_COLUMNS)]))


def _cmd_history(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    rows = st.history(args.name, limit=args.limit)
    if not rows and _status_of(st, args.name) is None:
        raise CatalogError(f"stream table {args.name!r} does not exist")
    if args.json:
        _print_json(rows)
    elif not rows:
        print(f"no refreshes recorded for {args.name}")
    else:
        print(format_table(rows, HISTORY_COLUMNS))
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    text = st.explain(args.name)
    if args.json:
        _print_json({"name": args.name, "explain": text})
    else:
        print(text)
    return EXIT_OK


def _cmd_maintain(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    from pipeline import housekeeping

    reports = housekeeping.maintain(st, args.names or None, mirrors=housekeeping.mirror_paths(st.spark, conf),
                                    sources=args.sources)
    if args.json:
        _print_json([r.as_json() for r in reports])
    else:
        for r in reports:
            print(housekeeping.describe(r))
    return EXIT_OK


# ------------------------------------------------------------------------------------------ run (loop)


def _cmd_run(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    """Bring up a conf file's pipeline (:class:`pipeline.runtime.Runtime`) until SIGINT/SIGTERM."""
    from pipeline.runtime import Runtime

    assert conf is not None
    if args.metrics_port is not None:  # the flag wins over the conf's runtime.metrics_port
        conf = dataclasses.replace(conf, runtime=dataclasses.replace(conf.runtime, metrics_port=args.metrics_port))
    log = _Logger(json_lines=args.json)
    # Our handlers replace pyspark's (which cancels all jobs and raises KeyboardInterrupt), so a signal
    # never interrupts a refresh or a create half-way: the loop stops at the next safe point.
    stop = threading.Event()
    done = threading.Event()
    restore = _install_stop_handlers(stop)
    from pipeline.lease import run_lease

    lease = run_lease(st.catalog, args.run_conf)  # one run per conf file and warehouse (pipeline.lease)
    lease.acquire()
    lease.keep_renewed(lambda e: (log.error(str(e)), stop.set()))
    runtime = Runtime(st, conf, log, args.warehouse_path)
    remove_hook = _install_jvm_stop_hook(st.spark, stop, done, log)
    page = None
    try:
        if args.ui is not None:  # the web page (pipeline.ui), before the sources: it shows the start too
            from pipeline import ui

            page = ui.serve(ui.PipelineView.for_runtime(runtime), args.ui)
            log.event("ui", url=page.url)
        runtime.start_sources()
        if getattr(args, "sdp_project", None) is not None:  # views and tables in the SDP project's order
            from pipeline.sdp import create

            create(st, args.sdp_project, log, stop)
        runtime.create_stream_tables(stop)
        runtime.run(stop)
    finally:
        try:
            runtime.stop()
        finally:
            if page is not None:
                page.close()
            done.set()
            remove_hook()
            restore()
            lease.release()
    return EXIT_OK


#: How long a JVM shutdown (SIGTERM to spark-submit's JVM) waits for the pipeline to stop gracefully.
JVM_STOP_GRACE_S = 120.0


class _JvmStopHook:
    """A Spark shutdown hook implemented in Python (a py4j callback): when the *JVM* is told to stop —
    SIGTERM to spark-submit's driver JVM, or to the process group of ``trickle run`` — it asks the run loop
    to stop and waits until the streaming queries finished their micro-batches, before Spark's own hook
    stops the SparkContext under them (which would abort the batch in flight)."""

    def __init__(self, stop: threading.Event, done: threading.Event, log: _Logger) -> None:
        self.stop, self.done, self.log = stop, done, log
        self.called = threading.Event()  # the JVM is running this hook
        self.returning = threading.Event()  # ... and it is about to return

    def apply(self) -> None:
        self.called.set()
        try:
            if not self.done.is_set():
                self.log.event("jvm_shutdown", action="stopping the pipeline before Spark stops")
                self.stop.set()
                self.done.wait(JVM_STOP_GRACE_S)
        finally:
            self.returning.set()

    class Java:
        implements = ["scala.Function0"]


# Scala calls a Function0[Unit] through its specialised method, a name Python syntax cannot spell
setattr(_JvmStopHook, "apply$mcV$sp", _JvmStopHook.apply)


#: How long Python stays after the JVM's call of the stop hook returned, so that py4j can send the answer.
JVM_HOOK_ANSWER_S = 0.5


def _install_jvm_stop_hook(
    spark: Any, stop: threading.Event, done: threading.Event, log: _Logger
) -> Callable[[], None]:
    """Register :class:`_JvmStopHook`; returns the function that unregisters it, to call once the pipeline
    stopped and before Python exits.

    Why unregister: the JVM outlives Python by a moment (it exits when pyspark closes the gateway) and then
    runs its shutdown hooks; a hook implemented in Python would fail there with an uncaught
    ``Py4JException: Error while obtaining a new communication channel``, since nothing answers any more.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    manager = gateway.jvm.org.apache.spark.util.ShutdownHookManager
    # higher priority runs first: before the local executor's own stop hook (default priority) and the
    # one that stops the SparkContext
    priority = max(manager.DEFAULT_SHUTDOWN_PRIORITY(), manager.SPARK_CONTEXT_SHUTDOWN_PRIORITY()) + 10
    hook = _JvmStopHook(stop, done, log)
    ref = manager.addShutdownHook(priority, hook)

    def remove() -> None:
        try:
            manager.removeShutdownHook(ref)
        except Exception:  # noqa: BLE001 - the JVM may be gone already; then no hook can run either
            pass
        if hook.called.is_set() and hook.returning.wait(JVM_STOP_GRACE_S):
            time.sleep(JVM_HOOK_ANSWER_S)  # the JVM is waiting for this call's answer: let py4j send it

    return remove


def _install_stop_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGINT/SIGTERM ask the loop to stop after the refresh in progress; a second one aborts at once.

    A repeat within a second is ignored: tools such as ``timeout`` signal both the process and its group,
    which would otherwise turn one request into an abort.
    """
    first: list[float] = []

    def handler(signum: int, frame: object) -> None:
        now = time.monotonic()
        if first and now - first[0] > 1.0:
            raise KeyboardInterrupt
        if not first:
            first.append(now)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, h in previous.items():
            signal.signal(sig, h)

    return restore


class _Logger:
    """One line per event on stdout (text or JSON lines), so ``run`` output can be tailed or parsed."""

    def __init__(self, json_lines: bool) -> None:
        self.json_lines = json_lines

    def event(self, what: str, **fields: Any) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.json_lines:
            print(json.dumps({"ts": stamp, "event": what, **fields}, default=str), flush=True)
        else:
            tail = " ".join(f"{k}={v}" for k, v in fields.items())
            print(f"{stamp} {what} {tail}".rstrip(), flush=True)

    def refresh(self, result: Any, note: str | None = None) -> None:
        """One refresh; ``note`` flags a result to read with care (say, a source that is DOWN)."""
        if self.json_lines:
            self.event("refresh", **_jsonable(result), **({"note": note} if note else {}))
        else:
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            tail = f" [{note}]" if note else ""
            print(f"{stamp} refresh {describe_refresh(result)}{tail}", flush=True)

    def error(self, message: str) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{stamp} error: {message}", file=sys.stderr, flush=True)


def _jsonable(obj: Any) -> Any:
    """Plain JSON types for API results (dataclasses, Rows, datetimes, Decimals)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "asDict"):  # pyspark Row
        return _jsonable(obj.asDict(recursive=True))
    if hasattr(obj, "_asdict"):  # NamedTuple
        return _jsonable(obj._asdict())
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, dt.datetime | dt.date):
        return obj.isoformat()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


def _print_json(obj: Any) -> None:
    print(json.dumps(_jsonable(obj), indent=2))


def _status_of(st: StreamTables, name: str) -> dict[str, Any] | None:
    for row in st.status():
        if row.get("name") == name:
            return dict(row)
    return None


# ------------------------------------------------- read-your-writes and pg_ivm compatibility (issue 20)


def _add_compat_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """``wait-for`` (:mod:`pipeline.read_your_writes`) and pg_ivm's functions as commands
    (:mod:`pipeline.pg_ivm`): ``create-immv``, ``refresh-immv``, ``get-immv-def``, ``pg-ivm-immv``."""
    p = add("wait-for", "wait until a stream table reflects a version of a base table a writer committed "
                        "(read-your-writes for writers outside the API)")
    p.add_argument("name", help="stream table")
    p.add_argument("source", help="the base table written, by name or as delta.`/path`")
    p.add_argument("version", type=int, help="the Delta version the writer committed")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait at most (default 60)")
    p.add_argument("--wait-only", action="store_true",
                   help="never refresh here: another process (trickle run) maintains the table (default: "
                   "refresh it here when it is behind)")

    p = add("create-immv", "pg_ivm's create_immv: create an IMMEDIATE stream table, populated now; prints its "
                           "row count (`trickle run` maintains it)")
    p.add_argument("name")
    p.add_argument("query", help="the view definition (Spark SQL)")

    p = add("refresh-immv", "pg_ivm's refresh_immv: replace the contents and resume maintenance, or with "
                            "--no-data empty it and stop maintaining it; prints the row count")
    p.add_argument("name")
    p.add_argument("--no-data", action="store_true", help="WITH NO DATA: unpopulate (pg_ivm with_data=false)")

    p = add("get-immv-def", "pg_ivm's get_immv_def: print the defining query")
    p.add_argument("name")

    add("pg-ivm-immv", "pg_ivm's pg_ivm_immv catalog: the IMMEDIATE stream tables (immvrelid, viewdef, "
                       "ispopulated, lastivmupdate)")


def _cmd_wait_for(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    got = st.wait_for(args.name, args.source, args.version, timeout=args.timeout,
                      refresh=False if args.wait_only else None)
    if args.json:
        _print_json({"name": args.name, **got})
    else:
        print(f"{args.name} reflects version {args.version} of {args.source} (or later) at its version "
              f"{got['version']}")
    return EXIT_OK


def _cmd_create_immv(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    n = st.create_immv(args.name, args.query, start=False)  # this process exits: `trickle run` maintains it
    if args.json:
        _print_json({"create_immv": n})
    else:
        print(n)
    return EXIT_OK


def _cmd_refresh_immv(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    n = st.refresh_immv(args.name, with_data=not args.no_data, start=False)
    if args.json:
        _print_json({"refresh_immv": n})
    else:
        print(n)
    return EXIT_OK


def _cmd_get_immv_def(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    text = st.get_immv_def(args.name)
    if args.json:
        _print_json({"name": args.name, "get_immv_def": text})
    else:
        print(text)
    return EXIT_OK


def _cmd_pg_ivm_immv(args: argparse.Namespace, st: StreamTables, conf: TrickleConf | None) -> int:
    from pipeline import pg_ivm

    columns = ("immvrelid", "viewdef", "ispopulated", "lastivmupdate")
    rows = [dict(zip(columns, r, strict=True)) for r in pg_ivm.catalog_rows(st)]
    if args.json:
        _print_json(rows)
    else:
        print(format_table(rows, columns) if rows else "no IMMVs (IMMEDIATE stream tables)")
    return EXIT_OK


_COMPAT_HANDLERS: dict[str, Callable[[argparse.Namespace, StreamTables, TrickleConf | None], int]] = {
    "wait-for": _cmd_wait_for,
    "create-immv": _cmd_create_immv,
    "refresh-immv": _cmd_refresh_immv,
    "get-immv-def": _cmd_get_immv_def,
    "pg-ivm-immv": _cmd_pg_ivm_immv,
}


if __name__ == "__main__":  # `python -m pipeline.cli ...` works without the console script installed
    sys.exit(main())
