"""Rewrites of the qualified sqlglot AST into forms the operator tree maintains (pure sqlglot, no Spark)."""
