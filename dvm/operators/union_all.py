"""UNION ALL.

Delta rule: Δ(A ⊎ B) = ΔA ⊎ ΔB. Branches that did not change contribute nothing. Columns are matched by
position, as in SQL, and renamed to the union's own internal names.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.context import Context, State, quote
from dvm.operators.base import Node, W, union_all


@dataclass(eq=False)
class UnionAll(Node):
    branches: list[Node]
    names: list[str]

    def __post_init__(self) -> None:
        self.children = list(self.branches)
        self.cols = list(self.names)

    def _rename(self, branch: Node, sql: str, weighted: bool) -> str:
        select = ", ".join(f"{quote(s)} AS {quote(t)}" for s, t in zip(branch.cols, self.cols, strict=True))
        return f"SELECT {select}{', ' + W if weighted else ''} FROM ({sql})"

    def snapshot(self, ctx: Context, state: State) -> str:
        out = union_all([self._rename(b, b.snapshot(ctx, state), False) for b in self.branches])
        assert out is not None
        return out

    def delta(self, ctx: Context) -> str | None:
        parts = []
        for b in self.branches:
            d = b.delta(ctx)
            if d is not None:
                parts.append(self._rename(b, d, True))
        return union_all(parts)

    def label(self) -> str:
        return f"UnionAll ({len(self.branches)} branches)"
