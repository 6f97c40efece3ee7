"""SQL text → logical operator tree.

sqlglot parses the defining query (Spark dialect by default) and qualifies every column against the
sources' schemas; this module then walks the qualified AST into the operator tree of :mod:`dvm.operators`,
renaming every column to a unique internal name so that generated SQL never has to qualify a column.
Constructs the tree cannot maintain raise :class:`~dvm.errors.UnsupportedError` with a hint.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.qualify import qualify

import dvm.operators.aggregates as aggregates
from dvm import rewrite
from dvm.context import quote
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import (
    AggCall,
    Aggregate,
    AntiJoin,
    Filter,
    FullJoin,
    InnerJoin,
    LeftJoin,
    Mark,
    MarkJoin,
    Node,
    Project,
    RecursiveCte,
    Scan,
    SemiJoin,
    UnionAll,
)
from dvm.operators.recursive import analyze_step

#: functions whose value changes between evaluations: a delta computed with them would not add up
VOLATILE = {
    "rand", "random", "randn", "uuid", "shuffle", "current_timestamp", "now", "current_date",
    "curdate", "localtimestamp", "unix_timestamp", "monotonically_increasing_id", "spark_partition_id",
    "input_file_name", "current_time", "try_reflect", "reflect", "java_method", "randstr", "uniform",
}
VOLATILE_EXP = (exp.Rand, exp.Randn, exp.CurrentTimestamp, exp.CurrentDate, exp.Uuid)

#: aggregate functions maintained differentially (sqlglot node -> canonical name); see dvm.operators.aggregates
AGG_FUNCS: dict[type[exp.Expression], str] = aggregates.FUNCTIONS


def table_key(table: exp.Table) -> str:
    """The normalised name of a source as written in the query: ``db.table`` or ``table``, lower case."""
    return ".".join(p.name for p in table.parts).lower()


def parse(sql: str, dialect: str = "spark") -> exp.Expression:
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as e:
        raise QueryError(f"invalid SQL: {e}") from None
    if len(statements) != 1:
        raise QueryError(f"the defining query must be exactly one SELECT statement, got {len(statements)}")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise QueryError(f"the defining query must be a SELECT query, got {tree.key.upper()}")
    return tree


def cte_names(tree: exp.Expression) -> set[str]:
    return {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}


def source_tables(tree: exp.Expression) -> list[exp.Table]:
    """Table references that name real sources (not CTEs)."""
    ctes = cte_names(tree)
    out = []
    for t in tree.find_all(exp.Table):
        if not t.name or isinstance(t.this, exp.Func):
            continue
        if not t.db and t.name.lower() in ctes:
            continue
        out.append(t)
    return out


def source_keys(sql: str, dialect: str = "spark") -> list[str]:
    """The distinct sources a query reads, in order of first appearance."""
    seen: dict[str, None] = {}
    for t in source_tables(parse(sql, dialect)):
        seen.setdefault(table_key(t), None)
    return list(seen)


def is_recursive_cte(cte: exp.CTE) -> bool:
    """A CTE of a ``WITH RECURSIVE`` list whose body reads its own name (the list may hold plain CTEs)."""
    w = cte.parent
    if not isinstance(w, exp.With) or not w.args.get("recursive"):
        return False
    name = cte.alias_or_name.lower()
    return any(t.name.lower() == name and not t.db for t in cte.this.find_all(exp.Table))


def _reject_always(node: exp.Expression) -> None:
    """Constructs refused everywhere, recursive CTE bodies included: their value is not a function of the
    sources' snapshots, so no delta of them adds up."""
    if isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)):
        raise UnsupportedError("LIMIT", "LIMIT/OFFSET cannot be maintained differentially (TopK is not "
                               "supported yet); drop the LIMIT or use refresh_mode='FULL'")
    if isinstance(node, exp.TableSample):
        raise UnsupportedError("TABLESAMPLE", "TABLESAMPLE is random, so a stream table cannot be kept "
                               "equal to its query; sample the source into a table instead")
    if isinstance(node, VOLATILE_EXP) or (isinstance(node, exp.Func) and node.name.lower() in VOLATILE):
        name = node.sql("spark").split("(")[0]
        raise UnsupportedError("volatile function", f"non-deterministic function {name}() gives a "
                               "different value at every evaluation, so its deltas do not add up; "
                               "compute it in the source table, or use refresh_mode='FULL'")


