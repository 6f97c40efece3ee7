"""Semi-join L ⋉ R: the rows of L that have at least one partner in R (EXISTS, IN (subquery), = ANY,
``LEFT SEMI JOIN``). Each qualifying row of L is kept once, however many partners it has.

Delta rule. Whether a row ``l`` qualifies depends only on ``l`` and on the rows of R that match it. Call
``l`` *affected* when its tuple occurs in ΔL or some row of ΔR matches it (P(l)); every other row keeps its
status, so the change is a scoped recompute, never a full one:

    Δ(L ⋉ R) = (σ_P L_post ⋉ R_post) − (σ_P L_pre ⋉ R_pre)

which covers a row gaining its first partner or losing its last one, rows of L inserted or deleted, and a
join-key update of L in the same window as a delete of its old partner (the pre side reads R_pre). When R
did not change the rule reduces to the linear ΔL ⋉ R_post; when L did not change σ_P L = L ⋉ ΔR. The
affected rows are found once for both states, see :func:`~dvm.operators.join.affected_rows`.

The builder turns a WHERE clause's subquery predicate into this operator when it is the clause's only one
and a conjunct of its own (negated: :mod:`~dvm.operators.anti_join`); several predicates, or one under OR,
share a :mod:`~dvm.operators.mark_join`. The correlated conjuncts of the subquery, plus the IN / ANY
comparison, become the join condition θ; the subquery's other conjuncts stay inside R.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.context import Context, State
from dvm.operators.base import W, col_list
from dvm.operators.join import TAG, BinaryJoin, Inputs, affected_rows, both_states, join_sql, tagged_condition


@dataclass(eq=False)
class SemiJoin(BinaryJoin):
    kind = "LEFT SEMI"

    def __post_init__(self) -> None:
        self.children = [self.left, self.right]
        self.cols = list(self.left.cols)

    def snapshot(self, ctx: Context, state: State) -> str:
        return join_sql(self.left.snapshot(ctx, state), self.right.snapshot(ctx, state), self.kind,
                        self.condition, col_list(self.left.cols, "__l."))

    def delta_of(self, inputs: Inputs, own: str = "left", other: str = "right") -> str | None:
        """The rule over ``inputs`` (unwrapped), ``own`` naming this join's left input there."""
        if inputs.delta(other) is None:  # ΔL ⋉ R_post, R_post read only where ΔL's keys fall when large
            post, dl = inputs.keyed_post(other, own, self.condition)
            return None if dl is None else join_sql(dl, post, self.kind, self.condition,  # type: ignore[arg-type]
                                                    f"{col_list(self.left.cols, '__l.')}, __l.{W}")
        rows = affected_rows(inputs, own, [(other, self.condition)])
        return (f"SELECT {col_list(self.left.cols, '__l.')}, __l.{TAG} AS {W} FROM ({rows}) __l {self.kind} JOIN "
                f"({both_states(inputs, other, self.condition)}) __r ON {tagged_condition(self.condition)}")

    def delta(self, ctx: Context) -> str | None:
        inputs = self.inputs(ctx)
        return inputs.wrap(self.delta_of(inputs))

    def strategy(self) -> str:
        return "incremental (left rows touched by ΔL or matching ΔR re-checked on both snapshots)"

    def label(self) -> str:
        return f"SemiJoin ON {self.on_sql()}"
