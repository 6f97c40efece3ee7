"""INTERSECT [ALL] and EXCEPT [ALL] (Spark's MINUS is EXCEPT); UNION is :mod:`~dvm.operators.union_all`
under a DISTINCT aggregate.

Delta rule. A set operation decides each distinct tuple t on its own, from t's multiplicities l in L and r in R:

    INTERSECT ALL  min(l, r)          EXCEPT ALL  max(l − r, 0)
    INTERSECT      [l > 0 ∧ r > 0]    EXCEPT      [l > 0 ∧ r = 0]

so only the tuples T occurring in ΔL or ΔR can change, and for them

    Δ(L op R)(t) = f(l_post, r_post) − f(l_post − ΔL(t), r_post − ΔR(t)),   t ∈ T

with ΔL(t), ΔR(t) the net weights of t in the children's deltas. The pre counts are derived from the post
counts and the deltas (l_pre = l_post − ΔL(t)), so the rule never reads a pre snapshot (a time-travel
read costs a Delta state reconstruction, see :mod:`~dvm.operators.join`), and the post counts are taken
over the touched tuples only: L_post ⋉ T and R_post ⋉ T. Everything is one aggregate over four tagged
inputs (ΔL, ΔR, L_post ⋉ T, R_post ⋉ T) grouped on the tuple; its result is one row per changed tuple
with the signed difference as its weight (a Z-set row stands for |w| copies, so no expansion is needed).

Why counts and not stored state: the operator may sit anywhere in the tree (under a join, an aggregate,
another set operation), where nothing of its own is stored; at the top of a stream table its output goes
into the plain-rows (bag) layout like any other non-aggregate query.
Counting the touched tuples of the post snapshots is a semi-join against the (small) set T.

Tuples are compared NULL-safely, as SQL's set operations do (NULL equals NULL): GROUP BY groups NULLs
together, and the semi-join against T matches with ``<=>``. Columns are matched by position and renamed
to the operator's own internal names, as in UNION ALL.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.context import Context, State, quote
from dvm.operators.base import Node, W, col_list, null_safe_match, union_all
from dvm.operators.join import Inputs

#: new multiplicity of a tuple from its counts ``l`` in the left and ``r`` in the right input
RULES = {
    ("intersect", True): "least({l}, {r})",
    ("except", True): "greatest({l} - {r}, 0)",
    ("intersect", False): "CASE WHEN {l} > 0 AND {r} > 0 THEN 1 ELSE 0 END",
    ("except", False): "CASE WHEN {l} > 0 AND {r} = 0 THEN 1 ELSE 0 END",
}
#: per tagged row: its count in L_post, in R_post, its weight in ΔL, in ΔR (summed per tuple)
COUNTS = ("__cl", "__cr", "__dl", "__dr")


@dataclass(eq=False)
class SetOp(Node):
    left: Node
    right: Node
    op: str  # "intersect" | "except"
    all: bool  # INTERSECT ALL / EXCEPT ALL (bag semantics) rather than the distinct form
    names: list[str]

    def __post_init__(self) -> None:
        assert (self.op, self.all) in RULES, self.op
        self.children = [self.left, self.right]
        self.cols = list(self.names)

    @property
    def keyword(self) -> str:
        return f"{self.op.upper()}{' ALL' if self.all else ''}"

    def _rename(self, side: Node, sql: str, extra: str = "") -> str:
        select = ", ".join(f"{quote(s)} AS {quote(t)}" for s, t in zip(side.cols, self.cols, strict=True))
        return f"SELECT {select}{extra} FROM ({sql})"

    def snapshot(self, ctx: Context, state: State) -> str:
        left = self._rename(self.left, self.left.snapshot(ctx, state))
        right = self._rename(self.right, self.right.snapshot(ctx, state))
        return f"SELECT * FROM ({left} {self.keyword} {right})"

    def multiplicity(self, l_count: str, r_count: str) -> str:
        return RULES[(self.op, self.all)].format(l=l_count, r=r_count)

    def delta(self, ctx: Context) -> str | None:
        inputs = Inputs(ctx, left=self.left, right=self.right)
        dl, dr = inputs.delta("left"), inputs.delta("right")
        if dl is None and dr is None:
            return None
        cols = col_list(self.cols)

        def tagged(side: str, rows: str, counts: tuple[str, str, str, str]) -> str:
            """Rows of one input renamed to this operator's columns, with the four count columns."""
            tags = ", ".join(f"{v} AS {c}" for v, c in zip(counts, COUNTS, strict=True))
            return self._rename(self.side(side), rows, f", {tags}")

        changes = [inputs.share(tagged(side, d, counts)) for side, d, counts in
                   (("left", dl, ("0", "0", W, "0")), ("right", dr, ("0", "0", "0", W))) if d is not None]
        touched = inputs.share(f"SELECT DISTINCT {cols} FROM ({union_all(changes)})")
        counted = []
        for side, counts in (("left", ("1", "0", "0", "0")), ("right", ("0", "1", "0", "0"))):
            match = null_safe_match("__a", "__t", list(zip(self.side(side).cols, self.cols, strict=True)))
            rows = (f"SELECT __a.* FROM ({inputs.snapshot(side, 'post')}) __a "
                    f"LEFT SEMI JOIN ({touched}) __t ON {match}")
            counted.append(tagged(side, rows, counts))
        sums = ", ".join(f"SUM({c}) AS {c}" for c in COUNTS)
        per_tuple = f"SELECT {cols}, {sums} FROM ({union_all(changes + counted)}) GROUP BY {cols}"
        new = self.multiplicity("__cl", "__cr")
        old = self.multiplicity("(__cl - __dl)", "(__cr - __dr)")
        body = (f"SELECT {cols}, {W} FROM (SELECT {cols}, CAST(({new}) - ({old}) AS BIGINT) AS {W} "
                f"FROM ({per_tuple})) WHERE {W} <> 0")
        return inputs.wrap(body)

    def side(self, name: str) -> Node:
        return self.left if name == "left" else self.right

    def strategy(self) -> str:
        return ("incremental (per touched tuple: multiplicities counted on the post snapshots, pre counts "
                "derived from the deltas)")

    def label(self) -> str:
        return f"SetOp {self.keyword}"
