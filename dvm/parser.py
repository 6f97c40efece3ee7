"""SQL text → logical operator tree.

sqlglot parses the defining query (Spark dialect by default) and qualifies every column against the
sources' schemas; this module then walks the qualified AST into the operator tree of :mod:`dvm.operators`,
renaming every column to a unique internal name so that generated SQL never has to qualify a column.
Constructs the tree cannot maintain raise :class:`~dvm.errors.UnsupportedError` with a hint.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

import dvm.operators.aggregates as aggregates
from dvm import rewrite
from dvm.context import quote
from dvm.dialect import SPARK, dialect_of
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import (
    AggCall,
    Aggregate,
    AntiJoin,
    Filter,
    FullJoin,
    Generate,
    InnerJoin,
    LateralJoin,
    LeftJoin,
    Mark,
    MarkJoin,
    Node,
    Project,
    RecursiveCte,
    Scan,
    SemiJoin,
    SetOp,
    TopK,
    UnionAll,
    Window,
)
from dvm.operators.cte import CteRef, SharedCte, finalize_ctes
from dvm.operators.join import absorb_equalities
from dvm.operators.lateral import LEFT, InnerSource
from dvm.operators.recursive import analyze_step
from dvm.operators.window import owning_window
from dvm.rewrites import scalar_subquery

#: functions whose value changes between evaluations (or depends on how the data is split into files and
#: partitions): a delta computed with them would not add up, and a recompute would not reproduce what is stored
VOLATILE = {
    "rand", "random", "randn", "uuid", "shuffle", "randstr", "uniform", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start", "input_file_block_length", "reflect",
    "java_method", "try_reflect",
}
VOLATILE_EXP = (exp.Rand, exp.Randn, exp.Uuid, exp.Shuffle, exp.Randstr, exp.Uniform)
#: the clock: fixed within one refresh (Spark evaluates it once per query) but different at every refresh,
#: so rows computed by earlier refreshes would keep an old value while new rows get a new one
CLOCK = {"current_timestamp", "now", "current_date", "curdate", "localtimestamp", "current_time"}
CLOCK_EXP = (exp.CurrentTimestamp, exp.CurrentDate, exp.Localtimestamp, exp.CurrentTime, exp.CurrentDatetime)
#: written without parentheses these parse as columns; they are the clock unless a source has such a column
CLOCK_KEYWORDS = {"localtimestamp", "current_time"}

#: aggregate functions maintained differentially (sqlglot node -> canonical name); see dvm.operators.aggregates
AGG_FUNCS: dict[type[exp.Expression], str] = aggregates.FUNCTIONS


def table_key(table: exp.Table) -> str:
    """The normalised name of a source as written in the query: ``db.table`` or ``table``, lower case. A
    table read by path, ``delta.`/data/T``` (a name with a ``/``), keeps its path as written: paths are
    case-sensitive (``pipeline.api`` resolves such a key by its path)."""
    parts = [p.name for p in table.parts]
    if len(parts) == 2 and "/" in parts[1]:
        return f"{parts[0].lower()}.{parts[1]}"
    return ".".join(parts).lower()


#: The recursion limit sqlglot's parser runs under, on a thread of its own (:func:`on_own_stack`). Its parser
#: recurses 8-35 frames per level of nesting (parentheses, CASE in CASE, function calls, subqueries), so
#: under the caller's limit whether a deeply nested query parses would depend on the caller's stack (a
#: query accepted by create_stream_table from a shallow stack could fail every refresh from a deeper one)
#: and on the sqlglot release (one more frame a level tipped 40 levels of CASE over the default 1000). A
#: fresh thread starts at the same depth from everywhere, and this limit leaves the parser several times
#: what :data:`MAX_NESTING` levels need.
PARSER_FRAMES = 6000

#: The C stack of that thread: Python frames that re-enter the interpreter from C (constructors, dunder
#: dispatch) take C stack too; 6000 of them fit with a wide margin (only touched pages are committed).
PARSER_STACK_BYTES = 512 * 1024 * 1024

#: Deepest nesting of parentheses, brackets and CASE a defining query may have (:func:`check_nesting`, at
#: create). The parser takes far more under :data:`PARSER_FRAMES`; the limit is for what comes after it:
#: sqlglot's renderer needs up to 12 frames a level (derived tables), a delta query wraps the user's
#: expressions in a few levels more, and Spark's own parser and analyzer recurse per level too.
MAX_NESTING = 40

FLATTEN = ("flatten it: one CASE with several WHEN branches instead of a CASE inside a CASE, x IN (...) or a "
           "join with a table of values instead of nested conditions, AND / OR chains without parentheses "
           "(chains of any length are fine), or a CTE instead of nested subqueries")

_Statements = list[exp.Expression | None]
_T = TypeVar("_T")
_deep = threading.Lock()


def on_own_stack(call: Callable[[], _T]) -> _T:
    """``call()`` on a thread of its own, under a recursion limit of :data:`PARSER_FRAMES` (see there for
    why). One at a time: the limit is process-wide, raised for the call and restored after it (a raised
    limit only lets other threads recurse further, never less)."""
    out: list[_T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(e)

    with _deep:
        limit = sys.getrecursionlimit()
        size = threading.stack_size()
        try:
            threading.stack_size(PARSER_STACK_BYTES)
            worker = threading.Thread(target=run, name="trickle-parse", daemon=True)
        finally:
            threading.stack_size(size)
        sys.setrecursionlimit(max(limit, PARSER_FRAMES))
        try:
            worker.start()
            worker.join()
        finally:
            sys.setrecursionlimit(limit)
    if error:
        raise error[0]
    return out[0]


def _parse_statements(sql: str, dialect: str) -> _Statements:
    return on_own_stack(lambda: sqlglot.parse(sql, read=dialect_of(dialect)))


def nesting(sql: str, dialect: str = "spark") -> int | None:
    """The deepest nesting of parentheses, brackets and CASE ... END in ``sql``, from its tokens (the
    tokenizer does not recurse, so this works where the parser gives up); None when it cannot tokenize."""
    try:
        tokens = dialect_of(dialect).tokenize(sql)
    except Exception:  # noqa: BLE001 - unreadable SQL: parse() says why
        return None
    depth = deepest = 0
    for t in tokens:
        name = t.token_type.name
        if name in ("L_PAREN", "L_BRACKET", "CASE"):
            depth += 1
            deepest = max(deepest, depth)
        elif name in ("R_PAREN", "R_BRACKET", "END"):
            depth -= 1
    return deepest


def check_nesting(sql: str, dialect: str = "spark") -> None:
    """Refuse, at create, a query nested deeper than :data:`MAX_NESTING` (see there for why)."""
    levels = nesting(sql, dialect)
    if levels is not None and levels > MAX_NESTING:
        raise QueryError(f"the query nests {levels} levels deep (parentheses, brackets, CASE inside CASE, "
                         f"function calls, subqueries); at most {MAX_NESTING} are supported: {FLATTEN}")


def parse(sql: str, dialect: str = "spark") -> exp.Expression:
    try:
        statements = [s for s in _parse_statements(sql, dialect) if s is not None]
    except ParseError as e:
        raise QueryError(f"invalid SQL: {e}") from None
    except RecursionError:
        levels = nesting(sql, dialect)
        depth = f" ({levels} levels of parentheses, brackets or CASE)" if levels else ""
        raise QueryError(f"the query nests expressions too deeply for the SQL parser{depth}: {FLATTEN}") from None
    if len(statements) != 1:
        raise QueryError(f"the defining query must be exactly one SELECT statement, got {len(statements)}")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise QueryError(f"the defining query must be a SELECT query, got {tree.key.upper()}")
    rewrite.check_limits(tree)
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


def function_name(node: exp.Expression) -> str:
    """The SQL name of a function call, lower case (``explode_outer``, ``rand``, ``json_tuple``)."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.sql_name().lower() if isinstance(node, exp.Func) else ""


