"""Scalar subqueries in SELECT and WHERE, decorrelated into LEFT JOINs (pure sqlglot, after ``qualify``).

Rule. A scalar subquery S of a SELECT Q becomes a derived table joined to Q's FROM clause, and S itself
the derived table's value column; the existing join and aggregate operators then maintain it:

* uncorrelated, ``(SELECT agg FROM b WHERE p)``: ``CROSS JOIN (SELECT agg AS __v FROM b WHERE p) __sqN``
  and S → ``__sqN.__v``. A global aggregate has exactly one row (HAVING is folded into the value, below),
  so every row of Q gets the value, and the inner join's rule ΔQ × v_post + Q_post × Δv − ΔQ × Δv is
  cheaper than an outer join's; Δv is netted, so it is empty when the value did not change (a Q without
  FROM reads the derived table as its FROM);
* correlated, ``(SELECT agg FROM b WHERE p AND b.k = a.k)``: the correlated equalities become group keys,
  ``LEFT JOIN (SELECT b.k AS __k0, agg AS __v, TRUE AS __m FROM b WHERE p GROUP BY b.k) __sqN
  ON __sqN.__k0 = a.k``. A row of Q without a group (no partner, or a NULL ``a.k``) must get the value the
  aggregate has over an EMPTY input — NULL for SUM/MAX/..., but 0 for COUNT (the "count bug" of naive
  decorrelation) and an empty array for COLLECT_LIST / COLLECT_SET. So S → ``CASE WHEN __sqN.__m IS NULL
  THEN <the select expression with every aggregate replaced by its empty value> ELSE __sqN.__v END``
  (just ``__sqN.__v`` when that value is NULL anyway). A HAVING clause H folds into the value,
  ``CASE WHEN H THEN expr END``: a filtered group, or an empty input failing H, yields NULL, as SQL's "no
  row" does.

Single row. SQL fails at run time when a scalar subquery returns more than one row; a stream table
cannot fail later on data, so only subqueries that return at most one row *by construction* are accepted:
an aggregate without GROUP BY, or a GROUP BY whose keys are all correlated (fixed per outer row by the
equalities). A non-aggregate subquery (``SELECT b.v FROM b WHERE b.id = a.k``) is refused even when
``b.id`` happens to be unique: wrap the column in MAX() / ANY_VALUE(), or join the table.

Refused, with the construct named: scalar subqueries elsewhere (ON, HAVING, GROUP BY, ORDER BY) or in the
SELECT list of an aggregating query; correlation other than ANDed equalities ``inner = outer`` in the
subquery's WHERE (non-equalities, outer columns in its SELECT list, HAVING or nested subqueries);
correlation to a query further out than the enclosing one; set operations as the subquery.

Subqueries are rewritten innermost first, so a scalar subquery nested in another's WHERE is already a
join when the outer one is decorrelated. Identical subqueries of one SELECT share one join.
"""

from __future__ import annotations

import itertools

from sqlglot import exp

from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError
from dvm.rewrite import conjuncts, local_aliases, subquery_select

#: parents under which a parenthesised query is not a scalar value (``x IN (SELECT ...)`` is checked apart:
#: there the query is the ``query`` argument, while ``(SELECT ...) IN (1, 2)`` compares a scalar)
_NOT_SCALAR = (exp.From, exp.Join, exp.Exists, exp.Any, exp.All, exp.SetOperation, exp.Subquery, exp.CTE,
               exp.Lateral)

#: aggregates whose value over an empty input is not NULL (Spark's ``defaultResult``)
_EMPTY_VALUE: dict[type[exp.Expression], exp.Expression] = {
    exp.Count: exp.Literal.number(0), exp.CountIf: exp.Literal.number(0), exp.RegrCount: exp.Literal.number(0),
    exp.ApproxDistinct: exp.Literal.number(0), exp.ArrayAgg: exp.Array(), exp.ArrayUniqueAgg: exp.Array(),
}

_HINT = "; use refresh_mode='FULL' or AUTO"


def is_scalar_subquery(node: exp.Expression) -> bool:
    """A parenthesised query used as a value (not a FROM item, set operand, or IN / EXISTS operand)."""
    return (isinstance(node, exp.Subquery) and isinstance(subquery_select(node), exp.Query)
            and node.parent is not None and not isinstance(node.parent, _NOT_SCALAR)
            and not (isinstance(node.parent, exp.In) and node.arg_key == "query"))


def _enclosing_select(node: exp.Expression) -> exp.Select | None:
    n = node.parent
    while n is not None and not isinstance(n, exp.Select):
        n = n.parent
    return n


def _position(sq: exp.Expression, select: exp.Select) -> str:
    """The clause of ``select`` holding ``sq`` (its arg name: expressions, where, having, joins, ...)."""
    n = sq
    while n.parent is not select:
        n = n.parent
    return n.arg_key


