"""Deletions from a large plain-rows stream table, three commit paths side by side in one run: delta-rs' MERGE
(rewrites the files it touches), Spark's MERGE with deletion vectors, and spark-trickle's own commit with
deletion vectors (connectors/deletion_vectors.py: the rows marked, nothing rewritten).

    ./dev bench commit-paths [--rows 10000000] [--changed 100] [--rounds 4]

Two stream tables of the ``scan`` shape over the same fact table; each round one source MERGE of
``--changed`` rows (70% updates, 15% deletes, 15% inserts, see run.change_cycle), then each refreshes, with
``trickle.apply.deletionVectorsAboveRows`` and ``trickle.apply.vectorsAboveRows`` switched between them so
each commits its own way. The order rotates per round (a later refresh of a window finds the first one's
compiled code). Medians after one warm-up round; the tables are checked to hold the same rows at the end.
This is what the two settings' defaults rest on. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import SHAPES, change_cycle, create_sources, log, start  # noqa: E402

DV_ABOVE = "trickle.apply.deletionVectorsAboveRows"
VECTORS_ABOVE = "trickle.apply.vectorsAboveRows"
#: each path's settings: (deletionVectorsAboveRows, vectorsAboveRows)
PATHS = {"delta-rs MERGE": (str(10**15), "-1"), "Spark MERGE with deletion vectors": ("0", "-1"),
         "own commit with deletion vectors": (str(10**15), "0")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="fact table rows")
    p.add_argument("--changed", type=int, default=100, help="rows the source MERGE changes per round")
    p.add_argument("--rounds", type=int, default=4, help="measured rounds (after one warm-up round)")
    args = p.parse_args(argv)

    from pipeline import StreamTables

    spark, wh, _ = start("commit-paths", "commit-paths", [])
    try:
        create_sources(spark, args.rows)
        st = StreamTables(spark, root=f"{wh}/_trickle")
        paths = PATHS
        names = {k: f"scan_{i}" for i, k in enumerate(paths)}
        for name in names.values():
            st.create_stream_table(name, SHAPES["scan"], refresh_mode="DIFFERENTIAL")
        times: dict[str, list[float]] = {k: [] for k in paths}
        next_id = args.rows
        for i in range(args.rounds + 1):
            next_id = change_cycle(spark, args.rows, args.changed / args.rows, i + 1, next_id)
            order = list(paths)
            for k in order[i % len(order):] + order[:i % len(order)]:
                spark.conf.set(DV_ABOVE, paths[k][0])
                spark.conf.set(VECTORS_ABOVE, paths[k][1])
                t0 = time.perf_counter()
                r = st.refresh_stream_table(names[k])
                took = time.perf_counter() - t0
                log(f"[commit-paths] round {i} {k}: {took:.2f} s, {r.action}, {r.apply}")
                if i:
                    times[k].append(took)
        spark.conf.unset(DV_ABOVE)
        spark.conf.unset(VECTORS_ABOVE)
        cols = ["id", "region", "dim_id", "amount"]
        first, *others = [st.read(n).select(*cols) for n in names.values()]
        # compared as multisets in Spark (collecting 10M rows per table to Python took minutes and 7 GB)
        same = [0] + [first.exceptAll(o).count() + o.exceptAll(first).count() for o in others]
        print(f"{args.rows:,} stored rows, {args.changed} changed rows per round, median of {args.rounds}:")
        for k, v in times.items():
            print(f"  {k}: {statistics.median(v):.2f} s")
        alike = not any(same)
        print(f"  same rows: {'yes' if alike else 'NO'}")
        return 0 if alike else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
