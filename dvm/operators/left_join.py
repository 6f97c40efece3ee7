"""LEFT OUTER join.

Delta rule. The output rows a left row ``l`` produces depend only on ``l`` and on the right rows that
match it. Call ``l`` *affected* when its tuple occurs in ΔL or some row of ΔR matches it (P(l)). Rows that
are not affected produce identical output before and after, so

    Δ(L ⟕ R) = (σ_P L_post ⟕ R_post) − (σ_P L_pre ⟕ R_pre)

which covers matches gained or lost, NULL-padded rows appearing and disappearing, and join-key changes.
σ_P over a bag is written without OR-ed subqueries as (L ⋉ D) ⊎ ((L ▷ D) ⋉ ΔR), D = distinct ΔL tuples
matched NULL-safely. When only the left side changed the rule reduces to the linear ΔL ⟕ R.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.context import Context, State, quote
from dvm.operators.base import W, col_list, null_safe_match, union_all
from dvm.operators.join import BinaryJoin, join_sql


@dataclass(eq=False)
class LeftJoin(BinaryJoin):
    kind = "LEFT OUTER"

    def _affected(self, ctx: Context, state: State, dl: str | None, dr: str) -> str:
        """σ_P L_state: left rows whose tuple is in ΔL or that match a row of ΔR, as a bag."""
        lstate = self.left.snapshot(ctx, state)
        on = self.on_sql()

        def by_right(src: str) -> str:
            return f"SELECT {col_list(self.left.cols, '__a.')} FROM ({src}) __a LEFT SEMI JOIN ({dr}) __e ON {on}"

        if dl is None:
            return by_right(lstate)
        renamed = ", ".join(f"{quote(c)} AS {quote('__d_' + c)}" for c in self.left.cols)
        tuples = f"SELECT DISTINCT {renamed} FROM ({dl})"
        match = null_safe_match("__a", "__d", [(c, "__d_" + c) for c in self.left.cols])
        in_delta = f"SELECT __a.* FROM ({lstate}) __a LEFT SEMI JOIN ({tuples}) __d ON {match}"
        not_in_delta = f"SELECT __a.* FROM ({lstate}) __a LEFT ANTI JOIN ({tuples}) __d ON {match}"
        out = union_all([in_delta, by_right(not_in_delta)])
        assert out is not None
        return out

    def delta(self, ctx: Context) -> str | None:
        dl = self.left.delta(ctx)
        dr = self.right.delta(ctx)
        if dr is None:
            if dl is None:
                return None
            return join_sql(dl, self.right.snapshot(ctx, "post"), "LEFT OUTER", self.condition,
                            f"{col_list(self.cols)}, __l.{W}")
        parts = []
        for state, sign in (("post", 1), ("pre", -1)):
            affected = self._affected(ctx, state, dl, dr)  # type: ignore[arg-type]
            parts.append(join_sql(affected, self.right.snapshot(ctx, state), "LEFT OUTER",  # type: ignore[arg-type]
                                  self.condition, f"{col_list(self.cols)}, CAST({sign} AS BIGINT) AS {W}"))
        return union_all(parts)

    def strategy(self) -> str:
        return "incremental (affected left rows re-joined when the right side changes)"

    def label(self) -> str:
        return f"LeftJoin ON {self.on_sql()}"
