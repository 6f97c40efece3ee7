"""The WHERE clause: plain conjuncts become a Filter (equalities between inner-join inputs their join
conditions), a lone subquery predicate (EXISTS, IN, ANY / ALL, negated or not) a semi- or anti-join,
several or any under OR one MarkJoin with a Filter over its marks. A predicate's subquery is split into
its rows and its correlated conjuncts (:meth:`WhereClause.correlated`)."""

from __future__ import annotations

from sqlglot import exp

from dvm import rewrite
from dvm.builder.scope import Scope
from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import AntiJoin, Filter, Mark, MarkJoin, Node, SemiJoin
from dvm.operators.join import absorb_equalities


class WhereClause(Scope):
    def where(self, node: Node, pred: exp.Expression, env: dict[tuple[str, str], str],
              ctes: dict[str, exp.Expression]) -> Node:
        """WHERE: plain conjuncts become a Filter; a lone [negated] subquery predicate that is a conjunct of
        its own becomes a semi- or anti-join; several, or any under OR, share one mark join (a mark per
        predicate) and a Filter over the marks."""
        if not rewrite.has_subquery_predicate(pred):
            return self.filter(node, self.translate(pred, env))
        plain: list[exp.Expression] = []
        atoms: list[tuple[exp.Expression, bool]] = []
        mixed: list[exp.Expression] = []
        for c in rewrite.conjuncts(rewrite.push_not(pred.copy())):
            atom = rewrite.as_atom(c)
            if atom is not None:
                atoms.append(atom)
            elif rewrite.has_subquery_predicate(c):
                mixed.append(c)
            else:
                plain.append(c)
        if plain:
            node = self.filter(node, self.translate(exp.and_(*plain), env))
        if len(atoms) == 1 and not mixed:  # a lone [negated] subquery predicate: filter by semi/anti-join
            right, cond, anti = self.subquery_join(atoms[0], env, ctes)
            return (AntiJoin if anti else SemiJoin)(node, right, cond)
        # several: one mark join for all of them (stacked semi-joins would each re-read the ones below)
        marks: list[Mark] = []
        scope = dict(env)

        def to_mark(n: exp.Expression) -> exp.Expression:
            atom = rewrite.as_atom(n)
            if atom is None:
                return n
            right, cond, anti = self.subquery_join(atom, env, ctes)
            marks.append(Mark(right, cond, self.fresh()))
            scope[("", marks[-1].name)] = marks[-1].name
            ref = exp.column(marks[-1].name, quoted=True)
            return exp.not_(ref) if anti else ref

        marked = [exp.Not(this=a) if neg else a for a, neg in atoms] + mixed
        preds = [c.transform(to_mark) for c in marked]
        return Filter(MarkJoin(node, marks), self.translate(exp.and_(*preds), scope))

    @staticmethod
    def filter(node: Node, pred: exp.Expression) -> Node:
        """A WHERE predicate over ``node``: its equalities between the inputs of inner joins become their
        conditions (see :func:`absorb_equalities`), the rest a Filter."""
        rest = absorb_equalities(node, pred)
        return node if rest is None else Filter(node, rest)

    def subquery_join(self, atom: tuple[exp.Expression, bool], env: dict[tuple[str, str], str],
                      ctes: dict[str, exp.Expression]) -> tuple[Node, exp.Expression | None, bool]:
        """A subquery predicate (``negated`` when under an odd number of NOTs) as (R, θ, anti): the predicate
        is TRUE for a row of L iff some row of R satisfies θ (anti: none does).

        With m the comparison of the predicate (x = y for IN, x op y for ANY / ALL) and corr the subquery's
        correlated conjuncts: EXISTS → θ = corr; IN / ANY → θ = corr ∧ m; NOT IN / NOT ANY → anti, θ = corr ∧
        (m IS NOT FALSE); ALL → anti, θ = corr ∧ (m IS NOT TRUE); NOT ALL → θ = corr ∧ ¬m. SQL's NULL
        semantics follow: a row of R for which m is NULL blocks NOT IN and ALL, and never satisfies IN."""
        pred, negated = atom
        if isinstance(pred, exp.Exists):
            right, corr, _ = self.correlated(pred.this, env, ctes, want_select=False)
            match, quant = None, "exists"
        elif isinstance(pred, exp.In):
            right, corr, ys = self.correlated(pred.args["query"], env, ctes, want_select=True)
            xs = pred.this.expressions if isinstance(pred.this, exp.Tuple) else [pred.this]
            if len(xs) != len(ys):
                raise QueryError(f"IN compares {len(xs)} value(s) with a subquery of {len(ys)} column(s): "
                                 f"{pred.sql(SPARK)[:80]}")
            match = exp.and_(*[exp.EQ(this=self.translate(x, env), expression=y) for x, y in zip(xs, ys, strict=True)])
            quant = "any"
        else:
            q = pred.expression
            right, corr, ys = self.correlated(q.this, env, ctes, want_select=True)
            if len(ys) != 1:
                raise QueryError(f"a quantified comparison needs a one-column subquery: {pred.sql(SPARK)[:80]}")
            match = exp.Paren(this=type(pred)(this=self.translate(pred.this, env), expression=ys[0]))
            quant = "all" if isinstance(q, exp.All) else "any"
        if quant == "exists":
            extra, anti = None, negated
        elif quant == "any":
            extra, anti = (rewrite.is_not_false(match) if negated else match), negated
        else:
            extra, anti = (exp.not_(match) if negated else rewrite.is_not_true(match)), not negated
        parts = [p for p in (corr, extra) if p is not None]
        return right, (exp.and_(*parts) if parts else None), anti

    def correlated(self, sub: exp.Expression, env: dict[tuple[str, str], str], ctes: dict[str, exp.Expression],
                   want_select: bool) -> tuple[Node, exp.Expression | None, list[exp.Expression]]:
        """A predicate's subquery as (R, corr, ys): R its rows without the correlated conjuncts of its WHERE,
        corr those conjuncts (over the outer columns and R's), ys its select list over R's columns."""
        q = rewrite.subquery_select(sub)
        inner = rewrite.local_aliases(q)
        outer = {t for t, _ in env}

        def refs_outer(e: exp.Expression) -> bool:
            return any(c.table and c.table.lower() in outer and c.table.lower() not in inner
                       for c in e.find_all(exp.Column))

        if not rewrite.is_simple_select(q):
            if refs_outer(q):
                raise UnsupportedError("correlated subquery", "a correlated subquery with GROUP BY, "
                                       "aggregates, DISTINCT ON, set operations or WITH is not maintained "
                                       "differentially yet; decorrelate it into a join with a GROUP BY subquery "
                                       "in FROM, or use refresh_mode='FULL' or AUTO")
            node, _ = self.query(q, ctes)
            return node, None, [exp.column(c, quoted=True) for c in node.cols]
        assert isinstance(q, exp.Select)
        used = self.used_columns(q)
        from_ = q.args.get("from_") or q.args.get("from")
        if from_ is None:
            raise UnsupportedError("SELECT without FROM", "a subquery needs at least one source table")
        for j in q.args.get("joins") or []:
            if j.args.get("on") is not None and refs_outer(j.args["on"]):
                raise UnsupportedError("correlated subquery", "a correlation inside the ON clause of a "
                                       f"subquery ({j.args['on'].sql(SPARK)[:60]}) is not supported; move it "
                                       "to the subquery's WHERE clause or use refresh_mode='FULL' or AUTO")
        node, inner_env = self.from_item(from_.this, ctes, used)
        node, inner_env = self.joins(node, inner_env, q.args.get("joins") or [], ctes, used)
        local: list[exp.Expression] = []
        corr: list[exp.Expression] = []
        where = q.args.get("where")
        for c in rewrite.conjuncts(where.this) if where is not None else []:
            if not refs_outer(c):
                local.append(c)
            elif rewrite.has_subquery_predicate(c):
                raise UnsupportedError("correlated subquery", "a correlated condition that holds another "
                                       f"subquery predicate ({c.sql(SPARK)[:60]}) is not maintained "
                                       "differentially; use refresh_mode='FULL' or AUTO")
            else:
                corr.append(c)
        if local:
            node = self.where(node, exp.and_(*local), inner_env, ctes)
        both = {**env, **inner_env}
        cond = self.translate(exp.and_(*corr), both) if corr else None
        ys = [self.translate(e.this if isinstance(e, exp.Alias) else e, both) for e in q.expressions] if want_select else []
        return node, cond, ys
