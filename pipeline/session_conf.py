"""The Spark conf as one refresh reads it.

Why: every ``spark.conf.get`` is a round trip to the JVM through py4j (0.3-0.9 ms here), and one small
refresh asked 28 times for a dozen keys: 9 ms of a 0.19 s refresh in the floor benchmark (``./dev bench
floor``). Reading each key once per refresh makes that about 4 ms. A setting changed while a refresh runs
applies from the next refresh on, which is when any setting took effect before too (each is read once, at
the point of use). ``RuntimeConfig.getAll`` is no shortcut: it copies the map entry by entry over py4j (60 ms).
"""

from __future__ import annotations

from typing import Any


class ConfReads:
    """A Spark ``RuntimeConfig`` whose ``get`` asks the JVM once per key and default."""

    def __init__(self, conf: Any) -> None:
        self._conf = conf
        self._seen: dict[tuple[str, Any], Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self._seen[(key, default)]
        except KeyError:
            value = self._seen[(key, default)] = self._conf.get(key, default)
            return value
