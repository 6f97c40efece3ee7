"""Filter (WHERE, HAVING over a nested aggregate).

Delta rule: Δσ(R) = σ(ΔR). A predicate over one row is linear: weights pass through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State
from dvm.dialect import SPARK
from dvm.operators.base import Node


@dataclass(eq=False)
class Filter(Node):
    child: Node
    predicate: exp.Expression

    def __post_init__(self) -> None:
        self.children = [self.child]
        self.cols = list(self.child.cols)

    def _where(self) -> str:
        return self.predicate.sql(SPARK)

    def snapshot(self, ctx: Context, state: State) -> str:
        return f"SELECT * FROM ({self.child.snapshot(ctx, state)}) WHERE {self._where()}"

    def delta(self, ctx: Context) -> str | None:
        d = self.child.delta(ctx)
        return None if d is None else f"SELECT * FROM ({d}) WHERE {self._where()}"

    def label(self) -> str:
        return f"Filter {self._where()}"
