"""Which sources a query reads monotonically: the edge classes of stratified evaluation (seed 002, S-1).

A query is *monotone* in a source when adding rows to that source can only add rows to the result, never
remove or change one. Stream tables may form a cycle only through monotone edges: then evaluating the
cycle from nothing up to its least fixpoint is well defined (Datalog's positive rules). A non-monotone edge
(``NOT EXISTS``, ``EXCEPT``'s right side, an aggregate's input) must point to a lower stratum: a table
outside the cycle, read as a constant while the cycle iterates.

The classification walks the operator tree (:mod:`dvm.operators`) from the root to every scan of a source:
an edge is non-monotone when ANY path passes a non-monotone position, and it names the first such
operator. Conservative on purpose: an operator not listed here as monotone counts as non-monotone, and so
does a source the query reads that no scan of the tree accounts for (a subquery the tree kept as SQL). A
false "monotone" would let a cycle converge to a wrong fixpoint, a false "non-monotone" only refuses it.

Pure Python, no JVM: it reads the tree only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sqlglot import exp

from dvm.operators.aggregate import Aggregate
from dvm.operators.anti_join import AntiJoin
from dvm.operators.base import Node
from dvm.operators.cte import CteRef
from dvm.operators.filter import Filter
from dvm.operators.full_join import FullJoin
from dvm.operators.generate import Generate
from dvm.operators.join import InnerJoin
from dvm.operators.left_join import LeftJoin
from dvm.operators.mark_join import MarkJoin
from dvm.operators.project import Project
from dvm.operators.scan import Scan
from dvm.operators.semi_join import SemiJoin
from dvm.operators.set_op import SetOp
from dvm.operators.union_all import UnionAll

MONOTONE = "monotone"
NON_MONOTONE = "non-monotone"


@dataclass(frozen=True)
class EdgeClass:
    """How a query reads one source: monotone, or non-monotone because of ``operator`` (the first
    non-monotone position on a path from the root to a scan of the source)."""

    source: str
    monotone: bool
    operator: str | None = None

    @property
    def kind(self) -> str:
        return MONOTONE if self.monotone else NON_MONOTONE

    def describe(self) -> str:
        return MONOTONE if self.monotone else f"{NON_MONOTONE} ({self.operator})"


def classify(root: Node, sources: list[str] | None = None) -> dict[str, EdgeClass]:
    """Each source's edge class in the tree ``root``. ``sources``: every source the query reads (lower-case
    keys); one the tree never scans is non-monotone ("read outside the operator tree")."""
    found: dict[str, str | None] = {}  # source -> first blocking operator (None: monotone so far)

    def reach(source: str, blocker: str | None) -> None:
        if source not in found or found[source] is None:
            found[source] = blocker if source not in found else (found[source] or blocker)

    def walk(node: Node, blocker: str | None, seen: frozenset[int]) -> None:
        if isinstance(node, Scan):
            reach(node.source, blocker)
            return
        if id(node) in seen:  # a shared CTE body reached again through itself: nothing new below
            return
        seen = seen | {id(node)}
        for child, why in _positions(node):
            walk(child, blocker or why, seen)

    walk(root, None, frozenset())
    if any(_holds_subquery(n) for n in root.walk()):  # its tables are no scans: every edge is unsure
        found = {s: b or "a subquery inside an expression (kept as SQL)" for s, b in found.items()}
    out = {s: EdgeClass(s, b is None, b) for s, b in found.items()}
    for s in sources or []:
        if s not in out:
            out[s] = EdgeClass(s, False, "read outside the operator tree (a subquery kept as SQL)")
    return out


def _holds_subquery(node: Node) -> bool:
    """Whether an expression of ``node`` (a predicate, a SELECT item) holds a query of its own."""
    if not dataclasses.is_dataclass(node):
        return False
    for f in dataclasses.fields(node):
        value = getattr(node, f.name, None)
        items = value if isinstance(value, list) else [value]
        for item in items:
            for part in item if isinstance(item, tuple) else (item,):
                if isinstance(part, exp.Expression) and part.find(exp.Select) is not None:
                    return True
    return False


def _positions(node: Node) -> list[tuple[Node, str | None]]:
    """The children of ``node``, each with why its position is non-monotone (None: monotone)."""
    if isinstance(node, CteRef):
        return [(node.shared.node, None)]
    if isinstance(node, (Project, Filter, UnionAll, Generate)):
        return [(c, None) for c in node.children]
    if isinstance(node, Aggregate):
        if not node.aggs and node.sets is None and node.groups:
            return [(node.child, None)]  # DISTINCT (also UNION's): a new input row can only add a group
        return [(node.child, "aggregate input")]
    if isinstance(node, AntiJoin):  # before SemiJoin: a subclass of it
        return [(node.left, None), (node.right, "NOT EXISTS / NOT IN (anti-join right side)")]
    if isinstance(node, SemiJoin):
        return [(node.left, None), (node.right, None)]
    if isinstance(node, FullJoin):
        why = "FULL OUTER JOIN (a new row on one side retracts a NULL-padded row)"
        return [(node.left, why), (node.right, why)]
    if isinstance(node, LeftJoin):
        return [(node.left, None), (node.right, "LEFT JOIN right side (a match retracts a NULL-padded row)")]
    if isinstance(node, InnerJoin):
        return [(node.left, None), (node.right, None)]
    if isinstance(node, SetOp):
        if node.op == "intersect":
            return [(node.left, None), (node.right, None)]
        return [(node.left, None), (node.right, "EXCEPT right side")]
    if isinstance(node, MarkJoin):
        return [(node.left, None)] + [(m.right, "EXISTS / IN under OR or NOT (mark join)") for m in node.marks]
    name = type(node).__name__
    why = {"Window": "window function input", "TopK": "ORDER BY ... LIMIT input",
           "RecursiveCte": "recursive CTE (treated as non-monotone)",
           "LateralJoin": "LATERAL (treated as non-monotone)"}.get(name, f"{name} (not known to be monotone)")
    return [(c, why) for c in node.children]
