"""The floor of a small differential refresh, beside the delta job alone, measured in one run.

    ./dev bench floor                          # 1M-row sources, 100 changed rows, 11 measured refreshes
    ./dev bench floor --rows 100000 --refreshes 3 --shapes aggregate,join_agg

Issue 16's floor target: a DIFFERENTIAL refresh of up to 100 changed rows over 1M-row sources (filter,
aggregate, join_agg), warm, costs a median <= 0.5 s and at most 1.2x *the delta job alone*, with at most 3
Spark jobs for an aggregate. "The delta job alone" is the part no refresh can skip: computing the
differentiated query over the window and handing its rows to the driver. Everything else a refresh does
(reading logs, deciding, the commit, the history) is the overhead the ratio measures.

Each round changes the fact table with ONE MERGE of ``--changed`` rows (70% updates incl. join-key updates,
15% deletes, 15% inserts; the matrix's ``change_cycle``). Rounds alternate:

* *delta rounds* measure the delta job alone, per shape: the delta of exactly the window the next refresh
  will apply, computed by the refresher's own code (``Refresher._differential``: held target, context,
  delta SQL, fixpoints, ``delta_sink.collect``, the apply strategy) and stopped by its ``before_commit``
  hook right before the commit (the stream table's version is checked not to move). Reported in two
  parts: the *delta job* (from ``fixpoints.evaluated``, where held reads and the netted delta of a
  plain-rows table are planned, to the end of ``delta_sink.collect``: analysing and planning, the Spark
  job(s), the Arrow transfer) and *prep*, the rest of the refresh's work before its commit (log reads,
  the held target, rendering the SQL, choosing the strategy). The stream table is then refreshed to move
  on; that refresh is the second reader of its window and is reported apart ("2nd refresh s");
* *refresh rounds* measure the real refresh (``refresh_stream_table``); its action is counted (a refresh
  that is not DIFFERENTIAL shows in the table and on stderr).

Why alternate: the first computation of a delta over a new window costs more than a second one over the
same window (measured at 100K rows: 0.3-0.6 s more, in jobs and on the driver; the second finds the first
one's generated code compiled, in Spark's code generation cache), and a real refresh is always the first.
Measuring the delta and the refresh in separate rounds makes both first readers of a window of the same
size. ``--warmup`` pairs of rounds run first and are not measured.

A refresh returns before its history record and state are written (a background thread writes them,
:mod:`pipeline.bookkeeping`); the benchmark waits for them after each refresh, outside its wall time and inside
its CPU-seconds, so they never run beside the next shape's refresh (the delta-alone rounds commit nothing, so
nothing runs beside them either).

After each source change, and before anything of the round is measured, the machine writes the change's dirty
pages out (``os.sync``, as the matrix's ``settle`` does; ``--no-sync`` turns it off). Why: the Spark MERGE
rewrites tens of MB of the 1M-row source's files, and their write-back then ran beside the refresh's own
file creates. Session 60, filter, 31 refreshes, the median of each step of the commit over the first and last
quarter of the run: without it the data file 0.85 -> 1.32 ms, the vectors 0.70 -> 0.94, the change data
0.50 -> 0.64, the log entry 0.22 -> 0.32, the whole overhead 6.6 -> 7.8 ms; with it 0.72 -> 0.79, 0.50 -> 0.56,
0.37 -> 0.40, 0.16 -> 0.18 and 6.0 -> 6.3 ms. The refresh's own files are not synced: their cost stays measured.

Per shape: medians of the refresh's wall time, of its own delta job inside it ("its delta s", timed by the
same wrappers without stopping it: the rest is the commit and the bookkeeping; "refresh/its delta" is the
median of each refresh's time over the delta inside it, both sides under the same refresh's conditions), Spark
jobs, commits (stream
table versions made), driver time, time in jobs, CPU-seconds (Python + driver JVM, executors included in
local mode) and the commit path (``RefreshResult.apply``). A Markdown table on stdout, progress on stderr, JSON in benchmarks/out/floor-*.json.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics import Measured, cpu_seconds, measure  # noqa: E402
from run import SHAPES, change_cycle, commits, create_sources, log, start, timed  # noqa: E402

#: the issue's floor shapes first, then the bag shapes it measures beside them
FLOOR_SHAPES = ["filter", "aggregate", "join_agg", "scan", "join"]
TARGET_SHAPES = {"filter", "aggregate", "join_agg"}
TARGET_S, TARGET_RATIO, TARGET_AGG_JOBS = 0.5, 1.2, 3

HEADER = ("| shape | refresh s | its delta s | delta job s | refresh/delta | refresh/its delta | prep s | 2nd refresh s "
          "| refresh jobs "
          "| delta jobs "
          "| commits | driver s | in jobs s | refresh CPU s | delta CPU s | delta rows | DIFFERENTIAL | commit path "
          "| <= 0.5 s | <= 1.2x | jobs |")
ALIGN = "|---|" + "---:|" * 15 + "---|---|---|---|---|"


@dataclass(frozen=True)
class DeltaAlone:
    """One delta computed and collected without a commit."""

    prep_s: float  # the rest of the refresh's work before the commit: frontiers, windows, held target, SQL, strategy
    prep_cpu: float
    delta_s: float  # the delta job: planning its held reads and query, its Spark job(s), Arrow to the driver
    delta_cpu: float
    job: Measured  # the delta_sink.collect call alone (jobs, time in jobs, rows read)
    rows: int
    would_apply: str  # the strategy the refresh would have committed with (``RefreshResult.apply``)


class _Stop(Exception):
    """Raised by the refresher's ``before_commit`` hook: the delta is computed, nothing gets committed."""


