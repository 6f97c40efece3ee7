"""How much does a refresh cost when nothing changed (NO_DATA)?

The design says a NO_DATA refresh must cost metadata reads only, no Spark job, aiming at milliseconds:
it is what every scheduled stream table pays on every tick when its sources are idle, so it bounds how
many stream tables one job can keep on a tight schedule. This script creates a small Delta source and one
aggregate stream table in a throw-away warehouse, applies one change and refreshes it (warm-up, and a
real DIFFERENTIAL refresh first), then times 50 consecutive refreshes with no new source versions.

It prints median / p90 / p99 / max (wall clock via ``time.perf_counter`` and the API's own ``duration_ms``);
it asserts only that each of the 50 refreshes is NO_DATA, never a timing, because timings depend on the
machine. Run from the project root: ``.venv/bin/python benchmarks/no_data.py``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Runnable as a plain script from a checkout, without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUNS = 50
SOURCE_ROWS = 1000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with 50 samples p90 is the 45th smallest, a value that was observed."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
    return ordered[int(rank) - 1]


def main() -> int:
    from pipeline import StreamTables, spark_session

    warehouse = Path(tempfile.mkdtemp(prefix="trickle-bench-"))
    spark = spark_session(app_name="trickle-bench-no-data", warehouse=warehouse)
    try:
        spark.sql(
            "CREATE TABLE orders (id INT NOT NULL, customer STRING NOT NULL, amount DECIMAL(10,2) NOT NULL) "
            "USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
        spark.range(SOURCE_ROWS).selectExpr(
            "CAST(id AS INT) AS id",
            "concat('c', CAST(id % 50 AS STRING)) AS customer",
            "CAST(id % 997 AS DECIMAL(10,2)) AS amount",
        ).write.format("delta").mode("append").saveAsTable("orders")

        st = StreamTables(spark)
        st.create_stream_table(
            "customer_totals",
            "SELECT customer, COUNT(*) AS orders, SUM(amount) AS total FROM orders GROUP BY customer",
            schedule="1m",
            refresh_mode="AUTO",
        )
        spark.sql(f"INSERT INTO orders VALUES ({SOURCE_ROWS}, 'c1', 12.50), ({SOURCE_ROWS + 1}, 'new', 3.00)")
        first = st.refresh_stream_table("customer_totals")
        print(f"first refresh: {first.action} ({first.reason}) in {first.duration_ms:.0f} ms")

        wall_ms: list[float] = []
        api_ms: list[float] = []
        for i in range(RUNS):
            t0 = time.perf_counter()
            r = st.refresh_stream_table("customer_totals")
            wall_ms.append((time.perf_counter() - t0) * 1000)
            assert r.action == "NO_DATA", f"refresh {i + 1}: expected NO_DATA, got {r.action} ({r.reason})"
            if r.duration_ms is not None:
                api_ms.append(float(r.duration_ms))

        print(f"{RUNS} NO_DATA refreshes of customer_totals ({SOURCE_ROWS + 2} source rows):")
        for label, values in (("wall clock", wall_ms), ("duration_ms", api_ms)):
            if values:
                print(
                    f"  {label:<11}  median {statistics.median(values):8.1f} ms"
                    f"   p90 {percentile(values, 90):8.1f} ms   p99 {percentile(values, 99):8.1f} ms"
                    f"   max {max(values):8.1f} ms"
                )

        # A fast NO_DATA is only worth something if it is not a stale answer: a new source version must
        # still be seen by the very next refresh.
        spark.sql(f"INSERT INTO orders VALUES ({SOURCE_ROWS + 2}, 'c2', 1.00)")
        after = st.refresh_stream_table("customer_totals")
        assert after.action != "NO_DATA", "a refresh after a source commit must not be NO_DATA"
        print(f"after one more source commit: {after.action} in {after.duration_ms:.0f} ms (not NO_DATA: ok)")
        return 0
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
