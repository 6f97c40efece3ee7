"""Pure rewrites of the sqlglot AST (no schemas, no Spark), in the style of sqlglot's optimizer rules.

* :func:`mark_merged_joins` / :func:`fix_merged_join_keys` — USING and NATURAL joins. sqlglot's ``qualify``
  expands them into ``ON l.c = r.c`` and ``COALESCE(l.c, r.c, ...)`` for the merged column, but in a chain it
  keys the next join on the first table's column: ``a FULL JOIN b USING (k) JOIN c USING (k)`` becomes
  ``... ON a.k = c.k``, whereas Spark joins c on the merged column, ``COALESCE(a.k, b.k)`` (``b.k`` after a
  RIGHT join). The merged column is the left key after INNER / LEFT joins, the right key after RIGHT joins
  and ``COALESCE(left, right)`` after FULL joins.
* :func:`push_not` / :func:`conjuncts` / :func:`as_atom` — the shape of a WHERE clause with subquery
  predicates: NOT pushed down to the predicates (De Morgan, exact in three-valued logic), then the
  top-level conjuncts.
* :func:`expand_quantified` — ``x op ANY/SOME/ALL (subquery)``, which Spark SQL cannot parse, as CASE over
  two EXISTS with SQL's three-valued result, so a FULL refresh can run it.
"""

from __future__ import annotations

from sqlglot import exp

MERGED = "trickle_merged_join"

COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


# --------------------------------------------------------------------------------------------------
# USING / NATURAL joins
# --------------------------------------------------------------------------------------------------


def mark_merged_joins(tree: exp.Expression) -> None:
    """Before ``qualify``: remember which joins merge their key columns (USING, NATURAL)."""
    for j in tree.find_all(exp.Join):
        if j.args.get("using") or (j.args.get("method") or "").upper() == "NATURAL":
            j.meta[MERGED] = True


def _equalities(on: exp.Expression | None) -> list[exp.EQ]:
    if on is None:
        return []
    parts = list(on.flatten()) if isinstance(on, exp.And) else [on]
    return [p for p in parts if isinstance(p, exp.EQ) and isinstance(p.expression, exp.Column)]


def fix_merged_join_keys(tree: exp.Expression) -> exp.Expression:
    """After ``qualify``: key every USING / NATURAL join on the merged column Spark uses (see module doc)."""
    for holder in list(tree.find_all(exp.Select, exp.Table)):
        merged: dict[str, exp.Expression] = {}
        for j in holder.args.get("joins") or []:
            if not j.meta.get(MERGED):
                continue
            eqs = _equalities(j.args.get("on"))
            for eq in eqs:
                name = eq.expression.name.lower()
                if name in merged:
                    eq.set("this", merged[name].copy())
            side = (j.side or "").upper()
            for eq in eqs:
                left, right = eq.this, eq.expression
                if side == "RIGHT":
                    merged[eq.expression.name.lower()] = right.copy()
                elif side == "FULL":
                    merged[eq.expression.name.lower()] = exp.func("COALESCE", left.copy(), right.copy())
                else:
                    merged[eq.expression.name.lower()] = left.copy()
    return tree


# --------------------------------------------------------------------------------------------------
# Subquery predicates
# --------------------------------------------------------------------------------------------------


def is_subquery_predicate(e: exp.Expression) -> bool:
    """EXISTS (...), x [NOT] IN (SELECT ...), x op ANY/SOME/ALL (SELECT ...)."""
    if isinstance(e, exp.Exists):
        return True
    if isinstance(e, exp.In):
        return e.args.get("query") is not None
    return isinstance(e, COMPARISONS) and isinstance(e.expression, (exp.Any, exp.All))


def has_subquery_predicate(e: exp.Expression) -> bool:
    return any(is_subquery_predicate(n) for n in e.walk())


def predicate_of(node: exp.Expression) -> exp.Expression | None:
    """The predicate a subquery-predicate node belongs to (the comparison around ANY / ALL), or None."""
    if isinstance(node, (exp.Any, exp.All)):
        parent = node.parent
        return parent if isinstance(parent, COMPARISONS) and parent.expression is node else None
    return node if is_subquery_predicate(node) else None


def in_where_position(pred: exp.Expression) -> bool:
    """True when ``pred`` reaches a WHERE clause through AND / OR / NOT / parentheses only."""
    n = pred.parent
    while isinstance(n, (exp.And, exp.Or, exp.Not, exp.Paren)):
        n = n.parent
    return isinstance(n, exp.Where)


def push_not(e: exp.Expression, negate: bool = False) -> exp.Expression:
    """Push NOT down through AND / OR / NOT onto the subquery predicates (De Morgan; exact in SQL's
    three-valued logic). Subtrees without a subquery predicate are left as they are (negated as a whole)."""
    if isinstance(e, exp.Paren):
        return push_not(e.this, negate)
    if isinstance(e, exp.Not):
        return push_not(e.this, not negate)
    if isinstance(e, (exp.And, exp.Or)) and has_subquery_predicate(e):
        left, right = push_not(e.left, negate), push_not(e.right, negate)
        return exp.and_(left, right) if isinstance(e, exp.And) != negate else exp.or_(left, right)
    return exp.Not(this=exp.Paren(this=e)) if negate else e


