"""Load a spark-trickle conf file (YAML) into a small dataclass.

One file describes a whole pipeline so that ``trickle run CONF`` (or spark-submit) can bring it up
without code: the Spark settings, the warehouse, the stream tables and the runtime knobs. This loader is
deliberately minimal: it checks the shape (known keys, right types) so that a typo fails loudly instead of
being ignored, and resolves relative paths against the conf file's folder so that a conf file works no
matter where the command is started from. Full schema validation (schedules, modes, sources, Kafka) is a
later issue.

Example::

    spark:
      spark.sql.shuffle.partitions: 4
    warehouse: ../warehouse          # relative to this file's folder
    stream_tables:
      - name: order_totals
        query: SELECT customer, SUM(amount) AS total FROM orders GROUP BY customer
        schedule: 30s
        refresh_mode: AUTO
      - name: big_customers
        query_file: sql/big_customers.sql   # relative to this file's folder
    runtime:
      tick_seconds: 1
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

__all__ = [
    "TOP_LEVEL_KEYS",
    "STREAM_TABLE_KEYS",
    "RUNTIME_KEYS",
    "REFRESH_MODES",
    "StreamTableSpec",
    "RuntimeSpec",
    "TrickleConf",
    "load_conf",
]

TOP_LEVEL_KEYS = frozenset({"spark", "warehouse", "stream_tables", "runtime"})
STREAM_TABLE_KEYS = frozenset({"name", "query", "query_file", "schedule", "refresh_mode"})
RUNTIME_KEYS = frozenset({"tick_seconds"})
REFRESH_MODES = ("AUTO", "DIFFERENTIAL", "FULL", "IMMEDIATE")

#: Same defaults as ``StreamTables.create_stream_table`` so that a conf entry and an API call without
#: options mean the same thing.
DEFAULT_SCHEDULE = "1m"
DEFAULT_REFRESH_MODE = "AUTO"
DEFAULT_TICK_SECONDS = 1.0


@dataclass(frozen=True)
class StreamTableSpec:
    """One stream table declared in a conf file (the query text is already read from ``query_file``)."""

    name: str
    query: str
    schedule: str = DEFAULT_SCHEDULE
    refresh_mode: str = DEFAULT_REFRESH_MODE


@dataclass(frozen=True)
class RuntimeSpec:
    """Knobs of the long-running job. ``tick_seconds``: how often the run loop looks for due refreshes."""

    tick_seconds: float = DEFAULT_TICK_SECONDS


@dataclass(frozen=True)
class TrickleConf:
    """A loaded conf file. ``path`` is kept so that later errors can name the file."""

    path: Path
    spark: dict[str, str] = field(default_factory=dict)
    warehouse: Path | None = None
    stream_tables: list[StreamTableSpec] = field(default_factory=list)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)


def load_conf(path: str | os.PathLike[str]) -> TrickleConf:
    """Read and check a conf file; raise :class:`ConfigError` naming the file and the offending key."""
    import yaml  # a light import, but only commands that take a conf file need it

    p = Path(path).expanduser().resolve()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read conf file ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping (keys: {', '.join(sorted(TOP_LEVEL_KEYS))})")
    _reject_unknown(p, data, TOP_LEVEL_KEYS, where="top level")

    spark = _spark_settings(p, data.get("spark"))
    warehouse = _warehouse(p, data.get("warehouse"))
    specs = _stream_tables(p, data.get("stream_tables"))
    runtime = _runtime(p, data.get("runtime"))
    return TrickleConf(path=p, spark=spark, warehouse=warehouse, stream_tables=specs, runtime=runtime)


def _reject_unknown(path: Path, mapping: dict[Any, Any], allowed: frozenset[str], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(
                f"{path}: unknown key {key!r} at {where} (allowed: {', '.join(sorted(allowed))})"
            )


def _spark_settings(path: Path, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: 'spark' must be a mapping of Spark settings, got {type(value).__name__}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, dict | list) or v is None:
            raise ConfigError(f"{path}: spark setting {k!r} must be a scalar value")
        # YAML turns `true` into a bool; Spark wants the lower-case string.
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _warehouse(path: Path, value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: 'warehouse' must be a non-empty path string")
    wh = Path(value).expanduser()
    return (wh if wh.is_absolute() else path.parent / wh).resolve()


def _stream_tables(path: Path, value: Any) -> list[StreamTableSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: 'stream_tables' must be a list of mappings")
    specs: list[StreamTableSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"stream_tables[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: {where} must be a mapping with keys name and query (or query_file)")
        name = item.get("name")
        if isinstance(name, str) and name:
            where = f"stream table {name!r}"
        _reject_unknown(path, item, STREAM_TABLE_KEYS, where=where)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{path}: {where}: 'name' is required and must be a string")
        if name in seen:
            raise ConfigError(f"{path}: stream table {name!r} is declared twice")
        seen.add(name)
        query = _query(path, where, item)
        schedule = item.get("schedule", DEFAULT_SCHEDULE)
        if not isinstance(schedule, str) or not schedule.strip():
            raise ConfigError(f"{path}: {where}: 'schedule' must be a string such as 30s, 5m or 1h30m")
        mode = item.get("refresh_mode", DEFAULT_REFRESH_MODE)
        if not isinstance(mode, str) or mode.upper() not in REFRESH_MODES:
            raise ConfigError(
                f"{path}: {where}: 'refresh_mode' must be one of {', '.join(REFRESH_MODES)}, got {mode!r}"
            )
        specs.append(
            StreamTableSpec(name=name, query=query, schedule=schedule.strip(), refresh_mode=mode.upper())
        )
    return specs


def _query(path: Path, where: str, item: dict[str, Any]) -> str:
    has_query, has_file = "query" in item, "query_file" in item
    if has_query == has_file:
        raise ConfigError(f"{path}: {where}: give exactly one of 'query' and 'query_file'")
    if has_query:
        q = item["query"]
        if not isinstance(q, str) or not q.strip():
            raise ConfigError(f"{path}: {where}: 'query' must be a non-empty SQL string")
        return q.strip()
    f = item["query_file"]
    if not isinstance(f, str) or not f.strip():
        raise ConfigError(f"{path}: {where}: 'query_file' must be a path string")
    qp = Path(f).expanduser()
    qp = qp if qp.is_absolute() else path.parent / qp
    try:
        q = qp.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{path}: {where}: cannot read query_file {f!r} ({exc.strerror or exc})") from exc
    if not q:
        raise ConfigError(f"{path}: {where}: query_file {f!r} is empty")
    return q


def _runtime(path: Path, value: Any) -> RuntimeSpec:
    if value is None:
        return RuntimeSpec()
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: 'runtime' must be a mapping (keys: {', '.join(sorted(RUNTIME_KEYS))})")
    _reject_unknown(path, value, RUNTIME_KEYS, where="runtime")
    tick = value.get("tick_seconds", DEFAULT_TICK_SECONDS)
    if isinstance(tick, bool) or not isinstance(tick, int | float) or tick <= 0:
        raise ConfigError(f"{path}: runtime.tick_seconds must be a positive number, got {tick!r}")
    return RuntimeSpec(tick_seconds=float(tick))