#: meta key of a subquery's SQL as the user wrote it (before sources get placeholder names and qualify
#: adds aliases), for messages
SHOWN = "trickle_sql"


def remember_sql(tree: exp.Expression) -> None:
    """Before sources are renamed and the tree qualified: keep each subquery's text for messages."""
    for sq in tree.find_all(exp.Subquery):
        sq.meta[SHOWN] = subquery_select(sq).sql(SPARK)


def _shown(e: exp.Expression) -> str:
    sql = e.meta.get(SHOWN) if isinstance(e, exp.Subquery) else None
    return f"({sql or subquery_select(e).sql(SPARK)})"[:80] if isinstance(e, exp.Subquery) else e.sql(SPARK)[:80]


def _from_aliases(select: exp.Select) -> set[str]:
    """Aliases of the sources in ``select``'s own FROM clause (joins and parenthesised joins included)."""
    out: set[str] = set()

    def add(item: exp.Expression) -> None:
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Table) and item.this.args.get("joins"):
            add(item.this)
            for j in item.this.args["joins"]:
                add(j.this)
        elif item.alias_or_name:
            out.add(item.alias_or_name.lower())

    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is not None:
        add(from_.this)
    for j in select.args.get("joins") or []:
        add(j.this)
    return out


def _empty_value(value: exp.Expression) -> exp.Expression | None:
    """``value`` over an empty input: each aggregate replaced by its value over no rows; None when that
    cannot be told from the expression alone (a bare column)."""
    def sub(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.AggFunc):
            return _EMPTY_VALUE.get(type(n), exp.Null()).copy()
        return n

    out = value.copy().transform(sub)
    return None if any(True for _ in out.find_all(exp.Column)) else out


