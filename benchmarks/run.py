"""DIFFERENTIAL vs FULL vs AUTO vs CTAS, side by side in one run, per query shape, source size and change rate.

    ./dev bench --quick            # 10K and 100K rows, 1% and 10% changes, 3 measured cycles
    ./dev bench --sizes 1000000,10000000 --rates 0.001,0.01,0.1,0.5     # all five shapes
    ./dev bench --sizes 100000000 --rates 0.001 --shapes join_agg
    ./dev bench --preset issue16   # both of the above in one run: the matrix of issue 16
    ./dev bench --gen-only --sizes 100000,1000000   # time data generation (and one change) only, extrapolated
    ./dev bench report             # Markdown tables + docs/benchmark_speedup.png from benchmarks/out/

Every shape gets three stream tables over the same sources: refresh_mode DIFFERENTIAL, AUTO and FULL. Each
cycle changes the fact table with ONE Delta MERGE (70% updates incl. join-key updates, 15% deletes, 15%
inserts), then refreshes the three stream tables of every shape, timing each, and runs the user's own full
recompute (CTAS: CREATE OR REPLACE TABLE ... AS SELECT on Delta). The first cycle of each rate warms up and
is not measured; medians of the others are reported (``--cycles`` of them, ``--cycles-small`` in the cells
changing at most :data:`SMALL_RATE` of the rows or over at most :data:`SMALL_ROWS` rows, whose short
refreshes need more samples). The second of two refreshes of the same query over
the same change window was measured 30-50% cheaper than the first at 10K-100K rows (it finds the first
one's generated code compiled, in Spark's code generation cache), so a fixed order would flatter whichever
goes second. Place itself matters too (session 42, 1M rows, join at 1%: the DIFFERENTIAL table's refresh
took a median 0.213 s when it came first after the source's change and 0.157 s when it came after FULL,
with the same apply, while AUTO, always second, took 0.171 s). So the four refreshes of a shape follow
:data:`ORDERS`, a Williams square: over every 4 measured cycles each takes each place once, and each
comes right after each other one once (over 2 cycles, the first two orders: DIFFERENTIAL, AUTO, CTAS, FULL
and its reverse). Right after matters: a refresh that follows a heavy one pays for it (its garbage, its
files still being written back), and until session 55 the square only balanced before and after, so AUTO
came right after DIFFERENTIAL in two cycles of four and FULL never (at 50% change, where DIFFERENTIAL takes
35-39 s at 10M rows and AUTO and FULL both recompute, AUTO's recomputations right after it were the slowest:
6.2 and 7.2 s against 4.4-5.8 s). The first
Spark query that scans the fact table after its MERGE rebuilds the new snapshot's state with a job ("Compute
snapshot for version", 0.3-0.9 s at 1-10M rows), which every later reader shares: the cycle plans a scan of
the table once, untimed, right after its MERGE (:func:`warm_snapshot`), so that no measured refresh pays it
by its place. (Until session 54 this was a ``count(*)``, which Delta answers from the log's statistics
without that job, so whichever of AUTO, FULL and CTAS scanned first paid it: AUTO twice in four cycles when
DIFFERENTIAL, first, read only the change feed.) The JSON keeps which went first per cycle (``first``).
Since session 57 each measured operation also starts after :func:`settle` (the dirty pages written back, then
0.2 s), untimed, so none shares the cores with what the one before it left running.

Per refresh: wall time and CPU-seconds (this Python process + the Spark driver JVM, which in local mode
runs the executors too: what a shared cluster pays; see metrics.cpu_seconds), and for DIFFERENTIAL where
the time went (Spark jobs, time with a job running vs. on the driver, rows read, Delta commits, the commit
path ``RefreshResult.apply``; see metrics.py). AUTO reports what it did (``RefreshResult.action`` and
``reason``) and its time against the faster of DIFFERENTIAL and FULL (issue 16's target: <= 1.2x). After
the last cycle DIFFERENTIAL and AUTO are checked to hold the same rows as FULL. Results: a Markdown table on
stdout, progress (data generation times) on stderr, JSON in benchmarks/out/ (rewritten after every cell,
so a long run that dies keeps what it measured). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics import Measured, cpu_seconds, measure  # noqa: E402

SHAPES = {
    "scan": "SELECT id, region, dim_id, amount FROM bench_fact",
    "filter": "SELECT id, amount FROM bench_fact WHERE amount > 900",
    "aggregate": "SELECT region, SUM(amount) AS total, COUNT(*) AS n FROM bench_fact GROUP BY region",
    "join": "SELECT f.id, f.amount, d.name FROM bench_fact f JOIN bench_dim d ON f.dim_id = d.id",
    "join_agg": ("SELECT d.name, SUM(f.amount) AS total, COUNT(*) AS n FROM bench_fact f "
                 "JOIN bench_dim d ON f.dim_id = d.id GROUP BY d.name"),
}
DIMS = 1000
#: the order of a shape's four refreshes in measured cycle i (i - 1 modulo 4; the warm-up cycle takes the
#: last): a Williams square, each in each place once and right after each other one once (see the docstring)
ORDERS = [["diff", "auto", "ctas", "full"], ["full", "ctas", "auto", "diff"], ["auto", "full", "diff", "ctas"],
          ["ctas", "diff", "full", "auto"]]
#: the stream tables of a shape: result-key prefix -> refresh_mode
MODES = {"diff": "DIFFERENTIAL", "auto": "AUTO", "full": "FULL"}
ALL_RATES = [0.001, 0.01, 0.1, 0.5]
#: named matrices, each a list of (sizes, rates, shapes) groups run one after the other in one process.
#: ``issue16`` is what issue 16 point 7 asks for: all five shapes at 1M and 10M rows x 0.1/1/10/50%, and
#: join_agg at 100M x 0.1% (a product of sizes x rates x shapes cannot say that, hence groups).
#: cells changing at most this share of the rows may get more measured cycles (``--cycles-small``). Why: their
#: refreshes take 0.05-0.5 s, and single refreshes of the same work spread by 35-300 ms (session 42's profiles
#: of AUTO against DIFFERENTIAL doing the same apply: 1.00-1.06x over 8-12 refreshes, while medians of 4 in the
#: matrix missed 1.2x by 12-47 ms); more samples cost little there
SMALL_RATE = 0.01
#: ... and so may every cell over at most this many fact rows, at any rate. Why: at 1M rows even a 10% change
#: refreshes differentially in 40-180 ms and FULL in about 1 s, and medians of 4 were decided by one hiccup
#: (session 54's matrix: AUTO over DIFFERENTIAL doing the same refreshes 1.77x at 1M x 10% aggregate, 1.02x
#: over 8 cycles; FULL over CTAS 1.37x at 1M x 10% join, 1.24x over 8). About 6 minutes more per matrix
SMALL_ROWS = 1_000_000
PRESETS: dict[str, list[tuple[list[int], list[float], list[str]]]] = {
    "quick": [([10_000, 100_000], [0.01, 0.1], list(SHAPES))],
    "issue16": [([1_000_000, 10_000_000], ALL_RATES, list(SHAPES)), ([100_000_000], [0.001], ["join_agg"])],
    "issue16-1m": [([1_000_000], ALL_RATES, list(SHAPES))],
    "issue16-10m": [([10_000_000], ALL_RATES, list(SHAPES))],
    "issue16-100m": [([100_000_000], [0.001], ["join_agg"])],
}

HEADER = ("| rows | change | shape | DIFF s | AUTO s | FULL s | CTAS s | FULL/DIFF | CTAS/DIFF | AUTO/best "
          "| AUTO did | DIFF CPU s | AUTO CPU s | FULL CPU s | CTAS CPU s | FULL/DIFF CPU | CTAS/DIFF CPU "
          "| DIFF jobs | DIFF commits | DIFF in jobs s | DIFF driver s | DIFF rows read | FULL jobs "
          "| FULL rows read | DIFF commit path | same rows |")
ALIGN = "|---:|---:|---|" + "---:|" * 7 + "---|" + "---:|" * 13 + "---|---|"


def log(msg: str) -> None:
    """Progress on stderr, so stdout stays one Markdown table."""
    print(msg, file=sys.stderr, flush=True)


def commits(st: Any, name: str) -> int | None:
    """The stream table's latest Delta version (to count the commits a refresh made)."""
    from connectors.delta_log import DeltaLog

    return DeltaLog(st.spark, st.catalog.get(name).path).latest_version()


