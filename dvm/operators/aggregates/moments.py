"""Algebraic statistics: STDDEV / VARIANCE (pop, samp), COVAR_POP / COVAR_SAMP, CORR and REGR_*.

Rule: each group keeps its count ``n``, the mean of each variable and its centred sums of squares
``q = Σ(x - mean)²`` (and for two variables the co-moment ``c = Σ(x - mean_x)(y - mean_y)``), all DOUBLE.
A delta is summarised *around a pivot* ``k`` (the least value of the delta rows of that group, a window over
the delta): ``Σw``, ``Σw(x-k)``, ``Σw(x-k)²``, ``Σw(x-k)(y-k')``. Shifting those sums to the old mean and
merging them with the old state is Chan's parallel-variance update, which also works for negative weights
(deletions):

    δ = k - mean_old;  e1 = s1 + n_d·δ;  e2 = s2 + 2δ·s1 + n_d·δ²;  n = n_old + n_d
    mean = mean_old + e1 / n;           q = q_old + e2 - e1² / n

Everything is computed from deviations, never from raw sums of squares, so data far from zero (epoch
seconds, prices around 10⁶) keeps its precision. Two-variable calls only see rows where both arguments are
non-NULL, like Spark.

Numeric caveat, and how it is contained: subtracting values can cancel. When a group's new ``q`` comes out
below 1e-9 of the magnitudes it was computed from (e.g. deletions leave equal values behind), the merged
state is not trusted and the group is rescanned from the source; so is a group shrunk to a single value,
whose mean must then be exact. Constant groups therefore hold exactly ``q = 0``, which keeps Spark's
zero-variance results exact (``regr_slope`` NULL, ``regr_r2`` 1.0 or NULL, ``var_pop`` 0). Otherwise the
stored moments carry relative rounding of about 1e-15 per refresh, far below the 1e-6 the tests allow.
A full computation (FULL refresh, rescan) derives the state from Spark's own numerically stable
aggregates: ``AVG``, ``VAR_POP * n`` and ``COVAR_POP * n``.

Spark differences: ``corr`` raises DIVIDE_BY_ZERO (ANSI mode) for a group of two or more rows where one
variable is constant; the stream table shows NULL there. ``regr_avgx`` / ``regr_avgy`` of a DECIMAL argument
are computed in DOUBLE and cast back to Spark's DECIMAL result type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dvm.operators.aggregates.base import AggCall, Cols

#: a merged centred sum of squares smaller than this fraction of the terms it came from is not trusted
CANCELLATION = "1e-9"

#: the one-argument and the two-argument aggregates maintained by their moments
SINGLE = {"var_pop", "var_samp", "stddev_pop", "stddev_samp"}
PAIR = {"covar_pop", "covar_samp", "corr", "regr_count", "regr_avgx", "regr_avgy", "regr_slope",
        "regr_intercept", "regr_r2", "regr_sxx", "regr_syy", "regr_sxy"}


@dataclass(eq=False)
class Moments(AggCall):
    """``args``: [x] for the single-variable family; [y, x] for REGR_* (Spark's order: dependent first)
    and [x, y] for COVAR_* / CORR. ``options["owner"]``: the ordinal of the call whose state this one
    reads (see :func:`share_states`)."""

    family: ClassVar[str] = "algebraic"

    def sql(self) -> str:
        return f"{self.func.upper()}({', '.join(self.a(i) for i in range(len(self.args)))})"

    def rule(self) -> str:
        if self.follower:
            return f"algebraic: reads the moments kept for call {self.owner} (same arguments)"
        what = "centred sums of squares and co-moment" if self.pair else "centred sum of squares"
        return (f"algebraic: count, mean(s) and {what} (Chan's update around a delta pivot); groups whose "
                "moments cancel below 1e-9 are rescanned")

    # --- sharing: calls over the same variables (stddev and variance of x; every regr_*(y, x)) keep one
    # --- state, owned by the first of them

    @property
    def owner(self) -> int:
        return int(self.options.get("owner", self.ordinal))

    @property
    def follower(self) -> bool:
        return self.owner != self.ordinal

    def share_key(self) -> tuple[str, ...]:
        return ("pair" if self.pair else "single", *(e for _, e in self.variables()))

    @property
    def p(self) -> str:
        return f"__agg{self.owner}"

    @property
    def d(self) -> str:
        return f"__d{self.owner}"

    @property
    def o(self) -> str:
        return f"__o{self.owner}"

    @property
    def m(self) -> str:
        return f"__m{self.owner}"

    @property
    def pair(self) -> bool:
        return self.func in PAIR

    def variables(self) -> list[tuple[str, str]]:
        """(suffix, DOUBLE expression) per variable, NULL where the row does not count."""
        if not self.pair:
            return [("x", f"CAST({self.a()} AS DOUBLE)")]
        if self.func.startswith("regr_"):
            y, x = self.a(0), self.a(1)
        else:  # symmetric in its arguments: a canonical order lets covar_pop(a, b) share corr(b, a)'s state
            x, y = sorted([self.a(0), self.a(1)])
        both = f"({x}) IS NOT NULL AND ({y}) IS NOT NULL"
        return [("x", f"CASE WHEN {both} THEN CAST({x} AS DOUBLE) END"),
                ("y", f"CASE WHEN {both} THEN CAST({y} AS DOUBLE) END")]

    # --- state ---

    def state_pre(self) -> Cols:
        if self.follower:
            return []
        return [(f"__v{self.owner}_{s}", e) for s, e in self.variables()]

    def state(self) -> Cols:
        if self.follower:
            return []
        p, v = self.p, f"__v{self.owner}"
        vs = [s for s, _ in self.variables()]
        out = [(f"{p}_n", f"COUNT({v}_x)")]
        for s in vs:
            c = f"{v}_{s}"
            # a constant group gets its exact value as mean (AVG may be off in the last bit)
            out.append((f"{p}_m{s}", f"CASE WHEN MIN({c}) = MAX({c}) THEN MIN({c}) ELSE AVG({c}) END"))
            out.append((f"{p}_q{s}", f"COALESCE(VAR_POP({c}) * COUNT({c}), 0D)"))
        if self.pair:
            out.append((f"{p}_c", f"COALESCE(COVAR_POP({v}_x, {v}_y) * COUNT({v}_x), 0D)"))
        return out

    def output(self) -> str:
        p, f = self.p, self.func
        n = f"{p}_n"
        if f in ("var_pop", "stddev_pop"):
            v = f"CASE WHEN {n} > 0 THEN {p}_qx / {n} END"
        elif f in ("var_samp", "stddev_samp"):
            v = f"CASE WHEN {n} > 1 THEN {p}_qx / ({n} - 1) END"
        else:
            v = ""
        if f.startswith("stddev"):
            return f"SQRT({v})"
        if v:
            return v
        qx, qy, c, mx, my = f"{p}_qx", f"{p}_qy", f"{p}_c", f"{p}_mx", f"{p}_my"
        return {
            "covar_pop": f"CASE WHEN {n} > 0 THEN {c} / {n} END",
            "covar_samp": f"CASE WHEN {n} > 1 THEN {c} / ({n} - 1) END",
            "corr": f"CASE WHEN {n} > 1 AND {qx} > 0 AND {qy} > 0 THEN {c} / SQRT({qx} * {qy}) END",
            "regr_count": n,
            "regr_avgx": f"CASE WHEN {n} > 0 THEN {mx} END",
            "regr_avgy": f"CASE WHEN {n} > 0 THEN {my} END",
            "regr_sxx": f"CASE WHEN {n} > 0 THEN {qx} END",
            "regr_syy": f"CASE WHEN {n} > 0 THEN {qy} END",
            "regr_sxy": f"CASE WHEN {n} > 0 THEN {c} END",
            "regr_slope": f"CASE WHEN {n} > 0 AND {qx} > 0 THEN {c} / {qx} END",
            "regr_intercept": f"CASE WHEN {n} > 0 AND {qx} > 0 THEN {my} - ({c} / {qx}) * {mx} END",
            # Spark: NULL when the dependent variable is constant, 1.0 when only the independent one is
            "regr_r2": f"CASE WHEN {n} > 0 AND {qy} > 0 THEN CASE WHEN {qx} = 0 THEN 1D "
                       f"ELSE ({c} * {c}) / ({qx} * {qy}) END END",
        }[f]

    # --- delta ---

    def delta_pre(self, partition: str) -> list[Cols]:
        """The pivot of each variable (``__v<i>_x``, from ``state_pre``): the least value in the group's
        delta."""
        if self.follower:
            return []
        v, k = f"__v{self.owner}", f"__k{self.owner}"
        return [[(f"{k}_{s}", f"MIN({v}_{s}) OVER ({partition})") for s, _ in self.variables()]]

    def delta_terms(self) -> Cols:
        if self.follower:
            return []
        d, v, k = self.d, f"__v{self.owner}", f"__k{self.owner}"
        zero = "0D"
        vs = [s for s, _ in self.variables()]
        out = [(f"{d}_n", f"SUM(CASE WHEN {v}_x IS NULL THEN 0 ELSE __w END)")]
        for s in vs:
            dev = f"({v}_{s} - {k}_{s})"
            out.append((f"{d}_k{s}", f"MIN({k}_{s})"))
            out.append((f"{d}_s{s}", f"COALESCE(SUM(__w * {dev}), {zero})"))
            out.append((f"{d}_s{s}{s}", f"COALESCE(SUM(__w * {dev} * {dev}), {zero})"))
        if self.pair:
            out.append((f"{d}_sxy", f"COALESCE(SUM(__w * ({v}_x - {k}_x) * ({v}_y - {k}_y)), {zero})"))
        return out

    def merge_steps(self) -> list[Cols]:
        """Layers: shifts δ and counts; the delta's sums around the old mean; the new moments (raw)."""
        if self.follower:
            return []
        d, o, m = self.d, self.o, self.m
        zero = "0D"
        vs = [s for s, _ in self.variables()]
        # δ: the delta's pivot minus the old mean (0 for a new group, whose mean starts at the pivot)
        shifts: Cols = [(f"{m}_na", f"COALESCE({o}_n, 0)"), (f"{m}_t", f"COALESCE({o}_n, 0) + COALESCE({d}_n, 0)")]
        shifts += [(f"{m}_dl{s}", f"COALESCE({d}_k{s} - COALESCE({o}_m{s}, {d}_k{s}), {zero})") for s in vs]
        sums: Cols = []
        for s in vs:
            dl = f"{m}_dl{s}"
            sums.append((f"{m}_e{s}", f"{d}_s{s} + {d}_n * {dl}"))
            sums.append((f"{m}_e{s}{s}", f"{d}_s{s}{s} + 2 * {dl} * {d}_s{s} + {d}_n * {dl} * {dl}"))
        if self.pair:
            sums.append((f"{m}_exy", f"{d}_sxy + {m}_dlx * {d}_sy + {m}_dly * {d}_sx + {d}_n * {m}_dlx * {m}_dly"))
        raw: Cols = []
        t = f"{m}_t"
        for s in vs:
            corr = f"CASE WHEN {t} > 0 THEN {m}_e{s} * {m}_e{s} / {t} ELSE {zero} END"
            raw.append((f"{m}_c{s}", corr))
        if self.pair:
            raw.append((f"{m}_cxy", f"CASE WHEN {t} > 0 THEN {m}_ex * {m}_ey / {t} ELSE {zero} END"))
        final: Cols = []
        for s in vs:
            old = f"COALESCE({o}_q{s}, {zero})"
            final.append((f"{m}_r{s}", f"{old} + {m}_e{s}{s} - {m}_c{s}"))
            final.append((f"{m}_scale{s}", f"GREATEST({old}, ABS({m}_e{s}{s}), {m}_c{s})"))
        if self.pair:
            final.append((f"{m}_rc", f"COALESCE({o}_c, {zero}) + {m}_exy - {m}_cxy"))
        return [shifts, sums, raw, final]

    def merged_state(self) -> Cols:
        if self.follower:
            return []
        p, d, o, m = self.p, self.d, self.o, self.m
        t = f"{m}_t"
        out = [(f"{p}_n", t)]
        for s, _ in self.variables():
            out.append((f"{p}_m{s}", f"CASE WHEN {t} > 0 THEN COALESCE({o}_m{s}, {d}_k{s}) + {m}_e{s} / {t} END"))
            out.append((f"{p}_q{s}", f"CASE WHEN {t} > 1 THEN GREATEST({m}_r{s}, 0D) "
                                     "ELSE 0D END"))
        if self.pair:
            out.append((f"{p}_c", f"CASE WHEN {t} > 1 THEN {m}_rc ELSE 0D END"))
        return out

    def needs_rescan(self) -> str | None:
        if self.follower:
            return None
        d, m = self.d, self.m
        t = f"{m}_t"
        vs = [s for s, _ in self.variables()]
        cancelled = " OR ".join(f"({m}_scale{s} > 0 AND {m}_r{s} <= {CANCELLATION} * {m}_scale{s})" for s in vs)
        # one value left of several (or replaced): its mean must be exact for a later constant group
        single = f"({t} = 1 AND {m}_na > 0 AND {d}_kx IS NOT NULL)"
        return f"(({t} > 1 AND ({cancelled})) OR {single})"


def share_states(calls: list[AggCall]) -> None:
    """Let calls over the same variables read one state: the first such call owns it."""
    owners: dict[tuple[str, ...], int] = {}
    for c in calls:
        if isinstance(c, Moments):
            c.options["owner"] = owners.setdefault(c.share_key(), c.ordinal)
