"""Does a long run decay? 10,000 refreshes in one process, with spark-trickle's Delta housekeeping.

Issue 18, point 5: over a long run, NO_DATA latency, differential refresh time and files per stream table
must stay flat. Without housekeeping every refresh leaves a commit in the stream table's ``_delta_log`` and
small files in the table, and every source write does the same to the source.

The run: a Delta source ``orders`` (Change Data Feed on, 20,000 rows) and two AUTO stream tables over it,
an aggregate (``customer_totals``) and a filter (``big_orders``). Each round refreshes both tables; every
``--change-every``-th round first commits a small change to the source with delta-rs (an append of a few
rows, every fifth of them an update), so the refreshes are a mix of NO_DATA and small DIFFERENTIAL ones.
Every ``--maintain-every`` rounds :func:`pipeline.housekeeping.maintain` runs (stream tables and, as a user
who lets spark-trickle maintain them would, the source: ``trickle maintain --sources``), with retention 0
(nothing but the frontiers protects a file) so that its effect shows within the run.

Recorded per refresh: the table, the action, wall time, and, after it, the table's data files on disk
(data and change data), its live files, and the entries of its ``_delta_log``. The JSON goes to
``benchmarks/out/soak-<time>.json`` (rewritten every 1,000 refreshes, so a run cut short still has its
numbers); ``--report FILE`` prints the first-vs-last-10% table and writes the plot (``docs/soak.png``).
Nothing is asserted about timings; a refresh other than NO_DATA or DIFFERENTIAL is printed (AUTO may measure
a FULL once after a slow delta), and both tables must equal their queries at the end (the oracle).

    .venv/bin/python benchmarks/soak.py [--refreshes 10000] [--no-housekeeping]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OUT = Path(__file__).resolve().parent / "out"
DOCS = Path(__file__).resolve().parents[1] / "docs"
SOURCE_ROWS = 20_000
TABLES = {
    "customer_totals": "SELECT customer, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY customer",
    "big_orders": "SELECT id, customer, amount FROM orders WHERE amount >= 900",
}


def files_on_disk(path: str) -> int:
    n = 0
    for dirpath, _dirs, files in os.walk(path):
        if "_delta_log" not in dirpath:
            n += sum(1 for f in files if f.endswith(".parquet"))
    return n


def log_entries(path: str) -> int:
    return sum(1 for n in os.listdir(os.path.join(path, "_delta_log")) if not n.startswith("."))


def live_files(path: str) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(path).get_add_actions(flatten=True))


def change_source(path: str, round_no: int, next_id: int) -> int:
    """One small commit to the source with delta-rs: an append of 5 rows, or (every fifth change) an update
    of a few rows. Returns the next free id."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    if (round_no // max(1, ARGS.change_every)) % 5 == 4:
        DeltaTable(path).update(predicate=f"id % 997 = {round_no % 997}", updates={"amount": "amount + 1"})
        return next_id
    ids = list(range(next_id, next_id + 5))
    batch = pa.table({"id": pa.array(ids, pa.int32()),
                      "customer": pa.array([f"c{i % 50}" for i in ids], pa.string()),
                      "amount": pa.array([float(i % 1000) for i in ids], pa.float64())})
    write_deltalake(path, batch, mode="append")
    return next_id + 5


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline import StreamTables, housekeeping, spark_session

    warehouse = Path(tempfile.mkdtemp(prefix="trickle-soak-"))
    spark = spark_session(app_name="trickle-soak", warehouse=warehouse)
    started = time.time()
    out: dict[str, Any] = {"benchmark": "soak", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "refreshes": [], "maintenance": []}
    name = OUT / f"soak-{time.strftime('%Y%m%d-%H%M%S')}{'-nohk' if args.no_housekeeping else ''}.json"
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        spark.sql("CREATE TABLE orders (id INT NOT NULL, customer STRING NOT NULL, amount DOUBLE NOT NULL) "
                  "USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        spark.range(SOURCE_ROWS).selectExpr("CAST(id AS INT) AS id", "concat('c', CAST(id % 50 AS STRING)) AS customer",
                                            "CAST(id % 1000 AS DOUBLE) AS amount").write.format("delta").mode(
            "append").saveAsTable("orders")
        src = str(spark.sql("DESCRIBE DETAIL orders").first()["location"]).removeprefix("file:")
        st = StreamTables(spark)
        for t, q in TABLES.items():
            st.create_stream_table(t, q, schedule=None, refresh_mode="AUTO")
        paths = {t: st.catalog.get(t).path for t in TABLES}
        settings = housekeeping.Settings(checkpoint_every=args.checkpoint_every, compact_min_files=args.compact_min_files,
                                         retain_hours=0, log_retain_hours=0)
        next_id, i, round_no = SOURCE_ROWS, 0, 0
        while i < args.refreshes:
            changed = round_no % args.change_every == 0
            if changed:
                next_id = change_source(src, round_no, next_id)
            for t in TABLES:
                t0 = time.perf_counter()
                r = st.refresh_stream_table(t)
                wall = (time.perf_counter() - t0) * 1000
                if r.action not in ("NO_DATA", "DIFFERENTIAL"):  # e.g. AUTO measuring FULL after a slow delta
                    print(f"[soak] refresh {i} of {t}: {r.action} ({r.reason})", flush=True)
                out["refreshes"].append({"i": i, "round": round_no, "table": t, "action": r.action,
                                         "wall_ms": round(wall, 2), "apply": r.apply,
                                         "files": files_on_disk(paths[t]), "log": log_entries(paths[t]),
                                         "source_files": files_on_disk(src), "source_log": log_entries(src)})
                i += 1
            round_no += 1
            if not args.no_housekeeping and round_no % args.maintain_every == 0:
                t0 = time.perf_counter()
                reports = housekeeping.maintain(st, settings=settings, sources=True)
                out["maintenance"].append({"after": i, "ms": round((time.perf_counter() - t0) * 1000, 1),
                                           "reports": [r.as_json() for r in reports]})
                skipped = [s for r in reports for s in r.skipped]
                if skipped:
                    print(f"[soak] housekeeping skipped: {skipped}", flush=True)
            if round_no % 50 == 0:
                for t in TABLES:  # live files: a delta-rs log replay, sampled
                    out.setdefault("live_files", []).append({"i": i, "table": t, "live": live_files(paths[t])})
            if i % 500 < len(TABLES):
                recent = out["refreshes"][-500:]
                by = {a: [x["wall_ms"] for x in recent if x["action"] == a] for a in ("NO_DATA", "DIFFERENTIAL")}
                print(f"[soak] {i} refreshes, {time.time() - started:.0f} s: " + ", ".join(
                    f"{a} median {statistics.median(v):.1f} ms" for a, v in by.items() if v)
                    + f", files {[x['files'] for x in recent[-2:]]}, log {[x['log'] for x in recent[-2:]]}",
                    flush=True)
            if i % 1000 < len(TABLES):
                name.write_text(json.dumps(out))
        for t, q in TABLES.items():  # the oracle: each table equals its query
            got = Counter(tuple(r) for r in st.read(t).collect())
            want = Counter(tuple(r) for r in spark.sql(q).collect())
            assert got == want, f"{t} differs from its query"
        out["oracle"] = "equal"
        for t in TABLES:
            out.setdefault("live_files", []).append({"i": i, "table": t, "live": live_files(paths[t])})
    finally:
        out["seconds"] = round(time.time() - started, 1)
        name.write_text(json.dumps(out))
        print(f"[soak] wrote {name}", flush=True)
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)
    return out