def create_sources(spark: Any, rows: int) -> float:
    """The fact table (``rows`` rows) and the 1000-row dimension; returns the seconds the fact table took.

    The fact table is ONE ``INSERT ... SELECT ... FROM range(n)``: Spark generates the ids in its tasks
    (``spark.default.parallelism`` partitions, one Parquet file each), nothing passes through Python, so
    100M rows cost what writing 100M narrow rows costs on the machine (``--gen-only`` measures it)."""
    spark.sql("DROP TABLE IF EXISTS bench_fact")
    spark.sql("DROP TABLE IF EXISTS bench_dim")
    spark.sql("CREATE TABLE bench_fact (id BIGINT, region INT, dim_id INT, amount DOUBLE) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql("CREATE TABLE bench_dim (id INT, name STRING, region INT) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO bench_dim SELECT CAST(id AS INT), concat('d', id % 50), CAST(id % 8 AS INT) "
              f"FROM range({DIMS})")
    t = time.perf_counter()
    spark.sql(f"INSERT INTO bench_fact SELECT id, CAST(id % 8 AS INT), CAST(id % {DIMS} AS INT), "
              f"CAST(id % 1000 AS DOUBLE) + 0.5 FROM range({rows})")
    return time.perf_counter() - t


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


def timed(spark: Any, fn: Callable[[], Any], after: Callable[[], Any] | None = None) -> tuple[Measured, float]:
    """``measure(fn)`` and the CPU-seconds it cost (Python + driver JVM, executors included in local mode).
    ``after``: waits for work ``fn`` left running when it returned (a refresh's bookkeeping, written by a
    background thread: :mod:`pipeline.bookkeeping`), counted in the CPU-seconds but not in the wall time, and
    never left to run beside what is measured next."""
    c0 = cpu_seconds(spark)
    m = measure(spark, fn)
    if after is not None:
        after()
    return m, cpu_seconds(spark) - c0


