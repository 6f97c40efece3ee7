"""Oracle harness: random changes to Delta sources, then stream table == its query run from scratch.

Why: incremental maintenance is only correct if, after *any* sequence of source changes, a refreshed
stream table holds exactly what its defining query returns on the same source snapshot (Delayed View
Semantics). Hand-written expected rows cannot cover the corner cases (key updates, NULLs, duplicates,
join partners vanishing in the same window), so we generate them at random from a seed and let Spark
itself compute the expected answer.

Pieces:

* :class:`Col` / :class:`TableSpec` describe a source table; :class:`ChangeGenerator` creates it as a
  Delta table with CDF on, keeps a Python model of its rows, and applies each cycle's random batch as
  ONE ``MERGE`` per table (so the Change Data Feed shows real update pre/post images, not a rewrite).
* :func:`compare_rows` / :func:`assert_matches` compare multisets of rows with a float tolerance and
  render a readable diff.
* :func:`run_oracle` drives a set of stream tables over shared sources for many cycles and checks the
  refresh action, the frontier and the contents after every refresh.

Queries name tables through ``{placeholders}``: ``{orders}`` is a source of the spec, ``{totals}`` is
another stream table of the same run (a DAG edge). Real names get a unique suffix so tests never clash
in the session catalog.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from functools import reduce
from typing import TYPE_CHECKING, Any, Literal

from pipeline.strata import SKIPPED

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import DataFrame, SparkSession

Kind = Literal["int", "string", "double", "jkey", "array"]
Row = tuple[Any, ...]

#: Small string pool: duplicates and equal values across tables happen often; "" is not NULL.
STRINGS: tuple[str, ...] = ("alpha", "beta", "gamma", "Delta", "eps", "", "x y")

_SUFFIX = itertools.count(1)


def unique_suffix() -> str:
    """A session-unique suffix: the in-memory session catalog is shared by every test of the run."""
    return f"{os.getpid() % 10000}_{next(_SUFFIX)}"


def sql_literal(value: Any, sql_type: str | None = None) -> str:
    """A typed Spark SQL literal. Test data goes into tables as ``VALUES`` literals, not through
    ``createDataFrame``: a local list becomes a Python RDD, whose Python worker processes cost seconds
    per batch on a 2-core machine. Without ``sql_type`` the literal is untyped (INSERT casts it)."""
    if value is None:
        return f"CAST(NULL AS {sql_type})" if sql_type else "NULL"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return f"CAST('{value!r}' AS {sql_type or 'DOUBLE'})"
    if isinstance(value, tuple):  # an ARRAY value (tuples keep model rows hashable)
        inner = sql_type[6:-1] if sql_type and sql_type.upper().startswith("ARRAY<") else None
        body = f"array({', '.join(sql_literal(v, inner) for v in value)})"
        return f"CAST({body} AS {sql_type})" if sql_type else body
    return f"CAST({value} AS {sql_type})" if sql_type else str(value)


#: The harness's own Spark statements (the oracle's recomputation, the sources' Spark MERGEs) join tables of
#: tens of rows: without broadcasts (a broadcast is a Spark job of its own, collected to the driver and
#: shipped), so over the oracle's single-partition inputs (see ``run_oracle``) a cycle's compare is one job
#: without a shuffle, plus one per uncorrelated scalar subquery. Results are the same; only the physical
#: plan differs.
ORACLE_JOINS = {"spark.sql.autoBroadcastJoinThreshold": "-1"}


@contextmanager
def session_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """Run the block with ``conf`` set on the session, then restore what was there (the session is shared
    by every test of the run, and refreshes read their own settings from it)."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def values_sql(rows: Sequence[Row], columns: Sequence[tuple[str, str]]) -> str:
    """``VALUES`` rows as a FROM item aliased ``s`` with the given (name, SQL type) columns."""
    body = ", ".join(
        "(" + ", ".join(sql_literal(v, t) for v, (_, t) in zip(r, columns, strict=True)) + ")" for r in rows
    )
    # a subquery, not ``(VALUES ...) AS s(cols)``: MERGE rejects column aliases on its source
    return f"(SELECT * FROM VALUES {body} AS v({', '.join(n for n, _ in columns)})) s"


# --------------------------------------------------------------------------------------------------
# Source description and random change generation
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """One value column. ``jkey`` is an int join key drawn from a small domain so that joins match.
    ``array`` is an ARRAY<INT> of 0 to 3 elements drawn from ``domain`` (default 0..5), elements NULL at
    times, the array itself NULL like any nullable value; in model rows it is a tuple."""

    name: str
    kind: Kind = "int"
    nullable: bool = True
    domain: tuple[int, int] | None = None  # inclusive range for int / jkey

    def sql_type(self) -> str:
        return {"int": "INT", "jkey": "INT", "double": "DOUBLE", "string": "STRING", "array": "ARRAY<INT>"}[self.kind]

    def random_value(self, rng: random.Random, null_p: float) -> Any:
        if self.nullable and rng.random() < null_p:
            return None
        if self.kind == "string":
            return rng.choice(STRINGS)
        if self.kind == "array":
            lo, hi = self.domain or (0, 5)
            return tuple(None if rng.random() < 0.2 else rng.randint(lo, hi) for _ in range(rng.randint(0, 3)))
        if self.kind == "double":
            lo, hi = self.domain or (-50, 150)
            return round(rng.uniform(lo, hi), 2)
        lo, hi = self.domain or ((1, 6) if self.kind == "jkey" else (0, 20))
        return rng.randint(lo, hi)


@dataclass(frozen=True)
class TableSpec:
    """A source table: optional int key column (unique, never NULL) followed by ``cols``.

    ``key=None`` makes a keyless table: rows are identified only by their values and exact duplicate
    rows exist. ``key_range`` draws keys from a small range (dimension tables that other tables join
    to by a ``jkey`` column), so deleted keys get reused and joins find partners.
    """

    name: str
    cols: tuple[Col, ...]
    key: str | None = "id"
    key_range: tuple[int, int] | None = None
    rows: int = 40
    dup_fraction: float = 0.15
    null_p: float = 0.15
    max_changes: int = 5

    @property
    def columns(self) -> list[str]:
        return ([self.key] if self.key else []) + [c.name for c in self.cols]

    def ddl(self, real_name: str) -> str:
        parts = ([f"{self.key} INT"] if self.key else []) + [f"{c.name} {c.sql_type()}" for c in self.cols]
        return (
            f"CREATE TABLE {real_name} ({', '.join(parts)}) USING delta "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )


