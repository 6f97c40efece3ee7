"""Parse, check and build: the defining query's SQL text to the root of its operator tree.

sqlglot parses the query in the dialect it is written in and qualifies every column against the sources'
schemas (each source renamed to a flat placeholder first); :mod:`dvm.builder.checks` refuses what cannot be
maintained; the :class:`Builder` then walks the qualified AST clause by clause into the operators of
:mod:`dvm.operators`. From there on everything is rendered as Spark SQL."""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

import dvm.operators.aggregates as aggregates
from dvm import rewrite
from dvm.builder.aggregate import AggregateClause
from dvm.builder.checks import reject_unsupported
from dvm.builder.ctes import CteClause
from dvm.builder.from_clause import FromClause
from dvm.builder.lateral import LateralClause
from dvm.builder.select import SelectClause
from dvm.builder.syntax import is_generator, unalias
from dvm.builder.where import WhereClause
from dvm.builder.windows import WindowClause
from dvm.dialect import SPARK
from dvm.errors import QueryError
from dvm.operators import Node
from dvm.operators.cte import finalize_ctes
from dvm.parser import parse, source_tables, table_key
from dvm.rewrites import scalar_subquery


class Builder(SelectClause, FromClause, WhereClause, AggregateClause, WindowClause, LateralClause, CteClause):
    """The whole builder: every clause module's methods over one :class:`~dvm.builder.scope.Scope`."""


def window_rewrites(tree: exp.Expression) -> exp.Expression:
    """Named windows inlined, QUALIFY and DISTINCT ON turned into ROW_NUMBER()-style subqueries: pure
    sqlglot rewrites shared by the differential and the FULL path (see :mod:`dvm.rewrite`)."""
    tree = rewrite.expand_named_windows(tree)
    tree = rewrite.eliminate_qualify(tree)
    return rewrite.eliminate_distinct_on(tree)


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
    builder = Builder(keys, schemas)
    root, names = builder.query(qualified, {})
    finalize_ctes(root)
    return root, names, builder.notes
