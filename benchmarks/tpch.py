"""TPC-H on stream tables: the 22 queries kept fresh DIFFERENTIAL and FULL under TPC-H's refresh functions.

    ./dev bench tpch --sf 0.01 --cycles 2                 # validate the harness (a few minutes)
    ./dev bench tpch --sf 1 --cycles 3                    # the real measurement, on a quiet machine
    ./dev bench tpch --sf 0.1 --queries 1,3,17 --timeout 300 --profile

Why: the matrix of benchmarks/run.py measures five synthetic shapes; TPC-H gives 22 queries somebody else
wrote (multi-way joins, correlated subqueries, EXISTS / NOT EXISTS, outer joins, nested aggregates,
top-k) over a standard schema and a standard change workload, so the FULL/DIFF ratio means something
outside this project.

Data: ``tpchgen-cli`` (the `bench` extra) writes the 8 tables as Parquet into ``--data-dir`` (git-ignored,
kept between runs); each is loaded as a Delta table with Change Data Feed on, into a temporary warehouse
that is deleted at the end (``--keep`` keeps it).

Queries: written for this harness from the query definitions of the TPC-H specification with its
validation substitution parameters (Q11's FRACTION is 0.0001 / SF as the spec says; Q15's view is a CTE).
A top-level ORDER BY without LIMIT is dropped from the stream table definition (a table has no order);
ORDER BY ... LIMIT stays (TopK). Each query becomes two stream tables, ``qNN_diff`` (DIFFERENTIAL) and
``qNN_full`` (FULL). A query the engine refuses in DIFFERENTIAL mode is created AUTO instead and the
reason printed; the table shows the action its refreshes actually took.

Churn per cycle (TPC-H's refresh functions, ``--churn`` of the orders, 0.1% by default): RF1 inserts new
orders with their lineitems (copies of a deterministic, per-cycle sample of the generated orders, re-keyed
beyond the largest order key), RF2 deletes the oldest orders with their lineitems (lowest keys first). Four
Delta commits per cycle: INSERT orders, INSERT lineitem, DELETE lineitem, DELETE orders.

Per cycle and query the DIFFERENTIAL and the FULL table are refreshed (FULL first in even cycles, DIFFERENTIAL
first in odd ones: the first refresh to read a table's new version pays for Delta's snapshot of it), each under ``metrics.measure``
(wall, Spark jobs, time in jobs, rows read) and ``metrics.cpu_seconds`` (CPU of this process and the
driver JVM). The first cycle warms up and is not measured; medians of the others are reported. A
DIFFERENTIAL refresh running longer than ``--timeout`` seconds is cancelled (its Spark jobs, repeatedly,
until the call returns), reported as TIMEOUT and not refreshed again. After the last cycle each
DIFFERENTIAL table is compared with its FULL twin (multiset of the user columns, exceptAll both ways).
Results: a Markdown table on stdout and JSON in benchmarks/out/tpch-<time>.json. Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics import Measured, cpu_seconds, measure  # noqa: E402

TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")

# The 22 queries, Spark SQL, validation parameters of the specification. `{fraction}` (Q11) is filled in
# per scale factor. Tables that occur twice in a query get aliases, so every correlated reference is
# qualified where it would otherwise depend on name resolution order.
QUERIES: dict[int, str] = {
    1: """
SELECT l_returnflag, l_linestatus,
       SUM(l_quantity) AS sum_qty,
       SUM(l_extendedprice) AS sum_base_price,
       SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       AVG(l_quantity) AS avg_qty,
       AVG(l_extendedprice) AS avg_price,
       AVG(l_discount) AS avg_disc,
       COUNT(*) AS count_order
FROM lineitem
WHERE l_shipdate <= DATE '1998-12-01' - INTERVAL '90' DAY
GROUP BY l_returnflag, l_linestatus
ORDER BY l_returnflag, l_linestatus
""",
    2: """
SELECT s.s_acctbal, s.s_name, n.n_name, p.p_partkey, p.p_mfgr, s.s_address, s.s_phone, s.s_comment
FROM part p, supplier s, partsupp ps, nation n, region r
WHERE p.p_partkey = ps.ps_partkey
  AND s.s_suppkey = ps.ps_suppkey
  AND p.p_size = 15
  AND p.p_type LIKE '%BRASS'
  AND s.s_nationkey = n.n_nationkey
  AND n.n_regionkey = r.r_regionkey
  AND r.r_name = 'EUROPE'
  AND ps.ps_supplycost = (
    SELECT MIN(ps2.ps_supplycost)
    FROM partsupp ps2, supplier s2, nation n2, region r2
    WHERE p.p_partkey = ps2.ps_partkey
      AND s2.s_suppkey = ps2.ps_suppkey
      AND s2.s_nationkey = n2.n_nationkey
      AND n2.n_regionkey = r2.r_regionkey
      AND r2.r_name = 'EUROPE')
ORDER BY s.s_acctbal DESC, n.n_name, s.s_name, p.p_partkey
LIMIT 100
""",
    3: """
