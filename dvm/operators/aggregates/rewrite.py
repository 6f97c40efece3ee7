"""Rewrites of aggregate syntax into the forms the aggregate rules maintain. Pure sqlglot, no schemas.

:func:`normalize` (before qualification, in place):

* ``agg(args) FILTER (WHERE c)`` folds the condition into the arguments: every aggregate kept here ignores
  NULL inputs, so ``CASE WHEN c THEN x END`` drops exactly the filtered rows. ``COUNT(*) FILTER (WHERE c)``
  becomes ``COUNT(CASE WHEN c THEN 1 END)``; for MIN_BY / MAX_BY the ordering argument is guarded (rows with a
  NULL ordering are ignored); for two-variable statistics both arguments are.
* Spark spellings sqlglot does not type: ``every`` → BOOL_AND, ``some`` / ``any`` → BOOL_OR, ``std`` →
  STDDEV; ``COUNT_IF(b)`` → ``COUNT(CASE WHEN b THEN 1 END)``; ``COUNT(x, y)`` (rows where all are non-NULL)
  → ``COUNT(CASE WHEN x IS NOT NULL AND y IS NOT NULL THEN 1 END)``; IGNORE / RESPECT NULLS around
  FIRST / LAST / ANY_VALUE is dropped (they are maintained as the least non-NULL value, see
  :mod:`.extremum`).

:func:`grouping_sets` expands GROUP BY with GROUPING SETS / CUBE / ROLLUP (inline, ``WITH ROLLUP`` /
``WITH CUBE``, Hive's ``GROUP BY a, b GROUPING SETS (...)``, and cross products of several) into the list of
grouping sets. Each set becomes one branch of the aggregate (a UNION ALL of GROUP BYs with NULL for the
keys a set leaves out; ``GROUPING()`` / ``grouping_id()`` become constants per branch). More than
:data:`MAX_GROUPING_SETS` branches are refused.
"""

from __future__ import annotations

from sqlglot import exp

from dvm.dialect import SPARK
from dvm.errors import UnsupportedError

MAX_GROUPING_SETS = 64

_ANONYMOUS = {"every": exp.LogicalAnd, "some": exp.LogicalOr, "bool_and": exp.LogicalAnd,
              "bool_or": exp.LogicalOr, "std": exp.Stddev}
_PAIR = (exp.CovarPop, exp.CovarSamp, exp.Corr, exp.RegrCount, exp.RegrAvgx, exp.RegrAvgy, exp.RegrSlope,
         exp.RegrIntercept, exp.RegrR2, exp.RegrSxx, exp.RegrSyy, exp.RegrSxy)
_ORDER_FREE = (exp.First, exp.Last, exp.AnyValue, exp.FirstValue, exp.LastValue)


def _when(cond: exp.Expression, value: exp.Expression) -> exp.Expression:
    return exp.Case(ifs=[exp.If(this=cond.copy(), true=value)])


def _not_null(e: exp.Expression) -> exp.Expression:
    return exp.Not(this=exp.Is(this=e.copy(), expression=exp.Null()))


def fold_filter(agg: exp.AggFunc, cond: exp.Expression) -> exp.AggFunc:
    """``agg FILTER (WHERE cond)`` as one aggregate over guarded arguments."""

    def guard(e: exp.Expression) -> exp.Expression:
        return _when(cond, e)

    this = agg.this
    if isinstance(agg, exp.Count) and (this is None or isinstance(this, exp.Star)):
        agg.set("this", guard(exp.Literal.number(1)))
    elif isinstance(agg, (exp.ArgMax, exp.ArgMin)):
        agg.set("expression", guard(agg.expression))
    elif isinstance(agg, _PAIR) and agg.expression is not None and not isinstance(this, exp.Distinct):
        agg.set("this", guard(this))
        agg.set("expression", guard(agg.expression))
    else:
        holder = this.this if isinstance(this, exp.Order) else this
        if isinstance(holder, exp.Distinct):
            holder.set("expressions", [guard(e) for e in holder.expressions])
        elif isinstance(this, exp.Order):
            this.set("this", guard(holder))
        elif this is not None:
            agg.set("this", guard(this))
        if isinstance(agg, exp.Count) and agg.expressions:
            agg.set("expressions", [guard(e) for e in agg.expressions])
    return agg


def normalize(tree: exp.Expression) -> exp.Expression:
    """Apply the rewrites of the module docstring in place; return the tree."""

    def fix(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Filter) and isinstance(n.this, exp.AggFunc) and isinstance(n.expression, exp.Where):
            return fold_filter(n.this, n.expression.this)
        if isinstance(n, exp.Anonymous) and n.name.lower() in _ANONYMOUS and len(n.expressions) == 1:
            return _ANONYMOUS[n.name.lower()](this=n.expressions[0])
        if isinstance(n, exp.Any) and not isinstance(n.parent, (exp.Binary, exp.Predicate)):
            inner = n.this.this if isinstance(n.this, exp.Paren) else n.this
            if inner is not None and not isinstance(inner, (exp.Query, exp.Subquery)):
                return exp.LogicalOr(this=inner)
        if (isinstance(n, (exp.IgnoreNulls, exp.RespectNulls)) and isinstance(n.this, _ORDER_FREE)
                and not isinstance(n.parent, exp.Window)):  # a window's FIRST_VALUE(x) IGNORE NULLS keeps it
            return n.this
        if isinstance(n, exp.CountIf):
            return exp.Count(this=_when(n.this, exp.Literal.number(1)))
        if isinstance(n, exp.Count) and n.expressions and not isinstance(n.this, exp.Distinct):
            args = [n.this, *n.expressions]
            return exp.Count(this=_when(exp.and_(*[_not_null(a) for a in args]), exp.Literal.number(1)))
        return n

    return tree.transform(fix, copy=False)


