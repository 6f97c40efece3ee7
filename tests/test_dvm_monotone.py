"""Edge classes (dvm.monotone): which sources a query reads monotonically. Pure, no Spark.

A false "monotone" would let a cycle converge to a wrong fixpoint, so every position the seed names
non-monotone is checked here, and so is the conservative default for constructs not known to be monotone."""

from __future__ import annotations

import pytest

import dvm
from dvm.monotone import classify

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

SCHEMAS = {t: [("src", "int"), ("dst", "int")] for t in ("e", "b", "x")}


def classes(query: str) -> dict[str, str]:
    return {k: c.describe() for k, c in classify(dvm.compile_query(query, SCHEMAS).root, dvm.source_keys(query)).items()}


@pytest.mark.parametrize("query, want", [
    ("SELECT src, dst FROM e UNION SELECT src, dst FROM b", {"e": "monotone", "b": "monotone"}),
    ("SELECT src, dst FROM e UNION ALL SELECT src, dst FROM b", {"e": "monotone", "b": "monotone"}),
    ("SELECT y.src, e.dst FROM b y JOIN e ON y.dst = e.src WHERE e.src > 1", {"b": "monotone", "e": "monotone"}),
    ("SELECT DISTINCT src FROM e", {"e": "monotone"}),
    ("SELECT src FROM e WHERE EXISTS (SELECT 1 FROM b WHERE b.src = e.dst)", {"e": "monotone", "b": "monotone"}),
    ("SELECT src, dst FROM e INTERSECT SELECT src, dst FROM b", {"e": "monotone", "b": "monotone"}),
])
def test_monotone_positions(query: str, want: dict[str, str]) -> None:
    assert classes(query) == want


@pytest.mark.parametrize("query, source, operator", [
    ("SELECT src FROM e WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.src = e.dst)", "b", "NOT EXISTS / NOT IN"),
    ("SELECT src FROM e WHERE src NOT IN (SELECT src FROM b)", "b", "NOT EXISTS / NOT IN"),
    ("SELECT src, dst FROM e EXCEPT SELECT src, dst FROM b", "b", "EXCEPT right side"),
    ("SELECT src, COUNT(*) AS n FROM b GROUP BY src", "b", "aggregate input"),
    ("SELECT src, MAX(dst) AS m FROM b GROUP BY src", "b", "aggregate input"),
    ("SELECT src, ROW_NUMBER() OVER (PARTITION BY src ORDER BY dst) AS r FROM b", "b", "window function input"),
    ("SELECT src, dst FROM b ORDER BY src, dst LIMIT 3", "b", "ORDER BY ... LIMIT input"),
    ("SELECT e.src, b.dst FROM e LEFT JOIN b ON e.dst = b.src", "b", "LEFT JOIN right side"),
    ("SELECT e.src, b.dst FROM e FULL JOIN b ON e.dst = b.src", "e", "FULL OUTER JOIN"),
    ("SELECT src FROM e WHERE src > (SELECT MAX(src) FROM b)", "b", "aggregate input"),
    ("SELECT src FROM e WHERE src IN (SELECT src FROM b) OR dst = 1", "b", "mark join"),
])
def test_non_monotone_positions_name_their_operator(query: str, source: str, operator: str) -> None:
    got = classes(query)[source]
    assert got.startswith("non-monotone (") and operator in got, got


def test_the_monotone_side_of_a_non_monotone_operator_stays_monotone() -> None:
    got = classes("SELECT src, dst FROM e EXCEPT SELECT src, dst FROM b")
    assert got["e"] == "monotone"
    got = classes("SELECT src FROM e WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.src = e.dst)")
    assert got["e"] == "monotone"


def test_a_source_read_twice_is_non_monotone_if_either_read_is() -> None:
    got = classes("SELECT src, dst FROM b UNION SELECT src, dst FROM e WHERE NOT EXISTS "
                  "(SELECT 1 FROM b WHERE b.src = e.src)")
    assert got["b"].startswith("non-monotone"), got
