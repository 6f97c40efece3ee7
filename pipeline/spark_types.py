"""Spark's type of an expression in a rendered delta query, decimals to the precision: what DuckDB needs to
divide and hash decimals exactly as Spark does (see :mod:`pipeline.local_engine`).

Why: Spark types decimal arithmetic by its own rules (``DecimalPrecision``: a product of DECIMAL(15,2)s is a
DECIMAL(31,4), a sum adds 10 digits of precision, a quotient's scale is max(6, s1 + p2 + 1), all capped at 38
digits by giving up scale), DuckDB by others (the same product is a DECIMAL(18,4), a sum is a DECIMAL(38,s),
a quotient a DOUBLE). The values of sums, differences and products agree, but a quotient is rounded at
Spark's result scale, and ``xxhash64`` hashes a decimal of up to 18 digits as a long and a longer one as
bytes. So where those two meet a decimal, the translation asks here for Spark's type.

:func:`spark_type` walks the expression and resolves columns through the query's scopes (derived tables,
CTEs, stars, UNION branches) down to relations whose types it is given. It returns None for anything it
does not know; the caller then leaves the delta to Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: a Spark type: "BIGINT", "INT", "DOUBLE", "STRING", ... or a :class:`Decimal`
SparkType = Any

_INT_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INT": 10, "BIGINT": 20}
_INTEGRAL = tuple(_INT_DIGITS)
_FLOATING = ("DOUBLE", "FLOAT")


@dataclass(frozen=True)
class Decimal:
    precision: int
    scale: int


def bounded(p: int, s: int) -> Decimal:
    """Spark's ``DecimalType.adjustPrecisionScale`` (precision loss allowed, its default): past 38 digits
    the integral part is kept and the scale gives way, down to 6."""
    if p <= 38:
        return Decimal(p, s)
    int_digits = p - s
    return Decimal(38, max(38 - int_digits, min(s, 6)))


def _as_decimal(t: SparkType, literal: Any = None) -> Decimal | None:
    if isinstance(t, Decimal):
        return t
    if t in _INT_DIGITS:
        if literal is not None:  # Spark's literalPickMinimumPrecision: an integral literal takes its own digits
            return Decimal(max(len(str(abs(int(literal)))), 1), 0)
        return Decimal(_INT_DIGITS[t], 0)
    return None


def _numeric(a: SparkType, b: SparkType) -> SparkType:
    """The type of integral arithmetic, or DOUBLE when a side is floating."""
    if a in _FLOATING or b in _FLOATING:
        return "DOUBLE"
    if a in _INTEGRAL and b in _INTEGRAL:
        return max(a, b, key=list(_INT_DIGITS).index)
    return None


def wider(a: SparkType, b: SparkType) -> SparkType:
    """Spark's common type of two branches (CASE, COALESCE, UNION): decimals keep the larger scale and the
    larger integral part."""
    if a is None or b is None:
        return None
    if a == "VOID":
        return b
    if b == "VOID":
        return a
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        if a in _FLOATING or b in _FLOATING:
            return "DOUBLE"
        da, db = _as_decimal(a), _as_decimal(b)
        if da is None or db is None:
            return None
        s = max(da.scale, db.scale)
        rng = max(da.precision - da.scale, db.precision - db.scale)
        return Decimal(min(rng + s, 38), min(s, 38))
    if a == b:
        return a
    return _numeric(a, b)


def arithmetic(op: str, a: SparkType, b: SparkType, a_literal: Any = None, b_literal: Any = None) -> SparkType:
    """The type of ``a op b`` (op one of + - * /)."""
    if a is None or b is None:
        return None
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        if a in _FLOATING or b in _FLOATING:
            return "DOUBLE"
        da, db = _as_decimal(a, a_literal), _as_decimal(b, b_literal)
        if da is None or db is None:
            return None
        p1, s1, p2, s2 = da.precision, da.scale, db.precision, db.scale
        if op in "+-":
            s = max(s1, s2)
            return bounded(max(p1 - s1, p2 - s2) + s + 1, s)
        if op == "*":
            return bounded(p1 + p2 + 1, s1 + s2)
        s = max(6, s1 + p2 + 1)
        return bounded(p1 - s1 + s2 + s, s)
    if op == "/":
        return "DOUBLE" if (a in _INTEGRAL + _FLOATING and b in _INTEGRAL + _FLOATING) else None
    return _numeric(a, b)


def parse_type(text: str) -> SparkType:
    """A Spark type from its SQL name (``decimal(15,2)``, ``bigint``, ``string`` ...)."""
    t = text.strip().upper().replace(" ", "")
    if t.startswith("DECIMAL") or t.startswith("NUMERIC"):
        inner = t[t.find("(") + 1:t.rfind(")")] if "(" in t else "10,0"
        p, _, s = inner.partition(",")
        return Decimal(int(p), int(s or 0))
    aliases = {"INTEGER": "INT", "LONG": "BIGINT", "SHORT": "SMALLINT", "BYTE": "TINYINT", "REAL": "FLOAT",
               "VARCHAR": "STRING", "TEXT": "STRING", "BOOL": "BOOLEAN"}
    return aliases.get(t, t)


#: a CAST's target type node (compared by structure) -> its Spark type: rendering the node is the dear part
_CAST_TYPES: dict[Any, SparkType] = {}


def _cast_type(to: Any) -> SparkType:
    """Spark's type of a CAST to ``to`` (a sqlglot DataType), memoized per process (bounded)."""
    found = _CAST_TYPES.get(to)
    if found is None:
        if len(_CAST_TYPES) > 4096:
            _CAST_TYPES.clear()
        found = _CAST_TYPES[to.copy()] = parse_type(to.sql("spark"))
    return found