@dataclass(frozen=True)
class Churn:
    """In some cycles: update ``child.fk`` of a row away from ``x`` AND delete the parent with key ``x``.

    This is the classic join-maintenance trap: computing the delete side against the parent's *current*
    state misses the old partner, so the stale joined row survives.
    """

    child: str
    fk: str
    parent: str
    p: float = 0.35


@dataclass(frozen=True)
class Extreme:
    """In some cycles: delete (or move away) the row holding the MIN or MAX of ``table.col``."""

    table: str
    col: str
    p: float = 0.3


@dataclass(frozen=True)
class Subtree:
    """In some cycles: insert a small subtree into ``table``: a new row whose ``parent`` column points at an
    existing row's key, then rows whose parent is one of the new rows (hierarchies, graphs)."""

    table: str
    parent: str
    size: tuple[int, int] = (2, 4)
    p: float = 0.3


@dataclass
class Op:
    """One row change of a batch. ``old`` is the pre-state row (U/D), ``new`` the post-state row (U/I)."""

    op: Literal["I", "U", "D"]
    old: Row | None
    new: Row | None
    count: int = 1  # target rows affected (every exact copy for keyless tables)


@dataclass
class _Source:
    spec: TableSpec
    real: str
    rows: dict[int, Row] = field(default_factory=dict)  # internal row id -> row (key first if keyed)
    version: int = -1
    next_rid: int = 0
    next_key: int = 1
    path: str | None = None  # the Delta table's location, once asked

    def key_idx(self) -> int:
        return 0

    def keys(self) -> set[int]:
        return {r[0] for r in self.rows.values()} if self.spec.key else set()

    def add(self, row: Row) -> int:
        rid = self.next_rid
        self.next_rid += 1
        self.rows[rid] = row
        return rid