def refresh(st: Any, name: str) -> tuple[Measured, float, int]:
    """Refresh ``name``, measured: what Spark did, the CPU-seconds, and the Delta commits it made."""
    before = commits(st, name)
    m, cpu = timed(st.spark, partial(st.refresh_stream_table, name), after=st.catalog.settle)
    return m, cpu, (commits(st, name) or 0) - (before or 0)


def record(acc: dict[str, list[float]], prefix: str, m: Measured, cpu: float) -> None:
    """Keep one measured call: wall time, CPU-seconds, jobs, driver vs in-job time, rows read."""
    for k, v in (("s", m.wall_s), ("cpu", cpu), ("jobs", m.jobs), ("job_s", m.job_s), ("driver_s", m.driver_s),
                 ("rows_read", m.rows_read)):
        acc.setdefault(f"{prefix}_{k}", []).append(float(v))


def same_rows(st: Any, a: str, b: str) -> bool:
    x, y = st.read(a), st.read(b)
    return x.exceptAll(y).limit(1).count() == 0 and y.exceptAll(x).limit(1).count() == 0


def commit_path(apply: str | None) -> str:
    """``RefreshResult.apply`` without its reason: "MERGE (delta-rs)", "SPARK_MERGE (spark)", ..."""
    return "-" if not apply else apply.split(":", 1)[0]


