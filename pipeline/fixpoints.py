"""Fixpoint loops for recursive CTEs, run by the refresh before the query that reads them.

Spark's recursive CTEs are UNION ALL only (``UNION_NOT_SUPPORTED_IN_RECURSIVE_CTE``), and a UNION ALL
recursion over a graph with a cycle never ends. A recursive CTE with UNION (``dvm.operators.recursive``)
therefore renders its evaluation as :class:`dvm.context.Fixpoint` specs: semi-naive iteration, each round
joining only the tuples the previous round added and keeping only tuples not seen before, so it stops once
a round adds nothing — after at most as many rounds as the longest shortest derivation, cycles or not.

The UNION ALL rules (counting, semi-naive) run their propagation here too, as weighted loops netted per
round. Spark's own recursion costs several jobs per level (``UnionLoopExec`` counts each iteration, then
collects it again when it is small, and every broadcast join is a job of its own); a round here costs about
2 (the count that fills the round's local checkpoint, and a broadcast), and netting a round sums path
counts instead of enumerating paths (figures in docs/BENCHMARKS.md, "Figures behind the code").

The results are global temporary views (the MERGE runs in another session of the same application) and
are dropped, with their checkpoints, when the refresh is done.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import reduce
from typing import Any

from connectors import delta_rs
from connectors.delta_log import DeltaLog, TableMeta
from connectors.delta_sink import release_checkpoint
from dvm import HELD_SEED, PREV, Context, Fixpoint, key_filter, quote
from pipeline.errors import RefreshError

#: Spark's own bound on recursion depth; the fixpoint honours it too (-1: unbounded).
LEVEL_LIMIT = "spark.sql.cteRecursionLevelLimit"
#: rounds between two re-checkpoints of the accumulated result (keeps each round's plan small)
COMPACT_EVERY = 16
#: Spark conf: a source snapshot whose data files total fewer bytes than this (default 1 MiB, and at most
#: :data:`READ_BY_DRIVER_ROWS` rows) is held once per refresh and read by delta-rs on the driver, handed to
#: Spark as a local relation (0: never; see :func:`_read_by_driver`).
READ_BY_DRIVER_BELOW = "trickle.refresh.readByDriverBelowBytes"
READ_BY_DRIVER_ROWS = "trickle.refresh.readByDriverRows"
#: Spark conf: the same for a change window whose files total fewer bytes than this (default: the snapshots'
#: limit; 0: never; see :func:`_changes_by_driver`)
READ_CHANGES_BY_DRIVER_BELOW = "trickle.refresh.readChangesByDriverBelowBytes"
#: a held snapshot's seed (:meth:`dvm.context.Context.table`)
_SNAPSHOT = re.compile(re.escape(HELD_SEED) + r"delta\.`((?:[^`]|``)+)` VERSION AS OF (\d+)")
#: a held change window's seed (:meth:`dvm.context.Context.changes`; the path as ``sql_string`` quotes it)
_CHANGES = re.compile(re.escape(HELD_SEED) + r"table_changes_by_path\('((?:[^'\\]|\\.)*)', (\d+), (\d+)\)")
#: the columns of Spark's ``table_changes`` a change window read on the driver adds to the table's own. Not
#: ``_commit_timestamp``: delta-rs takes it from the commit's ``commitInfo``, Spark from the commit file's
#: modification time (the two differ: figures in docs/BENCHMARKS.md, "Figures behind the code"), and no
#: delta rule reads it; a rule that did would fail to resolve it rather than read other values.
_CHANGE_COLUMNS = (("_change_type", "string"), ("_commit_version", "long"))

#: Settings for every session that reads loop results. A union of local checkpoints carries constraints
#: over attributes it does not output, and Spark 4.1.1's constraint propagation then fails with
#: ``NoSuchElementException: key not found: id#...`` in ``UnionBase.rewriteConstraints`` (seen under a
#: HAVING over a GROUP BY over such a union, in the demo's refresh). Constraint propagation only infers
#: extra filters, so turning it off costs nothing here.
#:
#: Only where a loop's union is read: with constraint propagation off, Spark 4.1.1 returns WRONG rows for a
#: LATERAL subquery with ORDER BY ... LIMIT (a left row's top-N came out as other rows; found by the lateral
#: oracle, seed 808), so every other query keeps Spark's default.
READ_CONF = {"spark.sql.constraintPropagation.enabled": "false"}


def read_conf(ctx: Context) -> dict[str, str]:
    """Settings for a session that reads ``ctx``'s fixpoints: :data:`READ_CONF` when a loop result (a union
    of checkpoints) is among them, nothing for source reads held once (one checkpoint each)."""
    return READ_CONF if any(spec.step is not None for _, spec in ctx.fixpoints) else {}


def reader(spark: Any, ctx: Context, conf: dict[str, str] | None = None) -> Any:
    """A session to run a query that reads ``ctx``'s fixpoints (``spark`` itself when there are none), with
    ``conf`` (default :func:`read_conf`)."""
    if not ctx.fixpoints:
        return spark
    session = spark.newSession()
    for k, v in (read_conf(ctx) if conf is None else conf).items():
        session.conf.set(k, v)
    return session


@contextmanager
def evaluated(spark: Any, ctx: Context, conf: dict[str, str] | None = None) -> Iterator[Callable[[str], str]]:
    """Evaluate ``ctx``'s fixpoints (in order: a later one may read an earlier one) for the duration of
    the block, in a session with ``conf`` (see :func:`reader`); nothing to do for queries without any.
    Yields ``bind``: a rendered query with its key filters filled in (see :func:`bind`)."""
    if not ctx.fixpoints:
        yield lambda sql: sql
        return
    session = reader(spark, ctx, conf)
    held: list[Any] = []
    views: list[str] = []
    predicates: dict[str, str] = {}
    try:
        for name, spec in ctx.fixpoints:
            spec = Fixpoint(spec.columns, bind(session, ctx, spec.seed, predicates),
                            None if spec.step is None else bind(session, ctx, spec.step, predicates), spec.weighted)
            df = run(session, spec, held, by_driver=name in ctx.driver_held)
            view = name.split(".", 1)[1]
            df.createOrReplaceGlobalTempView(view)
            views.append(view)
        yield lambda sql: bind(session, ctx, sql, predicates)
    finally:
        for view in views:
            spark.catalog.dropGlobalTempView(view)
        for df in held:
            release_checkpoint(df)


def bind(session: Any, ctx: Context, sql: str, predicates: dict[str, str]) -> str:
    """``sql`` with the token of each key filter it holds (see :mod:`dvm.key_filter`) replaced by its
    predicate, from the keys of the held relation (already registered: rendering holds it before any query
    reads the token). The keys of all the filters ``sql`` needs are read in one job, once per refresh
    (``predicates`` keeps them by token)."""
    wanted = [(token, spec) for token, spec in ctx.key_filters if token in sql and token not in predicates]
    if wanted:
        types = [session.sql(f"SELECT {spec.key} FROM {spec.held}").schema.fields[0].dataType.simpleString()
                 for _, spec in wanted]  # analysis only, no job
        kinds = sorted(set(types))
        for row in session.sql(key_filter.keys_query([(spec, t) for (_, spec), t in zip(wanted, types, strict=True)])
                               ).collect():
            token, spec = wanted[row[0]]
            keys = row[1 + kinds.index(types[row[0]])]
            predicates[token] = key_filter.predicate(list(keys), spec.column)
    for token, _ in ctx.key_filters:
        if token in sql:
            sql = sql.replace(token, predicates[token])
    return sql


def run(session: Any, spec: Fixpoint, held: list[Any], by_driver: bool = False) -> Any:
    """``spec`` evaluated as a DataFrame (see :class:`dvm.context.Fixpoint`). ``by_driver``: the context
    found the held read small enough for the driver (see :meth:`dvm.context.Context.changes`)."""
    limit = int(session.conf.get(LEVEL_LIMIT, "100"))
    cols = list(spec.columns)

    def materialise(df: Any) -> tuple[Any, int]:
        df = df.localCheckpoint(eager=False)
        held.append(df)
        return df, df.count()

    def netted(sql: str) -> Any:
        """Rows of ``sql`` named by ``cols``; weighted: one row per tuple with its summed weight."""
        df = session.sql(f"SELECT * FROM ({sql})")
        df = df.toDF(*cols) if cols else df
        if not spec.weighted:
            return df
        df.createOrReplaceTempView("__trickle_round__")
        keys = ", ".join(quote(c) for c in cols[:-1])
        w = quote(cols[-1])
        return session.sql(f"SELECT {keys}, SUM({w}) AS {w} FROM __trickle_round__ GROUP BY {keys} "
                           f"HAVING SUM({w}) <> 0")

    if spec.step is None and (small := _read_by_driver(session, spec.seed)) is not None:
        return small
    if spec.step is None and by_driver and (changes := _changes_by_driver(session, spec.seed)) is not None:
        return changes
    if spec.step is None:  # filled by the first job that reads it: no job of its own
        df = netted(spec.seed).localCheckpoint(eager=False)
        held.append(df)
        return df
    found, n = materialise(netted(spec.seed) if spec.weighted else netted(spec.seed).distinct())
    parts = [found]
    frontier = found
    rounds = 0
    while n > 0:
        rounds += 1
        if 0 <= limit < rounds:
            raise RefreshError(f"a recursive CTE did not reach its fixpoint in {limit} rounds (Spark's "
                               f"{LEVEL_LIMIT}); raise that setting if the data is that deep")
        if len(parts) > COMPACT_EVERY:
            whole, _ = materialise(reduce(lambda a, b: a.unionAll(b), parts))
            parts = [whole]
        frontier.createOrReplaceTempView(PREV)
        step = netted(spec.step)
        if not spec.weighted:  # keep only tuples no round found before
            step.createOrReplaceTempView("__trickle_step__")
            reduce(lambda a, b: a.unionAll(b), parts).createOrReplaceTempView("__trickle_seen__")
            step = session.sql("SELECT * FROM __trickle_step__ EXCEPT SELECT * FROM __trickle_seen__")
        frontier, n = materialise(step)
        parts.append(frontier)
    return reduce(lambda a, b: a.unionAll(b), parts)


#: the last snapshots read by the driver, as Spark relations, by (application, path, version, commit
#: signature, limits): a refresh reads a source at its pre and post versions and the next refresh's pre is this one's
#: post, and an unchanged dimension is read at the same version every time (see :func:`_read_by_driver`)
_DRIVER_READS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_DRIVER_READS_KEPT = 16
_DRIVER_READS_LOCK = threading.Lock()


def _read_by_driver(session: Any, seed: str) -> Any | None:
    """A small source snapshot read by delta-rs as Spark's local relation, typed by the table's schema;
    None when ``seed`` is not a snapshot, the table is larger than the limits, or delta-rs might read it
    differently from Spark (see :func:`connectors.delta_rs.unreadable`).

    Why: Spark resolves a time-travel read by reconstructing the table's snapshot at that version and
    planning its scan, and the held relation then costs a job of its own; a small table read here costs a
    fraction of that (figures in docs/BENCHMARKS.md, "Figures behind the code")."""
    m = _SNAPSHOT.fullmatch(seed)
    max_rows = int(session.conf.get(READ_BY_DRIVER_ROWS, "100000"))
    max_bytes = int(session.conf.get(READ_BY_DRIVER_BELOW, str(1 << 20))) - 1
    if m is None or max_rows <= 0 or max_bytes <= 0:
        return None
    path, version = m.group(1).replace("``", "`"), int(m.group(2))
    # A version's rows never change, so a relation read before is reused (reading a small dimension and
    # handing it to Spark again cost every refresh: figures in docs/BENCHMARKS.md, "Figures behind the
    # code"); the commit file's signature tells a table re-created at the same path from the one read before;
    # a relation belongs to the Spark application that made it.
    log = DeltaLog(session, path)
    signature = log.commit_signature(version)
    key = (session.sparkContext.applicationId, path, version, signature, max_bytes, max_rows)
    if signature is not None:
        with _DRIVER_READS_LOCK:
            if (hit := _DRIVER_READS.get(key)) is not None:
                _DRIVER_READS.move_to_end(key)
                return hit
    df = driver_relation(session, log, version, max_bytes, max_rows)
    if df is not None and signature is not None:
        with _DRIVER_READS_LOCK:
            _DRIVER_READS[key] = df
            while len(_DRIVER_READS) > _DRIVER_READS_KEPT:
                _DRIVER_READS.popitem(last=False)
    return df


def _read_like_spark(log: DeltaLog, version: int) -> TableMeta | None:
    """The table's metadata at ``version`` when delta-rs reads that version as Spark would; None when it might
    not (a reader feature such as column mapping, or a ``CHAR(n)`` column, which Spark pads
    on read while the files hold it unpadded) or the version is unknown."""
    if delta_rs.unreadable(log.protocol(version)) is not None:
        return None
    meta = log.metadata(version)
    return None if meta is None or '"char(' in meta.schema_json.lower() else meta


def driver_relation(session: Any, log: DeltaLog, version: int, max_bytes: int, max_rows: int,
                    columns: Sequence[str] | None = None) -> Any | None:
    """The snapshot of ``log``'s table at ``version`` read by delta-rs, as a Spark relation (see
    :func:`_read_by_driver`); only ``columns`` (all when None), chosen in Arrow: a Spark ``select`` of them
    costs two py4j calls a column."""
    meta = _read_like_spark(log, version)
    table = delta_rs.read_small(log.path, version, max_bytes, max_rows) if meta is not None else None
    if table is None or meta is None:
        return None
    from pyspark.sql.types import StructType  # pure Python

    schema = StructType.fromJson(json.loads(meta.schema_json))
    if sorted(table.column_names) != sorted(schema.fieldNames()):
        return None
    if columns is not None:
        if not set(columns) <= set(schema.fieldNames()):
            return None
        schema = StructType([schema[c] for c in columns])
    try:
        return session.createDataFrame(table.select(schema.fieldNames()), schema=schema)
    except Exception:  # noqa: BLE001 - an optimisation only: a type Arrow hands over differently goes to Spark
        return None


def _changes_by_driver(session: Any, seed: str) -> Any | None:
    """A small held change window read by delta-rs as Spark's local relation, typed as ``table_changes``
    types it (without ``_commit_timestamp``, see :data:`_CHANGE_COLUMNS`); None when ``seed`` is not a change
    window, delta-rs might read it differently from Spark (:func:`_read_like_spark`), the schema changed inside
    the window, or it holds too many rows.

    Why: a change window inside a delta job is a Change Data Feed query of its own for Spark to plan (the
    window's commits listed and read, each cdc or data file a scan task). The caller's context held it only
    when the window's files total less than ``trickle.refresh.readChangesByDriverBelowBytes``."""
    m = _CHANGES.fullmatch(seed)
    max_rows = int(session.conf.get(READ_BY_DRIVER_ROWS, "100000"))
    if m is None or max_rows <= 0:
        return None
    path, first, last = re.sub(r"\\(.)", r"\1", m.group(1)), int(m.group(2)), int(m.group(3))
    log = DeltaLog(session, path)
    if first < 1:
        return None
    meta, before = _read_like_spark(log, last), _read_like_spark(log, first - 1)
    if meta is None or before is None or meta.schema_json != before.schema_json:
        return None
    table = delta_rs.read_changes(path, first, last, max_rows)
    if table is None:
        return None
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType  # pure Python

    schema = StructType.fromJson(json.loads(meta.schema_json))
    for name, kind in _CHANGE_COLUMNS:
        schema = schema.add(name, kind)
    if not set(schema.fieldNames()) <= set(table.column_names):
        return None
    try:
        arrow = to_arrow_schema(schema)
        table = pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in arrow], schema=arrow)
        return session.createDataFrame(table, schema=schema)
    except Exception:  # noqa: BLE001 - an optimisation only: a type Arrow hands over differently goes to Spark
        return None
