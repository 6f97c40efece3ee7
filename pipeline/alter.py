"""Changing a stream table's defining query in place (``alter_stream_table(name, query=...)``).

In this order, and why:

1. The new query is checked exactly as create checks one (:meth:`StreamTables._definition`: SQL, sources,
   output columns, differentiability for the table's refresh mode), and for cycles through the stream
   tables that read this one. A failure raises before anything is written: the old definition, the
   table's contents and its streaming query stay as they were.
2. The new definition is written with a pending re-initialization (:attr:`StreamTableDef.reinitialize`)
   and refreshed at once. That is the refresh executor's REINITIALIZE path (:mod:`pipeline.refresh`): the
   query's result replaces the contents (a new schema included) in one checked commit carrying the new
   frontier, and the history, which is kept, records the action with the reason. Should that refresh
   fail before its commit, the old definition is put back.
3. When the table's columns changed, each stream table that reads it is checked again with its own query
   over the new columns: one that no longer compiles goes to ERROR, naming the columns that went missing;
   one that does is re-defined and re-initialized the same way (its own columns may change with a
   ``SELECT *``), and so on down. With unchanged columns the dependents need nothing: their next refresh
   reads the re-initialization from the change feed like any other change.

An IMMEDIATE table's streaming query running in this process is stopped before and started again after
(:mod:`pipeline.immediate` starts a fresh checkpoint when the followed sources changed); ``trickle run``
restarts its own when it sees the definition change (:meth:`pipeline.runtime.Runtime._sync_immediate`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import TYPE_CHECKING

from connectors.delta_log import DeltaLog
from pipeline import strata
from pipeline.catalog import SourceInfo, StreamTableDef
from pipeline.errors import CatalogError, SourceChangedError, TrickleError
from pipeline.modes import RefreshMode, TableStatus

if TYPE_CHECKING:
    from pipeline.host import StreamTablesHost

#: the reason an altered table's re-initialization records
QUERY_CHANGED = "query changed"


def change_query(st: StreamTablesHost, d: StreamTableDef, query: str, dialect: str | None = None) -> None:
    """Give stream table ``d`` (with any schedule / mode / status changes of the same ALTER applied) the
    defining query ``query``, written in ``dialect`` (None: the table's): check, re-initialize, re-validate
    dependents (see the module docstring)."""
    if not isinstance(query, str) or not query.strip():
        raise CatalogError(f"stream table {d.name}: the new query is empty")
    try:
        draft, _ = st._definition(d.name, query.strip(), d.schedule, d.refresh_mode, dialect or d.dialect)
    except TrickleError as e:
        raise type(e)(*_args(e, f"{e} (ALTER of {d.name}: the old query stays in place)")) from None
    check_cycles(st, d, draft)
    redefine(st, d, draft, QUERY_CHANGED)


def _args(e: TrickleError, message: str) -> tuple[object, ...]:
    """Constructor arguments for an error like ``e`` with ``message`` (UnsupportedError takes the construct
    first)."""
    construct = getattr(e, "construct", None)
    return (construct, message) if construct is not None else (message,)


def check_cycles(st: StreamTablesHost, d: StreamTableDef, draft: StreamTableDef) -> None:
    """CatalogError when the new query would put ``d`` in a cycle the pipeline may not hold: any cycle
    unless it allows them (``allow_circular``), else a cycle through a non-monotone edge, named with its
    operator (:func:`pipeline.strata.check`)."""
    if not st.cycles.allow_circular:
        check_no_cycle(st, d.name, draft.sources)
        return
    new = dataclasses.replace(d, sources=draft.sources, edge_classes=draft.edge_classes)
    defs = [new if x.name.lower() == d.name.lower() else x for x in st.catalog.all()]
    try:
        analysed = strata.analyse(defs)
        strata.check(analysed, True, d.name.lower())
    except CatalogError as e:
        raise CatalogError(f"{e}; the old query stays in place") from None
    cid = analysed.scc.get(d.name.lower())
    immediate = [x.name for x in defs if cid is not None and analysed.scc.get(x.name.lower()) == cid
                 and x.refresh_mode == "IMMEDIATE"]
    if immediate:
        raise CatalogError(f"stream table {d.name}: the new query closes a cycle with the IMMEDIATE stream table "
                           f"{', '.join(immediate)}; a cycle is refreshed as one unit to its fixpoint, which a "
                           "streaming query per table cannot do: alter it to another refresh mode first; the old "
                           "query stays in place")


def check_no_cycle(st: StreamTablesHost, key: str, sources: dict[str, SourceInfo]) -> None:
    """CatalogError when a stream table among ``sources`` reads ``key``, directly or through others: the
    new query would make ``key`` read itself."""
    todo = [(k, [key, k]) for k, s in sources.items() if s.kind == "stream_table"]
    seen: set[str] = set()
    while todo:
        up, trail = todo.pop()
        if up == key:
            raise CatalogError(f"stream table {key} cannot read itself (cycle {' -> '.join(trail)}); the old "
                               "query stays in place. A pipeline may allow cycles through monotone edges, "
                               "evaluated to a fixpoint: allow_circular")
        if up in seen or not st.catalog.exists(up):
            continue
        seen.add(up)
        todo += [(k, trail + [k]) for k, s in st.catalog.get(up).sources.items() if s.kind == "stream_table"]


def redefine(st: StreamTablesHost, d: StreamTableDef, draft: StreamTableDef, reason: str) -> None:
    """Replace the definition of ``d`` by the checked ``draft``, re-initialize the table (REINITIALIZE with
    ``reason``), then re-validate its dependents when its columns changed."""
    key = d.name
    prior = st.catalog.get(key)
    new = dataclasses.replace(
        d, query=draft.query, sources=draft.sources, names=draft.names, types=draft.types, layout=draft.layout,
        full_reason=draft.full_reason, dialect=draft.dialect, inlined_query=draft.inlined_query,
        views=draft.views, float_identity=draft.float_identity, soft_frontier=None, cost_model=None,
        edge_classes=draft.edge_classes,
        reinitialize=reason)
    running = key in st._queries and st._queries[key].isActive
    if running:
        st.stop(key)
    st.catalog.put(new)
    strata.restratify(st.catalog)  # before the refresh: a member of a cycle refreshes with its cycle
    try:
        st.refresher.refresh(key)
    except Exception:
        if _committed_refresh_id(st, new) == prior.last_refresh_id:  # the contents are still the old query's
            st.catalog.put(prior)
            strata.restratify(st.catalog)
            if running:
                st.start(key)
        raise
    st._register(key, new.path)
    if running and st.catalog.get(key).refresh_mode == RefreshMode.IMMEDIATE:
        st.start(key)
    after = st.catalog.get(key)
    if list(zip(prior.names, prior.types, strict=True)) != list(zip(after.names, after.types, strict=True)):
        revalidate_dependents(st, key, prior.names, after.names)


def _committed_refresh_id(st: StreamTablesHost, d: StreamTableDef) -> str | None:
    found = DeltaLog(st.spark, d.path).last_trickle_commit()
    return found[1].get("refresh_id") if found is not None else None


def revalidate_dependents(st: StreamTablesHost, key: str, old_names: list[str], new_names: list[str]) -> None:
    """Check each stream table reading ``key`` (whose columns changed from ``old_names`` to ``new_names``)
    with its own query: ERROR naming the missing columns when it no longer compiles, else re-define and
    re-initialize it (see :func:`redefine`)."""
    removed = [n for n in old_names if n.lower() not in {m.lower() for m in new_names}]
    for name in st.catalog.dependents(key):
        dep = st.catalog.get(name)
        try:
            draft, _ = st._definition(name, dep.query, dep.schedule, dep.refresh_mode, dep.dialect)
        except TrickleError as e:
            mark_error(st, dep, missing_message(dep, key, removed, new_names, e))
            continue
        try:
            redefine(st, dep, draft, f"source {key} was altered: its columns changed from {old_names} to "
                                     f"{new_names}")
        except Exception as e:  # noqa: BLE001 - the alter of key succeeded; this dependent waits for a user
            mark_error(st, st.catalog.get(name), f"stream table {name} could not be re-initialized after the "
                       f"query of {key} was altered: {_first_line(e)}; fix the cause and alter {name} (its "
                       "query, or status=ACTIVE to retry)")


def missing_message(dep: StreamTableDef, key: str, removed: list[str], new_names: list[str],
                    error: BaseException) -> str:
    """Why ``dep`` no longer compiles after ``key`` was altered: the columns of ``key`` it reads that are
    gone (those its query names; all removed ones when it names none), the cause, and what to do."""
    named = [c for c in removed if re.search(rf"(?<![\w`]){re.escape(c)}(?![\w`])|`{re.escape(c)}`",
                                             dep.maintained_query, re.IGNORECASE)]
    cols = named or removed
    gone = (f"column{'s' if len(cols) > 1 else ''} {', '.join(cols)} of {key} went missing"
            if cols else f"its query fails over the new columns of {key}")
    return (f"stream table {dep.name} no longer compiles after the query of {key} was altered: {gone} "
            f"({key} now has {', '.join(new_names)}; {_first_line(error)}). Alter {dep.name} to a query over "
            f"those columns (trickle alter {dep.name} --query ...), or alter {key} back")


def mark_error(st: StreamTablesHost, d: StreamTableDef, message: str) -> None:
    """Put ``d`` in ERROR with ``message``, recorded in its history as a failed refresh would be."""
    now = time.time()
    st.refresher._record_error(d, now, time.perf_counter(), SourceChangedError(message))
    fresh = st.catalog.get(d.name)
    if fresh.status != TableStatus.ERROR:  # a suspended table is put in ERROR too: resuming it cannot help
        fresh.status = TableStatus.ERROR
        st.catalog.put(fresh)
    st.stop(d.name)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:400] if text else type(e).__name__
