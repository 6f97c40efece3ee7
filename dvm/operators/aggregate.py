"""Aggregate: GROUP BY (with GROUPING SETS / CUBE / ROLLUP), global aggregates, DISTINCT.

Delta rules.

* Nested inside a larger query (no stored state to lean on) — *group rescan*: the groups touched by the
  child's delta are recomputed from both snapshots and subtracted,
  Δγ = γ(σ_G child_post) − γ(σ_G child_pre),  G = group keys occurring in Δchild,
  netted per output row, so a group whose values did not change drops out (a scalar subquery's global
  aggregate that kept its value changes nothing above it).
  A global aggregate (no GROUP BY) always has exactly one group. Any deterministic aggregate function
  works here, since Spark evaluates it on both snapshots.
* At the top of a stream table the group's state is stored in hidden columns of the stream table, and each
  aggregate call is maintained by the strategy of its family (:mod:`dvm.operators.aggregates`): *algebraic*
  (COUNT, SUM, AVG, BOOL_AND/OR, BIT_XOR, the variance / covariance / regression family: new state = old +
  delta), *semi-algebraic* (MIN, MAX, MIN_BY, MAX_BY, BIT_AND/OR: merge insertions, rescan a group only when a
  deletion may have removed its extremum or a bit) or *group rescan* (COUNT(DISTINCT), collect_list,
  percentile, ...: recompute the groups a delta touches, from the post snapshot only). A group disappears
  when its ``__cnt`` reaches 0. HAVING switches the top to group rescan, since groups it hides have no
  stored state. See :mod:`dvm.plan`.

GROUPING SETS / CUBE / ROLLUP: the aggregate has several *branches*, one per grouping set: a UNION ALL of
GROUP BYs where the keys a set leaves out are NULL, plus a hidden set-ordinal column so that equal keys of
different sets (and repeated sets) stay distinct groups. A grouping set without keys behaves like a grouped
aggregate (no row over an empty input), as in Spark.

DISTINCT is an aggregate with no aggregate calls: its ``__cnt`` is the tuple's multiplicity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.dialect import rendered_once
from dvm.operators.aggregates import AggCall, share_states
from dvm.operators.base import Node, consolidate, null_safe_match, union_all

#: one branch of an aggregate: (grouping-set ordinal or None for a plain GROUP BY, indexes of its groups)
Branch = tuple[int | None, tuple[int, ...]]

__all__ = ["AggCall", "Aggregate", "Branch", "key_match"]


@dataclass(eq=False)
class Aggregate(Node):
    child: Node
    groups: list[tuple[str, exp.Expression]]  # (internal name, expression over child columns)
    aggs: list[AggCall]
    sets: list[tuple[int, ...]] | None = None  # grouping sets (indexes into groups); None: plain GROUP BY
    set_col: str | None = None  # internal name of the grouping-set ordinal column (with sets)

    def __post_init__(self) -> None:
        self.children = [self.child]
        share_states(self.aggs)
        if self.sets is not None and self.set_col is None:
            self.set_col = "__set"
        self.cols = [n for n, _ in self.groups] + [a.name for a in self.aggs] + (
            [self.set_col] if self.sets is not None and self.set_col else [])

    @property
    def is_global(self) -> bool:
        """One group whatever the input, even an empty one (no GROUP BY, no grouping sets)."""
        return not self.groups and self.sets is None

    def key_names(self) -> list[str]:
        """The columns that identify a group: its keys, and the grouping-set ordinal."""
        return [n for n, _ in self.groups] + ([self.set_col] if self.sets is not None and self.set_col else [])

    def branches(self) -> list[Branch]:
        if self.sets is None:
            return [(None, tuple(range(len(self.groups))))]
        return list(enumerate(self.sets))

    def group_sql(self) -> list[str]:
        """Each group expression as Spark SQL, rendered once per plan (see :func:`dvm.dialect.rendered_once`)."""
        return rendered_once(self, "_group_sql", [e for _, e in self.groups])

    def group_select(self, branch: Branch | None = None) -> str:
        """The key columns of one branch: its group expressions, NULL for keys the set leaves out."""
        ordinal, idx = branch if branch is not None else self.branches()[0]
        rendered = self.group_sql()
        items = [f"{rendered[i] if i in idx else 'NULL'} AS {quote(n)}"
                 for i, (n, _) in enumerate(self.groups)]
        if ordinal is not None:
            items.append(f"CAST({ordinal} AS INT) AS {quote(self.set_col or '')}")
        return ", ".join(items)

    def group_by(self, branch: Branch | None = None) -> str:
        ordinal, idx = branch if branch is not None else self.branches()[0]
        if not idx:
            # a grouping set without keys is still a group: no row when it has no input
            return " HAVING COUNT(*) > 0" if ordinal is not None else ""
        rendered = self.group_sql()
        return " GROUP BY " + ", ".join(rendered[i] for i in idx)

    def partition(self, branch: Branch) -> str:
        """Window clause body grouping rows like ``branch`` (for per-group pivots over a delta)."""
        _, idx = branch
        rendered = self.group_sql()
        return "PARTITION BY " + ", ".join(rendered[i] for i in idx) if idx else ""

    def affected_keys(self, ctx: Context) -> str | None:
        """Distinct group keys occurring in the child's delta (named like the key columns)."""
        d = self.child.delta(ctx)
        if d is None:
            return None
        if self.is_global:
            return f"SELECT 1 AS __any FROM ({d}) LIMIT 1"
        return union_all([f"SELECT DISTINCT {self.group_select(b)} FROM ({d})" for b in self.branches()])

    def restricted(self, ctx: Context, state: State, keys: str, select: str | Callable[[Branch], str],
                   pre: Callable[[str], str] | None = None) -> str:
        """``select`` (per branch) grouped over the child at ``state`` (passed through ``pre``), only for
        the groups in ``keys``."""
        child = self.child.snapshot(ctx, state)
        child = pre(child) if pre is not None else child
        if self.is_global:
            sel = select if isinstance(select, str) else select(self.branches()[0])
            return f"SELECT {sel} FROM ({child})"
        parts = []
        for b in self.branches():
            ordinal, idx = b
            sel = select if isinstance(select, str) else select(b)
            rendered = self.group_sql()
            on = " AND ".join(f"({rendered[i]}) <=> __k.{quote(self.groups[i][0])}" for i in idx) or "TRUE"
            k = keys if ordinal is None else f"SELECT * FROM ({keys}) WHERE {quote(self.set_col or '')} = {ordinal}"
            parts.append(f"SELECT {sel} FROM ({child}) __c LEFT SEMI JOIN ({k}) __k ON {on}{self.group_by(b)}")
        out = union_all(parts)
        assert out is not None
        return out

    def _select(self, branch: Branch) -> str:
        items = [self.group_select(branch)] if self.key_names() else []
        items += [f"{a.sql()} AS {quote(a.name)}" for a in self.aggs]
        return ", ".join(items) if items else "COUNT(*) AS __cnt_unused"

    def snapshot(self, ctx: Context, state: State) -> str:
        child = self.child.snapshot(ctx, state)
        if not self.aggs and self.groups and self.sets is None:  # DISTINCT
            return f"SELECT {self.group_select()} FROM ({child}){self.group_by()}"
        out = union_all([f"SELECT {self._select(b)} FROM ({child}){self.group_by(b)}" for b in self.branches()])
        assert out is not None
        return out

    def delta(self, ctx: Context) -> str | None:
        keys = self.affected_keys(ctx)
        if keys is None:
            return None
        distinct = not self.aggs and self.groups and self.sets is None
        parts = []
        for state, sign in (("post", 1), ("pre", -1)):
            part = self.restricted(ctx, state, keys, self.group_select() if distinct else self._select)
            if self.is_global:
                # only when something changed; the single group always exists on both sides
                part = f"SELECT * FROM ({part}) WHERE EXISTS ({keys})"
            parts.append(f"SELECT *, CAST({sign} AS BIGINT) AS __w FROM ({part})")
        out = union_all(parts)
        assert out is not None
        # netted: a group whose value did not change (a MAX that kept its maximum, the one row of a global
        # aggregate under a scalar subquery) leaves nothing for the operators above to redo
        return consolidate(out, self.cols) if self.cols else out

    def strategy(self) -> str:
        return "group rescan of affected groups (nested aggregate)"

    def label(self) -> str:
        names = self.group_sql()
        g = ", ".join(names) or "()"
        if self.sets is not None:
            g = f"GROUPING SETS ({', '.join('(' + ', '.join(names[i] for i in s) + ')' for s in self.sets)})"
        if not self.aggs:
            return f"Distinct [{g}]" if self.groups and self.sets is None else f"Aggregate {g}"
        return f"Aggregate GROUP BY {g}: " + ", ".join(a.sql() for a in self.aggs)


def key_match(left: str, right: str, names: list[str]) -> str:
    return null_safe_match(left, right, [(n, n) for n in names])