@contextmanager
def probe(st: Any, stop: bool) -> Iterator[dict[str, Any]]:
    """Time the delta job inside the refresher's own code: from entering ``fixpoints.evaluated`` (held reads
    and the netted delta of a plain-rows table are planned there) to the return of ``delta_sink.collect``.
    Both module functions are wrapped while the block runs (the refresher looks them up at call time);
    ``stop``: the refresher's ``before_commit`` hook raises :class:`_Stop` and Spark's collect call is
    measured (jobs, time in jobs, rows read) -- the delta alone; otherwise only timestamps are taken, so the
    refresh's own measurement keeps its jobs. DuckDB's delta (``local_engine.collect``) is only stamped, in
    both modes: wrapping it in its own job group (a py4j call right before it, and the status store read
    after) made the delta alone 3-8 ms slower than the same delta inside a refresh (session 51: 47 / 28 / 39
    ms against 39 / 24 / 34 for filter / aggregate / join_agg), which flattered the ratio; its Spark jobs
    (none) are counted by :func:`delta_alone` over the whole stopped refresh, as the refresh's are. Yields
    the timings: ``enter`` / ``left`` as (wall, CPU), ``job`` and ``local``."""
    from connectors import delta_sink
    from pipeline import fixpoints, local_engine

    r, spark = st.refresher, st.spark
    timing: dict[str, Any] = {}
    real_collect, real_evaluated, real_hook = delta_sink.collect, fixpoints.evaluated, r.before_commit
    real_local = local_engine.collect

    @contextmanager
    def evaluated(*args: Any, **kwargs: Any) -> Iterator[Any]:
        timing["enter"] = (time.perf_counter(), cpu_seconds(spark))
        with real_evaluated(*args, **kwargs) as bind:
            yield bind

    def stamped(fn: Any, *args: Any, **kwargs: Any) -> Any:
        # the stamps are taken around the call itself: when stopping, :func:`timed`'s own work (a job group
        # set and cleared, the listener bus waited for, the status store read: 1-4 ms over py4j) is not the
        # delta job's, and counting it made the delta alone look slower than the same delta inside a refresh
        timing.setdefault("enter", (time.perf_counter(), cpu_seconds(spark)))
        out = fn(*args, **kwargs)
        timing["left"] = (time.perf_counter(), cpu_seconds(spark))
        timing["rows"] = out.num_rows
        return out

    def collect(*args: Any, **kwargs: Any) -> Any:
        if stop:
            timing["job"], _ = timed(spark, partial(stamped, real_collect, *args, **kwargs))
            return timing["job"].result
        return stamped(real_collect, *args, **kwargs)

    def local(*args: Any, **kwargs: Any) -> Any:  # the delta computed by DuckDB on the driver: no Spark job
        timing.pop("enter", None)  # the local engine's delta starts here, not at fixpoints.evaluated
        out = stamped(real_local, *args, **kwargs)
        if stop:  # its Spark jobs (none expected) are counted over the whole stopped refresh, see delta_alone
            timing["job"], timing["local"] = Measured(out, timing["left"][0] - timing["enter"][0], 0, 0.0, 0), True
        return out

    def halt(_name: str) -> None:
        raise _Stop

    delta_sink.collect, fixpoints.evaluated, local_engine.collect = collect, evaluated, local
    if stop:
        r.before_commit = halt
    try:
        yield timing
    finally:
        delta_sink.collect, fixpoints.evaluated, r.before_commit = real_collect, real_evaluated, real_hook
        local_engine.collect = real_local