#: table-generating functions Spark accepts in a SELECT list or a LATERAL VIEW (typed sqlglot nodes: Explode
#: and its subclasses posexplode / explode_outer / posexplode_outer, Inline, Stack)
GENERATORS = {"explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer", "stack",
              "json_tuple"}


def unalias(e: exp.Expression) -> exp.Expression:
    return e.this if isinstance(e, (exp.Alias, exp.Aliases)) else e


def is_generator(e: exp.Expression) -> bool:
    return isinstance(e, (exp.Explode, exp.Inline, exp.Stack)) or (
        isinstance(e, exp.Anonymous) and e.name.lower() in GENERATORS)


def generator_defaults(g: exp.Expression) -> list[str] | None:
    """The column names Spark gives a generator's output (which fixes its arity), from the argument's type
    (annotated by :func:`compile_tree`); None when the type is unknown."""
    name = function_name(g)
    args = [g.this] if g.this is not None and isinstance(g.this, exp.Expression) else []
    args += list(g.expressions)
    if name == "stack":
        if isinstance(g.this, exp.Literal) and not g.this.is_string:
            n = int(g.this.name)
            return [f"col{i}" for i in range((len(g.expressions) + n - 1) // n)] if n > 0 else None
        return None
    if name == "json_tuple":
        return [f"c{i}" for i in range(len(args) - 1)] if len(args) > 1 else None
    if not args or args[0].type is None:
        return None
    ty = args[0].type
    if name.startswith("inline"):
        inner = ty.expressions[0] if ty.is_type(exp.DataType.Type.ARRAY) and ty.expressions else None
        if inner is None or not inner.is_type(exp.DataType.Type.STRUCT):
            return None
        return [f.name for f in inner.expressions]
    if ty.is_type(exp.DataType.Type.ARRAY):
        cols = ["col"]
    elif ty.is_type(exp.DataType.Type.MAP):
        cols = ["key", "value"]
    else:
        return None
    return (["pos"] + cols) if name.startswith("posexplode") else cols


def tie_break(q: exp.Expression) -> None:
    """``ORDER BY ... LIMIT`` keeps arbitrary rows among ties: order ties by the select list too, so the rows
    kept are a function of the input (rows equal on the sort keys and on every output column are
    interchangeable). A lateral subquery is recomputed per left row on both snapshots, and the rows taken
    back must be the rows stored."""
    order = q.args.get("order")
    if order is None or (q.args.get("limit") is None and q.args.get("offset") is None):
        return
    if isinstance(q, exp.Select):
        extra = [unalias(e).copy() for e in q.expressions if not isinstance(unalias(e), exp.Star)]
    else:  # a set operation orders by its output names (those of its first branch)
        first = q
        while isinstance(first, exp.SetOperation):
            first = first.this
        extra = [exp.column(e.alias_or_name, quoted=True) for e in first.expressions]
    order.set("expressions", list(order.expressions) + [exp.Ordered(this=e, nulls_first=True) for e in extra])


def lateral_bodies(tree: exp.Expression) -> set[int]:
    """ids of the nodes inside LATERAL subqueries: Spark evaluates those wholesale (per left row, see
    :mod:`dvm.operators.lateral`), so only the safety checks apply to them."""
    return {id(n) for lat in tree.find_all(exp.Lateral) if isinstance(lat.this, exp.Subquery)
            for n in lat.this.walk()}


def _in_lateral_body(holder: exp.Expression | None) -> bool:
    """``holder`` is the query directly inside ``LATERAL ( ... )``."""
    parent = holder.parent if holder is not None else None
    return isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.Lateral)


def reject_unsafe(node: exp.Expression) -> None:
    """Constructs no refresh can keep equal to the query, wherever they stand: random or clock-dependent
    functions, TABLESAMPLE, LIMIT / OFFSET without ORDER BY (arbitrary rows)."""
    if isinstance(node, VOLATILE_EXP) or (isinstance(node, exp.Func) and function_name(node) in VOLATILE):
        name = node.sql(SPARK).split("(")[0].lower()
        raise UnsupportedError("volatile function", f"non-deterministic function {name}() gives a "
                               "different value at every evaluation, so its deltas do not add up; "
                               "compute it in the source table, or use refresh_mode='FULL'")
    if isinstance(node, CLOCK_EXP) or (isinstance(node, exp.Func) and function_name(node) in CLOCK):
        name = node.sql(SPARK).split("(")[0].lower()
        raise UnsupportedError("volatile function", f"{name}() is fixed within one refresh but differs between "
                               "refreshes, so rows computed by earlier refreshes would keep their old value "
                               "(and nothing is recomputed while the sources do not change); store the time in "
                               "the source table or compare with a literal, or use refresh_mode='FULL' (it is "
                               "then evaluated at each refresh that has source changes)")
    if isinstance(node, exp.TableSample):
        raise UnsupportedError("TABLESAMPLE", "TABLESAMPLE draws a different random sample at every read, so "
                               "a stream table cannot be kept equal to its query; for a stable sample filter "
                               "on a hash of a key instead, e.g. WHERE pmod(xxhash64(id), 100) < 10 for about "
                               "10 percent, or use refresh_mode='FULL'")
    if isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)) and (
        node.parent is None or node.parent.args.get("order") is None
    ):
        what = "OFFSET" if isinstance(node, exp.Offset) else "LIMIT"
        raise UnsupportedError("LIMIT", f"{what} without ORDER BY keeps arbitrary rows, which differ from one "
                               "evaluation to the next, so a stream table cannot be kept equal to its query; "
                               "for a top-k add an ORDER BY on columns that make the order total (a unique "
                               f"key last), e.g. ORDER BY score DESC, id {what} n; or drop the {what}, or use "
                               "refresh_mode='FULL' (some n rows, chosen anew at each refresh)")


