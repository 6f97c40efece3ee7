"""Schedules: durations (``30s``, ``1h30m``), cron expressions (5 or 6 fields, ``@hourly``), CALCULATED."""

from __future__ import annotations

import re

from pipeline.errors import CatalogError

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> int | None:
    """Seconds in a duration like ``90s``, ``5m``, ``1h30m``, ``2d``; None when ``text`` is not one."""
    m = _DURATION.match(text.strip().lower())
    if not m or not any(m.groups()):
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def validate_schedule(schedule: str | None) -> str | None:
    """Return the normalised schedule or raise a CatalogError saying which forms are accepted."""
    if schedule is None:
        return None
    text = str(schedule).strip()
    if text.upper() == "CALCULATED":
        return "CALCULATED"
    secs = parse_duration(text)
    if secs is not None:
        if secs <= 0:
            raise CatalogError(f"invalid schedule {schedule!r}: a duration must be positive")
        return text.lower()
    from croniter import croniter

    if croniter.is_valid(text):
        return text
    raise CatalogError(
        f"invalid schedule {schedule!r}: use a duration like '30s' or '1h30m', a cron expression like "
        "'*/5 * * * *' or '@hourly', or 'CALCULATED'"
    )
