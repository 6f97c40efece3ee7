"""Key filters: a join's large input read only where a small delta's join keys fall.

Why: the inner join's delta term ``ΔL ⋈ R_post`` needs only the rows of ``R_post`` whose key some row of
``ΔL`` carries, but Spark has no index to look them up, so it scans all of ``R_post`` (TPC-H at SF 1: a few
thousand changed orders joined with lineitem's 6M rows, a job that cost more than recomputing the query;
figures in docs/BENCHMARKS.md, "Figures behind the code").
Delta skips whole files, and Parquet skips row groups and pages, whose min/max statistics miss a predicate
with literals. So a small, held delta's keys are read on the driver first, and the term filters ``R_post`` by
them: an IN-list, or up to :data:`MAX_RANGES` ranges split at the widest gaps between the sorted keys (a
table clustered by its key, like lineitem by order key, keeps each range in few files).

Rendering leaves a token in the SQL (:meth:`dvm.context.Context.key_filter`); the refresh executor fills it
in with :func:`predicate` once the held delta is computed. The predicate keeps every row whose key equals
one of the values, so the join's result is the same with or without it.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dvm.dialect import sql_string

#: ranges of integral or date keys in one predicate (each a pair of bounds Delta and Parquet skip by)
MAX_RANGES = 16
#: string keys as an IN-list of at most this many values (no distance between strings to split gaps by)
MAX_IN = 1000
#: more distinct keys than this and the relation is read whole (a predicate that long costs more than it skips)
MAX_KEYS = 50_000


@dataclass(frozen=True)
class KeyFilter:
    """``column`` (SQL over the filtered relation's columns) restricted to the values ``key`` (SQL over the
    held relation ``held``'s columns) takes."""

    held: str
    key: str
    column: str



def keys_query(filters: Sequence[tuple[KeyFilter, str]]) -> str:
    """One query reading the distinct non-NULL keys (an equi-join never matches NULL) of every filter, given
    with its key's Spark type: row ``i`` holds the set of filter ``i``'s keys in the column of its type (a
    UNION ALL coerces a column to one type, and a string is not a date), at most one more than
    :data:`MAX_KEYS` of them (more are not used). One job, which also fills the held relations."""
    kinds = sorted({t for _, t in filters})
    rows = []
    for i, (spec, t) in enumerate(filters):
        sets = ", ".join(f"slice(collect_set({spec.key}), 1, {MAX_KEYS + 1})" if k == t
                         else f"CAST(NULL AS ARRAY<{k}>)" for k in kinds)
        rows.append(f"SELECT {i} AS i, {sets} FROM {spec.held}")
    return " UNION ALL ".join(rows)


def _literal(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
        return f"DATE'{v.isoformat()}'"
    if isinstance(v, str):
        return sql_string(v)
    return None


def _position(v: Any) -> int:
    return v.toordinal() if isinstance(v, datetime.date) else int(v)


def ranges(values: Sequence[Any], max_ranges: int = MAX_RANGES) -> list[tuple[Any, Any]]:
    """Sorted distinct integral or date ``values`` covered by at most ``max_ranges`` inclusive ranges, split
    at the widest gaps."""
    vs = sorted(set(values))
    if not vs:
        return []
    gaps = sorted(range(1, len(vs)), key=lambda i: _position(vs[i]) - _position(vs[i - 1]), reverse=True)
    cuts = sorted(gaps[:max_ranges - 1])
    bounds = [0, *cuts, len(vs)]
    return [(vs[a], vs[b - 1]) for a, b in zip(bounds, bounds[1:], strict=False)]


def predicate(values: Sequence[Any], column: str, max_ranges: int = MAX_RANGES) -> str:
    """A predicate on ``column`` true for every value of ``values`` (distinct, non-NULL keys); ``TRUE`` (no
    filter) for keys it cannot render or too many of them."""
    if not values:
        return "FALSE"
    if len(values) > MAX_KEYS or any(_literal(v) is None for v in values):
        return "TRUE"
    kinds = {type(v) for v in values}
    if len(kinds) > 1:
        return "TRUE"  # a join of differently typed keys: left to Spark
    if kinds == {str}:
        if len(values) > MAX_IN:
            return "TRUE"
        return f"({column} IN ({', '.join(_literal(v) for v in sorted(values))}))"  # type: ignore[misc]
    terms = []
    points = []
    for lo, hi in ranges(values, max_ranges):
        if lo == hi:
            points.append(_literal(lo))
        else:
            terms.append(f"{column} BETWEEN {_literal(lo)} AND {_literal(hi)}")
    if points:
        terms.append(f"{column} = {points[0]}" if len(points) == 1 else f"{column} IN ({', '.join(points)})")  # type: ignore[arg-type]
    return "(" + " OR ".join(terms) + ")"
