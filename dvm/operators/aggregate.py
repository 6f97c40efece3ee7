"""Aggregate: GROUP BY with COUNT(*) / COUNT(x) / SUM / AVG / MIN / MAX, global aggregates, DISTINCT.

Delta rules.

* Nested inside a larger query (no stored state to lean on) — *group rescan*: the groups touched by the
  child's delta are recomputed from both snapshots and subtracted,
  Δγ = γ(σ_G child_post) − γ(σ_G child_pre),  G = group keys occurring in Δchild.
  A global aggregate (no GROUP BY) always has exactly one group.
* At the top of a stream table the group's state is stored in hidden columns of the stream table, so the
  rules are *algebraic*: COUNT and SUM add the weighted delta (``SUM(__w * x)``), AVG keeps a sum and a
  non-NULL count, a group disappears when its ``__cnt`` reaches 0. MIN / MAX take the least / greatest of
  the old extremum and the inserted values, and rescan a group only when a deleted value equals its stored
  extremum (see :mod:`dvm.plan`). HAVING switches the top to group rescan, since groups it hides have no
  stored state.

DISTINCT is an aggregate with no aggregate calls: its ``__cnt`` is the tuple's multiplicity.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.operators.base import Node, null_safe_match, union_all

ALGEBRAIC = {"count_star", "count", "sum", "avg"}
EXTREMUM = {"min", "max"}
SUPPORTED = ALGEBRAIC | EXTREMUM


@dataclass(eq=False)
class AggCall:
    """One aggregate call: ``func`` is one of count_star, count, sum, avg, min, max."""

    name: str  # internal output column
    func: str
    arg: exp.Expression | None
    ordinal: int  # position among the aggregate's calls; names the hidden state columns

    def arg_sql(self) -> str:
        assert self.arg is not None
        return self.arg.sql(dialect="spark")

    def sql(self) -> str:
        """The call itself, as evaluated on a snapshot."""
        if self.func == "count_star":
            return "COUNT(*)"
        return f"{self.func.upper()}({self.arg_sql()})"

    # --- stored state (hidden columns of a stream table whose top operator is this aggregate) ---

    def state(self) -> list[tuple[str, str]]:
        """Hidden state columns and how a full computation fills them."""
        p = f"__agg{self.ordinal}"
        if self.func == "count_star":
            return []
        if self.func == "count":
            return [(f"{p}_nn", f"COUNT({self.arg_sql()})")]
        if self.func in ("sum", "avg"):
            return [(f"{p}_sum", f"SUM({self.arg_sql()})"), (f"{p}_nn", f"COUNT({self.arg_sql()})")]
        return [(f"{p}_ext", f"{self.func.upper()}({self.arg_sql()})")]

    def output(self) -> str:
        """The aggregate's value computed from its state columns (and the group's ``__cnt``)."""
        p = f"__agg{self.ordinal}"
        if self.func == "count_star":
            return "__cnt"
        if self.func == "count":
            return f"{p}_nn"
        if self.func == "sum":
            return f"CASE WHEN {p}_nn > 0 THEN {p}_sum END"
        if self.func == "avg":
            return f"CASE WHEN {p}_nn > 0 THEN CAST({p}_sum AS DOUBLE) / {p}_nn END"
        return f"{p}_ext"

    def delta_terms(self) -> list[tuple[str, str]]:
        """Per-group summaries of the weighted child delta this call's state needs."""
        p = f"__d{self.ordinal}"
        if self.func == "count_star":
            return []
        a = self.arg_sql()
        if self.func == "count":
            return [(f"{p}_nn", f"SUM(CASE WHEN ({a}) IS NULL THEN 0 ELSE __w END)")]
        if self.func in ("sum", "avg"):
            return [(f"{p}_sum", f"SUM(__w * ({a}))"),
                    (f"{p}_nn", f"SUM(CASE WHEN ({a}) IS NULL THEN 0 ELSE __w END)")]
        f = self.func.upper()
        return [(f"{p}_ins", f"{f}(CASE WHEN __w > 0 THEN {a} END)"),
                (f"{p}_del", f"{f}(CASE WHEN __w < 0 THEN {a} END)")]

    def merged_state(self) -> list[tuple[str, str]]:
        """New state from old state (``__o`` prefix, NULL for a new group) and the delta summaries."""
        p, d, o = f"__agg{self.ordinal}", f"__d{self.ordinal}", f"__o{self.ordinal}"
        if self.func == "count_star":
            return []
        if self.func == "count":
            return [(f"{p}_nn", f"COALESCE({o}_nn, 0) + COALESCE({d}_nn, 0)")]
        if self.func in ("sum", "avg"):
            return [
                (f"{p}_sum", f"CASE WHEN {o}_sum IS NULL THEN {d}_sum WHEN {d}_sum IS NULL THEN {o}_sum "
                             f"ELSE {o}_sum + {d}_sum END"),
                (f"{p}_nn", f"COALESCE({o}_nn, 0) + COALESCE({d}_nn, 0)"),
            ]
        pick = "LEAST" if self.func == "min" else "GREATEST"
        return [(f"{p}_ext", f"CASE WHEN {o}_ext IS NULL THEN {d}_ins WHEN {d}_ins IS NULL THEN {o}_ext "
                             f"ELSE {pick}({o}_ext, {d}_ins) END")]

    def needs_rescan(self) -> str | None:
        """Condition under which the merged state is wrong: a deleted value was the stored extremum."""
        if self.func not in EXTREMUM:
            return None
        d, o = f"__d{self.ordinal}", f"__o{self.ordinal}"
        cmp = "<=" if self.func == "min" else ">="
        return f"({d}_del IS NOT NULL AND {o}_ext IS NOT NULL AND {d}_del {cmp} {o}_ext)"

    def old_state(self) -> list[str]:
        return [c for c, _ in self.state()]


