"""GROUP BY and aggregates: the Aggregate node of a grouped SELECT (group keys, grouping sets, one call
per distinct aggregate), and the rewrite of the select list, HAVING and ORDER BY over its output (group
keys by their expression, aggregate calls by their column, GROUPING() as a constant per grouping set)."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

import dvm.operators.aggregates as aggregates
from dvm.builder.scope import Scope
from dvm.builder.syntax import limit_of
from dvm.dialect import SPARK
from dvm.errors import QueryError
from dvm.operators import AggCall, Aggregate, Node
from dvm.operators.window import owning_window


class AggregateClause(Scope):
    def aggregate(self, node: Node, q: exp.Select, env: dict[tuple[str, str], str]
                  ) -> tuple[Aggregate, Callable[[exp.Expression], exp.Expression]]:
        """The Aggregate node of a grouped SELECT, and ``post``: an expression over the SELECT's scope
        rewritten over the aggregate's columns (group keys, aggregate calls, GROUPING() constants)."""
        group_exprs, sets = aggregates.grouping_sets(q.args.get("group"))
        groups = [(self.fresh(), self.translate(g, env)) for g in group_exprs]
        set_col = self.fresh() if sets is not None else None

        def tr(x: exp.Expression) -> exp.Expression:
            return self.translate(x, env)

        calls: list[AggCall] = []
        by_sql: dict[str, str] = {}
        exprs = [e for e in q.expressions] + ([q.args["having"]] if q.args.get("having") else [])
        if q.args.get("order") and limit_of(q) is not None:
            exprs.append(q.args["order"])
        for e in exprs:
            for a in e.find_all(exp.AggFunc):
                if isinstance(a, aggregates.GROUPING_FUNCS) or owning_window(a) is not None:
                    continue
                call = aggregates.build_call(a, tr, self.fresh(), len(calls))
                if call.sql() not in by_sql:
                    by_sql[call.sql()] = call.name
                    calls.append(call)
        agg = Aggregate(node, groups, calls, sets, set_col)
        group_sql = {g.sql(SPARK): name for name, g in groups}
        group_index = {g.sql(SPARK): i for i, (_, g) in enumerate(groups)}

        def grouping(n: exp.Expression) -> exp.Expression:
            """GROUPING(a) / grouping_id(...): a constant per grouping set, chosen by the set ordinal."""
            if sets is None or set_col is None:
                raise QueryError(f"{n.sql(SPARK)} needs GROUP BY with GROUPING SETS, CUBE or ROLLUP")
            which = [] if n.expressions else list(range(len(groups)))
            for x in n.expressions:
                t = tr(x).sql(SPARK)
                if t not in group_index:
                    raise QueryError(f"{x.sql(SPARK)} in {n.sql(SPARK)} is not a GROUP BY expression")
                which.append(group_index[t])
            bits = aggregates.grouping_bits(sets, which)
            return exp.Case(this=exp.column(set_col, quoted=True),
                            ifs=[exp.If(this=exp.Literal.number(i), true=exp.Literal.number(b))
                                 for i, b in enumerate(bits)])

        def post(e: exp.Expression) -> exp.Expression:
            def children(n: exp.Expression) -> exp.Expression:
                for k, v in list(n.args.items()):
                    if isinstance(v, exp.Expression):
                        n.set(k, rewrite(v))
                    elif isinstance(v, list):
                        n.set(k, [rewrite(x) if isinstance(x, exp.Expression) else x for x in v])
                return n

            def rewrite(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.Window):  # evaluated above the aggregate: rewrite what it reads
                    f = n.this
                    while isinstance(f, (exp.IgnoreNulls, exp.RespectNulls)):
                        f = f.this
                    children(f)
                    for k, v in list(n.args.items()):
                        if k != "this" and isinstance(v, exp.Expression):
                            n.set(k, rewrite(v))
                        elif k != "this" and isinstance(v, list):
                            n.set(k, [rewrite(x) if isinstance(x, exp.Expression) else x for x in v])
                    return n
                if isinstance(n, aggregates.GROUPING_FUNCS):
                    return grouping(n)
                if isinstance(n, exp.AggFunc):
                    sql = aggregates.build_call(n, tr, "", 0).sql()
                    return exp.column(by_sql[sql], quoted=True)
                if isinstance(n, (exp.Column, exp.Func, exp.Binary, exp.Paren, exp.Case, exp.Cast)):
                    try:
                        t = self.translate(n, env)
                    except QueryError:
                        return n
                    if t.sql(SPARK) in group_sql:
                        return exp.column(group_sql[t.sql(SPARK)], quoted=True)
                if isinstance(n, exp.Column):
                    raise QueryError(f"column {n.sql(SPARK)} must appear in GROUP BY or inside an aggregate")
                return children(n)

            return rewrite(e.copy())

        return agg, post