class ChangeGenerator:
    """Creates the source tables and applies seeded random change batches, one MERGE per table.

    The generator keeps a Python model of every table (``expected_rows``) so a self-test can verify it
    mirrors Delta exactly, and it knows each table's Delta version (``versions``) so frontiers reported
    by refreshes can be checked.
    """

    def __init__(
        self,
        spark: SparkSession,
        specs: Sequence[TableSpec],
        seed: int,
        suffix: str | None = None,
        churn: Sequence[Churn] = (),
        extremes: Sequence[Extreme] = (),
        change_p: float = 0.88,
        subtrees: Sequence[Subtree] = (),
        insert_only_p: float = 0.0,
    ) -> None:
        self.spark = spark
        self.rng = random.Random(seed)
        self.seed = seed
        self.suffix = suffix or unique_suffix()
        self.sources: dict[str, _Source] = {s.name: _Source(s, f"{s.name}_{self.suffix}") for s in specs}
        self.churn = list(churn)
        self.extremes = list(extremes)
        self.change_p = change_p
        self.subtrees = list(subtrees)
        self.insert_only_p = insert_only_p  # chance that a cycle only inserts rows (into every table)
        self.last_ops: dict[str, list[Op]] = {}
        self.log: dict[str, dict[int, list[Op]]] = {n: {} for n in self.sources}  # name -> version -> ops

    # -- public ------------------------------------------------------------------------------------

    @property
    def names(self) -> dict[str, str]:
        """Logical name -> real catalog name."""
        return {n: s.real for n, s in self.sources.items()}

    @property
    def versions(self) -> dict[str, int]:
        """Logical name -> current Delta version (counted: CREATE = 0, initial INSERT = 1, +1 per MERGE)."""
        return {n: s.version for n, s in self.sources.items()}

    def expected_rows(self, name: str) -> list[Row]:
        return list(self.sources[name].rows.values())

    def create(self) -> dict[str, str]:
        """Create every source with its initial rows (NULLs and duplicate value rows included)."""
        for src in self.sources.values():
            spec = src.spec
            self.spark.sql(spec.ddl(src.real))
            src.version = 0
            if spec.key:
                if spec.key_range:
                    lo, hi = spec.key_range
                    keys = sorted(self.rng.sample(range(lo, hi + 1), min(spec.rows, hi - lo + 1)))
                else:
                    keys = sorted(self.rng.sample(range(1, 3 * spec.rows), spec.rows))
                src.next_key = max(keys) + 1
            else:
                keys = [0] * spec.rows
            initial: list[Row] = []
            for k in keys:
                if initial and self.rng.random() < spec.dup_fraction:
                    vals = self._values(self.rng.choice(initial), spec)
                else:
                    vals = tuple(c.random_value(self.rng, spec.null_p) for c in spec.cols)
                row = ((k,) if spec.key else ()) + tuple(vals)
                initial.append(row)
                src.add(row)
            if initial:
                self._append_delta_rs(src, [Op("I", None, row) for row in initial])
                src.version = 1
        return self.names

    def cycle(self, empty: bool = False) -> set[str]:
        """Apply one random batch; return the logical names of the tables that got a commit."""
        batches: dict[str, list[Op]] = {n: [] for n in self.sources}
        touched: dict[str, set[int]] = {n: set() for n in self.sources}
        # no draw unless asked for: other tests' seeds keep producing the batches they were checked with
        inserts_only = not empty and self.insert_only_p > 0 and self.rng.random() < self.insert_only_p
        if not empty and inserts_only:
            for sub in self.subtrees:
                if self.rng.random() < sub.p:
                    self._subtree(sub, batches, touched)
            for name, src in self.sources.items():
                if self.rng.random() < self.change_p or batches[name]:
                    for _ in range(self.rng.randint(1, src.spec.max_changes)):
                        self._random_insert(src, batches[name], touched[name])
        elif not empty:
            for sub in self.subtrees:
                if self.rng.random() < sub.p:
                    self._subtree(sub, batches, touched)
            for ch in self.churn:
                if self.rng.random() < ch.p:
                    self._churn(ch, batches, touched)
            for ex in self.extremes:
                if self.rng.random() < ex.p:
                    self._extreme(ex, batches, touched)
            for name, src in self.sources.items():
                if self.rng.random() < self.change_p or batches[name]:
                    for _ in range(self.rng.randint(1, src.spec.max_changes)):
                        self._random_op(src, batches[name], touched[name])
        changed: set[str] = set()
        for name, ops in batches.items():
            if ops:
                self._merge(self.sources[name], ops)
                changed.add(name)
        self.last_ops = batches
        return changed

    def model_sql(self, name: str) -> str:
        """A query returning the model's rows of ``name``: typed ``VALUES``, no Spark job to build, no Delta
        file listing to plan. :meth:`verify_contents` proves the model equals the Delta table."""
        spec = self.sources[name].spec
        cols = self._columns(spec)
        rows = self.expected_rows(name)
        if not rows:
            nulls = ", ".join(f"CAST(NULL AS {t}) AS {n}" for n, t in cols)
            return f"SELECT {nulls} WHERE false"
        body = ", ".join("(" + ", ".join(sql_literal(v, t) for v, (_, t) in zip(r, cols, strict=True)) + ")"
                         for r in rows)
        return f"SELECT * FROM VALUES {body} AS v({', '.join(n for n, _ in cols)})"

    def verify_contents(self) -> None:
        """Every table's Delta rows equal the model's, as multisets, in one Spark job."""
        from pyspark.sql import functions as F

        parts = [self.spark.table(src.real).select(F.lit(n).alias("t"), F.to_json(F.struct("*")).alias("j"))
                 for n, src in self.sources.items()]
        got: dict[str, list[Row]] = {n: [] for n in self.sources}
        for r in reduce(lambda x, y: x.unionAll(y), parts).collect():
            spec = self.sources[r["t"]].spec
            d = json.loads(r["j"])
            got[r["t"]].append(tuple(_model_value(d.get(c), k) for c, k in
                                     zip(spec.columns, (["int"] if spec.key else []) + [c.kind for c in spec.cols],
                                         strict=True)))
        for n in self.sources:
            missing, extra = compare_rows(self.expected_rows(n), got[n])
            assert not missing and not extra, (
                f"source {n}: the generator's model differs from the Delta table (missing {dict(missing)}, "
                f"extra {dict(extra)})"
            )

    def verify_versions(self) -> None:
        """Cross-check the counted versions with Delta's history (one cheap metadata query per table)."""
        for name, src in self.sources.items():
            v = self.spark.sql(f"DESCRIBE HISTORY {src.real} LIMIT 1").collect()[0]["version"]
            assert v == src.version, f"source {name}: counted version {src.version}, Delta says {v}"

    # -- change planning (sequential semantics == MERGE semantics, see _candidates) --------------

    @staticmethod
    def _values(row: Row, spec: TableSpec) -> Row:
        return row[1:] if spec.key else row

    @staticmethod
    def _columns(spec: TableSpec, change: bool = False) -> list[tuple[str, str]]:
        """(name, SQL type) of the table, or of a change batch: op, the match columns' old values, new row."""
        cols = ([(spec.key, "INT")] if spec.key else []) + [(c.name, c.sql_type()) for c in spec.cols]
        if not change:
            return cols
        match = cols[:1] if spec.key else cols
        return [("op", "STRING")] + [(f"o_{n}", t) for n, t in match] + cols

    def _candidates(self, src: _Source, touched: set[int]) -> list[int]:
        """Rows a new U/D may target: untouched pre-state rows (each target row matched once per MERGE).

        For keyless tables a U/D hits every copy of a value tuple, so a tuple qualifies only if none of
        its copies was touched and no row written earlier in the batch has the same values.
        """
        free = [rid for rid in src.rows if rid not in touched]
        if src.spec.key:
            return free
        written = {src.rows[rid] for rid in touched if rid in src.rows}
        seen: set[Row] = set()
        out = []
        for rid in free:
            row = src.rows[rid]
            if row in written or row in seen:
                continue
            seen.add(row)
            out.append(rid)
        return out

    def _rids_of(self, src: _Source, rid: int) -> list[int]:
        """All internal rows one U/D on ``rid`` affects (all exact copies for keyless tables)."""
        if src.spec.key:
            return [rid]
        row = src.rows[rid]
        return [r for r, v in src.rows.items() if v == row]

    def _new_key(self, src: _Source) -> int:
        used = src.keys()
        if src.spec.key_range:
            lo, hi = src.spec.key_range
            free = [k for k in range(lo, hi + 1) if k not in used]
            if free:
                return self.rng.choice(free)
        k = max(src.next_key, max(used, default=0) + 1)
        src.next_key = k + 1
        return k

    def _update(self, src: _Source, rid: int, new: Row, ops: list[Op], touched: set[int]) -> None:
        old = src.rows[rid]
        rids = self._rids_of(src, rid)
        for r in rids:
            src.rows[r] = new
            touched.add(r)
        ops.append(Op("U", old, new, len(rids)))

    def _delete(self, src: _Source, rid: int, ops: list[Op], touched: set[int]) -> None:
        old = src.rows[rid]
        rids = self._rids_of(src, rid)
        for r in rids:
            del src.rows[r]
            touched.discard(r)
        ops.append(Op("D", old, None, len(rids)))

    def _insert(self, src: _Source, new: Row, ops: list[Op], touched: set[int]) -> None:
        touched.add(src.add(new))
        ops.append(Op("I", None, new))

    def _random_op(self, src: _Source, ops: list[Op], touched: set[int]) -> None:
        spec, rng = src.spec, self.rng
        cands = self._candidates(src, touched)
        r = rng.random()
        if cands and r < 0.70:
            rid = rng.choice(cands)
            row = list(src.rows[rid])
            off = 1 if spec.key else 0
            jkeys = [i for i, c in enumerate(spec.cols) if c.kind == "jkey"]
            nullable = [i for i, c in enumerate(spec.cols) if c.nullable]
            kind = rng.random()
            if spec.key and kind < 0.12:
                row[0] = self._new_key(src)  # key update: pre/post images carry different keys
            elif jkeys and kind < 0.40:
                i = rng.choice(jkeys)
                row[off + i] = spec.cols[i].random_value(rng, spec.null_p)
            elif nullable and kind < 0.55:
                row[off + rng.choice(nullable)] = None
            else:
                for i in rng.sample(range(len(spec.cols)), min(len(spec.cols), rng.randint(1, 2))):
                    row[off + i] = spec.cols[i].random_value(rng, spec.null_p)
            self._update(src, rid, tuple(row), ops, touched)
        elif cands and r < 0.85:
            self._delete(src, rng.choice(cands), ops, touched)
        else:
            self._random_insert(src, ops, touched)

    def _random_insert(self, src: _Source, ops: list[Op], touched: set[int]) -> None:
        spec, rng = src.spec, self.rng
        if src.rows and rng.random() < 0.4:  # duplicate of an existing value combination
            vals = self._values(rng.choice(list(src.rows.values())), spec)
        else:
            vals = tuple(c.random_value(rng, spec.null_p) for c in spec.cols)
        new = ((self._new_key(src),) if spec.key else ()) + tuple(vals)
        self._insert(src, new, ops, touched)

    def _subtree(self, sub: Subtree, batches: dict[str, list[Op]], touched: dict[str, set[int]]) -> None:
        src = self.sources[sub.table]
        if not src.spec.key:
            raise ValueError(f"subtree table {sub.table} needs a key column")
        pi = src.spec.columns.index(sub.parent)
        keys = sorted(src.keys())
        if not keys:
            return
        added: list[int] = []
        for n in range(self.rng.randint(*sub.size)):
            key = self._new_key(src)  # a free key of the range, else one past it
            row = [c.random_value(self.rng, 0.0) for c in src.spec.cols]
            row.insert(0, key)
            row[pi] = self.rng.choice(keys) if n == 0 else self.rng.choice(added)
            self._insert(src, tuple(row), batches[sub.table], touched[sub.table])
            added.append(key)

    def _churn(self, ch: Churn, batches: dict[str, list[Op]], touched: dict[str, set[int]]) -> None:
        child, parent = self.sources[ch.child], self.sources[ch.parent]
        if not parent.spec.key:
            raise ValueError(f"churn parent {ch.parent} needs a key column")
        fk_i = child.spec.columns.index(ch.fk)
        parents = {
            parent.rows[rid][0]: rid
            for rid in self._candidates(parent, touched[ch.parent])
        }
        kids = [
            rid
            for rid in self._candidates(child, touched[ch.child])
            if child.rows[rid][fk_i] in parents
        ]
        if not kids:
            return
        rid = self.rng.choice(kids)
        x = child.rows[rid][fk_i]
        others = [k for k in parent.keys() if k != x]
        row = list(child.rows[rid])
        row[fk_i] = self.rng.choice(others) if others else None
        self._update(child, rid, tuple(row), batches[ch.child], touched[ch.child])
        self._delete(parent, parents[x], batches[ch.parent], touched[ch.parent])

    def _extreme(self, ex: Extreme, batches: dict[str, list[Op]], touched: dict[str, set[int]]) -> None:
        src = self.sources[ex.table]
        i = src.spec.columns.index(ex.col)
        cands = [rid for rid in self._candidates(src, touched[ex.table]) if src.rows[rid][i] is not None]
        if not cands:
            return
        pick = max if self.rng.random() < 0.5 else min
        rid = pick(cands, key=lambda r: src.rows[r][i])
        if self.rng.random() < 0.7 or (src.spec.key and i == 0):  # a key column is never set to NULL
            self._delete(src, rid, batches[ex.table], touched[ex.table])
        else:
            row = list(src.rows[rid])
            row[i] = None if src.spec.cols[i - (1 if src.spec.key else 0)].nullable else row[i]
            if row[i] is not None:  # not nullable: move it to the middle of the domain instead
                row[i] = type(row[i])(0)
            self._update(src, rid, tuple(row), batches[ex.table], touched[ex.table])

    #: every how-manyth version of a source Spark's MERGE commits (the others: delta-rs). Spark's MERGE takes
    #: 1.2-1.5 s of the test JVM (it first rebuilds the snapshot delta-rs' commits left without a checksum), a
    #: fifth of the setops oracle's time at one in five; one in eight still gives each source of a 20-cycle run
    #: two commits of Spark's own (versions 8 and 16), its change feed as Spark writes it, and every other test
    #: changes its sources with Spark's own INSERT, UPDATE, DELETE and MERGE.
    SPARK_EVERY = 8

    def _by_delta_rs(self, src: _Source) -> bool:
        """Whether the next commit of ``src`` may be delta-rs's: not a keyless table of arrays (its MERGE
        matches rows on every column, and delta-rs does not compare arrays)."""
        return bool(src.spec.key) or not any(c.kind == "array" for c in src.spec.cols)

    def _merge(self, src: _Source, ops: list[Op]) -> None:
        """Apply a batch as ONE MERGE: U/D match the pre-state row (by key, or null-safe on all values).
        Four batches in five are committed by delta-rs instead of Spark (see :meth:`_merge_delta_rs`), a batch
        of inserts only as an append (:meth:`_append_delta_rs`), and so are the initial rows (:meth:`create`)."""
        if src.version % self.SPARK_EVERY != 0 and self._by_delta_rs(src):
            if all(op.op == "I" for op in ops):
                self._append_delta_rs(src, ops)
            else:
                self._merge_delta_rs(src, ops)
        else:
            self._merge_spark(src, ops)
        src.version += 1
        self.log[src.spec.name][src.version] = list(ops)

    @staticmethod
    def _change_rows(spec: TableSpec, ops: list[Op]) -> list[tuple[Any, ...]]:
        """``(op, old match columns..., new columns...)`` per change."""
        width = 1 if spec.key else len(spec.columns)
        data = []
        for op in ops:
            old = (op.old[:width] if spec.key else op.old) if op.old is not None else (None,) * width
            new = op.new if op.new is not None else (None,) * len(spec.columns)
            data.append((op.op, *old, *new))
        return data

    def _merge_spark(self, src: _Source, ops: list[Op]) -> None:
        spec = src.spec
        cols = spec.columns
        if spec.key:
            on = f"t.{spec.key} = s.o_{spec.key}"
        else:
            on = " AND ".join(f"t.{c} <=> s.o_{c}" for c in cols)
        sets = ", ".join(f"{c} = s.{c}" for c in cols)
        with session_conf(self.spark, ORACLE_JOINS):  # its join of the batch with the table: no broadcast job
            self.spark.sql(
                f"MERGE INTO {src.real} t USING "
                f"{values_sql(self._change_rows(spec, ops), self._columns(spec, change=True))} "
                f"ON s.op <> 'I' AND {on} "
                "WHEN MATCHED AND s.op = 'D' THEN DELETE "
                f"WHEN MATCHED AND s.op = 'U' THEN UPDATE SET {sets} "
                f"WHEN NOT MATCHED AND s.op = 'I' THEN INSERT ({', '.join(cols)}) "
                f"VALUES ({', '.join('s.' + c for c in cols)})"
            )

    def _merge_delta_rs(self, src: _Source, ops: list[Op]) -> None:
        """The same MERGE committed by delta-rs (the ``deltalake`` package): sources are written by other
        engines than Spark too, and their change feeds must be maintained alike. It also costs 40 ms where
        Spark's MERGE costs about a second, which is most of an oracle cycle."""
        import pyarrow as pa

        spec = src.spec
        cols = spec.columns
        table = self._delta_rs_table(src)
        schema = table.to_pyarrow_dataset().schema
        match = cols[:1] if spec.key else cols
        fields = ([pa.field("op", pa.string())] + [pa.field(f"o_{c}", schema.field(c).type) for c in match]
                  + [schema.field(c) for c in cols])
        source = _arrow(self._change_rows(spec, ops), fields)
        on = " AND ".join(f"(t.{c} IS NOT DISTINCT FROM s.o_{c})" for c in match)
        sets = {c: f"s.{c}" for c in cols}
        (table.merge(source, predicate=f"s.op <> 'I' AND {on}", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s.op = 'D'")
         .when_matched_update(updates=sets, predicate="s.op = 'U'")
         .when_not_matched_insert(updates=sets, predicate="s.op = 'I'")
         .execute())

    def _append_delta_rs(self, src: _Source, ops: list[Op]) -> None:
        """A batch of inserts only, appended by delta-rs: add actions and no change data files, as any writer
        that only appends commits them (the refresh sees an insert-only window either way: see
        ``DeltaLog.window``)."""
        from deltalake import write_deltalake

        table = self._delta_rs_table(src)
        schema = table.to_pyarrow_dataset().schema
        write_deltalake(table, _arrow([op.new for op in ops if op.new is not None],
                                      [schema.field(c) for c in src.spec.columns]), mode="append")

    def _delta_rs_table(self, src: _Source) -> Any:
        from deltalake import DeltaTable

        if src.path is None:
            src.path = self.spark.sql(f"DESCRIBE DETAIL {src.real}").first()["location"]
        return DeltaTable(src.path)


def _arrow(rows: Sequence[Sequence[Any]], fields: list[Any]) -> Any:
    """Rows as an Arrow table of ``fields`` (model arrays are tuples, Arrow's are lists)."""
    import pyarrow as pa

    arrays = [pa.array([r[i] if not isinstance(r[i], tuple) else list(r[i]) for r in rows], f.type)
              for i, f in enumerate(fields)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _model_value(v: Any, kind: str) -> Any:
    """A JSON-decoded Delta value in the model's form (arrays are tuples)."""
    return tuple(v) if kind == "array" and v is not None else v


# --------------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------------


def _norm(v: Any) -> Any:
    """Hashable, order-insensitive-to-float-noise form of a value (6 significant digits for floats)."""
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return v
        return float(f"{v:.6g}") + 0.0  # +0.0 turns -0.0 into 0.0
    if isinstance(v, list | tuple):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _norm(x)) for k, x in v.items()))
    return v


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    return a == b


