"""The differentiation engine: defining query → operator tree → delta SQL. Pure Python, no JVM."""

from __future__ import annotations

from collections.abc import Mapping

from dvm.builder import compile_tree
from dvm.context import FLOAT_IDENTITY, Context, SourceRef
from dvm.errors import QueryError, TrickleError, UnsupportedError
from dvm.parser import source_keys
from dvm.plan import Plan


def compile_query(sql: str, schemas: Mapping[str, list[tuple[str, str]]], dialect: str = "spark") -> Plan:
    """Compile a defining query; raise QueryError / UnsupportedError on what cannot be maintained."""
    root, names, notes = compile_tree(sql, schemas, dialect)
    return Plan(root, names, notes)


__all__ = ["compile_query", "source_keys", "Plan", "FLOAT_IDENTITY", "Context", "SourceRef", "QueryError",
           "UnsupportedError", "TrickleError"]
