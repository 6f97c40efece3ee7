"""The operator contract.

Every node of the logical tree produces a relation with uniquely named internal columns (``cols``). It can
render two things as Spark SQL:

* ``snapshot(ctx, state)`` — its full output (a bag) over the sources at the pre or post frontier;
* ``delta(ctx)`` — its change between the two frontiers as a Z-set: the same columns plus ``__w``, the
  signed multiplicity (+n rows appear, -n rows disappear). ``None`` means "provably no change": none of the
  node's sources moved, which lets parents drop whole branches of their delta rule.

Internal column names are unique across the whole tree, so SQL can reference them unqualified.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from dvm.context import Context, State, quote

W = "__w"

_RECOMPUTE_WORDS = re.compile(r"\b(recomput|rescan)", re.IGNORECASE)


class Node:
    cols: list[str]
    children: list[Node]

    def snapshot(self, ctx: Context, state: State) -> str:
        raise NotImplementedError

    def delta(self, ctx: Context) -> str | None:
        raise NotImplementedError

    def label(self) -> str:
        """One line for ``explain``: the operator and its parameters."""
        raise NotImplementedError

    def strategy(self) -> str:
        """How the delta is computed, for ``explain`` (e.g. 'incremental', 'group rescan')."""
        return "incremental"

    def recompute(self) -> str | None:
        """Why this operator's delta rule recomputes part of its output from snapshots (the groups,
        partitions or rows a change touches) instead of deriving it from the changes alone; None for a
        pure delta rule. ``explain`` marks such operators, and the coverage table calls a query that has
        one *recompute-scoped* (tests/coverage_table.py). By default read off :meth:`strategy`: a
        strategy that says it recomputes or rescans is one; override where the wording would mislead."""
        s = self.strategy()
        return s if _RECOMPUTE_WORDS.search(s) else None

    def sources(self) -> set[str]:
        out: set[str] = set()
        for c in self.children:
            out |= c.sources()
        return out

    def changed(self, ctx: Context) -> bool:
        return any(ctx.changed(s) for s in self.sources())

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()


def col_list(cols: list[str], prefix: str = "") -> str:
    return ", ".join(prefix + quote(c) for c in cols) if cols else ""


def null_safe_match(left: str, right: str, pairs: list[tuple[str, str]]) -> str:
    """Equality of tuples where NULL matches NULL: the identity of a row or group, not SQL's '='."""
    if not pairs:
        return "TRUE"
    return " AND ".join(f"{left}.{quote(a)} <=> {right}.{quote(b)}" for a, b in pairs)


def consolidate(sql: str, cols: list[str]) -> str:
    """Net a Z-set: one row per distinct tuple with the sum of its weights, zero-weight tuples dropped.
    Rules whose output can hold a +n and a -n copy of the same tuple must net it before an operator that
    reads insertions and deletions separately (MIN/MAX treat every positive row as an inserted value)."""
    group = col_list(cols)
    return f"SELECT {group}, SUM({W}) AS {W} FROM ({sql}) GROUP BY {group} HAVING SUM({W}) <> 0"


def union_all(parts: list[str]) -> str | None:
    parts = [p for p in parts if p]
    if not parts:
        return None
    return "\nUNION ALL\n".join(f"SELECT * FROM ({p})" for p in parts) if len(parts) > 1 else parts[0]