class _Decorrelator:
    def __init__(self) -> None:
        self.names = itertools.count(1)

    def select(self, select: exp.Select) -> None:
        subqueries = [sq for sq in select.find_all(exp.Subquery)
                      if is_scalar_subquery(sq) and _enclosing_select(sq) is select]
        if not subqueries:
            return
        for sq in subqueries:
            where = _position(sq, select)
            if where not in ("expressions", "where"):
                clause = {"joins": "a JOIN's ON clause", "group": "GROUP BY", "order": "ORDER BY"}.get(
                    where, where.upper())
                raise UnsupportedError("scalar subquery", f"scalar subquery {_shown(sq)} in {clause} is not "
                                       "maintained differentially; scalar subqueries are maintained in the SELECT "
                                       f"list and the WHERE clause{_HINT}")
            if where == "expressions" and (select.args.get("group") or select.args.get("having") or any(
                    True for e in select.expressions for a in e.find_all(exp.AggFunc)
                    if _enclosing_select(a) is select)):
                raise UnsupportedError("scalar subquery", f"scalar subquery {_shown(sq)} in the SELECT list of "
                                       "an aggregating query is not maintained differentially; aggregate in a "
                                       "derived table and select the subquery around it, or use refresh_mode="
                                       "'FULL' or AUTO")
        done: dict[str, exp.Expression] = {}
        for sq in subqueries:
            key = subquery_select(sq).sql(SPARK)
            if key not in done:
                done[key] = self.join(select, sq)
            value = exp.Paren(this=done[key].copy())
            alias = sq.args.get("alias")
            if alias is not None:  # ``(SELECT ...) AS m`` in the SELECT list: the alias is on the subquery
                sq.replace(exp.alias_(value, alias.name))
            else:
                sq.replace(value)

    def join(self, select: exp.Select, sq: exp.Subquery) -> exp.Expression:
        """Join the derived table of ``sq`` to ``select``; return the expression that replaces ``sq``."""
        q = subquery_select(sq)
        if not isinstance(q, exp.Select):
            raise UnsupportedError("scalar subquery", f"scalar subquery {_shown(sq)}: a set operation as a "
                                   f"scalar subquery is not maintained differentially{_HINT}")
        if len(q.expressions) != 1:
            raise QueryError(f"a scalar subquery must return one column, {_shown(sq)} returns "
                             f"{len(q.expressions)}")
        inner = local_aliases(q)
        outer = _from_aliases(select)

        def outer_cols(e: exp.Expression) -> list[exp.Column]:
            return [c for c in e.find_all(exp.Column) if c.table and c.table.lower() not in inner]

        # WHERE conjuncts: local ones stay, ``inner = outer`` ones become group keys and the join condition
        local: list[exp.Expression] = []
        keys: list[tuple[exp.Expression, exp.Expression]] = []
        for c in conjuncts(q.args["where"].this) if q.args.get("where") else []:
            if not outer_cols(c):
                local.append(c)
                continue
            sides = (c.this, c.expression) if isinstance(c, exp.EQ) else ()
            pair = [s for s in sides if not outer_cols(s)], [s for s in sides if outer_cols(s)]
            if (len(pair[0]) != 1 or len(pair[1]) != 1
                    or any(x.table.lower() in inner for x in pair[1][0].find_all(exp.Column) if x.table)
                    or any(True for _ in c.find_all(exp.Subquery, exp.Select))):
                raise UnsupportedError("correlated scalar subquery", f"correlated scalar subquery {_shown(sq)}: "
                                       f"the condition {_shown(c)} is not an equality between an inner and an "
                                       "outer expression; only ANDed equalities inner = outer in its WHERE clause "
                                       f"are maintained differentially{_HINT}")
            keys.append((pair[0][0], pair[1][0]))
        rest = q.copy()
        rest.set("where", None)
        if any(outer_cols(rest)):
            raise UnsupportedError("correlated scalar subquery", f"correlated scalar subquery {_shown(sq)} "
                                   "references the outer query outside the equalities of its WHERE clause (in its "
                                   "SELECT list, HAVING, ON or a nested subquery), which is not maintained "
                                   f"differentially{_HINT}")
        for _, o in keys:
            for c in o.find_all(exp.Column):
                if c.table.lower() not in outer:
                    raise UnsupportedError("correlated scalar subquery", f"correlated scalar subquery {_shown(sq)} "
                                           f"references {c.sql(SPARK)} of a query further out than the one it "
                                           f"stands in; only one level of correlation is maintained{_HINT}")
        # one row per outer row by construction
        group = q.args.get("group")
        if group is not None:
            if group.args.get("grouping_sets") or group.args.get("cube") or group.args.get("rollup"):
                raise UnsupportedError("scalar subquery", f"scalar subquery {_shown(sq)} with GROUPING SETS / "
                                       f"CUBE / ROLLUP can return several rows{_HINT}")
            fixed = {i.sql(SPARK) for i, _ in keys}
            loose = [g for g in group.expressions if g.sql(SPARK) not in fixed]
            if loose:
                raise UnsupportedError("scalar subquery", f"scalar subquery {_shown(sq)} groups by "
                                       f"{_shown(loose[0])}, which the outer row does not fix, so it can return "
                                       f"several rows (an error in SQL); aggregate without GROUP BY, or join it{_HINT}")
        item = q.expressions[0]
        value = item.this if isinstance(item, exp.Alias) else item
        aggregating = any(True for a in value.find_all(exp.AggFunc) if _enclosing_select(a) is q)
        if group is None and not aggregating and q.args.get("having") is None:
            raise UnsupportedError("scalar subquery", f"scalar subquery {_shown(sq)} is not an aggregate, so it "
                                   "may return several rows (an error in SQL) and is not maintained; write it as "
                                   "an aggregate without GROUP BY (MAX(x), ANY_VALUE(x) when x is unique), or join "
                                   f"the table instead{_HINT}")
        having = q.args.get("having")
        if having is not None:
            value = exp.Case(ifs=[exp.If(this=having.this.copy(), true=value.copy())])
        # a row of the outer query without a group gets the value over an empty input (not when grouped:
        # GROUP BY over no rows is no row, i.e. NULL)
        empty = _empty_value(value) if keys and group is None else None
        marker = empty is not None and not isinstance(empty, exp.Null)

        name = f"__sq{next(self.names)}"
        derived = q.copy()
        for arg in ("where", "having", "distinct", "order", "group"):
            derived.set(arg, None)
        items = [exp.alias_(i.copy(), f"__k{n}") for n, (i, _) in enumerate(keys)]
        items.append(exp.alias_(value.copy(), "__v"))
        if marker:
            items.append(exp.alias_(exp.true(), "__m"))
        derived.set("expressions", items)
        if local:
            derived.where(exp.and_(*[c.copy() for c in local]), copy=False)
        if keys:
            derived.set("group", exp.Group(expressions=[i.copy() for i, _ in keys]))
        table = exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(name)))
        cond = exp.and_(*[exp.EQ(this=exp.column(f"__k{n}", table=name), expression=o.copy())
                          for n, (_, o) in enumerate(keys)]) if keys else None
        if select.args.get("from_") is None and select.args.get("from") is None and not keys:
            select.from_(table, copy=False)
        elif keys:
            select.append("joins", exp.Join(this=table, side="LEFT", on=cond))
        else:  # exactly one row: a cross join, whose rule is cheaper than the outer join's
            select.append("joins", exp.Join(this=table))
        out = exp.column("__v", table=name)
        if marker:
            assert empty is not None
            out = exp.Case(ifs=[exp.If(this=exp.Is(this=exp.column("__m", table=name), expression=exp.Null()),
                                       true=empty)], default=out)
        return out


def decorrelate(tree: exp.Expression) -> exp.Expression:
    """Rewrite every scalar subquery of the qualified ``tree`` in place (see the module doc); raise
    UnsupportedError for the forms it cannot maintain."""
    d = _Decorrelator()
    for select in reversed(list(tree.find_all(exp.Select, bfs=False))):  # innermost first
        d.select(select)
    return tree
