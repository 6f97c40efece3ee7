"""WITH RECURSIVE: a recursive CTE ``R = A ∪ F(R)`` maintained from the changes of its sources.

``A`` is the anchor (any query over the sources), ``F`` the recursive term: a query over the sources and
ONE reference to ``R`` (Spark, like PostgreSQL, allows no other shape). Spark 4.1 evaluates UNION ALL
recursion natively (:meth:`RecursiveCte.native`); it rejects UNION (UNION_NOT_SUPPORTED_IN_RECURSIVE_CTE),
so set-semantics recursion is evaluated by a semi-naive fixpoint that the refresh executor runs
(:class:`dvm.context.Fixpoint`; a loop of Spark jobs, each iteration keeping only tuples not seen before,
so cycles in the data terminate).

Delta rules. Write P/Q for the pre/post states of the sources, ΔA = A_Q − A_P (the anchor's own delta
rule; positive part A⁺, negative part A⁻), and for every base-table occurrence i of the recursive term
D_i / I_i its deleted / inserted rows and K_i = P_i − D_i = Q_i − I_i the rows it keeps. ``R_pre`` is the
CTE's previous result: read from the stream table itself when the table stores exactly the CTE's rows
(the query is ``SELECT <the CTE's columns> FROM cte``; see :mod:`dvm.plan`), else recomputed on P.

* **recompute-diff** (always correct; used when the recursive term is not linear and monotone in its
  sources): ΔR = R(Q) − R_pre, R(Q) by Spark's own recursion (UNION ALL) or a set fixpoint (UNION).
  Still a DIFFERENTIAL refresh: downstream operators, the MERGE and the change feed only see the rows
  that changed; the cost is one evaluation of the recursion.
* **UNION ALL (bag semantics: a row occurs once per derivation path)** — *counting*:
  the multiplicity of a row is its number of derivation paths, F is linear in R (one reference, no
  aggregate over it), and when F is built from inner joins, filters and projections of its base tables
  it is multilinear and monotone in them. Then, exactly (each path counted once):

      Lost = Σₖ F_Kᵏ(A⁻ + F_D(R_pre))     paths of the old result that used a deleted row, classified by the
                                          LAST deleted row they use: an old path, a step through a deleted
                                          row, then steps through kept rows only
      R_K  = R_pre − Lost                 the paths that survive
      New  = Σₖ F_Qᵏ(A⁺ + F_I(R_K))       paths of the new result that use an inserted row, classified by the
                                          FIRST one: a surviving path, a step through an inserted row, then
                                          any steps over Q
      ΔR   = New − Lost

  with F_D(X) = F_P(X) − F_K(X) and F_I(X) = F_Q(X) − F_K(X), expanded by telescoping over the
  occurrences (F_D = Σᵢ F(K₍<ᵢ₎, D_i, P₍>ᵢ₎), the join rule's trick) so every term joins one small delta.
  Both series terminate whenever Spark's own evaluation does on P and on Q: every term of Lost is a path of
  the old derivation graph and every term of New one of the new graph. Each series is a weighted
  :class:`~dvm.context.Fixpoint` loop that the refresh runs (:mod:`pipeline.fixpoints`): the path count
  travels in a ``__w`` column and each round is netted per tuple, so paths are counted, not enumerated,
  and a round costs fewer Spark jobs than a level of Spark's own recursion (figures in
  docs/BENCHMARKS.md, "Figures behind the code"). Lost is read twice (R_K and the result) but computed once. The simpler signed series
  Σₖ F_Qᵏ(ΔA + (F_Q − F_P)(R_pre)) is algebraically right too but may not terminate: a reparenting that
  closes a cycle the old rows led into yields +/- rows that cancel only in the limit.

  *Is DRed sound for bags?* DRed's re-derivation step asks "is this tuple still derivable?", a yes/no
  question: it cannot rebuild a multiplicity (the number of surviving paths) without recounting them all.
  Counting needs no re-derivation: a path that did not use a deleted row is untouched, so subtracting
  exactly the lost paths is the whole story. So UNION ALL uses counting, not DRed, and a term that is not
  monotone in its base tables (where a lost path is no longer a finite set of old paths) falls back to
  recompute-diff.
* **UNION (set semantics)** — the textbook pair, each phase a fixpoint over sets:

      OD  = fix(seed (A⁻ ∪ F_D(R_pre)) ∩ R_pre,   step F_P(·) ∩ R_pre)     over-delete
      RD  = fix(seed OD ∩ (A_Q ∪ F_Q(R_pre − OD)), step F_Q(·) ∩ OD)       re-derive what is still derivable
      Mid = (R_pre − OD) ∪ RD                                              closed under F over kept rows
      New = fix(seed (A⁺ ∪ F_I(Mid)) − Mid,        step F_Q(·) − Mid)      semi-naive insertion
      ΔR  = New − (OD − RD)

  Each phase is a set :class:`~dvm.context.Fixpoint` (Spark cannot run a recursive UNION). Here D_i / I_i
  may over-approximate (a duplicate row deleted while a copy stays is still "deleted"): an
  over-approximated over-deletion is re-derived, an over-approximated insertion finds tuples already in
  Mid. So no K is needed and the F_D / F_I terms take P / Q for the other occurrences.

Choice per refresh (the plan cannot know it before): when every source of the CTE received only inserts
in the window (read from the Delta log's actions, no Spark job: :attr:`dvm.context.SourceRef.insert_only`),
the rules above lose their deletion half and become **semi-naive**: New = Σₖ F_Qᵏ(A⁺ + F_I(R_pre)) with
K = P (bags), or New = fix((A⁺ ∪ F_I(R_pre)) − R_pre, F_Q(·) − R_pre) (sets). Otherwise counting (bags) or
DRed (sets). When only the anchor's sources changed, no R_pre is read at all: ΔR = Σₖ Fᵏ(ΔA) split into
its two signs. Each refresh notes the rule it used in its history record (``ctx.notes``).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from sqlglot import exp, parse_one

from dvm.context import PREV, Context, Fixpoint, State, quote
from dvm.dialect import SPARK
from dvm.operators.base import Node, W, col_list
from dvm.operators.scan import Scan
from dvm.rewrite import retarget

_IDS = itertools.count(1)


@dataclass
class Occurrence:
    """One base-table reference of the recursive term: its alias, source and the columns it reads."""

    alias: str
    source: str
    columns: list[str]

    def scan(self) -> Scan:
        return Scan(self.source, [(c, c) for c in self.columns], "__one")


@dataclass
class Shape:
    """A recursive term that is linear in R and multilinear and monotone in its base tables."""

    self_alias: str
    occurrences: list[Occurrence]


@dataclass(eq=False)
class RecursiveCte(Node):
    name: str  # the CTE's name (lower case)
    columns: list[str]  # the CTE's column names (positional)
    internal: list[str]  # this node's internal column names (positional to ``columns``)
    anchor_ast: exp.Expression  # qualified; tables renamed to source placeholders
    step_ast: exp.Expression  # qualified recursive term; reads the CTE by ``name``
    distinct: bool  # UNION (set semantics) rather than UNION ALL
    placeholders: dict[str, str]  # placeholder table name -> source key
    helpers: list[tuple[str, exp.Expression]]  # other CTEs the body reads, in definition order
    anchor: Node | None  # the anchor as an operator tree (its delta rule); None: anchor diffed natively
    shape: Shape | None  # None: the recursive term is not linear/monotone -> recompute-diff
    shape_reason: str = ""  # why ``shape`` is None
    #: set by the plan when the stream table stores exactly this CTE's rows: the user column name of
    #: each CTE column (R_pre is then read from the stream table, each stored row weighing 1)
    stored: list[str] | None = None
    id: int = field(default_factory=lambda: next(_IDS))

    def __post_init__(self) -> None:
        self.children = [self.anchor] if self.anchor is not None else []
        self.cols = list(self.internal)
        self._sources = {self.placeholders[t.name]
                         for ast in [self.anchor_ast, self.step_ast] + [b for _, b in self.helpers]
                         for t in ast.find_all(exp.Table) if t.name in self.placeholders}

    # --- explain ---

    def label(self) -> str:
        kind = "UNION" if self.distinct else "UNION ALL"
        return f"RecursiveCte {self.name} ({kind}) [{', '.join(self.columns)}]"

    def strategy(self) -> str:
        if self.shape is None:
            return f"recompute-diff: {self.shape_reason}; the recursion is evaluated on the new snapshot and " \
                   "diffed against the old result (still a DIFFERENTIAL refresh)"
        if self.distinct:
            return ("semi-naive fixpoint when the window only inserted rows, else DRed (over-delete, re-derive, "
                    "insert); set semantics evaluated by a fixpoint loop (Spark has no recursive UNION)")
        return ("semi-naive when the window only inserted rows, else counting (exact over-deletion of the "
                "derivation paths that used a deleted row; bags need no re-derivation)")

    def sources(self) -> set[str]:
        return set(self._sources)

    # --- rendering helpers ---

    def _cte_cols(self, prefix: str = "") -> str:
        return col_list(self.columns, prefix)

    def _n(self, what: str) -> str:
        return f"__rc{self.id}_{what}"

    def source_item(self, ctx: Context, key: str, state: State) -> str:
        """A FROM item reading source ``key`` at ``state``. A stream table is read as it is: it stores plain
        rows (one physical row per copy), and only its user columns are referenced."""
        return ctx.table(key, state)

    def _render(self, ast: exp.Expression, sub, extra: str | None = None) -> str:
        """``ast`` as Spark SQL with each table reference replaced by ``sub(table)`` (None: kept), and
        ``extra`` appended to the select list."""
        tree = ast.copy()
        marks: dict[str, str] = {}
        for t in list(tree.find_all(exp.Table)):
            item = sub(t)
            if item is None:
                continue
            mark = f"__trickle_rec_{len(marks)}__"
            marks[mark] = item
            retarget(t, mark)
        if extra is not None:
            assert isinstance(tree, exp.Select)
            tree.select(parse_one(extra, read=SPARK), append=True, copy=False)
        out = tree.sql(SPARK)
        for mark, item in marks.items():
            out = out.replace(mark, item)
        return out

    def _at(self, ctx: Context, state: State):
        """Table substitution reading every source at ``state`` (CTE references keep their names)."""

        def sub(t: exp.Table) -> str | None:
            if t.name in self.placeholders:
                return self.source_item(ctx, self.placeholders[t.name], state)
            return None

        return sub

    def _with(self, ctx: Context, state: State) -> list[str]:
        return [f"{quote(n)} AS ({self._render(b, self._at(ctx, state))})" for n, b in self.helpers]

    def native(self, ctx: Context, state: State) -> str:
        """The CTE's rows at ``state``, named by the CTE's columns. UNION ALL: Spark's own recursion.
        UNION: a fixpoint the refresh executor runs before the query (Spark cannot)."""
        anchor = self._render(self.anchor_ast, self._at(ctx, state))
        if self.distinct:
            helpers = self._with(ctx, state)
            prefix = f"WITH RECURSIVE {', '.join(helpers)} " if helpers else ""
            step = self._render(self.step_ast, self._step_sub(ctx, {}, state, PREV))
            # the fixpoint reads its previous iteration as {prev}; helpers are inlined in both queries
            name = ctx.fixpoint(Fixpoint(self.columns, prefix + anchor, prefix + step))
            return f"SELECT * FROM {name}"
        body = f"{anchor} UNION ALL {self._render(self.step_ast, self._at(ctx, state))}"
        ctes = self._with(ctx, state) + [f"{quote(self.name)}({self._cte_cols()}) AS ({body})"]
        return f"WITH RECURSIVE {', '.join(ctes)} SELECT * FROM {quote(self.name)}"

    def snapshot(self, ctx: Context, state: State) -> str:
        select = ", ".join(f"{quote(c)} AS {quote(i)}" for c, i in zip(self.columns, self.internal, strict=True))
        return f"SELECT {select} FROM ({self.native(ctx, state)})"

    def _to_internal(self, zset: str) -> str:
        select = ", ".join(f"{quote(c)} AS {quote(i)}" for c, i in zip(self.columns, self.internal, strict=True))
        return f"SELECT {select}, {W} FROM ({zset})"

    def _consolidated(self, parts: list[str], positive: bool = False) -> str:
        cols = self._cte_cols()
        body = "\nUNION ALL\n".join(f"SELECT * FROM ({p})" for p in parts)
        having = f"SUM({W}) > 0" if positive else f"SUM({W}) <> 0"
        return f"SELECT {cols}, SUM({W}) AS {W} FROM ({body}) GROUP BY {cols} HAVING {having}"

    def _negated(self, rel: str) -> str:
        return f"SELECT {self._cte_cols()}, -{W} AS {W} FROM {rel}"

    def _r_pre(self, ctx: Context) -> str:
        """R_pre with weights: from the stream table when it stores this CTE's rows, else recomputed."""
        if self.stored is not None:
            cols = ", ".join(f"{quote(u)} AS {quote(c)}" for u, c in zip(self.stored, self.columns, strict=True))
            # plain rows: each stored row is one copy (the rules treat R_pre as a Z-set, unconsolidated)
            return f"SELECT {cols}, CAST(1 AS BIGINT) AS {W} FROM {ctx.target()}"
        return f"SELECT *, CAST(1 AS BIGINT) AS {W} FROM ({self.native(ctx, 'pre')})"

    def _anchor_delta(self, ctx: Context) -> str | None:
        """ΔA named by the CTE's columns, with ``__w``."""
        if self.anchor is not None:
            d = self.anchor.delta(ctx)
            if d is None:
                return None
            select = ", ".join(f"{quote(i)} AS {quote(c)}" for i, c in zip(self.anchor.cols, self.columns, strict=True))
            # netted: A⁻ must be rows of the old anchor (a delta may hold +w/-w pairs of phantom tuples)
            return self._consolidated([f"SELECT {select}, {W} FROM ({d})"])
        anchor_keys = {self.placeholders[t.name] for t in self.anchor_ast.find_all(exp.Table)
                       if t.name in self.placeholders}
        if not any(ctx.changed(k) for k in anchor_keys):
            return None
        helpers = self._with(ctx, "post"), self._with(ctx, "pre")
        post, pre = (f"{'WITH RECURSIVE ' + ', '.join(h) + ' ' if h else ''}{self._render(self.anchor_ast, self._at(ctx, s))}"
                     for h, s in zip(helpers, ("post", "pre"), strict=True))
        return self._consolidated([f"SELECT *, CAST(1 AS BIGINT) AS {W} FROM ({post})",
                                   f"SELECT *, CAST(-1 AS BIGINT) AS {W} FROM ({pre})"])

    def _step_sub(self, ctx: Context, items: dict[str, str], default: State, self_rel: str):
        """Substitution for the recursive term: occurrences by alias from ``items`` (else the source at
        ``default``), the self-reference reads ``self_rel``."""

        def sub(t: exp.Table) -> str | None:
            if t.name.lower() == self.name and not t.db:
                return self_rel
            if t.name in self.placeholders:
                alias = t.alias_or_name.lower()
                if alias in items:
                    return items[alias]
                return self.source_item(ctx, self.placeholders[t.name], default)
            return None

        return sub

    def _step(self, ctx: Context, items: dict[str, str], weighted: set[str], default: State, self_rel: str) -> str:
        """The recursive term over ``self_rel`` (CTE columns + ``__w``), occurrences read from ``items``
        (those in ``weighted`` carry a ``__w`` multiplied into the row's), the others at ``default``."""
        assert self.shape is not None
        weights = [f"{quote(self.shape.self_alias)}.{W}"] + [f"{quote(a)}.{W}" for a in sorted(weighted)]
        return self._render(self.step_ast, self._step_sub(ctx, items, default, self_rel),
                            f"{' * '.join(weights)} AS {W}")

    # --- delta ---

    def mode(self, ctx: Context) -> str:
        """The rule this refresh uses (see the module docstring)."""
        if self.shape is None:
            return "recompute-diff"
        if all(ctx.sources[s].insert_only or not ctx.changed(s) for s in self.sources()):
            return "semi-naive"
        return "DRed" if self.distinct else "counting"

    def delta(self, ctx: Context) -> str | None:
        if not self.changed(ctx):
            return None
        mode = self.mode(ctx)
        why = {"recompute-diff": self.shape_reason, "semi-naive": "the window only inserted rows",
               "counting": "the window deleted or updated rows", "DRed": "the window deleted or updated rows"}
        ctx.note(f"recursive CTE {self.name}: {mode} ({why[mode]})")
        if mode == "recompute-diff":
            return self._recompute_diff(ctx)
        if self.distinct:
            return self._set_delta(ctx, mode == "semi-naive")
        return self._bag_delta(ctx, mode == "semi-naive")

    def _recompute_diff(self, ctx: Context) -> str:
        post = f"SELECT *, CAST(1 AS BIGINT) AS {W} FROM ({self.native(ctx, 'post')})"
        pre = self._r_pre(ctx)
        return self._to_internal(self._consolidated([post, self._negated(f"({pre})")]))

    def _changed_occurrences(self, ctx: Context) -> list[Occurrence]:
        assert self.shape is not None
        return [o for o in self.shape.occurrences if ctx.changed(o.source)]

    def _bag_delta(self, ctx: Context, inserts_only: bool) -> str:
        """Counting (semi-naive when ``inserts_only``): see the module docstring. Lost and New are weighted
        :class:`Fixpoint` loops (netted per round); the small relations they read (ΔA, each occurrence's
        delta and kept rows, R_pre, R_K) are CTEs repeated in each of their queries."""
        assert self.shape is not None
        n = self._n
        defs: list[tuple[str, str]] = []  # non-recursive CTEs the queries below may read

        def with_(body: str) -> str:
            """``body`` with the CTEs it reads (transitively): a round's query is analysed every round."""
            need, text = [], body
            for name, sql in reversed(defs):
                if re.search(rf"\b{name}\b", text):
                    need.append(f"{name} AS ({sql})")
                    text += sql
            return f"WITH {', '.join(reversed(need))} {body}" if need else body

        def loop(seeds: list[str], step: str) -> str:
            seed = "\nUNION ALL\n".join(f"SELECT * FROM ({x})" for x in seeds)
            return ctx.fixpoint(Fixpoint([*self.columns, W], with_(seed), with_(step), weighted=True))

        da = self._anchor_delta(ctx)
        if da is not None:
            defs.append((n("da"), da))
        changed = self._changed_occurrences(ctx)
        for i, o in enumerate(changed):
            d = o.scan().delta(ctx)
            assert d is not None
            defs.append((n(f"d{i}"), d))
            if not inserts_only:  # K_i = Q_i − I_i, weighted
                cols = col_list(o.scan().cols)
                post = o.scan().snapshot(ctx, "post")
                defs.append((n(f"k{i}"), f"SELECT {cols}, SUM({W}) AS {W} FROM ("
                             f"SELECT {cols}, CAST(1 AS BIGINT) AS {W} FROM ({post}) UNION ALL "
                             f"SELECT {cols}, -{W} FROM {n(f'd{i}')} WHERE {W} > 0) GROUP BY {cols} HAVING SUM({W}) > 0"))

        def part(i: int, sign: str) -> tuple[dict[str, str], set[str]]:
            """Occurrence items of one telescoping term: <i kept, i its deleted (-) / inserted (+) rows."""
            cols = col_list(changed[i].scan().cols)
            items = {changed[i].alias: f"(SELECT {cols}, {'-' if sign == '-' else ''}{W} AS {W} "
                                       f"FROM {n(f'd{i}')} WHERE {W} {'<' if sign == '-' else '>'} 0)"}
            weighted = {changed[i].alias}
            for j in range(i):
                if inserts_only:  # K = P
                    items[changed[j].alias] = self.source_item(ctx, changed[j].source, "pre")
                else:
                    items[changed[j].alias] = n(f"k{j}")
                    weighted.add(changed[j].alias)
            return items, weighted

        lost_seed, new_seed = [], []
        if da is not None:
            new_seed.append(f"SELECT * FROM {n('da')} WHERE {W} > 0")
            if not inserts_only:
                lost_seed.append(self._negated(f"{n('da')} WHERE {W} < 0"))
        if changed:
            rp = self._r_pre(ctx)
            if self.stored is None:  # a recursion: evaluate it once, however often it is read
                rp = f"SELECT * FROM {ctx.fixpoint(Fixpoint([*self.columns, W], rp, None, weighted=True))}"
            defs.append((n("rp"), rp))
            if not inserts_only:
                for i in range(len(changed)):
                    items, weighted = part(i, "-")
                    lost_seed.append(self._step(ctx, items, weighted, "pre", n("rp")))
        lost = None
        if lost_seed:
            items = {o.alias: n(f"k{i}") for i, o in enumerate(changed)}
            lost = loop(lost_seed, self._step(ctx, items, set(items), "post", PREV))
            if changed:
                rk = self._consolidated([f"SELECT * FROM {n('rp')}", self._negated(lost)], positive=True)
                defs.append((n("rk"), rk))
        for i in range(len(changed)):
            items, weighted = part(i, "+")
            new_seed.append(self._step(ctx, items, weighted, "post", n("rk") if lost else n("rp")))
        parts = []
        if new_seed:
            parts.append(f"SELECT * FROM {loop(new_seed, self._step(ctx, {}, set(), 'post', PREV))}")
        if lost is not None:
            parts.append(self._negated(lost))
        assert parts, "a changed recursive CTE has a changed anchor or a changed occurrence"
        return self._to_internal(self._consolidated(parts))

    def _set_delta(self, ctx: Context, inserts_only: bool) -> str:
        """Semi-naive (``inserts_only``) or DRed over sets, each phase a :class:`Fixpoint`: see the module
        docstring. Relations are SQL text named by the CTE's columns; a fixpoint is read by its name."""
        cols = self._cte_cols()

        def rel(sql: str) -> str:
            return f"SELECT {cols} FROM ({sql})"

        def union(parts: list[str]) -> str:
            return " UNION ".join(f"SELECT * FROM ({p})" for p in parts)

        def op(a: str, how: str, b: str) -> str:
            return f"SELECT * FROM ({a}) {how} SELECT * FROM ({b})"

        def fix(seed: str, step: str) -> str:
            return f"SELECT * FROM {ctx.fixpoint(Fixpoint(self.columns, seed, step))}"

        changed = self._changed_occurrences(ctx)
        deltas = [o.scan().delta(ctx) for o in changed]

        def rows(i: int, sign: str) -> str:
            return f"(SELECT {col_list(changed[i].scan().cols)} FROM ({deltas[i]}) WHERE {W} {sign} 0)"

        def f_d(x: str) -> list[str]:  # derivations through a (possibly) deleted row, others at P
            return [self._render(self.step_ast, self._step_sub(ctx, {o.alias: rows(i, '<')}, "pre", f"({x})"))
                    for i, o in enumerate(changed)]

        def f_i(x: str) -> list[str]:  # derivations through a (possibly) inserted row, others at Q
            return [self._render(self.step_ast, self._step_sub(ctx, {o.alias: rows(i, '>')}, "post", f"({x})"))
                    for i, o in enumerate(changed)]

        def f(x: str, state: State) -> str:
            return self._render(self.step_ast, self._step_sub(ctx, {}, state, x))

        r_pre = rel(self._r_pre(ctx))
        da = self._anchor_delta(ctx)
        a_plus = [rel(f"SELECT * FROM ({da}) WHERE {W} > 0")] if da is not None else []
        a_minus = [rel(f"SELECT * FROM ({da}) WHERE {W} < 0")] if da is not None else []
        if inserts_only:
            seeds = a_plus + f_i(r_pre)
            new = fix(op(union(seeds), "EXCEPT", r_pre), op(f(PREV, "post"), "EXCEPT", r_pre)) if seeds else None
            gone = None
        else:
            seeds = a_minus + f_d(r_pre)
            od = fix(op(union(seeds), "INTERSECT", r_pre), op(f(PREV, "pre"), "INTERSECT", r_pre)) if seeds else None
            if od is not None:
                anchor_post = self._render(self.anchor_ast, self._at(ctx, "post"))
                helpers = self._with(ctx, "post")
                if helpers:
                    anchor_post = f"WITH RECURSIVE {', '.join(helpers)} {anchor_post}"
                kept = op(r_pre, "EXCEPT", od)
                rd = fix(op(od, "INTERSECT", union([rel(anchor_post), f(f"({kept})", "post")])),
                         op(f(PREV, "post"), "INTERSECT", od))
                mid = union([kept, rd])
                gone = op(od, "EXCEPT", rd)
            else:
                mid, gone = r_pre, None
            seeds = a_plus + f_i(mid)
            new = fix(op(union(seeds), "EXCEPT", mid), op(f(PREV, "post"), "EXCEPT", mid)) if seeds else None
        parts = []
        if new is not None:
            parts.append(f"SELECT *, CAST(1 AS BIGINT) AS {W} FROM ({new})")
        if gone is not None:
            parts.append(f"SELECT *, CAST(-1 AS BIGINT) AS {W} FROM ({gone})")
        if not parts:
            return self._to_internal(f"SELECT *, CAST(0 AS BIGINT) AS {W} FROM ({r_pre}) WHERE FALSE")
        return self._to_internal(self._consolidated(parts))