#: aggregates whose value depends on the order Spark reads rows in (array_sort(collect_list(x)) does not)
ORDER_DEPENDENT = (exp.ArrayAgg, exp.ArrayUniqueAgg, exp.First, exp.Last, exp.AnyValue, exp.FirstValue,
                   exp.LastValue, exp.GroupConcat, exp.ArgMax, exp.ArgMin, exp.Mode)


def reject_order_dependent(node: exp.Expression) -> None:
    """Inside a LATERAL subquery, which Spark evaluates as written: a left row's rows are recomputed on
    both snapshots at every change that reaches it, and the rows taken back must be the rows stored, so
    whatever depends on the order rows are read in is refused (ORDER BY ... LIMIT gets a tie-break)."""
    if isinstance(node, (exp.Limit, exp.Offset)) and not _in_lateral_body(node.parent):
        raise UnsupportedError("LIMIT", "ORDER BY ... LIMIT is maintained inside a LATERAL subquery only at "
                               "its top level (a top-k per left row); use refresh_mode='FULL' or AUTO")
    if isinstance(node, exp.Window):
        raise UnsupportedError("window function", "window functions inside a LATERAL subquery are not "
                               "maintained (ties make their result depend on the read order); use ORDER BY ... "
                               "LIMIT in the subquery, or refresh_mode='FULL' or AUTO")
    sorted_list = isinstance(node, (exp.ArrayAgg, exp.ArrayUniqueAgg)) and isinstance(node.parent, exp.ArraySort)
    deterministic_mode = isinstance(node, exp.Mode) and any(
        isinstance(a, exp.Boolean) and a.this is True for a in node.iter_expressions())
    if isinstance(node, ORDER_DEPENDENT) and not sorted_list and not deterministic_mode:
        name = node.sql(SPARK).split("(")[0].lower()
        raise UnsupportedError("order-dependent aggregate", f"{name}() inside a LATERAL subquery depends on the "
                               "order Spark reads rows in, and a left row's result is recomputed whenever a "
                               "change reaches it, so it could differ from the stored one; use "
                               "array_sort(collect_list(...)), MIN / MAX, mode(x, true), or refresh_mode='FULL'")


