"""The FROM clause: a source table becomes a Scan of the columns the scope reads, a derived table its
query's tree, a CTE reference a shared subtree (:mod:`dvm.builder.ctes`), and each JOIN folds onto what
is left of it as the join operator its kind names (RIGHT as a swapped LEFT; LATERAL in
:mod:`dvm.builder.lateral`)."""

from __future__ import annotations

from sqlglot import exp

from dvm.builder.scope import Scope
from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import AntiJoin, FullJoin, InnerJoin, LeftJoin, Node, Project, Scan, SemiJoin
from dvm.parser import is_recursive_cte


class FromClause(Scope):
    def from_item(self, item: exp.Expression, ctes: dict[str, exp.Expression], used: dict[str, list[str]]
                  ) -> tuple[Node, dict[tuple[str, str], str]]:
        alias = item.alias_or_name.lower()
        if isinstance(item, exp.Table):
            name = item.name.lower()
            if name in self.keys:
                key = self.keys[name]
                schema = self.schemas[key]
                want = {c.lower() for c in used.get(alias, [])}
                columns = [(c, self.fresh()) for c, _ in schema if c.lower() in want]
                self.types.update({i: ty for (c, ty) in schema for (c2, i) in columns if c2 == c})
                scan = Scan(key, columns, self.fresh())
                return scan, {(alias, c.lower()): i for c, i in columns}
            if not item.db and name in ctes:
                cte = self.cte_of.get(id(ctes[name]))
                if cte is not None and is_recursive_cte(cte):
                    node, names = self.recursive(cte, ctes)
                    return node, {(alias, n.lower()): c for n, c in zip(names, node.cols, strict=True)}
                ref = self.cte_ref(name, ctes)
                return ref, {(alias, n.lower()): c for n, c in zip(ref.shared.names, ref.cols, strict=True)}
            raise QueryError(f"unknown table {item.sql(SPARK)}")
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Table) and item.this.args.get("joins"):
            # a parenthesised join, ``a FULL JOIN (b LEFT JOIN c ON ...) ON ...``: same scope, nested tree
            first = item.this.copy()
            first.set("joins", None)
            node, env = self.from_item(first, ctes, used)
            return self.joins(node, env, item.this.args["joins"], ctes, used)
        if isinstance(item, exp.Subquery):
            node, names = self.query(item.this, ctes)
            return node, {(alias, n.lower()): c for n, c in zip(names, node.cols, strict=True)}
        raise UnsupportedError(item.key, f"{item.sql(SPARK)[:60]} is not supported in FROM yet")

    def joins(self, node: Node, env: dict[tuple[str, str], str], joins: list[exp.Join],
              ctes: dict[str, exp.Expression], used: dict[str, list[str]]
              ) -> tuple[Node, dict[tuple[str, str], str]]:
        """Fold ``joins`` (left to right, as SQL nests them) onto ``node``."""
        for join in joins:
            if isinstance(join.this, exp.Lateral):
                node, env = self.lateral_join(node, env, join, ctes)
                continue
            right, renv = self.from_item(join.this, ctes, used)
            env = {**env, **renv}
            on = join.args.get("on")
            cond = self.translate(on, env) if on is not None else None
            side, kind = (join.side or "").upper(), (join.kind or "").upper()
            if kind == "SEMI":
                node = SemiJoin(node, right, cond)
            elif kind == "ANTI":
                node = AntiJoin(node, right, cond)
            elif side == "LEFT":
                node = LeftJoin(node, right, cond)
            elif side == "RIGHT":
                node = self._right_join(node, right, cond)
            elif side == "FULL":
                node = FullJoin(node, right, cond)
            else:
                node = InnerJoin(node, right, cond)
        return node, env

    def _right_join(self, left: Node, right: Node, cond: exp.Expression | None) -> Node:
        """A RIGHT join is a LEFT join with the sides swapped, projected back into the written order."""
        swapped = LeftJoin(right, left, cond)
        return Project(swapped, [(c, exp.column(c, quoted=True)) for c in left.cols + right.cols])
