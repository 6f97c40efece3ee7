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

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.decision import RefreshResult
from pipeline.errors import CatalogError

#: Spark conf keys of a pipeline's cycle settings (the API's arguments and the conf file's keys win; see
#: :class:`pipeline.cycles.Settings`)
ALLOW_CIRCULAR = "trickle.cycles.allowCircular"
MAX_ITERATIONS = "trickle.cycles.maxFixpointIterations"

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
                    f"({_operator(cls)} in the query of {r}); only monotone "
                    "edges (joins, UNION, filters, projections, DISTINCT, EXISTS) may form a cycle. Read the "
                    "negated or aggregated table from outside the cycle (a lower stratum) instead")


def _operator(edge_class: str) -> str:
    """The operator of a non-monotone edge class: ``non-monotone (X)`` -> ``X``."""
    inner = edge_class.removeprefix("non-monotone").strip()
    return inner[1:-1] if inner.startswith("(") and inner.endswith(")") else inner


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


def bootstrap_query(query: str, missing: set[str], dialect: str = "spark") -> str | None:
    """A first query for a cycle member whose cycle peers do not exist yet (a conf file declaring a cycle):
    the branches of its top-level UNION that read none of ``missing``; None when it has no such branch. The
    member is created with it, then altered to ``query`` once its peers exist, which closes the cycle (the
    API's own way: create, then alter)."""
    from sqlglot import exp

    import dvm

    tree = dvm.parse(query, dialect)
    branches: list[exp.Expression] = []

    def split(node: exp.Expression) -> None:
        if isinstance(node, exp.Union) and node.args.get("distinct") and not node.args.get("with"):
            split(node.this)
            split(node.expression)
        else:
            branches.append(node)

    split(tree)
    if len(branches) < 2:
        return None
    kept = [b for b in branches if not {dvm.table_key(t) for t in dvm.source_tables(b)} & missing]
    if not kept:
        return None
    return " UNION ".join(b.sql(dialect=dvm.dialect_of(dialect)) for b in kept)


# --- skipping: a refresh whose sources' changes net to nothing (seed 002, S-2) ---

#: a change window of at most this many change rows (and bytes of change files) is netted on the driver (delta-rs, no Spark job) to find
#: whether it changed any row at all; a larger one is left to the refresh
QUIET_WINDOW_ROWS = 10_000
QUIET_WINDOW_BYTES = 4 << 20

#: what the reason of a skipped refresh says (``tests/oracle.py`` accepts such a NO_DATA where sources moved)
SKIPPED = "skipped without a Spark job"
#: Spark conf: ``false`` turns the skip off (an escape hatch, as seed 002's ``enable_stratum_skip``)
SKIP_QUIET = "trickle.refresh.skipQuietWindows"

_PLUS = ("insert", "update_postimage")
_MINUS = ("delete", "update_preimage")


def quiet_refresh(refresher: Any, d: Any, committed: Any, post: dict[str, int], windows: dict[str, Any],
                  replaced: dict[str, str], record: dict[str, Any], started: float, t0: float) -> Any | None:
    """A NO_DATA result, recorded, when every source of ``d`` that moved since its last refresh is an upstream
    stream table whose commits change no row of what ``d`` reads (their change feed nets to nothing on its
    user columns: a refresh that only re-wrote rows with the same values, or a frontier-only commit); None
    when the refresh must run. Base tables' commits always go to the refresh.

    Why: the dependents of an upstream whose refresh applied no rows would each run a differential refresh
    over empty change windows, Spark jobs included; this check reads the small windows on the driver instead,
    so a quiet layer stops the wave below it. The table's frontier moves on as a soft frontier (no commit),
    as after an empty delta, so the next refresh does not read the window again."""
    pre = committed.frontier
    if pre is None or replaced or d.reinitialize is not None or pre == post:
        return None
    if str(refresher.conf.get(SKIP_QUIET, "true")).strip().lower() == "false":
        return None
    moved = [k for k in d.sources if post.get(k) != pre.get(k)]
    if any(k not in pre or post[k] < pre[k] or d.sources[k].kind != "stream_table" for k in moved):
        return None  # a base table's commits go to the refresh (its delta rules handle them)
    for key in moved:
        if not _window_nets_to_nothing(refresher, d, key, pre[key], post[key], windows.get(key)):
            return None
    meta = committed.meta or {}
    soft = {"table_version": committed.version, "refresh_id": meta.get("refresh_id"), "frontier": post,
            **{k: v for k, v in record.items() if v is not None}}
    reason = (f"upstream stream table{'s' if len(moved) > 1 else ''} {', '.join(sorted(moved))} moved, but "
              f"{'their commits net' if len(moved) > 1 else 'its commits net'} to no changed row ({SKIPPED})")
    result = RefreshResult(d.name, "NO_DATA", reason, duration_ms=(time.perf_counter() - t0) * 1000, frontier=post,
                           refresh_id=d.last_refresh_id)
    refresher._record_ok(d, started, result, soft)
    return result


def _window_nets_to_nothing(refresher: Any, d: Any, key: str, pre: int, post: int, window: Any) -> bool:
    """Whether the change feed of source ``key`` over (pre, post] nets to no row on the columns ``d`` reads
    of it (a stream table: its user columns; a base table: all of them)."""
    from connectors import delta_rs
    from connectors.delta_log import DeltaLog

    if window is None or window.schema_changed_at is not None or window.truncated_at is not None:
        return False
    if window.change_bytes > QUIET_WINDOW_BYTES or (window.insert_only and window.change_bytes > 0):
        return False  # too large to net on the driver, or rows were only added: the refresh runs
    src = d.sources[key]
    if delta_rs.unreadable(DeltaLog(refresher.spark, src.path).protocol(post)) is not None:
        return False
    changes = delta_rs.read_changes(src.path, pre + 1, post, QUIET_WINDOW_ROWS)
    if changes is None:
        return False
    if src.kind == "stream_table":
        if not refresher.catalog.exists(key):
            return False
        columns = refresher.catalog.get(key).names
    else:
        columns = [c for c in changes.column_names if not c.startswith("_commit_") and c != "_change_type"]
    if not set(columns) <= set(changes.column_names):
        return False
    net: Counter[tuple[Any, ...]] = Counter()
    kinds = changes.column("_change_type").to_pylist()
    values = zip(*(changes.column(c).to_pylist() for c in columns), strict=True)
    for kind, row in zip(kinds, values, strict=True):
        if kind in _PLUS:
            net[row] += 1
        elif kind in _MINUS:
            net[row] -= 1
        else:
            return False
    return not any(net.values())
