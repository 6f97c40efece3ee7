"""The public Python API: :class:`StreamTables` over a SparkSession."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import dvm
from connectors import delta_sink, log_checkpoints
from connectors.delta_log import DeltaLog
from connectors.storage import strip_file_scheme
from dvm import PREV, quote
from pipeline import alter, cycles, fixpoints, metastore, pg_ivm, read_your_writes, strata
from pipeline.catalog import (
    NAME_MAX_LENGTH,
    NAME_RE,
    Catalog,
    SourceInfo,
    StreamTableDef,
    validate_mode,
    validate_name,
)
from pipeline.errors import CatalogError, QueryError, SourceError, UnsupportedError
from pipeline.immediate import start_immediate
from pipeline.modes import DELTA_ONLY_MODES, USER_STATUSES, RefreshMode, TableStatus
from pipeline.refresh import Refresher, RefreshResult
from pipeline.schedule import DEFAULT_SCHEDULE, validate_schedule

__all__ = ["StreamTables", "RefreshResult"]

_BAD_COLUMN_CHARS = set(" ,;{}()\n\t=")


def _path_source(key: str) -> tuple[str, str] | None:
    """``(format, path)`` when the source key names a table by path (``delta.`/data/t``` is the key
    ``delta./data/t``, see :func:`dvm.parser.table_key`), else None: such a key is no name Spark's catalog
    can look up, so it is resolved by its path."""
    fmt, dot, path = key.partition(".")
    return (fmt, path) if dot and "/" in path else None


def _warehouse(spark: Any) -> str:
    return strip_file_scheme(spark.conf.get("spark.sql.warehouse.dir"))


class StreamTables:
    """Stream tables of one catalog.

    ``root`` is the catalog directory (default ``<warehouse>/_trickle``). ``strict=True`` makes every
    refresh that would fall back from DIFFERENTIAL to FULL fail instead, and AUTO refuse at create a query
    it could only refresh FULL; ``None`` (default) takes the Spark conf ``trickle.refresh.strict``.

    ``allow_circular=True`` lets stream tables read each other in cycles through monotone edges, evaluated
    to their least fixpoint in at most ``max_fixpoint_iterations`` rounds (default 100; see
    :mod:`pipeline.cycles`); ``None`` takes the Spark conf ``trickle.cycles.allowCircular`` /
    ``trickle.cycles.maxFixpointIterations``.
    """

    def __init__(self, spark: Any, root: str | None = None, strict: bool | None = None,
                 allow_circular: bool | None = None, max_fixpoint_iterations: int | None = None) -> None:
        self.spark = spark
        self.catalog = Catalog(root or f"{_warehouse(spark)}/_trickle")
        self.refresher = Refresher(spark, self.catalog, strict=strict)
        self.cycles = cycles.Settings.resolve(spark, allow_circular, max_fixpoint_iterations)
        self.refresher.cycles = self.cycles  # read by pipeline.cycles when it refreshes a cycle
        self.refresher.refresh_cycle = cycles.refresh_component
        self._queries: dict[str, Any] = {}
        self._register_all()

    # --- names in the session catalog ---

    def _register_all(self) -> None:
        """Make stream tables and their sources resolvable by name in this session."""
        for d in self.catalog.all():
            for key, src in d.sources.items():
                if src.kind == "delta" and _path_source(key) is None:  # a path is read as written
                    self._register(key, src.path)
            self._register(d.name, d.path)
            self._publish(d.name, d.path)

    def _publish(self, name: str, path: str) -> None:
        """Also register the stream table in the metastore database ``trickle.metastore.database``, if set
        (see :mod:`pipeline.metastore`), once it has a Delta log."""
        if metastore.database(self.spark) and DeltaLog(self.spark, path).latest_version() is not None:
            metastore.publish(self.spark, name, path)

    def _register(self, name: str, path: str) -> None:
        if DeltaLog(self.spark, path).latest_version() is None:
            return
        if not self.spark.catalog.tableExists(name):
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{path}'")

    # --- sources ---

    def _resolve_source(self, key: str, creating: str) -> tuple[SourceInfo, list[tuple[str, str]]]:
        """The source ``key`` of a query: a stream table, a Delta table by name, or a Delta table by path
        (``delta.`/data/t```, resolved like a named one; its Change Data Feed must be on too)."""
        if key == creating:
            raise CatalogError(f"stream table {creating} cannot read itself (cycle {creating} -> {creating})")
        by_path = _path_source(key)
        if by_path is not None:
            fmt, path = by_path
            ref = f"{fmt}.{quote(path)}"
            if fmt != "delta":
                raise SourceError(f"source {ref} reads files as {fmt}, not a Delta table; stream tables read Delta "
                                  "tables with Change Data Feed: write the data as a Delta table (with "
                                  f"delta.enableChangeDataFeed = true) and read it as delta.{quote(path)} or by "
                                  "name")
            try:
                detail = self.spark.sql(f"DESCRIBE DETAIL {ref}").collect()[0].asDict()
            except Exception as e:  # AnalysisException: nothing (or no Delta table) at the path
                raise SourceError(f"source {ref}: no Delta table at {path} ({_clean(e)}); create it there (with "
                                  "delta.enableChangeDataFeed = true) or correct the path") from None
        else:
            if self.catalog.exists(key):
                up = self.catalog.get(key)
                return SourceInfo(up.path, "stream_table"), list(zip(up.names, up.types, strict=True))
            try:
                exists = self.spark.catalog.tableExists(key)
            except Exception:  # noqa: BLE001 - ParseException: not a name the catalog can look up
                exists = False
            if not exists:
                raise QueryError(f"unknown table {key}: create it as a Delta table (with "
                                 "delta.enableChangeDataFeed = true) before using it as a source")
            ref = key
            detail = self.spark.sql(f"DESCRIBE DETAIL {key}").collect()[0].asDict()
        if (detail.get("format") or "").lower() != "delta":
            raise SourceError(f"source {ref} is not a Delta table (format {detail.get('format')}); stream "
                              "tables read Delta tables with Change Data Feed")
        props = detail.get("properties") or {}
        if str(props.get("delta.enableChangeDataFeed", "false")).lower() != "true":
            raise SourceError(f"source {ref} has Change Data Feed off; enable it with: ALTER TABLE {ref} SET "
                              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        location = strip_file_scheme(detail["location"])
        if by_path is None:
            schema = self.spark.table(key).schema
        else:
            self._check_not_stream_table_storage(ref, location, creating)
            schema = self.spark.read.format("delta").load(location).schema
        return SourceInfo(location, "delta"), [(f.name, f.dataType.simpleString()) for f in schema.fields]

    def _check_not_stream_table_storage(self, ref: str, location: str, creating: str) -> None:
        """A path into the catalog's own tables is a stream table's storage: read by path it would show the
        hidden columns, and escape the dependency order."""
        parent, name = os.path.split(os.path.normpath(location))
        if os.path.normpath(parent) != os.path.normpath(self.catalog.table_path("")):
            return
        if name == creating:
            raise CatalogError(f"stream table {creating} cannot read itself ({ref} is its own storage)")
        if self.catalog.exists(name):
            raise CatalogError(f"source {ref} is the storage of stream table {name}: read it by name "
                               f"(FROM {name}), which reads its rows as users see them")

    # --- views ---

    def _view(self, name: str) -> dvm.ViewDef | None:
        """The view ``name`` as the Spark catalog describes it, or None when ``name`` is not a view."""
        try:
            if not self.spark.catalog.tableExists(name):
                return None
            table = self.spark.catalog.getTable(name)
        except Exception:  # noqa: BLE001 - not a name the catalog can look up: not a view
            return None
        if not table.isTemporary and (table.tableType or "").upper() != "VIEW":
            return None
        doc = json.loads(self.spark.sql(f"DESCRIBE TABLE EXTENDED {name} AS JSON").collect()[0][0])
        text = doc.get("view_text")
        if not text:
            raise SourceError(f"source {name} is a temporary view made from a DataFrame: it has no SQL text, so "
                              "it cannot be maintained over its base tables; create it with CREATE TEMPORARY "
                              "VIEW ... AS SELECT, or write the DataFrame to a Delta table (Change Data Feed on) "
                              "and read that")
        columns = [c["name"] for c in doc.get("columns") or []]
        return dvm.ViewDef(name, text, columns, {
            "namespace": doc.get("view_catalog_and_namespace"), "temporary": bool(table.isTemporary)})

    def _inline_views(self, query: str, dialect: str = "spark") -> tuple[str, list[str]]:
        """``query`` (in SQL ``dialect``) with the views it reads (nested ones too) inlined; see
        :func:`dvm.inline_views`."""
        catalog = (self.spark.catalog.currentCatalog() or "").lower()
        database = (self.spark.catalog.currentDatabase() or "").lower()

        def short(parts: list[str]) -> str:
            """A name inside a view, qualified by the view's namespace, as short as it stays unambiguous
            (stream tables are known by their bare name)."""
            if len(parts) == 3 and parts[0] == catalog:
                parts = parts[1:]
            if len(parts) == 2 and parts[0] == database:
                parts = parts[1:]
            return ".".join(parts)

        def resolve(name: str, inside: dvm.ViewDef | None) -> str | dvm.ViewDef:
            if _path_source(name) is not None:
                return name  # a table by path is no view
            full = name
            if inside is not None and "." not in name:
                temp_ref = bool(inside.context.get("temporary")) and self._is_temp_view(name)
                namespace = str(inside.context.get("namespace") or "")
                if not temp_ref and namespace:
                    full = f"{namespace}.{name}".lower()
            view = self._view(full)
            if view is not None:
                return view
            return name if inside is None else short(full.split("."))

        return dvm.inline_views(query, resolve, dialect)

    def _is_temp_view(self, name: str) -> bool:
        try:
            return bool(self.spark.catalog.tableExists(name) and self.spark.catalog.getTable(name).isTemporary)
        except Exception:  # noqa: BLE001
            return False

    # --- API ---

    def create_stream_table(self, name: str, query: str, schedule: str | None = DEFAULT_SCHEDULE,
                            refresh_mode: str = RefreshMode.AUTO, initialize: bool = True, dialect: str = "spark") -> None:
        """Declare a stream table; with ``initialize`` populate it now (a FULL refresh). ``dialect``: the SQL
        dialect ``query`` is written in (a sqlglot dialect name, e.g. ``postgres``); it is kept with the table,
        every refresh reads the query in it, and what runs is Spark SQL rendered from it.

        Raises QueryError (bad SQL, unknown table or column), UnsupportedError (construct not maintainable
        when the mode is DIFFERENTIAL or IMMEDIATE), SourceError (not Delta, CDF off) or CatalogError
        (duplicate name, cycle). On error nothing is left behind.
        """
        key = validate_name(name)
        mode = validate_mode(refresh_mode)
        schedule = validate_schedule(schedule)
        if self.catalog.exists(key):
            raise CatalogError(f"stream table {key} already exists; drop it first or use alter_stream_table")
        if self.spark.catalog.tableExists(key):
            raise CatalogError(f"a table named {key} already exists and is not a stream table")
        draft, latest = self._definition(key, query, schedule, mode, dvm.check_dialect(dialect))
        path = draft.path
        self.catalog.put(draft)
        try:
            if initialize:
                self.refresher.refresh(key)
            else:
                self._create_empty(draft, latest)
            self._publish(key, path)  # first: a clash there leaves no session name behind
            self._register(key, path)
            strata.restratify(self.catalog)
        except Exception:
            self.catalog.delete(key)
            self.catalog.drop_history(key)
            log_checkpoints.settle(path)
            self.catalog.storage.delete_tree(path)
            raise

    def _definition(self, key: str, query: str, schedule: str | None, mode: str,
                    dialect: str = "spark") -> tuple[StreamTableDef, dict[str, int]]:
        """The definition of stream table ``key`` by ``query``, checked as create checks it (SQL, sources,
        output columns, differentiability for ``mode``), and its sources' latest versions; writes nothing.
        Shared by create and by an ALTER of the query (:mod:`pipeline.alter`)."""
        sources: dict[str, SourceInfo] = {}
        schemas: dict[str, list[tuple[str, str]]] = {}
        try:
            maintained, views = self._inline_views(query, dialect)
            dvm.check_nesting(maintained, dialect)  # what refreshes parse and render (views inlined)
            keys = dvm.source_keys(maintained, dialect)
        except (QueryError, SourceError) as e:
            raise type(e)(f"stream table {key}: {e}") from None
        for src_key in keys:
            sources[src_key], schemas[src_key] = self._resolve_source(src_key, key)
        path = self.catalog.table_path(key)
        latest = {k: DeltaLog(self.spark, s.path).latest_version() or 0 for k, s in sources.items()}
        draft = StreamTableDef(key, query, schedule, mode, path, sources, [], [], "bag",
                               inlined_query=maintained if views else None, views=views, dialect=dialect,
                               float_identity=dvm.FLOAT_IDENTITY)
        pinned = dvm.pin_sources(dvm.analyzable(maintained, dialect), self.refresher.from_items(draft, latest),
                                 dialect)
        try:
            schema = self.spark.sql(pinned).schema
        except Exception as e:  # AnalysisException and friends: unknown column, type errors
            raise QueryError(f"invalid query for stream table {key}: {_clean(e)}") from None
        names = [f.name for f in schema.fields]
        for n in names:
            if n.startswith("__") or set(n) & _BAD_COLUMN_CHARS:
                raise QueryError(f"output column {n!r} of stream table {key} needs an alias (names may not "
                                 "start with '__' or contain spaces or ,;{}()=)")
        if len({n.lower() for n in names}) != len(names):
            raise QueryError(f"stream table {key} has duplicate output column names: {names}")
        draft.names = names
        draft.types = [f.dataType.simpleString() for f in schema.fields]
        draft.edge_classes = {k: strata.UNKNOWN for k, s in sources.items() if s.kind == "stream_table"}
        try:
            plan = dvm.compile_query(maintained, schemas, dialect)
            draft.layout = plan.layout
            draft.edge_classes = {k: c.describe() for k, c in dvm.classify_edges(plan.root, keys).items()
                                  if k in draft.edge_classes}
        except UnsupportedError as e:
            if mode in DELTA_ONLY_MODES:
                raise UnsupportedError(e.construct, f"stream table {key}: {e} (refresh_mode={mode})") from None
            if mode == RefreshMode.AUTO and self.refresher.is_strict():
                raise UnsupportedError(e.construct, f"stream table {key}: {e} (strict mode: AUTO would refresh "
                                       "it FULL; use refresh_mode='FULL' to accept that)") from None
            draft.full_reason = str(e)
        except QueryError as e:
            if mode in DELTA_ONLY_MODES or (mode == RefreshMode.AUTO and self.refresher.is_strict()):
                raise UnsupportedError("query", f"stream table {key}: {e}") from None
            draft.full_reason = f"cannot build an operator tree: {e}"
        except RecursionError:  # check_nesting's limit should prevent it: never a raw error, never stored
            raise QueryError(f"stream table {key}: the query nests too deeply to be compiled: "
                             f"{dvm.FLATTEN}") from None
        return draft, latest

    def _create_empty(self, d: StreamTableDef, latest: dict[str, int]) -> None:
        ctx = self.refresher.context(d, None, latest)
        sql = self.refresher.full_sql(d, latest, ctx)
        with fixpoints.evaluated(self.spark, ctx):
            df = fixpoints.reader(self.spark, ctx).sql(sql)
            if not delta_sink.create(self.spark, df, d.path):  # a table left at the path, or a refused CREATE
                df.limit(0).write.format("delta").mode("overwrite").options(
                    **delta_sink.write_options(self.spark, df.schema)).save(d.path)

    def alter_stream_table(self, name: str, schedule: str | None = None, refresh_mode: str | None = None,
                           status: str | None = None, query: str | None = None, dialect: str | None = None) -> None:
        """Change a stream table's schedule, refresh mode, status or defining query. A new ``query`` is
        checked as create checks it (and for cycles) before anything changes; then the table is
        re-initialized (REINITIALIZE, reason "query changed") and its dependents are re-validated (see
        :mod:`pipeline.alter`). A new ``dialect`` (the SQL dialect the query is written in) is a change of
        the query: the same text may mean something else in another dialect, so the new query, or the
        current one without it, goes the same way."""
        d = self.catalog.get(validate_name(name))
        if dialect is not None:
            dialect = dvm.check_dialect(dialect)
            if dialect == d.dialect:
                dialect = None
            elif query is None:
                query = d.query
        if schedule is not None:
            d.schedule = validate_schedule(schedule)
        if refresh_mode is not None:
            mode = validate_mode(refresh_mode)
            if mode in DELTA_ONLY_MODES and d.full_reason is not None and query is None:
                raise UnsupportedError("query", f"stream table {d.name} cannot use refresh_mode={mode}: "
                                       f"{d.full_reason}")
            if mode == "IMMEDIATE" and d.scc is not None:
                raise CatalogError(f"stream table {d.name} is in the cycle {d.scc}, refreshed as one unit to its "
                                   "fixpoint: it cannot be IMMEDIATE")
            d.refresh_mode = mode
        if status is not None:
            s = str(status).upper()
            if s not in USER_STATUSES:
                raise CatalogError(f"invalid status {status!r}: use ACTIVE or SUSPENDED")
            d.status = TableStatus(s)
            if s == TableStatus.ACTIVE:
                d.consecutive_errors = 0
        if query is not None:

            alter.change_query(self, d, query, dialect)
            return
        self.catalog.put(d)

    def drop_stream_table(self, name: str) -> None:
        key = validate_name(name)
        d = self.catalog.get(key)
        deps = self.catalog.dependents(key)
        if deps:
            raise CatalogError(f"cannot drop {key}: stream tables {', '.join(deps)} read it; drop them first")
        self.stop(key)
        self.catalog.delete(key)
        self.catalog.drop_history(key)
        if self.spark.catalog.tableExists(key):
            self.spark.sql(f"DROP TABLE IF EXISTS {key}")
        metastore.unpublish(self.spark, key, d.path)
        strata.restratify(self.catalog)
        log_checkpoints.settle(d.path)
        self.catalog.storage.delete_tree(d.path)
        self.catalog.storage.delete_tree(self.catalog.checkpoint_path(key))
        self.refresher._plans = {k: v for k, v in self.refresher._plans.items() if k[0] != key}

    def refresh_stream_table(self, name: str) -> RefreshResult:
        """Bring the stream table (and, first, any stale upstream stream table) to the sources' latest
        versions."""
        return self.refresher.refresh(validate_name(name))

    def status(self) -> list[dict[str, Any]]:
        out = []
        for d in self.catalog.all():
            out.append({
                "name": d.name, "status": d.status, "refresh_mode": d.refresh_mode, "schedule": d.schedule,
                "layout": d.layout, "differentiable": d.full_reason is None, "full_reason": d.full_reason,
                "sources": sorted(d.sources), "frontier": d.frontier, "last_action": d.last_action,
                "last_refresh_at": d.last_refresh_at, "consecutive_errors": d.consecutive_errors,
                "last_error": d.last_error, "path": d.path,
                "running": d.name in self._queries and self._queries[d.name].isActive,
                "stratum": d.stratum, "scc": d.scc, "fixpoint_iterations": d.last_fixpoint_iterations,
            })
        return out

    def history(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        key = validate_name(name)
        if not self.catalog.exists(key):
            raise CatalogError(f"stream table {key} does not exist")
        return self.catalog.history(key, limit)

    def explain(self, name_or_query: str) -> str:
        """How a stream table (by name) or a query would be maintained, before anything runs: the operator
        tree, which operators apply a delta rule and which recompute what a change touches (and why), the
        hidden columns and the delta SQL of a refresh. For a query the engine cannot differentiate: the
        reason, and what each mode (and strict mode) does with it."""
        text = name_or_query.strip() if isinstance(name_or_query, str) else ""
        if not text:
            raise QueryError(f"explain needs the name of a stream table or a SELECT query, got {name_or_query!r}")
        schemas: dict[str, list[tuple[str, str]]] = {}
        if _NAME_LIKE.match(text):
            d = self._explained_stream_table(text)
            header = [f"stream table: {d.name}", f"refresh_mode: {d.refresh_mode}"]
        else:
            sources, schemas = {}, {}
            try:
                maintained, views = self._inline_views(text)
                dvm.check_nesting(maintained)
                keys = dvm.source_keys(maintained)
            except QueryError as e:
                raise QueryError(_explain_query_error(text, e)) from None
            for k in keys:
                sources[k], schemas[k] = self._resolve_source(k, "")
            d = StreamTableDef("(query)", text, None, RefreshMode.AUTO, "<stream table>", sources,
                               [], [], "bag", inlined_query=maintained if views else None, views=views)
            try:
                plan = dvm.compile_query(maintained, schemas)
                d.names = list(plan.names)
                d.layout = plan.layout
            except UnsupportedError as e:
                d.full_reason = str(e)
            except QueryError as e:
                self._check_analyzes(d)  # an unknown column is an invalid query (create refuses it), not FULL
                d.full_reason = f"cannot build an operator tree: {e}"
            d.types = ["string"] * len(d.names)
            header = ["query (not a stream table): as if created with refresh_mode AUTO"]
        strict = self.refresher.is_strict()
        lines = header + [f"strict mode: {'on' if strict else 'off'}", f"query: {d.query.strip()}"]
        if d.views:
            lines += [f"views inlined: {', '.join(d.views)}", f"maintained query: {d.maintained_query}"]
        if d.full_reason is not None:
            lines += ["", "maintenance: FULL only -- the engine cannot differentiate this query:",
                      f"  {d.full_reason}",
                      "  AUTO: every refresh is FULL, with this reason recorded in the refresh history"
                      + ("; in strict mode (on) such a refresh fails instead" if strict
                         else " (strict mode would fail such a refresh instead)"),
                      "  DIFFERENTIAL / IMMEDIATE: refused at create; FULL: recomputes every refresh by choice"]
            return "\n".join(lines)
        plan = self.refresher.plan(d) if d.name != "(query)" else dvm.compile_query(d.maintained_query, schemas)
        assert plan is not None
        if d.name == "(query)":
            plan.names = d.names
        if d.refresh_mode == RefreshMode.FULL:
            lines += ["", "refresh_mode FULL: every refresh recomputes; below is what AUTO / DIFFERENTIAL would do"]
        lines += ["", "operator tree (each operator: how its delta is computed; RECOMPUTE: recomputes what a "
                  "change touches, and why):", plan.tree_text()]
        if plan.notes:
            lines += ["", "notes:"] + [f"  - {n}" for n in plan.notes]
        lines += ["", "hidden columns: " + ", ".join(plan.hidden_columns())]
        lines += self._edge_lines(d, plan)
        lines += ["", *self._apply_lines(d, plan)]
        post = {k: 2 for k in d.sources}
        pre = {k: 1 for k in d.sources}
        ctx = self.refresher.context(d, pre, post)
        types = d.types if len(d.types) == len(plan.names) else ["string"] * len(plan.names)
        src = plan.merge_source_sql(ctx, types)
        src = ctx.unshare_single_reads(src) if src is not None else None
        if ctx.notes:
            lines += ["", "rules chosen for this window:"] + [f"  - {n}" for n in ctx.notes]
        lines += ["", "delta SQL (every source changed between versions 1 and 2):",
                  _pretty(plan.merge_statement(f"delta.{quote(d.path)}", src or "SELECT NULL"))]
        for name, spec in ctx.fixpoints:
            if spec.step is None:
                lines += ["", f"{name}: held once per refresh, filled by the first job reading it (Spark would "
                          "read it several times):",
                          _pretty(spec.seed)]
                continue
            lines += ["", f"{name}: fixpoint over ({', '.join(spec.columns)}), evaluated before the MERGE "
                      f"(rounds until nothing new; {PREV} = the previous round's new rows)",
                      "  seed:", _pretty(spec.seed), "  step:", _pretty(spec.step)]
        return "\n".join(lines)

    def _edge_lines(self, d: StreamTableDef, plan: dvm.Plan) -> list[str]:
        """Stratified evaluation (:mod:`pipeline.strata`): each stream-table source's edge class, and the
        table's stratum and cycle."""
        keys = [k for k, s in d.sources.items() if s.kind == "stream_table"]
        if not keys:
            return []
        classes = dvm.classify_edges(plan.root, list(d.sources))
        lines = ["", "edges from stream tables (only monotone ones may form a cycle; see pipeline.strata):"]
        lines += [f"  - {k} -> {d.name}: {classes[k].describe() if k in classes else strata.UNKNOWN}"
                  for k in sorted(keys)]
        if d.name != "(query)":
            where = f"in cycle {d.scc}" if d.scc else "in no cycle"
            lines.append(f"stratum {d.stratum if d.stratum is not None else '-'}, {where}"
                         + (f", last fixpoint {d.last_fixpoint_iterations} iterations"
                            if d.last_fixpoint_iterations is not None else ""))
        return lines

    def _check_analyzes(self, d: StreamTableDef) -> None:
        """QueryError when Spark cannot analyse the query of ``d`` (unknown column, type error), as create
        would raise: analysis only, no job."""
        latest = {k: DeltaLog(self.spark, s.path).latest_version() or 0 for k, s in d.sources.items()}
        pinned = dvm.pin_sources(dvm.analyzable(d.maintained_query, d.dialect), self.refresher.from_items(d, latest),
                                 d.dialect)
        try:
            self.spark.sql(pinned).schema  # noqa: B018 - analysing is the point
        except Exception as e:  # AnalysisException and friends
            raise QueryError(f"explain: invalid query: {_clean(e)}") from None

    def _explained_stream_table(self, text: str) -> StreamTableDef:
        """The stream table ``explain`` was given by name; CatalogError saying what ``text`` is instead (a
        plain table, or nothing) and what explain takes. A bare name is never a query, so parsing it as one
        only said "must be a SELECT query, got COLUMN"."""
        key = text.lower()
        if NAME_RE.match(key) and len(key) <= NAME_MAX_LENGTH and self.catalog.exists(key):
            return self.catalog.get(key)
        try:
            table = bool(self.spark.catalog.tableExists(text))
        except Exception:  # noqa: BLE001 - not a name Spark can look up: no table either
            table = False
        if table:
            raise CatalogError(f"{text} is a table, not a stream table: explain takes the name of a stream table "
                               "or a SELECT query; to see how a stream table over it would be maintained, explain "
                               f"the query, e.g. explain('SELECT ... FROM {text}')")
        raise CatalogError(f"no stream table or table named {text}: explain takes the name of a stream table "
                           "(status() lists them, `trickle status` on the command line) or a SELECT query")

    def _apply_lines(self, d: StreamTableDef, plan: dvm.Plan) -> list[str]:
        """How a refresh of ``d`` applies its delta and how AUTO decides (see :mod:`pipeline.strategy`)."""
        from connectors import delta_rs
        from pipeline import strategy

        limits = strategy.Limits.from_conf(self.spark.conf)
        if d.name == "(query)":
            engine = "delta-rs when the stream table's features and store allow it (checked per refresh)"
        else:
            log = DeltaLog(self.spark, d.path)
            latest = log.latest_version()
            why = delta_rs.unusable(d.path, log.protocol(latest) if latest is not None else None)
            engine = "delta-rs" if why is None and limits.delta_rs else f"Spark ({why or 'delta-rs is off'})"
        append = ("an insert-only delta is appended (APPEND), any other is merged on __row_id (MERGE)"
                  if plan.keyed is None else "change rows are merged on __row_id (MERGE: update, insert, delete)")
        lines = ["apply (chosen per refresh, recorded in its history):",
                 f"  - the delta job collects the change rows to the driver when the sources' change feeds total "
                 f"at most {limits.collect_below_bytes} bytes ({strategy.COLLECT_BELOW}); {append}; committed by "
                 f"{engine}, in one commit carrying the frontier",
                 "  - larger windows: Spark's MERGE from the cluster (SPARK_MERGE)",
                 "  - FULL / REINITIALIZE: the query's result overwrites the table (OVERWRITE)"]
        threshold, how = strategy.CostModel.from_dict(d.cost_model).threshold()
        if d.refresh_mode == RefreshMode.AUTO:
            lines.append(f"AUTO: FULL when more than {threshold:.1%} of the sources' bytes changed in a window "
                         f"({how}); strict mode never chooses FULL by cost")
        return lines

    def read(self, name: str, consistent: bool = False, timeout: float = 60.0, refresh: bool | None = None) -> Any:
        """The stream table as users see it: its user columns (every layout stores the query's rows as they
        are, duplicates as separate rows; only the hidden ``__`` columns are left out).

        ``consistent=True``: at a version reflecting every commit its base tables had when this was called,
        waiting up to ``timeout`` seconds for it (``refresh``: who refreshes meanwhile, see
        :mod:`pipeline.read_your_writes`)."""
        if consistent:

            return read_your_writes.consistent_read(self, name, timeout, refresh)
        d = self.catalog.get(validate_name(name))
        cols = ", ".join(quote(n) for n in d.names)
        return self.spark.sql(f"SELECT {cols} FROM delta.{quote(d.path)}")

    def register_catalog_views(self) -> None:
        """Temp views ``trickle_stream_tables`` and ``trickle_history`` for querying the catalog in SQL."""
        root = self.catalog.root
        # from the catalog, not its files: a definition file leaves the refresh state to its slots
        docs = [json.dumps(json.loads(d.to_json())) for d in self.catalog.all()]
        if docs:
            self.spark.read.json(self.spark.sparkContext.parallelize(docs, 1)).createOrReplaceTempView(
                "trickle_stream_tables")
        hist = root / "history"
        if any(self.catalog.history(n, limit=1) for n in self.catalog.names()):
            self.spark.read.json(str(hist / "*" / "*.json")).createOrReplaceTempView("trickle_history")

    # --- IMMEDIATE mode ---

    def start(self, name: str, follow: set[str] | None = None) -> Any:
        """Run the stream table continuously: a streaming query over its sources' change feeds (``follow``:
        only these sources'; None when that leaves none, see :mod:`pipeline.fused`)."""
        key = validate_name(name)
        q = self._queries.get(key)
        if q is not None and q.isActive:
            return q
        q = start_immediate(self.spark, self.catalog, self.refresher, key, follow=follow)
        if q is None:
            self._queries.pop(key, None)
            return None
        self._queries[key] = q
        return q

    def stop(self, name: str) -> None:
        q = self._queries.pop(name.lower(), None)
        if q is not None and q.isActive:
            q.stop()

    def stop_all(self) -> None:
        for n in list(self._queries):
            self.stop(n)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until a streaming query stops (or the timeout passes)."""
        deadline = None if timeout_s is None else time.time() + timeout_s
        while any(q.isActive for q in self._queries.values()):
            if deadline is not None and time.time() > deadline:
                return
            time.sleep(0.5)

    # --- read-your-writes (pipeline.read_your_writes) ---

    def write(self, table: str, data: Any, mode: str = "append", timeout: float = 60.0,
              refresh: bool | None = None) -> int:
        """Commit ``data`` (a DataFrame, a SELECT, or one INSERT/UPDATE/DELETE/MERGE of ``table``) to the Delta
        table ``table``; return once every IMMEDIATE stream table reading it reflects the commit. Returns the
        table's version holding the write. See :func:`pipeline.read_your_writes.write`."""

        return read_your_writes.write(self, table, data, mode, timeout, refresh)

    def wait_for(self, name: str, source: str, version: int, timeout: float = 60.0,
                 refresh: bool | None = None) -> dict[str, Any]:
        """Return once stream table ``name`` reflects ``version`` (or later) of its base table ``source``:
        for a writer that committed by other means. Returns ``{"version": <the stream table's version>,
        "base_frontier": {<base table path>: <version reflected>}}``; ConsistencyTimeout after ``timeout``."""

        r = read_your_writes.wait_for(self, name, source, version, timeout, refresh)
        return {"version": r.version, "base_frontier": dict(r.base)}

    # --- pg_ivm compatibility (pipeline.pg_ivm) ---

    def create_immv(self, name: str, query: str, start: bool = True) -> int:
        """pg_ivm's ``create_immv``: an IMMEDIATE stream table, populated now, maintained by a streaming query
        of this process (``start``); returns its number of rows."""

        return pg_ivm.create_immv(self, name, query, start)

    def refresh_immv(self, name: str, with_data: bool = True, start: bool = True) -> int:
        """pg_ivm's ``refresh_immv``: ``with_data`` replaces the contents and resumes maintenance (returns the
        rows); otherwise the IMMV is emptied and no longer maintained (returns 0)."""

        return pg_ivm.refresh_immv(self, name, with_data, start)

    def get_immv_def(self, name: str) -> str:
        """pg_ivm's ``get_immv_def``: the defining query."""

        return pg_ivm.get_immv_def(self, name)

    def pg_ivm_immv(self) -> Any:
        """pg_ivm's catalog: registers the temp view ``pg_ivm_immv`` (immvrelid, viewdef, ispopulated,
        lastivmupdate) and the SQL function ``get_immv_def``; returns the view."""

        return pg_ivm.register(self)