def span(timing: dict[str, Any]) -> tuple[float, float]:
    """(wall, CPU) seconds of the delta job a :func:`probe` saw; (0, 0) when none ran (nothing to collect)."""
    if "left" not in timing:
        return 0.0, 0.0
    return timing["left"][0] - timing["enter"][0], timing["left"][1] - timing["enter"][1]


def delta_alone(st: Any, name: str) -> DeltaAlone:
    """The delta the next refresh of ``name`` would apply, computed and collected by the refresher's own
    code, stopped right before the commit: the frontiers are read as ``Refresher._refresh`` reads them, then
    ``Refresher._differential`` runs (held target, context, delta SQL, fixpoints, ``delta_sink.collect``, the
    apply strategy) under :func:`probe` with its ``before_commit`` hook raising, so nothing is committed.
    Running the refresher's code instead of a copy keeps this measuring what a refresh does while the engine
    changes."""
    r, spark = st.refresher, st.spark
    c0, t0 = cpu_seconds(spark), time.perf_counter()
    d = st.catalog.get(name)
    committed = r._committed(d)  # noqa: SLF001 - the refresher's own steps, see the docstring
    pre = committed.frontier
    assert pre is not None, f"{name} was never populated"
    post, _ = r.latest_frontier(d, {}, pre)
    windows = r.windows(d, pre, post)
    record: dict[str, Any] = {"refresh_id": uuid.uuid4().hex[:16], "frontier": post, "action": "DIFFERENTIAL",
                              "name": d.name, "base_frontier": r.base_frontier(d, post),
                              "source_ids": {k: w.meta.id for k, w in windows.items() if w.meta is not None}}

    def stopped() -> None:
        try:
            r._differential(d, pre, post, windows, record, committed.version)  # noqa: SLF001
        except _Stop:
            pass

    with probe(st, stop=True) as timing:
        whole = measure(spark, stopped)
    total_s, total_cpu = time.perf_counter() - t0, cpu_seconds(spark) - c0
    job: Measured | None = timing.get("job")
    if job is None:
        raise RuntimeError(f"{name}: the refresh would not collect its delta ({record.get('apply')}), so there is "
                           "no delta job alone to measure; lower the change or raise trickle.apply.collectBelowBytes")
    if timing.get("local"):  # DuckDB's delta: the Spark jobs of the whole stopped refresh (none expected)
        job = Measured(job.result, job.wall_s, whole.jobs, whole.job_s, whole.rows_read)
    delta_s, delta_cpu = span(timing)
    return DeltaAlone(total_s - delta_s, total_cpu - delta_cpu, delta_s, delta_cpu, job, job.result.num_rows,
                      str(record.get("apply") or ""))


