"""Lateral join: ``L, LATERAL (subquery)``, ``L [CROSS] JOIN LATERAL (...) [ON θ]``, ``L LEFT JOIN LATERAL
(...) ON θ`` and ``LATERAL f(...) AS t(c)`` — the right side is evaluated once per left row ``l`` and may
reference ``l``'s columns: a top-N per group (``ORDER BY ... LIMIT n``), a correlated aggregate, any query.

Delta rule. The output rows of ``l`` are a function F(l, S) of ``l`` and of the tables S the lateral item
reads. Call ``l`` *affected* when its tuple occurs in ΔL or some changed row of a table X of S can reach
F(l, ·) (P(l) below). Rows that are not affected produce identical output before and after, so

    Δ(L ⋈lat S) = (σ_P L_post ⋈lat S_post) − (σ_P L_pre ⋈lat S_pre)

— the affected left rows are recomputed on both snapshots, as in the outer, semi and mark joins
(:func:`~dvm.operators.join.affected_rows`), and the two results netted. When no table of S changed (or the
item reads none: a table function, ``LATERAL (SELECT l.x + 1)``) F(l) is a function of ``l`` alone and the
rule is linear: ΔL ⋈lat S_post, weights carried.

P(l), for each table X the item reads: when X is a FROM item of the subquery's top SELECT (inner / cross
joins only), a change of X reaches F(l) only through rows that satisfy every conjunct of the WHERE clause
(and of the inner joins' ON clauses) that reads X's columns and l's columns and nothing else — typically
the correlation ``b.k = a.k`` — because any combination holding another row of X is filtered out before
grouping, ordering or limiting. So l is affected by ΔX iff some row of ΔX satisfies those conjuncts against
l. For a table read anywhere else (in a nested subquery, under an outer join) every left row is affected by
any change of it.

``ORDER BY ... LIMIT n`` picks arbitrary rows among ties, so a recompute could take other rows than the ones
stored; the builder appends the select list to the ORDER BY (ties broken by the output itself), which makes
the result of each left row a well-defined bag.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dvm.context import Context, State
from dvm.dialect import SPARK
from dvm.operators.base import Node, W, col_list, consolidate, union_all
from dvm.operators.join import TAG, Inputs, affected_rows
from dvm.operators.scan import Scan

#: the alias of the left rows in the rendered SQL; the lateral item references their columns through it
LEFT = "__l"


@dataclass(eq=False)
class InnerSource:
    """A table the lateral item reads: ``mark`` stands for it in the item's SQL; ``scan`` reads the columns
    the item references (its change window finds the affected left rows); ``filter`` (over the left input's and the
    scan's columns) is what a changed row must satisfy to reach a left row, None when any change reaches
    every left row."""

    scan: Scan
    mark: str
    filter: exp.Expression | None

    def from_item(self, ctx: Context, state: State) -> str:
        cols = col_list([c for c, _ in self.scan.columns]) or "1 AS __one"
        return f"(SELECT {cols} FROM {ctx.table(self.scan.source, state)})"


@dataclass(eq=False)
class LateralJoin(Node):
    left: Node
    #: the lateral item (a Subquery or a table function) over ``__l.<left column>`` and the inner marks
    item: exp.Expression
    #: internal names of the item's output columns
    out: list[str]
    kind: str  # CROSS | INNER | LEFT
    condition: exp.Expression | None  # ON, over the left's and the item's columns
    inner: list[InnerSource]

    def __post_init__(self) -> None:
        self.children = [self.left] + [s.scan for s in self.inner]
        self.cols = list(self.left.cols) + list(self.out)

    def _item_sql(self, ctx: Context, state: State) -> str:
        sql = self.item.sql(SPARK)
        for s in self.inner:
            sql = sql.replace(s.mark, s.from_item(ctx, state))
        return sql

    def _join(self, ctx: Context, state: State) -> str:
        item = f"LATERAL {self._item_sql(ctx, state)} AS __r({col_list(self.out)})"
        on = self.condition.sql(SPARK) if self.condition is not None else "TRUE"
        if self.kind == "LEFT":
            return f"LEFT JOIN {item} ON {on}"
        if self.kind == "INNER":
            return f"JOIN {item} ON {on}"
        return f"CROSS JOIN {item}"

    def _rows(self, ctx: Context, rows: str, state: State, weight: str) -> str:
        return f"SELECT {col_list(self.cols)}{weight} FROM ({rows}) {LEFT} {self._join(ctx, state)}"

    def snapshot(self, ctx: Context, state: State) -> str:
        return self._rows(ctx, self.left.snapshot(ctx, state), state, "")

    def delta(self, ctx: Context) -> str | None:
        inputs = Inputs(ctx, left=self.left, **{f"s{i}": s.scan for i, s in enumerate(self.inner)})
        others = [(f"s{i}", s.filter) for i, s in enumerate(self.inner)]
        if all(inputs.delta(o) is None for o, _ in others):
            dl = inputs.delta("left")
            return None if dl is None else inputs.wrap(self._rows(ctx, dl, "post", f", {LEFT}.{W}"))
        rows = inputs.share(affected_rows(inputs, "left", others))
        terms = [self._rows(ctx, f"SELECT * FROM ({rows}) WHERE {TAG} = {sign}", state, f", {LEFT}.{TAG} AS {W}")
                 for sign, state in ((1, "post"), (-1, "pre"))]
        return inputs.wrap(consolidate(union_all(terms), self.cols))  # type: ignore[arg-type]

    def strategy(self) -> str:
        if not self.inner:
            return "incremental (a function of each left row: ΔL joined laterally, weights carried)"
        return ("row-scoped recompute (left rows touched by ΔL, or reached by a changed row of "
                f"{', '.join(sorted({s.scan.source for s in self.inner}))}, recomputed on both snapshots)")

    def label(self) -> str:
        on = f" ON {self.condition.sql(SPARK)}" if self.condition is not None else ""
        reach = "; ".join(f"{s.scan.source}: {s.filter.sql(SPARK) if s.filter is not None else 'any row'}"
                          for s in self.inner)
        text = self.item.sql(SPARK)
        for s in self.inner:
            text = text.replace(s.mark, s.scan.source)
        return (f"LateralJoin {self.kind} LATERAL {text[:200]} AS ({', '.join(self.out)}){on}"
                + (f"  [changes reach left rows by {reach}]" if reach else ""))