def conjuncts(e: exp.Expression) -> list[exp.Expression]:
    if isinstance(e, exp.Paren):
        return conjuncts(e.this)
    if isinstance(e, exp.And):
        return conjuncts(e.left) + conjuncts(e.right)
    return [e]


def as_atom(e: exp.Expression) -> tuple[exp.Expression, bool] | None:
    """(subquery predicate, negated) when ``e`` is one, under any NOTs and parentheses; else None."""
    negated = False
    while isinstance(e, (exp.Not, exp.Paren)):
        negated ^= isinstance(e, exp.Not)
        e = e.this
    return (e, negated) if is_subquery_predicate(e) else None


def subquery_select(e: exp.Expression) -> exp.Expression:
    """The query inside a subquery operand (``(SELECT ...)`` may come wrapped in parentheses)."""
    while isinstance(e, (exp.Subquery, exp.Paren)):
        e = e.this
    return e


def is_simple_select(q: exp.Expression) -> bool:
    """A SELECT ... FROM ... [WHERE ...] whose rows map one to one to rows of its FROM clause."""
    if not isinstance(q, exp.Select):
        return False
    if any(q.args.get(k) for k in ("group", "having", "with_", "with", "limit", "offset", "qualify")):
        return False
    if any(True for e in q.expressions for _ in e.find_all(exp.AggFunc, exp.Window)):
        return False
    distinct = q.args.get("distinct")
    return not (distinct and distinct.args.get("on"))


def is_not_false(e: exp.Expression) -> exp.Expression:
    return exp.or_(e.copy(), exp.Is(this=exp.Paren(this=e.copy()), expression=exp.Null()))


def is_not_true(e: exp.Expression) -> exp.Expression:
    return exp.or_(exp.not_(e.copy()), exp.Is(this=exp.Paren(this=e.copy()), expression=exp.Null()))


def local_aliases(q: exp.Expression) -> set[str]:
    """Table and derived-table aliases defined anywhere inside ``q``."""
    return {n.alias_or_name.lower() for n in q.find_all(exp.Table, exp.Subquery) if n.alias_or_name}


def _exists_with(sub: exp.Expression, x: exp.Expression, cond_of: object) -> exp.Expression:
    """EXISTS over the rows of ``sub`` (one output column y) where ``cond_of(y)`` holds. The comparison is
    moved into the subquery's WHERE only when every column of ``x`` names a table outside it (an
    unqualified outer column could resolve to an inner one there); otherwise ``sub`` is a derived table."""
    q = subquery_select(sub)
    inner_names = local_aliases(q)
    outer_only = all(c.table and c.table.lower() not in inner_names for c in x.find_all(exp.Column))
    if is_simple_select(q) and len(q.expressions) == 1 and outer_only:
        inner = q.copy()
        item = inner.expressions[0]
        y = item.this if isinstance(item, exp.Alias) else item
        inner.set("expressions", [exp.Literal.number(1)])
        inner.set("distinct", None)
        inner.where(cond_of(y.copy()), copy=False)  # type: ignore[operator]
        return exp.Exists(this=inner)
    alias = exp.TableAlias(this=exp.to_identifier("__q"), columns=[exp.to_identifier("__c")])
    derived = exp.Subquery(this=q.copy(), alias=alias)
    y = exp.column("__c", table="__q")
    inner = exp.select("1").from_(derived).where(cond_of(y))  # type: ignore[operator]
    return exp.Exists(this=inner)


def expand_quantified(tree: exp.Expression) -> exp.Expression:
    """Rewrite ``x op ANY (S)`` / ``x op ALL (S)`` (Spark SQL has no quantified comparisons) as

        ANY: CASE WHEN EXISTS(S: x op y) THEN TRUE  WHEN EXISTS(S: (x op y) IS NULL) THEN NULL ELSE FALSE END
        ALL: CASE WHEN EXISTS(S: NOT (x op y)) THEN FALSE WHEN EXISTS(S: (x op y) IS NULL) THEN NULL ELSE TRUE END

    which is SQL's three-valued result wherever the predicate stands. A correlated S is inlined (its WHERE
    gets the comparison), any other S is read as a derived table."""
    null = exp.cast(exp.Null(), "BOOLEAN")

    def rewrite(n: exp.Expression) -> exp.Expression:
        if not (isinstance(n, COMPARISONS) and isinstance(n.expression, (exp.Any, exp.All))):
            return n
        q = n.expression
        x = n.this

        def cmp(y: exp.Expression) -> exp.Expression:
            return exp.Paren(this=type(n)(this=x.copy(), expression=y))

        unknown = _exists_with(q.this, x, lambda y: exp.Is(this=cmp(y), expression=exp.Null()))
        if isinstance(q, exp.Any):
            decided, value, otherwise = _exists_with(q.this, x, cmp), exp.true(), exp.false()
        else:
            decided, value, otherwise = _exists_with(q.this, x, lambda y: exp.not_(cmp(y))), exp.false(), exp.true()
        case = exp.Case(ifs=[exp.If(this=decided, true=value), exp.If(this=unknown, true=null.copy())],
                        default=otherwise)
        return exp.Paren(this=case)

    return tree.transform(rewrite, copy=False)
