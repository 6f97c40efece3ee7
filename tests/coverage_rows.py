"""Rows of the SQL coverage table (docs/COVERAGE.md), declared next to the tests that prove them.

Why here and not in the docs: a table written by hand drifts from the engine. Each oracle test module
declares ``COVERAGE: list[Row]`` for the constructs it exercises; ``tests/coverage_table.py`` compiles every
row's example query against :data:`SCHEMA` (pure sqlglot, no Spark) to confirm its status, checks that a row
marked DIFFERENTIAL or recompute-scoped names an oracle test running ``run_oracle`` with >= 20 cycles, and
regenerates the table (``.venv/bin/python tests/coverage_table.py --write``); ``tests/test_coverage_table.py``
fails when a row fails its check or the committed table differs from the generated one.

The status of a compiling query is not chosen but derived: *recompute-scoped* when some operator of its plan
recomputes what a change touches (``Node.recompute()``: by default a ``strategy()`` text that says
"recompute" or "rescan"; ``Plan.recomputes()``), DIFFERENTIAL otherwise.

A module may also set ``COVERAGE_TITLE`` (its section heading; default from the module name) and
``COVERAGE_ORDER`` (sections are sorted by it, default 50, then by module name).
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
    DIFFERENTIAL but recomputes the groups / partitions / rows the changes touch), FULL-only (not maintained
    differentially yet: compiling raises, AUTO falls back to FULL, Spark must run the example) or rejected
    (not maintainable by design: compiling raises an error naming the construct).
    ``example``: a query over :data:`SCHEMA` that uses the construct.
    ``test``: the oracle test function that proves it, ``test_x`` in the declaring module or
    ``test_oracle_y.py::test_x`` in another one; required for DIFFERENTIAL and recompute-scoped rows, and
    refused for the others.
    ``reason``: shown in the table: why, for FULL-only / rejected rows (empty: the engine's error message);
    a note on how, for the others (what a recompute-scoped row recomputes is taken from the plan).
    """

    construct: str
    status: Status
    example: str
    test: str | None = None
    reason: str = ""
