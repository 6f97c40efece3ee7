"""Generators and LATERAL items: ``LATERAL VIEW f(...)`` becomes a Generate over the FROM clause's rows,
``JOIN LATERAL (subquery | function)`` a LateralJoin whose item reads the left input's columns through
``__l`` and whose inner sources are marked with the condition a changed row needs to reach a left row
(see :mod:`dvm.operators.lateral`)."""

from __future__ import annotations

from sqlglot import exp

from dvm import rewrite
from dvm.builder.scope import Scope
from dvm.builder.syntax import tie_break
from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import Generate, LateralJoin, Node, Scan
from dvm.operators.lateral import LEFT, InnerSource


class LateralClause(Scope):
    def lateral_view(self, node: Node, env: dict[tuple[str, str], str], lat: exp.Lateral
                     ) -> tuple[Node, dict[tuple[str, str], str]]:
        """``LATERAL VIEW [OUTER] f(...) t AS c1, c2``: Generate over the FROM clause's rows."""
        alias = lat.args.get("alias")
        cols = [c.name for c in alias.columns] if alias is not None else []
        if not cols:
            raise UnsupportedError("LATERAL VIEW", f"name the columns of {lat.sql(SPARK)[:60]}: LATERAL VIEW "
                                   "explode(arr) t AS x (posexplode: AS pos, x); the defaults depend on types "
                                   "the query does not show")
        out = [self.fresh() for _ in cols]
        node = Generate(node, self.translate(lat.this, env), bool(lat.args.get("outer")), out)
        table = alias.name.lower() if alias is not None else ""
        return node, {**env, **{(table, c.lower()): o for c, o in zip(cols, out, strict=True)}}

    def lateral_join(self, node: Node, env: dict[tuple[str, str], str], join: exp.Join,
                     ctes: dict[str, exp.Expression]) -> tuple[Node, dict[tuple[str, str], str]]:
        """``L [CROSS | LEFT] JOIN LATERAL item [ON θ]`` (``L, LATERAL item`` too): a LateralJoin whose item
        references L's columns through ``__l`` (see :mod:`dvm.operators.lateral`)."""
        lat = join.this
        assert isinstance(lat, exp.Lateral)
        alias = lat.args.get("alias")
        table = alias.name.lower() if alias is not None else ""
        names = [c.name for c in alias.columns] if alias is not None else []
        item = lat.this.copy()
        if isinstance(item, exp.Subquery):
            body = item.this
            first = body
            while isinstance(first, exp.SetOperation):
                first = first.this
            if not names:
                names = [e.alias_or_name for e in first.expressions] if isinstance(first, exp.Select) else []
            if not names:
                raise UnsupportedError("LATERAL", "name the columns of the LATERAL subquery: LATERAL (...) AS "
                                       "t(a, b)")
            item.set("alias", None)
            self.inline_ctes(item, ctes)
            tie_break(body)
        elif isinstance(item, exp.Func):
            if not names:
                raise UnsupportedError("LATERAL", f"name the columns of {lat.sql(SPARK)[:60]}: LATERAL "
                                       "explode(arr) AS t(x)")
        else:
            raise UnsupportedError("LATERAL", f"LATERAL {item.sql(SPARK)[:60]} is not supported; use a "
                                   "subquery or a table function")
        inner = self.inner_sources(item, env)
        item = self.outer_refs(item, env)
        out = [self.fresh() for _ in names]
        renv = {**env, **{(table, n.lower()): o for n, o in zip(names, out, strict=True)}}
        on = join.args.get("on")
        cond = None if on is None or (isinstance(on, exp.Boolean) and on.this is True) else self.translate(on, renv)
        kind = "LEFT" if (join.side or "").upper() == "LEFT" else ("INNER" if cond is not None else "CROSS")
        return LateralJoin(node, item, out, kind, cond, inner), renv

    def inline_ctes(self, item: exp.Expression, ctes: dict[str, exp.Expression]) -> None:
        """References to the query's CTEs inside a LATERAL item become derived tables (the item is rendered
        as SQL of its own, outside the WITH clause)."""
        local = {c.alias_or_name.lower() for c in item.find_all(exp.CTE)}
        for _ in range(32):
            refs = [t for t in item.find_all(exp.Table) if not t.db and t.name.lower() in ctes
                    and t.name.lower() not in local and t.name.lower() not in self.keys]
            if not refs:
                return
            for t in refs:
                alias = exp.TableAlias(this=exp.to_identifier(t.alias_or_name))
                t.replace(exp.Subquery(this=ctes[t.name.lower()].copy(), alias=alias))
        raise QueryError("CTEs nested too deeply inside a LATERAL subquery")

    def inner_sources(self, item: exp.Expression, env: dict[tuple[str, str], str]) -> list[InnerSource]:
        """Every source the LATERAL item reads, replaced in ``item`` by a mark, with the condition a changed
        row must meet to reach a left row (see :mod:`dvm.operators.lateral`)."""
        outer = {t for t, _ in env}
        local = rewrite.local_aliases(item)
        top = item.this if isinstance(item, exp.Subquery) else None
        direct: set[int] = set()
        conjs: list[exp.Expression] = []
        if isinstance(top, exp.Select):
            joins = top.args.get("joins") or []
            if all((j.side or "") == "" and (j.kind or "").upper() in ("", "INNER", "CROSS") and
                   not isinstance(j.this, exp.Lateral) for j in joins):
                from_ = top.args.get("from_") or top.args.get("from")
                direct = {id(x) for x in [from_.this if from_ else None] + [j.this for j in joins]
                          if isinstance(x, exp.Table)}
                where = top.args.get("where")
                conjs = rewrite.conjuncts(where.this) if where is not None else []
                conjs += [c for j in joins if j.args.get("on") is not None for c in rewrite.conjuncts(j.args["on"])]
        conjs = [c for c in conjs if not any(True for _ in c.find_all(exp.Query, exp.Subquery))]
        out: list[InnerSource] = []
        for t in list(item.find_all(exp.Table)):
            name = t.name.lower()
            if name not in self.keys:
                if not t.db and name not in {c.alias_or_name.lower() for c in item.find_all(exp.CTE)}:
                    raise QueryError(f"unknown table {t.sql(SPARK)} in a LATERAL item")
                continue
            key = self.keys[name]
            alias = t.alias_or_name.lower()
            refs = {c.name.lower() for c in item.find_all(exp.Column) if (c.table or '').lower() == alias}
            columns = [(c, self.fresh()) for c, _ in self.schemas[key] if c.lower() in refs]
            scan = Scan(key, columns, self.fresh())
            filt = None
            if id(t) in direct:
                senv = {**{k: v for k, v in env.items() if k[0] not in local},
                        **{(alias, c.lower()): i for c, i in columns}}

                def reaches(c: exp.Expression, alias: str = alias) -> bool:
                    cols = list(c.find_all(exp.Column))
                    return bool(cols) and all(
                        x.table and (x.table.lower() == alias or x.table.lower() in outer - local) for x in cols)

                mine = [c for c in conjs if reaches(c)]
                filt = self.translate(exp.and_(*mine), senv) if mine else None
            mark = f"__trickle_lat_{self.fresh()}__"
            rewrite.retarget(t, mark)
            out.append(InnerSource(scan, mark, filt))
        return out

    def outer_refs(self, item: exp.Expression, env: dict[tuple[str, str], str]) -> exp.Expression:
        """The item with every reference to a column of the left input rewritten to ``__l.<internal>``."""
        local = rewrite.local_aliases(item)

        def fix(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and n.table and n.table.lower() not in local:
                key = (n.table.lower(), n.name.lower())
                if key not in env:
                    raise QueryError(f"unknown column {n.sql(SPARK)}")
                return exp.column(env[key], table=LEFT, quoted=True)
            return n

        return item.transform(fix, copy=False)
