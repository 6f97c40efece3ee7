"""Anti-join L ▷ R: the rows of L without any partner in R (NOT EXISTS, NOT IN (subquery), ALL (subquery),
``LEFT ANTI JOIN``), and the NULL-padding half of a FULL OUTER join.

Delta rule: the semi-join's, with the status inverted. A row ``l`` is *affected* when its tuple occurs in ΔL
or a row of ΔR matches it (P(l)); only affected rows can change status, so

    Δ(L ▷ R) = (σ_P L_post ▷ R_post) − (σ_P L_pre ▷ R_pre)

and with R unchanged Δ(L ▷ R) = ΔL ▷ R_post.

NULL semantics are carried by the condition θ the builder makes, since a row of R "matches" when the
subquery predicate is not FALSE for it:

* ``x NOT IN (SELECT y ...)``: θ = corr ∧ (x = y ∨ (x = y) IS NULL). A NULL among the y empties the result,
  a NULL x qualifies only when the subquery is empty, as in SQL. (Spark plans this shape as its null-aware
  anti-join.)
* ``x op ALL (SELECT y ...)``: θ = corr ∧ (¬(x op y) ∨ (x op y) IS NULL): a row qualifies when every
  comparison is TRUE.
* ``NOT EXISTS``: θ = corr, the subquery's correlated conjuncts.

Because θ decides which rows of ΔR touch ``l``, a NULL inserted into or deleted from a NOT IN subquery marks
every row of L affected, which is exactly the set whose status can flip.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.operators.semi_join import SemiJoin


@dataclass(eq=False)
class AntiJoin(SemiJoin):
    kind = "LEFT ANTI"

    def strategy(self) -> str:
        return "incremental (left rows touched by ΔL or matching ΔR re-checked on both snapshots)"

    def label(self) -> str:
        return f"AntiJoin ON {self.on_sql()}"
