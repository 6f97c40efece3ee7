"""Read-your-writes for IMMEDIATE stream tables: as close to pg_trickle's in-transaction maintenance (seed
003) as Delta allows.

In PostgreSQL an IMMEDIATE stream table is maintained by triggers *inside* the writing transaction: when
``INSERT`` returns, the stream table already holds the change, and a reader sees both or neither. Delta
has no multi-table transaction and no triggers, so the source commit and the stream table's commit are
two commits. What this module gives instead:

* **write, then wait**: :func:`write` commits to a source and returns only once every IMMEDIATE stream
  table reading that source (directly, or through upstream stream tables) reflects that commit;
  :func:`wait_for` is the second half alone, for a writer that committed some other way (Spark SQL, a
  delta-rs writer, another process).
* **consistent reads**: :func:`consistent_read` returns the stream table at a Delta version whose frontier
  covers every commit its base tables had when the call was made.

"Reflects" is read from the stream table itself, never from a clock: each refresh commit records in its
``userMetadata`` the version of every base table it reflects (``base_frontier``, transitively through
upstream stream tables), and an empty refresh, which commits nothing, records the same in the catalog as
a *soft frontier* valid while the table stays at that version (see :mod:`pipeline.refresh`). So a
:class:`Reflected` pairs a version of the stream table with what that version reflects, and reading the
table ``VERSION AS OF`` it gives exactly those rows, whatever refreshes land meanwhile.

Who applies the change while the writer waits (``refresh``):

* ``None`` (default): this process's streaming query of the table, when it runs one (``StreamTables.start``,
  or ``create_immv``); otherwise the writer refreshes the table itself (a write-through, as a trigger
  would), under the same per-table lock the streaming query's refreshes take.
* ``True``: always the writer itself, as soon as the table is behind.
* ``False``: never the writer: it only waits (the table is maintained by another process, e.g. ``trickle
  run``), up to ``timeout`` seconds, then :class:`~pipeline.errors.ConsistencyTimeout`.

What stays non-transactional is listed in docs/read-your-writes.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from connectors.delta_log import DeltaLog
from dvm import SPARK, quote
from pipeline.catalog import StreamTableDef, validate_name
from pipeline.errors import (
    CatalogError,
    ConsistencyTimeout,
    QueryError,
    RefreshError,
    SourceError,
)
from pipeline.modes import RefreshMode, TableStatus

if TYPE_CHECKING:
    from pipeline.host import StreamTablesHost

#: How long a default wait lasts before it gives up (seconds).
DEFAULT_TIMEOUT_S = 60.0
#: First and longest pause between two looks at a stream table's frontier while waiting (seconds): a look
#: reads a few small log files, so polling stays cheap, and the pause doubles up to the longest.
_FIRST_PAUSE_S = 0.05
_LONGEST_PAUSE_S = 0.5


@dataclass(frozen=True)
class Reflected:
    """A version of a stream table and, per base Delta table (by path), the version it reflects there."""

    version: int | None
    base: dict[str, int] = field(default_factory=dict)

    def behind(self, wanted: dict[str, int]) -> dict[str, int]:
        """The base tables (path -> version reflected, -1 for none) where this is behind ``wanted``."""
        return {p: self.base.get(p, -1) for p, v in wanted.items() if self.base.get(p, -1) < v}


def normalized(path: str) -> str:
    """A table location as the catalog stores it (``SourceInfo.path``): without ``file:``, no trailing
    slash."""
    return (path[len("file:"):] if path.startswith("file:") else path).rstrip("/")


def reflected(st: StreamTablesHost, name: str) -> Reflected:
    """What stream table ``name`` reflects at its latest version. The version is read first and the catalog
    after it, so a soft frontier is used only when it describes that very version."""
    path = st.catalog.get(name).path
    log = DeltaLog(st.spark, path)
    version = log.latest_version()
    if version is None:
        return Reflected(None)
    meta = log.trickle_metadata_at(version)
    if meta is None:  # created without data (initialize=False): reflects nothing yet
        return Reflected(version)
    d = st.catalog.get(name)
    soft = d.soft_frontier_over(version, meta)
    if soft is not None:
        meta = {**meta, **{k: soft[k] for k in ("frontier", "base_frontier") if k in soft}}
    base = meta.get("base_frontier")
    if not base:  # a record from before base frontiers: its direct sources were base tables
        base = {d.sources[k].path: v for k, v in (meta.get("frontier") or {}).items() if k in d.sources}
    return Reflected(version, {normalized(str(p)): int(v) for p, v in base.items()})


def base_paths(st: StreamTablesHost, d: StreamTableDef, seen: set[str] | None = None) -> set[str]:
    """The base Delta tables ``d`` reads, directly or through upstream stream tables (their paths)."""
    seen = set() if seen is None else seen
    seen.add(d.name)
    out: set[str] = set()
    for key, src in d.sources.items():
        if src.kind != "stream_table":
            out.add(normalized(src.path))
        elif key not in seen and st.catalog.exists(key):
            out |= base_paths(st, st.catalog.get(key), seen)
    return out


def readers_of(st: StreamTablesHost, path: str) -> list[StreamTableDef]:
    """The IMMEDIATE stream tables a write to the base table at ``path`` must reach before it returns:
    those reading it directly or transitively, except SUSPENDED ones (not maintained: pg_ivm's
    unpopulated IMMVs, see :mod:`pipeline.pg_ivm`)."""
    return [d for d in st.catalog.all()
            if d.refresh_mode == RefreshMode.IMMEDIATE and d.status != TableStatus.SUSPENDED and path in base_paths(st, d)]


def location(st: StreamTablesHost, table: str) -> str:
    """The location of the Delta table ``table`` (a name, or ``delta.`/path```); SourceError when there is
    none, CatalogError for a stream table (only its refreshes write it). A name a stream table's query uses
    is resolved from the catalog: ``DESCRIBE DETAIL`` is a Spark job, seconds while streaming queries run."""
    key = table.strip().lower()
    if validate_name_ok(key) and st.catalog.exists(key):
        raise CatalogError(f"{table} is a stream table: only its refreshes write it; write to the tables it "
                           "reads")
    for d in st.catalog.all():  # a source of a stream table, named as its query names it: no Spark job
        src = d.sources.get(key)
        if src is not None and src.kind != "stream_table":
            return normalized(src.path)
        for k, src in d.sources.items():  # by path: delta.`/p` is the key delta./p (dvm.parser.table_key)
            if src.kind != "stream_table" and k.startswith("delta.") and key == f"delta.`{k[len('delta.'):]}`".lower():
                return normalized(src.path)
    try:
        detail = st.spark.sql(f"DESCRIBE DETAIL {table}").collect()[0].asDict()
    except Exception as e:  # noqa: BLE001 - AnalysisException/ParseException: no such table
        first = str(e).strip().split("\n")[0][:300]
        raise SourceError(f"cannot write {table}: no Delta table by that name or path ({first})") from None
    if (detail.get("format") or "").lower() != "delta":
        raise SourceError(f"cannot write {table}: it is a {detail.get('format')} table; read-your-writes "
                          "needs a Delta table, whose log records the version written")
    path = normalized(str(detail["location"]))
    if path.startswith(normalized(str(st.catalog.table_path("")))):
        raise CatalogError(f"{table} is the storage of a stream table: only its refreshes write it")
    return path


def validate_name_ok(name: str) -> bool:
    try:
        validate_name(name)
    except CatalogError:
        return False
    return True


def wait_for(st: StreamTablesHost, name: str, source: str, version: int, timeout: float = DEFAULT_TIMEOUT_S,
             refresh: bool | None = None) -> Reflected:
    """Return once stream table ``name`` reflects ``version`` (or later) of its base table ``source`` (a
    name as in its query, or ``delta.`/path```): what a writer calls after its own commit. Returns what the
    table then reflects. CatalogError when ``name`` does not read ``source`` or is SUSPENDED;
    ConsistencyTimeout after ``timeout`` seconds of waiting."""
    key = validate_name(name)
    d = st.catalog.get(key)
    path = _source_path(st, d, source)
    return _until_covered(st, key, {path: int(version)}, timeout, refresh, f"version {version} of {source}")


def write(st: StreamTablesHost, table: str, data: Any, mode: str = "append", timeout: float = DEFAULT_TIMEOUT_S,
          refresh: bool | None = None) -> int:
    """Commit ``data`` to the Delta table ``table``, then wait until every IMMEDIATE stream table reading
    it reflects the commit; return the table's version that holds the write (a later one if another writer
    committed meanwhile, which is covered too).

    ``data``: a DataFrame (appended, or replacing the contents with ``mode="overwrite"``), a SELECT query
    (its rows, likewise), or one INSERT / UPDATE / DELETE / MERGE statement whose target is ``table``.
    The write is committed before any waiting: on a timeout or a failed refresh the error says so, and the
    data is not lost (the stream tables catch up with their next refresh)."""
    if mode not in ("append", "overwrite"):
        raise CatalogError(f"write: invalid mode {mode!r}: use 'append' or 'overwrite'")
    path = location(st, table)
    if isinstance(data, str):
        _write_sql(st, table, path, data, mode)
    elif hasattr(data, "write"):
        data.write.format("delta").mode(mode).save(path)
    else:
        raise TypeError(f"write: data must be a DataFrame or a SQL string, got {type(data).__name__}")
    version = DeltaLog(st.spark, path).latest_version()
    assert version is not None  # it was just written
    deadline = time.monotonic() + timeout
    for d in readers_of(st, path):
        try:
            _until_covered(st, d.name, {path: version}, max(0.0, deadline - time.monotonic()), refresh,
                           f"version {version} of {table}")
        except Exception as e:  # a failed refresh too (a Spark error): the message must say the data is in
            kind = type(e) if isinstance(e, ConsistencyTimeout | CatalogError) else RefreshError
            first = str(e).strip().split("\n")[0][:500]
            raise kind(f"write to {table} is committed (version {version}) but not yet visible in every "
                       f"IMMEDIATE stream table reading it: {first}") from e
    return version


def consistent_read(st: StreamTablesHost, name: str, timeout: float = DEFAULT_TIMEOUT_S,
                    refresh: bool | None = None) -> Any:
    """Stream table ``name`` at a version reflecting every commit its base tables had when this was called:
    a DataFrame pinned to that version (later refreshes do not change it)."""
    d = st.catalog.get(validate_name(name))
    at = consistent_snapshot(st, d.name, timeout, refresh)
    cols = ", ".join(quote(n) for n in d.names)
    return st.spark.sql(f"SELECT {cols} FROM delta.{quote(d.path)} VERSION AS OF {at.version}")


def consistent_snapshot(st: StreamTablesHost, name: str, timeout: float = DEFAULT_TIMEOUT_S,
                        refresh: bool | None = None) -> Reflected:
    """The version of stream table ``name`` :func:`consistent_read` reads, and what it reflects: one covering
    the latest version every base table it reads had when this was called."""
    key = validate_name(name)
    d = st.catalog.get(key)
    wanted: dict[str, int] = {}
    for path in sorted(base_paths(st, d)):
        latest = DeltaLog(st.spark, path).latest_version()
        if latest is None:
            raise SourceError(f"stream table {key} reads the Delta table at {path}, which no longer exists; "
                              "re-create it, or drop the stream table")
        wanted[path] = latest
    return _until_covered(st, key, wanted, timeout, refresh, "the latest versions of its base tables")


# --- internals ---


def _source_path(st: StreamTablesHost, d: StreamTableDef, source: str) -> str:
    """The base table ``source`` names, as one of the paths ``d`` reads; CatalogError when it reads none."""
    paths = base_paths(st, d)
    key = source.strip().lower()
    direct = d.sources.get(key)
    if direct is not None and direct.kind != "stream_table":
        return normalized(direct.path)
    if direct is not None or (validate_name_ok(key) and st.catalog.exists(key)):
        raise CatalogError(f"wait_for: {source} is a stream table; name the base table that was written "
                           f"(stream table {d.name} reads {', '.join(sorted(paths)) or 'none'})")
    for other in st.catalog.all():  # a base table read through an upstream stream table, by its name there
        src = other.sources.get(key)
        if src is not None and src.kind != "stream_table" and normalized(src.path) in paths:
            return normalized(src.path)
    path = location(st, source)
    if path not in paths:
        raise CatalogError(f"stream table {d.name} does not read {source} (it reads {', '.join(sorted(paths))}): "
                           "nothing to wait for")
    return path


def _until_covered(st: StreamTablesHost, name: str, wanted: dict[str, int], timeout: float, refresh: bool | None,
                   what: str) -> Reflected:
    """Wait until ``name`` reflects at least ``wanted`` (base path -> version); see the module docstring
    for who refreshes it meanwhile."""
    deadline = time.monotonic() + timeout
    pause = _FIRST_PAUSE_S
    refreshed = False
    while True:
        now = reflected(st, name)
        behind = now.behind(wanted)
        if not behind:
            return now
        d = st.catalog.get(name)
        if d.status == TableStatus.SUSPENDED:
            raise CatalogError(f"stream table {name} is SUSPENDED: it is not maintained, so it cannot reflect "
                               f"{what}; resume it with alter_stream_table({name!r}, status='ACTIVE') (or "
                               f"refresh_immv({name!r}, True))")
        if refreshed:  # a refresh reads the latest versions: still behind means the log went back
            raise RefreshError(f"stream table {name} was refreshed but reflects {_versions(behind)}, behind "
                               f"{what} ({_versions(wanted)}): was a source dropped and re-created?")
        query = st._queries.get(name)  # noqa: SLF001 - the API's own streaming queries
        if query is not None and not query.isActive and query.exception() is not None:
            raise RefreshError(f"stream table {name}: its IMMEDIATE streaming query stopped: "
                               f"{str(query.exception()).splitlines()[0][:300]}; restart it with start({name!r})")
        if refresh or (refresh is None and (query is None or not query.isActive)):
            st.refresh_stream_table(name)
            refreshed = True
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConsistencyTimeout(
                f"stream table {name} did not reflect {what} within {timeout:g} s: it reflects "
                f"{_versions(behind)}, wanted {_versions(wanted)} (status {d.status}"
                + (f", last error: {d.last_error}" if d.last_error else "")
                + "); is its streaming query or `trickle run` job running? Wait longer (timeout=...), or "
                  "let the caller refresh it (refresh=True)")
        time.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE_S)


def _versions(by_path: dict[str, int]) -> str:
    return ", ".join(f"{p} @ {'nothing' if v < 0 else v}" for p, v in sorted(by_path.items()))


def _write_sql(st: StreamTablesHost, table: str, path: str, text: str, mode: str) -> None:
    """Run a SELECT as an insert of its rows into ``table``, or a DML statement that writes ``table``."""
    statement = text.strip().rstrip(";")
    try:
        tree = sqlglot.parse_one(statement, read=SPARK)
    except Exception as e:  # noqa: BLE001 - sqlglot's ParseError and friends
        raise QueryError(f"write: cannot parse {statement[:80]!r}: {str(e).splitlines()[0][:200]}") from None
    if isinstance(tree, exp.Query):
        verb = "INSERT OVERWRITE" if mode == "overwrite" else "INSERT INTO"
        st.spark.sql(f"{verb} delta.{quote(path)} {statement}")
        return
    if not isinstance(tree, exp.Insert | exp.Update | exp.Delete | exp.Merge):
        raise QueryError(f"write: expected a SELECT query or one INSERT / UPDATE / DELETE / MERGE statement, got "
                         f"{statement[:80]!r}")
    target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    name = "?"
    if isinstance(target, exp.Table):
        bare = target.copy()
        bare.set("alias", None)  # MERGE INTO t AS x / UPDATE t x: the table's name only
        name = bare.sql(dialect=SPARK)
    if name == "?" or location(st, name) != path:
        raise QueryError(f"write: the statement writes {name}, not {table}: read-your-writes waits for the "
                         "stream tables reading the table written")
    st.spark.sql(statement)
