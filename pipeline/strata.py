"""Strongly connected components and strata of the stream-table graph (seed 002: stratified evaluation).

The graph's nodes are stream tables; an edge ``S -> R`` says that R's query reads S, classified monotone
or non-monotone by :mod:`dvm.monotone`. Base tables are no nodes: they are constants to every stratum.

- A *cyclic component* is an SCC of more than one table (a table never reads itself: create refuses it).
  Cycles exist only in a pipeline that opted in (``allow_circular``) and only through monotone edges:
  :func:`check` refuses a component with a non-monotone edge inside, naming the edge and the operator.
- A table's *stratum* is the minimum stratification (002:L123-139): over the condensation in topological
  order, ``stratum(R) = max over sources S of stratum(S) + (1 if S -> R is non-monotone else 0)``; a table
  reading only base tables is stratum 0. Members of one component share a stratum.

Computed from the catalog's definitions alone (no Spark): cheap, so recomputed on every change to the
graph (create, alter, drop) and stored on each definition for ``status`` (see :func:`restratify`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import CatalogError

#: the edge class recorded for an edge whose reader's query could not be classified
UNKNOWN = "non-monotone (not classified)"


@dataclass
class Strata:
    """The graph's analysis: each table's component id (None: in no cycle), stratum, and edge classes."""

    scc: dict[str, str | None] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)  # component id -> its tables, sorted
    stratum: dict[str, int] = field(default_factory=dict)
    #: (source, reader) -> "monotone" or "non-monotone (operator)", for edges between stream tables
    edges: dict[tuple[str, str], str] = field(default_factory=dict)


def sccs(nodes: Iterable[str], reads: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph where ``reads[n]`` are the nodes ``n`` reads,
    in reverse topological order of the condensation's *read* edges, i.e. sources before their readers."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    nodes = sorted(nodes)
    graph = {n: sorted(r for r in reads.get(n, ()) if r in set(nodes)) for n in nodes}

    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, int]] = [(start, 0)]  # iterative: a deep chain must not hit the recursion limit
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            succ = graph[v]
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def analyse(defs: Iterable[Any]) -> Strata:
    """Components, strata and edge classes of catalog definitions (``edge_classes`` as recorded at create
    or alter; an edge without a record counts as non-monotone)."""
    defs = {d.name.lower(): d for d in defs}
    reads = {n: [k for k, s in d.sources.items() if s.kind == "stream_table" and k in defs] for n, d in defs.items()}
    out = Strata()
    for reader, sources in reads.items():
        classes = defs[reader].edge_classes or {}
        for s in sources:
            out.edges[(s, reader)] = classes.get(s, UNKNOWN)
    for comp in sccs(defs, reads):  # sources first
        cid = f"scc:{comp[0]}" if len(comp) > 1 else None
        for n in comp:
            out.scc[n] = cid
        if cid is not None:
            out.members[cid] = comp
        inside = set(comp)
        level = 0
        for n in comp:
            for s in reads[n]:
                if s not in inside:
                    level = max(level, out.stratum[s] + (0 if out.edges[(s, n)] == "monotone" else 1))
        for n in comp:
            out.stratum[n] = level
    return out


def check(strata: Strata, allow_circular: bool, changing: str) -> None:
    """CatalogError when the graph has a cycle the pipeline may not hold: any cycle without
    ``allow_circular``, and a cycle through a non-monotone edge in any case (it has no least fixpoint)."""
    for comp in strata.members.values():
        if changing not in comp:
            continue
        cycle = " -> ".join(_cycle_path(strata, comp, changing))
        if not allow_circular:
            raise CatalogError(f"stream table {changing} cannot read itself (cycle {cycle}); cycles of stream "
                               "tables are evaluated to a fixpoint only in a pipeline that allows them: "
                               "allow_circular: true in the conf file, StreamTables(..., allow_circular=True), "
                               "or trickle --allow-circular")
        for (s, r), cls in sorted(strata.edges.items()):
            if s in comp and r in comp and cls != "monotone":
                raise CatalogError(
                    f"stream table {changing}: the cycle {cycle} goes through the non-monotone edge {s} -> {r} "
                    f"({cls.removeprefix('non-monotone ').strip('()')} in the query of {r}); only monotone "
                    "edges (joins, UNION, filters, projections, DISTINCT, EXISTS) may form a cycle. Read the "
                    "negated or aggregated table from outside the cycle (a lower stratum) instead")


def _cycle_path(strata: Strata, comp: list[str], start: str) -> list[str]:
    """One cycle through ``start`` inside ``comp``, as source -> reader names, ending where it started."""
    inside = set(comp)
    readers: dict[str, list[str]] = {}
    for (s, r) in strata.edges:
        if s in inside and r in inside:
            readers.setdefault(s, []).append(r)
    trail, todo, seen = [start], [(start, [start])], {start}
    while todo:
        node, trail = todo.pop(0)
        for r in sorted(readers.get(node, [])):
            if r == start:
                return trail + [start]
            if r not in seen:
                seen.add(r)
                todo.append((r, trail + [r]))
    return [start, start]


def restratify(catalog: Any) -> Strata:
    """Recompute the analysis and store each table's component and stratum on its definition (written only
    when they changed), so that ``status`` shows them without recomputing."""
    defs = catalog.all()
    strata = analyse(defs)
    for d in defs:
        key = d.name.lower()
        scc, level = strata.scc.get(key), strata.stratum.get(key)
        if d.scc != scc or d.stratum != level:
            fresh = catalog.get(key)
            if fresh.scc is not None and scc is None and fresh.reinitialize is None:
                # its cycle stored plain rows of a set; its own refreshes need the layout of its plan
                fresh.reinitialize = f"it left the cycle {fresh.scc}"
            fresh.scc, fresh.stratum = scc, level
            catalog.put(fresh)
    return strata


def component_of(catalog: Any, name: str) -> list[str]:
    """The other-than-trivial component holding ``name`` (sorted), or [] when it is in no cycle. Read from
    the catalog's sources (topology only), so a refresh never trusts a stale stored ``scc``."""
    defs = {d.name.lower(): d for d in catalog.all()}
    reads = {n: [k for k, s in d.sources.items() if s.kind == "stream_table" and k in defs] for n, d in defs.items()}
    key = name.lower()
    if not any(key in _reach(reads, up) for up in reads.get(key, [])):
        return []
    for comp in sccs(defs, reads):
        if key in comp:
            return comp if len(comp) > 1 else []
    return []


def _reach(reads: Mapping[str, list[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for up in reads.get(todo.pop(), []):
            if up not in seen:
                seen.add(up)
                todo.append(up)
    return seen