def summary(per: dict[str, list[float]], text: dict[str, list[str]]) -> dict[str, Any]:
    """Medians of one cell's measured cycles, the ratios, and what AUTO did."""
    m: dict[str, Any] = {k: statistics.median(v) for k, v in per.items()}
    m["speedup"] = m["full_s"] / m["diff_s"]
    m["ctas_speedup"] = m["ctas_s"] / m["diff_s"]
    m["cpu_speedup"] = m["full_cpu"] / m["diff_cpu"] if m["diff_cpu"] > 0 else None
    m["ctas_cpu_speedup"] = m["ctas_cpu"] / m["diff_cpu"] if m["diff_cpu"] > 0 else None
    m["auto_vs_best"] = m["auto_s"] / min(m["full_s"], m["diff_s"])
    m["auto_actions"] = text["auto_action"]
    m["auto_did"] = ", ".join(f"{a} x{n}" if n > 1 else a for a, n in Counter(text["auto_action"]).items())
    m["auto_reason"] = text["auto_reason"][-1]
    m["auto_apply"] = text["auto_apply"][-1]
    m["auto_change_ratios"] = [None if r == "None" else float(r) for r in text["auto_change_ratio"]]
    m["diff_apply"] = text["diff_apply"][-1]
    m["diff_paths"] = sorted(set(map(commit_path, text["diff_apply"])))
    m["first"] = text["first"]
    m["samples"] = {k: per[k] for k in ("diff_s", "auto_s", "full_s", "ctas_s") if k in per}
    return m


def line(row: dict[str, Any]) -> str:
    """One row of the stdout table (the same columns as report.py's, with the shape)."""
    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}x"

    return (f"| {row['rows']:>11,} | {row['rate']:6.1%} | {row['shape']:9} | {row['diff_s']:7.2f} | "
            f"{row['auto_s']:7.2f} | {row['full_s']:7.2f} | {row['ctas_s']:7.2f} | {x(row['speedup'])} | "
            f"{x(row['ctas_speedup'])} | {row['auto_vs_best']:.2f}x | {row['auto_did']} | {row['diff_cpu']:6.2f} | "
            f"{row['auto_cpu']:6.2f} | {row['full_cpu']:6.2f} | {row['ctas_cpu']:6.2f} | {x(row['cpu_speedup'])} | "
            f"{x(row['ctas_cpu_speedup'])} | {row['diff_jobs']:3.0f} | {row['diff_commits']:2.0f} | "
            f"{row['diff_job_s']:5.2f} | {row['diff_driver_s']:5.2f} | {row['diff_rows_read']:10,.0f} | "
            f"{row['full_jobs']:3.0f} | {row['full_rows_read']:10,.0f} | {', '.join(row['diff_paths'])} | "
            f"{'yes' if row['same_rows'] else 'NO'} |")


def groups(args: argparse.Namespace) -> list[tuple[list[int], list[float], list[str]]]:
    """What to run: a preset's groups, or the one group of --sizes x --rates x --shapes."""
    if args.preset:
        return PRESETS[args.preset]
    return [([int(s) for s in args.sizes.split(",")], [float(r) for r in args.rates.split(",")],
             args.shapes.split(","))]


def gen_only(spark: Any, sizes: list[int], rates: list[float]) -> None:
    """Time the fact table's generation and one change MERGE per rate at each size, and extrapolate
    linearly (from the largest size run) to the issue's 10M and 100M rows: the setup cost of a large cell,
    which is not measured but has to fit in the lead's run."""
    print("| fact rows | generate s | rows/s | " + " | ".join(f"change {r:.1%} s" for r in rates) + " |")
    print("|---:|---:|---:|" + "---:|" * len(rates))
    last: tuple[int, float, list[float]] | None = None
    for rows in sizes:
        gen = create_sources(spark, rows)
        changes, next_id = [], rows
        for i, rate in enumerate(rates):
            t = time.perf_counter()
            next_id = change_cycle(spark, rows, rate, i + 1, next_id)
            changes.append(time.perf_counter() - t)
        print(f"| {rows:,} | {gen:.2f} | {rows / gen:,.0f} | " + " | ".join(f"{c:.2f}" for c in changes) + " |")
        last = (rows, gen, changes)
    if last is None:
        return
    rows, gen, changes = last
    for target in (10_000_000, 100_000_000):
        if target > rows:
            f = target / rows
            print(f"| {target:,} (extrapolated x{f:,.0f} from {rows:,}) | {gen * f:.0f} | | "
                  + " | ".join(f"{c * f:.0f}" for c in changes) + " |")



