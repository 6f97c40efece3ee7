"""Turn matrix results (benchmarks/out/results-*.json) into Markdown tables and a speedup plot.

    ./dev bench report [results.json ...] [--png docs/benchmark_speedup.png]

Without arguments it merges every results file in benchmarks/out/ (a later file wins for the same cell),
so the matrix can be measured in several runs (e.g. the 10M-row cells separately). The plot has one panel
per query shape: FULL/DIFFERENTIAL speedup against change rate, one line per source size, log-log.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"


def load(paths: list[Path], tag: str = "") -> list[dict[str, Any]]:
    """Cells of the runs labelled ``tag`` (``--tag`` of run.py; "" = default settings)."""
    cells: dict[tuple[int, float, str], dict[str, Any]] = {}
    for p in sorted(paths, key=lambda p: p.stat().st_mtime):
        for row in json.loads(p.read_text()):
            if "diff_driver_s" in row and row.get("tag", "") == tag:  # older files lack the breakdown
                cells[(row["rows"], row["rate"], row["shape"])] = row
    return [cells[k] for k in sorted(cells)]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        lines += [f"### {shape}", "",
                  "| rows | change | DIFF s | FULL s | CTAS s | FULL/DIFF | CTAS/DIFF | DIFF jobs | DIFF commits "
                  "| DIFF in jobs s | DIFF driver s | DIFF rows read | FULL rows read | same rows |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in (r for r in rows if r["shape"] == shape):
            lines.append(
                f"| {r['rows']:,} | {r['rate']:.1%} | {r['diff_s']:.2f} | {r['full_s']:.2f} | {r['ctas_s']:.2f} | "
                f"{r['speedup']:.1f}x | {r['ctas_speedup']:.1f}x | {r['diff_jobs']:.0f} | {r['diff_commits']:.0f} | "
                f"{r['diff_job_s']:.2f} | {r['diff_driver_s']:.2f} | {r['diff_rows_read']:,.0f} | "
                f"{r['full_rows_read']:,.0f} | {'yes' if r['same_rows'] else 'NO'} |")
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.4 * len(shapes), 3.4), sharey=True, squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for size in sorted({r["rows"] for r in rows if r["shape"] == shape}):
            pts = sorted((r["rate"] * 100, r["speedup"]) for r in rows if r["shape"] == shape and r["rows"] == size)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{size:,} rows")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(shape)
        ax.set_xlabel("change rate per cycle (%)")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("FULL / DIFFERENTIAL refresh time")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", type=Path)
    p.add_argument("--tag", default="", help="only runs with this --tag (default: untagged runs)")
    p.add_argument("--png", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "benchmark_speedup.png")
    args = p.parse_args(argv)
    paths = args.results or sorted(OUT.glob("results-*.json"))
    if not paths:
        print("no results: run ./dev bench first", file=sys.stderr)
        return 1
    rows = load(paths, args.tag)
    if not rows:
        print(f"no results with tag {args.tag!r}", file=sys.stderr)
        return 1
    print(markdown(rows))
    plot(rows, args.png)
    print(f"plot written to {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
