"""Rows of the SQL coverage table (docs/COVERAGE.md), declared next to the tests that prove them.

Why here and not in the docs: a table written by hand drifts from the engine. Each oracle test module
declares ``COVERAGE: list[Row]`` for the constructs it exercises; a checker compiles every row's example
query against :data:`SCHEMA` (pure sqlglot, no Spark) to confirm its status, checks that a row marked
DIFFERENTIAL or recompute-scoped names an oracle test of its module, and regenerates the table; a test
fails when the committed table differs from the generated one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["DIFFERENTIAL", "recompute-scoped", "FULL-only", "rejected"]

#: The fixed schema every row's example query is written against (``{a}`` etc. are not used here: the
#: example names the tables directly). ``a`` and ``b`` are keyed on ``id``; ``c`` is keyless.
SCHEMA: dict[str, list[tuple[str, str]]] = {
    "a": [("id", "int"), ("k", "int"), ("v", "int"), ("s", "string"), ("x", "double")],
    "b": [("id", "int"), ("k", "int"), ("v", "int"), ("s", "string"), ("x", "double")],
    "c": [("k", "int"), ("v", "int"), ("s", "string"), ("arr", "array<int>")],
}


@dataclass(frozen=True)
class Row:
    """One construct of the coverage table.

    ``construct``: what a user would look for ("FULL OUTER JOIN", "STDDEV_SAMP", "ROW_NUMBER() OVER").
    ``status``: DIFFERENTIAL (delta computed from the changes only), recompute-scoped (the refresh is
    DIFFERENTIAL but recomputes the groups / partitions / rows the changes touch), FULL-only (compiles
    only for a FULL refresh; AUTO falls back) or rejected (an error naming the construct).
    ``example``: a query over :data:`SCHEMA` that uses the construct.
    ``test``: the oracle test function (in the declaring module) that proves it; required for
    DIFFERENTIAL and recompute-scoped rows.
    ``reason``: why, for recompute-scoped / FULL-only / rejected rows (shown in the table).
    """

    construct: str
    status: Status
    example: str
    test: str | None = None
    reason: str = ""