def reject_unsupported(tree: exp.Expression) -> None:
    """Fail on constructs the operator tree cannot maintain, naming them and saying what to do.

    The body of a recursive CTE is not built into operators (Spark evaluates it, see
    :mod:`dvm.operators.recursive`): only :func:`_reject_always` applies inside it; its anchor is checked
    again when it is built."""
    inside = {id(n) for cte in tree.find_all(exp.CTE) if is_recursive_cte(cte) for n in cte.this.walk()}
    for node in tree.walk():
        if id(node) in inside:
            _reject_always(node)
            continue
        if isinstance(node, exp.Window):
            raise UnsupportedError("window function", f"window functions ({node.sql('spark')}) are not "
                                   "maintained differentially yet; use refresh_mode='FULL' or AUTO")
        _reject_always(node)
        if isinstance(node, (exp.Lateral, exp.Unnest, exp.Explode)):
            raise UnsupportedError("LATERAL", "LATERAL / explode is not maintained differentially yet; use "
                                   "refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Intersect, exp.Except)):
            raise UnsupportedError(node.key.upper(), f"{node.key.upper()} is not maintained differentially "
                                   "yet; use refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Exists, exp.Any, exp.All)) or (
            isinstance(node, exp.In) and node.args.get("query") is not None
        ):
            pred = rewrite.predicate_of(node)
            if pred is None or not rewrite.in_where_position(pred):
                raise UnsupportedError("subquery predicate", f"subquery predicate {node.sql('spark')[:80]} is "
                                       "maintained differentially only in a WHERE clause, combined with AND / "
                                       "OR / NOT (not in SELECT, ON, HAVING or inside other expressions); "
                                       "move it there or use refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.Subquery) and not isinstance(
            node.parent, (exp.From, exp.Join, exp.In, exp.Exists, exp.Any, exp.All, exp.SetOperation,
                          exp.Subquery, exp.CTE)
        ) and node.parent is not None:
            raise UnsupportedError("scalar subquery", f"scalar subquery {node.sql('spark')[:80]} is not "
                                   "maintained differentially yet; join the subquery in FROM instead (e.g. "
                                   "CROSS JOIN (SELECT ... ) for an uncorrelated one) or use "
                                   "refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.Group):
            aggregates.grouping_sets(node)  # refuses more than MAX_GROUPING_SETS branches
        if (isinstance(node, exp.AggFunc) and type(node) not in AGG_FUNCS
                and not isinstance(node, aggregates.GROUPING_FUNCS)):
            raise aggregates.unsupported(f"aggregate {node.key}", node.sql("spark")[:60],
                                         aggregates.HINTS.get(type(node), ""))
        if isinstance(node, exp.Anonymous) and node.name.lower() in aggregates.UNTYPED_AGGREGATES:
            raise aggregates.unsupported(f"aggregate {node.name.lower()}", node.sql("spark")[:60])
        if isinstance(node, exp.WithinGroup):
            raise aggregates.unsupported(f"aggregate {node.this.key}", aggregates.shown(node),
                                         aggregates.HINTS.get(type(node.this), "WITHIN GROUP is supported "
                                                              "for STRING_AGG / LISTAGG only"))
        if isinstance(node, exp.Filter):  # left over by aggregates.normalize: not on a maintained aggregate
            raise UnsupportedError("aggregate FILTER", f"FILTER on {node.this.sql('spark')[:60]} is not "
                                   "maintained differentially; use CASE WHEN inside the aggregate")
        if isinstance(node, exp.Join):
            side, kind = (node.side or "").upper(), (node.kind or "").upper()
            method = (node.args.get("method") or "").upper()
            if method not in ("", "NATURAL") or (side == "RIGHT" and kind in ("SEMI", "ANTI")):
                what = " ".join(x for x in (method, side, kind) if x)
                raise UnsupportedError(f"{what} JOIN", f"{what} JOIN is not maintained differentially yet; "
                                       "use refresh_mode='FULL' or AUTO")


class _Builder:
    """Walks one qualified query; hands out unique internal column names."""

    def __init__(self, keys: dict[str, str], schemas: Mapping[str, list[tuple[str, str]]]) -> None:
        self.keys = keys  # placeholder table name -> source key
        self.schemas = schemas  # source key -> [(column, type)]
        self.counter = 0
        self.notes: list[str] = []
        self.cte_of: dict[int, exp.CTE] = {}  # id(CTE body) -> its CTE node (column list, WITH RECURSIVE)

    def fresh(self) -> str:
        self.counter += 1
        return f"__t{self.counter}"

    # --- queries ---

    def query(self, q: exp.Expression, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        """Build ``q``; return its node and its output names (positional to ``node.cols``)."""
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes)
        if isinstance(q, exp.Union):
            return self.union(q, ctes)
        if isinstance(q, exp.Select):
            return self.select(q, ctes)
        raise UnsupportedError(q.key, f"{q.key.upper()} is not supported in a defining query")

    def union(self, q: exp.Union, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        ctes = self.with_ctes(q, ctes)
        left, names = self.query(q.this, ctes)
        right, rnames = self.query(q.expression, ctes)
        if len(left.cols) != len(right.cols):
            raise QueryError(f"UNION branches have {len(left.cols)} and {len(right.cols)} columns")
        node: Node = UnionAll([left, right], [self.fresh() for _ in left.cols])
        if q.args.get("distinct"):
            node = Aggregate(node, [(self.fresh(), exp.column(c, quoted=True)) for c in node.cols], [])
        return node, names

    def with_ctes(self, q: exp.Expression, ctes: dict[str, exp.Expression]) -> dict[str, exp.Expression]:
        w = q.args.get("with_") or q.args.get("with")
        if not w:
            return ctes
        out = dict(ctes)
        for cte in w.expressions:
            out[cte.alias_or_name.lower()] = cte.this
            self.cte_of[id(cte.this)] = cte
        return out

    def select(self, q: exp.Select, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        ctes = self.with_ctes(q, ctes)
        if q.args.get("order"):
            self.notes.append("ORDER BY without LIMIT is ignored: a table has no order")
        if q.args.get("distinct") and q.args["distinct"].args.get("on"):
            raise UnsupportedError("DISTINCT ON", "DISTINCT ON is not supported yet; use ROW_NUMBER()")
        used = self.used_columns(q)
        env: dict[tuple[str, str], str] = {}
        from_ = q.args.get("from_") or q.args.get("from")
        if from_ is None:
            raise UnsupportedError("SELECT without FROM", "a defining query needs at least one source table")
        node, env = self.from_item(from_.this, ctes, used)
        node, env = self.joins(node, env, q.args.get("joins") or [], ctes, used)
        where = q.args.get("where")
        if where is not None:
            node = self.where(node, where.this, env, ctes)
        selects = q.expressions
        having = q.args.get("having")
        group = q.args.get("group")
        has_aggs = any(self.aggs_in(e) for e in selects) or (having is not None and self.aggs_in(having))
        if group is not None or has_aggs:
            node, post = self.aggregate(node, q, env)
            if having is not None:
                node = Filter(node, post(having.this))
            items = [(self.fresh(), post(e.this if isinstance(e, exp.Alias) else e)) for e in selects]
        else:
            if having is not None:
                raise QueryError("HAVING without GROUP BY or aggregate")
            items = [(self.fresh(), self.translate(e.this if isinstance(e, exp.Alias) else e, env))
                     for e in selects]
        names = [e.alias_or_name for e in selects]
        node = Project(node, items)
        if q.args.get("distinct"):
            node = Aggregate(node, [(self.fresh(), exp.column(c, quoted=True)) for c in node.cols], [])
        return node, names

    def _right_join(self, left: Node, right: Node, cond: exp.Expression | None) -> Node:
        """A RIGHT join is a LEFT join with the sides swapped, projected back into the written order."""
        swapped = LeftJoin(right, left, cond)
        return Project(swapped, [(c, exp.column(c, quoted=True)) for c in left.cols + right.cols])

    # --- joins and WHERE-clause subqueries ---

    def joins(self, node: Node, env: dict[tuple[str, str], str], joins: list[exp.Join],
              ctes: dict[str, exp.Expression], used: dict[str, list[str]]
              ) -> tuple[Node, dict[tuple[str, str], str]]:
        """Fold ``joins`` (left to right, as SQL nests them) onto ``node``."""
        for join in joins:
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

    def where(self, node: Node, pred: exp.Expression, env: dict[tuple[str, str], str],
              ctes: dict[str, exp.Expression]) -> Node:
        """WHERE: plain conjuncts become a Filter; a lone [negated] subquery predicate that is a conjunct of
        its own becomes a semi- or anti-join; several, or any under OR, share one mark join (a mark per
        predicate) and a Filter over the marks."""
        if not rewrite.has_subquery_predicate(pred):
            return Filter(node, self.translate(pred, env))
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
            node = Filter(node, self.translate(exp.and_(*plain), env))
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
                                 f"{pred.sql('spark')[:80]}")
            match = exp.and_(*[exp.EQ(this=self.translate(x, env), expression=y) for x, y in zip(xs, ys, strict=True)])
            quant = "any"
        else:
            q = pred.expression
            right, corr, ys = self.correlated(q.this, env, ctes, want_select=True)
            if len(ys) != 1:
                raise QueryError(f"a quantified comparison needs a one-column subquery: {pred.sql('spark')[:80]}")
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
                                       f"subquery ({j.args['on'].sql('spark')[:60]}) is not supported; move it "
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
                                       f"subquery predicate ({c.sql('spark')[:60]}) is not maintained "
                                       "differentially; use refresh_mode='FULL' or AUTO")
            else:
                corr.append(c)
        if local:
            node = self.where(node, exp.and_(*local), inner_env, ctes)
        both = {**env, **inner_env}
        cond = self.translate(exp.and_(*corr), both) if corr else None
        ys = [self.translate(e.this if isinstance(e, exp.Alias) else e, both) for e in q.expressions] if want_select else []
        return node, cond, ys

    # --- FROM items ---

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
                scan = Scan(key, columns, self.fresh())
                return scan, {(alias, c.lower()): i for c, i in columns}
            if not item.db and name in ctes:
                cte = self.cte_of.get(id(ctes[name]))
                if cte is not None and is_recursive_cte(cte):
                    node, names = self.recursive(cte, ctes)
                else:
                    node, names = self.query(ctes[name], ctes)
                return node, {(alias, n.lower()): c for n, c in zip(names, node.cols, strict=True)}
            raise QueryError(f"unknown table {item.sql('spark')}")
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Table) and item.this.args.get("joins"):
            # a parenthesised join, ``a FULL JOIN (b LEFT JOIN c ON ...) ON ...``: same scope, nested tree
            first = item.this.copy()
            first.set("joins", None)
            node, env = self.from_item(first, ctes, used)
            return self.joins(node, env, item.this.args["joins"], ctes, used)
        if isinstance(item, exp.Subquery):
            node, names = self.query(item.this, ctes)
            return node, {(alias, n.lower()): c for n, c in zip(names, node.cols, strict=True)}
        raise UnsupportedError(item.key, f"{item.sql('spark')[:60]} is not supported in FROM yet")

    def recursive(self, cte: exp.CTE, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        """A recursive CTE read in FROM: a :class:`RecursiveCte` over its anchor and recursive term."""
        name = cte.alias_or_name.lower()
        body = cte.this
        if not isinstance(body, exp.Union) or any(
            t.name.lower() == name and not t.db for t in body.this.find_all(exp.Table)
        ):
            raise QueryError(f"recursive CTE {name} must be <anchor> UNION [ALL] <recursive term>, the anchor "
                             "not reading the CTE itself")
        anchor, step = body.this, body.expression
        alias = cte.args.get("alias")
        columns = [c.name for c in alias.columns] if alias is not None and alias.columns else select_names(anchor)
        # other CTEs the body reads (transitively), in definition order, rendered natively beside it
        needed: set[str] = set()
        todo = [body]
        while todo:
            for t in todo.pop().find_all(exp.Table):
                n = t.name.lower()
                if not t.db and n in ctes and n != name and n not in needed:
                    needed.add(n)
                    todo.append(ctes[n])
        helpers = []
        for n, b in ctes.items():
            if n in needed:
                c = self.cte_of.get(id(b))
                cols = c.args.get("alias") if c is not None else None
                head = quote(n) + (f"({', '.join(quote(x.name) for x in cols.columns)})"
                                   if cols is not None and cols.columns else "")
                helpers.append((head, b))
        anchor_node: Node | None
        try:
            reject_unsupported(anchor)
            anchor_node, _ = self.query(anchor, ctes)
        except UnsupportedError as e:
            anchor_node = None
            self.notes.append(f"recursive CTE {name}: its anchor is diffed by evaluating it twice ({e})")
        if anchor_node is not None and len(anchor_node.cols) != len(columns):
            raise QueryError(f"recursive CTE {name} names {len(columns)} columns but its anchor has "
                             f"{len(anchor_node.cols)}")
        shape, reason = analyze_step(step, name, self.keys, self.schemas)
        node = RecursiveCte(name, columns, [self.fresh() for _ in columns], anchor, step,
                            bool(body.args.get("distinct")), dict(self.keys),
                            {k: [c for c, _ in cols] for k, cols in self.schemas.items()}, helpers,
                            anchor_node, shape, reason)
        return node, columns

    @staticmethod
    def scope_nodes(q: exp.Select):
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
            if isinstance(n, (exp.Select, exp.Union)) or (
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
        where = q.args.get("where")
        for n in where.find_all(exp.Column) if where is not None else []:  # correlated references too
            if n.table:
                out.setdefault(n.table.lower(), []).append(n.name)
        return out

    # --- expressions ---

    def translate(self, e: exp.Expression, env: dict[tuple[str, str], str]) -> exp.Expression:
        def fix(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                key = (n.table.lower(), n.name.lower())
                if key not in env:
                    raise QueryError(f"unknown column {n.sql('spark')}")
                return exp.column(env[key], quoted=True)
            return n

        return e.copy().transform(fix, copy=False)

    @staticmethod
    def aggs_in(e: exp.Expression) -> bool:
        return any(True for _ in e.find_all(exp.AggFunc))

    def aggregate(self, node: Node, q: exp.Select, env: dict[tuple[str, str], str]):
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
        for e in exprs:
            for a in e.find_all(exp.AggFunc):
                if isinstance(a, aggregates.GROUPING_FUNCS):
                    continue
                call = aggregates.build_call(a, tr, self.fresh(), len(calls))
                if call.sql() not in by_sql:
                    by_sql[call.sql()] = call.name
                    calls.append(call)
        agg = Aggregate(node, groups, calls, sets, set_col)
        group_sql = {g.sql("spark"): name for name, g in groups}
        group_index = {g.sql("spark"): i for i, (_, g) in enumerate(groups)}

        def grouping(n: exp.Expression) -> exp.Expression:
            """GROUPING(a) / grouping_id(...): a constant per grouping set, chosen by the set ordinal."""
            if sets is None or set_col is None:
                raise QueryError(f"{n.sql('spark')} needs GROUP BY with GROUPING SETS, CUBE or ROLLUP")
            which = [] if n.expressions else list(range(len(groups)))
            for x in n.expressions:
                t = tr(x).sql("spark")
                if t not in group_index:
                    raise QueryError(f"{x.sql('spark')} in {n.sql('spark')} is not a GROUP BY expression")
                which.append(group_index[t])
            bits = aggregates.grouping_bits(sets, which)
            return exp.Case(this=exp.column(set_col, quoted=True),
                            ifs=[exp.If(this=exp.Literal.number(i), true=exp.Literal.number(b))
                                 for i, b in enumerate(bits)])

        def post(e: exp.Expression) -> exp.Expression:
            def rewrite(n: exp.Expression) -> exp.Expression:
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
                    if t.sql("spark") in group_sql:
                        return exp.column(group_sql[t.sql("spark")], quoted=True)
                if isinstance(n, exp.Column):
                    raise QueryError(f"column {n.sql('spark')} must appear in GROUP BY or inside an aggregate")
                for k, v in list(n.args.items()):
                    if isinstance(v, exp.Expression):
                        n.set(k, rewrite(v))
                    elif isinstance(v, list):
                        n.set(k, [rewrite(x) if isinstance(x, exp.Expression) else x for x in v])
                return n

            return rewrite(e.copy())

        return agg, post


def select_names(q: exp.Expression) -> list[str]:
    """Output names of a query: those of its leftmost SELECT."""
    while isinstance(q, (exp.SetOperation, exp.Subquery)):
        q = q.this
    if not isinstance(q, exp.Select):
        raise QueryError(f"cannot name the columns of {q.sql('spark')[:60]}")
    return [e.alias_or_name for e in q.expressions]


def compile_tree(sql: str, schemas: Mapping[str, list[tuple[str, str]]], dialect: str = "spark"
                 ) -> tuple[Node, list[str], list[str]]:
    """Parse, check and build. ``schemas`` maps each source key to its columns as (name, type).

    Returns the root node, the output column names (positional) and notes for ``explain``.
    """
    tree = parse(sql, dialect)
    tables = source_tables(tree)
    for t in tables:
        if table_key(t) not in schemas:
            raise QueryError(f"unknown table {table_key(t)}")
    aggregates.normalize(tree)  # FILTER, every/some/std, COUNT_IF, ...: see dvm.operators.aggregates.rewrite
    reject_unsupported(tree)
    # give every source a flat placeholder name so sqlglot's schema lookup is unambiguous
    keys: dict[str, str] = {}
    placeholder_of: dict[str, str] = {}
    for t in tables:
        key = table_key(t)
        ph = placeholder_of.setdefault(key, f"__src{len(placeholder_of)}")
        keys[ph] = key
        alias = t.alias_or_name
        t.set("this", exp.to_identifier(ph))
        t.set("db", None)
        t.set("catalog", None)
        if not t.alias:
            t.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    schema = {ph: {c: ty for c, ty in schemas[k]} for ph, k in keys.items()}
    rewrite.mark_merged_joins(tree)
    try:
        qualified = qualify(tree, schema=schema, dialect="spark", validate_qualify_columns=True,
                            quote_identifiers=False, identify=False)
    except OptimizeError as e:
        raise QueryError(str(e)) from None
    rewrite.fix_merged_join_keys(qualified)
    builder = _Builder(keys, schemas)
    root, names = builder.query(qualified, {})
    return root, names, builder.notes


def analyzable(sql: str, dialect: str = "spark") -> str:
    """``sql`` in a form Spark can analyse for its result schema: a recursive CTE with UNION (which Spark
    4.1 refuses, and spark-trickle evaluates itself) becomes UNION ALL, whose schema is the same."""
    tree = parse(sql, dialect)
    changed = False
    for cte in tree.find_all(exp.CTE):
        if is_recursive_cte(cte) and isinstance(cte.this, exp.Union) and cte.this.args.get("distinct"):
            cte.this.set("distinct", False)
            changed = True
    return tree.sql(dialect=dialect) if changed else sql


def pin_sources(sql: str, from_items: Mapping[str, str], dialect: str = "spark") -> str:
    """Rewrite a query so each source reads a fixed snapshot.

    ``from_items`` maps each source key to the Spark SQL FROM item to read instead (a time-travel table
    reference or a parenthesised subquery). The original table name stays the alias, so qualified column
    references keep resolving. Used for FULL refreshes, including of queries the tree cannot represent.
    """
    tree = parse(sql, dialect)
    marks: dict[str, str] = {}
    for t in source_tables(tree):
        key = table_key(t)
        if key not in from_items:
            raise QueryError(f"unknown table {key}")
        mark = f"__trickle_pin_{len(marks)}__"
        marks[mark] = from_items[key]
        alias = t.alias_or_name
        t.set("this", exp.to_identifier(mark))
        t.set("db", None)
        t.set("catalog", None)
        if not t.alias:
            t.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    rewrite.expand_quantified(tree)  # Spark SQL cannot parse x op ANY/ALL (subquery)
    out = tree.sql(dialect="spark")
    for mark, item in marks.items():
        out = out.replace(mark, item)
    return out
