"""Schedules: durations (``30s``, ``1h30m``), cron expressions (5 or 6 fields, ``@hourly``), CALCULATED."""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache

from pipeline.errors import CatalogError

CALCULATED = "CALCULATED"
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> int | None:
    """Seconds in a duration like ``90s``, ``5m``, ``1h30m``, ``2d``; None when ``text`` is not one."""
    m = _DURATION.match(text.strip().lower())
    if not m or not any(m.groups()):
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


#: the ``@`` forms of cron that croniter and the scheduler both understand
CRON_NICKNAMES = ("@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight")
#: what an error about a schedule lists: every form :func:`normalize_schedule` accepts
SCHEDULE_FORMS = (
    "a positive duration like 30s, 5m, 1h30m or 2d; a cron expression with 5 or 6 fields like "
    f"'*/5 * * * *' or one of {', '.join(CRON_NICKNAMES)}; or CALCULATED"
)


def normalize_schedule(value: object) -> str:
    """The one schedule grammar, shared by the API (:func:`validate_schedule`) and the conf file: the
    normalised schedule (durations lower case, ``CALCULATED`` upper case, cron as written with single spaces),
    or ValueError. Cron has 5 or 6 fields: croniter also accepts 7 (a year), which the scheduler does not."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"invalid schedule {value!r}")
    text = " ".join(value.split())
    if text.upper() == CALCULATED:
        return CALCULATED
    secs = parse_duration(text)
    if secs is not None:
        if secs <= 0:
            raise ValueError(f"invalid schedule {value!r}: a duration must be positive")
        return text.lower()
    if text.startswith("@"):
        if text.lower() in CRON_NICKNAMES:
            return text.lower()
        raise ValueError(f"invalid schedule {value!r}")
    from croniter import croniter

    if len(text.split(" ")) not in (5, 6) or not croniter.is_valid(text):
        raise ValueError(f"invalid schedule {value!r}")
    return text


def validate_schedule(schedule: str | None) -> str | None:
    """Return the normalised schedule (None stays None) or raise a CatalogError saying which forms are
    accepted."""
    if schedule is None:
        return None
    try:
        return normalize_schedule(schedule)
    except ValueError:
        raise CatalogError(f"invalid schedule {schedule!r}: use {SCHEDULE_FORMS}") from None


# --- when is a schedule due -------------------------------------------------------------------------------

DEFAULT_SCHEDULE = "1m"
# Cron intervals are compared from a fixed reference instant so that the answer (and so the CALCULATED
# resolution) is the same in every process and on every run.
_CRON_REFERENCE = datetime(2024, 1, 1, tzinfo=UTC)
_CRON_SAMPLES = 16


def is_calculated(schedule: str | None) -> bool:
    """True for the CALCULATED marker (any case): the table inherits its consumers' schedule."""
    return schedule is not None and schedule.strip().upper() == CALCULATED


def next_due(schedule: str, last: float | None, now: float) -> float:
    """Epoch seconds at which a table with ``schedule``, last refreshed (started) at ``last``, is due again.

    Durations: ``last + seconds``. Cron (UTC, croniter's grammar: 5 fields, 6 with seconds last, ``@hourly``
    ...): the first fire time strictly after ``last``. A table never refreshed is due ``now``: its contents
    are as stale as they can be. The result may lie in the past (a process that was down): the caller then
    refreshes once and the next call, anchored on that refresh, returns a future time — missed slots are
    caught up with one refresh, not replayed.
    """
    if last is None:
        return now
    secs = _duration(schedule, "CALCULATED has no due time of its own: resolve it with effective_schedules() "
                               "first")
    if secs is not None:
        return last + secs
    return _cron_next(schedule.strip(), last)


def _duration(schedule: str, if_calculated: str) -> int | None:
    """The seconds of a duration schedule, None for cron; ValueError for CALCULATED (saying
    ``if_calculated``) and for a duration that is not positive."""
    if is_calculated(schedule):
        raise ValueError(if_calculated)
    secs = parse_duration(schedule)
    if secs is not None and secs <= 0:
        raise ValueError(f"invalid schedule {schedule!r}: a duration must be positive")
    return secs


def _cron_next(expr: str, after: float) -> float:
    from croniter import croniter

    try:
        it = croniter(expr, datetime.fromtimestamp(after, tz=UTC))
    except Exception as e:  # croniter raises several unrelated types for bad input
        raise ValueError(f"invalid schedule {expr!r}: {e}") from None
    return float(it.get_next(float))


@lru_cache(maxsize=256)
def schedule_interval(schedule: str) -> float:
    """Typical seconds between two refreshes: the duration itself, or for cron the median gap between
    consecutive fire times (so ``0 9 * * 1-5`` counts as daily, not as the 3-day weekend gap).

    Used only to rank schedules by tightness; ValueError when ``schedule`` is neither form.
    """
    secs = _duration(schedule, "CALCULATED has no interval of its own")
    if secs is not None:
        return float(secs)
    t = _CRON_REFERENCE.timestamp()
    fires = []
    for _ in range(_CRON_SAMPLES + 1):
        t = _cron_next(schedule.strip(), t)
        fires.append(t)
    return float(statistics.median(b - a for a, b in zip(fires, fires[1:], strict=False)))


def effective_schedules(
    tables: Mapping[str, str | None],
    consumers: Mapping[str, set[str]],
    default: str = DEFAULT_SCHEDULE,
) -> dict[str, str | None]:
    """The schedule each table actually runs on: CALCULATED resolved, everything else unchanged.

    ``tables``: declared schedule per stream table, None for tables the scheduler does not run (IMMEDIATE:
    kept fresh by their streaming query). ``consumers``: the stream tables that read each table directly.

    A CALCULATED table must be at least as fresh as its most demanding reader, so it takes the tightest
    (smallest :func:`schedule_interval`) schedule among its consumers, looking through CALCULATED consumers
    transitively. The winning string is copied as is: a cron consumer makes its upstream fire on the same
    cron instants, so both become due in the same tick and the upstream runs in an earlier wave.

    Choices: an IMMEDIATE consumer counts as ``default`` — it wants its input as fresh as possible, but
    refreshing the upstream every tick would burn the cluster, so it gets the same cadence as an unscheduled
    CALCULATED table; a tighter scheduled consumer still wins. A CALCULATED table with no consumer (or only
    CALCULATED consumers that themselves have none) gets ``default``. Status (SUSPENDED/ERROR) of consumers
    is ignored so that the resolution does not flap while tables are paused. Around a cycle of stream tables
    (a pipeline with ``allow_circular``) a consumer already being resolved adds no candidate, so the
    resolution ends; the cycle refreshes as one unit anyway (:mod:`pipeline.cycles`).
    """
    resolved: dict[str, str] = {}
    visiting: set[str] = set()

    def resolve(name: str) -> str:
        if name in resolved:
            return resolved[name]
        visiting.add(name)
        candidates: list[str] = []
        for c in sorted(consumers.get(name, ())):
            if c not in tables:
                continue
            s = tables[c]
            if s is None:
                candidates.append(default)
            elif is_calculated(s):
                if c not in visiting:  # around a cycle: the member being resolved adds nothing
                    candidates.append(resolve(c))
            else:
                candidates.append(s)
        visiting.discard(name)
        best = min(candidates, key=lambda s: (schedule_interval(s), s)) if candidates else default
        resolved[name] = best
        return best

    return {name: (resolve(name) if is_calculated(s) else s) for name, s in tables.items()}
