"""DIFFERENTIAL vs FULL, side by side in one run, per query shape, source size and change rate.

    ./dev bench --quick            # 10K and 100K rows, 1% and 10% changes, 3 measured cycles (~20 min)
    ./dev bench --sizes 100000,1000000 --rates 0.001,0.01,0.1,0.5 --cycles 3
    ./dev bench --sizes 10000000 --rates 0.001,0.01 --shapes join_agg
    ./dev bench report             # Markdown tables + docs/benchmark_speedup.png from benchmarks/out/

Each cycle changes the fact table with ONE Delta MERGE (70% updates incl. join-key updates, 15% deletes,
15% inserts), then refreshes the DIFFERENTIAL and the FULL stream table of every shape, timing each, and
runs the user's own full recompute (CTAS: CREATE OR REPLACE TABLE ... AS SELECT on Delta). The first
cycle of each rate warms up and is not measured; medians of the others are reported, with where the time
of a DIFFERENTIAL refresh went (Spark jobs, time with a job running vs. on the driver, rows read, Delta
commits; see metrics.py), and a check that DIFFERENTIAL and FULL hold the same rows. Results: a Markdown
table on stdout and JSON in benchmarks/out/. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics import Measured, measure  # noqa: E402

SHAPES = {
    "scan": "SELECT id, region, dim_id, amount FROM bench_fact",
    "filter": "SELECT id, amount FROM bench_fact WHERE amount > 900",
    "aggregate": "SELECT region, SUM(amount) AS total, COUNT(*) AS n FROM bench_fact GROUP BY region",
    "join": "SELECT f.id, f.amount, d.name FROM bench_fact f JOIN bench_dim d ON f.dim_id = d.id",
    "join_agg": ("SELECT d.name, SUM(f.amount) AS total, COUNT(*) AS n FROM bench_fact f "
                 "JOIN bench_dim d ON f.dim_id = d.id GROUP BY d.name"),
}
DIMS = 1000


def commits(st: Any, name: str) -> int | None:
    """The stream table's latest Delta version (to count the commits a refresh made)."""
    from connectors.delta_log import DeltaLog

    return DeltaLog(st.spark, st.catalog.get(name).path).latest_version()


def create_sources(spark: Any, rows: int) -> None:
    spark.sql("DROP TABLE IF EXISTS bench_fact")
    spark.sql("DROP TABLE IF EXISTS bench_dim")
    spark.sql("CREATE TABLE bench_fact (id BIGINT, region INT, dim_id INT, amount DOUBLE) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("CREATE TABLE bench_dim (id INT, name STRING, region INT) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO bench_dim SELECT CAST(id AS INT), concat('d', id % 50), CAST(id % 8 AS INT) "
              f"FROM range({DIMS})")
    spark.sql(f"INSERT INTO bench_fact SELECT id, CAST(id % 8 AS INT), CAST(id % {DIMS} AS INT), "
              f"CAST(id % 1000 AS DOUBLE) + 0.5 FROM range({rows})")


