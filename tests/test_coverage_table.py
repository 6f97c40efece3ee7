"""docs/COVERAGE.md is generated from the COVERAGE rows of the oracle test modules and checked against the
engine (tests/coverage_table.py): these tests fail when a row no longer tells the truth or the committed
table is stale, and check that the checker itself catches a wrong row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import coverage_table
import pytest
from coverage_rows import SCHEMA, Row

from dvm.parser import pin_sources


def test_every_coverage_row_passes_its_check() -> None:
    _, problems = coverage_table.collect()
    problems += coverage_table._graph_problems()  # the rows of the graph of stream tables name live tests
    assert not problems, "coverage rows that do not hold:\n" + "\n".join(problems)


def test_docs_coverage_md_is_generated_from_the_rows() -> None:
    text, _ = coverage_table.generate()
    doc = coverage_table.DOC
    current = doc.read_text(encoding="utf-8") if doc.exists() else ""
    assert current == text, f"{doc} is out of date: run {coverage_table.WRITE_COMMAND}"


ORACLE_MODULE = '''
import os
from oracle import run_oracle

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))
FEW = 5


def test_good(spark, st):
    run_oracle(spark, st, [], {}, cycles=CYCLES, seed=1)


def _helper(spark, st):
    run_oracle(spark, st, [], {})


def test_through_helper(spark, st):
    _helper(spark, st)


def test_few(spark, st):
    run_oracle(spark, st, [], {}, cycles=FEW)


def test_auto(spark, st):
    run_oracle(spark, st, [], {}, mode="AUTO")


def test_no_oracle(spark, st):
    assert True


@pytest.mark.slow
def test_slow(spark, st):
    run_oracle(spark, st, [], {})
'''


@pytest.mark.parametrize(
    ("status", "example", "test", "needle"),
    [
        ("DIFFERENTIAL", "SELECT id, v FROM a WHERE v > 1", "test_good", None),
        ("DIFFERENTIAL", "SELECT id, v FROM a WHERE v > 1", "test_through_helper", None),
        ("recompute-scoped", "SELECT k, COUNT(DISTINCT v) AS n FROM a GROUP BY k", "test_good", None),
        ("recompute-scoped", "SELECT id, v FROM a", "test_good", "plan is DIFFERENTIAL"),
        ("DIFFERENTIAL", "SELECT k, SUM(v) AS s FROM a GROUP BY k HAVING SUM(v) > 1", "test_good",
         "plan is recompute-scoped"),
        ("DIFFERENTIAL", "SELECT id FROM a", "test_few", "5 cycles"),
        ("DIFFERENTIAL", "SELECT id FROM a", "test_auto", "mode 'AUTO'"),
        ("DIFFERENTIAL", "SELECT id FROM a", "test_no_oracle", "does not call run_oracle"),
        ("DIFFERENTIAL", "SELECT id FROM a", "test_slow", "marked"),
        ("DIFFERENTIAL", "SELECT id FROM a", "test_missing", "does not exist"),
        ("DIFFERENTIAL", "SELECT id FROM a", None, "must name its oracle test"),
        ("DIFFERENTIAL", "SELECT id, rand() AS r FROM a", "test_good", "compiling the example fails"),
        ("FULL-only", "SELECT id, rand() AS r FROM a", None, None),
        ("FULL-only", "SELECT id FROM a", None, "compiles"),
        ("FULL-only", "SELECT id, rand() AS r FROM a", "test_good", "names no oracle test"),
        ("rejected", "SELECT id FROM a; SELECT id FROM b", None, None),
        ("rejected", "SELECT id, rand() AS r FROM a", None, None),
        ("rejected", "SELECT id FROM a", None, "compiles"),
    ],
)
def test_the_checker_catches_wrong_rows(tmp_path: Path, status: str, example: str, test: str | None,
                                        needle: str | None) -> None:
    path = tmp_path / "test_oracle_fake.py"
    path.write_text("import pytest\n" + ORACLE_MODULE, encoding="utf-8")
    checked = coverage_table.check_row("test_oracle_fake", Row("x", status, example, test), path)  # type: ignore[arg-type]
    if needle is None:
        assert not checked.problems, checked.problems
    else:
        assert any(needle in p for p in checked.problems), checked.problems


def test_full_only_examples_are_spark_queries(spark: Any) -> None:
    """A FULL-only row claims AUTO refreshes it FULL: Spark must accept the query the FULL refresh runs
    (the example with its sources pinned). Analysis only, over empty views of the coverage schema."""
    for name, cols in SCHEMA.items():
        body = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in cols)
        spark.sql(f"CREATE OR REPLACE TEMP VIEW _cov_{name} AS SELECT {body} WHERE FALSE")
    sections, _ = coverage_table.collect()
    failures = []
    for c in (c for s in sections for c in s.rows if c.row.status == "FULL-only"):
        pinned = pin_sources(c.row.example, {k: f"_cov_{k}" for k in SCHEMA})
        try:
            spark.sql(pinned).schema  # noqa: B018 - analysis is the check
        except Exception as e:  # noqa: BLE001 - collect every failure
            failures.append(f"{c.module}: {c.row.construct!r}: {str(e).splitlines()[0][:200]}")
    assert not failures, "FULL-only examples Spark cannot run:\n" + "\n".join(failures)