SELECT l_orderkey, SUM(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
FROM customer, orders, lineitem
WHERE c_mktsegment = 'BUILDING'
  AND c_custkey = o_custkey
  AND l_orderkey = o_orderkey
  AND o_orderdate < DATE '1995-03-15'
  AND l_shipdate > DATE '1995-03-15'
GROUP BY l_orderkey, o_orderdate, o_shippriority
ORDER BY revenue DESC, o_orderdate
LIMIT 10
""",
    4: """
SELECT o.o_orderpriority, COUNT(*) AS order_count
FROM orders o
WHERE o.o_orderdate >= DATE '1993-07-01'
  AND o.o_orderdate < DATE '1993-07-01' + INTERVAL '3' MONTH
  AND EXISTS (SELECT * FROM lineitem l WHERE l.l_orderkey = o.o_orderkey AND l.l_commitdate < l.l_receiptdate)
GROUP BY o.o_orderpriority
ORDER BY o.o_orderpriority
""",
    5: """
SELECT n_name, SUM(l_extendedprice * (1 - l_discount)) AS revenue
FROM customer, orders, lineitem, supplier, nation, region
WHERE c_custkey = o_custkey
  AND l_orderkey = o_orderkey
  AND l_suppkey = s_suppkey
  AND c_nationkey = s_nationkey
  AND s_nationkey = n_nationkey
  AND n_regionkey = r_regionkey
  AND r_name = 'ASIA'
  AND o_orderdate >= DATE '1994-01-01'
  AND o_orderdate < DATE '1994-01-01' + INTERVAL '1' YEAR
GROUP BY n_name
ORDER BY revenue DESC
""",
    6: """
SELECT SUM(l_extendedprice * l_discount) AS revenue
FROM lineitem
WHERE l_shipdate >= DATE '1994-01-01'
  AND l_shipdate < DATE '1994-01-01' + INTERVAL '1' YEAR
  AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01
  AND l_quantity < 24
""",
    7: """
SELECT supp_nation, cust_nation, l_year, SUM(volume) AS revenue
FROM (
  SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation, EXTRACT(YEAR FROM l_shipdate) AS l_year,
         l_extendedprice * (1 - l_discount) AS volume
  FROM supplier, lineitem, orders, customer, nation n1, nation n2
  WHERE s_suppkey = l_suppkey
    AND o_orderkey = l_orderkey
    AND c_custkey = o_custkey
    AND s_nationkey = n1.n_nationkey
    AND c_nationkey = n2.n_nationkey
    AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
    AND l_shipdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31'
) shipping
GROUP BY supp_nation, cust_nation, l_year
ORDER BY supp_nation, cust_nation, l_year
""",
    8: """
SELECT o_year, SUM(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / SUM(volume) AS mkt_share
FROM (
  SELECT EXTRACT(YEAR FROM o_orderdate) AS o_year, l_extendedprice * (1 - l_discount) AS volume,
         n2.n_name AS nation
  FROM part, supplier, lineitem, orders, customer, nation n1, nation n2, region
  WHERE p_partkey = l_partkey
    AND s_suppkey = l_suppkey
    AND l_orderkey = o_orderkey
    AND o_custkey = c_custkey
    AND c_nationkey = n1.n_nationkey
    AND n1.n_regionkey = r_regionkey
    AND r_name = 'AMERICA'
    AND s_nationkey = n2.n_nationkey
    AND o_orderdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31'
    AND p_type = 'ECONOMY ANODIZED STEEL'
) all_nations
GROUP BY o_year
ORDER BY o_year
""",
    9: """
SELECT nation, o_year, SUM(amount) AS sum_profit
FROM (
  SELECT n_name AS nation, EXTRACT(YEAR FROM o_orderdate) AS o_year,
         l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount
  FROM part, supplier, lineitem, partsupp, orders, nation
  WHERE s_suppkey = l_suppkey
    AND ps_suppkey = l_suppkey
    AND ps_partkey = l_partkey
    AND p_partkey = l_partkey
    AND o_orderkey = l_orderkey
    AND s_nationkey = n_nationkey
    AND p_name LIKE '%green%'
) profit
GROUP BY nation, o_year
ORDER BY nation, o_year DESC
""",
    10: """
SELECT c_custkey, c_name, SUM(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name, c_address,
       c_phone, c_comment
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey
  AND l_orderkey = o_orderkey
  AND o_orderdate >= DATE '1993-10-01'
  AND o_orderdate < DATE '1993-10-01' + INTERVAL '3' MONTH
  AND l_returnflag = 'R'
  AND c_nationkey = n_nationkey
GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
ORDER BY revenue DESC
LIMIT 20
""",
    11: """
SELECT ps.ps_partkey, SUM(ps.ps_supplycost * ps.ps_availqty) AS value
FROM partsupp ps, supplier s, nation n
WHERE ps.ps_suppkey = s.s_suppkey
  AND s.s_nationkey = n.n_nationkey
  AND n.n_name = 'GERMANY'
GROUP BY ps.ps_partkey
HAVING SUM(ps.ps_supplycost * ps.ps_availqty) > (
  SELECT SUM(ps2.ps_supplycost * ps2.ps_availqty) * {fraction}
  FROM partsupp ps2, supplier s2, nation n2
  WHERE ps2.ps_suppkey = s2.s_suppkey
    AND s2.s_nationkey = n2.n_nationkey
    AND n2.n_name = 'GERMANY')
ORDER BY value DESC
""",
    12: """
SELECT l_shipmode,
       SUM(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END)
         AS high_line_count,
       SUM(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END)
         AS low_line_count
FROM orders, lineitem
WHERE o_orderkey = l_orderkey
  AND l_shipmode IN ('MAIL', 'SHIP')
  AND l_commitdate < l_receiptdate
  AND l_shipdate < l_commitdate
  AND l_receiptdate >= DATE '1994-01-01'
  AND l_receiptdate < DATE '1994-01-01' + INTERVAL '1' YEAR
GROUP BY l_shipmode
ORDER BY l_shipmode
""",
    13: """
SELECT c_count, COUNT(*) AS custdist
FROM (
  SELECT c_custkey, COUNT(o_orderkey) AS c_count
  FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
  GROUP BY c_custkey
) c_orders
GROUP BY c_count
ORDER BY custdist DESC, c_count DESC
""",
    14: """
SELECT 100.00 * SUM(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
       / SUM(l_extendedprice * (1 - l_discount)) AS promo_revenue
FROM lineitem, part
WHERE l_partkey = p_partkey
  AND l_shipdate >= DATE '1995-09-01'
  AND l_shipdate < DATE '1995-09-01' + INTERVAL '1' MONTH
""",
    15: """
WITH revenue0 AS (
  SELECT l_suppkey AS supplier_no, SUM(l_extendedprice * (1 - l_discount)) AS total_revenue
  FROM lineitem
  WHERE l_shipdate >= DATE '1996-01-01'
    AND l_shipdate < DATE '1996-01-01' + INTERVAL '3' MONTH
  GROUP BY l_suppkey
)
SELECT s_suppkey, s_name, s_address, s_phone, total_revenue
FROM supplier, revenue0
WHERE s_suppkey = supplier_no
  AND total_revenue = (SELECT MAX(r2.total_revenue) FROM revenue0 r2)
ORDER BY s_suppkey
""",
    16: """
SELECT p_brand, p_type, p_size, COUNT(DISTINCT ps_suppkey) AS supplier_cnt
FROM partsupp, part
WHERE p_partkey = ps_partkey
  AND p_brand <> 'Brand#45'
  AND p_type NOT LIKE 'MEDIUM POLISHED%'
  AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
  AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Customer%Complaints%')
GROUP BY p_brand, p_type, p_size
ORDER BY supplier_cnt DESC, p_brand, p_type, p_size
""",
    17: """
SELECT SUM(l.l_extendedprice) / 7.0 AS avg_yearly
FROM lineitem l, part p
WHERE p.p_partkey = l.l_partkey
  AND p.p_brand = 'Brand#23'
  AND p.p_container = 'MED BOX'
  AND l.l_quantity < (SELECT 0.2 * AVG(l2.l_quantity) FROM lineitem l2 WHERE l2.l_partkey = p.p_partkey)
""",
    18: """
SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, SUM(l.l_quantity) AS sum_qty
FROM customer, orders, lineitem l
WHERE o_orderkey IN (
    SELECT l2.l_orderkey FROM lineitem l2 GROUP BY l2.l_orderkey HAVING SUM(l2.l_quantity) > 300)
  AND c_custkey = o_custkey
  AND o_orderkey = l.l_orderkey
GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
ORDER BY o_totalprice DESC, o_orderdate
LIMIT 100
""",
    19: """
SELECT SUM(l_extendedprice * (1 - l_discount)) AS revenue
FROM lineitem, part
WHERE (p_partkey = l_partkey
       AND p_brand = 'Brand#12'
       AND p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
       AND l_quantity >= 1 AND l_quantity <= 1 + 10
       AND p_size BETWEEN 1 AND 5
       AND l_shipmode IN ('AIR', 'AIR REG')
       AND l_shipinstruct = 'DELIVER IN PERSON')
   OR (p_partkey = l_partkey
       AND p_brand = 'Brand#23'
       AND p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
       AND l_quantity >= 10 AND l_quantity <= 10 + 10
       AND p_size BETWEEN 1 AND 10
       AND l_shipmode IN ('AIR', 'AIR REG')
       AND l_shipinstruct = 'DELIVER IN PERSON')
   OR (p_partkey = l_partkey
       AND p_brand = 'Brand#34'
       AND p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
       AND l_quantity >= 20 AND l_quantity <= 20 + 10
       AND p_size BETWEEN 1 AND 15
       AND l_shipmode IN ('AIR', 'AIR REG')
       AND l_shipinstruct = 'DELIVER IN PERSON')
""",
    20: """
SELECT s_name, s_address
FROM supplier, nation
WHERE s_suppkey IN (
    SELECT ps.ps_suppkey
    FROM partsupp ps
    WHERE ps.ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%')
      AND ps.ps_availqty > (
        SELECT 0.5 * SUM(l.l_quantity)
        FROM lineitem l
        WHERE l.l_partkey = ps.ps_partkey
          AND l.l_suppkey = ps.ps_suppkey
          AND l.l_shipdate >= DATE '1994-01-01'
          AND l.l_shipdate < DATE '1994-01-01' + INTERVAL '1' YEAR))
  AND s_nationkey = n_nationkey
  AND n_name = 'CANADA'
ORDER BY s_name
""",
    21: """
SELECT s_name, COUNT(*) AS numwait
FROM supplier, lineitem l1, orders, nation
WHERE s_suppkey = l1.l_suppkey
  AND o_orderkey = l1.l_orderkey
  AND o_orderstatus = 'F'
  AND l1.l_receiptdate > l1.l_commitdate
  AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey)
  AND NOT EXISTS (
    SELECT * FROM lineitem l3
    WHERE l3.l_orderkey = l1.l_orderkey
      AND l3.l_suppkey <> l1.l_suppkey
      AND l3.l_receiptdate > l3.l_commitdate)
  AND s_nationkey = n_nationkey
  AND n_name = 'SAUDI ARABIA'
GROUP BY s_name
ORDER BY numwait DESC, s_name
LIMIT 100
""",
    22: """
SELECT cntrycode, COUNT(*) AS numcust, SUM(c_acctbal) AS totacctbal
FROM (
  SELECT SUBSTRING(c.c_phone, 1, 2) AS cntrycode, c.c_acctbal
  FROM customer c
  WHERE SUBSTRING(c.c_phone, 1, 2) IN ('13', '31', '23', '29', '30', '18', '17')
    AND c.c_acctbal > (
      SELECT AVG(c2.c_acctbal) FROM customer c2
      WHERE c2.c_acctbal > 0.00
        AND SUBSTRING(c2.c_phone, 1, 2) IN ('13', '31', '23', '29', '30', '18', '17'))
    AND NOT EXISTS (SELECT * FROM orders o WHERE o.o_custkey = c.c_custkey)
) custsale
GROUP BY cntrycode
ORDER BY cntrycode
""",
}

_TRAILING_ORDER_BY = re.compile(r"\s+ORDER\s+BY\s+[^()]*$", re.IGNORECASE)


def stream_table_query(n: int, sf: float) -> tuple[str, str | None]:
    """The query as a stream table defines it, and a note when it differs from the spec's text.

    A top-level ORDER BY without LIMIT only orders the client's result set; a table has no order, so it is
    dropped (and said so). ORDER BY ... LIMIT is kept: that is a top-k the engine maintains."""
    import sqlglot

    q = QUERIES[n].format(fraction=f"{0.0001 / sf:.10f}".rstrip("0")).strip()
    top = sqlglot.parse_one(q, dialect="spark")
    if top.args.get("order") is None or top.args.get("limit") is not None:
        return q, None
    stripped = _TRAILING_ORDER_BY.sub("", q)
    again = sqlglot.parse_one(stripped, dialect="spark")
    if again.args.get("order") is not None or stripped == q:  # the ORDER BY was not the last clause
        raise ValueError(f"Q{n}: could not drop the top-level ORDER BY")
    return stripped, "top-level ORDER BY without LIMIT dropped"


# --- data ---------------------------------------------------------------------------------------------


def generate(sf: float, data_dir: Path) -> Path:
    """Parquet files of scale factor ``sf`` under ``data_dir/sf<sf>`` (generated once, then reused)."""
    out = data_dir / f"sf{sf:g}"
    if all((out / f"{t}.parquet").is_file() for t in TABLES):
        return out
    exe = shutil.which("tpchgen-cli", path=str(Path(sys.executable).parent)) or shutil.which("tpchgen-cli")
    if exe is None:
        raise SystemExit("tpchgen-cli not found: pip install -e '.[bench]' (or ./dev bench tpch, which does)")
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    subprocess.run([exe, "parquet", "-s", f"{sf:g}", "--output-dir", str(out), "--overwrite", "--quiet",
                    "--no-progress"], check=True)
    print(f"generated SF {sf:g} with tpchgen-cli into {out} in {time.perf_counter() - t:.1f} s", flush=True)
    return out


def load(spark: Any, parquet_dir: Path) -> dict[str, int]:
    """The 8 tables as Delta tables with Change Data Feed on; returns their row counts."""
    counts = {}
    for t in TABLES:
        spark.sql(f"DROP TABLE IF EXISTS {t}")
        spark.sql(f"CREATE TABLE {t} USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true) "
                  f"AS SELECT * FROM parquet.`{parquet_dir / f'{t}.parquet'}`")
        counts[t] = spark.table(t).count()
    return counts


@dataclass
class Churn:
    """TPC-H's refresh functions over the loaded orders / lineitem. RF1's new orders are copies of a sample
    of the generated orders (from the Parquet files, so the sample does not depend on earlier cycles),
    re-keyed from ``next_key`` on; RF2 deletes the ``n`` lowest order keys still present."""

    parquet_dir: Path
    n: int  # orders inserted and deleted per cycle
    next_key: int

    def run(self, spark: Any, cycle: int) -> dict[str, float]:
        src = self.parquet_dir
        t = time.perf_counter()
        spark.sql(f"""
            CREATE OR REPLACE TEMP VIEW tpch_rf1_keys AS
            SELECT o_orderkey AS old_key,
                   CAST({self.next_key} + ROW_NUMBER() OVER (ORDER BY h, o_orderkey) - 1 AS BIGINT) AS new_key
            FROM (SELECT o_orderkey, xxhash64(o_orderkey, {cycle}) AS h
                  FROM parquet.`{src / 'orders.parquet'}` ORDER BY h, o_orderkey LIMIT {self.n})""")
        spark.sql(f"""
            INSERT INTO orders
            SELECT k.new_key, o.o_custkey, o.o_orderstatus, o.o_totalprice, o.o_orderdate, o.o_orderpriority,
                   o.o_clerk, o.o_shippriority, o.o_comment
            FROM parquet.`{src / 'orders.parquet'}` o JOIN tpch_rf1_keys k ON o.o_orderkey = k.old_key""")
        spark.sql(f"""
            INSERT INTO lineitem
            SELECT k.new_key, l.l_partkey, l.l_suppkey, l.l_linenumber, l.l_quantity, l.l_extendedprice,
                   l.l_discount, l.l_tax, l.l_returnflag, l.l_linestatus, l.l_shipdate, l.l_commitdate,
                   l.l_receiptdate, l.l_shipinstruct, l.l_shipmode, l.l_comment
            FROM parquet.`{src / 'lineitem.parquet'}` l JOIN tpch_rf1_keys k ON l.l_orderkey = k.old_key""")
        self.next_key += self.n
        rf1 = time.perf_counter() - t
        t = time.perf_counter()
        bound = spark.sql(f"SELECT MAX(o_orderkey) FROM (SELECT o_orderkey FROM orders ORDER BY o_orderkey "
                          f"LIMIT {self.n})").first()[0]
        spark.sql(f"DELETE FROM lineitem WHERE l_orderkey <= {bound}")
        spark.sql(f"DELETE FROM orders WHERE o_orderkey <= {bound}")
        return {"rf1_s": rf1, "rf2_s": time.perf_counter() - t}


# --- refreshes ----------------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured refresh call: the metrics, the CPU it used, and what the engine did."""

    m: Measured
    cpu_s: float
    action: str
    apply: str | None
    reason: str
    error: str | None = None


def refresh(spark: Any, st: Any, name: str, timeout: float) -> Run:
    """Refresh ``name`` under ``measure`` and ``cpu_seconds``. Past ``timeout`` seconds (0: none) a watchdog
    cancels every Spark job, again every half second until the call returns: a refresh spends part of
    its time planning on the driver, where nothing can be interrupted, so the next job it starts is what
    ends it."""
    done = threading.Event()
    fired = threading.Event()

    def watchdog() -> None:
        if done.wait(timeout):
            return
        fired.set()
        while not done.wait(0.5):
            spark.sparkContext.cancelAllJobs()

    def call() -> Any:
        try:
            return st.refresh_stream_table(name)
        except Exception as e:  # noqa: BLE001 - reported in the table, the run goes on
            return e

    dog = threading.Thread(target=watchdog, daemon=True) if timeout > 0 else None
    c0 = cpu_seconds(spark)
    if dog:
        dog.start()
    try:
        m = measure(spark, call)
    finally:
        done.set()
    st.catalog.settle()  # its bookkeeping (pipeline/bookkeeping.py): in its CPU-seconds, not its wall time
    cpu = cpu_seconds(spark) - c0
    r = m.result
    if isinstance(r, Exception):
        lines = [x.strip() for x in str(r).splitlines() if x.strip()] or [type(r).__name__]
        # py4j's first line only names the failed call; the cancellation says more
        first = next((x for x in lines if "cancel" in x.lower()), lines[0])[:300]
        return Run(m, cpu, "TIMEOUT" if fired.is_set() else "ERROR", None, "", first)
    return Run(m, cpu, r.action, r.apply, r.reason)


def job_profile(spark: Any, first: int, last: int) -> list[dict[str, Any]]:
    """The Spark jobs with ids in [first, last): what each ran (its description / call site), how long,
    how many stages and tasks and rows read. For a serial run these are the jobs of the calls between."""
    store = spark.sparkContext._jsc.sc().statusStore()  # noqa: SLF001
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # noqa: SLF001
    out = []
    for jid in range(first, last):
        try:
            job = store.job(jid)
        except Exception:  # noqa: BLE001 - a job id of another thread that the store dropped
            continue
        sub, done = job.submissionTime(), job.completionTime()
        ms = (done.get().getTime() - sub.get().getTime()) if sub.isDefined() and done.isDefined() else -1
        rows = 0
        stages = job.stageIds()
        for i in range(stages.size()):
            try:
                rows += store.lastStageAttempt(stages.apply(i)).inputRecords()
            except Exception:  # noqa: BLE001 - skipped stage
                pass
        desc = job.description().getOrElse(None) if job.description().isDefined() else None
        out.append({"job": jid, "ms": ms, "stages": stages.size(), "tasks": job.numTasks(), "rows_read": rows,
                    "status": str(job.status()), "name": str(job.name())[:160],
                    "description": (str(desc)[:300] if desc else None)})
    return out


def next_job_id(spark: Any) -> int:
    """The id the next Spark job will get (ids are sequential per application), read from the DAG
    scheduler's counter (package-private in Scala, public in bytecode); else from the status store."""
    sc = spark.sparkContext._jsc.sc()  # noqa: SLF001
    try:
        counter = sc.dagScheduler().nextJobId()  # an AtomicInteger, which py4j hands over as an int
        return int(counter) if isinstance(counter, int) else int(counter.get())
    except Exception:  # noqa: BLE001 - another Spark version
        sc.listenerBus().waitUntilEmpty()
        jobs = sc.statusStore().jobsList(None)  # a Scala Seq
        return max((jobs.apply(i).jobId() for i in range(jobs.size())), default=-1) + 1


def same_rows(st: Any, a: str, b: str) -> bool:
    """Multiset equality of the user columns of two stream tables."""
    x, y = st.read(a), st.read(b)
    return x.exceptAll(y).limit(1).count() == 0 and y.exceptAll(x).limit(1).count() == 0


# --- main ---------------------------------------------------------------------------------------------


@dataclass
class QueryState:
    """What the run knows about one query: how it was created and what its refreshes measured."""

    n: int
    mode: str = "DIFFERENTIAL"
    note: str | None = None
    create_error: str | None = None
    diff: list[Run] = field(default_factory=list)
    full: list[Run] = field(default_factory=list)
    auto: list[Run] = field(default_factory=list)  # with --auto: a third table, refresh_mode AUTO
    auto_stopped: str | None = None  # why the AUTO table was no longer refreshed (its --timeout)
    stopped: str | None = None  # why its DIFFERENTIAL table was no longer refreshed
    same: bool | None = None
    profile: list[dict[str, Any]] = field(default_factory=list)


def _median(runs: list[Run], key: str) -> float | None:
    vals = [float(getattr(r.m, key) if hasattr(r.m, key) else getattr(r, key)) for r in runs
            if r.error is None]
    return statistics.median(vals) if vals else None


def summarize(q: QueryState, measured_from: int) -> dict[str, Any]:
    """Medians over the measured cycles (the warm-up cycle, index 0, left out)."""
    d, f = q.diff[measured_from:], q.full[measured_from:]
    row: dict[str, Any] = {"query": q.n, "mode": q.mode, "note": q.note, "create_error": q.create_error,
                           "stopped": q.stopped, "same_rows": q.same, "cycles": len(d)}
    for prefix, runs in (("diff", d), ("full", f)):
        for k in ("wall_s", "jobs", "job_s", "driver_s", "rows_read", "cpu_s"):
            row[f"{prefix}_{k}"] = _median(runs, k)
        row[f"{prefix}_actions"] = [r.action for r in runs]
        row[f"{prefix}_errors"] = [r.error for r in runs if r.error]
        row[f"{prefix}_all_wall_s"] = [r.m.wall_s for r in runs]
    row["auto_actions"] = [r.action for r in q.auto[measured_from:]]
    row["auto_all_wall_s"] = [r.m.wall_s for r in q.auto[measured_from:]]
    row["auto_reasons"] = [r.reason for r in q.auto[measured_from:]]
    row["auto_stopped"] = q.auto_stopped
    last = next((r for r in reversed(q.diff) if r.error is None), None)
    row["diff_apply"] = last.apply if last else None
    row["diff_reason"] = last.reason if last else None
    ds, fs = row["diff_wall_s"], row["full_wall_s"]
    # a ratio only where both tables did work: Q2, Q11 and Q16 read none of the tables RF1 / RF2 change,
    # so both refreshes are NO_DATA (no Spark job, under a millisecond) and their ratio is noise
    worked = any(r.action not in ("NO_DATA", "TIMEOUT", "ERROR") for r in d)
    row["worked"] = worked
    row["ratio"] = fs / ds if ds and fs and worked else None
    dc, fc = row["diff_cpu_s"], row["full_cpu_s"]
    row["cpu_ratio"] = fc / dc if dc and fc and worked else None
    row["profile"] = q.profile
    return row


def _fmt(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def print_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The Markdown table and the median ratios (returned for the JSON)."""
    print("\n| query | DIFF s | FULL s | FULL/DIFF | DIFF CPU-s | FULL CPU-s | CPU FULL/DIFF | DIFF jobs | "
          "FULL jobs | DIFF rows read | FULL rows read | DIFF action | apply (last refresh) | same rows |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    for r in rows:
        actions = sorted(set(r["diff_actions"]))
        act = "/".join(actions) if actions else "–"
        if r["mode"] != "DIFFERENTIAL":
            act = f"{r['mode']}: {act}"
        if r["stopped"]:
            act += f" ({r['stopped']})"
        same = {True: "yes", False: "**NO**", None: "–"}[r["same_rows"]]
        name = f"Q{r['query']}" + ("*" if r["note"] else "")
        if r["create_error"]:
            print(f"| {name} | – | – | – | – | – | – | – | – | – | – | create failed: {r['create_error']} | – | – |")
            continue
        print(f"| {name} | {_fmt(r['diff_wall_s'])} | {_fmt(r['full_wall_s'])} | {_fmt(r['ratio'], '.1f', 'x')} | "
              f"{_fmt(r['diff_cpu_s'])} | {_fmt(r['full_cpu_s'])} | {_fmt(r['cpu_ratio'], '.1f', 'x')} | "
              f"{_fmt(r['diff_jobs'], '.0f')} | {_fmt(r['full_jobs'], '.0f')} | {_fmt(r['diff_rows_read'], ',.0f')} | "
              f"{_fmt(r['full_rows_read'], ',.0f')} | {act} | {r['diff_apply'] or '–'} | {same} |")
    maintained = [r for r in rows if r["mode"] == "DIFFERENTIAL" and not r["stopped"]
                  and r["diff_actions"] and set(r["diff_actions"]) == {"DIFFERENTIAL"}]
    ratios = [r["ratio"] for r in maintained if r["ratio"]]
    cpu = [r["cpu_ratio"] for r in maintained if r["cpu_ratio"]]
    summary = {"median_ratio": statistics.median(ratios) if ratios else None,
               "median_cpu_ratio": statistics.median(cpu) if cpu else None,
               "median_over": [r["query"] for r in maintained if r["ratio"]]}
    print(f"\nmedian FULL/DIFF over the {len(ratios)} queries refreshed DIFFERENTIAL in every measured cycle "
          f"({', '.join(f'Q{n}' for n in summary['median_over'])}): wall {_fmt(summary['median_ratio'], '.2f', 'x')}, "
          f"CPU {_fmt(summary['median_cpu_ratio'], '.2f', 'x')}")
    for r in rows:
        if r["note"]:
            print(f"* Q{r['query']}: {r['note']}")
        if r["diff_actions"] and set(r["diff_actions"]) == {"NO_DATA"}:
            print(f"* Q{r['query']}: reads none of the tables RF1 / RF2 change (orders, lineitem): every refresh "
                  "is NO_DATA, no ratio")
    return summary


def print_auto(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """AUTO against the faster of DIFFERENTIAL and FULL, cycle by cycle: AUTO learns (a DIFFERENTIAL refresh
    first, then a warm FULL where it may pay), so its last cycle is its steady state."""
    print("\n| query | AUTO actions by cycle | AUTO s (last) | DIFF s (last) | FULL s (last) | AUTO / faster |")
    print("|---|---|---:|---:|---:|---:|")
    worst: list[float] = []
    for r in rows:
        if r["auto_stopped"]:
            print(f"| Q{r['query']} | {r['auto_stopped']} | – | – | – | – |")
            continue
        if not r["auto_actions"]:
            continue
        a = r["auto_all_wall_s"][-1]
        d = r["diff_all_wall_s"][-1] if r["diff_all_wall_s"] and not r["stopped"] else None
        f = r["full_all_wall_s"][-1] if r["full_all_wall_s"] else None
        best = min(x for x in (d, f) if x is not None) if (d or f) else None
        rel = a / best if best and r["worked"] else None
        if rel is not None:
            worst.append(rel)
        print(f"| Q{r['query']} | {' '.join(x[:4] for x in r['auto_actions'])} | {a:.2f} | {_fmt(d)} | {_fmt(f)} | "
              f"{_fmt(rel, '.2f', 'x')} |")
    out = {"auto_max_over_faster": max(worst) if worst else None,
           "auto_median_over_faster": statistics.median(worst) if worst else None}
    print(f"\nAUTO in the last cycle over the faster mode: median {_fmt(out['auto_median_over_faster'], '.2f', 'x')}, "
          f"worst {_fmt(out['auto_max_over_faster'], '.2f', 'x')}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    p.add_argument("--cycles", type=int, default=3, help="measured cycles after one warm-up cycle (default 3)")
    p.add_argument("--queries", default=",".join(str(n) for n in QUERIES), help="e.g. 1,3,17 (default all 22)")
    p.add_argument("--churn", type=float, default=0.001, help="orders inserted and deleted per cycle, as a "
                   "fraction of the orders (default 0.001)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds after which a DIFFERENTIAL refresh is "
                   "cancelled and the query's DIFFERENTIAL table no longer refreshed (0: never; default 600)")
    p.add_argument("--profile", action="store_true", help="list the Spark jobs of each query's last DIFFERENTIAL "
                   "refresh (also printed for every refresh that timed out)")
    p.add_argument("--data-dir", type=Path, default=ROOT / "benchmarks" / "data",
                   help="where the generated Parquet files are kept (git-ignored; default benchmarks/data)")
    p.add_argument("--warehouse", type=Path, default=None, help="warehouse folder (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the warehouse afterwards")
    p.add_argument("--no-check", action="store_true", help="skip the DIFFERENTIAL == FULL check")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)")
    p.add_argument("--tag", default="", help="label stored with the results")
    p.add_argument("--auto", action="store_true", help="also a refresh_mode AUTO table per query, refreshed every "
                   "cycle and compared with the faster mode in the last cycle (give it 4+ cycles to learn)")
    args = p.parse_args(argv)
    wanted = [int(s) for s in args.queries.split(",") if s.strip()]
    unknown = [n for n in wanted if n not in QUERIES]
    if unknown:
        p.error(f"no TPC-H query {unknown}; queries are 1..22")

    parquet = generate(args.sf, args.data_dir)

    from pipeline import StreamTables, spark_session
    from pipeline.errors import UnsupportedError

    wh = str(args.warehouse) if args.warehouse else tempfile.mkdtemp(prefix="trickle-tpch-")
    spark = spark_session(app_name="trickle-tpch", warehouse=wh, conf=dict(c.split("=", 1) for c in args.conf))
    started = time.time()
    states = {n: QueryState(n) for n in wanted}
    churn_log: list[dict[str, float]] = []
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    try:
        t = time.perf_counter()
        counts = load(spark, parquet)
        print(f"loaded SF {args.sf:g} as Delta in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{k} {v:,}" for k, v in counts.items()), flush=True)
        max_key = spark.sql("SELECT MAX(o_orderkey) FROM orders").first()[0]
        churn = Churn(parquet, max(1, round(counts["orders"] * args.churn)), int(max_key) + 1)
        print(f"churn per cycle: RF1 inserts {churn.n} orders (~{churn.n * counts['lineitem'] // counts['orders']} "
              f"lineitems), RF2 deletes {churn.n} orders with their lineitems", flush=True)
        st = StreamTables(spark, root=f"{wh}/_trickle")

        for n in wanted:
            q = states[n]
            sql, q.note = stream_table_query(n, args.sf)
            t = time.perf_counter()
            try:
                try:
                    st.create_stream_table(f"q{n:02d}_diff", sql, refresh_mode="DIFFERENTIAL")
                except UnsupportedError as e:
                    q.mode = "AUTO"
                    why = str(e).strip().splitlines()[0][:300]
                    q.note = "; ".join(x for x in (q.note, f"not differentiable, run AUTO: {why}") if x)
                    st.create_stream_table(f"q{n:02d}_diff", sql, refresh_mode="AUTO")
                st.create_stream_table(f"q{n:02d}_full", sql, refresh_mode="FULL")
                if args.auto:
                    st.create_stream_table(f"q{n:02d}_auto", sql, refresh_mode="AUTO")
            except Exception as e:  # noqa: BLE001 - reported, the other queries go on
                q.create_error = str(e).strip().splitlines()[0][:300]
                print(f"Q{n}: create failed: {q.create_error}", flush=True)
                continue
            print(f"Q{n}: created ({q.mode}) in {time.perf_counter() - t:.1f} s"
                  + (f"; {q.note}" if q.note else ""), flush=True)

        live = [n for n in wanted if states[n].create_error is None]
        for cycle in range(args.cycles + 1):
            c = churn.run(spark, cycle)
            churn_log.append(c)
            label = "warm-up" if cycle == 0 else f"cycle {cycle}"
            print(f"{label}: RF1 {c['rf1_s']:.1f} s, RF2 {c['rf2_s']:.1f} s", flush=True)
            full_first = cycle % 2 == 0  # each mode pays for reading new table versions first half the time
            for n in live:
                q = states[n]
                if full_first:
                    q.full.append(refresh(spark, st, f"q{n:02d}_full", 0))
                if q.stopped is None:
                    first = next_job_id(spark) if args.profile or args.timeout else 0
                    d = refresh(spark, st, f"q{n:02d}_diff", args.timeout)
                    q.diff.append(d)
                    if d.error is None and args.profile:
                        q.profile = job_profile(spark, first, next_job_id(spark))
                    if d.error is not None:
                        q.stopped = f"{d.action} in {label} after {d.m.wall_s:.0f} s"
                        if d.action == "TIMEOUT":
                            q.profile = job_profile(spark, first, next_job_id(spark))
                        print(f"  Q{n} DIFF {d.action} after {d.m.wall_s:.1f} s ({d.m.jobs} jobs, "
                              f"{d.m.job_s:.1f} s in jobs): {d.error}", flush=True)
                if not full_first:
                    q.full.append(refresh(spark, st, f"q{n:02d}_full", 0))
                f = q.full[-1]
                dd = q.diff[-1] if q.diff and q.stopped is None else None
                print(f"  Q{n}: DIFF " + (f"{dd.m.wall_s:.2f} s {dd.action} ({dd.m.jobs} jobs, {dd.cpu_s:.1f} CPU-s)"
                                          if dd else "–")
                      + f" | FULL {f.m.wall_s:.2f} s {f.action} ({f.m.jobs} jobs, {f.cpu_s:.1f} CPU-s)"
                      + (f" ERROR {f.error}" if f.error else ""), flush=True)
                if args.auto and q.auto_stopped is None:
                    a = refresh(spark, st, f"q{n:02d}_auto", args.timeout)
                    q.auto.append(a)
                    if a.error is not None:
                        q.auto_stopped = f"{a.action} in {label} after {a.m.wall_s:.0f} s"
                    print(f"  Q{n}: AUTO {a.m.wall_s:.2f} s {a.action}" + (f" ERROR {a.error}" if a.error else ""),
                          flush=True)

        if not args.no_check:
            for n in live:
                q = states[n]
                if q.stopped is None:
                    q.same = same_rows(st, f"q{n:02d}_diff", f"q{n:02d}_full")
            print("DIFFERENTIAL == FULL after the last cycle: " + ", ".join(
                f"Q{n} {'yes' if states[n].same else ('NO' if states[n].same is False else '–')}" for n in live),
                flush=True)
        rows = [summarize(states[n], 1) for n in wanted]
        print(f"\nTPC-H SF {args.sf:g}, churn {args.churn:.2%} of orders per cycle ({churn.n} orders), "
              f"{args.cycles} measured cycle(s) after 1 warm-up; medians")
        summary = print_table(rows)
        if args.auto:
            summary.update(print_auto(rows))
        for r in rows:
            if r["profile"] and (r["stopped"] or args.profile):
                last = states[r["query"]].diff[-1].m
                print(f"\nQ{r['query']}: jobs of its last DIFFERENTIAL refresh"
                      + (" (timed out)" if r["stopped"] else "")
                      + f": {last.wall_s:.2f} s wall, {last.jobs} jobs, {last.job_s:.2f} s with a job running, "
                      f"{last.driver_s:.2f} s on the driver only")
                for j in r["profile"]:
                    what = re.sub(r"bench-\d+:? ?", "", j["description"] or "").strip(": ")
                    print(f"  job {j['job']:>5} {j['ms']:>8} ms  {j['stages']:>2} stages {j['tasks']:>4} tasks "
                          f"{j['rows_read']:>10,} rows  {what or j['name']}")
    finally:
        out = Path(__file__).resolve().parent / "out"
        out.mkdir(exist_ok=True)
        meta = {"sf": args.sf, "cycles": args.cycles, "churn": args.churn, "timeout": args.timeout,
                "tag": args.tag, "started": started, "churn_log": churn_log}
        (out / f"tpch-{int(time.time())}.json").write_text(json.dumps({**meta, **summary, "queries": rows}, indent=1))
        spark.stop()
        if not args.keep and not args.warehouse:
            shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