@dataclass(eq=False)
class Aggregate(Node):
    child: Node
    groups: list[tuple[str, exp.Expression]]  # (internal name, expression over child columns)
    aggs: list[AggCall]

    def __post_init__(self) -> None:
        self.children = [self.child]
        self.cols = [n for n, _ in self.groups] + [a.name for a in self.aggs]

    @property
    def is_global(self) -> bool:
        return not self.groups

    def group_select(self) -> str:
        return ", ".join(f"{e.sql(dialect='spark')} AS {quote(n)}" for n, e in self.groups)

    def group_by(self) -> str:
        if not self.groups:
            return ""
        return " GROUP BY " + ", ".join(e.sql(dialect="spark") for _, e in self.groups)

    def affected_keys(self, ctx: Context) -> str | None:
        """Distinct group keys occurring in the child's delta (named like the group columns)."""
        d = self.child.delta(ctx)
        if d is None:
            return None
        if self.is_global:
            return f"SELECT 1 AS __any FROM ({d}) LIMIT 1"
        return f"SELECT DISTINCT {self.group_select()} FROM ({d})"

    def restricted(self, ctx: Context, state: State, keys: str, select: str) -> str:
        """``select`` grouped over the child at ``state``, only for groups in ``keys``."""
        child = self.child.snapshot(ctx, state)
        if self.is_global:
            return f"SELECT {select} FROM ({child})"
        on = " AND ".join(f"({e.sql(dialect='spark')}) <=> __k.{quote(n)}" for n, e in self.groups)
        return f"SELECT {select} FROM ({child}) __c LEFT SEMI JOIN ({keys}) __k ON {on}{self.group_by()}"

    def _select(self) -> str:
        items = [self.group_select()] if self.groups else []
        items += [f"{a.sql()} AS {quote(a.name)}" for a in self.aggs]
        return ", ".join(items) if items else "COUNT(*) AS __cnt_unused"

    def snapshot(self, ctx: Context, state: State) -> str:
        if not self.aggs and self.groups:  # DISTINCT
            return f"SELECT {self.group_select()} FROM ({self.child.snapshot(ctx, state)}){self.group_by()}"
        return f"SELECT {self._select()} FROM ({self.child.snapshot(ctx, state)}){self.group_by()}"

    def delta(self, ctx: Context) -> str | None:
        keys = self.affected_keys(ctx)
        if keys is None:
            return None
        select = self._select() if self.aggs or not self.groups else self.group_select()
        parts = []
        for state, sign in (("post", 1), ("pre", -1)):
            part = self.restricted(ctx, state, keys, select)
            if self.is_global:
                # only when something changed; the single group always exists on both sides
                part = f"SELECT * FROM ({part}) WHERE EXISTS ({keys})"
            parts.append(f"SELECT *, CAST({sign} AS BIGINT) AS __w FROM ({part})")
        return union_all(parts)

    def strategy(self) -> str:
        return "group rescan of affected groups (nested aggregate)"

    def label(self) -> str:
        g = ", ".join(e.sql(dialect="spark") for _, e in self.groups) or "()"
        if not self.aggs:
            return f"Distinct [{g}]" if self.groups else "Aggregate ()"
        return f"Aggregate GROUP BY {g}: " + ", ".join(a.sql() for a in self.aggs)


def key_match(left: str, right: str, names: list[str]) -> str:
    return null_safe_match(left, right, [(n, n) for n in names])
