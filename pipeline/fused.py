"""The fused path: a Kafka source's micro-batch commits its events to the mirror, then the IMMEDIATE stream
tables that read that mirror are refreshed right away, beside the ingestion (:mod:`pipeline.fused_lanes`).

Why: with a second streaming query per IMMEDIATE table polling the mirror's change feed, an event waited for
the mirror's MERGE, then for that query's next trigger, then for its own read of the window (two queries and
their triggers on two cores: about half of the latency from producer to stream table; figures in
docs/BENCHMARKS.md, "Figures behind the code"). In pg_trickle, IMMEDIATE maintenance runs inside the writing
transaction; on Spark the closest honest equivalent is the mirror commit followed at once by the refreshes it
calls for.

Exactly-once is unchanged, because the refresh still decides *what* to apply from the frontier recorded in
the stream table's own commit, never from the batch: a batch replayed after a crash re-applies its events
under the same Delta transaction id (skipped), and a refresh finds its versions applied (NO_DATA) or applies
what the killed run did not.

Which tables a batch marks (:func:`fed_by`) and which sources an IMMEDIATE table's own streaming query
must still follow (:func:`followed`) are pure decisions over the catalog, here; :mod:`pipeline.runtime` runs
them. A source is *pushed* when every change of it reaches its readers through a mirror batch: a Kafka
mirror, or an IMMEDIATE stream table all of whose sources are pushed (its commits are made by the lanes
those mirrors' batches mark, which mark its readers too). Anything else (a Delta table written by someone
else, a scheduled stream table) is followed by the table's streaming query over its change feed, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.catalog import StreamTableDef
from pipeline.modes import RefreshMode, TableStatus


def _immediate(d: StreamTableDef) -> bool:
    return d.refresh_mode == RefreshMode.IMMEDIATE and d.status == TableStatus.ACTIVE


def pushed_sources(defs: Iterable[StreamTableDef], mirrors: Iterable[str]) -> set[str]:
    """The names (lower case) of the sources whose changes reach their readers through mirror batches."""
    by_name = {d.name.lower(): d for d in defs}
    pushed = {m.lower() for m in mirrors}
    grew = True
    while grew:  # a fixpoint: an IMMEDIATE table over pushed sources is pushed, so are its IMMEDIATE readers
        grew = False
        for key, d in by_name.items():
            if key not in pushed and _immediate(d) and d.sources and all(s.lower() in pushed for s in d.sources):
                pushed.add(key)
                grew = True
    return pushed


def fed_by(defs: Iterable[StreamTableDef], mirror: str) -> list[str]:
    """The IMMEDIATE stream tables a micro-batch of ``mirror`` marks for their lanes: those that read it,
    directly or through IMMEDIATE stream tables it feeds. Listed upstream first, so that an upstream lane is
    woken first; the order is not needed for correctness (a refresh brings its stale upstream tables along)."""
    by_name = {d.name.lower(): d for d in defs}
    fed: set[str] = set()
    grew, reached = True, {mirror.lower()}
    while grew:
        grew = False
        for key, d in by_name.items():
            if key not in fed and _immediate(d) and any(s.lower() in reached for s in d.sources):
                fed.add(key)
                reached.add(key)
                grew = True
    order: list[str] = []

    def visit(key: str, path: tuple[str, ...]) -> None:
        if key in order or key in path:
            return
        for s in by_name[key].sources:
            if s.lower() in fed:
                visit(s.lower(), (*path, key))
        order.append(key)

    for key in sorted(fed):
        visit(key, ())
    return [by_name[k].name for k in order]


def followed(d: StreamTableDef, pushed: set[str]) -> set[str]:
    """The sources of the IMMEDIATE table ``d`` its own streaming query still follows (empty: the mirror
    batches refresh it, and it needs no query)."""
    return {s for s in d.sources if s.lower() not in pushed}
