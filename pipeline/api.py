"""The public Python API: :class:`StreamTables` over a SparkSession."""

from __future__ import annotations

import shutil
import time
from typing import Any

import dvm
from connectors.delta_log import DeltaLog
from dvm.context import PREV, quote
from pipeline import fixpoints
from pipeline.catalog import Catalog, SourceInfo, StreamTableDef, validate_mode, validate_name
from pipeline.errors import CatalogError, QueryError, SourceError, UnsupportedError
from pipeline.refresh import Refresher, RefreshResult
from pipeline.schedule import validate_schedule

__all__ = ["StreamTables", "RefreshResult"]

_BAD_COLUMN_CHARS = set(" ,;{}()\n\t=")


def _warehouse(spark: Any) -> str:
    wh = spark.conf.get("spark.sql.warehouse.dir")
    return wh[len("file:"):] if wh.startswith("file:") else wh


class StreamTables:
    """Stream tables of one catalog.

    ``root`` is the catalog directory (default ``<warehouse>/_trickle``). ``strict=True`` makes every
    refresh that would fall back from DIFFERENTIAL to FULL fail instead.
    """

    def __init__(self, spark: Any, root: str | None = None, strict: bool = False) -> None:
        self.spark = spark
        self.catalog = Catalog(root or f"{_warehouse(spark)}/_trickle")
        self.refresher = Refresher(spark, self.catalog, strict=strict)
        self._queries: dict[str, Any] = {}
        self._register_all()

    # --- names in the session catalog ---

    def _register_all(self) -> None:
        """Make stream tables and their sources resolvable by name in this session."""
        for d in self.catalog.all():
            for key, src in d.sources.items():
                if src.kind == "delta":
                    self._register(key, src.path)
            self._register(d.name, d.path)

    def _register(self, name: str, path: str) -> None:
        if DeltaLog(self.spark, path).latest_version() is None:
            return
        if not self.spark.catalog.tableExists(name):
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{path}'")

    # --- sources ---

    def _resolve_source(self, key: str, creating: str) -> tuple[SourceInfo, list[tuple[str, str]]]:
        if key == creating:
            raise CatalogError(f"stream table {creating} cannot read itself (cycle {creating} -> {creating})")
        if self.catalog.exists(key):
            up = self.catalog.get(key)
            mult = "__mult" if up.layout == "bag" else None
            return SourceInfo(up.path, "stream_table", mult), list(zip(up.names, up.types, strict=True))
        if not self.spark.catalog.tableExists(key):
            raise QueryError(f"unknown table {key}: create it as a Delta table (with "
                             "delta.enableChangeDataFeed = true) before using it as a source")
        detail = self.spark.sql(f"DESCRIBE DETAIL {key}").collect()[0].asDict()
        if (detail.get("format") or "").lower() != "delta":
            raise SourceError(f"source {key} is not a Delta table (format {detail.get('format')}); stream "
                              "tables read Delta tables with Change Data Feed")
        props = detail.get("properties") or {}
        if str(props.get("delta.enableChangeDataFeed", "false")).lower() != "true":
            raise SourceError(f"source {key} has Change Data Feed off; enable it with: ALTER TABLE {key} SET "
                              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        location = detail["location"]
        if location.startswith("file:"):
            location = location[len("file:"):]
        schema = self.spark.table(key).schema
        return SourceInfo(location, "delta"), [(f.name, f.dataType.simpleString()) for f in schema.fields]

    # --- API ---

    def create_stream_table(self, name: str, query: str, schedule: str | None = "1m",
                            refresh_mode: str = "AUTO", initialize: bool = True) -> None:
        """Declare a stream table; with ``initialize`` populate it now (a FULL refresh).

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
        sources: dict[str, SourceInfo] = {}
        schemas: dict[str, list[tuple[str, str]]] = {}
        try:
            keys = dvm.source_keys(query)
        except QueryError as e:
            raise QueryError(f"stream table {key}: {e}") from None
        for src_key in keys:
            sources[src_key], schemas[src_key] = self._resolve_source(src_key, key)
        path = self.catalog.table_path(key)
        latest = {k: DeltaLog(self.spark, s.path).latest_version() or 0 for k, s in sources.items()}
        draft = StreamTableDef(key, query, schedule, mode, path, sources, [], [], "bag")
        pinned = dvm.parser.pin_sources(dvm.parser.analyzable(query), self.refresher.from_items(draft, latest))
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
        try:
            plan = dvm.compile_query(query, schemas)
            draft.layout = plan.layout
        except UnsupportedError as e:
            if mode in ("DIFFERENTIAL", "IMMEDIATE"):
                raise UnsupportedError(e.construct, f"stream table {key}: {e} (refresh_mode={mode})") from None
            draft.full_reason = str(e)
        except QueryError as e:
            if mode in ("DIFFERENTIAL", "IMMEDIATE"):
                raise UnsupportedError("query", f"stream table {key}: {e}") from None
            draft.full_reason = f"cannot build an operator tree: {e}"
        self.catalog.put(draft)
        try:
            if initialize:
                self.refresher.refresh(key)
            else:
                self._create_empty(draft, latest)
            self._register(key, path)
        except Exception:
            self.catalog.delete(key)
            self.catalog.drop_history(key)
            shutil.rmtree(path, ignore_errors=True)
            raise

    def _create_empty(self, d: StreamTableDef, latest: dict[str, int]) -> None:
        ctx = self.refresher.context(d, None, latest)
        sql = self.refresher.full_sql(d, latest, ctx)
        with fixpoints.evaluated(self.spark, ctx):
            df = fixpoints.reader(self.spark, ctx).sql(sql).limit(0)
            (df.write.format("delta").mode("overwrite").option("delta.enableChangeDataFeed", "true").save(d.path))

    def alter_stream_table(self, name: str, schedule: str | None = None, refresh_mode: str | None = None,
                           status: str | None = None) -> None:
        d = self.catalog.get(validate_name(name))
        if schedule is not None:
            d.schedule = validate_schedule(schedule)
        if refresh_mode is not None:
            mode = validate_mode(refresh_mode)
            if mode in ("DIFFERENTIAL", "IMMEDIATE") and d.full_reason is not None:
                raise UnsupportedError("query", f"stream table {d.name} cannot use refresh_mode={mode}: "
                                       f"{d.full_reason}")
            d.refresh_mode = mode
        if status is not None:
            s = str(status).upper()
            if s not in ("ACTIVE", "SUSPENDED"):
                raise CatalogError(f"invalid status {status!r}: use ACTIVE or SUSPENDED")
            d.status = s
            if s == "ACTIVE":
                d.consecutive_errors = 0
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
        shutil.rmtree(d.path, ignore_errors=True)
        shutil.rmtree(self.catalog.checkpoint_path(key), ignore_errors=True)
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
            })
        return out

    def history(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        key = validate_name(name)
        if not self.catalog.exists(key):
            raise CatalogError(f"stream table {key} does not exist")
        return self.catalog.history(key, limit)

    def explain(self, name_or_query: str) -> str:
        """The operator tree, how each operator is maintained, and the delta SQL — before anything runs."""
        if self.catalog.exists(name_or_query.lower()) if " " not in name_or_query.strip() else False:
            d = self.catalog.get(name_or_query.lower())
        else:
            sources, schemas = {}, {}
            for k in dvm.source_keys(name_or_query):
                sources[k], schemas[k] = self._resolve_source(k, "")
            d = StreamTableDef("(query)", name_or_query, None, "AUTO", "<stream table>", sources,
                               [], [], "bag")
            try:
                plan = dvm.compile_query(name_or_query, schemas)
                d.names = list(plan.names)
                d.layout = plan.layout
            except (UnsupportedError, QueryError) as e:
                d.full_reason = str(e)
            d.types = ["string"] * len(d.names)
        lines = [f"stream table: {d.name}", f"refresh_mode: {d.refresh_mode}", f"query: {d.query.strip()}"]
        if d.full_reason is not None:
            lines += ["", f"NOT differentiable -> every refresh is FULL: {d.full_reason}"]
            return "\n".join(lines)
        plan = self.refresher.plan(d) if d.name != "(query)" else dvm.compile_query(d.query, schemas)
        assert plan is not None
        if d.name == "(query)":
            plan.names = d.names
        lines += ["", "operator tree:", plan.tree_text()]
        if plan.notes:
            lines += ["", "notes:"] + [f"  - {n}" for n in plan.notes]
        lines += ["", "hidden columns: " + ", ".join(plan.hidden_columns())]
        post = {k: 2 for k in d.sources}
        pre = {k: 1 for k in d.sources}
        ctx = self.refresher.context(d, pre, post)
        types = d.types if len(d.types) == len(plan.names) else ["string"] * len(plan.names)
        src = plan.merge_source_sql(ctx, types)
        if ctx.notes:
            lines += ["", "rules chosen for this window:"] + [f"  - {n}" for n in ctx.notes]
        lines += ["", "delta SQL (every source changed between versions 1 and 2):",
                  _pretty(plan.merge_statement(f"delta.{quote(d.path)}", src or "SELECT NULL"))]
        for name, spec in ctx.fixpoints:
            lines += ["", f"{name}: fixpoint over ({', '.join(spec.columns)}), evaluated before the MERGE "
                      f"(rounds until nothing new; {PREV} = the previous round's new rows)",
                      "  seed:", _pretty(spec.seed), "  step:", _pretty(spec.step)]
        return "\n".join(lines)

    def read(self, name: str) -> Any:
        """The stream table as users see it: user columns only, duplicates expanded from ``__mult``."""
        d = self.catalog.get(validate_name(name))
        cols = ", ".join(quote(n) for n in d.names)
        table = f"delta.{quote(d.path)}"
        if d.layout == "bag":
            return self.spark.sql(
                f"SELECT {cols} FROM {table} LATERAL VIEW explode(sequence(1, __mult)) __mx AS __mi")
        return self.spark.sql(f"SELECT {cols} FROM {table}")

    def register_catalog_views(self) -> None:
        """Temp views ``trickle_stream_tables`` and ``trickle_history`` for querying the catalog in SQL."""
        root = self.catalog.root
        self.spark.read.json(str(root / "stream_tables")).createOrReplaceTempView("trickle_stream_tables")
        hist = root / "history"
        if any(hist.glob("*/*.json")):
            self.spark.read.json(str(hist / "*" / "*.json")).createOrReplaceTempView("trickle_history")

    # --- IMMEDIATE mode ---

    def start(self, name: str) -> Any:
        """Run the stream table continuously: a streaming query over its sources' change feeds."""
        from pipeline.immediate import start_immediate

        key = validate_name(name)
        q = self._queries.get(key)
        if q is not None and q.isActive:
            return q
        self._queries[key] = start_immediate(self, key)
        return self._queries[key]

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


def _clean(e: BaseException) -> str:
    text = str(e).strip()
    return text.split("\n")[0][:400]


def _pretty(sql: str) -> str:
    try:
        import sqlglot

        return sqlglot.transpile(sql, read="spark", write="spark", pretty=True)[0]
    except Exception:  # noqa: BLE001 - formatting is best effort
        return sql
