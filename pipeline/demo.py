"""The org-chart tutorial of pg_trickle's Getting Started, on the embedded default.

"The main job on the embedded default": local Spark, Delta files under a local warehouse folder, no
servers. It shows the whole product loop in one command (``trickle demo``): source tables with Change
Data Feed, a three-layer DAG of stream tables, the four kinds of change of the tutorial (insert, insert in
the hierarchy, rename, delete) cascading through the DAG, and the refresh history that says what each
refresh did and why.

The DAG is the tutorial's::

    departments ──> department_tree ──┐
                                      ├──> department_stats ──> department_report
    employees ────────────────────────┘

Differences from the tutorial, and why:

* ``department_tree`` uses ``WITH RECURSIVE`` with UNION ALL (Spark 4.1 evaluates it natively; it has no
  recursive UNION) and is ``DIFFERENTIAL`` as in the tutorial: an insert-only window (4b) is maintained
  semi-naively, a rename (4c) by counting — exactly the tree rows whose derivation went through the old
  row are removed and re-derived through the new one (:mod:`dvm.operators.recursive`). The history at
  the end names the rule of each refresh.
* ``department_stats`` and ``department_report`` use ``AUTO`` rather than the tutorial's
  ``DIFFERENTIAL``: if the engine cannot maintain a construct yet, AUTO falls back to FULL and the history
  printed at the end says why, instead of the demo failing.
* Schedules are plain ``30s`` everywhere: ``CALCULATED`` needs the scheduler (a later issue). The demo
  refreshes by hand anyway, as the tutorial does.
* Spark has no SERIAL: employee ids are explicit (the tutorial's insertion order, Alice = 1).
* String concatenation uses ``concat`` and the salary is ``DECIMAL(10,2)`` (Spark SQL dialect).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.storage import strip_file_scheme
from pipeline.formatting import STATUS_COLUMNS, describe_refresh, format_table
from pipeline.modes import RefreshMode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.api import StreamTables

__all__ = ["run_demo", "SOURCE_TABLES", "STREAM_TABLES"]

#: Source tables, recreated on every run so the demo is repeatable. CDF on: stream tables read changes
#: from the Change Data Feed.
SOURCE_TABLES: dict[str, str] = {
    "departments": "id INT NOT NULL, name STRING NOT NULL, parent_id INT",
    "employees": "id INT NOT NULL, name STRING NOT NULL, department_id INT NOT NULL, salary DECIMAL(10,2) NOT NULL",
}

SEED_SQL = (
    # Company (1) > Engineering (2) > Backend (5), Frontend (6), Platform (7); Sales (3); Operations (4)
    "INSERT INTO departments VALUES (1, 'Company', NULL), (2, 'Engineering', 1), (3, 'Sales', 1),"
    " (4, 'Operations', 1), (5, 'Backend', 2), (6, 'Frontend', 2), (7, 'Platform', 2)",
    "INSERT INTO employees VALUES (1, 'Alice', 5, 120000), (2, 'Bob', 5, 115000), (3, 'Charlie', 6, 110000),"
    " (4, 'Diana', 7, 130000), (5, 'Eve', 3, 95000), (6, 'Frank', 3, 90000), (7, 'Grace', 4, 100000)",
)

DEPARTMENT_TREE = """\
WITH RECURSIVE tree AS (
  SELECT id, name, parent_id, name AS path, 0 AS depth
  FROM departments
  WHERE parent_id IS NULL
  UNION ALL
  SELECT d.id, d.name, d.parent_id, concat(tree.path, ' > ', d.name) AS path, tree.depth + 1 AS depth
  FROM departments d
  JOIN tree ON d.parent_id = tree.id
)
SELECT id, name, parent_id, path, depth FROM tree"""

DEPARTMENT_STATS = """\
SELECT
  t.id AS department_id,
  t.name AS department_name,
  t.path AS full_path,
  t.depth,
  COUNT(e.id) AS headcount,
  COALESCE(SUM(e.salary), 0) AS total_salary,
  COALESCE(AVG(e.salary), 0) AS avg_salary
FROM department_tree t
LEFT JOIN employees e ON e.department_id = t.id
GROUP BY t.id, t.name, t.path, t.depth"""

DEPARTMENT_REPORT = """\
SELECT
  split_part(full_path, ' > ', 2) AS division,
  SUM(headcount) AS total_headcount,
  SUM(total_salary) AS total_payroll
