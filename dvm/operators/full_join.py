"""FULL OUTER join (equi or not; ``FULL JOIN ... USING`` / NATURAL FULL JOIN after the builder's rewrite).

A full join is the inner join plus both NULL-padded anti-joins, and the inner join plus the left one is the
LEFT join:

    L ⟗ R = (L ⋈ R) ⊎ pad_R(L ▷ R) ⊎ pad_L(R ▷ L) = (L ⟕ R) ⊎ pad_L(R ▷ L)

Each term is differentiated with its own rule, and padding is linear, so

    Δ(L ⟗ R) = Δ(L ⟕ R) + pad_L(Δ(R ▷ L))

* Δ(L ⟕ R) (:mod:`~dvm.operators.left_join`) = (σ_P L_post ⟕ R_post) − (σ_P L_pre ⟕ R_pre), P(l) = l's tuple
  in ΔL or l matches a row of ΔR; ΔL ⟕ R_post when R did not change. It carries the inner-join delta and
  the left padding: a left row's padded row appears when it loses its last partner, disappears when it gains
  its first one;
* Δ(R ▷ L) (:mod:`~dvm.operators.anti_join`) = (σ_Q R_post ▷ L_post) − (σ_Q R_pre ▷ L_pre), Q(r) = r's tuple
  in ΔR or r matches a row of ΔL: the same transitions for right rows; ΔR ▷ L_post when L did not change.

(The inner-join delta plus both anti-join deltas is the same sum; this split reads each input fewer times.)
Rows gaining or losing partners on either side, join-key updates together with deletes of the old partner,
and NULL keys (which never match, so their rows are always padded) all fall out of these terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.context import Context, quote
from dvm.operators.anti_join import AntiJoin
from dvm.operators.base import W, union_all
from dvm.operators.join import BinaryJoin
from dvm.operators.left_join import left_outer_delta


@dataclass(eq=False)
class FullJoin(BinaryJoin):
    kind = "FULL OUTER"

    def _padded(self, sql: str | None, kept: list[str]) -> str | None:
        """Rows of one input (columns ``kept``) widened to this join's columns, NULL elsewhere."""
        if sql is None:
            return None
        items = ", ".join(quote(c) if c in kept else f"NULL AS {quote(c)}" for c in self.cols)
        return f"SELECT {items}, {W} FROM ({sql})"

    def delta(self, ctx: Context) -> str | None:
        # one WITH clause for both terms: each input's delta and snapshots are rendered once
        inputs = self.inputs(ctx)
        # the LEFT part is None exactly when neither side changed; it comes first, so the union takes its
        # column types and the padding NULLs are typed by it
        left = left_outer_delta(inputs, self.cols, self.condition)
        if left is None:
            return None
        right_only = AntiJoin(self.right, self.left, self.condition).delta_of(inputs, "right", "left")
        return inputs.wrap(union_all([left, self._padded(right_only, self.right.cols)]))

    def strategy(self) -> str:
        return ("incremental (LEFT join delta plus the NULL-padded anti-join delta of the right side; rows "
                "touched by a change re-checked on both snapshots)")

    def label(self) -> str:
        return f"FullJoin ON {self.on_sql()}"