def is_recursive_cte(cte: exp.CTE) -> bool:
    """A CTE of a ``WITH RECURSIVE`` list whose body reads its own name (the list may hold plain CTEs)."""
    w = cte.parent
    if not isinstance(w, exp.With) or not w.args.get("recursive"):
        return False
    name = cte.alias_or_name.lower()
    return any(t.name.lower() == name and not t.db for t in cte.this.find_all(exp.Table))


def reject_unsupported(tree: exp.Expression, columns: set[str] | None = None) -> None:
    """Fail on constructs the operator tree cannot maintain, naming them and saying what to do.

    ``columns``: the (lower case) column names of every source, to tell the clock keywords written without
    parentheses (``localtimestamp``) from columns of that name.

    The body of a recursive CTE is not built into operators (Spark evaluates it, see
    :mod:`dvm.operators.recursive`): only the safety checks apply inside it, and LIMIT (its rows would depend
    on the evaluation order of the rounds); its anchor is checked again when it is built."""
    in_lateral = lateral_bodies(tree)
    in_recursive = {id(n) for cte in tree.find_all(exp.CTE) if is_recursive_cte(cte) for n in cte.this.walk()}
    for node in tree.walk():
        reject_unsafe(node)
        if (isinstance(node, exp.Column) and not node.table and node.name.lower() in CLOCK_KEYWORDS
                and node.name.lower() not in (columns or set())):
            reject_unsafe(exp.Anonymous(this=node.name))
        if id(node) in in_recursive:
            if isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)):
                raise UnsupportedError("LIMIT", "ORDER BY ... LIMIT inside a recursive CTE is not maintained; "
                                       "use refresh_mode='FULL' or AUTO")
            continue
        if id(node) in in_lateral:
            reject_order_dependent(node)
            continue
        if isinstance(node, exp.Window):
            check_window_position(node)
        if isinstance(node, exp.Unnest):
            raise UnsupportedError("UNNEST", "UNNEST is not Spark SQL; use LATERAL VIEW explode(...) t AS x")
        if isinstance(node, exp.Lateral):
            join = node.parent
            side = (join.side or "").upper() if isinstance(join, exp.Join) else ""
            kind = (join.kind or "").upper() if isinstance(join, exp.Join) else ""
            if not node.args.get("view") and (not isinstance(join, exp.Join) or side in ("RIGHT", "FULL")
                                              or kind in ("SEMI", "ANTI")):
                raise UnsupportedError("LATERAL", "a LATERAL item is maintained after a FROM item, joined with "
                                       "a comma, [CROSS] JOIN or LEFT JOIN; use refresh_mode='FULL' or AUTO")
        if isinstance(node, (exp.Exists, exp.Any, exp.All)) or (
            isinstance(node, exp.In) and node.args.get("query") is not None
        ):
            pred = rewrite.predicate_of(node)
            if pred is None or not rewrite.in_where_position(pred):
                raise UnsupportedError("subquery predicate", f"subquery predicate {node.sql(SPARK)[:80]} is "
                                       "maintained differentially only in a WHERE clause, combined with AND / "
                                       "OR / NOT (not in SELECT, ON, HAVING or inside other expressions); "
                                       "move it there or use refresh_mode='FULL' or AUTO")
        if isinstance(node, exp.Group):
            aggregates.grouping_sets(node)  # refuses more than MAX_GROUPING_SETS branches
        if owning_window(node) is not None:
            continue  # evaluated by its window (partition recompute): any deterministic function works
        if (isinstance(node, exp.AggFunc) and type(node) not in AGG_FUNCS
                and not isinstance(node, aggregates.GROUPING_FUNCS)):
            raise aggregates.unsupported(f"aggregate {node.key}", node.sql(SPARK)[:60],
                                         aggregates.HINTS.get(type(node), ""))
        if isinstance(node, exp.Anonymous) and node.name.lower() in aggregates.UNTYPED_AGGREGATES:
            raise aggregates.unsupported(f"aggregate {node.name.lower()}", node.sql(SPARK)[:60])
        if isinstance(node, exp.WithinGroup):
            raise aggregates.unsupported(f"aggregate {node.this.key}", aggregates.shown(node),
                                         aggregates.HINTS.get(type(node.this), "WITHIN GROUP is supported "
                                                              "for STRING_AGG / LISTAGG only"))
        if isinstance(node, exp.Filter):  # left over by aggregates.normalize: not on a maintained aggregate
            raise UnsupportedError("aggregate FILTER", f"FILTER on {node.this.sql(SPARK)[:60]} is not "
                                   "maintained differentially; use CASE WHEN inside the aggregate")
        if isinstance(node, exp.Join):
            side, kind = (node.side or "").upper(), (node.kind or "").upper()
            method = (node.args.get("method") or "").upper()
            if method not in ("", "NATURAL") or (side == "RIGHT" and kind in ("SEMI", "ANTI")):
                what = " ".join(x for x in (method, side, kind) if x)
                raise UnsupportedError(f"{what} JOIN", f"{what} JOIN is not maintained differentially yet; "
                                       "use refresh_mode='FULL' or AUTO")