#: seconds each measured operation waits, untimed, after the machine's dirty pages are written back
SETTLE_S = 0.2


def settle() -> None:
    """Start the next measured operation on a quiet machine. What the one before it left behind, dirty pages of
    the files it wrote (up to 10M rows for a FULL or a CTAS) and the JVM's work after a large job (garbage
    collection, compiling), otherwise runs beside it on the two cores, and the square balances who follows
    whom only over whole rounds of four. Session 57's matrix, the 40 cells of at most 1% change, AUTO over
    DIFFERENTIAL doing the same refreshes, geometric means by the square's order: 0.98x where AUTO came right
    after DIFFERENTIAL, 1.12x where it came right after a CTAS and DIFFERENTIAL right after it, 1.03x and
    0.99x; in cells of 50-100 ms refreshes that spread decided medians of 12 (1M / 0.1% join: AUTO 1.25x)."""
    os.sync()
    time.sleep(SETTLE_S)


def warm_snapshot(spark: Any, table: str) -> None:
    """Build ``table``'s new snapshot state now, untimed, so that no measured refresh or CTAS pays it by its
    place in the order. Planning a scan lists the snapshot's files, which reconstructs its state (a Spark job
    of 0.3-0.9 s at 1-10M rows, kept for every later reader of that version); a ``count(*)`` would not: Delta
    answers it from the log's statistics."""
    spark.table(table).inputFiles()