def compare_rows(expected: Iterable[Row], actual: Iterable[Row]) -> tuple[Counter[Row], Counter[Row]]:
    """Multiset difference (missing, extra) after float normalisation plus a tolerant pairing pass.

    Exact Counter matching handles almost everything; values that straddle a rounding boundary (e.g.
    sums of doubles added in another order) are paired up by ``math.isclose`` afterwards.
    """
    # normalised -> raw rows per side: the tolerant pass must see unrounded values
    raw_e: dict[Row, list[Row]] = {}
    raw_a: dict[Row, list[Row]] = {}
    exp: Counter[Row] = Counter()
    act: Counter[Row] = Counter()
    for rows, counter, raw in ((expected, exp, raw_e), (actual, act, raw_a)):
        for r in rows:
            n = _norm(tuple(r))
            counter[n] += 1
            raw.setdefault(n, []).append(_norm_exact(tuple(r)))
    missing, extra = exp - act, act - exp
    if missing and extra:
        for m in list(missing):
            for e in list(extra):
                while missing[m] and extra[e] and any(_close(x, y) for x in raw_e[m] for y in raw_a[e]):
                    missing[m] -= 1
                    extra[e] -= 1
        missing, extra = +missing, +extra
    return missing, extra


def _norm_exact(v: Any) -> Any:
    """Like :func:`_norm` but keeps full float precision (for the tolerant pass)."""
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, list | tuple):
        return tuple(_norm_exact(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _norm_exact(x)) for k, x in v.items()))
    return v


