"""What the builder reads off a query's syntax tree: function and generator names, the arity of a
generator, LIMIT / OFFSET as numbers, a query's output names, and the tie-break that makes an ``ORDER BY
... LIMIT`` inside a LATERAL subquery pick the same rows at every evaluation. Pure functions of the AST."""

from __future__ import annotations

from sqlglot import exp

from dvm.dialect import SPARK
from dvm.errors import QueryError, UnsupportedError


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


def orderable(ty: str | None) -> bool:
    """Spark can sort this type (maps and variants cannot be ordered)."""
    return ty is None or not any(t in ty.lower() for t in ("map<", "variant"))


def select_names(q: exp.Expression) -> list[str]:
    """Output names of a query: those of its leftmost SELECT."""
    while isinstance(q, (exp.SetOperation, exp.Subquery)):
        q = q.this
    if not isinstance(q, exp.Select):
        raise QueryError(f"cannot name the columns of {q.sql(SPARK)[:60]}")
    return [e.alias_or_name for e in q.expressions]