def check_window_position(w: exp.Window) -> None:
    """A window function belongs in a SELECT list or an ORDER BY (QUALIFY is rewritten before this)."""
    n: exp.Expression = w
    while n.parent is not None and not isinstance(n.parent, (exp.Select, exp.Union)):
        if isinstance(n.parent, exp.Window):
            raise QueryError(f"nested window function {n.parent.sql(SPARK)[:80]}")
        n = n.parent
    if n.arg_key not in ("expressions", "order"):
        raise QueryError(f"window function {w.sql(SPARK)[:80]} is allowed only in the SELECT list, ORDER BY "
                         "or QUALIFY (filter on it in an outer query: SELECT * FROM (SELECT ..., "
                         "ROW_NUMBER() OVER (...) AS rn FROM t) WHERE rn <= 3)")


def limit_of(q: exp.Expression) -> tuple[int | None, int] | None:
    """(LIMIT, OFFSET) of a query as integers, None without either; FETCH FIRST n ROWS ONLY is a LIMIT."""
    limit, offset = q.args.get("limit"), q.args.get("offset")
    if limit is None and offset is None:
        return None

    def value(node: exp.Expression | None, what: str) -> int | None:
        if node is None:
            return None
        e = node.args.get("count") if isinstance(node, exp.Fetch) else node.expression
        if e is None and isinstance(node, exp.Fetch):
            return 1  # FETCH FIRST ROW ONLY
        if not (isinstance(e, exp.Literal) and e.is_int) or int(e.name) < 0:
            raise UnsupportedError(what, f"{what} {e.sql(SPARK) if e is not None else ''} must be a "
                                   "non-negative integer literal to be maintained differentially; write the "
                                   "number instead, or use refresh_mode='FULL'")
        return int(e.name)

    n = value(limit, "LIMIT")
    return n, value(offset, "OFFSET") or 0


