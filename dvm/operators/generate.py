"""Generate: a table-generating function applied to every row — ``LATERAL VIEW [OUTER] explode / posexplode /
inline / stack / json_tuple (...)`` and a generator in the SELECT list (``SELECT explode(arr) AS x``).

Delta rule: a generator maps each input row to 0..n output rows that depend on that row alone (its
arguments are expressions over the row), so it distributes over bag union and

    Δ Generate(R) = Generate(ΔR)     with each output row carrying the weight of its input row.

A row deleted (weight -1) takes back exactly the rows it generated, because generating them again from
the same values gives the same rows. ``OUTER`` (and the ``*_outer`` functions) pads a row whose generator
yields nothing (NULL or empty array) with NULLs, which is still a function of that row alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State
from dvm.dialect import SPARK
from dvm.operators.base import Node, W, col_list


@dataclass(eq=False)
class Generate(Node):
    child: Node
    #: the generator call over the child's internal column names, e.g. ``explode(`__t3`)``
    generator: exp.Expression
    outer: bool
    #: internal names of the generated columns (the generator's arity)
    out: list[str]

    def __post_init__(self) -> None:
        self.children = [self.child]
        self.cols = list(self.child.cols) + list(self.out)

    def _lateral_view(self) -> str:
        outer = "OUTER " if self.outer else ""
        return f"LATERAL VIEW {outer}{self.generator.sql(SPARK)} __g AS {col_list(self.out)}"

    def snapshot(self, ctx: Context, state: State) -> str:
        return f"SELECT {col_list(self.cols)} FROM ({self.child.snapshot(ctx, state)}) {self._lateral_view()}"

    def delta(self, ctx: Context) -> str | None:
        d = self.child.delta(ctx)
        if d is None:
            return None
        return f"SELECT {col_list(self.cols)}, {W} FROM ({d}) {self._lateral_view()}"

    def strategy(self) -> str:
        return "incremental (the generator applied to the input delta, weights carried)"

    def label(self) -> str:
        outer = " OUTER" if self.outer else ""
        return f"Generate{outer} {self.generator.sql(SPARK)} AS {', '.join(self.out)}"
