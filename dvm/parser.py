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

from dvm.errors import QueryError, UnsupportedError
from dvm.operators import AggCall, Aggregate, Filter, InnerJoin, LeftJoin, Node, Project, Scan, UnionAll

#: functions whose value changes between evaluations: a delta computed with them would not add up
VOLATILE = {
    "rand", "random", "randn", "uuid", "shuffle", "current_timestamp", "now", "current_date",
    "curdate", "localtimestamp", "unix_timestamp", "monotonically_increasing_id", "spark_partition_id",
    "input_file_name", "current_time", "try_reflect", "reflect", "java_method", "randstr", "uniform",
}
VOLATILE_EXP = (exp.Rand, exp.Randn, exp.CurrentTimestamp, exp.CurrentDate, exp.Uuid)

AGG_FUNCS: dict[type[exp.Expression], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
}


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


def reject_unsupported(tree: exp.Expression) -> None:
    """Fail on constructs the operator tree cannot maintain, naming them and saying what to do."""
    for node in tree.walk():
        if isinstance(node, exp.Window):
            raise UnsupportedError("window function", f"window functions ({node.sql('spark')}) are not "
                                   "maintained differentially yet; use refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)):
            raise UnsupportedError("LIMIT", "LIMIT/OFFSET cannot be maintained differentially (TopK is not "
                                   "supported yet); drop the LIMIT or use refresh_mode='FULL'")
        if isinstance(node, exp.TableSample):
            raise UnsupportedError("TABLESAMPLE", "TABLESAMPLE is random, so a stream table cannot be kept "
                                   "equal to its query; sample the source into a table instead")
        if isinstance(node, (exp.Lateral, exp.Unnest, exp.Explode)):
            raise UnsupportedError("LATERAL", "LATERAL / explode is not maintained differentially yet; use "
                                   "refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Intersect, exp.Except)):
            raise UnsupportedError(node.key.upper(), f"{node.key.upper()} is not maintained differentially "
                                   "yet; use refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise UnsupportedError("WITH RECURSIVE", "WITH RECURSIVE is not maintained differentially yet; "
                                   "use refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Exists, exp.Any, exp.All)) or (
            isinstance(node, exp.In) and node.args.get("query") is not None
        ):
            raise UnsupportedError("subquery predicate", f"subquery predicates ({node.sql('spark')[:80]}) "
                                   "are not maintained differentially yet; use refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Cube, exp.Rollup, exp.GroupingSets)):
            raise UnsupportedError("GROUPING SETS", "GROUPING SETS / CUBE / ROLLUP are not maintained "
                                   "differentially yet; use refresh_mode='FULL' or AUTO")
        if isinstance(node, VOLATILE_EXP) or (
            isinstance(node, exp.Func) and node.name.lower() in VOLATILE
        ):
            name = node.sql("spark").split("(")[0]
            raise UnsupportedError("volatile function", f"non-deterministic function {name}() gives a "
                                   "different value at every evaluation, so its deltas do not add up; "
                                   "compute it in the source table, or use refresh_mode='FULL'")
        if isinstance(node, exp.AggFunc) and type(node) not in AGG_FUNCS:
            raise UnsupportedError(f"aggregate {node.key}", f"aggregate {node.sql('spark')[:60]} is not "
                                   "maintained differentially yet (supported: COUNT, SUM, AVG, MIN, MAX); "
                                   "use refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
            raise UnsupportedError("COUNT(DISTINCT)", "COUNT(DISTINCT ...) is not maintained "
                                   "differentially yet; use refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.Filter):
            raise UnsupportedError("aggregate FILTER", "aggregate FILTER (WHERE ...) is not maintained "
                                   "differentially yet; use CASE WHEN inside the aggregate")
        if isinstance(node, exp.Join):
            side, kind = (node.side or "").upper(), (node.kind or "").upper()
            if side == "FULL" or kind in ("SEMI", "ANTI") or node.args.get("method"):
                what = " ".join(x for x in (node.args.get("method"), side, kind) if x)
                raise UnsupportedError(f"{what} JOIN", f"{what} JOIN is not maintained differentially yet; "
                                       "use refresh_mode='FULL' or AUTO")


class _Builder:
    """Walks one qualified query; hands out unique internal column names."""

    def __init__(self, keys: dict[str, str], schemas: Mapping[str, list[tuple[str, str]]]) -> None:
        self.keys = keys  # placeholder table name -> source key
        self.schemas = schemas  # source key -> [(column, type)]
        self.counter = 0
        self.notes: list[str] = []

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
        for join in q.args.get("joins") or []:
            right, renv = self.from_item(join.this, ctes, used)
            env = {**env, **renv}
            on = join.args.get("on")
            cond = self.translate(on, env) if on is not None else None
            side = (join.side or "").upper()
            if side == "LEFT":
                node = LeftJoin(node, right, cond)
            elif side == "RIGHT":
                node = self._right_join(node, right, cond)
            else:
                node = InnerJoin(node, right, cond)
        where = q.args.get("where")
        if where is not None:
            node = Filter(node, self.translate(where.this, env))
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
                node, names = self.query(ctes[name], ctes)
                return node, {(alias, n.lower()): c for n, c in zip(names, node.cols, strict=True)}
            raise QueryError(f"unknown table {item.sql('spark')}")
        if isinstance(item, exp.Subquery):
            node, names = self.query(item.this, ctes)
            return node, {(alias, n.lower()): c for n, c in zip(names, node.cols, strict=True)}
        raise UnsupportedError(item.key, f"{item.sql('spark')[:60]} is not supported in FROM yet")

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
            if isinstance(n, (exp.Select, exp.Subquery, exp.Union)):
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
        group = q.args.get("group")
        groups: list[tuple[str, exp.Expression]] = []
        for g in group.expressions if group is not None else []:
            groups.append((self.fresh(), self.translate(g, env)))
        calls: list[AggCall] = []
        by_sql: dict[str, str] = {}
        exprs = [e for e in q.expressions] + ([q.args["having"]] if q.args.get("having") else [])
        for e in exprs:
            for a in e.find_all(exp.AggFunc):
                func = AGG_FUNCS[type(a)]
                arg = a.this
                if func == "count" and (arg is None or isinstance(arg, exp.Star)):
                    func, targ = "count_star", None
                else:
                    targ = self.translate(arg, env)
                call = AggCall(self.fresh(), func, targ, len(calls))
                if call.sql() not in by_sql:
                    by_sql[call.sql()] = call.name
                    calls.append(call)
        agg = Aggregate(node, groups, calls)
        group_sql = {g.sql("spark"): name for name, g in groups}

        def post(e: exp.Expression) -> exp.Expression:
            def rewrite(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.AggFunc):
                    func = AGG_FUNCS[type(n)]
                    if func == "count" and (n.this is None or isinstance(n.this, exp.Star)):
                        sql = "COUNT(*)"
                    else:
                        sql = AggCall("", func, self.translate(n.this, env), 0).sql()
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
    try:
        qualified = qualify(tree, schema=schema, dialect="spark", validate_qualify_columns=True,
                            quote_identifiers=False, identify=False)
    except OptimizeError as e:
        raise QueryError(str(e)) from None
    builder = _Builder(keys, schemas)
    root, names = builder.query(qualified, {})
    return root, names, builder.notes


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
    out = tree.sql(dialect="spark")
    for mark, item in marks.items():
        out = out.replace(mark, item)
    return out
