"""Turn benchmark results (benchmarks/out/*.json) into Markdown tables and the speedup plot.

    ./dev bench report [results.json ...] [--png docs/benchmark_speedup.png] [--tag T]
    ./dev bench report --freshness [kafka-freshness-*.json] [--png docs/kafka_freshness.png]

Without arguments it merges every matrix results file in benchmarks/out/ (``results-*.json``; a later file
wins for the same cell), so the matrix can be measured in several runs (e.g. the 10M- and 100M-row cells
separately), and prints the newest floor run (``floor-*.json``, from ``./dev bench floor``) after it.

Per shape one table: wall time of DIFFERENTIAL, AUTO, FULL and CTAS and the ratios; what AUTO did and its
time against the faster of DIFFERENTIAL and FULL; CPU-seconds of each and the ratios; where a DIFFERENTIAL
refresh's time went and its commit path. Files written before a column existed show "-" there.

The plot has one panel per query shape, FULL/DIFFERENTIAL against change rate, one line per source size,
log-log: wall time in the top row; when the results have them, CPU-seconds in a second row and AUTO's time
against the faster of FULL and DIFFERENTIAL in a third (the dotted line is issue 16's 1.2x target).

``--freshness`` reads a run of ``./dev bench kafka`` instead (default: the newest ``kafka-freshness-*.json``):
its table as in docs/BENCHMARKS.md, and a plot of p50 (bar) and p99 (tick) freshness per path and rate, the
dotted lines being issue 17's targets (p50 2 s, p99 4 s).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"

HEADER = ("| rows | change | DIFF s | AUTO s | FULL s | CTAS s | FULL/DIFF | CTAS/DIFF | AUTO/best | AUTO did "
          "| DIFF CPU s | AUTO CPU s | FULL CPU s | CTAS CPU s | FULL/DIFF CPU | CTAS/DIFF CPU | DIFF jobs "
          "| DIFF commits | DIFF in jobs s | DIFF driver s | DIFF rows read | FULL rows read | DIFF commit path "
          "| same rows |")
ALIGN = "|---:|---:|" + "---:|" * 7 + "---|" + "---:|" * 12 + "---|---|"


def load(paths: list[Path], tag: str = "") -> list[dict[str, Any]]:
    """Cells of the runs labelled ``tag`` (``--tag`` of run.py; "" = default settings; several tags separated
    by commas, e.g. one run per source size, merged with the newest file winning a cell)."""
    tags = set(tag.split(","))
    cells: dict[tuple[int, float, str], dict[str, Any]] = {}
    for p in sorted(paths, key=lambda p: p.stat().st_mtime):
        data = json.loads(p.read_text())
        if not isinstance(data, list):  # a floor file given by hand
            continue
        for row in data:
            if "diff_driver_s" in row and row.get("tag", "") in tags:  # older files lack the breakdown
                cells[(row["rows"], row["rate"], row["shape"])] = row
    return [cells[k] for k in sorted(cells)]


def _f(r: dict[str, Any], key: str, fmt: str) -> str:
    """``r[key]`` formatted, or "-" when the run that made ``r`` did not measure it."""
    v = r.get(key)
    return "-" if v is None else format(v, fmt)


def _x(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    return "-" if v is None else f"{v:.1f}x"


def _paths(r: dict[str, Any]) -> str:
    if r.get("diff_paths"):
        return ", ".join(r["diff_paths"])
    apply = r.get("diff_apply")
    return apply.split(":", 1)[0] if apply else "-"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        lines += [f"### {shape}", "", HEADER, ALIGN]
        for r in (r for r in rows if r["shape"] == shape):
            best = "-" if r.get("auto_vs_best") is None else f"{r['auto_vs_best']:.2f}x"
            lines.append(
                f"| {r['rows']:,} | {r['rate']:.1%} | {r['diff_s']:.2f} | {_f(r, 'auto_s', '.2f')} | "
                f"{r['full_s']:.2f} | {r['ctas_s']:.2f} | {r['speedup']:.1f}x | {r['ctas_speedup']:.1f}x | {best} | "
                f"{r.get('auto_did', '-')} | {_f(r, 'diff_cpu', '.2f')} | {_f(r, 'auto_cpu', '.2f')} | "
                f"{_f(r, 'full_cpu', '.2f')} | {_f(r, 'ctas_cpu', '.2f')} | {_x(r, 'cpu_speedup')} | "
                f"{_x(r, 'ctas_cpu_speedup')} | {r['diff_jobs']:.0f} | {r['diff_commits']:.0f} | "
                f"{r['diff_job_s']:.2f} | {r['diff_driver_s']:.2f} | {r['diff_rows_read']:,.0f} | "
                f"{r['full_rows_read']:,.0f} | {_paths(r)} | {'yes' if r['same_rows'] else 'NO'} |")
        reasons = [(r["rows"], r["rate"], r["auto_reason"]) for r in rows if r["shape"] == shape and r.get("auto_reason")]
        if reasons:
            lines += ["", "AUTO's reason (last measured cycle):", ""]
            lines += [f"- {n:,} rows, {rate:.1%}: {why}" for n, rate, why in reasons]
        lines.append("")
    return "\n".join(lines)


def floor_markdown(path: Path) -> str:
    """The floor table of one ``./dev bench floor`` run (the same table floor.py prints)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from floor import markdown as floor_table

    data = json.loads(path.read_text())
    head = (f"### Floor ({path.name}): {data['rows']:,}-row sources, {data['changed']} changed rows per refresh, "
            f"median of {data['refreshes']} warm refreshes")
    return "\n".join([head, "", floor_table(data["shapes"]), ""])


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    panels = [("speedup", "FULL / DIFFERENTIAL refresh time", "")]
    if any(r.get("cpu_speedup") for r in rows):
        panels.append(("cpu_speedup", "FULL / DIFFERENTIAL CPU-seconds", " (CPU)"))
    if any(r.get("auto_vs_best") for r in rows):
        panels.append(("auto_vs_best", "AUTO / min(FULL, DIFFERENTIAL) time", " (AUTO)"))
    fig, axes = plt.subplots(len(panels), len(shapes), figsize=(3.4 * len(shapes), 3.4 * len(panels)),
                             sharey="row", squeeze=False)
    def tick(y: float, _pos: int, unit: str = "x") -> str:
        """1x, 2x, 5x, 10x, 0.5x ...: every tick of a log axis labelled would overlap."""
        lead = round(y / 10 ** math.floor(math.log10(y))) if y > 0 else 0
        return f"{y:g}{unit}" if lead in (1, 2, 5) else ""

    ratio = matplotlib.ticker.FuncFormatter(tick)
    percent = matplotlib.ticker.FuncFormatter(lambda x, pos: tick(x, pos, "%"))
    for row_axes, (key, label, suffix) in zip(axes, panels, strict=True):
        for ax, shape in zip(row_axes, shapes, strict=True):
            for size in sorted({r["rows"] for r in rows if r["shape"] == shape}):
                pts = sorted((r["rate"] * 100, r[key]) for r in rows
                             if r["shape"] == shape and r["rows"] == size and r.get(key))
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{size:,} rows")
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
            if key == "auto_vs_best":  # issue 16's target for AUTO
                ax.axhline(1.2, color="red", linewidth=0.8, linestyle=":")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ratio)
            ax.yaxis.set_minor_formatter(ratio)
            ax.xaxis.set_major_formatter(percent)
            ax.xaxis.set_minor_formatter(percent)
            ax.set_title(f"{shape}{suffix}")
            ax.set_xlabel("change rate per cycle")
            ax.grid(True, which="both", linewidth=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
        row_axes[0].set_ylabel(label)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


FRESHNESS_HEADER = ("| path | events/s | sent | p50 s | p99 s | max s | Kafka→mirror p50 | mirror→ST p50 | "
                    "first third p50 | last third p50 | ST refreshes | drain s | sustained | equals query |\n"
                    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")


def freshness_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [FRESHNESS_HEADER]
    for f in rows:
        lines.append(f"| {f['path']} | {f['rate']:,} | {f['events_sent']:,} | {f['p50_s']:.2f} | {f['p99_s']:.2f} | "
                     f"{f['max_s']:.2f} | {f['kafka_to_mirror_p50_s']:.2f} | {f['mirror_to_st_p50_s']:.2f} | "
                     f"{f['first_third_p50_s']:.2f} | {f['last_third_p50_s']:.2f} | {f['st_refreshes']} | "
                     f"{f['drain_s']:.1f} | {f['sustained']} | {f['result_equals_query']} |")
    return "\n".join(lines)


def freshness_plot(rows: list[dict[str, Any]], png: Path) -> None:
    """Per rate a group of bars, one per path: p50 as the bar, split into Kafka→mirror and mirror→stream
    table, p99 as a black tick; log scale, because the slowest path is ten times the fastest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rates = sorted({r["rate"] for r in rows})
    paths = list(dict.fromkeys(r["path"] for r in rows))
    by: dict[tuple[int, str], dict[str, Any]] = {}
    for r in rows:  # a path measured more than once in the run (interleaved repeats): their mean
        seen = by.setdefault((r["rate"], r["path"]), {**r, "n": 0, "p50_s": 0.0, "p99_s": 0.0})
        seen["n"] += 1
        seen["sustained"] = seen["sustained"] and r["sustained"]
        for k in ("p50_s", "p99_s"):
            seen[k] += (r[k] - seen[k]) / seen["n"]
    width = 0.8 / len(paths)
    fig, ax = plt.subplots(figsize=(2.2 + 1.1 * len(rates) * len(paths), 3.8))
    for i, path in enumerate(paths):
        xs = [k + (i - (len(paths) - 1) / 2) * width for k in range(len(rates))]
        got = [by.get((rate, path)) for rate in rates]
        p50 = [r["p50_s"] if r else 0 for r in got]
        bars = ax.bar(xs, p50, width * 0.9, label=path)
        ax.scatter(xs, [r["p99_s"] if r else float("nan") for r in got], marker="_", s=200, color="black",
                   zorder=3)
        for bar, r in zip(bars, got, strict=True):
            if r and not r["sustained"]:
                ax.annotate("not sustained", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=6, rotation=90)
    ax.axhline(2.0, color="red", linewidth=0.8, linestyle=":", label="p50 target 2 s")
    ax.axhline(4.0, color="black", linewidth=0.8, linestyle=":", label="p99 target 4 s")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda y, _pos: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xticks(range(len(rates)), [f"{r:,} events/s" for r in rates])
    ax.set_ylabel("send → stream table commit, s\n(bar: p50, tick: p99; mean of repeats)")
    ax.set_title("End-to-end freshness through Kafka (IMMEDIATE join + aggregate)")
    ax.grid(True, axis="y", which="both", linewidth=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", type=Path)
    p.add_argument("--tag", default="", help="only runs with this --tag, or any of several separated by commas (default: untagged runs)")
    p.add_argument("--png", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "benchmark_speedup.png")
    p.add_argument("--no-plot", action="store_true", help="tables only (no matplotlib needed)")
    p.add_argument("--freshness", action="store_true", help="a ./dev bench kafka run instead of the matrix")
    args = p.parse_args(argv)
    if args.freshness:
        runs = args.results or sorted(OUT.glob("kafka-freshness-*.json"), key=lambda x: x.stat().st_mtime)[-1:]
        if not runs:
            print("no results: run ./dev bench kafka first", file=sys.stderr)
            return 1
        rows = [r for run in runs for r in json.loads(run.read_text())]
        print(freshness_markdown(rows))
        if not args.no_plot:
            png = args.png if "--png" in (argv or sys.argv) else args.png.with_name("kafka_freshness.png")
            freshness_plot(rows, png)
            print(f"plot written to {png}", file=sys.stderr)
        return 0
    if args.results:
        paths = [x for x in args.results if not x.name.startswith("floor-")]
        floors = [x for x in args.results if x.name.startswith("floor-")]
    else:
        paths, floors = sorted(OUT.glob("results-*.json")), sorted(OUT.glob("floor-*.json"))
    floors = [x for x in floors if json.loads(x.read_text()).get("tag", "") in args.tag.split(",")]
    if not paths and not floors:
        print("no results: run ./dev bench (or ./dev bench floor) first", file=sys.stderr)
        return 1
    rows = load(paths, args.tag)
    if rows:
        print(markdown(rows))
        if not args.no_plot:
            plot(rows, args.png)
            print(f"plot written to {args.png}", file=sys.stderr)
    if floors:
        print(floor_markdown(max(floors, key=lambda x: x.stat().st_mtime)))
    if not rows and not floors:
        print(f"no results with tag {args.tag!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