class Scopes:
    """Spark types of a rendered query's expressions. ``relations``: the columns of every relation it reads
    by name (as the FROM item spells it), each a dict of column name to Spark type."""

    def __init__(self, relations: dict[str, dict[str, SparkType]]) -> None:
        self.relations = relations
        self._outputs: dict[int, dict[str, SparkType] | None] = {}

    # --- a query's output columns --------------------------------------------------------------------------

    def context(self, node: Any) -> tuple[Any, dict[str, Any]]:
        """The SELECT ``node`` belongs to, and the CTEs visible there."""
        from sqlglot import exp

        chain = []
        parent = node.parent
        while parent is not None:
            chain.append(parent)
            parent = parent.parent
        ctes: dict[str, Any] = {}
        for anc in reversed(chain):
            ctes = self._with(anc, ctes)
        return node.find_ancestor(exp.Select), ctes

    def outputs(self, query: Any, ctes: dict[str, Any]) -> dict[str, SparkType] | None:
        """The output columns of ``query`` (Select, Union, Subquery) with their types; None if unknown."""
        from sqlglot import exp

        key = id(query)
        if key in self._outputs:
            return self._outputs[key]
        self._outputs[key] = None  # a cycle (never in rendered SQL) stays unknown
        ctes = self._with(query, ctes)
        out: dict[str, SparkType] | None
        if isinstance(query, exp.Subquery):
            out = self.outputs(query.this, ctes)
        elif isinstance(query, exp.Union | exp.Except | exp.Intersect):
            left, right = self.outputs(query.left, ctes), self.outputs(query.right, ctes)
            if left is None or right is None or len(left) != len(right):
                out = None
            else:
                out = {n: wider(t, u) for (n, t), u in zip(left.items(), right.values(), strict=True)}
        elif isinstance(query, exp.Select):
            out = {}
            for e in query.expressions:
                if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                    star = self._star(query, ctes, e.table if isinstance(e, exp.Column) else "")
                    if star is None:
                        out = None
                        break
                    out.update(star)
                else:
                    out[e.alias_or_name] = self.type_of(e, query, ctes)
        else:
            out = None
        self._outputs[key] = out
        return out

    def _with(self, query: Any, ctes: dict[str, Any]) -> dict[str, Any]:
        w = query.args.get("with_") or query.args.get("with")
        if not w:
            return ctes
        ctes = dict(ctes)
        for cte in w.expressions:
            ctes[cte.alias] = (cte.this, dict(ctes))
        return ctes

    def _sources(self, select: Any, ctes: dict[str, Any]) -> list[tuple[str, dict[str, SparkType] | None]]:
        """(alias, columns) of each FROM item, join and LATERAL VIEW of ``select``."""
        from sqlglot import exp

        items = []
        frm = select.args.get("from_") or select.args.get("from")
        if frm is not None:
            items.append(frm.this)
        items += [j.this for j in select.args.get("joins") or []]
        out = []
        for item in items:
            alias = item.alias_or_name
            if isinstance(item, exp.Table) and isinstance(item.this, exp.Anonymous):  # table_changes_by_path
                args = item.this.expressions
                out.append((alias, self.relations.get(f"changes:{args[0].name}") if args else None))
            elif isinstance(item, exp.Table):
                name = item.name if not item.db else f"{item.db}.{item.name}"
                if not item.db and item.name in ctes:
                    query, scope = ctes[item.name]
                    out.append((alias, self.outputs(query, scope)))
                else:
                    out.append((alias, self.relations.get(name)))
            elif isinstance(item, exp.Subquery):
                out.append((alias, self.outputs(item.this, ctes)))
            elif isinstance(item, exp.Values) and item.expressions:
                cols = item.args.get("alias")
                names = [c.name for c in cols.columns] if cols is not None else []
                first = item.expressions[0].expressions
                types = [self.type_of(v, select, ctes) for v in first]
                out.append((alias, dict(zip(names, types, strict=False)) if len(names) == len(types) else None))
            else:
                out.append((alias, None))
        for lateral in select.args.get("laterals") or []:
            cols = lateral.args.get("alias")
            names = [c.name for c in cols.columns] if cols is not None else []
            out.append((cols.name if cols is not None else "", {n: None for n in names}))
        return out

    def _star(self, select: Any, ctes: dict[str, Any], table: str) -> dict[str, SparkType] | None:
        out: dict[str, SparkType] = {}
        for alias, cols in self._sources(select, ctes):
            if table and alias != table:
                continue
            if cols is None:
                return None
            out.update(cols)
        return out

    # --- an expression's type -------------------------------------------------------------------------------

    def type_of(self, e: Any, select: Any, ctes: dict[str, Any]) -> SparkType:
        """Spark's type of expression ``e`` inside ``select`` (None: unknown)."""
        from sqlglot import exp

        t = lambda x: self.type_of(x, select, ctes)  # noqa: E731
        if isinstance(e, exp.Alias | exp.Paren):
            return t(e.this)
        if isinstance(e, exp.Column):
            for alias, cols in self._sources(select, self._with(select, ctes)):
                if e.table and alias != e.table:
                    continue
                if cols is None:
                    return None
                if e.name in cols:
                    return cols[e.name]
            return None
        if isinstance(e, exp.Literal):
            if e.is_string:
                return "STRING"
            text = e.name
            if "e" in text.lower():
                return "DOUBLE"
            if "." in text:
                whole, _, frac = text.lstrip("-").partition(".")
                digits = len((whole + frac).lstrip("0")) or 1
                return Decimal(max(digits, len(frac)), len(frac))
            return "INT" if abs(int(text)) < 2 ** 31 else "BIGINT"
        if isinstance(e, exp.Null):
            return "VOID"
        if isinstance(e, exp.Boolean | exp.Predicate | exp.Connector | exp.Not | exp.Exists):
            return "BOOLEAN"
        if isinstance(e, exp.Cast | exp.TryCast):
            return _cast_type(e.to)
        if isinstance(e, exp.Add | exp.Sub | exp.Mul | exp.Div):
            op = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/"}[type(e)]
            lit = lambda x: x.name if isinstance(x, exp.Literal) and not x.is_string and x.name.lstrip("-").isdigit() else None  # noqa: E731
            return arithmetic(op, t(e.this), t(e.expression), lit(e.this), lit(e.expression))
        if isinstance(e, exp.Neg | exp.Min | exp.Max | exp.Abs):
            return t(e.this)
        if isinstance(e, exp.Sqrt):
            return "DOUBLE"
        if isinstance(e, exp.Mod):
            return _numeric(t(e.this), t(e.expression))
        if isinstance(e, exp.TsOrDsAdd):
            return "DATE"
        if isinstance(e, exp.BitwiseXor | exp.BitwiseAnd | exp.BitwiseOr):
            return _numeric(t(e.this), t(e.expression))
        if isinstance(e, exp.Count | exp.Anonymous) and (not isinstance(e, exp.Anonymous) or e.name.lower() == "xxhash64"):
            return "BIGINT"
        if isinstance(e, exp.RowNumber | exp.Rank | exp.DenseRank):
            return "INT"
        if isinstance(e, exp.Sum):
            a = t(e.this)
            if isinstance(a, Decimal):
                return Decimal(min(a.precision + 10, 38), a.scale)
            return "BIGINT" if a in _INTEGRAL else ("DOUBLE" if a in _FLOATING else None)
        if isinstance(e, exp.Avg):
            a = t(e.this)
            if isinstance(a, Decimal):
                return bounded(a.precision + 4, a.scale + 4)
            return "DOUBLE" if a in _INTEGRAL + _FLOATING else None
        if isinstance(e, exp.Window):
            return t(e.this)
        if isinstance(e, exp.Case):
            branches = [i.args.get("true") for i in e.args.get("ifs") or []] + [e.args.get("default") or exp.Null()]
            return self._widest([t(b) for b in branches])
        if isinstance(e, exp.If):
            return self._widest([t(e.args.get("true")), t(e.args.get("false") or exp.Null())])
        if isinstance(e, exp.Coalesce | exp.Greatest | exp.Least):
            return self._widest([t(e.this)] + [t(x) for x in e.expressions])
        if isinstance(e, exp.Nullif):
            return t(e.this)
        if isinstance(e, exp.Concat):
            return "STRING"
        if isinstance(e, exp.Subquery):
            cols = self.outputs(e.this, self._with(select, ctes))
            return next(iter(cols.values())) if cols and len(cols) == 1 else None
        return None

    @staticmethod
    def _widest(types: list[SparkType]) -> SparkType:
        out: SparkType = "VOID"
        for x in types:
            out = wider(out, x)
        return out
