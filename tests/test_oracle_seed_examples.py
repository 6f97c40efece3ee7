"""The pg_stream SQL reference examples (seeds/001, "SQL Reference", lines ~548-912) as oracle tests: every
example Spark SQL can express, written in Spark SQL over three shared random sources and maintained
DIFFERENTIAL over random change cycles (``TRICKLE_SEED_CYCLES``, default 6: see :data:`CYCLES`).

Packing (a refresh has a fixed cost of its own): the examples that group ``orders`` by region share one keyed
stream table (``by_region``), the ones that group ``employees`` by department another (``by_dept``), and
every other example is one UNION ALL branch of ``branches`` (column ``b`` names the example, so a diff points
at it; each example is a subquery there, so its aggregates are nested ones), except the few whose deltas run on
Spark, which ``lateral_sets`` packs the same way (:data:`ON_SPARK`). The seed's tables map onto the
sources: ``orders`` (and ``sales``, ``events``, ``order_items``, ``line_items``, ``shipments``, the
``orders_east``/``west`` pair as ``region`` 1 / 2), ``employees`` (and ``categories``, ``products``,
``stock_received``), ``users`` (and ``customers``, ``departments``, ``parent_data``, ``tagged_items``,
``newsletter_subscribers`` as ``orders.status``).

Translations (the seed is PostgreSQL):

* string literals: ``'active'`` / ``'shipped'`` are ``'alpha'`` / ``'beta'``, values of the random string
  pool; boolean columns are INT 0/1 compared with ``= 1``; ``ts`` is ``timestamp_seconds`` of the amount.
* ``STRING_AGG(name, ', ' ORDER BY name)`` → ``string_agg(name, ', ') WITHIN GROUP (ORDER BY name)``;
  ``ARRAY_AGG(x)`` → ``array_sort(array_agg(x))`` and ``JSON_AGG(name)`` →
  ``to_json(array_sort(collect_list(name)))`` (PostgreSQL keeps input order, which has no meaning here);
  ``MODE() WITHIN GROUP (ORDER BY grade)`` → ``mode(grade, true)`` (ties to the least value, as Spark's
  ``mode() WITHIN GROUP``); ``PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY salary)`` →
  ``percentile(salary, 0.5)`` (the same interpolation); ``PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY
  salary)`` → its definition, the ``ceil(0.9 * n)``-th smallest value (the engine maintains
  ``percentile_disc`` only FULL, see docs/COVERAGE.md).
* ``CORR(salary, experience)`` → ``corr(salary + id / 1000.0, experience + id / 1000.0)``: Spark (ANSI
  mode) raises DIVIDE_BY_ZERO for a group of two or more rows where a variable is constant, which random
  data (rows inserted with another row's values) hits.
* ``ANY_VALUE(office_location)`` takes a value fixed by the department: Spark's ANY_VALUE picks any row,
  so only a group-constant value has one right answer to compare with.
* ``jsonb_array_elements`` / ``jsonb_each`` / ``unnest`` → ``LATERAL explode`` of an array / map built from
  the row's columns (the sources have no JSON); LATERAL top-N orders by ``amount DESC, oid DESC`` (the seed's
  ``created_at`` would tie).
* ``order_items.product_id`` is NOT NULL in the seed: ``orders.user_id`` is never NULL here, so NOT IN keeps
  its meaning (NOT IN over NULLs is covered by tests/test_oracle_joins.py).

Skipped: ``config_map`` (JSON_OBJECT_AGG / JSONB_OBJECT_AGG): Spark has no JSON object aggregate, and
``map_from_entries(collect_list(struct(k, v)))`` fails on a duplicate key, which random data has. The CREATE
examples before line 548 (schedules, cron) are API calls, tested in tests/test_conf.py and test_scheduler.py.

Every example compiles and is in the oracle run. An example the engine stopped maintaining would have to be
listed in :data:`NOT_YET` (left out of the run); ``test_seed_examples_not_yet_maintained_are_listed`` fails
when one is listed but compiles, or compiles no more but is not listed. The recursive examples stay finite on
random data: a manager cycle is never reachable from a root (each employee has one manager).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from oracle import Col, Extreme, TableSpec, run_oracle

from dvm.builder import compile_tree
from dvm.errors import QueryError, UnsupportedError

#: The examples are checked after every cycle like any oracle test, but over fewer cycles than the 20 of the
#: construct oracles: each construct they use is proven over >= 20 cycles by its own module (docs/COVERAGE.md
#: names it), and the examples' UNION ALL of two dozen queries is the most expensive refresh of the suite.
CYCLES = int(os.environ.get("TRICKLE_SEED_CYCLES", "6"))

ORDERS = TableSpec(
    "orders",
    (
        Col("region", "jkey", domain=(1, 4)),
        Col("user_id", "jkey", nullable=False, domain=(1, 9)),  # user 9 never exists
        Col("amount", "double", domain=(1, 500)),
        Col("qty", "int", domain=(0, 9)),
        Col("status", "string"),
    ),
    key="oid",
    rows=30,
    max_changes=4,
)
EMPLOYEES = TableSpec(
    "employees",
    (
        Col("department", "jkey", domain=(1, 4)),
        Col("name", "string"),
        Col("salary", "double", domain=(1000, 9000)),
        Col("experience", "int", domain=(0, 20)),
        Col("grade", "int", domain=(1, 5)),
        Col("permissions", "int", domain=(0, 15)),
        Col("flags", "int", domain=(0, 15)),
        Col("active", "int", domain=(0, 1)),
        Col("manager_id", "jkey", domain=(1, 24)),  # NULL: a root of the org chart
    ),
    key="id",
    key_range=(1, 24),
    rows=18,
    max_changes=4,
)
USERS = TableSpec(
    "users",
    (Col("name", "string"), Col("active", "int", domain=(0, 1))),
    key="id",
    key_range=(1, 8),
    rows=6,
    max_changes=2,
)
SOURCES = [ORDERS, EMPLOYEES, USERS]

# order_totals, daily_report (sales.revenue -> orders.qty), sales_summary, order_metrics
BY_REGION = (
    "SELECT region, SUM(amount) AS ot_total, SUM(qty) AS dr_total, COUNT(*) AS ss_cnt, "
    "AVG(amount) AS ss_avg_amount, COUNT(*) FILTER (WHERE status = 'alpha') AS om_active_count, "
    "SUM(amount) FILTER (WHERE status = 'beta') AS om_shipped_total FROM {orders} GROUP BY region"
)

# salary_ranges, team_members, permission_summary, salary_stats, salary_percentiles, regression_stats,
# dept_sample
BY_DEPT = (
    "SELECT department, MIN(salary) AS min_sal, MAX(salary) AS max_sal, "
    "string_agg(name, ', ') WITHIN GROUP (ORDER BY name) AS members, array_sort(array_agg(id)) AS member_ids, "
    "bool_and(active = 1) AS all_active, to_json(array_sort(collect_list(name))) AS members_json, "
    "bit_or(permissions) AS combined_perms, bit_and(permissions) AS common_perms, bit_xor(flags) AS xor_flags, "
    "stddev_pop(salary) AS sd_pop, stddev_samp(salary) AS sd_samp, var_pop(salary) AS var_pop, "
    "var_samp(salary) AS var_samp, mode(grade, true) AS most_common_grade, "
    "percentile(salary, 0.5) AS median_salary, "
    "CASE WHEN COUNT(salary) > 0 THEN element_at(array_sort(collect_list(salary)), "
    "CAST(ceil(0.9 * COUNT(salary)) AS INT)) END AS p90_salary, "
    "corr(salary + id / 1000.0, experience + id / 1000.0) AS sal_exp_corr, covar_pop(salary, experience) AS covar_pop, "
    "covar_samp(salary, experience) AS covar_samp, regr_slope(salary, experience) AS slope, "
    "regr_intercept(salary, experience) AS intercept, regr_r2(salary, experience) AS r_squared, "
    "regr_count(salary, experience) AS regr_n, "
    "any_value(concat('office-', CAST(department AS STRING))) AS sample_office "
    "FROM {employees} GROUP BY department"
)

# Every other example, as (name, query, (id, label, v1, v2)): the columns of the shared branch shape
# (b STRING, id BIGINT, label STRING, v1 DOUBLE, v2 DOUBLE) taken from the example's output (NULL: none).
BRANCHES: list[tuple[str, str, tuple[str, str, str, str]]] = [
    # --- CTEs
    ("active_order_totals",
     "WITH active_users AS (SELECT id, name FROM {users} WHERE active = 1) "
     "SELECT a.id, a.name, SUM(o.amount) AS total FROM active_users a JOIN {orders} o ON o.user_id = a.id "
     "GROUP BY a.id, a.name", ("id", "name", "total", "NULL")),
    ("top_regions",
     "WITH regional AS (SELECT region, SUM(amount) AS total FROM {orders} GROUP BY region), "
     "ranked AS (SELECT region, total FROM regional WHERE total > 1800) SELECT * FROM ranked",
     ("region", "NULL", "total", "NULL")),
    ("self_compare",
     "WITH totals AS (SELECT user_id, SUM(amount) AS total FROM {orders} GROUP BY user_id) "
     "SELECT t1.user_id, t1.total, t2.total AS next_total FROM totals t1 JOIN totals t2 "
     "ON t1.user_id = t2.user_id + 1", ("user_id", "NULL", "total", "next_total")),
    # --- the cron example's query (FULL in the seed; maintained here)
    ("hourly_summary",
     "SELECT date_trunc('HOUR', timestamp_seconds(CAST(amount * 100 AS BIGINT))) AS hour, COUNT(*) AS cnt "
     "FROM {orders} GROUP BY 1", ("NULL", "CAST(hour AS STRING)", "cnt", "NULL")),
    # --- set operations
    ("all_contacts", "SELECT name AS email FROM {users} UNION SELECT status FROM {orders}",
     ("NULL", "email", "NULL", "NULL")),
    ("bi_region_customers",
     "SELECT user_id FROM {orders} WHERE region = 1 INTERSECT SELECT user_id FROM {orders} WHERE region = 2",
     ("user_id", "NULL", "NULL", "NULL")),
    ("common_items",
     "SELECT status AS item_name FROM {orders} WHERE region = 3 INTERSECT ALL SELECT name FROM {employees}",
     ("NULL", "item_name", "NULL", "NULL")),
    ("unshipped_orders",
     "SELECT oid FROM {orders} EXCEPT SELECT oid FROM {orders} WHERE status = 'beta'",
     ("oid", "NULL", "NULL", "NULL")),
    ("excess_inventory",
     "SELECT department AS sku FROM {employees} EXCEPT ALL SELECT region FROM {orders}",
     ("sku", "NULL", "NULL", "NULL")),
    # --- WHERE subqueries
    ("active_customers",
     "SELECT c.id, c.name FROM {users} c WHERE EXISTS (SELECT 1 FROM {orders} o WHERE o.user_id = c.id)",
     ("id", "name", "NULL", "NULL")),
    ("inactive_customers",
     "SELECT c.id, c.name FROM {users} c WHERE NOT EXISTS (SELECT 1 FROM {orders} o WHERE o.user_id = c.id)",
     ("id", "name", "NULL", "NULL")),
    ("ordered_products",
     "SELECT p.id, p.name FROM {employees} p WHERE p.id IN (SELECT user_id FROM {orders})",
     ("id", "name", "NULL", "NULL")),
    ("unordered_products",
     "SELECT p.id, p.name FROM {employees} p WHERE p.id NOT IN (SELECT user_id FROM {orders})",
     ("id", "name", "NULL", "NULL")),
    ("products_with_max_price",
     "SELECT p.oid, p.status, (SELECT max(amount) FROM {orders}) AS max_price FROM {orders} p",
     ("oid", "status", "max_price", "NULL")),
    # --- recursive CTEs (categories -> employees, parent_id -> manager_id)
    ("category_tree",
     "WITH RECURSIVE cat_tree AS (SELECT id, name, manager_id AS parent_id, 0 AS depth FROM {employees} "
     "WHERE manager_id IS NULL UNION ALL SELECT c.id, c.name, c.manager_id, ct.depth + 1 FROM {employees} c "
     "JOIN cat_tree ct ON c.manager_id = ct.id) SELECT * FROM cat_tree",
     ("id", "name", "depth", "parent_id")),
    ("org_chart",
     "WITH RECURSIVE reports AS (SELECT id, name, manager_id FROM {employees} WHERE manager_id IS NULL "
     "UNION ALL SELECT e.id, e.name, e.manager_id FROM {employees} e JOIN reports r ON e.manager_id = r.id) "
     "SELECT * FROM reports", ("id", "name", "manager_id", "NULL")),
    # --- LATERAL set-returning functions
    ("flat_children",
     "SELECT p.oid AS id, child.value AS val FROM {orders} p, LATERAL explode(array(p.qty, p.qty + 1)) AS child(value)",
     ("id", "NULL", "val", "NULL")),
    ("flat_properties",
     "SELECT d.id, kv.key, kv.value FROM {employees} d, "
     "LATERAL explode(map('grade', d.grade, 'flags', d.flags)) AS kv(key, value)",
     ("id", "key", "value", "NULL")),
    ("flat_tags",
     "SELECT t.id, tag.tag FROM {users} t, LATERAL explode(split(t.name, ' ')) AS tag(tag)",
     ("id", "tag", "NULL", "NULL")),
    ("high_value_items",
     "SELECT p.oid AS id, e.value AS amount FROM {orders} p, "
     "LATERAL explode(array(p.amount, p.amount / 4)) AS e(value) WHERE e.value > 100",
     ("id", "NULL", "amount", "NULL")),
    ("element_counts",
     "SELECT a.id, count(*) AS cnt FROM {users} a, LATERAL explode(split(a.name, ' ')) AS e(v) GROUP BY a.id",
     ("id", "NULL", "cnt", "NULL")),
    # --- LATERAL subqueries (departments -> users)
    ("latest_items",
     "SELECT o.id, o.name, latest.amount FROM {users} o, LATERAL (SELECT li.amount FROM {orders} li "
     "WHERE li.user_id = o.id ORDER BY li.amount DESC, li.oid DESC LIMIT 1) AS latest",
     ("id", "name", "amount", "NULL")),
    ("dept_summaries",
     "SELECT d.id, d.name, stats.total, stats.cnt FROM {users} d, LATERAL (SELECT SUM(e.salary) AS total, "
     "COUNT(*) AS cnt FROM {employees} e WHERE e.department = d.id) AS stats",
     ("id", "name", "total", "cnt")),
    ("dept_stats_all",
     "SELECT d.id, d.name, stats.total FROM {users} d LEFT JOIN LATERAL (SELECT SUM(e.salary) AS total "
     "FROM {employees} e WHERE e.department = d.id) AS stats ON true",
     ("id", "name", "total", "NULL")),
]

#: examples the engine cannot maintain yet -> the construct it lacks (none today: every example is maintained)
NOT_YET: dict[str, str] = {}

SHAPE = ("id", "label", "v1", "v2")
SHAPE_TYPES = ("BIGINT", "STRING", "DOUBLE", "DOUBLE")


def branch_sql(name: str, query: str, cols: tuple[str, str, str, str]) -> str:
    """One example as a UNION ALL branch of the shared shape."""
    items = ", ".join(f"CAST({c} AS {t}) AS {n}" for c, n, t in zip(cols, SHAPE, SHAPE_TYPES, strict=True))
    return f"SELECT '{name}' AS b, {items} FROM ({query}) q"


def _schemas() -> dict[str, list[tuple[str, str]]]:
    return {s.name: ([(s.key, "int")] if s.key else []) + [(c.name, c.sql_type().lower()) for c in s.cols]
            for s in SOURCES}


def compile_problem(sql: str) -> str | None:
    """Why the engine cannot maintain ``sql`` (placeholders as source names), or None."""
    text = sql.format(**{s.name: s.name for s in SOURCES})
    try:
        compile_tree(text, _schemas())
    except (UnsupportedError, QueryError) as e:
        return f"{type(e).__name__}: {e}"
    return None


#: examples whose delta DuckDB leaves to Spark (``explode`` of a map or of ``split``, timestamps: see
#: pipeline/local_engine.py); they are packed into a stream table of their own, so that the other branches'
#: deltas still run on DuckDB (one Spark refresh of the whole union cost 16-35 s)
ON_SPARK = {"flat_properties", "flat_tags", "element_counts", "hourly_summary"}


def maintained_branches(on_spark: bool | None = None) -> list[str]:
    """The branches of ``branches`` this engine maintains (each compiled on its own, in branch form); only
    those in :data:`ON_SPARK` (True) or only the others (False)."""
    return [branch_sql(n, q, c) for n, q, c in BRANCHES if compile_problem(branch_sql(n, q, c)) is None
            and (on_spark is None or (n in ON_SPARK) == on_spark)]


def test_seed_examples_not_yet_maintained_are_listed() -> None:
    """NOT_YET lists exactly the examples that do not compile: one that starts compiling must join the
    oracle run (remove it from NOT_YET), and one that stops compiling is a regression."""
    problems = {n: compile_problem(branch_sql(n, q, c)) for n, q, c in BRANCHES}
    now_compiling = sorted(n for n in NOT_YET if problems[n] is None)
    assert not now_compiling, (f"seed examples {now_compiling} compile now: remove them from NOT_YET in "
                               f"{__file__} so the oracle test maintains them")
    broken = {n: p for n, p in problems.items() if p is not None and n not in NOT_YET}
    assert not broken, f"seed examples that no longer compile: {broken}"
    assert not set(NOT_YET) - {n for n, *_ in BRANCHES}, "NOT_YET names unknown examples"
    for q in (BY_REGION, BY_DEPT):
        assert compile_problem(q) is None, compile_problem(q)


def test_seed_examples_are_spark_sql(spark: Any) -> None:
    """Every translation, maintained here or not yet, is a query Spark accepts (analysed over empty views
    of the sources): the ones in NOT_YET are ready for the oracle run once the engine maintains them."""
    views = {}
    for spec in SOURCES:
        cols = ([(spec.key, "INT")] if spec.key else []) + [(c.name, c.sql_type()) for c in spec.cols]
        views[spec.name] = f"_seed_{spec.name}"
        body = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in cols)
        spark.sql(f"CREATE OR REPLACE TEMP VIEW {views[spec.name]} AS SELECT {body} WHERE FALSE")
    failures = []
    for name, q in [("by_region", BY_REGION), ("by_dept", BY_DEPT)] + [(n, branch_sql(n, q, c)) for n, q, c in BRANCHES]:
        try:
            spark.sql(q.format(**views)).schema  # noqa: B018 - analysis is the check
        except Exception as e:  # noqa: BLE001 - collect every failure
            failures.append(f"{name}: {str(e).splitlines()[0][:200]}")
    assert not failures, "\n".join(failures)


def test_seed_examples_differential(spark: Any, st: Any) -> None:
    """Every seed example the engine maintains equals its query after each random change cycle, each
    refresh DIFFERENTIAL; the MIN / MAX salary rows are deleted or moved in many cycles."""
    branches, on_spark = maintained_branches(on_spark=False), maintained_branches(on_spark=True)
    if not branches or not on_spark:
        pytest.fail("no seed example branch compiles")
    assert not ON_SPARK - {n for n, *_ in BRANCHES}, "ON_SPARK names unknown examples"
    queries = {"by_region": BY_REGION, "by_dept": BY_DEPT, "branches": " UNION ALL ".join(branches),
               "lateral_sets": " UNION ALL ".join(on_spark)}
    run_oracle(spark, st, SOURCES, queries, cycles=CYCLES, seed=548,
               extremes=[Extreme("employees", "salary"), Extreme("orders", "amount", p=0.2)])
