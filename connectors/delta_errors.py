"""Delta's failures that a refresh acts on, recognised by their class where they enter and raised as
spark-trickle's own exceptions, so that retry and fallback test a type.

Two families matter:

* a commit refused because another writer committed first (Delta's optimistic concurrency): the refresh
  starts again from the winner's frontier (:class:`CommitConflict`);
* a change window that can no longer be read (:class:`ChangesUnreadable`): AUTO recomputes instead; when
  files or commits it needs are gone (VACUUM, log retention: :class:`ChangesGone`) the other modes fail
  naming the source and the versions.

How the class is known: a JVM exception reaches Python as pyspark's ``CapturedException``. For the classes
pyspark knows it keeps the Java exception, whose class, error condition and causes are asked through py4j;
the others become ``UnknownException``, which keeps only ``Throwable.toString()`` (the Java class name, then
the message, whose ``[CONDITION]`` prefix is Spark's error-condition format) and its converted cause; a call
pyspark does not wrap (``toArrow``) raises py4j's ``Py4JJavaError`` with the Java exception attached. All are
read as (class name, condition) pairs along the cause chain; Python exceptions by their own type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

#: Delta's commit conflicts (io.delta.exceptions.*, subclasses of org.apache.spark.sql.delta's classes of the
#: same names; each a DeltaConcurrentModificationException), by simple name in either package
CONFLICT_CLASSES = frozenset({
    "DeltaConcurrentModificationException", "ConcurrentAppendException", "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException", "ConcurrentTransactionException", "MetadataChangedException",
    "ProtocolChangedException", "ConcurrentWriteException"})
DELTA_PACKAGES = ("io.delta.", "org.apache.spark.sql.delta.")
CONFLICT_CONDITIONS = re.compile(r"^(DELTA_CONCURRENT_.*|DELTA_PROTOCOL_CHANGED|DELTA_METADATA_CHANGED)$")

#: a read that needs files or commits no longer there
GONE_CLASSES = frozenset({"java.io.FileNotFoundException", "org.apache.spark.sql.delta.DeltaFileNotFoundException",
                          "io.delta.exceptions.DeltaFileNotFoundException",
                          "org.apache.spark.sql.delta.VersionNotFoundException"})
GONE_CONDITIONS = re.compile(
    r"^(FAILED_READ_FILE\.FILE_NOT_EXIST|DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION|"
    r"DELTA_FILE_NOT_FOUND.*|DELTA_MISSING_CHANGE_DATA|DELTA_VERSIONS_NOT_CONTIGUOUS|"
    r"DELTA_CHANGE_DATA_FILE_NOT_FOUND|DELTA_LOG_FILE_NOT_FOUND.*|DELTA_VERSION_NOT_FOUND|"
    r"DELTA_CDC_READ_NULL_RANGE_BOUNDARY)$")
#: a change feed that cannot be read for the window, files present or not (e.g. CDF off for some version)
UNREADABLE_CONDITIONS = re.compile(r"^(DELTA_CHANGE_DATA_FEED.*|DELTA_MISSING_CHANGE_DATA|.*CHANGE_DATA_FEED.*)$")


class CommitConflict(Exception):
    """Delta refused the commit: another writer committed to the table first. Nothing of this commit landed."""


class ChangesUnreadable(Exception):
    """The change feed of a refresh's window cannot be read."""


class ChangesGone(ChangesUnreadable):
    """Files or commits a read of a table's history needs are gone (VACUUM, log retention)."""


def classified(e: BaseException) -> BaseException | None:
    """``e`` as one of this module's exceptions (chained to it), or None when it is neither family."""
    if isinstance(e, CommitConflict | ChangesUnreadable):
        return e
    if not _foreign(e):  # already spark-trickle's own (whatever its cause): decided where it was raised
        return None
    kinds = list(_kinds(e))
    if any(_delta_class(c) in CONFLICT_CLASSES or CONFLICT_CONDITIONS.match(k or "") for c, k in kinds):
        typed: BaseException = CommitConflict(_first_line(e))
    elif any(c in GONE_CLASSES or GONE_CONDITIONS.match(k or "") for c, k in kinds):
        typed = ChangesGone(_first_line(e))
    elif any(UNREADABLE_CONDITIONS.match(k or "") for _, k in kinds):
        typed = ChangesUnreadable(_first_line(e))
    else:
        return None
    typed.__cause__ = e
    return typed


@contextmanager
def typed() -> Iterator[None]:
    """Re-raise the block's Delta failures of the two families as :class:`CommitConflict` / :class:`ChangesGone`;
    any other exception passes unchanged."""
    try:
        yield
    except Exception as e:
        t = classified(e)
        if t is None or t is e:
            raise
        raise t from e


def _foreign(e: BaseException) -> bool:
    """Raised by Spark (pyspark, py4j) or the file system, not by spark-trickle's own code."""
    return isinstance(e, OSError) or type(e).__module__.split(".", 1)[0] in ("pyspark", "py4j")


def _delta_class(name: str) -> str | None:
    """The simple name of one of Delta's classes (None for any other)."""
    return name.rsplit(".", 1)[-1] if name.startswith(DELTA_PACKAGES) else None


def _kinds(e: BaseException | None, depth: int = 0) -> Iterator[tuple[str, str | None]]:
    """(class name, error condition) of ``e`` and its causes: Java ones for pyspark's captured exceptions,
    the Python class otherwise."""
    if e is None or depth > 8:
        return
    # a JVM exception pyspark kept, or py4j's own error from a call pyspark does not convert (e.g. toArrow)
    origin = getattr(e, "_origin", None) or getattr(e, "java_exception", None)
    if origin is not None:
        yield from _java_kinds(origin)
    elif type(e).__name__ == "UnknownException" and hasattr(e, "_desc"):
        text = str(getattr(e, "_desc", "") or "")
        m = re.match(r"^([\w.$]+)(?::\s*(?:\[([A-Z0-9_.]+)\])?)?", text)
        if m:
            yield m.group(1), m.group(2)
    elif isinstance(e, FileNotFoundError):
        yield "java.io.FileNotFoundException", None
    cause = getattr(e, "_cause", None) or e.__cause__
    if cause is not None and _foreign(cause):
        yield from _kinds(cause, depth + 1)


def _java_kinds(origin: object) -> Iterator[tuple[str, str | None]]:
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    throwable, depth = origin, 0
    while throwable is not None and depth < 8:
        try:
            name = str(throwable.getClass().getName())  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - not a Java object after all
            return
        condition = None
        try:  # as pyspark asks a SparkThrowable (py4j does not reach the interface's default method)
            if jvm is not None and jvm.PythonErrorUtils is not None:
                condition = jvm.PythonErrorUtils.getCondition(throwable)
        except Exception:  # noqa: BLE001 - not a SparkThrowable
            condition = None
        yield name, str(condition) if condition else None
        try:
            throwable, depth = throwable.getCause(), depth + 1  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            return


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:500]
