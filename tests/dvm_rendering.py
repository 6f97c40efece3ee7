"""The SQL of a refresh as the refresh runs it, for the dvm unit tests to assert on (no JVM).

Why: a refresh renders over a :class:`~dvm.Context` with ``materialize_changes`` (each change window, and each
small snapshot, read once and held as a :class:`~dvm.Fixpoint` the SQL names), then puts back the held reads
Spark would read only once (:meth:`~dvm.Context.unshare_single_reads`). SQL rendered without
``materialize_changes`` is a text no refresh runs. :func:`as_run` renders the way a refresh does, then writes
each held relation in place of its name, so an assertion finds ``table_changes_by_path(...)`` or a
snapshot wherever the refresh reads it; :func:`held_queries` gives the computed relations it holds, each
once, as the refresh computes them.
"""

from __future__ import annotations

import re
from typing import Any

from dvm import HELD_SEED, Context, Fixpoint, SourceRef


def refresh_context(sources: dict[str, SourceRef], **settings: Any) -> Context:
    """A Context as a refresh builds one (``materialize_changes``), the stream table at ``/w/st``."""
    return Context(sources, target_path="/w/st", materialize_changes=True, **settings)


def as_run(ctx: Context, sql: str | None) -> str | None:
    """``sql`` (rendered over ``ctx``) as the refresh runs it, each relation it holds written out in place of
    its name (a source read as it is, a computed one as a subquery), as if read where it is named; loops
    (recursive CTEs) keep their names. To count what the refresh computes once, see :func:`held_queries`."""
    if sql is None:
        return None
    sql = ctx.unshare_single_reads(sql)
    for name, spec in reversed(ctx.fixpoints):  # a later one may read an earlier one: written out first
        if spec.step is None:
            item = spec.seed[len(HELD_SEED):] if spec.reads_source() else f"({spec.seed})"
            sql = re.sub(re.escape(name) + r"\b", lambda _m, item=item: item, sql)
    return sql


def computed(ctx: Context) -> list[tuple[str, Fixpoint]]:
    """The relations the rendered SQL holds that it computes (a netted delta, a recursive CTE's result or
    loops), not the held source reads, in the order the refresh computes them."""
    return [(name, spec) for name, spec in ctx.fixpoints if not spec.reads_source()]


def loops(ctx: Context) -> list[tuple[str, Fixpoint]]:
    """The loops the rendered SQL reads (a recursive CTE's semi-naive or counting rounds), in order."""
    return [(name, spec) for name, spec in ctx.fixpoints if spec.step is not None]


def held_queries(ctx: Context) -> list[str]:
    """The :func:`computed` relations' SQL (seed, then step for a loop), each once as the refresh computes
    it, source reads written out as in :func:`as_run`."""
    return [_written_out(ctx, spec.seed + (f"\n{spec.step}" if spec.step else "")) for _, spec in computed(ctx)]


def _written_out(ctx: Context, text: str) -> str:
    for name, spec in ctx.fixpoints:
        if spec.reads_source():
            item = spec.seed[len(HELD_SEED):]
            text = re.sub(re.escape(name) + r"\b", lambda _m, item=item: item, text)
    return text


def merge_sql(plan: Any, ctx: Context, types: list[str]) -> str | None:
    """``plan.merge_source_sql`` as the refresh runs it (see :func:`as_run`)."""
    return as_run(ctx, plan.merge_source_sql(ctx, types))


def delta_sql(node: Any, ctx: Context) -> str | None:
    """An operator's delta as the refresh runs it (see :func:`as_run`)."""
    return as_run(ctx, node.delta(ctx))


def full_sql(plan: Any, ctx: Context, types: list[str]) -> str | None:
    """``plan.full_sql`` as the refresh runs it (see :func:`as_run`)."""
    return as_run(ctx, plan.full_sql(ctx, types))
