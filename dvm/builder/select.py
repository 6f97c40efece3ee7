"""Queries: a SELECT (FROM, WHERE, GROUP BY / HAVING, the select list with its generator, DISTINCT,
ORDER BY ... LIMIT) and the set operations (UNION [ALL], INTERSECT, EXCEPT), built bottom-up into
Project, Aggregate, Generate, SetOp / UnionAll and TopK nodes. The clauses below the select list are
built by the other clause modules."""

from __future__ import annotations

from sqlglot import exp

from dvm.builder.scope import Scope
from dvm.builder.syntax import generator_defaults, is_generator, limit_of, unalias
from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import Aggregate, Filter, Generate, Node, Project, SetOp, TopK, UnionAll


class SelectClause(Scope):
    def query(self, q: exp.Expression, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        """Build ``q``; return its node and its output names (positional to ``node.cols``)."""
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes)
        if isinstance(q, exp.SetOperation):
            return self.set_operation(q, ctes)
        if isinstance(q, exp.Select):
            return self.select(q, ctes)
        raise UnsupportedError(q.key, f"{q.key.upper()} is not supported in a defining query")

    def set_operation(self, q: exp.SetOperation, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        """UNION [ALL] (UNION ALL, under a DISTINCT aggregate unless ALL), INTERSECT [ALL], EXCEPT / MINUS
        [ALL] (:mod:`~dvm.operators.set_op`). sqlglot nests them as SQL does (INTERSECT binds tighter)."""
        ctes = self.with_ctes(q, ctes)
        left, names = self.query(q.this, ctes)
        right, _ = self.query(q.expression, ctes)
        if len(left.cols) != len(right.cols):
            raise QueryError(f"{q.key.upper()} branches have {len(left.cols)} and {len(right.cols)} columns")
        distinct = bool(q.args.get("distinct"))
        out = [self.fresh() for _ in left.cols]
        node: Node
        if not isinstance(q, exp.Union):
            node = SetOp(left, right, q.key.lower(), not distinct, out)
        else:
            node = UnionAll([left, right], out)
            if distinct:
                node = Aggregate(node, [(self.fresh(), exp.column(c, quoted=True)) for c in node.cols], [])
        bounds = limit_of(q)
        if bounds is not None:
            keys = []
            for o in q.args["order"].expressions:
                k = o.this
                idx = next((i for i, n in enumerate(names) if isinstance(k, exp.Column) and not k.table
                            and n.lower() == k.name.lower()), None)
                if isinstance(k, exp.Literal) and k.is_int and 0 < int(k.name) <= len(names):
                    idx = int(k.name) - 1
                if idx is None:
                    raise UnsupportedError("ORDER BY", f"ORDER BY {k.sql(SPARK)} of a {q.key.upper()} must name an output "
                                           "column (or its position)")
                keys.append(self.ordered(o, node.cols[idx]))
            node = TopK(node, keys, bounds[0], bounds[1], self.tie_cols(node))
        elif q.args.get("order"):
            self.notes.append("ORDER BY without LIMIT is ignored: a table has no order")
        return node, names

    def select(self, q: exp.Select, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        ctes = self.with_ctes(q, ctes)
        bounds = limit_of(q)
        if q.args.get("order") and bounds is None:
            self.notes.append("ORDER BY without LIMIT is ignored: a table has no order")
        if q.args.get("distinct") and q.args["distinct"].args.get("on"):  # rewritten by compile_tree
            raise UnsupportedError("DISTINCT ON", "DISTINCT ON must be rewritten first (rewrite.eliminate_distinct_on)")
        used = self.used_columns(q)
        env: dict[tuple[str, str], str] = {}
        from_ = q.args.get("from_") or q.args.get("from")
        if from_ is None:
            raise UnsupportedError("SELECT without FROM", "a defining query needs at least one source table")
        node, env = self.from_item(from_.this, ctes, used)
        node, env = self.joins(node, env, q.args.get("joins") or [], ctes, used)
        for lat in q.args.get("laterals") or []:  # LATERAL VIEW: after the FROM clause, before WHERE
            node, env = self.lateral_view(node, env, lat)
        where = q.args.get("where")
        if where is not None:
            node = self.where(node, where.this, env, ctes)
        selects = q.expressions
        having = q.args.get("having")
        group = q.args.get("group")
        order = q.args.get("order")
        has_aggs = any(self.aggs_in(e) for e in selects) or (having is not None and self.aggs_in(having)) or (
            bounds is not None and order is not None and self.aggs_in(order))
        if group is not None or has_aggs:
            node, post = self.aggregate(node, q, env)
            if having is not None:
                node = Filter(node, post(having.this))
            tr = post
        else:
            if having is not None:
                raise QueryError("HAVING without GROUP BY or aggregate")

            def tr(x: exp.Expression) -> exp.Expression:
                return self.translate(x, env)

        gens = [e for e in selects if is_generator(unalias(e))]
        if len(gens) > 1:
            raise QueryError(f"only one generator is allowed per SELECT, found {len(gens)}: "
                             f"{', '.join(g.sql(SPARK)[:40] for g in gens)}")
        items: list[tuple[str, exp.Expression]] = []
        names: list[str] = []
        for e in selects:
            if gens and e is gens[0]:  # a generator in the SELECT list: Generate below the projection
                gen_names = self.generator_names(e)
                out = [self.fresh() for _ in gen_names]
                node = Generate(node, tr(unalias(e)), False, out)
                items += [(self.fresh(), exp.column(o, quoted=True)) for o in out]
                names += gen_names
            else:
                items.append((self.fresh(), tr(unalias(e))))
                names.append(e.alias_or_name)
        distinct = bool(q.args.get("distinct"))
        keys = self.order_keys(q, items, names, tr, distinct) if bounds is not None else []
        node, items = self.windows(node, items)
        node = Project(node, items)
        self.propagate_types(items)
        if distinct:
            node = Aggregate(node, [(self.fresh(), exp.column(c, quoted=True)) for c in node.cols], [])
        if bounds is not None:
            ordered = [self.ordered(o, node.cols[i]) for i, o in keys]
            node = TopK(node, ordered, bounds[0], bounds[1], self.tie_cols(node))
            if len(node.cols) > len(names):  # drop the hidden sort columns
                node = Project(node, [(c, exp.column(c, quoted=True)) for c in node.cols[:len(names)]])
        return node, names

    def generator_names(self, e: exp.Expression) -> list[str]:
        """The output names of a generator in the SELECT list: its ``AS (a, b)`` aliases, or the names Spark
        gives (``col``, ``pos``, ``key``/``value``, struct fields, ...), which fix its arity."""
        if isinstance(e, exp.Aliases):
            return [x.name for x in e.expressions]
        defaults = generator_defaults(unalias(e))
        if defaults is None:
            raise UnsupportedError("generator", f"cannot tell how many columns {e.sql(SPARK)[:60]} returns; "
                                   "name them, e.g. posexplode(arr) AS (pos, x), or use LATERAL VIEW ... t AS "
                                   "pos, x")
        if isinstance(e, exp.Alias) and len(defaults) == 1:
            return [e.alias]
        return defaults
