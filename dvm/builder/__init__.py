"""The builder: a qualified defining query → the operator tree of :mod:`dvm.operators`, clause by clause.

Rooms: ``compile`` (parse, check, qualify, then build), ``checks`` (what is refused before building),
``scope`` (internal column names), ``select`` (SELECT and set operations), ``from_clause`` (tables,
derived tables, joins), ``where`` (filters and subquery predicates), ``aggregate`` (GROUP BY),
``windows`` (window functions, top-k sort keys), ``lateral`` (generators, LATERAL), ``ctes`` (shared and
recursive CTEs), ``syntax`` (what is read off the AST).
"""

from dvm.builder.compile import compile_tree

__all__ = ["compile_tree"]
