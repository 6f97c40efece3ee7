"""Inner join (equi, non-equi, cross; 3+ tables as nested binary joins).

Delta rule (Z-sets, bilinear):  Δ(L ⋈ R) = ΔL ⋈ R_post  +  L_post ⋈ ΔR  −  ΔL ⋈ ΔR.

This is the textbook ΔL ⋈ R_pre + L_post ⋈ ΔR with R_pre written as R_post − ΔR, so it stays exact when in
one window a row's join key changes *and* its old partner is deleted (the case that breaks systems which
join deletions against the other side's *current* state without the correction term). Why not read R_pre
by time travel: every snapshot of a Delta table at a new version costs a state-reconstruction Spark job,
and the post snapshot is shared with every other read of the refresh, while a pre snapshot never is. A side
that did not change drops its terms, so a change to only one table costs one join of its delta against
the other side. When that side is large and the delta small, the delta is held and the other side read only
where its keys fall (:mod:`dvm.key_filter`): Delta skips the files no key can be in.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.dialect import SPARK
from dvm.key_filter import KeyFilter
from dvm.operators.base import Node, W, col_list, consolidate, null_safe_match, union_all
from dvm.operators.filter import Filter

#: equalities of a join condition used as key filters, at most (each a predicate of up to 16 ranges)
MAX_KEY_FILTERS = 2


def equi_keys(condition: exp.Expression | None, keyed: list[str], filtered: list[str]) -> list[tuple[str, str]]:
    """The conjuncts ``a = b`` of ``condition`` with ``a`` over columns of ``keyed`` only and ``b`` a column of
    ``filtered``, as (a, b) SQL: a column is what Delta and Parquet can skip by."""
    if condition is None:
        return []
    out = []
    for conj in condition.flatten() if isinstance(condition, exp.And) else [condition]:
        if not isinstance(conj, exp.EQ):
            continue
        for a, b in ((conj.this, conj.expression), (conj.expression, conj.this)):
            names = {c.name for c in a.find_all(exp.Column)}
            if names and names <= set(keyed) and isinstance(b, exp.Column) and b.name in filtered:
                out.append((a.sql(SPARK), b.sql(SPARK)))
                break
    return out[:MAX_KEY_FILTERS]


def join_sql(left: str, right: str, kind: str, condition: exp.Expression | None, select: str) -> str:
    on = condition.sql(SPARK) if condition is not None else "TRUE"
    return f"SELECT {select} FROM ({left}) __l {kind} JOIN ({right}) __r ON {on}"


class Inputs:
    """What a join's delta rule reads — each input's delta and snapshots — rendered once per refresh and
    named once in a WITH clause, however many terms of the rule read it. Without this the SQL of nested
    joins grows exponentially with depth (every term repeats its inputs' whole SQL), and Spark spends its
    time analysing and optimising copies; a CTE read several times is also computed once (its exchanges
    are reused). Identical SQL (e.g. the pre and post snapshot of an unchanged input) gets one name."""

    def __init__(self, ctx: Context, **nodes: Node) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self.defs: list[tuple[str, str]] = []
        self._deltas: dict[str, str | None] = {}
        self._held: dict[str, str] = {}  # side -> the held relation its delta's WITH query reads
        self._snapshots: dict[tuple[str, State], str] = {}
        #: set by :func:`affected_rows`: the input whose rows it selected, and the other inputs whose delta did
        self._affected: tuple[str, list[str]] | None = None

    def share(self, sql: str) -> str:
        """A query reading ``sql`` through a name of this WITH clause."""
        for name, body in self.defs:
            if body == sql:
                return f"SELECT * FROM {name}"
        name = self.ctx.name("__j")
        self.defs.append((name, sql))
        return f"SELECT * FROM {name}"

    def delta(self, side: str, hold: bool = False) -> str | None:
        """The delta of input ``side``. ``hold``: computed once before the query, so that a key filter can read
        its keys (the WITH query every term reads it by then reads the held relation)."""
        if side not in self._deltas:
            d = self.nodes[side].delta(self.ctx)
            self._deltas[side] = None if d is None else self.share(d)
        ref = self._deltas[side]
        if hold and ref is not None and side not in self._held:
            name = ref[len("SELECT * FROM "):]
            i = next(i for i, (n, _) in enumerate(self.defs) if n == name)
            self._held[side] = self.ctx.hold(self.defs[i][1])
            self.defs[i] = (name, f"SELECT * FROM {self._held[side]}")
        return ref

    def keyed_post(self, side: str, by: str, condition: exp.Expression | None) -> tuple[str | None, str | None]:
        """The post snapshot of ``side`` as a term joining it with the delta of ``by`` on ``condition`` reads
        it, and that delta (both None when the delta is). When the snapshot is large and the delta small, the
        delta is held and the snapshot filtered by its keys on the condition's equalities between the two
        inputs (see :mod:`dvm.key_filter`): a row of ``side`` whose key no changed row carries joins none."""
        pairs = equi_keys(condition, self.nodes[by].cols, self.nodes[side].cols)
        filtered = bool(pairs) and self.nodes[by].changed(self.ctx) and (
            self.ctx.filters_keys(self.nodes[side].snapshot(self.ctx, "post")))
        delta = self.delta(by, hold=filtered)
        if delta is None:
            return None, None
        post = self.snapshot(side, "post")
        if not filtered:
            return post, delta
        tokens = [self.ctx.key_filter(KeyFilter(self._held[by], key, column)) for key, column in pairs]
        self.ctx.note("key filter: a join input's post snapshot read only where the changed rows' keys fall "
                      "(" + ", ".join(column for _, column in pairs) + ")")
        return f"SELECT * FROM ({post}) __k WHERE {' AND '.join(tokens)}", delta

    def _token(self, held_side: str, key: str, column: str) -> str:
        """A key filter on ``column`` by the values ``key`` takes in the held delta of ``held_side``."""
        self.delta(held_side, hold=True)
        return self.ctx.key_filter(KeyFilter(self._held[held_side], key, column))

    def affected_filter(self, side: str, others: list[tuple[str, exp.Expression | None]]) -> str | None:
        """A predicate over ``side``'s columns true for every row :func:`affected_rows` can select from either
        snapshot, when that snapshot is large and the deltas small (None otherwise: read it whole). An affected
        row's tuple is in ΔX, or it meets a row of some ΔOther under that input's condition, so its column
        ``c`` of an equality ``c = b`` with each changed other takes one of ΔOther's values of ``b``, one of
        ΔX's values of ``c``, or NULL (a NULL-keyed tuple of ΔX is affected too)."""
        node = self.nodes[side]
        if not self.ctx.filters_keys(node.snapshot(self.ctx, "post")):
            return None
        terms, column = [], None
        for o, cond in others:
            if self.delta(o) is None:
                continue
            pairs = equi_keys(cond, self.nodes[o].cols, node.cols)
            if not pairs:
                return None
            key, col = pairs[0]
            terms.append(self._token(o, key, col))
            column = column or col
        if column is None:
            return None
        if self.delta(side) is not None:
            terms.append(self._token(side, column, column))
        self.ctx.note("key filter: the rows a change affects read at both states only where the changed rows' "
                      f"keys fall ({column})")
        return "(" + " OR ".join([*terms, f"{column} IS NULL"]) + ")"

    def partner_filter(self, side: str, condition: exp.Expression | None) -> str | None:
        """A predicate over ``side``'s columns true for every row meeting, under ``condition``'s equalities, an
        affected row of the input :func:`affected_rows` selected from (None: read it whole). That row's tuple is
        in ΔX, or meets a row of Δ``side`` (when ``side`` is the only other input that changed), so a partner's
        column ``b`` of an equality ``a = b`` holds ``a`` of some row of ΔX or ``b`` of some row of Δ``side``;
        NULL meets nothing."""
        if self._affected is None:
            return None
        x, changed = self._affected
        if not set(changed) <= {side} or not self.ctx.filters_keys(self.nodes[side].snapshot(self.ctx, "post")):
            return None
        pairs = equi_keys(condition, self.nodes[x].cols, self.nodes[side].cols)
        if not pairs:
            return None
        a, b = pairs[0]
        terms = [self._token(s, k, b) for s, k in ((side, b), (x, a)) if self.delta(s) is not None]
        self.ctx.note("key filter: the partners of the rows a change affects read at both states only where "
                      f"those rows' keys fall ({b})")
        return "(" + " OR ".join(terms) + ")"

    def snapshot(self, side: str, state: State) -> str:
        if (side, state) not in self._snapshots:
            self._snapshots[(side, state)] = self.share(self.nodes[side].snapshot(self.ctx, state))
        return self._snapshots[(side, state)]

    def wrap(self, body: str | None) -> str | None:
        if body is None or not self.defs:
            return body
        return "WITH " + ",\n".join(f"{n} AS ({b})" for n, b in self.defs) + "\n" + body


#: the state tag of rows recomputed on both snapshots in one pass: +1 post, -1 pre (it is also their weight)
TAG = "__sa"
#: the state tag of the other input's rows they are joined with
OTHER_TAG = "__sb"


def _signs(column: str) -> str:
    return f"(VALUES (CAST(1 AS BIGINT)), (CAST(-1 AS BIGINT))) AS __signs({column})"


def _tagged(inputs: Inputs, side: str, column: str, where: str | None = None) -> str:
    """Both snapshots of ``side`` tagged by ``column``, each read only where ``where`` holds when given."""
    same = not inputs.nodes[side].changed(inputs.ctx)
    post, pre = inputs.snapshot(side, "post"), inputs.snapshot(side, "post" if same else "pre")
    if where is not None:
        post, pre = (f"SELECT * FROM ({s}) __k WHERE {where}" for s in (post, pre))
    if same:  # unchanged input: read it once, twice over
        return f"SELECT __x.*, __signs.{column} FROM ({post}) __x CROSS JOIN {_signs(column)}"
    return (f"SELECT *, CAST(1 AS BIGINT) AS {column} FROM ({post}) UNION ALL "
            f"SELECT *, CAST(-1 AS BIGINT) AS {column} FROM ({pre})")


def both_states(inputs: Inputs, side: str, condition: exp.Expression | None) -> str:
    """The rows of the input ``side`` at both frontiers, tagged ``__sb`` = +1 (post) / -1 (pre), that may meet
    the affected rows under ``condition``: all of them, or those a key filter keeps (:meth:`Inputs.partner_filter`)."""
    return _tagged(inputs, side, OTHER_TAG, inputs.partner_filter(side, condition))


def tagged_condition(condition: exp.Expression | None) -> str:
    """``condition`` restricted to rows of the same state (see :func:`affected_rows`)."""
    on = condition.sql(SPARK) if condition is not None else "TRUE"
    return f"({on}) AND __l.{TAG} = __r.{OTHER_TAG}"


def affected_rows(inputs: Inputs, side: str, others: list[tuple[str, exp.Expression | None]]) -> str:
    """σ_P X_post ⊎ σ_P X_pre in one relation, tagged ``__sa`` = +1 / -1, X the input ``side`` of a join: the
    rows whose tuple occurs in X's own delta, or that match some row of another input's delta under that
    input's condition (P(x) in the rules of the outer, semi, anti and mark joins). Every other row meets the
    same partners before and after, so those rules recompute only these rows, joining them with the other
    input's rows of the same state (:func:`both_states`, :func:`tagged_condition`); the tag is the sign.
    At least one other input must have changed (the others are skipped).

    P is a property of the tuple, so the affected tuples are found once for both states:
    K = D ∪ ⋃ π(X_post ⋉_θ ΔOther), D = the distinct tuples of ΔX, and σ_P X_state = X_state ⋉ K (matched
    NULL-safely). K needs no X_pre: a tuple of X_pre that is not in X_post changed, so it is in D.
    A condition may reference both inputs' columns: internal names are unique across the tree, so it reads
    the same whichever side X is. One pass over both states reads every input once: Spark inlines every
    repeated subquery, so a rule that reads an input twice doubles the plan of everything below it."""
    node = inputs.nodes[side]
    # (X_post as the semi-join with ΔOther reads it, ΔOther, θ): X_post filtered by ΔOther's keys when large
    changed = [(post, d, cond) for o, cond in others for post, d in [inputs.keyed_post(side, o, cond)]
               if d is not None]
    assert changed, "affected rows need a changed other input"

    def by_other(src: str, delta: str, cond: exp.Expression | None, cols: str) -> str:
        on = cond.sql(SPARK) if cond is not None else "TRUE"
        return f"SELECT {cols} FROM ({src}) __a LEFT SEMI JOIN ({delta}) __e ON {on}"

    own_delta = inputs.delta(side)
    inputs._affected = (side, [o for o, _ in others if inputs.delta(o) is not None])
    if own_delta is None and len(changed) == 1:  # X_pre = X_post: P is the match with ΔOther alone
        hit = by_other(*changed[0], "__a.*")  # type: ignore[arg-type]
        return f"SELECT __h.*, __signs.{TAG} FROM ({hit}) __h CROSS JOIN {_signs(TAG)}"
    renamed = ", ".join(f"{quote(c)} AS {quote('__d_' + c)}" for c in node.cols)
    parts = [f"SELECT {renamed} FROM ({own_delta})"] if own_delta is not None else []
    parts += [f"SELECT {renamed} FROM ({by_other(post, d, c, col_list(node.cols, '__a.'))})"  # type: ignore[arg-type]
              for post, d, c in changed]
    keys = f"SELECT DISTINCT * FROM ({union_all(parts)})"
    match = null_safe_match("__a", "__d", [(c, "__d_" + c) for c in node.cols])
    tagged = _tagged(inputs, side, TAG, inputs.affected_filter(side, others))
    return f"SELECT __a.* FROM ({tagged}) __a LEFT SEMI JOIN ({keys}) __d ON {match}"


@dataclass(eq=False)
class BinaryJoin(Node):
    """What every two-input join shares: its inputs, its ON condition and its snapshot."""

    left: Node
    right: Node
    condition: exp.Expression | None
    kind = "INNER"

    def __post_init__(self) -> None:
        self.children = [self.left, self.right]
        self.cols = self.left.cols + self.right.cols

    def snapshot(self, ctx: Context, state: State) -> str:
        return join_sql(
            self.left.snapshot(ctx, state), self.right.snapshot(ctx, state), self.kind, self.condition,
            col_list(self.cols),
        )

    def on_sql(self) -> str:
        return self.condition.sql(SPARK) if self.condition is not None else "TRUE"

    def inputs(self, ctx: Context) -> Inputs:
        return Inputs(ctx, left=self.left, right=self.right)


def inner_delta(cols: list[str], condition: exp.Expression | None, inputs: Inputs) -> str | None:
    """ΔL ⋈ R_post + L_post ⋈ ΔR − ΔL ⋈ ΔR over the inputs ``left`` and ``right`` (see the module doc)."""
    parts = []
    right_post, dl = inputs.keyed_post("right", "left", condition)
    left_post, dr = inputs.keyed_post("left", "right", condition)
    if dl is not None:
        parts.append(join_sql(dl, right_post, "INNER", condition, f"{col_list(cols)}, __l.{W}"))  # type: ignore[arg-type]
    if dr is not None:
        parts.append(join_sql(left_post, dr, "INNER", condition, f"{col_list(cols)}, __r.{W}"))  # type: ignore[arg-type]
    if dl is None or dr is None:
        return union_all(parts)
    # the correction term cancels rows of the other two (a changed row joined with a deleted partner
    # appears once with +w and once with -w): net them, MIN/MAX above must not see phantom inserts
    parts.append(join_sql(dl, dr, "INNER", condition, f"{col_list(cols)}, -(__l.{W} * __r.{W}) AS {W}"))
    return consolidate(union_all(parts), cols)  # type: ignore[arg-type]


def absorb_equalities(node: Node, predicate: exp.Expression) -> exp.Expression | None:
    """Move each equality ``column = column`` of a WHERE ``predicate`` between the two inputs of an inner join
    below ``node`` (through a chain of inner joins, as ``FROM a, b, c WHERE ...`` builds them) into that
    join's condition, and each conjunct over one input's columns alone into a Filter over that input; the
    conjuncts left, in their order, or None. Why: the same rows (an inner join's condition and a filter above
    it are one predicate), but a join that knows its equalities reads its large input only where its delta's
    keys fall (:meth:`Inputs.keyed_post`), while ``ON TRUE`` reads all of it; and a delta filtered before the
    join holds only the rows that can pass, so the keys it filters the other inputs by are only theirs.
    Equalities of columns only: an expression in a join's condition would be evaluated on pairs of rows, and
    could fail (ANSI mode) on pairs the other conjuncts would have dropped. A conjunct over one input is
    evaluated on that input's rows, as Spark's optimiser evaluates it (it pushes such conjuncts into the
    input's scan); those with a subquery, an aggregate or a window stay.

    The search also goes down the left input of a LEFT OUTER, SEMI or ANTI join: each of its rows passes (or
    not) as a whole with its columns unchanged, so a conjunct over those columns alone means the same below
    it. That is where a scalar subquery's decorrelated LEFT JOIN puts ``FROM a, b``: TPC-H Q17 joined its
    changed lineitems with every part (``ON TRUE``) before the WHERE's ``p_partkey = l_partkey``, and held
    that join's ~12K rows before its ``p_brand`` and ``p_container`` filter, which now leaves ~10 of them
    below the subquery's join (its refresh 3.4 -> 1.8 s; the subquery's own AVG still recomputes every part
    the changed lineitems name: docs/BENCHMARKS.md, "Session 68")."""
    conjuncts = list(predicate.flatten()) if isinstance(predicate, exp.And) else [predicate]
    absorbed: set[int] = set()
    _absorb(node, conjuncts, absorbed)
    rest = [c for c in conjuncts if id(c) not in absorbed]
    return exp.and_(*rest) if rest else None


def _columns(c: exp.Expression) -> set[str]:
    return {col.name for col in c.find_all(exp.Column)}


def _movable(c: exp.Expression) -> bool:
    """Whether a conjunct may filter a join's input instead (volatile functions never reach a plan: see
    :func:`dvm.builder.checks.reject_unsafe`)."""
    return not any(True for _ in c.find_all(exp.Subquery, exp.Select, exp.AggFunc, exp.Window))


def _filtered(child: Node, conjuncts: list[exp.Expression], absorbed: set[int]) -> Node:
    """``child`` under a Filter of the ``conjuncts`` (over its columns alone) no join below took; ``child``
    itself when none is left, or when it is a join (its conjuncts went into its own inputs, and one over both
    of them would be evaluated there as above)."""
    if isinstance(child, BinaryJoin):
        return child
    taken = [c for c in conjuncts if id(c) not in absorbed and _movable(c)]
    if not taken:
        return child
    absorbed.update(id(c) for c in taken)
    return Filter(child, exp.and_(*(c.copy() for c in taken)))


def _absorb(node: Node, conjuncts: list[exp.Expression], absorbed: set[int]) -> None:
    if isinstance(node, BinaryJoin) and node.kind in ("LEFT OUTER", "LEFT SEMI", "LEFT ANTI"):
        left = set(node.left.cols)
        below = [c for c in conjuncts if (names := _columns(c)) and names <= left]
        _absorb(node.left, below, absorbed)
        node.left = _filtered(node.left, below, absorbed)
        node.children = [node.left, node.right]
        return
    if type(node) is not InnerJoin:
        return
    left, right = set(node.left.cols), set(node.right.cols)
    below: dict[str, list[exp.Expression]] = {"left": [], "right": []}
    for c in conjuncts:
        names = _columns(c)
        if names and names <= left:
            below["left"].append(c)
        elif names and names <= right:
            below["right"].append(c)
        elif (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)
              and names <= left | right):
            node.condition = c if node.condition is None else exp.and_(node.condition, c)
            absorbed.add(id(c))
    _absorb(node.left, below["left"], absorbed)
    _absorb(node.right, below["right"], absorbed)
    node.left = _filtered(node.left, below["left"], absorbed)
    node.right = _filtered(node.right, below["right"], absorbed)
    node.children = [node.left, node.right]


@dataclass(eq=False)
class InnerJoin(BinaryJoin):

    def delta(self, ctx: Context) -> str | None:
        inputs = self.inputs(ctx)
        return inputs.wrap(inner_delta(self.cols, self.condition, inputs))

    def label(self) -> str:
        return f"InnerJoin ON {self.on_sql()}"
