"""An edited conf file, picked up by a running ``trickle run`` on its next tick.

The run loop asks :class:`ConfFile` every tick whether the file changed (its modification time, then its
content). A changed file is loaded and checked as at start (:func:`pipeline.conf.load_conf`); an invalid
one is reported and the pipeline keeps running as it was. Of a valid one, :func:`changes` picks what is
applied while running: a new query of an existing stream table is an ALTER of its query (checked first; a
bad one leaves the old one running, see :mod:`pipeline.alter`), and so is a new ``dialect`` (the same text
may mean something else in another dialect); a new schedule or refresh mode is an ALTER of those. Everything else (stream tables added or removed, sources, Spark settings, runtime knobs, paths) is
logged as not applied, with what to do, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import TrickleError

if TYPE_CHECKING:
    from pipeline.api import StreamTables
    from pipeline.conf import StreamTableSpec, TrickleConf


class ConfFile:
    """Watches one conf file: :meth:`changed` is True once per edit of its content."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mtime, self._digest = self._signature()

    def _signature(self) -> tuple[int | None, str | None]:
        try:
            mtime = self.path.stat().st_mtime_ns
            return mtime, hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None, None

    def changed(self) -> bool:
        """Whether the content changed since the last call (a touch without an edit is no change)."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return False  # being replaced, or gone: the running pipeline goes on
        if mtime == self._mtime:
            return False
        mtime, digest = self._signature()
        self._mtime = mtime
        if digest is None or digest == self._digest:
            return False
        self._digest = digest
        return True


@dataclass(frozen=True)
class Alter:
    """What an edit changes of one existing stream table (None: unchanged)."""

    name: str
    query: str | None = None
    schedule: str | None = None
    refresh_mode: str | None = None
    #: a new dialect of the query (then ``query`` is set too: a new dialect is a change of the query)
    dialect: str | None = None


def changes(old: TrickleConf, new: TrickleConf, catalog_queries: dict[str, str],
            catalog_dialects: dict[str, str] | None = None) -> tuple[list[Alter], list[str]]:
    """The ALTERs an edit from ``old`` to ``new`` means for the stream tables in the catalog
    (``catalog_queries``: name -> current query; ``catalog_dialects``: name -> its dialect, when known), and
    what of the edit is not applied while running."""
    before = {s.name.lower(): s for s in old.stream_tables}
    alters: list[Alter] = []
    ignored: list[str] = []
    for spec in new.stream_tables:
        key = spec.name.lower()
        was = before.get(key)
        if key not in catalog_queries:
            ignored.append(f"stream table {spec.name} was added: it is created at the next start of trickle run "
                           f"(or now with trickle create {spec.name})")
            continue
        if was is None:
            was = spec  # declared again after a removal: only a changed query is applied
        alter = alter_to(was, spec, catalog_queries[key], (catalog_dialects or {}).get(key))
        if alter is not None:
            alters.append(alter)
    for key, spec in before.items():
        if key not in {s.name.lower() for s in new.stream_tables}:
            ignored.append(f"stream table {spec.name} was removed from the conf file: it is not dropped (drop it "
                           f"with trickle drop {spec.name})")
    for field in ("sources", "spark", "runtime", "warehouse", "checkpoints"):
        if getattr(old, field) != getattr(new, field):
            ignored.append(f"'{field}' changed: not applied while running; restart trickle run to apply it")
    return alters, ignored


def alter_to(was: StreamTableSpec, now: StreamTableSpec, current_query: str,
             current_dialect: str | None = None) -> Alter | None:
    """The ALTER from declaration ``was`` to ``now`` of a table whose catalog holds ``current_query`` written
    in ``current_dialect`` (None: taken to be ``was``'s), or None when nothing changes: a query that differs
    from both, a dialect that differs from both (an ALTER of the query: the same text may mean something else
    in another dialect), a new schedule (None never clears one), a new refresh mode. A query is altered in
    ``now``'s dialect, which the ALTER names when it is not the catalog's."""
    query = now.query if now.query != was.query and now.query.strip() != current_query.strip() else None
    if now.dialect != was.dialect and now.dialect != current_dialect:
        query = now.query
    dialect = now.dialect if query is not None and now.dialect != (current_dialect or was.dialect) else None
    schedule = now.schedule if now.schedule != was.schedule and now.schedule is not None else None
    mode = now.refresh_mode if now.refresh_mode != was.refresh_mode else None
    if query is None and schedule is None and mode is None:
        return None
    return Alter(now.name.lower(), query, schedule, mode, dialect)


def at_start(conf: TrickleConf, catalog: dict[str, tuple[str, str | None, str, str]]) -> list[Alter]:
    """The ALTERs that bring stream tables already in the catalog (``catalog``: name -> (query, schedule,
    refresh mode, dialect)) to the conf file a run starts with. Why: an edit made while no run was alive would
    otherwise be ignored, and the table would go on answering its old query."""
    alters = []
    for spec in conf.stream_tables:
        current = catalog.get(spec.name.lower())
        if current is None:
            continue
        query, schedule, mode, dialect = current
        was = dataclasses.replace(spec, query=query, schedule=schedule, refresh_mode=mode, dialect=dialect)
        alter = alter_to(was, spec, query, dialect)
        if alter is not None:
            alters.append(alter)
    return alters


def apply(st: StreamTables, alters: list[Alter], log: Any) -> None:
    """Run the ALTERs, each on its own: one that fails is logged and leaves its table's old definition."""
    for a in alters:
        try:
            st.alter_stream_table(a.name, query=a.query, schedule=a.schedule, refresh_mode=a.refresh_mode,
                                  dialect=a.dialect)
            log.event("altered", name=a.name, query_changed=a.query is not None, schedule=a.schedule,
                      refresh_mode=a.refresh_mode, **({"dialect": a.dialect} if a.dialect is not None else {}))
        except Exception as e:  # noqa: BLE001 - one bad definition must not stop the pipeline
            log.error(f"conf file: ALTER of stream table {a.name} failed, its old definition keeps running: "
                      f"{type(e).__name__}: {e}")


def reload(st: StreamTables, conf: TrickleConf, watched: ConfFile, log: Any) -> TrickleConf:
    """The conf the run goes on with: ``conf`` when the file did not change or is invalid now, else ``conf``
    with the new file's stream tables, after applying what can be applied (see the module docstring)."""
    if not watched.changed():
        return conf
    from pipeline.conf import load_conf

    try:
        new = load_conf(watched.path)
    except TrickleError as e:
        log.error(f"conf file changed but cannot be used, nothing of it applied (the pipeline runs on as "
                  f"before): {e}")
        return conf
    defs = st.catalog.all()
    alters, ignored = changes(conf, new, {d.name: d.query for d in defs}, {d.name: d.dialect for d in defs})
    log.event("conf_changed", conf=str(watched.path), alters=[a.name for a in alters])
    apply(st, alters, log)
    for note in ignored:
        log.event("conf_not_applied", detail=note)
    return dataclasses.replace(conf, stream_tables=new.stream_tables)
