"""``trickle dag``: the dependency graph of sources and stream tables, in the terminal, as Graphviz DOT, or
as a PNG.

Read from the catalog alone (no Spark): each stream table's definition names its sources. A source that
is no stream table is a base table: a Delta table, or the mirror of a Kafka topic when the conf file says
so. The terminal view is a tree from every base table down to the tables that read it; a table that reads
several sources appears under each of them, its subtree drawn once (later mentions say ``(see above)``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import TrickleError


@dataclass(frozen=True)
class Node:
    name: str
    kind: str  # "stream table", "delta", "kafka"
    label: str  # what the node says besides its name: mode/schedule/status, or the topic


@dataclass
class Graph:
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)  # (source, reader)

    def readers(self, name: str) -> list[str]:
        return sorted(r for s, r in self.edges if s == name)

    def roots(self) -> list[str]:
        targets = {r for _, r in self.edges}
        return sorted(n for n in self.nodes if n not in targets)


def build(defs: Iterable[Any], kafka_topics: Mapping[str, str] | None = None) -> Graph:
    """The graph of catalog definitions; ``kafka_topics``: Kafka source name -> topic (from the conf)."""
    kafka_topics = {k.lower(): v for k, v in (kafka_topics or {}).items()}
    g = Graph()
    defs = list(defs)
    tables = {d.name.lower() for d in defs}
    for d in defs:
        schedule = d.schedule or "-"
        label = f"{d.refresh_mode}, {schedule}" + ("" if d.status == "ACTIVE" else f", {d.status}") + (
            f", cycle {d.scc}" if getattr(d, "scc", None) else "")  # pipeline.strata
        g.nodes[d.name.lower()] = Node(d.name, "stream table", label)
    for d in defs:
        for key in sorted(d.sources):
            if key not in tables and key not in g.nodes:
                topic = kafka_topics.get(key)
                g.nodes[key] = Node(key, "kafka" if topic else "delta", f"kafka {topic}" if topic else "delta")
            g.edges.append((key, d.name.lower()))
    return g


def render_text(g: Graph) -> str:
    """The tree view (box-drawing characters)."""
    if not g.nodes:
        return "no stream tables"
    lines: list[str] = []
    drawn: set[str] = set()

    def walk(name: str, prefix: str, last: bool, top: bool) -> None:
        node = g.nodes[name]
        branch = "" if top else ("└── " if last else "├── ")
        again = name in drawn and bool(g.readers(name))
        lines.append(f"{prefix}{branch}{node.name} [{node.label}]" + ("  (see above)" if again else ""))
        if again:
            return
        drawn.add(name)
        kids = g.readers(name)
        inner = prefix + ("" if top else ("    " if last else "│   "))
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in g.roots():
        walk(root, "", True, True)
    return "\n".join(lines)


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_dot(g: Graph) -> str:
    """Graphviz DOT: base tables as cylinders (Kafka mirrors filled), stream tables as boxes (ERROR red)."""
    out = ["digraph trickle {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=11];']
    for key in sorted(g.nodes):
        n = g.nodes[key]
        if n.kind == "stream table":
            color = ', color="red", fontcolor="red"' if "ERROR" in n.label else ""
            attrs = f'shape=box, style=rounded{color}'
        elif n.kind == "kafka":
            attrs = 'shape=cylinder, style=filled, fillcolor="#fde9c9"'
        else:
            attrs = "shape=cylinder"
        label = f"{n.name}\\n{n.label}".replace('"', '\\"')
        out.append(f'  {_dot_id(key)} [label="{label}", {attrs}];')
    for s, r in g.edges:
        out.append(f"  {_dot_id(s)} -> {_dot_id(r)};")
    out.append("}")
    return "\n".join(out) + "\n"


def layers(g: Graph) -> dict[str, int]:
    """Each node's depth: 0 for base tables, else 1 + the deepest source it reads."""
    depth: dict[str, int] = {}

    def of(name: str, trail: frozenset[str]) -> int:
        if name in depth:
            return depth[name]
        sources = [s for s, r in g.edges if r == name and s not in trail]
        depth[name] = 0 if not sources else 1 + max(of(s, trail | {name}) for s in sources)
        return depth[name]

    for n in g.nodes:
        of(n, frozenset())
    return depth


def write(g: Graph, out: Path) -> str:
    """Write ``out``: ``.dot`` (DOT text), ``.png`` / ``.svg`` / ``.pdf`` (Graphviz's ``dot`` when on the
    PATH, else matplotlib). Returns how it was drawn."""
    suffix = out.suffix.lower()
    dot_text = render_dot(g)
    if suffix in (".dot", ".gv"):
        out.write_text(dot_text, encoding="utf-8")
        return "DOT"
    if suffix not in (".png", ".svg", ".pdf"):
        raise TrickleError(f"dag --out {out}: give a .dot, .gv, .png, .svg or .pdf file name")
    exe = shutil.which("dot")
    if exe is not None:
        done = subprocess.run([exe, f"-T{suffix[1:]}", "-o", str(out)], input=dot_text.encode(),
                              capture_output=True, check=False)
        if done.returncode != 0:
            raise TrickleError(f"Graphviz dot failed to write {out}: {done.stderr.decode(errors='replace').strip()}")
        return "Graphviz"
    try:
        import matplotlib
    except ImportError:
        raise TrickleError(f"cannot draw {out}: neither Graphviz's 'dot' command nor matplotlib is installed. "
                           "Install one (apt-get install graphviz, or pip install matplotlib, which the "
                           "'bench' extra of spark-trickle includes), or write DOT text with --out dag.dot"
                           ) from None
    matplotlib.use("Agg")
    _draw_matplotlib(g, out)
    return "matplotlib"


def _draw_matplotlib(g: Graph, out: Path) -> None:
    """A layered drawing: base tables on the left, each stream table one column right of its deepest source."""
    import matplotlib.pyplot as plt

    depth = layers(g)
    columns: dict[int, list[str]] = {}
    for n in sorted(g.nodes):
        columns.setdefault(depth[n], []).append(n)
    pos = {n: (float(x), -float(i) + (len(col) - 1) / 2) for x, col in columns.items() for i, n in enumerate(col)}
    tall = max((len(c) for c in columns.values()), default=1)
    fig, ax = plt.subplots(figsize=(3.2 * (len(columns) or 1) + 1, 1.1 * tall + 1))
    for s, r in g.edges:  # from the right edge of the source's box to the left edge of the reader's
        (xs, ys), (xr, yr) = pos[s], pos[r]
        ax.annotate("", xy=(xr - 0.27, yr), xytext=(xs + 0.27, ys), zorder=5,
                    arrowprops={"arrowstyle": "-|>", "color": "#555", "shrinkA": 0, "shrinkB": 0,
                                "mutation_scale": 14})
    colors = {"stream table": "#dbe9f6", "kafka": "#fde9c9", "delta": "#eeeeee"}
    for n, (x, y) in pos.items():
        node = g.nodes[n]
        edge = "red" if "ERROR" in node.label else "#333"
        ax.text(x, y, f"{node.name}\n{node.label}", ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round,pad=0.4", "fc": colors.get(node.kind, "#fff"), "ec": edge})
    ax.set_xlim(-0.7, max(columns, default=0) + 0.7)
    ax.set_ylim(-tall / 2 - 0.3, tall / 2 + 0.3)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
