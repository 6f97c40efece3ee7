"""Project: the SELECT list (expressions, CASE, casts, deterministic built-in functions).

Delta rule: Δπ(R) = π(ΔR) with weights kept. Projection is bag projection: two input rows that project to
the same tuple stay two rows, which is why weights, not sets, flow between operators.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.dialect import SPARK
from dvm.operators.base import Node, W


@dataclass(eq=False)
class Project(Node):
    child: Node
    items: list[tuple[str, exp.Expression]]  # (internal name, expression over child columns)

    def __post_init__(self) -> None:
        self.children = [self.child]
        self.cols = [name for name, _ in self.items]

    def _select_list(self) -> str:
        return ", ".join(f"{e.sql(SPARK)} AS {quote(n)}" for n, e in self.items)

    def snapshot(self, ctx: Context, state: State) -> str:
        return f"SELECT {self._select_list()} FROM ({self.child.snapshot(ctx, state)})"

    def delta(self, ctx: Context) -> str | None:
        d = self.child.delta(ctx)
        return None if d is None else f"SELECT {self._select_list()}, {W} FROM ({d})"

    def label(self) -> str:
        return "Project " + ", ".join(e.sql(SPARK) for _, e in self.items)