def _fmt_rows(c: Counter[Row], other: Counter[Row], limit: int = 25) -> str:
    lines = []
    for row in sorted(c, key=repr)[:limit]:
        lines.append(f"    {row!r}  x{c[row]}")
    if len(c) > limit:
        lines.append(f"    ... {len(c) - limit} more distinct rows")
    return "\n".join(lines)


def format_diff(
    name: str, columns: Sequence[str], missing: Counter[Row], extra: Counter[Row], n_exp: int, n_act: int
) -> str:
    return (
        f"stream table {name!r} differs from its query ({n_exp} expected rows, {n_act} actual rows)\n"
        f"  columns: {list(columns)}\n"
        f"  missing (in query result, not in stream table): {sum(missing.values())} rows\n"
        f"{_fmt_rows(missing, extra)}\n"
        f"  extra (in stream table, not in query result): {sum(extra.values())} rows\n"
        f"{_fmt_rows(extra, missing)}"
    )


def json_rows(df: DataFrame, tag: str) -> DataFrame:
    """Rows as JSON strings so any schemas can be unioned and collected in one Spark job. One ``selectExpr``
    (one py4j call): each ``pyspark.sql.functions`` call costs about six, as PySpark notes its Python call site
    for error messages first (``_with_origin``), which made this 6% of an aggregate oracle's time."""
    columns = ", ".join("`" + c.replace("`", "``") + "`" for c in df.columns)
    return df.selectExpr(f"{sql_literal(tag)} AS tag",
                         f"to_json(struct({columns}), map('ignoreNullFields', 'false')) AS j")


