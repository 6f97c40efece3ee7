"""The Spark SQL dialect spark-trickle parses and renders with: sqlglot's Spark dialect, corrected where it
reads a literal differently from Spark 4.1 or renders one Spark reads back differently.

Why: a defining query is parsed with sqlglot and the delta (and FULL) SQL is rendered from that tree, so a
literal sqlglot misreads changes the query silently. Measured against Spark 4.1.1 with sqlglot 30:

* ``'it''s'``: Spark 4.1 reads a doubled quote inside a quoted string as one quote (SPARK-52545; the
  internal ``spark.sql.legacy.consecutiveStringLiterals.enabled`` restores the old reading); sqlglot reads
  two adjacent strings ``'it' 's'`` and renders ``CONCAT('it', 's')``, so ``WHERE name = 'O''Brien'``
  matched nothing. The same for ``"a""b"`` (Spark: ``a"b``).
* ``r'a' 'b'`` (a raw string next to another string): Spark concatenates every adjacent string literal
  into one literal; sqlglot does so only for plain strings (as ``CONCAT(...)``, which also renames an
  unaliased column) and refuses the raw one.
* ``DATE '2024-01-02'::STRING`` (any typed literal followed by ``::``, ``[...]`` or ``.field``): sqlglot
  applies the operator to the string before the type, ``CAST(CAST('2024-01-02' AS STRING) AS DATE)``;
  ``TIMESTAMP '2024-01-02 03:04:05'::DATE`` came back as midnight of a TIMESTAMP instead of a DATE.
* ``-128Y``, ``-32768S``, ``-9223372036854775808L``: Spark reads the sign as part of the literal; sqlglot
  renders ``-CAST(128 AS TINYINT)``, which overflows. ``1.000...0001D`` (more than 38 digits) is a
  DOUBLE to Spark; rendered as ``CAST(1.000...0001 AS DOUBLE)`` it is a decimal Spark refuses. And
  ``1.5L`` (which Spark refuses) rendered as ``CAST(1.5 AS BIGINT)`` was accepted as 1.

What this dialect changes:

* tokenizer: ``''`` inside ``'...'`` and ``""`` inside ``"..."`` are an escaped quote (backslash escapes
  stay as they are); raw strings keep no escapes, as in Spark;
* parser: adjacent string literals (plain or raw) become one literal, as Spark's parser builds them;
  ``<type> '<text>'`` is a typed literal: the cast of the literal, marked so it renders as written, with
  operators after it applied to the typed value; a numeric literal with a type suffix (``10L``, ``1Y``,
  ``1S``, ``1D``, ``1F``, ``1.5BD``) keeps its suffix;
* generator: renders those marked casts back as the literal (``DATE '2024-01-02'``, ``-128Y``,
  ``1.5BD``). A quote inside a string is rendered ``\\'`` (sqlglot's Spark escape), which every Spark
  version, and sqlglot's stock Spark dialect, read as one quote whatever the legacy setting above.

Not covered (Spark settings the dvm layer cannot see): ``spark.sql.ansi.doubleQuotedIdentifiers`` (then
``"x"`` is a column, here it stays a string), ``spark.sql.parser.escapedStringLiterals`` (then backslashes
are not escapes) and the legacy consecutive-string setting above.

Use :data:`SPARK` (an instance) wherever the project parses or renders Spark SQL, and :func:`dialect_of`
where a caller names a dialect: ``"spark"`` means this one. A defining query may be written in another
sqlglot dialect (``create_stream_table(..., dialect="postgres")``): it is parsed in that dialect, and
everything after the parse (qualifying, typing, the delta and FULL SQL) works on the tree and renders
Spark SQL with :data:`SPARK`.
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect, DialectType
from sqlglot.dialects.spark import Spark
from sqlglot.tokens import TokenType

from dvm.errors import QueryError

#: meta key on a Cast that stands for a literal as written: "typed" (``DATE '...'``) or the numeric suffix
LITERAL = "trickle_literal"

#: Spark's numeric literal suffixes (sqlglot tokenizes ``10L`` as ``10 :: BIGINT``)
SUFFIXES = frozenset(Spark.Tokenizer.NUMERIC_LITERALS)

#: string tokens Spark concatenates when they are adjacent
_STRINGS = frozenset({TokenType.STRING, TokenType.RAW_STRING})


class TrickleSpark(Spark):
    """sqlglot's Spark dialect with Spark 4.1's reading of literals (see the module docstring)."""

    class Tokenizer(Spark.Tokenizer):
        # the backslash first: the generator escapes a quote with STRING_ESCAPES[0]
        STRING_ESCAPES = ["\\", "'", '"']

    class Parser(Spark.Parser):
        # a raw string is a plain string literal once read (Spark has no other kind): r'\d' is '\\d'
        PRIMARY_PARSERS = {
            **Spark.Parser.PRIMARY_PARSERS,
            TokenType.RAW_STRING: lambda self, token: self.expression(exp.Literal.string(token.text)),
        }

        def _parse_atom(self) -> exp.Expr | None:
            if self._curr and self._curr.token_type in _STRINGS and self._next and self._next.token_type in _STRINGS:
                return None  # adjacent strings: one literal, built by _parse_primary
            return super()._parse_atom()

        def _parse_primary(self) -> exp.Expr | None:
            if not (self._curr and self._curr.token_type in _STRINGS and self._next
                    and self._next.token_type in _STRINGS):
                return super()._parse_primary()
            text = ""
            while self._curr and self._curr.token_type in _STRINGS:
                text += self._curr.text  # a raw string's text is as written, a plain one's unescaped
                self._advance()
            return self.expression(exp.Literal.string(text))

        def _parse_type(self, parse_interval: bool = True, fallback_to_identifier: bool = False
                        ) -> exp.Expr | None:
            curr, nxt = self._curr, self._next
            if (fallback_to_identifier or curr is None or nxt is None or nxt.token_type not in _STRINGS
                    or curr.token_type not in self.TYPE_TOKENS or curr.token_type == TokenType.INTERVAL):
                return super()._parse_type(parse_interval, fallback_to_identifier)
            index = self._index
            to = self._parse_types(check_func=True, allow_identifiers=False)
            if not isinstance(to, exp.DataType) or self._curr is None or self._curr.token_type not in _STRINGS:
                self._retreat(index)
                return super()._parse_type(parse_interval, fallback_to_identifier)
            self._advance()  # one string: Spark refuses DATE '2024-01-02' 'x'
            if self._curr is not None and self._curr.token_type in _STRINGS:
                self.raise_error("a typed literal takes a single string")
            cast = self.expression(exp.Cast(this=exp.Literal.string(self._prev.text), to=to))
            cast.meta[LITERAL] = "typed"
            return self._parse_column_ops(cast)  # DATE '...'::STRING casts the date, as in Spark

        def build_cast(self, strict: bool, **kwargs: Any) -> exp.Expr:
            suffix = self._prev.text.upper() if self._prev is not None else ""
            before = self._tokens[self._index - 2] if self._index >= 2 else None
            # a suffix is tokenized as "::" and a type token at the number's own position
            written = (suffix in SUFFIXES and before is not None and before.token_type == TokenType.DCOLON
                       and before.start == self._prev.start)
            node = super().build_cast(strict, **kwargs)
            if written:
                node.meta[LITERAL] = suffix
            return node

    class Generator(Spark.Generator):
        def cast_sql(self, expression: exp.Cast, safe_prefix: str | None = None) -> str:
            kind = expression.meta_get(LITERAL)
            this = expression.this
            if kind == "typed" and isinstance(this, exp.Literal) and this.is_string:
                return f"{self.sql(expression, 'to')} {self.sql(this)}"
            if kind in SUFFIXES and isinstance(this, exp.Literal):
                return f"{this.name}{kind}"
            return super().cast_sql(expression, safe_prefix)


def quote(name: str) -> str:
    """Backtick-quote one identifier for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal for ``value`` (backslash escapes, read the same whatever the legacy
    settings named in the module docstring)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: the dialect instance to parse and render with (an instance: sqlglot builds one per call from a name)
