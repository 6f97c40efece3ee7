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
* :func:`expand_named_windows`, :func:`eliminate_qualify`, :func:`eliminate_distinct_on` — ``OVER w``,
  QUALIFY and PostgreSQL's DISTINCT ON as plain window functions in a subquery with a WHERE on top (the
  window operator, :mod:`dvm.operators.window`, maintains them); the FULL path runs the same rewrites, so
  both read the query alike. :func:`check_limits` refuses ``FETCH ... WITH TIES`` / ``PERCENT``.
* :func:`inlined_read_counts` — how many relations Spark plans for each table of a rendered delta query,
  once it has inlined the CTEs (it inlines every deterministic one).
"""

from __future__ import annotations

from collections import Counter

import sqlglot
from sqlglot import exp

from dvm.dialect import SPARK
from dvm.errors import QueryError
from dvm.own_stack import on_own_stack

MERGED = "trickle_merged_join"

COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


# --------------------------------------------------------------------------------------------------
# USING / NATURAL joins
# --------------------------------------------------------------------------------------------------


def retarget(t: exp.Table, name: str, db: str | None = None, catalog: str | None = None) -> None:
    """Point the table reference ``t`` at ``[catalog.][db.]name`` (a placeholder, a mark replaced after
    rendering, or a view's base table), keeping the name the query refers to it by as its alias so qualified
    column references still resolve."""
    alias = t.alias_or_name
    t.set("this", exp.to_identifier(name))
    t.set("db", exp.to_identifier(db) if db else None)
    t.set("catalog", exp.to_identifier(catalog) if catalog else None)
    if not t.alias:
        t.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))


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


# --------------------------------------------------------------------------------------------------
# Window clauses: named windows, QUALIFY, DISTINCT ON
# --------------------------------------------------------------------------------------------------


def expand_named_windows(tree: exp.Expression) -> exp.Expression:
    """``f() OVER w ... WINDOW w AS (PARTITION BY .. ORDER BY ..)`` → the definition inlined into each
    ``OVER w`` (a reference's own ORDER BY / frame, ``OVER (w ORDER BY ...)``, wins over the definition's)."""
    for select in list(tree.find_all(exp.Select)):
        defs = {d.name.lower(): d for d in select.args.get("windows") or [] if isinstance(d.this, exp.Identifier)}
        if not defs:
            continue
        for w in list(select.find_all(exp.Window)):
            ref = w.args.get("alias")
            if not isinstance(ref, exp.Identifier) or ref.name.lower() not in defs or w.parent is select and \
                    w.arg_key == "windows":
                continue
            d = defs[ref.name.lower()]
            w.set("alias", None)
            for arg in ("partition_by", "order", "spec"):
                if not w.args.get(arg) and d.args.get(arg):
                    value = d.args[arg]
                    w.set(arg, [v.copy() for v in value] if isinstance(value, list) else value.copy())
        select.set("windows", None)
    return tree


def _output_ref(e: exp.Expression, selects: list[exp.Expression]) -> exp.Expression:
    """An ORDER BY / DISTINCT ON item as an expression over the FROM clause: a bare name of an output
    column, or its position, stands for the selected expression (SQL's rule for ORDER BY)."""
    if isinstance(e, exp.Literal) and e.is_int:
        i = int(e.name) - 1
        if 0 <= i < len(selects):
            s = selects[i]
            return (s.this if isinstance(s, exp.Alias) else s).copy()
    if isinstance(e, exp.Column) and not e.table:
        for s in selects:
            if isinstance(s, exp.Alias) and s.alias.lower() == e.name.lower():
                return s.this.copy()
    return e.copy()


def _pop_tail(q: exp.Select) -> dict[str, exp.Expression | None]:
    """Remove and return ORDER BY / LIMIT / OFFSET (they apply after a clause being wrapped away)."""
    out = {k: q.args.get(k) for k in ("order", "limit", "offset")}
    for k in out:
        q.set(k, None)
    return out


def _replace(tree: exp.Expression, old: exp.Expression, new: exp.Expression) -> exp.Expression:
    if old is tree:
        return new
    old.replace(new)
    return tree


def _named_selects(q: exp.Select) -> list[exp.Expression]:
    """The select list with every item aliased (an unaliased column keeps its name)."""
    out: list[exp.Expression] = []
    taken = {s.alias_or_name.lower() for s in q.selects if s.alias_or_name}
    for i, s in enumerate(q.selects):
        if isinstance(s, exp.Alias):
            out.append(s)
            continue
        name = s.name if isinstance(s, exp.Column) else ""
        if not name:
            name = f"_col{i}"
            while name.lower() in taken:
                name = "_" + name
            taken.add(name.lower())
        out.append(exp.alias_(s, name, quoted=isinstance(s, exp.Column) and bool(s.this.args.get("quoted"))))
    return out


def eliminate_distinct_on(tree: exp.Expression) -> exp.Expression:
    """PostgreSQL's ``SELECT DISTINCT ON (e..) cols FROM .. ORDER BY k..`` → the first row of each group:

        SELECT cols FROM (SELECT cols, ROW_NUMBER() OVER (PARTITION BY e.. ORDER BY k..) AS __trickle_rn
                          FROM ..) __trickle_don WHERE __trickle_rn = 1

    Names and positions of output columns in ``e``/``k`` stand for the selected expressions (PostgreSQL's
    rule). Without ORDER BY the row kept is arbitrary in PostgreSQL; here ROW_NUMBER's tie-breaker picks one
    deterministically. A LIMIT / OFFSET stays on the outer query, after the DISTINCT ON, ordered by the same
    keys (carried out of the subquery as hidden columns). sqlglot's own transform drops the ORDER BY of a
    LIMIT and keeps its window column under ``SELECT *``; hence this one."""
    for q in reversed(list(tree.find_all(exp.Select, bfs=False))):
        distinct = q.args.get("distinct")
        on = distinct.args.get("on") if distinct is not None else None
        if on is None:
            continue
        if any(s.is_star for s in q.selects):
            raise QueryError("SELECT DISTINCT ON (...) * is not supported: list the selected columns")
        selects = list(q.selects)
        part = [_output_ref(e, selects) for e in (on.expressions if isinstance(on, exp.Tuple) else [on])]
        inner = q.copy()
        tail = _pop_tail(inner)
        with_ = inner.args.get("with_") or inner.args.get("with")
        inner.set("with_", None)
        inner.set("with", None)
        inner.set("distinct", None)
        order = tail["order"]
        keys = ([exp.Ordered(this=_output_ref(o.this, selects), desc=o.args.get("desc"),
                             nulls_first=o.args.get("nulls_first")) for o in order.expressions]
                if order is not None else [exp.Ordered(this=p.copy()) for p in part])
        named = _named_selects(inner)
        rn = "__trickle_rn"
        window = exp.Window(this=exp.RowNumber(), partition_by=part, order=exp.Order(expressions=keys))
        hidden = []
        if tail["limit"] is not None or tail["offset"] is not None:
            hidden = [exp.alias_(k.this.copy(), f"__trickle_ok{i}") for i, k in enumerate(keys)]
        inner.set("expressions", named + [exp.alias_(window, rn)] + hidden)
        outer = exp.select(*[exp.column(s.alias, quoted=bool(s.args["alias"].args.get("quoted"))) for s in named])
        outer = outer.from_(inner.subquery("__trickle_don")).where(exp.column(rn).eq(1))
        if hidden:
            if order is not None:
                outer.set("order", exp.Order(expressions=[
                    exp.Ordered(this=exp.column(f"__trickle_ok{i}"), desc=k.args.get("desc"),
                                nulls_first=k.args.get("nulls_first")) for i, k in enumerate(keys)]))
            outer.set("limit", tail["limit"])
            outer.set("offset", tail["offset"])
        if with_ is not None:
            outer.set("with_", with_)
        tree = _replace(tree, q, outer)
    return tree


def eliminate_qualify(tree: exp.Expression) -> exp.Expression:
    """``SELECT .. QUALIFY pred`` → ``SELECT .. FROM (SELECT .., windows of pred) WHERE pred`` (sqlglot's
    transform), with ORDER BY / LIMIT / OFFSET moved to the outer query: they apply after QUALIFY, and
    sqlglot would leave them inside. ``SELECT *`` with QUALIFY is refused (the window column would leak)."""
    from sqlglot import transforms

    for q in reversed(list(tree.find_all(exp.Select, bfs=False))):
        if not q.args.get("qualify"):
            continue
        if any(s.is_star for s in q.selects):
            raise QueryError("SELECT * with QUALIFY is not supported: list the selected columns")
        inner = q.copy()
        tail = _pop_tail(inner)
        with_ = inner.args.get("with_") or inner.args.get("with")
        inner.set("with_", None)
        inner.set("with", None)
        outer = transforms.eliminate_qualify(inner)
        for k, v in tail.items():
            if v is not None:
                outer.set(k, v)
        if with_ is not None:
            outer.set("with_", with_)
        tree = _replace(tree, q, outer)
    return tree


def check_limits(tree: exp.Expression) -> None:
    """FETCH .. WITH TIES / PERCENT: Spark has neither, and sqlglot would silently drop them."""
    for f in tree.find_all(exp.Fetch):
        opts = f.args.get("limit_options")
        if opts is not None and (opts.args.get("with_ties") or opts.args.get("percent")):
            raise QueryError(f"{f.sql()} is not supported (Spark has no WITH TIES / PERCENT); use ORDER BY ... "
                             "LIMIT n, or RANK() OVER (ORDER BY ...) <= n in an outer query to keep the ties")


# --------------------------------------------------------------------------------------------------
# Reads of a relation after CTE inlining
# --------------------------------------------------------------------------------------------------


class _ReadsUnknown(Counter[tuple[str, str]]):
    """The counts of a delta query nested too deeply to parse again from the refresh's stack (a defining
    query near :data:`dvm.parser.MAX_NESTING`, wrapped in a few levels more): every table counts as read
    twice, so every held read stays held. Correct, only without the saving; the refresh must not fail."""

    def __missing__(self, key: tuple[str, str]) -> int:
        return 2


def inlined_read_counts(sql: str) -> Counter[tuple[str, str]]:
    """How often Spark's plan of ``sql`` reads each qualified table ``(db, name)`` once CTEs are inlined: a
    reference in a CTE counts as often as the CTE is itself read, scoped like SQL (a nested WITH sees the
    outer CTEs). All tables in one parse: a delta query can be tens of kilobytes long, and parsing it once
    per table was a cost of every refresh.

    The walk keeps its own stack instead of recursing: a long chain of ``OR`` / ``AND`` / ``+`` is a tree
    thousands of nodes deep (sqlglot parses and renders such chains without recursion), and a recursive
    walk failed every refresh of a query that created fine. Work items run in the recursive walk's order
    (a CTE is counted before anything after it reads its counter), and every CTE sees the ones before it."""
    try:
        tree = on_own_stack(lambda: sqlglot.parse_one(sql, read=SPARK))
    except RecursionError:
        return _ReadsUnknown()
    reads: Counter[tuple[str, str]] = Counter()
    Env = dict[str, Counter[tuple[str, str]]]
    stack: list[tuple[exp.Expression, Env, Counter[tuple[str, str]]]] = [(tree, {}, reads)]
    while stack:
        node, env, acc = stack.pop()
        if isinstance(node, exp.Table):
            if node.db:
                acc[(node.db, node.name)] += 1
                continue
            if node.name in env:
                acc.update(env[node.name])
                continue
        todo: list[tuple[exp.Expression, Env, Counter[tuple[str, str]]]] = []
        with_ = node.args.get("with_")
        if isinstance(with_, exp.With):
            for cte in with_.expressions:
                env = {**env, cte.alias: Counter()}
                todo.append((cte.this, env, env[cte.alias]))
        for key, value in node.args.items():
            if key == "with_":
                continue
            todo.extend((child, env, acc) for child in (value if isinstance(value, list) else [value])
                        if isinstance(child, exp.Expression))
        stack.extend(reversed(todo))
    return reads