def change_cycle(spark: Any, rows: int, rate: float, cycle: int, next_id: int) -> int:
    """One MERGE: updates of amount and of the join key, deletes, inserts of new ids."""
    n = max(1, int(rows * rate))
    upd, dele, ins = int(n * 0.7), int(n * 0.15), n - int(n * 0.7) - int(n * 0.15)
    step = max(1, rows // max(1, upd + dele))
    spark.sql(f"""
        MERGE INTO bench_fact t USING (
          SELECT id, 'U' AS op FROM (SELECT (id * {step} + {cycle * 7919}) % {rows} AS id FROM range({upd}))
          UNION ALL
          SELECT id, 'D' AS op FROM (SELECT (id * {step} + {cycle * 7919} + {step // 2 or 1}) % {rows} AS id
                                     FROM range({dele}))
          UNION ALL
          SELECT {next_id} + id AS id, 'I' AS op FROM range({ins})
        ) s ON t.id = s.id
        WHEN MATCHED AND s.op = 'D' THEN DELETE
        WHEN MATCHED AND s.op = 'U' THEN UPDATE SET amount = t.amount + 1, dim_id = (t.dim_id + {cycle}) % {DIMS}
        WHEN NOT MATCHED AND s.op = 'I' THEN INSERT (id, region, dim_id, amount)
          VALUES (s.id, CAST(s.id % 8 AS INT), CAST(s.id % {DIMS} AS INT), 7.5)
    """)
    return next_id + ins


def record(acc: dict[str, list[float]], d: Measured, f: Measured, c: Measured, made: int) -> None:
    """Keep one measured cycle: times, jobs, driver vs in-job time, rows read, commits."""
    for prefix, m in (("diff", d), ("full", f), ("ctas", c)):
        for k, v in (("s", m.wall_s), ("jobs", m.jobs), ("job_s", m.job_s), ("driver_s", m.driver_s),
                     ("rows_read", m.rows_read)):
            acc.setdefault(f"{prefix}_{k}", []).append(float(v))
    acc.setdefault("diff_commits", []).append(float(made))


def same_rows(st: Any, a: str, b: str) -> bool:
    x, y = st.read(a), st.read(b)
    return x.exceptAll(y).limit(1).count() == 0 and y.exceptAll(x).limit(1).count() == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--rates", default="0.001,0.01,0.1,0.5")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--no-check", action="store_true", help="skip the DIFFERENTIAL == FULL check")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, e.g. trickle.streamTable.deletionVectors=true (repeatable)")
    p.add_argument("--tag", default="", help="label stored with the results (e.g. the settings tried)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.rates, args.cycles = "10000,100000", "0.01,0.1", 3
    sizes = [int(s) for s in args.sizes.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    shapes = args.shapes.split(",")

    from pipeline import StreamTables, spark_session

    wh = tempfile.mkdtemp(prefix="trickle-bench-")
    spark = spark_session(app_name="trickle-bench", warehouse=wh, conf=dict(c.split("=", 1) for c in args.conf))
    results = []
    try:
        for rows in sizes:
            create_sources(spark, rows)
            st = StreamTables(spark, root=f"{wh}/_trickle_{rows}")
            for shape in shapes:
                st.create_stream_table(f"{shape}_diff_{rows}", SHAPES[shape], refresh_mode="DIFFERENTIAL")
                st.create_stream_table(f"{shape}_full_{rows}", SHAPES[shape], refresh_mode="FULL")
            next_id = rows
            cycle = 0
            for rate in rates:
                per: dict[str, dict[str, list[float]]] = {s: {} for s in shapes}
                ok = {s: True for s in shapes}
                for i in range(args.cycles + 1):  # the first cycle warms up and is not measured
                    cycle += 1
                    next_id = change_cycle(spark, rows, rate, cycle, next_id)
                    for shape in shapes:
                        before = commits(st, f"{shape}_diff_{rows}")
                        d = measure(spark, lambda n=f"{shape}_diff_{rows}", t=st: t.refresh_stream_table(n))
                        assert d.result.action == "DIFFERENTIAL", d.result
                        made = (commits(st, f"{shape}_diff_{rows}") or 0) - (before or 0)
                        f = measure(spark, lambda n=f"{shape}_full_{rows}", t=st: t.refresh_stream_table(n))
                        c = measure(spark, lambda s=shape: spark.sql(
                            f"CREATE OR REPLACE TABLE bench_ctas_{s} USING delta AS {SHAPES[s]}"))
                        if i > 0:
                            record(per[shape], d, f, c, made)
                        if i == args.cycles and not args.no_check:
                            ok[shape] = same_rows(st, f"{shape}_diff_{rows}", f"{shape}_full_{rows}")
                for shape in shapes:
                    m = {k: statistics.median(v) for k, v in per[shape].items()}
                    row = {"rows": rows, "rate": rate, "shape": shape, **m, "speedup": m["full_s"] / m["diff_s"],
                           "ctas_speedup": m["ctas_s"] / m["diff_s"], "same_rows": ok[shape],
                           "cycles": args.cycles, "tag": args.tag}
                    results.append(row)
                    print(f"| {rows:>9} | {rate:6.1%} | {shape:9} | {m['diff_s']:7.2f} | {m['full_s']:7.2f} | "
                          f"{m['ctas_s']:7.2f} | {row['speedup']:5.1f}x | {row['ctas_speedup']:5.1f}x | "
                          f"{m['diff_jobs']:3.0f} | {m['diff_commits']:2.0f} | {m['diff_job_s']:5.2f} | "
                          f"{m['diff_driver_s']:5.2f} | {m['diff_rows_read']:10,.0f} | {m['full_jobs']:3.0f} | "
                          f"{m['full_rows_read']:10,.0f} | {ok[shape]} |", flush=True)
    finally:
        out = Path(__file__).resolve().parent / "out"
        out.mkdir(exist_ok=True)
        (out / f"results-{int(time.time())}.json").write_text(json.dumps(results, indent=1))
        spark.stop()
        shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    print("| rows | change | shape | DIFF s | FULL s | CTAS s | FULL/DIFF | CTAS/DIFF | DIFF jobs | DIFF commits "
          "| DIFF in jobs s | DIFF driver s | DIFF rows read | FULL jobs | FULL rows read | same rows |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    raise SystemExit(main())
