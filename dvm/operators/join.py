"""Inner join (equi, non-equi, cross; 3+ tables as nested binary joins).

Delta rule (Z-sets, bilinear):  Δ(L ⋈ R) = ΔL ⋈ R_post  +  L_post ⋈ ΔR  −  ΔL ⋈ ΔR.

This is the textbook ΔL ⋈ R_pre + L_post ⋈ ΔR with R_pre written as R_post − ΔR, so it stays exact when in
one window a row's join key changes *and* its old partner is deleted (the case that breaks systems which
join deletions against the other side's *current* state without the correction term). Why not read R_pre
by time travel: every snapshot of a Delta table at a new version costs a state-reconstruction Spark job,
and the post snapshot is shared with every other read of the refresh, while a pre snapshot never is. A side
that did not change drops its terms, so a change to only one table costs one join of its delta against
the other side.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State
from dvm.operators.base import Node, W, col_list, consolidate, union_all


def join_sql(left: str, right: str, kind: str, condition: exp.Expression | None, select: str) -> str:
    on = condition.sql(dialect="spark") if condition is not None else "TRUE"
    return f"SELECT {select} FROM ({left}) __l {kind} JOIN ({right}) __r ON {on}"


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
        return self.condition.sql(dialect="spark") if self.condition is not None else "TRUE"


@dataclass(eq=False)
class InnerJoin(BinaryJoin):

    def delta(self, ctx: Context) -> str | None:
        parts = []
        dl = self.left.delta(ctx)
        dr = self.right.delta(ctx)
        if dl is not None:
            parts.append(join_sql(dl, self.right.snapshot(ctx, "post"), "INNER", self.condition,
                                  f"{col_list(self.cols)}, __l.{W}"))
        if dr is not None:
            parts.append(join_sql(self.left.snapshot(ctx, "post"), dr, "INNER", self.condition,
                                  f"{col_list(self.cols)}, __r.{W}"))
        if dl is None or dr is None:
            return union_all(parts)
        # the correction term cancels rows of the other two (a changed row joined with a deleted partner
        # appears once with +w and once with -w): net them, MIN/MAX above must not see phantom inserts
        parts.append(join_sql(dl, dr, "INNER", self.condition, f"{col_list(self.cols)}, -(__l.{W} * __r.{W}) AS {W}"))
        return consolidate(union_all(parts), self.cols)  # type: ignore[arg-type]

    def label(self) -> str:
        return f"InnerJoin ON {self.on_sql()}"
