"""CteRef: one reference to a common table expression (``WITH t AS (...)``) whose body is shared.

Delta rule: Δρ(t) = ρ(Δt) — a reference renames the body's columns, weights kept. The point is that the
body is built and differentiated ONCE however often the query reads it: the builder makes one subtree per
CTE definition (at its first reference), and every reference is a CteRef over that same subtree, with
output names of its own (internal names are unique across the tree, and ``t x JOIN t y`` needs two sets).

Rendering. A CTE read by one reference is inlined, as a subquery would be. A CTE read by two or more is
rendered once per refresh as a named query of the statement's outermost WITH clause, one name per form
the rule reads — ``__cteN_delta``, ``__cteN_post``, ``__cteN_pre`` (the pre form only when the body's
sources moved; otherwise it is the post one) — and each reference reads the name
(:func:`with_shared`). Spark does not inline a CTE that is read more than once: it computes it once and
reuses its exchange, so both the SQL text and the work stay linear in the number of references. Only the
forms the rendered statement names are defined (a pre snapshot nobody reads would still cost Delta a
state reconstruction during analysis).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from dvm.context import Context, State, quote
from dvm.operators.base import Node, W

_ORDER = itertools.count(1)
_NAME = re.compile(r"\b(__cte\d+)_(post|pre|delta)\b")


@dataclass(eq=False)
class SharedCte:
    """A CTE's body, built once. ``inline`` is decided once the whole tree is built (:func:`finalize_ctes`)."""

    name: str  # the CTE's name as written, for explain
    node: Node
    names: list[str]  # its output column names as written (positional to node.cols)
    inline: bool = True
    order: int = field(default_factory=lambda: next(_ORDER))  # bodies are built before their users

    @property
    def ident(self) -> str:
        return f"__cte{self.order}"

    def form(self, ctx: Context, state: str) -> str:
        """The WITH-clause name of one form of the body (``delta``, ``post`` or ``pre``)."""
        if state == "pre" and not self.node.changed(ctx):
            state = "post"
        return f"{self.ident}_{state}"

    def render(self, ctx: Context, state: str) -> str:
        if state == "delta":
            d = self.node.delta(ctx)
            if d is not None:
                return d
            return f"SELECT *, CAST(0 AS BIGINT) AS {W} FROM ({self.node.snapshot(ctx, 'post')}) WHERE FALSE"
        return self.node.snapshot(ctx, state)  # type: ignore[arg-type]


@dataclass(eq=False)
class CteRef(Node):
    shared: SharedCte
    names: list[str]  # this reference's internal output names

    def __post_init__(self) -> None:
        self.children = [self.shared.node]
        self.cols = list(self.names)

    def _rename(self, sql: str, weighted: bool) -> str:
        select = ", ".join(f"{quote(s)} AS {quote(t)}" for s, t in zip(self.shared.node.cols, self.cols, strict=True))
        return f"SELECT {select}{', ' + W if weighted else ''} FROM ({sql})"

    def snapshot(self, ctx: Context, state: State) -> str:
        if self.shared.inline:
            return self._rename(self.shared.node.snapshot(ctx, state), False)
        return self._rename(f"SELECT * FROM {self.shared.form(ctx, state)}", False)

    def delta(self, ctx: Context) -> str | None:
        if self.shared.inline:
            d = self.shared.node.delta(ctx)
            return None if d is None else self._rename(d, True)
        if not self.shared.node.changed(ctx):
            return None
        return self._rename(f"SELECT * FROM {self.shared.form(ctx, 'delta')}", True)

    def strategy(self) -> str:
        if self.shared.inline:
            return "incremental (the CTE's only reference: inlined)"
        return f"incremental (shared CTE, differentiated once as {self.shared.ident}_*)"

    def label(self) -> str:
        return f"CteRef {self.shared.name}"


def finalize_ctes(root: Node) -> None:
    """Once the tree is built: a CTE with one reference is inlined, one with more is shared."""
    refs: dict[int, CteRef] = {}
    for n in root.walk():
        if isinstance(n, CteRef):
            refs[id(n)] = n
    counts: dict[int, int] = {}
    for r in refs.values():
        counts[id(r.shared)] = counts.get(id(r.shared), 0) + 1
    for r in refs.values():
        r.shared.inline = counts[id(r.shared)] == 1


def with_shared(sql: str, root: Node, ctx: Context) -> str:
    """``sql`` (a statement rendered from ``root``'s tree) with the shared CTE forms it names defined in an
    outermost WITH clause, in dependency order (a body's own shared CTEs are built, so numbered, first)."""
    shared = {s.ident: s for n in root.walk() if isinstance(n, CteRef) and not (s := n.shared).inline}
    if not shared:
        return sql
    defs: dict[str, str] = {}
    pending = [m.group(0) for m in _NAME.finditer(sql)]
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        ident, state = _NAME.fullmatch(name).groups()  # type: ignore[union-attr]
        defs[name] = shared[ident].render(ctx, state)
        pending += [m.group(0) for m in _NAME.finditer(defs[name])]
    if not defs:
        return sql
    ordered = sorted(defs, key=lambda n: (shared[_NAME.fullmatch(n).group(1)].order, n))  # type: ignore[union-attr]
    return "WITH " + ",\n".join(f"{n} AS ({defs[n]})" for n in ordered) + f"\nSELECT * FROM ({sql})"
