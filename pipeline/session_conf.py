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

Most refreshes find the settings as the previous one left them, so :class:`SessionSettings` keeps the last
read and asks the JVM only whether they changed: the session's settings map (``SQLConf``'s own, which
``RuntimeConfig.set``, ``unset`` and SQL ``SET`` all write) rendered by its ``toString``, one round trip of
0.15 ms instead of three (``conf()``, ``getAll``, ``mkString``: 0.45 ms), compared with the rendering seen at
the last read. The rendering is only compared, never parsed (a value may hold its punctuation), less the
value of the one entry Delta rewrites on every commit a session makes
(``spark.databricks.delta.lastCommitVersionInSession``: a source written in the same session would otherwise
change the rendering between any two refreshes). When
it differs, or the map is out of reach (another Spark build), the settings are read as above.
"""

from __future__ import annotations

from typing import Any

#: the prefix of the settings read in one round trip
OWN = "trickle."
_SEP = "\u0001"  # between entries of the joined map: a character no setting holds
_ARROW = " -> "  # Scala's rendering of a map entry: key -> value (no Spark key contains it)
#: the entry of the settings map's rendering (``{k=v, k=v}``) that Delta rewrites on each commit of the session
_VOLATILE = "spark.databricks.delta.lastCommitVersionInSession="


class SessionSettings:
    """The ``trickle.*`` settings of one JVM session, read again only when its settings map changed (see the
    module docstring). One per session, kept by whoever refreshes on it."""

    def __init__(self, jsession: Any) -> None:
        self._jsession = jsession
        self._map: Any = None  # the session's live settings map; False when out of reach
        #: (the map's rendering, the settings read while it showed it); one attribute, so that a thread never
        #: sees one read's rendering with another's settings
        self._kept: tuple[str, dict[str, str]] | None = None

    def own(self) -> dict[str, str]:
        """The session's ``trickle.*`` settings now (do not modify the answer: it is kept)."""
        before, kept = self._rendering(), self._kept
        if before is not None and kept is not None and before == kept[0]:
            return kept[1]
        joined = str(self._jsession.conf().getAll().mkString(_SEP))
        own = dict(e.split(_ARROW, 1) for e in joined.split(_SEP) if e.startswith(OWN) and _ARROW in e)
        # kept only when nothing changed while it was read: a rendering taken before the read and matched
        # after it is the rendering of exactly what was read
        if before is not None and self._rendering() == before:
            self._kept = (before, own)
        return own

    def _rendering(self) -> str | None:
        if self._map is None:
            try:
                self._map = self._jsession.sessionState().conf().settings()
            except Exception:  # noqa: BLE001 - py4j's error for a member this Spark build does not have
                self._map = False
        if self._map is False:
            return None
        try:
            return _stable(str(self._map.toString()))
        except Exception:  # noqa: BLE001 - e.g. the session's JVM went away: read the settings every time
            self._map = False
            return None


def _stable(rendering: str) -> str:
    """The settings map's rendering less the value of its volatile entry (the key stays: only compared). Why
    not a regular expression: it cost 50 us over the ~4 KB rendering, a find 2 us."""
    at = rendering.find(_VOLATILE)
    if at < 0:
        return rendering
    start = end = at + len(_VOLATILE)
    while end < len(rendering) and (rendering[end].isdigit() or rendering[end] == "-"):
        end += 1
    return rendering[:start] + rendering[end:]


class ConfReads:
    """A Spark ``RuntimeConfig`` whose ``get`` asks the JVM once per refresh for every ``trickle.*`` key, and
    once per key and default for any other. ``settings``: the session's kept :class:`SessionSettings`; None
    (Spark Connect, no JVM session here): every key asked for on its own."""

    def __init__(self, conf: Any, settings: SessionSettings | None) -> None:
        self._conf = conf
        self._session = settings
        self._own: dict[str, str] | None = None
        self._seen: dict[tuple[str, Any], Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        if key.startswith(OWN) and self._session is not None:
            return self._settings().get(key, default)
        try:
            return self._seen[(key, default)]
        except KeyError:
            value = self._seen[(key, default)] = self._conf.get(key, default)
            return value

    def _settings(self) -> dict[str, str]:
        if self._own is None:
            assert self._session is not None
            self._own = self._session.own()
        return self._own


def jvm_session(spark: Any) -> Any:
    """The JVM side of a classic PySpark session, or None (Spark Connect has no py4j)."""
    return getattr(spark, "_jsparkSession", None)