def summarise(shape: str, rows: int, refreshes: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one shape's measured refreshes and deltas, their ratio and the targets."""
    def medians(samples: list[dict[str, Any]]) -> dict[str, float]:
        return {k: statistics.median(s[k] for s in samples) for k, v in samples[0].items()
                if isinstance(v, float | int)}

    med = {**medians(refreshes), **medians(deltas)}
    paths = Counter(s["apply"].split(":", 1)[0] if s["apply"] else "-" for s in refreshes)
    out: dict[str, Any] = {"shape": shape, "rows": rows, "refreshes": len(refreshes), **med,
                           "ratio": med["refresh_s"] / med["delta_s"] if med["delta_s"] > 0 else None,
                           # each refresh against the delta inside it, then the median: the same refresh's
                           # conditions on both sides (the verdict stays on the delta alone, as issue 16 asks)
                           "ratio_own": statistics.median(r["refresh_s"] / r["own_delta_s"] for r in refreshes)
                           if all(r.get("own_delta_s") for r in refreshes) else None,
                           "ratio_with_prep": (med["refresh_s"] / (med["delta_s"] + med["prep_s"])
                                               if med["delta_s"] + med["prep_s"] > 0 else None),
                           "commit_paths": dict(paths), "apply": refreshes[-1]["apply"],
                           "actions": dict(Counter(s["action"] for s in refreshes)),
                           "target_shape": shape in TARGET_SHAPES}
    out["floor_met"] = med["refresh_s"] <= TARGET_S
    out["ratio_met"] = out["ratio"] is not None and out["ratio"] <= TARGET_RATIO
    out["jobs_met"] = med["refresh_jobs"] <= TARGET_AGG_JOBS if shape == "aggregate" else None
    return out


def markdown_row(s: dict[str, Any]) -> str:
    """One shape's line of the floor table (report.py prints the same table from the JSON)."""
    def yes(v: bool | None) -> str:
        return "-" if v is None else ("met" if v else "missed")

    ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}x"
    paths = ", ".join(f"{p} x{n}" if len(s["commit_paths"]) > 1 else p for p, n in s["commit_paths"].items())
    jobs = yes(s["jobs_met"]) + (" (<= 3)" if s["jobs_met"] is not None else "")
    diff = f"{s['actions'].get('DIFFERENTIAL', 0)}/{s['refreshes']}"
    own = "-" if s.get("own_delta_s") is None else f"{s['own_delta_s']:.3f}"
    own_ratio = "-" if s.get("ratio_own") is None else f"{s['ratio_own']:.2f}x"
    return (f"| {s['shape']} | {s['refresh_s']:.3f} | {own} | {s['delta_s']:.3f} | {ratio} | {own_ratio} | "
            f"{s['prep_s']:.3f} | "
            f"{s['second_refresh_s']:.3f} | {s['refresh_jobs']:.0f} | {s['delta_jobs']:.0f} | {s['commits']:.0f} | "
            f"{s['refresh_driver_s']:.3f} | {s['refresh_job_s']:.3f} | {s['refresh_cpu']:.2f} | {s['delta_cpu']:.2f} | "
            f"{s['delta_rows']:.0f} | {diff} | {paths} | {yes(s['floor_met'])} | {yes(s['ratio_met'])} | {jobs} |")


