"""Plain-text rendering of API results: the tables and one-line refresh summaries people read.

Its own module so that the CLI and the demo share it without the demo importing the CLI (which imports the
demo to run it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["STATUS_COLUMNS", "HISTORY_COLUMNS", "describe_refresh", "format_table", "epoch_to_datetime"]

#: Columns shown by ``trickle status`` / ``trickle history`` in plain-text mode, in this order, when the
#: API returns them. ``--json`` prints every key instead.
STATUS_COLUMNS = (
    "name",
    "status",
    "refresh_mode",
    "schedule",
    "last_action",
    "last_refresh_at",
    "frontier",
    "consecutive_errors",
    "full_reason",
)
HISTORY_COLUMNS = (
    "started_at",
    "status",
    "action",
    "reason",
    "rows_inserted",
    "rows_deleted",
    "rows_updated",
    "duration_ms",
    "error",
)

def describe_refresh(result: Any) -> str:
    """One line for a RefreshResult: what ran, why, what changed, how long it took."""
    g = _getter(result)
    parts = [f"{g('name')}: {g('action')}"]
    reason = g("reason")
    if reason:
        parts.append(f"({reason})")
    parts.append(f"+{g('rows_inserted') or 0} -{g('rows_deleted') or 0} ~{g('rows_updated') or 0} rows")
    duration = g("duration_ms")
    if duration is not None:
        parts.append(f"in {_fmt(duration)} ms")
    return " ".join(parts)


def format_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render dicts as a plain-text table (no borders, so output pastes cleanly into issues and docs).

    ``columns`` picks and orders the columns; those absent from every row are left out, so the table
    adapts when the API adds or omits keys. Without ``columns`` every key of the first row is shown.
    """
    rows = [dict(r) for r in rows]
    if not rows:
        return ""
    if columns is None:
        cols = list(rows[0])
    else:
        cols = [c for c in columns if any(c in r for r in rows)]
    cells = [
        [_fmt(epoch_to_datetime(r.get(c)) if c.endswith("_at") else r.get(c)) for c in cols] for r in rows
    ]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 1e6 else f"{value:.0f}"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={_fmt(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, list | tuple):
        return ",".join(_fmt(v) for v in value)
    text = str(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def epoch_to_datetime(value: Any) -> Any:
    """The catalog stores times as epoch seconds (cheap, JSON-friendly); people read UTC timestamps."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, dt.UTC).replace(tzinfo=None)
    return value


def _getter(obj: Any) -> Callable[[str], Any]:
    if isinstance(obj, Mapping):
        return obj.get
    return lambda key: getattr(obj, key, None)
