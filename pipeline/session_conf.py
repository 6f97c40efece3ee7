"""The Spark conf as one refresh reads it.

Why: every ``spark.conf.get`` is a round trip to the JVM through py4j (0.3-0.9 ms idle, more under load),
and one small refresh asks for some 18 ``trickle.*`` keys: 5 ms of a 78 ms refresh in the floor benchmark
(``./dev bench floor``). So the ``trickle.*`` settings are read in one round trip, the first time a refresh
asks for one: the session's settings joined into one string in the JVM (``mkString`` over
``RuntimeConfig.getAll``, 0.5-3 ms for ~4 KB). ``RuntimeConfig.getAll`` from Python is no shortcut: it copies
the map entry by entry over py4j (60 ms). A ``trickle.*`` key has no Spark-registered default, so one the
session does not set is the caller's default, exactly what ``conf.get(key, default)`` answers. Any other key
is asked for once per key and default, as before. A setting changed while a refresh runs applies from the
next refresh on, which is when any setting took effect before too (each is read once, at the point of use).
"""

from __future__ import annotations

from typing import Any

#: the prefix of the settings read in one round trip
OWN = "trickle."
_SEP = "\u0001"  # between entries of the joined map: a character no setting holds
_ARROW = " -> "  # Scala's rendering of a map entry: key -> value (no Spark key contains it)


class ConfReads:
    """A Spark ``RuntimeConfig`` whose ``get`` asks the JVM once per refresh for every ``trickle.*`` key, and
    once per key and default for any other."""

    def __init__(self, conf: Any, jsession: Any = None) -> None:
        self._conf = conf
        self._jsession = jsession  # the JVM's SparkSession; None (Spark Connect) asks per key
        self._own: dict[str, str] | None = None
        self._seen: dict[tuple[str, Any], Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        if key.startswith(OWN) and self._jsession is not None:
            return self._settings().get(key, default)
        try:
            return self._seen[(key, default)]
        except KeyError:
            value = self._seen[(key, default)] = self._conf.get(key, default)
            return value

    def _settings(self) -> dict[str, str]:
        if self._own is None:
            joined = str(self._jsession.conf().getAll().mkString(_SEP))
            self._own = dict(e.split(_ARROW, 1) for e in joined.split(_SEP) if e.startswith(OWN) and _ARROW in e)
        return self._own


def jvm_session(spark: Any) -> Any:
    """The JVM side of a classic PySpark session, or None (Spark Connect has no py4j)."""
    return getattr(spark, "_jsparkSession", None)
