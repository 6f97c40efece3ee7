"""What a delta query is rendered against: the sources and the two frontiers of one refresh.

A refresh moves a stream table from the *pre* frontier (the source versions its contents reflect) to the
*post* frontier (the versions it will reflect). Every operator renders SQL against this context: a source
at the pre or post version is a time-travel read, its change window is the Change Data Feed between the
two versions. Pure data: rendering SQL needs no Spark.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from dvm.dialect import quote, sql_string

if TYPE_CHECKING:
    from dvm.key_filter import KeyFilter

State = Literal["pre", "post"]


#: In rendered SQL, a key filter's predicate until the refresh executor fills it in (:meth:`Context.key_filter`)
KEY_FILTER_TOKEN = "__trickle_keys_"


#: How a floating value is identified in ``__row_hash`` (the identity a plain-rows table's stored copies are
#: found by; fixed per stream table, see ``StreamTableDef.float_identity``):
#:
#: * ``bits37+nested``: floats as ``bits37``, and arrays, maps and structs identified element by element
#:   (:func:`dvm.plan._nested_identity`): each element's and field's NULL flagged, floats inside rounded
#:   the same way, a map's entries sorted. The default since Spark's own hash skips NULL elements (so
#:   ``[1, NULL]`` and ``[NULL, 1]`` shared a ``__row_hash``, and deleting one could delete the other's
#:   copy) and refuses maps (a plain-rows table with a MAP column could not be refreshed at all).
#: * ``bits37``: rounded to 37 significant bits (about 11 decimal digits) by Veltkamp's split, three
#:   floating-point operations. The default since the older form (``format_string``, Java's formatter)
#:   was found to be most of a FULL refresh of a scan with a DOUBLE column (docs/BENCHMARKS.md, "Figures
#:   behind the code"). Nested values as Spark's hash reads them; tables created before ``bits37+nested``.
#: * ``digits12``: 12 significant decimal digits (``format_string('%.12g')``), tables created before.
FLOAT_IDENTITIES = ("bits37+nested", "bits37", "digits12")
FLOAT_IDENTITY = FLOAT_IDENTITIES[0]


@dataclass(frozen=True)
class SourceRef:
    """One source of a stream table as a refresh sees it.

    ``pre`` is None when the stream table has never been populated (a FULL refresh). A source that is itself a
    stream table is read like any Delta table: it stores plain rows (one physical row per copy of a result
    row), so its snapshots and change feeds are bags of its user columns, hidden columns ignored.
    """

    path: str
    post: int
    pre: int | None = None
    #: every commit of the window only added rows (no Delta ``remove``/``cdc`` action): read from the log
    #: by the refresh executor when a rule can use it (recursive CTEs: semi-naive instead of counting/DRed)
    insert_only: bool = False
    #: bytes of the source's data files at the versions a differential refresh reads (version -> bytes), from
    #: Delta checksum files (no job); a version missing here has no checksum. Decides holding (see
    #: :meth:`Context.table`) and code generation (the refresh executor).
    sizes: Mapping[int, int] = field(default_factory=dict, hash=False)
    #: bytes of the change files of the window (pre, post], from the log; None when unknown
    change_bytes: int | None = None

    @property
    def changed(self) -> bool:
        return self.pre is not None and self.post != self.pre


#: How a materialised source read (a change window or a small snapshot) is seeded: this prefix and the
#: FROM item it stands for (see :meth:`Context.changes`, :meth:`Context.table`).
HELD_SEED = "SELECT * FROM "

#: In a :class:`Fixpoint`'s step query, the relation of the previous iteration's new tuples.
PREV = "__trickle_prev__"


@dataclass(frozen=True)
class Fixpoint:
    """A relation the refresh executor evaluates before running the rendered query, read by the name
    :meth:`Context.fixpoint` returned (``columns``). Pure data, so rendering SQL still needs no Spark.

    * ``weighted`` False — a set-semantics fixpoint (Spark's own recursion is UNION ALL only): start from
      the distinct rows of ``seed``; repeatedly run ``step`` with :data:`PREV` reading the tuples the
      previous round added, keeping only tuples not seen yet; stop when a round adds none.
    * ``weighted`` True — a Z-set series Σₖ stepᵏ(seed): the last column is the weight ``__w``; every round
      is netted per tuple (weights summed: paths are counted, not enumerated) and the series stops at the
      first empty round. The result is the union of all rounds.
    * ``step`` None — ``seed`` materialised once (read twice by the query, computed once). Empty
      ``columns`` keep the seed's own column names.
    """

    columns: list[str]
    seed: str
    step: str | None
    weighted: bool = False

    def key(self) -> tuple[str, ...]:
        return (*self.columns, "\x00", self.seed, "\x00", self.step or "", str(self.weighted))

    def reads_source(self) -> bool:
        """A held source read: a change window or a small snapshot, not a computed relation."""
        return self.step is None and self.seed.startswith(
            (f"{HELD_SEED}table_changes_by_path(", f"{HELD_SEED}delta.`"))


@dataclass
class Rendering:
    """What rendering one refresh's SQL records on the way, for the refresh executor to act on: a
    :class:`Context` is fixed for the refresh, and this is the part of it that grows while rules render."""

    #: what rules decided (e.g. which recursive-CTE strategy), for the refresh's record
    notes: list[str] = field(default_factory=list)
    #: fixpoints the rendered SQL reads, in the order they must run (a later one may read an earlier one)
    fixpoints: list[tuple[str, Fixpoint]] = field(default_factory=list)
    #: the key filters the rendered SQL holds tokens of, filled in by the refresh executor
    key_filters: list[tuple[str, KeyFilter]] = field(default_factory=list)
    #: the held snapshots and change windows read on the driver (filled by :meth:`Context.table` and
    #: :meth:`Context.changes`)
    driver_held: set[str] = field(default_factory=set)
    #: names handed out by :meth:`Context.name`, per prefix
    names: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """The sources of one refresh, by source key (the normalised table name used in the query), and how to
    read them. Its fields never change; what rendering records goes to :attr:`rendering`."""

    sources: dict[str, SourceRef] = field(default_factory=dict)
    #: the stream table's own Delta path: the algebraic aggregate rule reads its stored state from it
    target_path: str | None = None
    #: a relation holding the stream table's rows, read by the refresh executor (see :meth:`target`)
    target_relation: str | None = None
    #: the refresh executor knows the change window is small (it collects the delta to the driver): a rule
    #: may broadcast a relation derived from the delta instead of letting Spark shuffle a large table
    small_delta: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: read each change window (and each snapshot under ``hold_below`` bytes) once, held for the delta query
    #: (see :meth:`changes` and :meth:`table`)
    materialize_changes: bool = False
    hold_below: int = 0
    #: the refresh executor reads a held snapshot of fewer bytes than this on the driver (delta-rs, no Spark
    #: job and no time-travel planning; see ``pipeline.fixpoints``): holding such a read saves even when the
    #: query reads it only once, so :meth:`unshare_single_reads` keeps it held
    driver_below: int = 0
    #: the same for a change window (no change feed planning, no scan of its files)
    changes_driver_below: int = 0
    #: a literal unique to this refresh, hashed into the ``__row_id`` of every row a plain-rows (bag) stream
    #: table gains (see :mod:`dvm.plan`): ids of rows inserted by different refreshes must not repeat, while a
    #: refresh's SQL stays deterministic (Delta's MERGE may read its source twice). The refresh executor sets
    #: a fresh one per refresh; the constant default keeps rendered SQL stable for tests and ``explain``.
    salt: str = "trickle"
    #: how floating values are identified in ``__row_hash`` (:data:`FLOAT_IDENTITIES`): the stream table's
    #: own, so the delta finds the copies its FULL refresh stored
    float_identity: str = FLOAT_IDENTITY
    #: a join's input whose post snapshot reads at least this many bytes is filtered by the join keys of the
    #: other input's small delta (see :mod:`dvm.key_filter`); 0: never
    key_filter_above: int = 0
    #: what rendering records (the one mutable part): see :class:`Rendering`
    rendering: Rendering = field(default_factory=Rendering)

    @property
    def notes(self) -> list[str]:
        return self.rendering.notes

    @property
    def fixpoints(self) -> list[tuple[str, Fixpoint]]:
        return self.rendering.fixpoints

    @property
    def key_filters(self) -> list[tuple[str, KeyFilter]]:
        return self.rendering.key_filters

    @property
    def driver_held(self) -> set[str]:
        return self.rendering.driver_held

    def name(self, prefix: str) -> str:
        """``prefix`` numbered 1, 2, ... within this refresh's SQL. Why not one counter for the process: the
        same query's delta SQL is then the same text at every refresh, which the local engine parses once
        (``pipeline.local_engine._parsed``) and ``explain`` shows alike."""
        n = self.rendering.names.get(prefix, 0) + 1
        self.rendering.names[prefix] = n
        return f"{prefix}{n}"

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def fixpoint(self, spec: Fixpoint) -> str:
        """The name the query reads ``spec``'s result by (a global temporary view, visible to every session
        of the application); the same spec rendered twice is evaluated once."""
        for name, s in self.fixpoints:
            if s.key() == spec.key():
                return name
        name = f"global_temp.__trickle_fx_{self.run_id}_{len(self.fixpoints)}"
        self.fixpoints.append((name, spec))
        return name

    def hold(self, sql: str) -> str:
        """``sql`` computed once per refresh and held, as a FROM item (a loop-free :class:`Fixpoint`)."""
        return self.fixpoint(Fixpoint([], sql, None))

    def filters_keys(self, relation: str) -> bool:
        """Whether a join input rendered as ``relation`` is worth a key filter: the delta is small (collected)
        and the relation's Delta files total at least ``key_filter_above`` bytes (known from checksums)."""
        if not self.small_delta or self.key_filter_above <= 0:
            return False
        size = self._bytes_named(relation)
        return size is not None and size >= self.key_filter_above

    def key_filter(self, spec: KeyFilter) -> str:
        """A token standing for ``spec``'s predicate in rendered SQL, filled in by the refresh executor once
        the held relation is computed (an identifier, so the SQL still parses)."""
        for token, s in self.key_filters:
            if s == spec:
                return token
        token = f"{KEY_FILTER_TOKEN}{self.run_id}_{len(self.key_filters)}__"
        self.key_filters.append((token, spec))
        return token

    def table(self, key: str, state: State) -> str:
        """Source ``key`` at the pre or post frontier as a FROM item.

        A snapshot smaller than ``hold_below`` bytes is read once per refresh and held, like a change window: a delta
        rule reads the same snapshot in several places (both sides of a set operation, every branch of a
        UNION ALL, each scalar subquery), and Spark plans each Delta scan on its own, with a file-filtering
        job per distinct pushed filter. Holding a small table costs less than that; a large one is never
        held (a differential refresh must not read a large source whole more often than its rule does)."""
        ref = self.sources[key]
        version = ref.post if state == "post" or ref.pre is None else ref.pre
        relation = f"delta.{quote(ref.path)} VERSION AS OF {version}"
        size = ref.sizes.get(version)
        if not self.materialize_changes or size is None or size >= self.hold_below:
            return relation
        name = self.fixpoint(Fixpoint([], f"{HELD_SEED}{relation}", None))
        if size < self.driver_below:
            self.driver_held.add(name)
        return name

    def changes(self, key: str) -> str:
        """The change window of source ``key`` as a FROM item.

        With ``materialize_changes`` the window is read ONCE per refresh (a materialised relation, see
        :class:`Fixpoint`) and every operator reading it reads that. Why: Spark inlines CTEs, so a delta
        rule that refers to a source's changes in several places holds as many Change Data Feed relations,
        and planning each one plans a whole query of its own (file listing of the window's commits
        included), most of a refresh's planning time on a multi-source delta (docs/BENCHMARKS.md, "Figures
        behind the code"). A change window is small by the premise of a differential refresh, so holding it costs little."""
        ref = self.sources[key]
        assert ref.pre is not None, "a change window needs a pre frontier"
        window = f"table_changes_by_path({sql_string(ref.path)}, {ref.pre + 1}, {ref.post})"
        if not self.materialize_changes:
            return window
        name = self.fixpoint(Fixpoint([], f"{HELD_SEED}{window}", None))
        if ref.change_bytes is not None and ref.change_bytes < self.changes_driver_below:
            self.driver_held.add(name)  # held even when read once: the driver reads it (no Spark scan)
        return name

    def unshare_single_reads(self, sql: str) -> str:
        """``sql`` with every held source read (change window or small snapshot) that Spark would read only
        once put back in place (and dropped from :attr:`fixpoints`): holding it would cost a plan of its own
        and the held blocks, and save nothing (docs/BENCHMARKS.md, "Figures behind the code").

        A held query that is not a source read (a loop-free :class:`Fixpoint` such as the netted delta of a
        plain-rows table, see :mod:`dvm.plan`) runs once, so the reads in its seed count once, beside those
        of ``sql``, and a source read it alone makes once is put back into it. A source read by a loop stays
        held (a loop reads it every round)."""
        from dvm.rewrite import inlined_read_counts  # sqlglot: only needed once a delta query is rendered

        if not self.fixpoints:
            return sql

        held = [i for i, (_, s) in enumerate(self.fixpoints) if s.step is None and not s.reads_source()]
        # putting one read back leaves the others' counts as they are
        counts = [inlined_read_counts(sql)] + [inlined_read_counts(self.fixpoints[i][1].seed) for i in held]
        specs = list(self.fixpoints)
        gone: set[int] = set()
        for k, (name, spec) in enumerate(specs):
            ref = re.compile(re.escape(name) + r"\b")
            read_by_loop = any(ref.search(s.seed + (s.step or "")) for _, s in specs if s.step is not None)
            if not spec.reads_source() or read_by_loop or sum(c[tuple(name.split(".", 1))] for c in counts) > 1:
                continue
            if name in self.driver_held:
                continue
            item = spec.seed[len(HELD_SEED):]
            sql = ref.sub(lambda _m, item=item: item, sql)
            for i in held:
                n, h = specs[i]
                specs[i] = (n, replace(h, seed=ref.sub(lambda _m, item=item: item, h.seed)))
            gone.add(k)
        self.fixpoints[:] = [f for k, f in enumerate(specs) if k not in gone]
        return sql

    def bytes_read(self, sql: str) -> int | None:
        """The bytes of Delta files Spark reads to run ``sql`` and the held reads it needs: each snapshot and
        change window read once, however often the text names it; snapshots read by the driver reach Spark
        as local relations and count nothing. None when a read's size is unknown (no checksum, or the
        stored table read in place). The refresh executor runs a job over a few MiB on one partition, and one
        over a few hundred KiB without generated code."""
        return self._bytes_named(sql + "".join(spec.seed + (spec.step or "") for name, spec in self.fixpoints
                                               if name not in self.driver_held))

    def _bytes_named(self, text: str) -> int | None:
        """The bytes of the snapshots and change windows ``text`` names (each once); None when one is unknown."""
        if self.target_path is not None and f"delta.{quote(self.target_path)}" in text:
            return None
        total = 0
        for ref in self.sources.values():
            for version in {v for v in (ref.pre, ref.post) if v is not None}:
                if f"delta.{quote(ref.path)} VERSION AS OF {version}" in text:
                    if (size := ref.sizes.get(version)) is None:
                        return None
                    total += size
            if ref.pre is not None and f"table_changes_by_path({sql_string(ref.path)}, " in text:
                if ref.change_bytes is None:
                    return None
                total += ref.change_bytes
        return total

    def changed(self, key: str) -> bool:
        return self.sources[key].changed

    def target(self) -> str:
        """The stream table's stored rows as a FROM item: ``target_relation`` when the refresh executor holds
        them (a small table read once, at the version the refresh will commit against), else the table."""
        if self.target_relation is not None:
            return self.target_relation
        assert self.target_path is not None
        return f"delta.{quote(self.target_path)}"