def markdown(summaries: list[dict[str, Any]]) -> str:
    return "\n".join([HEADER, ALIGN, *map(markdown_row, summaries)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="fact table rows (the dimension has 1000)")
    p.add_argument("--changed", type=int, default=100, help="rows the source MERGE changes per round")
    p.add_argument("--refreshes", type=int, default=11,
                   help="measured refreshes per shape (7 until session 46: its medians moved by several ms "
                        "between runs, on a ratio whose margin is a few ms)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured pairs of rounds first (JIT, caches)")
    p.add_argument("--shapes", default=",".join(FLOOR_SHAPES))
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    p.add_argument("--no-sync", action="store_true",
                   help="do not write the source change's dirty pages out before each round (see the docstring)")
    p.add_argument("--tag", default="", help="label stored with the results")
    args = p.parse_args(argv)
    shapes = args.shapes.split(",")
    for shape in shapes:
        if shape not in SHAPES:
            p.error(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")

    from pipeline import StreamTables

    spark, wh, path = start("floor", "floor", args.conf)
    try:
        gen = create_sources(spark, args.rows)
        log(f"[floor] {args.rows:,} fact rows generated in {gen:.1f} s")
        st = StreamTables(spark, root=f"{wh}/_trickle")
        names = {s: f"floor_{s}" for s in shapes}
        for shape, name in names.items():
            st.create_stream_table(name, SHAPES[shape], refresh_mode="DIFFERENTIAL")
        rate = args.changed / args.rows
        refreshes: dict[str, list[dict[str, Any]]] = {s: [] for s in shapes}
        deltas: dict[str, list[dict[str, Any]]] = {s: [] for s in shapes}
        next_id, rounds = args.rows, 2 * (args.warmup + args.refreshes)
        for i in range(rounds):
            # even rounds measure the delta alone, odd rounds the refresh: each the FIRST reader of its window
            # (a second computation over the same window reuses compiled code, see the docstring)
            delta_round, measured = i % 2 == 0, i >= 2 * args.warmup
            next_id = change_cycle(spark, args.rows, rate, i + 1, next_id)
            if not args.no_sync:
                os.sync()  # the source MERGE's dirty pages written out before, not beside, what is measured
            for shape, name in names.items():
                before = commits(st, name)
                if delta_round:
                    alone = delta_alone(st, name)
                    if commits(st, name) != before:  # e.g. a one-time protocol upgrade before a commit
                        log(f"[floor] {name}: the table moved from version {before} to {commits(st, name)} while "
                            "its delta alone was computed (nothing of the delta is committed there)")
                        before = commits(st, name)
                with probe(st, stop=False) as inside:
                    ref, ref_cpu = timed(spark, partial(st.refresh_stream_table, name), after=st.catalog.settle)
                own_s, own_cpu = span(inside)
                res = ref.result
                if res.action != "DIFFERENTIAL":
                    log(f"[floor] {name}: refresh in round {i + 1} was {res.action} ({res.reason})")
                if not measured:
                    continue
                if delta_round:
                    deltas[shape].append({
                        "delta_s": alone.delta_s, "delta_jobs": alone.job.jobs, "delta_job_s": alone.job.job_s,
                        "delta_cpu": alone.delta_cpu, "delta_rows_read": alone.job.rows_read, "delta_rows": alone.rows,
                        "collect_s": alone.job.wall_s,
                        "prep_s": alone.prep_s, "prep_cpu": alone.prep_cpu, "would_apply": alone.would_apply,
                        "second_refresh_s": ref.wall_s, "second_refresh_jobs": ref.jobs})
                    continue
                refreshes[shape].append({
                    "refresh_s": ref.wall_s, "refresh_jobs": ref.jobs, "refresh_job_s": ref.job_s,
                    "refresh_driver_s": ref.driver_s, "refresh_cpu": ref_cpu, "refresh_rows_read": ref.rows_read,
                    "own_delta_s": own_s, "own_delta_cpu": own_cpu, "rest_s": ref.wall_s - own_s,
                    "commits": (commits(st, name) or 0) - (before or 0),
                    "action": res.action, "reason": res.reason, "apply": res.apply or "",
                    "rows_changed": res.rows_inserted + res.rows_updated + res.rows_deleted})
            log(f"[floor] round {i + 1}/{rounds}: " + ("delta alone" if delta_round else "refresh")
                + ("" if measured else " (warm-up)"))
        samples = {s: {"refreshes": refreshes[s], "deltas": deltas[s]} for s in shapes}
        summaries = [summarise(s, args.rows, refreshes[s], deltas[s]) for s in shapes]
        print(f"Floor: {args.rows:,}-row fact table, {args.changed} changed rows per refresh (one MERGE), "
              f"median of {args.refreshes} warm refreshes; targets (issue 16, filter / aggregate / join_agg): "
              f"median <= {TARGET_S} s, <= {TARGET_RATIO}x the delta job alone, aggregate <= {TARGET_AGG_JOBS} "
              "jobs\n")
        print(markdown(summaries))
        path.write_text(json.dumps({"rows": args.rows, "changed": args.changed, "refreshes": args.refreshes,
                                    "warmup": args.warmup, "tag": args.tag, "gen_s": gen, "conf": args.conf,
                                    "shapes": summaries, "samples": samples}, indent=1))
        log(f"[floor] results in {path}")
    finally:
        spark.stop()
        shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