def decode_row(j: str) -> Row:
    """A row from :func:`json_rows`'s JSON, its values in column order (pairs kept, so duplicate names survive)."""
    return tuple(v for _, v in json.loads(j, object_pairs_hook=list))


def read_stream_table(spark: SparkSession, st: Any, name: str) -> DataFrame:
    """The stream table's user columns as the oracle compares them: read by delta-rs (a reader other than
    Spark: every reader must see the query's rows) and handed to Spark as a local relation typed by the
    table's schema; through ``st.read`` when delta-rs might read it differently (deletion vectors, column
    mapping, CHAR columns) or the table is large. Why not always ``st.read``: Spark plans a scan of a table
    delta-rs committed to by replaying its log (no checksum file), most of an oracle cycle's compare step."""
    from connectors.delta_log import DeltaLog
    from pipeline.fixpoints import driver_relation

    d = st.catalog.get(name)
    log = DeltaLog(spark, d.path)
    version = log.latest_version()
    df = driver_relation(spark, log, version, 64 << 20, 1_000_000, d.names) if version is not None else None
    return st.read(name) if df is None else df


def check_many(
    spark: SparkSession, st: Any, pairs: Mapping[str, str], context: str = ""
) -> dict[str, str]:
    """Compare several stream tables to their queries with ONE collect; return name -> failure text.

    Each Spark job has a large fixed cost on a small machine, so all reads of a cycle are unioned.
    If the union itself fails (one read or query raises), fall back to one table at a time so the
    failure is attributed to the right stream table.
    """
    failures: dict[str, str] = {}
    parts: list[DataFrame] = []
    meta: dict[str, tuple[list[str], list[str]]] = {}
    for name, query in pairs.items():
        try:
            actual_df = read_stream_table(spark, st, name)
            expected_df = spark.sql(query)
        except Exception as e:  # noqa: BLE001 - report any failure against the table
            failures[name] = f"stream table {name!r}: reading it or its query failed: {type(e).__name__}: {e}"
            continue
        a_cols, e_cols = list(actual_df.columns), list(expected_df.columns)
        meta[name] = (a_cols, e_cols)
        if [c.lower() for c in a_cols] != [c.lower() for c in e_cols]:
            failures[name] = (
                f"stream table {name!r}: columns {a_cols} of st.read() differ from the query's {e_cols}"
            )
            continue
        parts += [json_rows(actual_df, f"a:{name}"), json_rows(expected_df, f"e:{name}")]
    if not parts:
        return failures
    try:
        with session_conf(spark, ORACLE_JOINS):
            collected = reduce(lambda x, y: x.unionAll(y), parts).collect()
    except Exception:  # noqa: BLE001
        if len(parts) == 2:
            raise
        for name in [n for n in pairs if n not in failures]:
            try:
                failures.update(check_many(spark, st, {name: pairs[name]}, context))
            except Exception as e:  # noqa: BLE001
                failures[name] = f"stream table {name!r}: comparing failed: {type(e).__name__}: {e}"
        return failures
    rows: dict[str, list[Row]] = {}
    for r in collected:
        rows.setdefault(r["tag"], []).append(decode_row(r["j"]))
    for name in meta:
        if name in failures:
            continue
        exp, act = rows.get(f"e:{name}", []), rows.get(f"a:{name}", [])
        missing, extra = compare_rows(exp, act)
        if missing or extra:
            failures[name] = (context + "\n" if context else "") + format_diff(
                name, meta[name][1], missing, extra, len(exp), len(act)
            ) + f"\n  query: {pairs[name]}"
    return failures


def check_steps_differential(spark: SparkSession, st: Any, src: str, queries: Mapping[str, str],
                             expected: Mapping[str, str], steps: Sequence[tuple[str, str]]) -> None:
    """Create each of ``queries`` (name -> SQL) as a DIFFERENTIAL stream table; then run each step's
    statement (``{src}`` filled in) and refresh them all, three at a time. Every refresh must be
    DIFFERENTIAL, and every table must equal its ``expected`` query after create and after each step."""
    for name, q in queries.items():
        st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL")
    failures = check_many(spark, st, expected, "after create")
    assert not failures, "\n\n".join(failures.values())
    for what, statement in steps:
        spark.sql(statement.format(src=src))
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = dict(zip(queries, pool.map(st.refresh_stream_table, queries), strict=True))
        wrong = {n: (r.action, r.reason) for n, r in results.items() if r.action != "DIFFERENTIAL"}
        assert not wrong, f"{what}: refreshes not DIFFERENTIAL: {wrong}"
        failures = check_many(spark, st, expected, what)
        assert not failures, "\n\n".join(failures.values())


def assert_matches(spark: SparkSession, st: Any, name: str, query: str, context: str = "") -> None:
    """Assert ``st.read(name)`` equals ``spark.sql(query)`` as a multiset (floats to ~6 digits)."""
    failures = check_many(spark, st, {name: query}, context)
    if failures:
        raise AssertionError(failures[name])


# --------------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------------

_PH = re.compile(r"\{(\w+)\}")


def render(query: str, mapping: Mapping[str, str]) -> str:
    """Replace ``{name}`` placeholders; an unknown placeholder is a bug in the test, so raise."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in mapping:
            raise KeyError(f"unknown placeholder {{{m.group(1)}}} in {query!r}")
        return mapping[m.group(1)]

    return _PH.sub(sub, query)


def _frontier_version(frontier: Mapping[str, Any] | None, real: str) -> Any:
    """Find a source in a frontier whatever qualification the engine uses (``spark_catalog.default.x``)."""
    for k, v in (frontier or {}).items():
        if str(k).replace("`", "").lower().split(".")[-1] == real.lower():
            return v
    return None


def oracle_seed(default: int) -> int:
    """``TRICKLE_ORACLE_SEED`` overrides the test's fixed seed (``random`` draws a fresh one)."""
    env = os.environ.get("TRICKLE_ORACLE_SEED")
    if not env:
        return default
    return random.randrange(1, 10**9) if env == "random" else int(env)


REFRESH_THREADS = int(os.environ.get("TRICKLE_ORACLE_THREADS", "3"))


