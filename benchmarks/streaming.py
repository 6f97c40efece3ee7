"""IMMEDIATE freshness and sustained change rate, and Spark's own streaming aggregation as a baseline.

    ./dev bench-streaming                      # rates 1000,5000,20000,50000 changes/s, 40 s each
    ./dev bench-streaming --rates 1000 --seconds 20

Freshness: a writer commits inserts to a Delta source once per ``--commit-every`` seconds at a target rate,
while an IMMEDIATE stream table (``SELECT region, SUM(amount), COUNT(*) ... GROUP BY region``) runs in the
same Spark application. Afterwards both Delta logs are read: for every source version, freshness = commit
time of the first stream table commit whose frontier covers it - commit time of the source version. A rate
is *sustained* when freshness does not grow over the run (last third's median <= 1.5 x first third's + 1 s)
and the backlog drains within 30 s after the writer stops.

Native baseline: the same insert-only aggregate as a Structured Streaming query (``groupBy`` in update
mode, ``foreachBatch`` MERGE of the changed groups into a Delta table), the way a user would write it
without us. Both digest the same backlog of commits; throughput = rows / seconds. The native query's
fixed cost (the same query over an empty backlog) is reported separately. Nothing here asserts a time.
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

QUERY = "SELECT region, SUM(amount) AS total, COUNT(*) AS n FROM {src} GROUP BY region"
PREFILL = 100_000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (a value that was observed)."""
    ordered = sorted(values)
    return ordered[max(1, -(-len(ordered) * q // 100)) - 1] if ordered else float("nan")


def create_source(spark: Any, name: str, rows: int) -> None:
    spark.sql(f"DROP TABLE IF EXISTS {name}")
    spark.sql(f"CREATE TABLE {name} (id BIGINT, region INT, amount DOUBLE) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    append(spark, name, 0, rows)


def append(spark: Any, name: str, start: int, n: int) -> None:
    """One commit of ``n`` inserts in one file (so a streaming reader sees one file per commit)."""
    if n <= 0:
        return
    spark.sql(f"INSERT INTO {name} SELECT id, CAST(id % 16 AS INT), CAST(id % 1000 AS DOUBLE) "
              f"FROM range({start}, {start + n}, 1, 1)")


def commit_times(log: Any) -> dict[int, float]:
    """Delta version -> commit time (seconds) from the commit's own ``commitInfo.timestamp``."""
    return {v: log.commit_info(v).get("timestamp", 0) / 1000.0 for v in log.versions()}


def freshness(spark: Any, st: Any, rate: int, seconds: float, every: float) -> dict[str, Any]:
    """Run an IMMEDIATE stream table under a steady insert load; return freshness figures."""
    from connectors.delta_log import DeltaLog

    src, name = f"imm_src_{rate}", f"imm_agg_{rate}"
    create_source(spark, src, PREFILL)
    st.create_stream_table(name, QUERY.format(src=src), refresh_mode="IMMEDIATE")
    src_log = DeltaLog(spark, st.catalog.get(name).sources[next(iter(st.catalog.get(name).sources))].path)
    first_version = src_log.latest_version() or 0
    st.start(name)
    per_commit = max(1, int(rate * every))
    next_id, n_commits = PREFILL, 0
    t_end = time.time() + seconds
    tick = time.time()
    while time.time() < t_end:
        append(spark, src, next_id, per_commit)
        next_id += per_commit
        n_commits += 1
        tick += every
        time.sleep(max(0.0, tick - time.time()))
    last = src_log.latest_version() or 0
    st_log = DeltaLog(spark, st.catalog.get(name).path)

    def covered() -> int:
        meta = st_log.last_trickle_commit()
        return max((int(v) for v in (meta[1].get("frontier") or {}).values()), default=-1) if meta else -1

    drain_start = time.time()
    while covered() < last and time.time() - drain_start < 60:
        time.sleep(0.2)
    drain = time.time() - drain_start
    st.stop(name)
    src_t = commit_times(src_log)
    applied: list[tuple[int, float]] = []  # (frontier version, commit time) of stream table commits
    for v in st_log.versions():
        meta = st_log.trickle_metadata(v)
        if meta and meta.get("frontier"):
            applied.append((max(int(x) for x in meta["frontier"].values()),
                            st_log.commit_info(v).get("timestamp", 0) / 1000.0))
    lags: list[float] = []
    for v in range(first_version + 1, last + 1):
        seen = [t for f, t in applied if f >= v]
        if seen and v in src_t:
            lags.append(min(seen) - src_t[v])
    third = max(1, len(lags) // 3)
    early, late = statistics.median(lags[:third]), statistics.median(lags[-third:])
    refreshes = sum(1 for f, _ in applied if f > first_version)
    return {
        "rate": rate, "seconds": seconds, "commits": n_commits, "rows_per_commit": per_commit,
        "p50_s": statistics.median(lags), "p99_s": percentile(lags, 99), "max_s": max(lags),
        "first_third_p50_s": early, "last_third_p50_s": late, "drain_s": drain,
        "refreshes": refreshes, "commits_per_refresh": len(lags) / max(1, refreshes),
        "sustained": late <= 1.5 * early + 1.0 and drain < 30 and covered() >= last,
    }


def native_backlog(spark: Any, src: str, target: str, start_version: int | None, ckpt: str) -> float:
    """Digest the source's versions after ``start_version`` (None: none) with Spark's own streaming
    aggregation."""
    spark.sql(f"CREATE TABLE IF NOT EXISTS {target} (region INT, total DOUBLE, n BIGINT) USING delta")

    def upsert(batch: Any, batch_id: int) -> None:
        batch.createOrReplaceTempView("native_batch")
        batch.sparkSession.sql(f"""
            MERGE INTO {target} t USING native_batch s ON t.region = s.region
            WHEN MATCHED THEN UPDATE SET total = s.total, n = s.n
            WHEN NOT MATCHED THEN INSERT (region, total, n) VALUES (s.region, s.total, s.n)""")

    t = time.perf_counter()
    q = (spark.readStream.format("delta").option("startingVersion", "latest" if start_version is None else str(start_version + 1)).table(src)
         .groupBy("region").agg({"amount": "sum", "*": "count"})
         .withColumnRenamed("sum(amount)", "total").withColumnRenamed("count(1)", "n")
         .writeStream.outputMode("update").foreachBatch(upsert)
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination()
    return time.perf_counter() - t


def throughput(spark: Any, st: Any, commits: int, rows: int, wh: str, tag: str = "tp",
               rounds: int = 3) -> dict[str, Any]:
    """Same insert-only backlog, digested by a DIFFERENTIAL refresh and by the native streaming query.

    The source starts empty, so both start from nothing: the native query's state and our stream table
    cover exactly the backlog, and their results must be equal. ``rounds`` rounds, each a new backlog of
    ``commits`` x ``rows`` digested by both (the native query resumes from its checkpoint); who goes first
    alternates, since the second of two queries over the same fresh files finds them in the OS cache and
    its code compiled; medians are reported."""
    from connectors.delta_log import DeltaLog

    src, agg, nat = f"{tag}_src", f"{tag}_agg", f"{tag}_native"
    create_source(spark, src, 0)
    st.create_stream_table(agg, QUERY.format(src=src), refresh_mode="DIFFERENTIAL")
    d = st.catalog.get(agg)
    v0 = DeltaLog(spark, d.sources[next(iter(d.sources))].path).latest_version() or 0
    next_id = 0
    ours_s: list[float] = []
    native_s: list[float] = []

    def ours() -> None:
        t = time.perf_counter()
        r = st.refresh_stream_table(agg)
        ours_s.append(time.perf_counter() - t)
        assert r.action == "DIFFERENTIAL", r

    def native() -> None:
        native_s.append(native_backlog(spark, src, nat, v0, f"{wh}/ckpt_{nat}"))

    for i in range(rounds):
        for _ in range(commits):
            append(spark, src, next_id, rows)
            next_id += rows
        for run in ((ours, native) if i % 2 == 0 else (native, ours)):
            run()
    # the native query's fixed cost: the same query again, over an empty backlog (JVM already warm)
    startup = native_backlog(spark, src, f"{nat}_empty", None, f"{wh}/ckpt_{nat}_empty")
    a = {r["region"]: (round(r["total"], 3), r["n"]) for r in st.read(agg).collect()}
    b = {r["region"]: (round(r["total"], 3), r["n"]) for r in spark.table(nat).collect()}
    total = commits * rows
    o, n = statistics.median(ours_s), statistics.median(native_s)
    return {"commits": commits, "rows_per_commit": rows, "rounds": rounds, "ours_s": o, "native_s": n,
            "ours_each_s": ours_s, "native_each_s": native_s, "native_startup_s": startup,
            "ours_rows_per_s": total / o, "native_rows_per_s": total / n, "same_result": a == b}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1000,5000,20000,50000", help="changes per second to try")
    p.add_argument("--seconds", type=float, default=40.0, help="writer run time per rate")
    p.add_argument("--commit-every", type=float, default=1.0, help="seconds between source commits")
    p.add_argument("--backlog", default="10x100000", help="COMMITSxROWS for the throughput comparison")
    p.add_argument("--rounds", type=int, default=3, help="backlogs digested by both, median reported")
    args = p.parse_args(argv)
    from pipeline import StreamTables, spark_session

    wh = tempfile.mkdtemp(prefix="trickle-bench-stream-")
    spark = spark_session(app_name="trickle-bench-streaming", warehouse=wh)
    out: dict[str, Any] = {"freshness": [], "throughput": None}
    try:
        st = StreamTables(spark, root=f"{wh}/_trickle")
        commits, rows = (int(x) for x in args.backlog.split("x"))
        throughput(spark, st, 2, 1000, wh, tag="warmup", rounds=1)  # JIT-compile both paths before measuring
        tp = throughput(spark, st, commits, rows, wh, rounds=args.rounds)
        out["throughput"] = tp
        each = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(tp["ours_each_s"], tp["native_each_s"], strict=True))
        print(f"backlog {commits} commits x {rows:,} inserts, median of {tp['rounds']} rounds (ours/native: "
              f"{each}): ours {tp['ours_s']:.2f} s "
              f"({tp['ours_rows_per_s']:,.0f} rows/s), native streaming {tp['native_s']:.2f} s "
              f"({tp['native_rows_per_s']:,.0f} rows/s; over an empty backlog {tp['native_startup_s']:.2f} s), "
              f"same result: {tp['same_result']}", flush=True)
        print("| changes/s | commits | p50 s | p99 s | max s | first third p50 | last third p50 | "
              "commits per refresh | drain s | sustained |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for rate in (int(r) for r in args.rates.split(",") if r):
            f = freshness(spark, st, rate, args.seconds, args.commit_every)
            out["freshness"].append(f)
            print(f"| {rate:,} | {f['commits']} | {f['p50_s']:.2f} | {f['p99_s']:.2f} | {f['max_s']:.2f} | "
                  f"{f['first_third_p50_s']:.2f} | {f['last_third_p50_s']:.2f} | {f['commits_per_refresh']:.1f} | "
                  f"{f['drain_s']:.1f} | {f['sustained']} |", flush=True)
    finally:
        d = Path(__file__).resolve().parent / "out"
        d.mkdir(exist_ok=True)
        (d / f"streaming-{int(time.time())}.json").write_text(json.dumps(out, indent=1))
        for q in spark.streams.active:
            q.stop()
        spark.stop()
        shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
