"""The state one build shares across clauses, and the name bookkeeping every clause uses.

A column of the qualified query is known by (table alias, column name); the builder renames each to a
unique internal name (``__tN``) so generated SQL never qualifies a column. ``env`` maps the first to the
second within one scope, and :meth:`Scope.translate` rewrites an expression over it. Each clause module
(select, from_clause, where, aggregate, windows, lateral, ctes) holds one subclass of :class:`Scope` with
its clause's methods; :class:`~dvm.builder.compile.Builder` joins them, so a clause calls another through
``self`` and no clause module imports another (a subquery in WHERE builds a query, which builds a WHERE)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sqlglot import exp

from dvm.builder.syntax import orderable
from dvm.dialect import SPARK
from dvm.errors import QueryError
from dvm.operators import Node
from dvm.operators.cte import SharedCte
from dvm.operators.window import owning_window


class Scope:
    """Walks one qualified query; hands out unique internal column names."""

    def __init__(self, keys: dict[str, str], schemas: Mapping[str, list[tuple[str, str]]]) -> None:
        self.keys = keys  # placeholder table name -> source key
        self.schemas = schemas  # source key -> [(column, type)]
        self.counter = 0
        self.notes: list[str] = []
        self.types: dict[str, str] = {}  # internal column -> source type, where known (tie-breakers skip maps)
        self.shared: dict[int, SharedCte] = {}  # id of a CTE's body AST -> its subtree, built once
        self.cte_of: dict[int, exp.CTE] = {}  # id(CTE body) -> its CTE node (column list, WITH RECURSIVE)

    def fresh(self) -> str:
        self.counter += 1
        return f"__t{self.counter}"

    def translate(self, e: exp.Expression, env: dict[tuple[str, str], str]) -> exp.Expression:
        """A copy of ``e`` with every column renamed to its internal name in ``env``."""
        def fix(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                key = (n.table.lower(), n.name.lower())
                if key not in env:
                    raise QueryError(f"unknown column {n.sql(SPARK)}")
                return exp.column(env[key], quoted=True)
            return n

        return e.copy().transform(fix, copy=False)

    @staticmethod
    def aggs_in(e: exp.Expression) -> bool:
        """``e`` holds a GROUP BY aggregate (not the function of a window: ``SUM(x) OVER (...)``)."""
        return any(owning_window(a) is None for a in e.find_all(exp.AggFunc))

    @staticmethod
    def ordered(o: exp.Ordered, col: str) -> exp.Ordered:
        """The sort key ``o`` (direction, NULLS placement) over the internal column ``col``."""
        return exp.Ordered(this=exp.column(col, quoted=True), desc=bool(o.args.get("desc")),
                           nulls_first=o.args.get("nulls_first"))

    def tie_cols(self, node: Node) -> list[str]:
        """``node``'s columns a tie-breaker can sort by (maps and variants cannot be ordered)."""
        return [c for c in node.cols if orderable(self.types.get(c))]

    def propagate_types(self, items: list[tuple[str, exp.Expression]]) -> None:
        for name, e in items:
            if isinstance(e, exp.Column) and e.name in self.types:
                self.types[name] = self.types[e.name]

    def with_ctes(self, q: exp.Expression, ctes: dict[str, exp.Expression]) -> dict[str, exp.Expression]:
        w = q.args.get("with_") or q.args.get("with")
        if not w:
            return ctes
        out = dict(ctes)
        for cte in w.expressions:
            out[cte.alias_or_name.lower()] = cte.this
            self.cte_of[id(cte.this)] = cte
        return out

    @staticmethod
    def scope_nodes(q: exp.Select) -> Iterator[exp.Expression]:
        """Nodes of this SELECT's own scope: not inside nested queries (subqueries, CTE bodies)."""
        stack: list[exp.Expression] = [
            v for k, v in q.args.items() if k not in ("with_", "with", "from_", "from") and v is not None
            for v in (v if isinstance(v, list) else [v])
        ]
        from_ = q.args.get("from_") or q.args.get("from")
        if from_ is not None:
            stack.append(from_)
        while stack:
            n = stack.pop()
            if not isinstance(n, exp.Expression):
                continue
            if isinstance(n, (exp.Select, exp.SetOperation)) or (
                isinstance(n, exp.Subquery) and not isinstance(n.this, exp.Table)  # a parenthesised join is in scope
            ):
                continue
            yield n
            for v in n.args.values():
                if isinstance(v, list):
                    stack.extend(x for x in v if isinstance(x, exp.Expression))
                elif isinstance(v, exp.Expression):
                    stack.append(v)

    def used_columns(self, q: exp.Select) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.scope_nodes(q):
            if isinstance(n, exp.Column) and n.table:
                out.setdefault(n.table.lower(), []).append(n.name)
        for j in q.args.get("joins") or []:  # references of LATERAL items to the left input
            for n in j.this.find_all(exp.Column) if isinstance(j.this, exp.Lateral) else []:
                if n.table:
                    out.setdefault(n.table.lower(), []).append(n.name)
        where = q.args.get("where")
        for n in where.find_all(exp.Column) if where is not None else []:  # correlated references too
            if n.table:
                out.setdefault(n.table.lower(), []).append(n.name)
        return out
