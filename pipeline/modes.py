"""The words a stream table's life is told in: refresh modes, refresh actions, table and record statuses.

One home for them, so that the catalog, the conf, the CLI, the scheduler, the runtime and the monitor
spell each word once. They are string enums: a member equals the string the catalog and the history store
(``RefreshMode.AUTO == "AUTO"``), ``json.dumps`` writes it as that string, and a file read back yields plain
strings that still compare equal, so the files keep their format and old files still load.
"""

from __future__ import annotations

from enum import StrEnum


class RefreshMode(StrEnum):
    """How a stream table is kept fresh (``refresh_mode``)."""

    #: DIFFERENTIAL when the query can be differentiated and the change is small enough, else FULL
    AUTO = "AUTO"
    #: apply the sources' changes as a delta; an error when the query cannot be differentiated
    DIFFERENTIAL = "DIFFERENTIAL"
    #: recompute the whole query at every refresh
    FULL = "FULL"
    #: DIFFERENTIAL, driven by a streaming query over the sources' change feeds instead of a schedule
    IMMEDIATE = "IMMEDIATE"


#: the modes that must apply changes as a delta (no fallback to FULL)
DELTA_ONLY_MODES = (RefreshMode.DIFFERENTIAL, RefreshMode.IMMEDIATE)


class RefreshAction(StrEnum):
    """What one refresh did (a history record's ``action``, a table's ``last_action``)."""

    NO_DATA = "NO_DATA"
    DIFFERENTIAL = "DIFFERENTIAL"
    FULL = "FULL"
    REINITIALIZE = "REINITIALIZE"
    #: a record of a refresh that failed before it chose an action (the monitor's name for it)
    ERROR = "ERROR"
    #: the run loop's record of a refresh it did not attempt (see :class:`pipeline.scheduler.Scheduler`)
    SKIP = "SKIP"


#: the actions that wrote the stream table
WRITING_ACTIONS = (RefreshAction.DIFFERENTIAL, RefreshAction.FULL, RefreshAction.REINITIALIZE)
#: the actions a successful refresh records
REFRESH_ACTIONS = (RefreshAction.NO_DATA, *WRITING_ACTIONS)


class TableStatus(StrEnum):
    """Whether the scheduler refreshes a stream table (a definition's ``status``)."""

    ACTIVE = "ACTIVE"
    #: paused by a user (``alter_stream_table(status="SUSPENDED")``)
    SUSPENDED = "SUSPENDED"
    #: paused by the scheduler after too many failures in a row, or by a change retrying cannot mend
    ERROR = "ERROR"


#: the statuses a user may set; ERROR is set only by the system
USER_STATUSES = (TableStatus.ACTIVE, TableStatus.SUSPENDED)


class RecordStatus(StrEnum):
    """How one refresh attempt ended (a history record's ``status``)."""

    OK = "OK"
    ERROR = "ERROR"
    #: the run loop did not attempt a due refresh (an upstream failed or is paused, an unusable schedule)
    SKIPPED = "SKIPPED"
    #: the run loop scheduled another attempt after a failure (the failure has its own ERROR record)
    RETRY = "RETRY"


__all__ = ["RefreshMode", "RefreshAction", "TableStatus", "RecordStatus", "DELTA_ONLY_MODES",
           "WRITING_ACTIONS", "REFRESH_ACTIONS", "USER_STATUSES"]
