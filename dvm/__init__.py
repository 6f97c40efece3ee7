"""The differentiation engine: defining query → operator tree → delta SQL. Pure Python, no JVM.

This module is dvm's one door: pipeline/ and connectors/ import what they use from here, never from a module
inside dvm/. Inside, :mod:`dvm.parser` reads the query, :mod:`dvm.builder` builds the operator tree of
:mod:`dvm.operators` (each operator's delta rule in its own file), :mod:`dvm.plan` renders the SQL of a
refresh over a :class:`Context` (the snapshots it reads), and :mod:`dvm.dialect` is the Spark SQL it speaks.
"""

from __future__ import annotations

from collections.abc import Mapping

from dvm import key_filter
from dvm.builder import compile_tree
from dvm.context import FLOAT_IDENTITY, HELD_SEED, PREV, Context, Fixpoint, SourceRef
from dvm.dialect import SPARK, check_dialect, dialect_of, quote
from dvm.errors import QueryError, TrickleError, UnsupportedError
from dvm.monotone import EdgeClass
from dvm.monotone import classify as classify_edges
from dvm.operators import Node, RecursiveCte, Scan
from dvm.parser import (
    FLATTEN,
    MAX_NESTING,
    analyzable,
    check_nesting,
    parse,
    pin_sources,
    source_keys,
    source_occurrences,
    source_tables,
    table_key,
)
from dvm.plan import DEL, DW, ROW_HASH, ROW_ID, Plan, plain_rows_sql
from dvm.views import ViewDef, inline_views


def compile_query(sql: str, schemas: Mapping[str, list[tuple[str, str]]], dialect: str = "spark") -> Plan:
    """Compile a defining query; raise QueryError / UnsupportedError on what cannot be maintained."""
    root, names, notes = compile_tree(sql, schemas, dialect)
    return Plan(root, names, notes)


__all__ = [
    "EdgeClass", "classify_edges", "parse", "source_occurrences", "source_tables", "dialect_of",
    # compiling a defining query, and what it reads
    "compile_query", "source_keys", "table_key", "check_nesting", "MAX_NESTING", "FLATTEN", "Plan",
    # the FULL path: the query as written over pinned snapshots
    "pin_sources", "analyzable", "plain_rows_sql",
    # views, inlined into the query before it is compiled
    "ViewDef", "inline_views",
    # what a refresh reads, and the fixpoints it evaluates for recursive CTEs
    "Context", "SourceRef", "Fixpoint", "PREV", "HELD_SEED", "FLOAT_IDENTITY", "key_filter",
    # the operator tree, as far as the pipeline looks into it
    "Node", "Scan", "RecursiveCte",
    # the hidden columns of a stream table
    "ROW_ID", "ROW_HASH", "DEL", "DW",
    # Spark SQL text, and the dialect a defining query is written in
    "SPARK", "quote", "check_dialect",
    "QueryError", "UnsupportedError", "TrickleError",
]