def run_oracle(
    spark: SparkSession,
    st: Any,
    sources_spec: Sequence[TableSpec],
    queries: Mapping[str, str | tuple[str, str]],
    cycles: int = 20,
    mode: str = "DIFFERENTIAL",
    seed: int = 1,
    churn: Sequence[Churn] = (),
    extremes: Sequence[Extreme] = (),
    empty_cycle: int | None = 2,
    max_extra_cycles: int = 8,
    views: Mapping[str, str] | None = None,
    subtrees: Sequence[Subtree] = (),
    insert_only_p: float = 0.0,
    oracle_queries: Mapping[str, str] | None = None,
) -> dict[str, Counter[str]]:
    """Create sources and stream tables, then change/refresh/compare until every table saw ``cycles``
    DIFFERENTIAL refreshes (or ``cycles + max_extra_cycles`` cycles ran); a table that saw them is left
    alone from then on unless a table still short of them reads it.

    Checked per refresh: the action (DIFFERENTIAL iff a source it depends on got a commit, else
    NO_DATA; NO_DATA too when only upstream stream tables moved, by commits netting to no row, see
    :func:`pipeline.strata.quiet_refresh`; an upstream already refreshed by a downstream's cascade must then be NO_DATA and its
    history must show the cascaded refresh), the frontier of each base source (== its Delta version),
    and the contents. A failing stream table is reported and dropped from later cycles so the others
    keep being tested; all failures are raised together at the end, with the seed.

    A query may be a pair (stream table query, oracle query): the oracle then runs the second, a Spark SQL
    equivalent of syntax Spark itself lacks (PostgreSQL's DISTINCT ON).

    ``views`` (name -> ``CREATE [TEMPORARY] VIEW {name} AS ...`` over ``{source}`` and earlier ``{view}``
    placeholders) are created, in order, after the sources; queries read them as ``{name}``, and a query
    reading a view depends on the view's sources (the stream table maintains it over them).
    """
    expected_queries = {n: q[1] if isinstance(q, tuple) else q for n, q in queries.items()}
    queries = {n: q[0] if isinstance(q, tuple) else q for n, q in queries.items()}
    seed = oracle_seed(seed)
    gen = ChangeGenerator(spark, sources_spec, seed, churn=churn, extremes=extremes, subtrees=subtrees,
                          insert_only_p=insert_only_p)
    suffix = gen.suffix
    gen.create()
    st_real = {n: f"{n}_{suffix}" for n in queries}
    oracle_view = {n: f"_oracle_q_{n}_{suffix}" for n in queries}
    views = dict(views or {})
    view_real = {v: f"{v}_{suffix}" for v in views}
    view_bases: dict[str, set[str]] = {}
    for v, ddl in views.items():
        refs = set(_PH.findall(ddl)) - {v}
        unknown = refs - set(gen.sources) - set(view_bases)
        if unknown:
            raise KeyError(f"view {v} names unknown placeholders {sorted(unknown)} (views come in order)")
        view_bases[v] = (refs & set(gen.sources)).union(*(view_bases[u] for u in refs & set(view_bases)))
        spark.sql(render(ddl, {**gen.names, **view_real}))

    # dependency bookkeeping: direct base sources, direct upstream stream tables, all base sources
    deps: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for n, q in queries.items():
        refs = set(_PH.findall(q))
        unknown = refs - set(queries) - set(gen.sources) - set(views)
        if unknown:
            raise KeyError(f"query {n} names unknown placeholders {sorted(unknown)}")
        deps[n] = refs & set(queries)
        bases[n] = (refs & set(gen.sources)).union(*(view_bases[v] for v in refs & set(views)))
    order: list[str] = []  # topological: upstream first
    while len(order) < len(queries):
        ready = [n for n in queries if n not in order and deps[n] <= set(order)]
        if not ready:
            raise ValueError("cycle among test queries")
        order += ready

    def all_bases(n: str) -> set[str]:
        return bases[n].union(*(all_bases(u) for u in deps[n])) if deps[n] else set(bases[n])

    # The oracle reads each base source as the generator's model of it: exactly the rows of the version the
    # stream tables must reach, as a VALUES view. Reading Delta instead costs a file listing per scan per
    # recomputation, or a caching job per changed source per cycle (seconds per cycle either way); the
    # model is proved equal to the Delta tables at the end of the run (``verify_contents``), and a model that
    # strayed earlier would fail the comparison, never hide a wrong stream table.
    # Each view is one partition (``COALESCE(1)``), which Spark knows: with one shuffle partition per session
    # (tests/conftest.py) its joins and aggregates need no exchange, so a recomputation runs as one stage
    # instead of one stage per shuffle (the setops oracle's compare: 27 shuffles per cycle before).
    snap = {b: f"_oracle_src_{b}_{suffix}" for b in gen.sources}

    # Each view is made from a DataFrame, so it holds the analysed plan (the rows as a local relation): a view
    # made by SQL holds its text, which Spark parses and analyses again wherever a query reads the view (the
    # setops oracle's queries read each source several times, every cycle).
    def snapshot(changed: Iterable[str]) -> None:
        for b in changed:
            spark.sql(gen.model_sql(b)).coalesce(1).createOrReplaceTempView(snap[b])

    snapshot(gen.sources)
    create_map = {**gen.names, **view_real, **st_real}
    oracle_map = {**gen.names, **snap, **view_real, **oracle_view}
    # ``oracle_queries`` gives the oracle another formulation of a query Spark cannot run as written
    oracle_sql = {n: render((oracle_queries or {}).get(n, expected_queries[n]), oracle_map) for n in queries}
    for n in order:  # the oracle of a downstream table reads the upstream's *query*, not its table
        spark.sql(f"CREATE OR REPLACE TEMP VIEW {oracle_view[n]} AS {oracle_sql[n]}")

    header = f"[oracle seed={seed} suffix={suffix} mode={mode}]"
    failures: dict[str, str] = {}
    prev_frontier: dict[str, dict[str, Any]] = {}
    for n in order:
        t0 = time.time()
        st.create_stream_table(st_real[n], render(queries[n], create_map), refresh_mode=mode)
        print(f"{header} created {n} in {time.time() - t0:.1f}s")
    for s in st.status():
        for n, real in st_real.items():
            if str(s.get("name", "")).lower() == real.lower():
                prev_frontier[n] = dict(s.get("frontier") or {})
    failures.update(
        {
            _logical(k, st_real): f"{header} after create (initial load):\n{v}"
            for k, v in check_many(spark, st, {st_real[n]: oracle_sql[n] for n in order}).items()
        }
    )

    actions: dict[str, Counter[str]] = {n: Counter() for n in queries}

    ok_actions = {"DIFFERENTIAL"} if mode == "DIFFERENTIAL" else {"DIFFERENTIAL", "FULL"}

    def productive(n: str) -> int:
        """Refreshes that applied changes, including ones a downstream's cascade ran."""
        return sum(actions[n][a] + actions[n]["cascaded " + a] for a in ok_actions)

    refresh_order = list(reversed(order))  # downstream first: it must bring its upstream along
    max_cycles = cycles + max_extra_cycles
    cycle = 0
    while cycle < max_cycles:
        alive = [n for n in queries if n not in failures and not (deps[n] & set(failures))]
        if not alive or all(productive(n) >= cycles for n in alive if bases[n]):
            break
        # A table that saw its ``cycles`` refreshes leaves the loop (the others' extra cycles would only
        # refresh and compare it again), unless a table still short of them reads it.
        needed = {n for n in alive if not bases[n] or productive(n) < cycles}
        while grown := {u for n in needed for u in deps[n] if u in alive} - needed:
            needed |= grown
        alive = [n for n in alive if n in needed]
        cycle += 1
        t0 = time.time()
        changed = gen.cycle(empty=(cycle == empty_cycle))
        t_source = time.time() - t0
        snapshot(changed)
        t_merge = time.time() - t0
        where = f"{header} cycle {cycle} (changed sources: {sorted(changed) or 'none'})"
        cascaded: set[str] = set()
        refreshed: list[str] = []
        # Stream tables nothing else reads are refreshed concurrently (each cascades to its upstreams,
        # which the engine serialises per table): a Spark job is mostly fixed driver-side latency, so
        # overlapping independent refreshes is the cheapest speed-up on a small machine.
        leaves = [n for n in refresh_order if n in alive and not any(n in deps[m] for m in alive)]
        with ThreadPoolExecutor(max_workers=REFRESH_THREADS) as pool:
            early = {n: pool.submit(st.refresh_stream_table, st_real[n]) for n in leaves}
        for n in refresh_order:
            if n not in alive:
                continue
            touched = all_bases(n) & changed
            try:
                r = early[n].result() if n in early else st.refresh_stream_table(st_real[n])
            except Exception as e:  # noqa: BLE001 - an engine error is a test failure for this table
                failures[n] = f"{where}: refresh of {n} raised {type(e).__name__}: {e}\n  query: {queries[n]}"
                print(f"FAILURE {failures[n]}")
                continue
            actions[n][r.action] += 1
            frontier = dict(r.frontier or {})
            if n in cascaded:
                expected = {"NO_DATA"}
                why = "its downstream's refresh in this cycle should already have brought it up to date"
            elif not touched:
                expected = {"NO_DATA"}
                why = "no source it depends on changed"
            elif bases[n] & changed:
                expected = ok_actions
                why = f"sources {sorted(bases[n] & changed)} got a commit"
            else:  # only upstream stream tables can have changed: did their Delta version move?
                moved = [
                    u for u in deps[n]
                    if _frontier_version(frontier, st_real[u])
                    != _frontier_version(prev_frontier.get(n), st_real[u])
                ]
                expected = ok_actions if moved else {"NO_DATA"}
                why = f"upstream versions moved: {moved}" if moved else "no upstream version moved"
            if expected == ok_actions and r.action == "NO_DATA" and SKIPPED in (r.reason or ""):
                expected = {"NO_DATA"}  # its upstreams' commits net to no row (pipeline.strata); contents checked
            problems = []
            if r.action not in expected:
                problems.append(f"action {r.action} (reason {r.reason!r}), expected {sorted(expected)}: {why}")
            for b in bases[n]:
                got = _frontier_version(frontier, gen.names[b])
                if got != gen.versions[b]:
                    problems.append(
                        f"frontier[{gen.names[b]}] = {got!r}, but the source is at version {gen.versions[b]}"
                        f" (frontier: {frontier})"
                    )
            if touched and deps[n]:
                for u in deps[n]:
                    if u in alive and u not in cascaded:
                        hist = st.history(st_real[u], limit=1)
                        last = hist[0].get("action") if hist else None
                        if all_bases(u) & changed:
                            if last in ok_actions:
                                actions[u]["cascaded " + last] += 1
                            else:
                                problems.append(
                                    f"upstream {u} was not refreshed by the cascade (its last history action: "
                                    f"{last}, expected one of {sorted(ok_actions)})"
                                )
                        cascaded.add(u)
            if problems:
                failures[n] = f"{where}: stream table {n}:\n  " + "\n  ".join(problems) + f"\n  query: {queries[n]}"
                print(f"FAILURE {failures[n]}")
                continue
            prev_frontier[n] = frontier
            if touched or n in cascaded:  # an untouched NO_DATA table cannot have changed: skip the job
                refreshed.append(n)
        t_refresh = time.time() - t0 - t_merge
        for real, msg in check_many(spark, st, {st_real[n]: oracle_sql[n] for n in refreshed}, where).items():
            failures[_logical(real, st_real)] = msg
            print(f"FAILURE {msg}")
        print(
            f"{where}: merges {t_source:.1f}s, snapshots {t_merge - t_source:.1f}s, refreshes {t_refresh:.1f}s, "
            f"compare {time.time() - t0 - t_merge - t_refresh:.1f}s"
        )
    gen.verify_versions()
    gen.verify_contents()
    for b in snap.values():
        spark.sql(f"DROP VIEW IF EXISTS {b}")
    summary = ", ".join(f"{n}: {dict(c)}" for n, c in actions.items())
    print(f"{header} actions after {cycle} cycles: {summary}")
    for n in queries:
        if n not in failures and bases[n] and productive(n) < cycles:
            failures[n] = (
                f"{header} {n} saw only {productive(n)} DIFFERENTIAL refreshes in {cycle} "
                f"cycles (wanted {cycles}): {dict(actions[n])}"
            )
    if failures:
        raise AssertionError(
            f"{header} {len(failures)} of {len(queries)} stream tables failed "
            f"(reproduce with TRICKLE_ORACLE_SEED={seed}):\n\n" + "\n\n".join(failures[n] for n in sorted(failures))
        )
    return actions


def _logical(real: str, st_real: Mapping[str, str]) -> str:
    for n, r in st_real.items():
        if r == real:
            return n
    return real