FROM department_stats
WHERE depth >= 1
GROUP BY 1"""

#: name -> (query, refresh_mode, schedule, order-by column for printing), upstream first.
STREAM_TABLES: dict[str, tuple[str, str, str, str]] = {
    "department_tree": (DEPARTMENT_TREE, RefreshMode.DIFFERENTIAL, "30s", "path"),
    "department_stats": (DEPARTMENT_STATS, RefreshMode.AUTO, "30s", "full_path"),
    "department_report": (DEPARTMENT_REPORT, RefreshMode.AUTO, "30s", "division"),
}

#: The tutorial's Step 4: (title, SQL on the sources, stream table to refresh). Refreshing the most
#: downstream table brings its stale upstreams along, as in the tutorial.
CHANGES: tuple[tuple[str, str, str], ...] = (
    (
        "4a insert: Heidi joins Frontend",
        "INSERT INTO employees VALUES (8, 'Heidi', 6, 105000)",
        "department_report",
    ),
    (
        "4b insert: DevOps team under Engineering",
        "INSERT INTO departments VALUES (8, 'DevOps', 2)",
        "department_report",
    ),
    (
        "4c update: rename Engineering to R&D",
        "UPDATE departments SET name = 'R&D' WHERE id = 2",
        "department_report",
    ),
    ("4d delete: Bob leaves", "DELETE FROM employees WHERE name = 'Bob'", "department_report"),
)

HISTORY_COLUMNS = ("action", "reason", "rows_inserted", "rows_deleted", "rows_updated", "duration_ms")


def run_demo(
    warehouse: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    log_level: str = "ERROR",
) -> None:
    """Run the tutorial end to end and print what happens; safe to run again on the same warehouse."""
    from pipeline.api import StreamTables
    from pipeline.session import spark_session

    started = time.perf_counter()
    spark = spark_session(app_name="trickle-demo", warehouse=warehouse, conf=spark_conf, log_level=log_level)
    try:
        st = StreamTables(spark)
        _banner(f"spark-trickle demo (warehouse: {spark.conf.get('spark.sql.warehouse.dir')})")
        _reset(spark, st)
        _create_sources(spark)
        for name, (query, mode, schedule, _) in STREAM_TABLES.items():
            t0 = time.perf_counter()
            st.create_stream_table(name, query, schedule=schedule, refresh_mode=mode)
            print(f"created {name} ({mode}, {schedule}) in {_ms(t0)} ms")

        _banner("Stream tables after the initial refresh")
        _show_all(st)
        _banner("Status")
        _print_status(st)

        _banner("Step 4: changes to the sources cascade through the DAG")
        for title, sql, target in CHANGES:
            spark.sql(sql)
            t0 = time.perf_counter()
            result = st.refresh_stream_table(target)
            print(f"{title}\n    {sql}\n    refresh {target}: {_describe(result)} (wall {_ms(t0)} ms)")

        _banner("Stream tables after the changes")
        _show_all(st)
        _banner("Consistency: each stream table equals its defining query over the current sources")
        for name, (query, *_rest) in STREAM_TABLES.items():
            print(f"{name}: {'yes' if _same_rows(st.read(name), spark.sql(query)) else 'NO - please report'}")

        _banner("Refresh history (newest first)")
        for name in STREAM_TABLES:
            print(f"\n{name}")
            print(format_table(st.history(name, limit=20), HISTORY_COLUMNS))
        _banner("Status")
        _print_status(st)
        print(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    finally:
        spark.stop()  # the demo starts no streaming query, so stopping Spark is all the clean-up


# ---------------------------------------------------------------------------------------------- steps


def _reset(spark: SparkSession, st: StreamTables) -> None:
    """Drop the demo's stream tables (downstream first) and its source tables, files included.

    The embedded default has no metastore: a managed table's files outlive the session that created it,
    and Spark refuses to create a managed table over a non-empty folder, so the folders go too.
    """
    existing = {str(r.get("name")) for r in st.status()}
    for name in reversed(STREAM_TABLES):
        if name in existing:
            st.drop_stream_table(name)
            print(f"dropped stream table {name} from an earlier run")
    warehouse = _warehouse_dir(spark)
    for table in SOURCE_TABLES:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
        folder = warehouse / table
        if folder.is_dir():
            shutil.rmtree(folder)


def _create_sources(spark: SparkSession) -> None:
    for table, columns in SOURCE_TABLES.items():
        spark.sql(
            f"CREATE TABLE {table} ({columns}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
    for sql in SEED_SQL:
        spark.sql(sql)
    print(
        f"created source tables {', '.join(SOURCE_TABLES)} (Delta, Change Data Feed on) with the tutorial's rows"
    )


def _show_all(st: StreamTables) -> None:
    for name, (*_rest, order_by) in STREAM_TABLES.items():
        print(f"\n{name}")
        st.read(name).orderBy(order_by).show(truncate=False)


def _print_status(st: StreamTables) -> None:
    print(format_table(st.status(), STATUS_COLUMNS))


def _same_rows(left: DataFrame, right: DataFrame) -> bool:
    """Bag equality, compared as strings by column name so that type widening cannot hide a difference. The
    demo's tables are tiny: both sides are collected by one Spark job and counted here (an EXCEPT ALL job each
    way, each with a shuffle, cost seconds in the demo's fresh JVM)."""
    from collections import Counter

    cols = sorted(right.columns)
    if sorted(left.columns) != cols:
        return False
    as_text = [f"CAST(`{c.replace('`', '``')}` AS STRING)" for c in cols]
    rows = left.selectExpr("true AS `__left`", *as_text).unionAll(right.selectExpr("false", *as_text)).collect()
    sides: dict[bool, Counter[tuple[Any, ...]]] = {True: Counter(), False: Counter()}
    for r in rows:
        sides[r[0]][tuple(r[1:])] += 1
    return sides[True] == sides[False]


# ---------------------------------------------------------------------------------------------- helpers


def _warehouse_dir(spark: SparkSession) -> Path:
    return Path(strip_file_scheme(spark.conf.get("spark.sql.warehouse.dir") or "warehouse"))


def _describe(result: Any) -> str:
    return describe_refresh(result).split(": ", 1)[-1]


def _ms(t0: float) -> int:
    return round((time.perf_counter() - t0) * 1000)


def _banner(title: str) -> None:
    print(f"\n=== {title} ===")