# --- the report ---

def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def _p90(xs: list[float]) -> float | None:
    return round(sorted(xs)[int(0.9 * (len(xs) - 1))], 1) if xs else None


def summary(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """First and last 10% of the refreshes: NO_DATA and DIFFERENTIAL wall time (median, p90), files and
    ``_delta_log`` entries per stream table (mean, max)."""
    refs = doc["refreshes"]
    tenth = max(1, len(refs) // 10)
    out = {}
    for label, part in (("first 10%", refs[:tenth]), ("last 10%", refs[-tenth:])):
        nd = [r["wall_ms"] for r in part if r["action"] == "NO_DATA"]
        df = [r["wall_ms"] for r in part if r["action"] == "DIFFERENTIAL"]
        out[label] = {"refreshes": f"{part[0]['i']}-{part[-1]['i']}",
                      "NO_DATA median ms": _median(nd), "NO_DATA p90 ms": _p90(nd),
                      "DIFFERENTIAL median ms": _median(df), "DIFFERENTIAL p90 ms": _p90(df),
                      "files per stream table (mean)": round(statistics.mean(r["files"] for r in part), 1),
                      "files per stream table (max)": max(r["files"] for r in part),
                      "_delta_log entries (mean)": round(statistics.mean(r["log"] for r in part), 1),
                      "_delta_log entries (max)": max(r["log"] for r in part),
                      "source files (max)": max(r["source_files"] for r in part),
                      "source _delta_log entries (max)": max(r["source_log"] for r in part)}
    return out


def markdown(doc: dict[str, Any]) -> str:
    s = summary(doc)
    first, last = s["first 10%"], s["last 10%"]
    lines = ["| measure | first 10% | last 10% |", "|---|---:|---:|"]
    lines += [f"| {k} | {first[k]} | {last[k]} |" for k in first]
    return "\n".join(lines)


def plot(doc: dict[str, Any], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    refs = doc["refreshes"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for action, color in (("NO_DATA", "tab:blue"), ("DIFFERENTIAL", "tab:orange")):
        pts = [(r["i"], r["wall_ms"]) for r in refs if r["action"] == action]
        if pts:
            axes[0].scatter(*zip(*pts, strict=True), s=2, alpha=0.4, color=color, label=action)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("refresh wall time (ms)")
    axes[0].legend(loc="upper right", markerscale=5)
    for t in sorted({r["table"] for r in refs}):
        pts = [(r["i"], r["files"], r["log"]) for r in refs if r["table"] == t]
        xs, files, logs = zip(*pts, strict=True)
        axes[1].plot(xs, files, label=t, linewidth=0.8)
        axes[2].plot(xs, logs, label=t, linewidth=0.8)
    axes[1].set_ylabel("parquet files on disk")
    axes[2].set_ylabel("_delta_log entries")
    axes[2].set_xlabel("refresh")
    for ax in axes[1:]:
        ax.legend(loc="upper right")
    tenth = max(1, len(refs) // 10)
    for ax in axes:
        ax.axvspan(0, tenth, color="grey", alpha=0.1)
        ax.axvspan(len(refs) - tenth, len(refs), color="grey", alpha=0.1)
    hk = "with housekeeping" if not doc["settings"].get("no_housekeeping") else "without housekeeping"
    fig.suptitle(f"Soak: {len(refs)} refreshes of two stream tables in one process ({hk}); "
                 "shaded: first and last 10%")
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--refreshes", type=int, default=10_000)
    p.add_argument("--change-every", type=int, default=3, help="rounds between source commits")
    p.add_argument("--maintain-every", type=int, default=100, help="rounds between housekeeping runs")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--compact-min-files", type=int, default=16)
    p.add_argument("--no-housekeeping", action="store_true", help="the control run: no housekeeping at all")
    p.add_argument("--report", type=Path, help="only print the table and plot a finished run's JSON")
    p.add_argument("--plot", type=Path, default=DOCS / "soak.png")
    global ARGS
    ARGS = p.parse_args()
    doc = json.loads(ARGS.report.read_text()) if ARGS.report else run(ARGS)
    print(markdown(doc))
    try:
        plot(doc, ARGS.plot)
        print(f"[soak] plot: {ARGS.plot}")
    except ImportError:
        print("[soak] matplotlib missing (.venv/bin/pip install -e '.[bench]'): no plot")
    return 0


ARGS = argparse.Namespace(change_every=3)

if __name__ == "__main__":
    sys.exit(main())