def analyze_step(step: exp.Expression, name: str, placeholders: dict[str, str],
                 schemas: dict[str, list[tuple[str, str]]]) -> tuple[Shape | None, str]:
    """The recursive term's :class:`Shape` when it is linear in the CTE and multilinear and monotone in
    its base tables — one SELECT of inner joins of source tables and ONE reference to the CTE, with any
    deterministic WHERE and select list — else None and why (the CTE then uses recompute-diff)."""
    if not isinstance(step, exp.Select):
        return None, "the recursive term is a set operation"
    for arg, what in (("group", "GROUP BY"), ("having", "HAVING"), ("distinct", "DISTINCT"),
                      ("order", "ORDER BY"), ("qualify", "QUALIFY"), ("laterals", "LATERAL VIEW"),
                      ("with_", "WITH"), ("with", "WITH")):
        if step.args.get(arg):
            return None, f"the recursive term has {what}"
    for node in step.walk():
        if isinstance(node, exp.AggFunc):
            return None, "the recursive term aggregates"
        if isinstance(node, exp.Window):
            return None, "the recursive term has a window function"
        if isinstance(node, (exp.Lateral, exp.Unnest, exp.Explode)):
            return None, "the recursive term explodes rows"
        if node is not step and isinstance(node, (exp.Select, exp.Subquery, exp.Exists)):
            return None, "the recursive term has a subquery"
    from_ = step.args.get("from_") or step.args.get("from")
    if from_ is None:
        return None, "the recursive term has no FROM"
    joins = step.args.get("joins") or []
    for j in joins:
        side, kind = (j.side or "").upper(), (j.kind or "").upper()
        if side or kind not in ("", "INNER", "CROSS") or j.args.get("method"):
            what = " ".join(x for x in (j.args.get("method") or "", side, kind) if x)
            return None, f"the recursive term has a {what} JOIN (not monotone in its sources)"
    self_alias = None
    occurrences = []
    for item in [from_.this] + [j.this for j in joins]:
        if not isinstance(item, exp.Table):
            return None, "the recursive term reads a subquery"
        alias = item.alias_or_name.lower()
        if item.name.lower() == name and not item.db:
            if self_alias is not None:
                return None, "the recursive term reads the CTE twice"
            self_alias = alias
        elif item.name in placeholders:
            source = placeholders[item.name]
            used = {c.name.lower() for c in step.find_all(exp.Column) if c.table.lower() == alias}
            occurrences.append(Occurrence(alias, source, [c for c, _ in schemas[source] if c.lower() in used]))
        else:
            return None, f"the recursive term reads {item.name}, which is not a source table"
    if self_alias is None:
        return None, "the recursive term does not read the CTE in its FROM clause"
    return Shape(self_alias, occurrences), ""
