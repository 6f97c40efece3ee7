"""LEFT OUTER join.

Delta rule. The output rows a left row ``l`` produces depend only on ``l`` and on the right rows that
match it. Call ``l`` *affected* when its tuple occurs in ΔL or some row of ΔR matches it (P(l)). Rows that
are not affected produce identical output before and after, so

    Δ(L ⟕ R) = (σ_P L_post ⟕ R_post) − (σ_P L_pre ⟕ R_pre)

which covers matches gained or lost, NULL-padded rows appearing and disappearing, and join-key changes.
σ_P L is L ⋉ K over the affected tuples K = D ∪ π(L_post ⋉ ΔR), D = the distinct tuples of ΔL, and both
terms are computed in one pass: the affected rows of both states, tagged +1 / -1, joined with R's rows of
the same state (see :func:`~dvm.operators.join.affected_rows`). When only the left side changed the rule
reduces to the linear ΔL ⟕ R_post.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context
from dvm.operators.base import W, col_list
from dvm.operators.join import TAG, BinaryJoin, Inputs, affected_rows, both_states, join_sql, tagged_condition


def left_outer_delta(inputs: Inputs, cols: list[str], condition: exp.Expression | None) -> str | None:
    """The rule above over ``inputs`` (unwrapped): ΔL ⟕ R_post when R did not change, else the affected left
    rows of both states joined with R's rows of the same state, weighted by their state's sign."""
    if inputs.delta("right") is None:  # R_post read only where ΔL's keys fall when large
        post, dl = inputs.keyed_post("right", "left", condition)
        return None if dl is None else join_sql(dl, post, "LEFT OUTER", condition,  # type: ignore[arg-type]
                                                f"{col_list(cols)}, __l.{W}")
    rows = affected_rows(inputs, "left", [("right", condition)])
    return (f"SELECT {col_list(cols)}, __l.{TAG} AS {W} FROM ({rows}) __l LEFT OUTER JOIN "
            f"({both_states(inputs, 'right', condition)}) __r ON {tagged_condition(condition)}")


@dataclass(eq=False)
class LeftJoin(BinaryJoin):
    kind = "LEFT OUTER"

    def delta(self, ctx: Context) -> str | None:
        inputs = self.inputs(ctx)
        return inputs.wrap(left_outer_delta(inputs, self.cols, self.condition))

    def strategy(self) -> str:
        return "incremental (affected left rows re-joined when the right side changes)"

    def label(self) -> str:
        return f"LeftJoin ON {self.on_sql()}"
