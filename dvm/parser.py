"""SQL text → syntax tree, and the text-to-text rewrites done on it.

:func:`parse` reads a defining query in the dialect it is written in (Spark SQL by default) and checks it
is one SELECT query within the limits; :func:`source_keys` names the sources it reads. The FULL path runs
the query as written, with each source pinned to a snapshot (:func:`pin_sources`, rendered as Spark SQL);
the differential path builds an operator tree from it (:mod:`dvm.builder`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from dvm import rewrite
from dvm.dialect import SPARK, dialect_of
from dvm.errors import QueryError
from dvm.own_stack import on_own_stack


def table_key(table: exp.Table) -> str:
    """The normalised name of a source as written in the query: ``db.table`` or ``table``, lower case. A
    table read by path, ``delta.`/data/T``` (a name with a ``/``), keeps its path as written: paths are
    case-sensitive (``pipeline.api`` resolves such a key by its path)."""
    parts = [p.name for p in table.parts]
    if len(parts) == 2 and "/" in parts[1]:
        return f"{parts[0].lower()}.{parts[1]}"
    return ".".join(parts).lower()


#: Deepest nesting of parentheses, brackets and CASE a defining query may have (:func:`check_nesting`, at
#: create). The parser takes far more under :data:`dvm.own_stack.PARSER_FRAMES`; the limit is for what comes after it:
#: sqlglot's renderer needs up to 12 frames a level (derived tables), a delta query wraps the user's
#: expressions in a few levels more, and Spark's own parser and analyzer recurse per level too.
MAX_NESTING = 40

FLATTEN = ("flatten it: one CASE with several WHEN branches instead of a CASE inside a CASE, x IN (...) or a "
           "join with a table of values instead of nested conditions, AND / OR chains without parentheses "
           "(chains of any length are fine), or a CTE instead of nested subqueries")

_Statements = list[exp.Expression | None]


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


def source_occurrences(sql: str, dialect: str = "spark") -> list[str]:
    """The source key of each table reference of the query, in the order :func:`pin_sources` numbers them."""
    return [table_key(t) for t in source_tables(parse(sql, dialect))]


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


def pin_sources(sql: str, from_items: Mapping[str, str] | Callable[[str, int], str], dialect: str = "spark") -> str:
    """Rewrite a query so each source reads a fixed snapshot.

    ``from_items`` maps each source key to the Spark SQL FROM item to read instead (a time-travel table
    reference or a parenthesised subquery), or is a function of (key, occurrence number) when occurrences of
    one source read different relations (a cycle's rounds, see pipeline/cycles.py). The original table name
    stays the alias, so qualified column references keep resolving. Used for FULL refreshes, including of
    queries the tree cannot represent.
    """
    tree = parse(sql, dialect)
    marks: dict[str, str] = {}
    for i, t in enumerate(source_tables(tree)):
        key = table_key(t)
        if callable(from_items):
            item = from_items(key, i)
        elif key in from_items:
            item = from_items[key]
        else:
            raise QueryError(f"unknown table {key}")
        mark = f"__trickle_pin_{len(marks)}__"
        marks[mark] = item
        rewrite.retarget(t, mark)
    tree = rewrite.expand_quantified(tree)  # Spark SQL cannot parse x op ANY/ALL (subquery)
    tree = rewrite.eliminate_qualify(tree)  # sqlglot's own would keep ORDER BY / LIMIT inside
    tree = rewrite.eliminate_distinct_on(tree)  # ... and drop the ORDER BY of a LIMIT
    out = tree.sql(SPARK)
    for mark, item in marks.items():
        out = out.replace(mark, item)
    return out