# --------------------------------------------------------------------------------------------------
# GROUPING SETS / CUBE / ROLLUP
# --------------------------------------------------------------------------------------------------


def _set_items(item: exp.Expression) -> list[exp.Expression]:
    """One element of GROUPING SETS (...): ``(a, b)``, ``(a)``, ``a`` or ``()``."""
    if isinstance(item, (exp.Cube, exp.Rollup, exp.GroupingSets)):
        raise UnsupportedError("GROUPING SETS", f"{item.sql(SPARK)} nested inside GROUPING SETS is not "
                               "supported; list the grouping sets explicitly, or use refresh_mode='FULL' or AUTO")
    if isinstance(item, exp.Tuple):
        return list(item.expressions)
    if isinstance(item, exp.Paren):
        return [item.this]
    return [item]


def _size(kind: str, n: int) -> int:
    return 2 ** n if kind == "cube" else n + 1 if kind == "rollup" else n


def _alternatives(kind: str, exprs: list[exp.Expression]) -> list[list[exp.Expression]]:
    if kind == "rollup":
        return [exprs[:i] for i in range(len(exprs), -1, -1)]
    if kind == "cube":
        n = len(exprs)
        return [[e for j, e in enumerate(exprs) if mask >> (n - 1 - j) & 1] for mask in range(2 ** n - 1, -1, -1)]
    return [_set_items(s) for s in exprs]


def grouping_sets(group: exp.Group | None) -> tuple[list[exp.Expression], list[tuple[int, ...]] | None]:
    """The GROUP BY expressions (distinct, in the order ``grouping_id()`` numbers them) and the grouping
    sets as index tuples into them; ``None`` for a plain GROUP BY. Raises UnsupportedError past
    :data:`MAX_GROUPING_SETS` sets."""
    if group is None:
        return [], None
    items = list(group.expressions)
    plain = [e for e in items if not isinstance(e, (exp.Cube, exp.Rollup, exp.GroupingSets))]
    factors: list[tuple[str, list[exp.Expression]]] = []  # (cube | rollup | sets | plain, expressions)
    hive = group.args.get("grouping_sets") or []
    if hive:
        factors = [("sets", [s for gs in hive for s in gs.expressions])]
    elif group.args.get("rollup"):
        factors = [("rollup", plain)]
    elif group.args.get("cube"):
        factors = [("cube", plain)]
    elif len(plain) != len(items):
        for e in items:
            if isinstance(e, exp.Cube):
                factors.append(("cube", list(e.expressions)))
            elif isinstance(e, exp.Rollup):
                factors.append(("rollup", list(e.expressions)))
            elif isinstance(e, exp.GroupingSets):
                factors.append(("sets", list(e.expressions)))
            else:
                factors.append(("plain", [e]))
    else:
        return plain, None
    count = 1
    for kind, exprs in factors:
        count *= 1 if kind == "plain" else _size(kind, len(exprs))
    if count > MAX_GROUPING_SETS:
        raise UnsupportedError("GROUPING SETS", f"GROUP BY {', '.join(i.sql(SPARK) for i in items)[:80]} "
                               f"expands to {count} grouping sets, more than the limit of {MAX_GROUPING_SETS} "
                               "(each set is one branch of the maintained aggregate); list the sets you need "
                               "with GROUPING SETS (...), or use refresh_mode='FULL'")
    sets: list[list[exp.Expression]] = [[]]
    for kind, exprs in factors:
        alts = [exprs] if kind == "plain" else _alternatives(kind, exprs)
        sets = [s + a for s in sets for a in alts]
    order: dict[str, int] = {}
    all_exprs: list[exp.Expression] = []
    for e in plain + [e for s in sets for e in s]:
        key = e.sql(SPARK)
        if key not in order:
            order[key] = len(all_exprs)
            all_exprs.append(e)
    out: list[tuple[int, ...]] = []
    for s in sets:
        idx: list[int] = []
        for e in s:
            i = order[e.sql(SPARK)]
            if i not in idx:
                idx.append(i)
        out.append(tuple(sorted(idx)))
    return all_exprs, out


def grouping_bits(sets: list[tuple[int, ...]], which: list[int]) -> list[int]:
    """``grouping_id(which...)`` per grouping set: bit = 1 where the column is aggregated away, the first
    column most significant (``GROUPING(a)`` is the one-column case)."""
    out = []
    for s in sets:
        v = 0
        for i in which:
            v = (v << 1) | (0 if i in s else 1)
        out.append(v)
    return out
