"""What a refresh does, decided before anything runs: NO_DATA, FULL, DIFFERENTIAL or REINITIALIZE, and why.

The refresh (:mod:`pipeline.refresh`) reads each source's log once into a :class:`~connectors.delta_log.SourceWindow`
(pre and post version, identity, schema changes, truncates, insert-only, sizes, change bytes); the decision is
a pure function of those windows, the table's definition and its committed frontier, so it is tested without
Spark and the executor only carries it out (as pg_trickle's orchestrator decides a ``RefreshAction`` and its
merge module applies it: :class:`Decision`). The executor may still change course while running, and says so in the reason: an
unreadable change feed or AUTO's budget turns a DIFFERENTIAL refresh into a FULL one.

The order of the rules is the order of precedence:

1. nothing moved (same frontier, no source re-created, no pending re-initialisation): NO_DATA;
2. never populated: FULL;
3. the definition changed, the set of sources changed, a source was re-created or changed its schema in a way
   the query notices: REINITIALIZE (a FULL that may also adopt new output types);
4. ``refresh_mode='FULL'``, a truncated base source, or a query that cannot be differentiated: FULL (the
   latter an error under DIFFERENTIAL, IMMEDIATE and strict mode);
5. AUTO (not strict): the cost model picks (:func:`pipeline.strategy.auto`);
6. otherwise DIFFERENTIAL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from connectors.delta_log import SourceWindow
from pipeline import source_schema, strategy
from pipeline.catalog import StreamTableDef
from pipeline.errors import RefreshError, SourceChangedError
from pipeline.modes import DELTA_ONLY_MODES, RefreshAction, RefreshMode


@dataclass(frozen=True)
class Decision:
    """The decision: ``action`` and the ``reason`` recorded with it; ``change_ratio`` is the sources' change
    bytes over their sizes (None before the first refresh, or when unknown), what AUTO weighs and learns."""

    action: RefreshAction  # NO_DATA | FULL | DIFFERENTIAL | REINITIALIZE
    reason: str
    change_ratio: float | None = None


def decide(d: StreamTableDef, pre: Mapping[str, int] | None, windows: Mapping[str, SourceWindow],
           replaced: Mapping[str, str], verdict: source_schema.Verdict | None, strict: bool) -> Decision:
    """The action for refreshing ``d`` from its committed frontier ``pre`` (None: never populated) to the
    windows' post versions. ``replaced``: sources dropped and re-created (key -> why); ``verdict``: what the
    sources' schemas mean for the query (:mod:`pipeline.source_schema`; None before the first refresh);
    ``strict``: no fallback from DIFFERENTIAL to FULL. Raises when the table cannot be refreshed as asked."""
    if nothing_moved(d, pre, windows, replaced):
        return Decision(RefreshAction.NO_DATA, "no source changed since the last refresh")
    post = {k: w.post for k, w in windows.items()}
    ratio = change_ratio(pre, windows)
    action, reason = _action(d, pre, post, windows, replaced, ratio, verdict, strict)
    if verdict is not None and verdict.notes:
        reason = f"{reason}; {'; '.join(verdict.notes)}"
    return Decision(RefreshAction(action), reason, ratio)


def nothing_moved(d: StreamTableDef, pre: Mapping[str, int] | None, windows: Mapping[str, SourceWindow],
                  replaced: Mapping[str, str]) -> bool:
    """Rule 1: the table was populated, every source is where it was, none was re-created, and no
    re-initialisation is pending."""
    return (pre is not None and dict(pre) == {k: w.post for k, w in windows.items()} and not replaced
            and d.reinitialize is None)


def change_ratio(pre: Mapping[str, int] | None, windows: Mapping[str, SourceWindow]) -> float | None:
    """Bytes of the changed sources' change feeds over the bytes of every source at its post version."""
    if pre is None:
        return None
    changed = [w for k, w in windows.items() if w.post != pre.get(k)]
    return strategy.change_ratio(sum(w.change_bytes for w in changed), [w.sizes.get(w.post) for w in windows.values()])


def _action(d: StreamTableDef, pre: Mapping[str, int] | None, post: Mapping[str, int],
            windows: Mapping[str, SourceWindow], replaced: Mapping[str, str], ratio: float | None,
            verdict: source_schema.Verdict | None, strict: bool) -> tuple[RefreshAction, str]:
    if pre is None:
        return RefreshAction.FULL, "initial population"
    if d.reinitialize is not None:  # its definition changed (pipeline.alter)
        return RefreshAction.REINITIALIZE, d.reinitialize
    if set(pre) != set(post):
        return RefreshAction.REINITIALIZE, "the set of sources changed"
    if replaced:
        return RefreshAction.REINITIALIZE, "; ".join(replaced.values())
    if verdict is not None and verdict.action == "ERROR":
        raise SourceChangedError(f"stream table {d.name} no longer matches its sources: {verdict.reason}")
    if verdict is not None and verdict.action == "REINITIALIZE":
        return RefreshAction.REINITIALIZE, verdict.reason
    for key, w in windows.items():
        if w.schema_changed_at is not None and not (verdict is not None and key in verdict.checked):
            return RefreshAction.REINITIALIZE, f"source {key} changed its schema at version {w.schema_changed_at}"
    if d.refresh_mode == RefreshMode.FULL:
        return RefreshAction.FULL, "refresh_mode is FULL"
    for key, w in windows.items():
        if d.sources[key].kind != "stream_table" and w.truncated_at is not None:
            # a truncate's delta is "every row deleted": recomputing from the (small) remaining
            # source is cheaper than differentiating it, and it re-bases every hidden state
            return RefreshAction.FULL, f"source {key} was truncated (version {w.truncated_at})"
    if d.full_reason is not None:
        if d.refresh_mode in DELTA_ONLY_MODES:
            raise RefreshError(f"stream table {d.name} cannot be refreshed differentially: {d.full_reason}")
        if strict:
            raise RefreshError(f"stream table {d.name} cannot be refreshed differentially: {d.full_reason} "
                               "(strict mode: no fallback to FULL; use refresh_mode='FULL' to recompute it)")
        return RefreshAction.FULL, f"query not differentiable: {d.full_reason}"
    if d.refresh_mode == RefreshMode.AUTO and not strict:
        action, reason = strategy.auto(ratio, strategy.CostModel.from_dict(d.cost_model))
        return RefreshAction(action), reason
    return RefreshAction.DIFFERENTIAL, "source changes applied as a delta"


@dataclass
class RefreshResult:
    """What one refresh did and why."""

    name: str
    action: str  # NO_DATA | DIFFERENTIAL | FULL | REINITIALIZE
    reason: str
    rows_inserted: int = 0
    rows_deleted: int = 0
    rows_updated: int = 0
    duration_ms: float = 0.0
    frontier: dict[str, int] = field(default_factory=dict)
    refresh_id: str | None = None
    recovered: bool = False
    #: how the delta was applied and why (see :mod:`pipeline.strategy`); None for NO_DATA
    apply: str | None = None
    #: bytes of the sources' change feeds over the sources' bytes (None: unknown), what AUTO decides on
    change_ratio: float | None = None