def start(kind: str, prefix: str, conf: list[str]) -> tuple[Any, str, Path]:
    """A benchmark's Spark session over a fresh temporary warehouse (``--conf KEY=VALUE`` settings applied),
    the warehouse, and the JSON file its results go to (benchmarks/out/<prefix>-<time>.json)."""
    from pipeline import spark_session

    wh = tempfile.mkdtemp(prefix=f"trickle-{kind}-")
    spark = spark_session(app_name=f"trickle-{kind}", warehouse=wh, conf=dict(c.split("=", 1) for c in conf))
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    return spark, wh, out / f"{prefix}-{int(time.time())}.json"

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="same as --preset quick --cycles 3")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named matrix (overrides --sizes/--rates/--shapes)")
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--rates", default=",".join(map(str, ALL_RATES)))
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--cycles", type=int, default=2,
                   help="measured cycles per cell, after one warm-up cycle (even: see the order of refreshes)")
    p.add_argument("--cycles-small", type=int, default=None, metavar="N",
                   help=f"measured cycles of the cells changing at most {SMALL_RATE:.0%} of the rows or over at "
                        f"most {SMALL_ROWS:,} rows (default: --cycles; see SMALL_RATE, SMALL_ROWS)")
    p.add_argument("--no-check", action="store_true", help="skip the DIFFERENTIAL == AUTO == FULL check")
    p.add_argument("--gen-only", action="store_true",
                   help="only time data generation and one change per rate, extrapolated to 10M / 100M rows")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, e.g. trickle.streamTable.deletionVectors=true (repeatable)")
    p.add_argument("--tag", default="", help="label stored with the results (e.g. the settings tried)")
    args = p.parse_args(argv)
    if args.quick:
        args.preset, args.cycles = args.preset or "quick", 2
    for shape in (s for _, _, shapes in groups(args) for s in shapes):
        if shape not in SHAPES:
            p.error(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")

    from pipeline import StreamTables

    spark, wh, path = start("bench", "results", args.conf)
    results: list[dict[str, Any]] = []
    try:
        if args.gen_only:
            for sizes, rates, _ in groups(args):
                gen_only(spark, sizes, rates)
            return 0
        print(HEADER)
        print(ALIGN, flush=True)
        run_id = 0
        for sizes, rates, shapes in groups(args):
            for rows in sizes:
                run_id += 1
                gen = create_sources(spark, rows)
                log(f"[bench] {rows:,} fact rows generated in {gen:.1f} s ({rows / gen:,.0f} rows/s)")
                st = StreamTables(spark, root=f"{wh}/_trickle_{run_id}")
                t = time.perf_counter()
                names = {(s, k): f"{s}_{k}_{rows}_{run_id}" for s in shapes for k in MODES}
                for (shape, k), name in names.items():
                    st.create_stream_table(name, SHAPES[shape], refresh_mode=MODES[k])
                log(f"[bench] {len(names)} stream tables created and populated in {time.perf_counter() - t:.1f} s")
                next_id, cycle = rows, 0
                for rate in rates:
                    small = rate <= SMALL_RATE or rows <= SMALL_ROWS
                    cycles = args.cycles_small if args.cycles_small and small else args.cycles
                    per: dict[str, dict[str, list[float]]] = {s: {} for s in shapes}
                    text: dict[str, dict[str, list[str]]] = {s: {} for s in shapes}
                    ok = {s: True for s in shapes}
                    changes: list[float] = []
                    for i in range(cycles + 1):  # the first cycle warms up and is not measured
                        cycle += 1
                        t = time.perf_counter()
                        next_id = change_cycle(spark, rows, rate, cycle, next_id)
                        changes.append(time.perf_counter() - t)
                        warm_snapshot(spark, "bench_fact")
                        for shape in shapes:
                            # places rotate (compiled code and place, see the docstring)
                            order = ORDERS[(i - 1) % len(ORDERS)]
                            ctas = f"CREATE OR REPLACE TABLE bench_ctas_{shape} USING delta AS {SHAPES[shape]}"
                            got = {}
                            for k in order:
                                settle()
                                got[k] = (timed(spark, partial(spark.sql, ctas)) if k == "ctas"
                                          else refresh(st, names[(shape, k)]))
                            (d, d_cpu, made), (a, a_cpu, _), (f, f_cpu, _) = got["diff"], got["auto"], got["full"]
                            c, c_cpu = got["ctas"]
                            assert d.result.action == "DIFFERENTIAL", d.result
                            if i == 0:
                                continue
                            acc, txt = per[shape], text[shape]
                            for prefix, m, cpu in (("diff", d, d_cpu), ("auto", a, a_cpu), ("full", f, f_cpu),
                                                   ("ctas", c, c_cpu)):
                                record(acc, prefix, m, cpu)
                            acc.setdefault("diff_commits", []).append(float(made))
                            txt.setdefault("diff_apply", []).append(d.result.apply or "")
                            txt.setdefault("first", []).append(order[0])
                            for k, v in (("action", a.result.action), ("reason", a.result.reason),
                                         ("apply", a.result.apply or ""),
                                         ("change_ratio", str(getattr(a.result, "change_ratio", None)))):
                                txt.setdefault(f"auto_{k}", []).append(v)
                            if i == cycles and not args.no_check:
                                full = names[(shape, "full")]
                                ok[shape] = (same_rows(st, names[(shape, "diff")], full)
                                             and same_rows(st, names[(shape, "auto")], full))
                    for shape in shapes:
                        row = {"rows": rows, "rate": rate, "shape": shape, **summary(per[shape], text[shape]),
                               "same_rows": ok[shape], "cycles": cycles, "tag": args.tag,
                               "gen_s": gen, "change_s": statistics.median(changes[1:] or changes)}
                        results.append(row)
                        print(line(row), flush=True)
                        path.write_text(json.dumps(results, indent=1))
                    log(f"[bench] {rows:,} rows x {rate:.1%}: source MERGE median {statistics.median(changes):.1f} s")
    finally:
        if results:
            path.write_text(json.dumps(results, indent=1))
            log(f"[bench] results in {path}")
        spark.stop()
        shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
