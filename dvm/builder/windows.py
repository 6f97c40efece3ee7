"""Window functions and the sort keys of a top-k: window calls in a select list become one Window node
below the projection; the ORDER BY of ``ORDER BY ... LIMIT`` is resolved to positions in the select list
(adding hidden items for keys not selected). QUALIFY, named windows and DISTINCT ON were rewritten into
these before the build (:func:`dvm.builder.compile.window_rewrites`)."""

from __future__ import annotations

from sqlglot import exp

from dvm.builder.scope import Scope
from dvm.dialect import SPARK
from dvm.errors import QueryError
from dvm.operators import Node, Window


class WindowClause(Scope):
    def windows(self, node: Node, items: list[tuple[str, exp.Expression]]) -> tuple[Node, list[tuple[str, exp.Expression]]]:
        """Pull the window functions out of ``items`` (expressions over ``node``'s columns) into a Window node
        below them; the items then read the window's output columns."""
        funcs: list[tuple[str, exp.Window]] = []
        by_sql: dict[str, str] = {}

        def pull(n: exp.Expression) -> exp.Expression:
            if not isinstance(n, exp.Window):
                return n
            sql = n.sql(SPARK)
            if sql not in by_sql:
                by_sql[sql] = self.fresh()
                funcs.append((by_sql[sql], n.copy()))
            return exp.column(by_sql[sql], quoted=True)

        out = [(name, e.transform(pull)) for name, e in items]
        if not funcs:
            return node, items
        return Window(node, funcs, self.tie_cols(node)), out

    def order_keys(self, q: exp.Select, items: list[tuple[str, exp.Expression]], names: list[str],
                   tr: object, distinct: bool) -> list[tuple[int, exp.Ordered]]:
        """The ORDER BY of a TopK as (position in ``items``, key): an output column by name or position, an
        expression equal to a selected one, or else a hidden item appended to ``items`` (not with DISTINCT,
        whose rows are the selected columns only)."""
        out = []
        for o in q.args["order"].expressions:
            k = o.this
            idx = None
            if isinstance(k, exp.Literal) and k.is_int and 0 < int(k.name) <= len(names):
                idx = int(k.name) - 1
            elif isinstance(k, exp.Column) and not k.table:
                idx = next((i for i, n in enumerate(names) if n.lower() == k.name.lower()), None)
            if idx is None:
                t = tr(k)  # type: ignore[operator]
                idx = next((i for i, (_, e) in enumerate(items) if e.sql(SPARK) == t.sql(SPARK)), None)
                if idx is None:
                    if distinct:
                        raise QueryError(f"ORDER BY {k.sql(SPARK)} of a SELECT DISTINCT must be one of the "
                                         "selected columns")
                    items.append((self.fresh(), t))
                    idx = len(items) - 1
            out.append((idx, o))
        return out
