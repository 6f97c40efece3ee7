"""Oracle test: joins, aggregates over joins, joins over aggregates and a DAG of stream tables, maintained
DIFFERENTIALly over >= 20 random change cycles (the coverage rows are in test_oracle_operators.py).

A module of its own so that pytest-xdist (one file per worker) can run it beside the single-table operators.
``TRICKLE_ORACLE_CYCLES`` and ``TRICKLE_ORACLE_SEED`` (an int or ``random``) override the defaults.
"""

from __future__ import annotations

import os
from typing import Any

from oracle import Churn, run_oracle
from test_oracle_operators import CUSTOMERS, ORDERS, REGIONS

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

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