def _orderable(ty: str | None) -> bool:
    """Spark can sort this type (maps and variants cannot be ordered)."""
    return ty is None or not any(t in ty.lower() for t in ("map<", "variant"))


class _Builder:
    """Walks one qualified query; hands out unique internal column names."""

    def __init__(self, keys: dict[str, str], schemas: Mapping[str, list[tuple[str, str]]]) -> None:
        self.keys = keys  # placeholder table name -> source key
        self.schemas = schemas  # source key -> [(column, type)]
        self.counter = 0
        self.notes: list[str] = []
        self.types: dict[str, str] = {}  # internal column -> source type, where known (tie-breakers skip maps)
        self.shared: dict[int, SharedCte] = {}  # id of a CTE's body AST -> its subtree, built once
        self.cte_of: dict[int, exp.CTE] = {}  # id(CTE body) -> its CTE node (column list, WITH RECURSIVE)

    def fresh(self) -> str:
        self.counter += 1
        return f"__t{self.counter}"

    # --- queries ---

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
                keys.append(self._ordered(o, node.cols[idx]))
            node = TopK(node, keys, bounds[0], bounds[1], self.tie_cols(node))
        elif q.args.get("order"):
            self.notes.append("ORDER BY without LIMIT is ignored: a table has no order")
        return node, names

    @staticmethod
    def _ordered(o: exp.Ordered, col: str) -> exp.Ordered:
        return exp.Ordered(this=exp.column(col, quoted=True), desc=bool(o.args.get("desc")),
                           nulls_first=o.args.get("nulls_first"))

    def tie_cols(self, node: Node) -> list[str]:
        return [c for c in node.cols if _orderable(self.types.get(c))]

    def _propagate_types(self, items: list[tuple[str, exp.Expression]]) -> None:
        for name, e in items:
            if isinstance(e, exp.Column) and e.name in self.types:
                self.types[name] = self.types[e.name]

    def windows(self, node: Node, items: list[tuple[str, exp.Expression]]) -> tuple[Node, list[tuple[str, exp.Expression]]]:
        """Pull the window functions out of ``items`` (expressions over ``node``'s columns) into a Window node
        below them; the items then read the window's output columns."""
        funcs: list[tuple[str, exp.Window]] = []
        by_sql: dict[str, str] = {}

        def pull(n: exp.Expression) -> exp.Expression:
            if not isinstance(n, exp.Window):
                return n
            sql = n.sql(SPARK)
            if sql not in by_sql:
                by_sql[sql] = self.fresh()
                funcs.append((by_sql[sql], n.copy()))
            return exp.column(by_sql[sql], quoted=True)

        out = [(name, e.transform(pull)) for name, e in items]
        if not funcs:
            return node, items
        return Window(node, funcs, self.tie_cols(node)), out

    def order_keys(self, q: exp.Select, items: list[tuple[str, exp.Expression]], names: list[str],
                   tr: object, distinct: bool) -> list[tuple[int, exp.Ordered]]:
        """The ORDER BY of a TopK as (position in ``items``, key): an output column by name or position, an
        expression equal to a selected one, or else a hidden item appended to ``items`` (not with DISTINCT,
        whose rows are the selected columns only)."""
        out = []
        for o in q.args["order"].expressions:
            k = o.this
            idx = None
            if isinstance(k, exp.Literal) and k.is_int and 0 < int(k.name) <= len(names):
                idx = int(k.name) - 1
            elif isinstance(k, exp.Column) and not k.table:
                idx = next((i for i, n in enumerate(names) if n.lower() == k.name.lower()), None)
            if idx is None:
                t = tr(k)  # type: ignore[operator]
                idx = next((i for i, (_, e) in enumerate(items) if e.sql(SPARK) == t.sql(SPARK)), None)
                if idx is None:
                    if distinct:
                        raise QueryError(f"ORDER BY {k.sql(SPARK)} of a SELECT DISTINCT must be one of the "
                                         "selected columns")
                    items.append((self.fresh(), t))
                    idx = len(items) - 1
            out.append((idx, o))
        return out

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
        self._propagate_types(items)
        if distinct:
            node = Aggregate(node, [(self.fresh(), exp.column(c, quoted=True)) for c in node.cols], [])
        if bounds is not None:
            ordered = [self._ordered(o, node.cols[i]) for i, o in keys]
            node = TopK(node, ordered, bounds[0], bounds[1], self.tie_cols(node))
            if len(node.cols) > len(names):  # drop the hidden sort columns
                node = Project(node, [(c, exp.column(c, quoted=True)) for c in node.cols[:len(names)]])
        return node, names

    # --- generators and LATERAL ---

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

    def cte_ref(self, name: str, ctes: dict[str, exp.Expression]) -> CteRef:
        """A reference to the CTE ``name``: its body is built once, at the first reference, and shared by
        every reference (:mod:`~dvm.operators.cte`)."""
        body = ctes[name]
        shared = self.shared.get(id(body))
        if shared is None:
            node, names = self.query(body, ctes)
            shared = self.shared[id(body)] = SharedCte(name, node, names)
        return CteRef(shared, [self.fresh() for _ in shared.node.cols])

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
            if isinstance(n, (exp.Select, exp.SetOperation)) or (
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
        for j in q.args.get("joins") or []:  # references of LATERAL items to the left input
            for n in j.this.find_all(exp.Column) if isinstance(j.this, exp.Lateral) else []:
                if n.table:
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
                    raise QueryError(f"unknown column {n.sql(SPARK)}")
                return exp.column(env[key], quoted=True)
            return n

        return e.copy().transform(fix, copy=False)

    @staticmethod
    def aggs_in(e: exp.Expression) -> bool:
        """``e`` holds a GROUP BY aggregate (not the function of a window: ``SUM(x) OVER (...)``)."""
        return any(owning_window(a) is None for a in e.find_all(exp.AggFunc))

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
        if q.args.get("order") and limit_of(q) is not None:
            exprs.append(q.args["order"])
        for e in exprs:
            for a in e.find_all(exp.AggFunc):
                if isinstance(a, aggregates.GROUPING_FUNCS) or owning_window(a) is not None:
                    continue
                call = aggregates.build_call(a, tr, self.fresh(), len(calls))
                if call.sql() not in by_sql:
                    by_sql[call.sql()] = call.name
                    calls.append(call)
        agg = Aggregate(node, groups, calls, sets, set_col)
        group_sql = {g.sql(SPARK): name for name, g in groups}
        group_index = {g.sql(SPARK): i for i, (_, g) in enumerate(groups)}

        def grouping(n: exp.Expression) -> exp.Expression:
            """GROUPING(a) / grouping_id(...): a constant per grouping set, chosen by the set ordinal."""
            if sets is None or set_col is None:
                raise QueryError(f"{n.sql(SPARK)} needs GROUP BY with GROUPING SETS, CUBE or ROLLUP")
            which = [] if n.expressions else list(range(len(groups)))
            for x in n.expressions:
                t = tr(x).sql(SPARK)
                if t not in group_index:
                    raise QueryError(f"{x.sql(SPARK)} in {n.sql(SPARK)} is not a GROUP BY expression")
                which.append(group_index[t])
            bits = aggregates.grouping_bits(sets, which)
            return exp.Case(this=exp.column(set_col, quoted=True),
                            ifs=[exp.If(this=exp.Literal.number(i), true=exp.Literal.number(b))
                                 for i, b in enumerate(bits)])

        def post(e: exp.Expression) -> exp.Expression:
            def children(n: exp.Expression) -> exp.Expression:
                for k, v in list(n.args.items()):
                    if isinstance(v, exp.Expression):
                        n.set(k, rewrite(v))
                    elif isinstance(v, list):
                        n.set(k, [rewrite(x) if isinstance(x, exp.Expression) else x for x in v])
                return n

            def rewrite(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.Window):  # evaluated above the aggregate: rewrite what it reads
                    f = n.this
                    while isinstance(f, (exp.IgnoreNulls, exp.RespectNulls)):
                        f = f.this
                    children(f)
                    for k, v in list(n.args.items()):
                        if k != "this" and isinstance(v, exp.Expression):
                            n.set(k, rewrite(v))
                        elif k != "this" and isinstance(v, list):
                            n.set(k, [rewrite(x) if isinstance(x, exp.Expression) else x for x in v])
                    return n
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
                    if t.sql(SPARK) in group_sql:
                        return exp.column(group_sql[t.sql(SPARK)], quoted=True)
                if isinstance(n, exp.Column):
                    raise QueryError(f"column {n.sql(SPARK)} must appear in GROUP BY or inside an aggregate")
                return children(n)

            return rewrite(e.copy())

        return agg, post


def window_rewrites(tree: exp.Expression) -> exp.Expression:
    """Named windows inlined, QUALIFY and DISTINCT ON turned into ROW_NUMBER()-style subqueries: pure
    sqlglot rewrites shared by the differential and the FULL path (see :mod:`dvm.rewrite`)."""
    tree = rewrite.expand_named_windows(tree)
    tree = rewrite.eliminate_qualify(tree)
    return rewrite.eliminate_distinct_on(tree)


def select_names(q: exp.Expression) -> list[str]:
    """Output names of a query: those of its leftmost SELECT."""
    while isinstance(q, (exp.SetOperation, exp.Subquery)):
        q = q.this
    if not isinstance(q, exp.Select):
        raise QueryError(f"cannot name the columns of {q.sql(SPARK)[:60]}")
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
    tree = window_rewrites(tree)
    tables = source_tables(tree)
    aggregates.normalize(tree)  # FILTER, every/some/std, COUNT_IF, ...: see dvm.operators.aggregates.rewrite
    reject_unsupported(tree, {c.lower() for cols in schemas.values() for c, _ in cols})
    scalar_subquery.remember_sql(tree)
    # give every source a flat placeholder name so sqlglot's schema lookup is unambiguous
    keys: dict[str, str] = {}
    placeholder_of: dict[str, str] = {}
    for t in tables:
        key = table_key(t)
        ph = placeholder_of.setdefault(key, f"__src{len(placeholder_of)}")
        keys[ph] = key
        rewrite.retarget(t, ph)
    schema = {ph: {c: ty for c, ty in schemas[k]} for ph, k in keys.items()}
    rewrite.mark_merged_joins(tree)
    try:
        qualified = qualify(tree, schema=schema, dialect=SPARK, validate_qualify_columns=True,
                            quote_identifiers=False, identify=False)
    except OptimizeError as e:
        raise QueryError(str(e)) from None
    rewrite.fix_merged_join_keys(qualified)
    if any(is_generator(unalias(e)) and not isinstance(e, exp.Aliases)
           for sel in qualified.find_all(exp.Select) for e in sel.expressions):
        try:  # a generator's arity comes from its argument's type (see generator_defaults)
            annotate_types(qualified, schema=schema, dialect=SPARK)
        except Exception:  # noqa: BLE001 - unknown types leave the arity unknown: generator_names says so
            pass
    scalar_subquery.decorrelate(qualified)  # scalar subqueries -> joins (refuses what it cannot maintain)
    builder = _Builder(keys, schemas)
    root, names = builder.query(qualified, {})
    finalize_ctes(root)
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
    return tree.sql(dialect=dialect_of(dialect)) if changed else sql


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
        rewrite.retarget(t, mark)
    tree = rewrite.expand_quantified(tree)  # Spark SQL cannot parse x op ANY/ALL (subquery)
    tree = rewrite.eliminate_qualify(tree)  # sqlglot's own would keep ORDER BY / LIMIT inside
    tree = rewrite.eliminate_distinct_on(tree)  # ... and drop the ORDER BY of a LIMIT
    out = tree.sql(SPARK)
    for mark, item in marks.items():
        out = out.replace(mark, item)
    return out