#: What ``explain`` takes for a stream table's name: an identifier, perhaps qualified (``db.t``), which no
#: SELECT query is.
_NAME_LIKE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

#: First words of a text ``explain`` reads as a query (the rest is neither a name nor a query).
_QUERY_START = ("SELECT", "WITH", "FROM", "VALUES", "TABLE")


def _explain_query_error(text: str, e: QueryError) -> str:
    """The message for a text ``explain`` could not read as a query: a query's own error for what looks like
    a query, else that the text is neither a stream table's name nor a query, and what explain takes."""
    words = text.lstrip("( \n\t").split(None, 1)
    if words and words[0].upper() in _QUERY_START:
        return f"explain: invalid query: {e}"
    shown = text if len(text) <= 60 else text[:57] + "..."
    return (f"explain: {shown!r} is neither the name of a stream table nor a SELECT query ({e}); pass a stream "
            "table's name (status() lists them) or one SELECT query")


def _clean(e: BaseException) -> str:
    text = str(e).strip()
    return text.split("\n")[0][:400]


def _pretty(sql: str) -> str:
    try:
        import sqlglot

        return sqlglot.transpile(sql, read=dvm.SPARK, write=dvm.SPARK, pretty=True)[0]
    except Exception:  # noqa: BLE001 - formatting is best effort
        return sql
