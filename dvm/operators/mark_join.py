"""Mark join: every row of L plus one BOOLEAN column per subquery, ``mark_i`` = "l has a partner in R_i
under θ_i" (never NULL).

Used when a WHERE clause holds several subquery predicates, or one that is not a plain conjunct, e.g.
``WHERE a > 3 OR EXISTS (...)`` or ``WHERE x IN (...) AND NOT EXISTS (...)``: the builder pushes NOT down to
the predicates (De Morgan, exact in SQL's three-valued logic), gives each predicate a mark and replaces it
by ``mark_i`` (``NOT mark_i`` for the negated forms, whose θ_i already carries the NULL semantics, see
:mod:`~dvm.operators.anti_join`), and keeps one Filter on top. In a WHERE clause only TRUE passes, and AND /
OR are monotone, so a predicate that would be NULL may stand as FALSE there.

Why one operator for all the predicates of a WHERE clause: stacking one semi-join per predicate makes each
read the whole rule of the one below several times, and Spark inlines every such repeated subquery, so the
plan grows exponentially with the number of predicates; side by side, the marks read L's rows once each.

Delta rule: the marks of ``l`` depend only on ``l`` and on its partners, like a semi-join's status, so

    Δ mark(L; R_1..R_k) = (σ_P L_post marked by R_i,post) − (σ_P L_pre marked by R_i,pre),
    ΔL marked by R_i,post when no R_i changed,

with P(l) = l's tuple occurs in ΔL or some row of some ΔR_i matches it under θ_i. A mark is a property of
the tuple, so it is computed once per distinct tuple (a semi-join) and joined back NULL-safely.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.dialect import SPARK
from dvm.operators.base import Node, W, col_list, null_safe_match
from dvm.operators.join import TAG, Inputs, affected_rows, both_states, tagged_condition


@dataclass(eq=False)
class Mark:
    """One subquery of a mark join: its rows, the condition θ a partner satisfies, the mark's column."""

    right: Node
    condition: exp.Expression | None
    name: str

    def on_sql(self) -> str:
        return self.condition.sql(SPARK) if self.condition is not None else "TRUE"


@dataclass(eq=False)
class MarkJoin(Node):
    left: Node
    marks: list[Mark]

    def __post_init__(self) -> None:
        self.children = [self.left] + [m.right for m in self.marks]
        self.cols = list(self.left.cols) + [m.name for m in self.marks]

    def inputs(self, ctx: Context) -> Inputs:
        return Inputs(ctx, left=self.left, **{f"r{i}": m.right for i, m in enumerate(self.marks)})

    def _marked(self, inputs: Inputs, rows: str, state: State | None, weight: str) -> str:
        """``rows`` (rows of the left input) with every mark against its subquery's rows at ``state``; with
        ``state`` None the rows carry a state tag (:func:`~dvm.operators.join.affected_rows`) and meet the
        subquery's rows of their own state."""
        rows = inputs.share(rows)
        keyed = self.left.cols + ([TAG] if state is None else [])
        select = [col_list(self.left.cols, "__m.")]
        joins = []
        for i, m in enumerate(self.marks):
            prefix = f"__k{i}_"
            renamed = ", ".join(f"__l.{quote(c)} AS {quote(prefix + c)}" for c in keyed)
            if state is None:
                right, on = both_states(inputs, f"r{i}", m.condition), tagged_condition(m.condition)
            else:
                right, on = inputs.snapshot(f"r{i}", state), m.on_sql()
            hits = f"SELECT DISTINCT {renamed}, TRUE AS __hit FROM ({rows}) __l LEFT SEMI JOIN ({right}) __r ON {on}"
            match = null_safe_match("__m", f"__k{i}", [(c, prefix + c) for c in keyed])
            joins.append(f"LEFT JOIN ({hits}) __k{i} ON {match}")
            select.append(f"COALESCE(__k{i}.__hit, FALSE) AS {quote(m.name)}")
        select.append(weight if state is not None else f"__m.{TAG} AS {W}")
        return f"SELECT {', '.join(s for s in select if s)} FROM ({rows}) __m {' '.join(joins)}"

    def snapshot(self, ctx: Context, state: State) -> str:
        inputs = self.inputs(ctx)
        out = inputs.wrap(self._marked(inputs, inputs.snapshot("left", state), state, ""))
        assert out is not None
        return out

    def delta(self, ctx: Context) -> str | None:
        inputs = self.inputs(ctx)
        dl = inputs.delta("left")
        others = [(f"r{i}", m.condition) for i, m in enumerate(self.marks)]
        if all(inputs.delta(o) is None for o, _ in others):
            return None if dl is None else inputs.wrap(self._marked(inputs, dl, "post", f"__m.{W}"))
        return inputs.wrap(self._marked(inputs, affected_rows(inputs, "left", others), None, ""))

    def strategy(self) -> str:
        return "incremental (marks of left rows touched by ΔL or matching a ΔR_i re-checked on both snapshots)"

    def label(self) -> str:
        return "MarkJoin " + "; ".join(f"{m.name} = EXISTS partner ON {m.on_sql()}" for m in self.marks)
