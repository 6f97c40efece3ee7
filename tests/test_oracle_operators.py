"""Oracle tests: every operator in scope, maintained DIFFERENTIALly over >= 20 random change cycles.

Why grouped: a Spark job costs ~0.5-2 s here, so many stream tables share the same sources and the same
change batches; each cycle is one MERGE per source, one refresh per stream table and ONE comparison job.
``TRICKLE_ORACLE_CYCLES`` and ``TRICKLE_ORACLE_SEED`` (an int or ``random``) override the defaults.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from oracle import ChangeGenerator, Churn, Col, Extreme, TableSpec, compare_rows, run_oracle

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

# --------------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------------

ITEMS = TableSpec(
    "items",
    (
        Col("grp", "jkey", domain=(1, 5)),
        Col("qty", "int", domain=(0, 20)),
        Col("price", "double"),
        Col("name", "string"),
    ),
    key="id",
    rows=40,
)
EVENTS = TableSpec(  # keyless, many exact duplicate rows
    "events",
    (Col("grp", "jkey", domain=(1, 5)), Col("val", "int", domain=(0, 10)), Col("tag", "string")),
    key=None,
    rows=30,
    dup_fraction=0.3,
)
CUSTOMERS = TableSpec(
    "customers",
    (Col("region", "jkey", domain=(1, 4)), Col("cname", "string"), Col("credit", "double", domain=(0, 100))),
    key="id",
    key_range=(1, 14),
    rows=10,
    max_changes=3,
)
ORDERS = TableSpec(
    "orders",
    (
        Col("cust_id", "jkey", domain=(1, 14)),  # some ids have no customer; NULL never joins
        Col("amount", "double", domain=(1, 500)),
        Col("qty", "int", domain=(1, 9)),
        Col("status", "string"),
    ),
    key="oid",
    rows=45,
)
REGIONS = TableSpec("regions", (Col("rname", "string"),), key="rid", key_range=(1, 5), rows=4, max_changes=2)


# --------------------------------------------------------------------------------------------------
# Harness self-checks (no stream tables needed)
# --------------------------------------------------------------------------------------------------


def test_compare_rows_is_a_tolerant_multiset_diff() -> None:
    """Duplicates count, row order does not, float noise is ignored, a real difference is reported."""
    exp = [(1, 0.1 + 0.2, "a"), (1, 0.1 + 0.2, "a"), (2, None, None), (3, 1e-15, "z")]
    act = [(3, 0.0, "z"), (2, None, None), (1, 0.3, "a"), (1, 0.30000000001, "a")]
    assert compare_rows(exp, act) == (Counter(), Counter())
    missing, extra = compare_rows(exp, act[:-1] + [(1, 0.31, "a")])
    assert missing == Counter({(1, 0.3, "a"): 1}) and extra == Counter({(1, 0.31, "a"): 1})
    missing, extra = compare_rows(exp, act[1:])
    assert missing == Counter({(3, 1e-15, "z"): 1}) and not extra
    # values straddling a 6-digit rounding boundary (sums of doubles in another order) still match
    assert compare_rows([(3, 401.83 / 8)], [(3, 401.83000000000004 / 8)]) == (Counter(), Counter())
    assert compare_rows([(3, 50.22874999999)], [(3, 50.22875000001)]) == (Counter(), Counter())


def test_generator_mirrors_delta_and_cdf_shows_real_updates(spark: Any) -> None:
    """The generator's model must equal the Delta table, and each MERGE's CDF must be exactly the planned
    changes (update pre/post images, key changes, NULLs, duplicate rows), or the oracle proves nothing."""
    gen = ChangeGenerator(
        spark,
        [ORDERS, CUSTOMERS, EVENTS],
        seed=7,
        churn=[Churn("orders", "cust_id", "customers", p=1.0)],
        extremes=[Extreme("orders", "amount", p=1.0)],
    )
    gen.create()
    for _ in range(8):
        gen.cycle()
    gen.verify_versions()
    seen: Counter[str] = Counter()
    for name, src in gen.sources.items():
        real, cols = src.real, src.spec.columns
        missing, extra = compare_rows(gen.expected_rows(name), [tuple(r) for r in spark.table(real).collect()])
        assert not missing and not extra, f"{name}: model vs Delta: missing {missing}, extra {extra}"
        cdf = spark.sql(
            f"SELECT {', '.join(cols)}, _change_type, _commit_version FROM table_changes('{real}', 2)"
        ).collect()
        for version, ops in gen.log[name].items():
            want: Counter[tuple[Any, ...]] = Counter()
            for op in ops:
                if op.op == "U":
                    want[(*op.old, "update_preimage")] += op.count
                    want[(*op.new, "update_postimage")] += op.count
                    seen["update"] += 1
                    if src.spec.key and op.old[0] != op.new[0]:
                        seen["key change"] += 1
                    if any(a is not None and b is None for a, b in zip(op.old, op.new, strict=True)):
                        seen["set NULL"] += 1
                    if op.count > 1:
                        seen["update of duplicated row"] += 1
                elif op.op == "D":
                    want[(*op.old, "delete")] += op.count
                    seen["delete"] += 1
                else:
                    want[(*op.new, "insert")] += 1
                    seen["insert"] += 1
            got = Counter(tuple(r)[:-1] for r in cdf if r["_commit_version"] == version)
            assert not (Counter(want) - got) and not (got - Counter(want)), (
                f"{name} v{version}: CDF {got} != planned {want}"
            )
        if not src.spec.key:
            rows = Counter(gen.expected_rows(name))
            seen["duplicate rows"] += sum(1 for c in rows.values() if c > 1)
    for feature in ("update", "key change", "set NULL", "delete", "insert", "duplicate rows"):
        assert seen[feature] > 0, f"generator never produced: {feature} ({dict(seen)})"


# --------------------------------------------------------------------------------------------------
# Operators over one table (plus a keyless one): scan, filter, project, aggregates, DISTINCT, UNION ALL,
# subquery in FROM, CTE
# --------------------------------------------------------------------------------------------------

# Operators are combined into few stream tables (each refresh costs seconds of Spark jobs here); every
# operator of the scope still occurs in at least one of them, and every one is checked each cycle.
SINGLE_TABLE_QUERIES = {
    "scan_keyless": "SELECT * FROM {events}",
    "filter_project": (
        "SELECT id, qty * 2 + 1 AS q2, price / 4.0 - qty AS mix, "
        "CASE WHEN price > 50 THEN 'hi' WHEN price IS NULL THEN 'none' ELSE 'lo' END AS band, "
        "CAST(qty AS STRING) AS qs, CAST(price AS INT) AS pi, coalesce(name, 'n/a') AS nm, "
        "concat(name, '-', CAST(grp AS STRING)) AS c, upper(name) AS u, length(name) AS len, "
        "abs(price) AS ap, round(price, 1) AS rp, greatest(qty, grp) AS g, nullif(qty, 0) AS nz "
        "FROM {items} WHERE (qty > 5 AND price IS NOT NULL) OR name IS NULL OR (grp = 2 AND price < 0)"
    ),
    "group_agg": (
        "SELECT grp, COUNT(*) AS n, COUNT(qty) AS nq, SUM(qty) AS sq, AVG(price) AS ap, "
        "MIN(price) AS mnp, MAX(qty) AS mxq, MIN(name) AS mnn FROM {items} GROUP BY grp "
        "HAVING SUM(qty) > 60 OR MIN(price) < -40"
    ),
    "global_agg": (
        "SELECT COUNT(*) AS n, COUNT(price) AS np, SUM(qty) AS s, AVG(qty) AS a, MIN(qty) AS mnq, "
        "MAX(qty) AS mxq, MIN(price) AS mnp, MAX(price) AS mxp FROM {items}"
    ),
    "distinct": "SELECT DISTINCT grp, tag FROM {events}",
    "union_all": "SELECT grp, name AS label FROM {items} WHERE qty > 3 UNION ALL SELECT grp, tag FROM {events}",
    "cte_subquery": (
        "WITH big AS (SELECT id, grp, price FROM {items} WHERE price > 20), "
        "ev AS (SELECT grp, val FROM {events} WHERE val IS NOT NULL) "
        "SELECT big.id, big.price, ev.val, t.total FROM big JOIN ev ON big.grp = ev.grp "
        "JOIN (SELECT grp AS g, SUM(qty) AS total, COUNT(*) AS n FROM {items} "
        "WHERE qty IS NOT NULL GROUP BY grp) t ON t.g = big.grp WHERE t.total > 30"
    ),
}


def test_single_table_operators_differential(spark: Any, st: Any) -> None:
    """Scan (keyed and keyless), filter, project, GROUP BY + HAVING, global aggregate with the extremum
    row deleted, DISTINCT, UNION ALL, subquery in FROM and a CTE: all equal their query every cycle."""
    run_oracle(
        spark,
        st,
        [ITEMS, EVENTS],
        SINGLE_TABLE_QUERIES,
        cycles=CYCLES,
        seed=101,
        extremes=[Extreme("items", "qty"), Extreme("items", "price")],
    )


# --------------------------------------------------------------------------------------------------
# Joins, aggregates over joins, joins over aggregates, and a DAG of stream tables
# --------------------------------------------------------------------------------------------------

JOIN_QUERIES = {
    "join3": (
        "SELECT o.oid, c.cname, r.rname, o.qty * c.credit AS score FROM {orders} o "
        "JOIN {customers} c ON o.cust_id = c.id JOIN {regions} r ON c.region = r.rid "
        "WHERE o.qty > 1 OR r.rname IS NULL"
    ),
    "left_join": (
        "SELECT o.oid, o.cust_id, c.cname, c.credit FROM {orders} o LEFT JOIN {customers} c ON o.cust_id = c.id"
    ),
    "left_join_dim": (
        "SELECT c.id, c.cname, o.oid, o.amount FROM {customers} c "
        "LEFT OUTER JOIN {orders} o ON c.id = o.cust_id AND o.qty > 2"
    ),
    "agg_join": (
        "SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MAX(o.qty) AS mq, AVG(c.credit) AS ac "
        "FROM {orders} o JOIN {customers} c ON o.cust_id = c.id GROUP BY c.region"
    ),
    "join_agg": (
        "SELECT c.id, c.cname, t.total, t.n FROM {customers} c JOIN "
        "(SELECT cust_id, SUM(amount) AS total, COUNT(*) AS n FROM {orders} GROUP BY cust_id) t "
        "ON c.id = t.cust_id"
    ),
    # DAG: region_totals reads cust_totals; refreshing it must bring cust_totals along.
    "cust_totals": "SELECT cust_id, COUNT(*) AS n, SUM(qty) AS q FROM {orders} GROUP BY cust_id",
    "region_totals": (
        "SELECT c.region, SUM(t.q) AS q, SUM(t.n) AS n FROM {cust_totals} t "
        "JOIN {customers} c ON t.cust_id = c.id WHERE t.n >= 2 GROUP BY c.region"
    ),
}


def test_join_operators_differential(spark: Any, st: Any) -> None:
    """Inner (2- and 3-table), LEFT OUTER (unmatched rows, NULL keys), aggregate over join, join over
    aggregate, stream table over stream table; with join keys updated while the old partner is deleted
    in the same commit window (Churn), which needs the partner's pre-state."""
    run_oracle(
        spark,
        st,
        [ORDERS, CUSTOMERS, REGIONS],
        JOIN_QUERIES,
        cycles=CYCLES,
        seed=202,
        churn=[Churn("orders", "cust_id", "customers"), Churn("customers", "region", "regions", p=0.2)],
    )
