"""Inner join (equi, non-equi, cross; 3+ tables as nested binary joins).

Delta rule (Z-sets, bilinear):  Δ(L ⋈ R) = ΔL ⋈ R_pre  +  L_post ⋈ ΔR.

The pre-state of the other side comes from Delta time travel, never from the current table: the rule is
exact when in one window a row's join key changes *and* its old partner is deleted, the case that breaks
systems which read the other side's current state for deletions. A side that did not change drops its
term, so a change to only one table costs one join of its delta against the other side.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State
from dvm.operators.base import Node, W, col_list, union_all


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
        if dl is not None:
            parts.append(join_sql(dl, self.right.snapshot(ctx, "pre"), "INNER", self.condition,
                                  f"{col_list(self.cols)}, __l.{W}"))
        dr = self.right.delta(ctx)
        if dr is not None:
            parts.append(join_sql(self.left.snapshot(ctx, "post"), dr, "INNER", self.condition,
                                  f"{col_list(self.cols)}, __r.{W}"))
        return union_all(parts)

    def label(self) -> str:
        return f"InnerJoin ON {self.on_sql()}"
