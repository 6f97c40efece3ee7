"""Refreshing a cycle of stream tables: semi-naive evaluation to the least fixpoint (seed 002).

A pipeline that allows cycles (``allow_circular``) may hold stream tables that read each other, through
monotone edges only (:mod:`pipeline.strata` checks it at create and alter). Such a *component* is refreshed
as one unit, whichever member was asked for:

1. The stream tables the component reads from outside are refreshed first; every outside source is read at
   one version (the refresh call's pin), the same for every member.
2. When no outside source moved since the members' last refresh (their committed or soft frontiers), every
   member records NO_DATA: no Spark job.
3. Otherwise the component is **reset and recomputed**: every member starts empty and the members' queries
   are iterated semi-naively. A round evaluates, for each member and each occurrence of a member in its
   query, the query with that occurrence reading only the rows the previous round added (the *delta*) and
   every other occurrence reading everything so far; the round's new rows are those not seen before. For
   monotone queries (joins, unions, filters, projections, DISTINCT, EXISTS) this finds every row the naive
   iteration finds, and the iteration stops at the first round where no member gained a row: convergence
   is judged on the net delta rows, not on row counts (a swap that keeps a count would fool a count).
   Starting from nothing is what makes deletions right: a row that only supported itself around the cycle
   (A = E ∪ B, B = A, x deleted from E) is not derived again, so it disappears from every member. Keeping
   the old contents and iterating from there would stop at a fixpoint that still holds x.
4. A member whose rows changed is overwritten in one checked commit carrying the outside frontier; one
   whose rows did not change commits nothing (a soft frontier, as an empty delta does), so its readers find
   NO_DATA. Members hold sets: each row once (the semantics of ``WITH RECURSIVE ... UNION``; a bag cycle,
   ``UNION ALL`` around a cycle, has no finite fixpoint).

A component that needs more than ``max_fixpoint_iterations`` rounds (default 100) puts every member in ERROR
with the count; nothing is written. The rounds' rows are held on the driver (Arrow): cycles are for graph
closures of modest size, and each round is one small Spark job per member occurrence.

Isolation: the members' commits are separate Delta commits, as every stream table's are; a reader between
two of them sees one member converged and the other not yet (pg_trickle's note A41-5 says the same of its
per-iteration commits; here only converged results are ever committed).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

import dvm
from connectors import delta_rs, delta_sink
from connectors.delta_log import DeltaLog
from dvm import Context, plain_rows_sql, quote
from pipeline import history, local_engine
from pipeline.catalog import StreamTableDef
from pipeline.decision import RefreshResult
from pipeline.errors import RefreshError
from pipeline.strata import ALLOW_CIRCULAR, MAX_ITERATIONS

if TYPE_CHECKING:
    from pipeline.refresh import Refresher

DEFAULT_MAX_ITERATIONS = 100
#: an outside source (or a member's stored rows) of at most this many bytes and rows is read once per
#: refresh by delta-rs and held as a local relation, so the rounds plan no Delta scan (no Spark job to read)
HOLD_BYTES, HOLD_ROWS = 64 << 20, 1_000_000


@dataclass
class Settings:
    """A pipeline's cycle settings: whether cycles are allowed, and the fixpoint's round limit."""

    allow_circular: bool = False
    max_fixpoint_iterations: int = DEFAULT_MAX_ITERATIONS

    @classmethod
    def resolve(cls, spark: Any, allow_circular: bool | None, max_iterations: int | None) -> Settings:
        """Explicit values win; else the Spark conf (:data:`ALLOW_CIRCULAR`, :data:`MAX_ITERATIONS`)."""
        if allow_circular is None:
            allow_circular = str(spark.conf.get(ALLOW_CIRCULAR, "false")).strip().lower() == "true"
        if max_iterations is None:
            max_iterations = int(spark.conf.get(MAX_ITERATIONS, str(DEFAULT_MAX_ITERATIONS)))
        if isinstance(max_iterations, bool) or not isinstance(max_iterations, int) or not 1 <= max_iterations <= 10000:
            raise ValueError(f"max_fixpoint_iterations must be an integer from 1 to 10000, got {max_iterations!r}")
        return cls(bool(allow_circular), max_iterations)


class NotConverged(RefreshError):
    """The component did not reach its fixpoint within the round limit."""


def refresh_component(refresher: Refresher, name: str, members: list[str], seen: set[str], pin: dict[str, int],
                      refresh_upstream: Callable[[str], None]) -> RefreshResult:
    """Refresh the cycle ``members`` (``name`` among them); returns ``name``'s result (see the module
    docstring). ``refresh_upstream`` refreshes a stream table the component reads from outside."""
    defs = {m: refresher.catalog.get(m) for m in members}
    outside = sorted({k for d in defs.values() for k, s in d.sources.items()
                      if s.kind == "stream_table" and k not in defs})
    for key in outside:
        if key not in seen:
            refresh_upstream(key)
            seen.add(key)
    with refresher.lock(f"scc:{members[0]}"):
        results = _Component(refresher, {m: refresher.catalog.get(m) for m in members}, pin).refresh()
    seen.update(members)
    return results[name]


class _Component:
    def __init__(self, refresher: Refresher, defs: dict[str, StreamTableDef], pin: dict[str, int]) -> None:
        self.r = refresher
        self.spark = refresher.spark
        self.defs = defs
        self.pin = pin
        self.run = uuid.uuid4().hex[:10]
        self.settings: Settings = getattr(refresher, "cycles", None) or Settings()
        self.held: dict[str, str] = {}  # outside source key -> the temp view holding its rows at the frontier
        self.held_rows: dict[str, pa.Table] = {}  # the same view name -> its rows (for DuckDB)
        #: DuckDB on the driver evaluates the rounds (pipeline.local_engine, its reviewed constructs only)
        #: unless the local engine is off or refused the queries; then Spark does
        self.local: Any = None if local_engine.mode(refresher.conf) == "off" else False
        self.engine_note = "Spark" if self.local is None else "DuckDB"
        self.schemas: dict[str, pa.Schema] = {}

    # --- the decision ---

    def outside_post(self) -> dict[str, tuple[str, int, str]]:
        """Every outside source of the component: key -> (path, version read, kind); base tables at the
        call's pin."""
        out: dict[str, tuple[str, int, str]] = {}
        for d in self.defs.values():
            for key, src in d.sources.items():
                if key in self.defs or key in out:
                    continue
                v = self.pin.get(src.path) if src.kind != "stream_table" else None
                if v is None:
                    v = DeltaLog(self.spark, src.path).latest_version()
                    if v is None:
                        raise RefreshError(f"source {key} of stream table {d.name} no longer exists at {src.path}")
                    if src.kind != "stream_table":
                        self.pin[src.path] = v
                out[key] = (src.path, v, src.kind)
        return out

    def refresh(self) -> dict[str, RefreshResult]:
        started, t0 = time.time(), time.perf_counter()
        post = self.outside_post()
        committed = {m: self.r._committed(d) for m, d in self.defs.items()}
        frontier = {k: v for k, (_, v, _) in post.items()}
        if all(c.frontier is not None and d.reinitialize is None
               and all(c.frontier.get(k) == frontier[k] for k in d.sources if k in frontier)
               for (m, d), c in zip(self.defs.items(), committed.values(), strict=True)):
            out = {}
            for m, d in self.defs.items():
                out[m] = RefreshResult(m, "NO_DATA", "no source outside the cycle changed since the last refresh",
                                       duration_ms=(time.perf_counter() - t0) * 1000, frontier=committed[m].frontier,
                                       refresh_id=d.last_refresh_id)
                history.write(self.r.catalog, history.no_data(m, out[m].reason, started, out[m].duration_ms,
                                                              out[m].frontier))
            return out
        try:
            rows, rounds = self.fixpoint(frontier)
        except NotConverged as e:
            self._error_all(started, t0, e, self.settings.max_fixpoint_iterations)
            raise
        except Exception as e:
            self._error_all(started, t0, e, None)
            raise
        base = self.base_frontier(post)
        out = {}
        for m, d in self.defs.items():
            out[m] = self.write(d, committed[m], rows[m], frontier, base, rounds, started, t0)
        return out

    def base_frontier(self, post: dict[str, tuple[str, int, str]]) -> dict[str, int]:
        """The base-table versions every member reflects: the outside base sources, and those the outside
        stream tables reflect (each records its own)."""
        out: dict[str, int] = {}
        for key, (path, v, kind) in post.items():
            if kind != "stream_table":
                out[path] = v
                continue
            meta = DeltaLog(self.spark, path).trickle_metadata_at(v) or {}
            soft = self.r.catalog.get(key).soft_frontier_over(v, meta) if self.r.catalog.exists(key) else None
            if soft is not None:
                meta = soft
            out.update({p: int(x) for p, x in (meta.get("base_frontier") or {}).items()})
        return out

    # --- the fixpoint ---

    def fixpoint(self, frontier: dict[str, int]) -> tuple[dict[str, pa.Table], int]:
        """Every member's rows at the least fixpoint over the outside sources at ``frontier``, and the rounds
        it took (the seed round counts as the first)."""
        full = {m: self._empty(d) for m, d in self.defs.items()}
        delta = dict(full)
        self._hold_outside(frontier)
        try:
            return self._iterate(full, delta, frontier)
        finally:
            for view in self.held.values():
                self.spark.catalog.dropTempView(view)
            self.held.clear()
            if self.local:
                self.local.con.close()

    def _hold_outside(self, frontier: dict[str, int]) -> None:
        """Read each small outside source once (delta-rs, no Spark job) and bind it as a temp view."""
        for d in self.defs.values():
            for key, src in d.sources.items():
                if key in self.defs or key in self.held:
                    continue
                table = delta_rs.read_small(src.path, frontier[key], HOLD_BYTES, HOLD_ROWS)
                if table is None:
                    continue  # read by the Delta time-travel FROM item instead
                if src.kind == "stream_table":
                    table = table.select(self.r.catalog.get(key).names)
                view = f"__trickle_cycle_{self.run}_src_{len(self.held)}"
                if table.num_rows:
                    self.spark.createDataFrame(table.combine_chunks()).createOrReplaceTempView(view)
                else:
                    columns = DeltaLog(self.spark, src.path).metadata(frontier[key])
                    if columns is None:
                        continue
                    names = set(table.column_names)
                    self.spark.createDataFrame([], ", ".join(f"{quote(c)} {t}" for c, t in columns.columns()
                                                             if c in names)).createOrReplaceTempView(view)
                self.held[key] = view
                self.held_rows[view] = table

    def _iterate(self, full: dict[str, pa.Table], delta: dict[str, pa.Table],
                 frontier: dict[str, int]) -> tuple[dict[str, pa.Table], int]:
        rounds = 0
        while True:
            rounds += 1
            if rounds > self.settings.max_fixpoint_iterations:
                raise NotConverged(
                    f"the cycle {', '.join(self.defs)} did not reach its fixpoint within "
                    f"{self.settings.max_fixpoint_iterations} iterations (max_fixpoint_iterations); every member "
                    "is in ERROR. Check that the cycle's rows are finite (a growing counter or a string that "
                    "keeps lengthening never converges), or raise the limit")
            new = self._round_local(frontier, full, delta, seed=rounds == 1)
            if new is None:
                self._bind(full, "full")
                self._bind(delta, "delta")
                try:
                    new = self._round(frontier, delta, seed=rounds == 1)
                finally:
                    self._unbind()
            if all(t.num_rows == 0 for t in new.values()):
                return full, rounds
            full = {m: pa.concat_tables([full[m], new[m]]) for m in self.defs}
            delta = new

    def _round(self, frontier: dict[str, int], delta: dict[str, pa.Table], seed: bool) -> dict[str, pa.Table]:
        """The rows each member gains this round, computed in ONE Spark job for the whole component (each
        member's rows packed in a struct column of its own; a job's fixed cost dominates at this size)."""
        parts = []
        for i, d in enumerate(self.defs.values()):
            sql = self._member_round(d, frontier, delta, seed)
            if sql is None:
                continue
            cols = ["CAST(NULL AS " + self._struct_type(x) + f") AS __r{j}" if x is not d else f"struct(*) AS __r{j}"
                    for j, x in enumerate(self.defs.values())]
            parts.append(f"SELECT {i} AS __m, {', '.join(cols)} FROM ({sql})")
        out = {m: self._empty(d) for m, d in self.defs.items()}
        if not parts:
            return out
        table = self.spark.sql(" UNION ALL ".join(parts)).toArrow()
        for i, (m, _) in enumerate(self.defs.items()):
            mine = table.filter(pc.equal(table.column("__m"), i)).column(f"__r{i}")
            if len(mine):
                out[m] = pa.Table.from_struct_array(mine).rename_columns(out[m].column_names).cast(out[m].schema)
        return out

    def _round_local(self, frontier: dict[str, int], full: dict[str, pa.Table], delta: dict[str, pa.Table],
                     seed: bool) -> dict[str, pa.Table] | None:
        """The round on DuckDB (no Spark job; milliseconds at this size), the queries translated by the local
        engine, which refuses any construct DuckDB might evaluate otherwise than Spark; None when it is off
        or refused (then Spark runs this round and the rest)."""
        if self.local is None:
            return None
        import duckdb

        try:
            if self.local is False:
                self.local = local_engine.LocalEngine(self.spark, Context(), None, HOLD_ROWS)
                for view, rows in self.held_rows.items():
                    self.local.con.register(view, rows)
            out = {}
            for m in self.defs:
                self.local.con.register(self._view(m, "full"), full[m])
                self.local.con.register(self._view(m, "delta"), delta[m])
            for m, d in self.defs.items():
                sql = self._member_round(d, frontier, delta, seed)
                empty = self._empty(d)
                if sql is None:
                    out[m] = empty
                    continue
                rows = self.local.con.sql(self.local.translate(sql)).to_arrow_table()
                out[m] = rows.rename_columns(empty.column_names).cast(empty.schema)
            return out
        except (local_engine.Unsupported, duckdb.Error, pa.ArrowException) as e:
            if self.local:
                self.local.con.close()
            self.local = None
            self.engine_note = f"Spark (DuckDB refused: {str(e).splitlines()[0][:200]})"
            return None

    @staticmethod
    def _struct_type(d: StreamTableDef) -> str:
        return "STRUCT<" + ", ".join(f"{quote(n)}: {t}" for n, t in zip(d.names, d.types, strict=True)) + ">"

    def _member_round(self, d: StreamTableDef, frontier: dict[str, int], delta: dict[str, pa.Table],
                      seed: bool) -> str | None:
        """The query of the rows member ``d`` gains this round: the union over its member occurrences of its
        query with that occurrence reading the previous round's delta of its member (the seed round: every
        member empty), less the rows it holds; None when it can gain none (no occurrence has a delta)."""
        if seed:
            branches = [self._pinned(d, frontier, lambda key, i: "full")]
        else:
            keys = self._occurrences(d)
            branches = [self._pinned(d, frontier, lambda key, i, j=j: "delta" if i == j else "full")
                        for j, key in enumerate(keys) if delta[key].num_rows]
        if not branches:
            return None
        cols = ", ".join(f"CAST({quote(n)} AS {t}) AS {quote(n)}" for n, t in zip(d.names, d.types, strict=True))
        union = " UNION ALL ".join(f"SELECT {cols} FROM ({b})" for b in branches)
        return f"SELECT DISTINCT * FROM ({union}) EXCEPT SELECT * FROM {self._view(d.name, 'full')}"

    def _occurrences(self, d: StreamTableDef) -> list[str]:
        """The member each occurrence of a member in ``d``'s query reads, in the order :meth:`_pinned` numbers
        them."""
        return [k for k in dvm.source_occurrences(d.maintained_query, d.dialect) if k in self.defs]

    def _pinned(self, d: StreamTableDef, frontier: dict[str, int], which: Callable[[str, int], str]) -> str:
        """``d``'s query with its outside sources read at ``frontier`` and the i-th occurrence of a member
        reading that member's ``which(key, i)`` relation ("full" or "delta")."""
        outside = self.r.from_items(d, {k: frontier.get(k, 0) for k in d.sources})
        outside.update({k: view for k, view in self.held.items() if k in outside})
        members = 0

        def item(key: str, _occurrence: int) -> str:
            nonlocal members
            if key not in self.defs:
                return outside[key]
            members += 1
            return self._view(key, which(key, members - 1))

        return dvm.pin_sources(d.maintained_query, item, d.dialect)

    def _view(self, member: str, which: str) -> str:
        return f"__trickle_cycle_{self.run}_{member}_{which}"

    def _bind(self, tables: dict[str, pa.Table], which: str) -> None:
        for m, t in tables.items():
            self._frame(self.defs[m], t).createOrReplaceTempView(self._view(m, which))

    def _unbind(self) -> None:
        for m in self.defs:
            for which in ("full", "delta"):
                self.spark.catalog.dropTempView(self._view(m, which))

    def _frame(self, d: StreamTableDef, t: pa.Table) -> Any:
        schema = ", ".join(f"{quote(n)} {ty}" for n, ty in zip(d.names, d.types, strict=True))
        if t.num_rows == 0:  # pyspark cannot convert an Arrow table without chunks
            return self.spark.createDataFrame([], schema)
        return self.spark.createDataFrame(t.combine_chunks()).toDF(*d.names)

    def _empty(self, d: StreamTableDef) -> pa.Table:
        if d.name not in self.schemas:
            frame = self.spark.createDataFrame([], ", ".join(
                f"{quote(n)} {ty}" for n, ty in zip(d.names, d.types, strict=True)))
            self.schemas[d.name] = frame.limit(0).toArrow().schema
        return pa.Table.from_batches([], schema=self.schemas[d.name])

    # --- writing ---

    def write(self, d: StreamTableDef, committed: Any, rows: pa.Table, frontier: dict[str, int],
              base: dict[str, int], rounds: int, started: float, t0: float) -> RefreshResult:
        """Commit member ``d``'s fixpoint rows when they differ from what it holds (a multiset compare on
        the driver); record the refresh and the rounds either way."""
        version = committed.version
        held = self._held(d, version)
        mine = {k: frontier[k] for k in d.sources if k in frontier}
        members = {k: DeltaLog(self.spark, s.path).latest_version() or 0 for k, s in d.sources.items() if k in self.defs}
        post = {**mine, **members}
        refresh_id = uuid.uuid4().hex[:16]
        reason = (f"cycle {', '.join(self.defs)} reset and recomputed to its least fixpoint in {rounds} "
                  f"iterations (semi-naive, rounds on {self.engine_note})")
        new = _bag(rows)
        inserted = sum((new - held).values())
        deleted = sum((held - new).values())
        soft = None
        if d.reinitialize is None and committed.frontier is not None and inserted == 0 and deleted == 0:
            meta = committed.meta or {}
            soft = {"table_version": version, "refresh_id": meta.get("refresh_id"), "frontier": post,
                    "base_frontier": base, "source_ids": {}}
            reason += "; its rows did not change, so nothing was committed"
        else:
            record = {"refresh_id": refresh_id, "frontier": post, "action": "FULL", "name": d.name,
                      "base_frontier": base, "source_ids": {}, "fixpoint_iterations": rounds,
                      "apply": "OVERWRITE (spark): the cycle's fixpoint replaces the table"}
            self._overwrite(d, rows, record, version)
            self.r.after_commit(d.name)
        result = RefreshResult(d.name, "FULL", reason, inserted, deleted, 0, (time.perf_counter() - t0) * 1000,
                               post, refresh_id if soft is None else d.last_refresh_id)
        self.r._record_ok(d, started, result, soft)
        fresh = self.r.catalog.get(d.name)
        fresh.last_fixpoint_iterations = rounds
        fresh.reinitialize = None
        self.r.catalog.put(fresh)
        return result

    def _overwrite(self, d: StreamTableDef, rows: pa.Table, record: dict[str, Any], version: int | None) -> None:
        """Replace the member's contents by ``rows`` (plain rows, see :func:`dvm.plan.plain_rows_sql`) in one
        checked commit: by delta-rs when it may write the table and its stored columns are the plain rows'
        (no Spark write job), else by Spark's overwrite (which also replaces another layout's schema)."""
        view = f"__trickle_cycle_{self.run}_{d.name}_out"
        self._frame(d, rows).createOrReplaceTempView(view)
        try:
            frame = self.spark.sql(plain_rows_sql(f"SELECT * FROM {view}", d.names, d.types, record["refresh_id"],
                                                  d.float_identity))
            log = DeltaLog(self.spark, d.path)
            meta = log.metadata(version) if version is not None else None
            stored = [c for c, _ in meta.columns()] if meta is not None else []
            self.r.before_commit(d.name)
            if (version is None or delta_rs.unusable(d.path, log.protocol(version)) is not None
                    or sorted(stored) != sorted(frame.columns)):
                delta_sink.overwrite(self.spark, frame, d.path, record, version)
                return
            table = frame.toArrow()
            try:
                delta_rs.overwrite(d.path, table.select(stored), record, version, delta_sink.txn_version(version),
                                   delta_sink.TXN_APP_ID)
            except delta_rs.CommitFailed as e:
                raise delta_sink.CommitLost(f"delta-rs did not overwrite {d.path}: {e}") from e
        finally:
            self.spark.catalog.dropTempView(view)

    def _held(self, d: StreamTableDef, version: int | None) -> Any:
        """The member's user rows at ``version`` as a multiset (empty for a table not written yet)."""
        from collections import Counter

        if version is None:
            return Counter()
        small = delta_rs.read_small(d.path, version, HOLD_BYTES, HOLD_ROWS)
        if small is not None and set(d.names) <= set(small.column_names):
            return _bag(small.select(d.names))
        cols = ", ".join(quote(n) for n in d.names)
        return _bag(self.spark.sql(f"SELECT {cols} FROM delta.{quote(d.path)} VERSION AS OF {version}").toArrow())

    def _error_all(self, started: float, t0: float, e: BaseException, rounds: int | None) -> None:
        """Every member to ERROR (the limit) or with the failure recorded (anything else), and the rounds."""
        for m, d in self.defs.items():
            self.r._record_error(d, started, t0, e)
            fresh = self.r.catalog.get(m)
            if rounds is not None:
                fresh.status = "ERROR"
                fresh.last_fixpoint_iterations = rounds
            self.r.catalog.put(fresh)


def _bag(t: pa.Table) -> Any:
    from collections import Counter

    return Counter(zip(*(c.to_pylist() for c in t.columns), strict=True)) if t.num_columns else Counter()