SPARK = TrickleSpark()


def rendered_once(owner: Any, slot: str, exprs: list[exp.Expression]) -> list[str]:
    """``exprs`` as Spark SQL, kept on ``owner`` (a plan or one of its operators) under ``slot``: sqlglot's
    generator costs 20-40 us a call, and each refresh of a stream table renders the same group and projection
    expressions several times. Rendered again when ``exprs`` are other objects (checked by identity: a plan
    never changes an expression in place)."""
    ids = [id(e) for e in exprs]
    kept = owner.__dict__.get(slot)
    if kept is None or kept[0] != ids:
        kept = owner.__dict__[slot] = (ids, [e.sql(SPARK) for e in exprs])
    return kept[1]


def dialect_of(dialect: DialectType) -> Dialect:
    """The dialect to use for a dialect a caller names: ``"spark"`` (any case) is :data:`SPARK`, any other
    is sqlglot's."""
    if isinstance(dialect, str) and dialect.lower() == "spark":
        return SPARK
    return Dialect.get_or_raise(dialect)


def check_dialect(name: str) -> str:
    """``name`` checked as the dialect a defining query is written in: a sqlglot dialect name, returned lower
    case. Why here: the dialect is kept with a stream table and every refresh parses its query in it, so an
    unknown name is refused when the table is declared, naming the known ones."""
    key = name.strip().lower() if isinstance(name, str) else ""
    try:
        if not key:
            raise ValueError(name)
        dialect_of(key)
    except ValueError:
        known = ", ".join(sorted(d for d, cls in Dialect.classes.items() if d and cls is not TrickleSpark))
        raise QueryError(f"unknown SQL dialect {name!r}: use one of {known}") from None
    return key


def _memoize_type_names() -> None:
    """Make sqlglot's ``DataType.from_str`` parse each type name once per process.

    Why: sqlglot builds a type from its name by running its whole parser over the name, and it does that for
    every CAST its Hive-family parser reads (``is_type("char", "varchar")``) and every type its generators
    compare. On the delta SQL of a refresh (tens of kB, hundreds of CASTs) those parses were a fifth of
    parsing and rendering it. A name read again gets a copy of its first parse (a type node is mutable).
    Only plain calls are memoized: a dialect given by name or none, no extra arguments."""
    original = exp.DataType.from_str.__func__  # type: ignore[attr-defined]
    parsed: dict[tuple[Any, ...], exp.DataType] = {}

    def from_str(cls: Any, dtype: str, dialect: DialectType = None, udt: bool = False, **kwargs: Any) -> Any:
        if kwargs or not (dialect is None or isinstance(dialect, str)):
            return original(cls, dtype, dialect, udt, **kwargs)
        key = (cls, dtype, dialect, udt)
        hit = parsed.get(key)
        if hit is None:
            if len(parsed) > 4096:  # bounded: type names come from queries
                parsed.clear()
            hit = parsed[key] = original(cls, dtype, dialect, udt)
        return hit.copy()

    exp.DataType.from_str = classmethod(from_str)  # type: ignore[method-assign,assignment]


_memoize_type_names()
