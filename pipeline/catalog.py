"""The durable catalog: stream table definitions and refresh history, as small JSON files.

Layout under the catalog root (default ``<warehouse>/_trickle``)::

    stream_tables/<name>.json        one definition per stream table (atomic replace when its declaration
                                     changes: query, schedule, mode, status, ...)
    state/<name>.0.json, .1.json     its refresh state (frontier, last refresh, AUTO's cost model, errors),
                                     in two slots written in place by turns (see below)
    history/<name>/<ts>-<id>.json    one record per refresh, newest sorts last
    tables/<name>/                   the stream table itself (a Delta table)
    checkpoints/<name>/              Structured Streaming checkpoints of IMMEDIATE stream tables

Why files and not Delta tables: every process (the long-running job, a CLI call) reads and writes them
without a metastore, without a Spark job and without commit conflicts, and a NO_DATA refresh stays a
few file reads. They are still queryable with Spark SQL (``StreamTables.register_catalog_views``). The
source of truth for what a stream table contains is its own Delta log; the catalog may lag one refresh
behind after a crash and is repaired from the log (see :mod:`pipeline.refresh`). A refresh's record and state
are written by a background worker after it returned (:mod:`pipeline.bookkeeping`); every call here for a table
first waits for its queued ones, so this process never reads the catalog behind its own refreshes.

Why the state has slots of its own: a refresh changes its table's state, not its declaration, and replacing
the definition (a new file, then a rename) cost every refresh 0.5-1.3 ms on ext4. A slot is an existing file
written over in place, so a write can be torn by a crash or by a concurrent reader: each slot holds one line
of JSON (a sequence number, the ``created_at`` of the definition it belongs to, the state) and the line's
CRC-32, a reader takes the valid slot with the highest number, and a writer writes over the other one. So a
torn write loses only itself (the state one write back), and a slot left by a dropped table of the same name
is never read (another ``created_at``). On an object store, where an object appears whole, slot 0 alone is
written.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from connectors.storage import LocalStorage, Storage, for_uri, is_local, join, local_path, location
from pipeline import bookkeeping
from pipeline.errors import CatalogError
from pipeline.modes import RefreshMode, TableStatus

#: Refresh-history records kept per stream table (older ones are pruned as new ones are appended).
HISTORY_KEEP = int(os.environ.get("TRICKLE_HISTORY_KEEP", "1000"))
HISTORY_PRUNE_EVERY = 100

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODES = tuple(RefreshMode)
STATUSES = tuple(TableStatus)


@dataclass
class SourceInfo:
    path: str
    kind: str  # "delta" (a base table) or "stream_table"
    #: always None: stream tables store plain rows since issue 16 (nothing to expand); kept so catalog files
    #: that carry the key still load
    mult_col: str | None = None


@dataclass
class StreamTableDef:
    name: str
    query: str
    schedule: str | None
    refresh_mode: str
    path: str
    sources: dict[str, SourceInfo]
    names: list[str]
    types: list[str]
    layout: str  # keyed | bag
    full_reason: str | None = None  # set when the query cannot be differentiated (AUTO → FULL)
    dialect: str = "spark"
    status: str = TableStatus.ACTIVE
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    consecutive_errors: int = 0
    last_error: str | None = None
    frontier: dict[str, int] | None = None
    last_refresh_id: str | None = None
    last_refresh_at: float | None = None
    last_action: str | None = None
    #: set by a refresh whose delta changed nothing (so committed nothing): the table, while still at
    #: ``table_version``, reflects ``frontier`` (see :mod:`pipeline.refresh`); keys: table_version,
    #: refresh_id (of the commit it builds on), frontier, base_frontier, source_ids
    soft_frontier: dict[str, Any] | None = None
    #: what this table's refreshes cost, learned by AUTO (see :class:`pipeline.strategy.CostModel`)
    cost_model: dict[str, Any] | None = None
    #: ``query`` with the views it reads inlined (None: it reads no view); what the engine maintains
    inlined_query: str | None = None
    #: the views inlined, outermost first (their definitions are captured at create)
    views: list[str] = field(default_factory=list)
    #: how floating values are identified in a plain-rows table's ``__row_hash``
    #: (``dvm.context.FLOAT_IDENTITIES``): fixed when the table is declared, since its stored hashes must
    #: match every later delta's; files without the key come from before ``bits37`` and keep ``digits12``
    float_identity: str = "digits12"
    #: why the next refresh must REINITIALIZE (the defining query was altered, see :mod:`pipeline.alter`);
    #: None once a refresh of the current definition replaced the contents
    reinitialize: str | None = None
    #: per base source, the schema this table was last refreshed against and the columns its query reads
    #: (:func:`pipeline.source_schema.record`); None in files from before it, filled by the next refresh
    source_schema: dict[str, Any] | None = None
    #: per stream-table source, how the query reads it: "monotone" or "non-monotone (operator)"
    #: (:mod:`dvm.monotone`), recorded at create and alter; decides which cycles the table may join
    edge_classes: dict[str, str] | None = None
    #: the cycle of stream tables this one is in ("scc:<first member>"; None: none) and its stratum
    #: (:mod:`pipeline.strata`), recomputed on every change to the graph
    scc: str | None = None
    stratum: int | None = None
    #: rounds the last fixpoint evaluation of its cycle took (:mod:`pipeline.cycles`)
    last_fixpoint_iterations: int | None = None

    def soft_frontier_over(self, version: int, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """The soft frontier when it still applies: recorded while the table was at ``version`` and over the
        refresh commit whose record is ``record`` (the same refresh_id); None otherwise. Why both: a table
        another process rewrote to the same version number carries another refresh's record."""
        soft = self.soft_frontier
        if soft is None or soft.get("table_version") != version:
            return None
        return soft if soft.get("refresh_id") == (record or {}).get("refresh_id") else None

    @property
    def maintained_query(self) -> str:
        """The query the engine compiles and runs: over base tables and stream tables only."""
        return self.inlined_query or self.query

    def to_json(self) -> str:
        """The whole definition, its state included (what ``trickle_stream_tables`` shows)."""
        return json.dumps(self._doc(), sort_keys=True, indent=1)

    def _doc(self, only: frozenset[str] | None = None, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        # field by field: ``asdict`` deep-copies every nested dict and list first, which cost each refresh's
        # definition rewrite 0.2 ms; the sources are the only dataclasses inside
        doc = {f.name: getattr(self, f.name) for f in fields(self)
               if (only is None or f.name in only) and f.name not in skip}
        if "sources" in doc:
            doc["sources"] = {k: asdict(v) for k, v in self.sources.items()}
        return doc

    def _split(self) -> tuple[str, str]:
        """(declaration, state) as canonical JSON, to tell which of the two a change touched; ``updated_at``
        is left out: it moves with the declaration."""
        return (json.dumps(self._doc(skip=_NOT_DECLARED), sort_keys=True),
                json.dumps(self._doc(only=STATE_FIELDS), sort_keys=True))

    @classmethod
    def from_json(cls, text: str) -> StreamTableDef:
        doc = json.loads(text)
        doc["sources"] = {k: SourceInfo(**v) for k, v in doc["sources"].items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in known})


#: What a refresh changes: kept in the state slots, not in the definition file (see the module docstring).
#: Definition files from before the slots carry these keys too; a slot, once written, overrides them.
STATE_FIELDS = frozenset({"frontier", "soft_frontier", "cost_model", "last_refresh_id", "last_refresh_at",
                          "last_action", "consecutive_errors", "last_error", "last_fixpoint_iterations"})
_NOT_DECLARED = STATE_FIELDS | {"updated_at"}
_KNOWN = frozenset(StreamTableDef.__dataclass_fields__)


class Catalog:
    """File-backed catalog rooted at a local directory (the embedded default) or at any Hadoop FileSystem URI
    (``s3a://bucket/wh/_trickle``, ...). Its files go through :mod:`connectors.storage`: a definition is
    replaced atomically (a temporary file and a rename on a disk; one PUT on an object store, where an object
    appears whole), and a history record is a new file per refresh, so no two writers ever edit one file.
    ``storage``: how to reach the root (default: from its scheme, a URI through the active Spark session)."""

    def __init__(self, root: str | os.PathLike[str], storage: Storage | None = None) -> None:
        self.root = location(root)
        self.storage = storage or for_uri(self.root)
        if is_local(self.root):
            (self.root / "stream_tables").mkdir(parents=True, exist_ok=True)
            (self.root / "history").mkdir(parents=True, exist_ok=True)
            (self.root / "state").mkdir(parents=True, exist_ok=True)
        self._appended: dict[str, int] = {}
        #: local definition and state files' texts by path, with the file status they were read at (see :meth:`_text`)
        self._texts: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        #: the state slots: two written by turns on a disk, one on a store where a write appears whole
        self._slots = (0, 1) if isinstance(self.storage, LocalStorage) else (0,)
        #: definition texts' canonical (declaration, state), see :meth:`_declared`
        self._canonical: dict[str, tuple[str, str]] = {}

    def _at(self, *parts: str) -> str:
        return join(self.root, *parts)

    def table_path(self, name: str) -> str:
        return self._at("tables", name.lower())

    def checkpoint_path(self, name: str) -> str:
        return self._at("checkpoints", name.lower())

    def _def_file(self, name: str) -> str:
        return self._at("stream_tables", f"{name.lower()}.json")

    # --- definitions ---

    def names(self) -> list[str]:
        return sorted(n[:-len(".json")] for n in self.storage.list(self._at("stream_tables")) if n.endswith(".json"))

    def exists(self, name: str) -> bool:
        return self.storage.exists(self._def_file(name))

    def later(self, name: str, job: Callable[[], None]) -> None:
        """Write ``name``'s bookkeeping after a refresh on the background worker (:mod:`pipeline.bookkeeping`);
        every call of this catalog for ``name`` waits for it first."""
        bookkeeping.later(self._def_file(name), job)

    def settle(self, name: str | None = None) -> None:
        """Wait for ``name``'s queued bookkeeping (every table's when None)."""
        bookkeeping.settle(None if name is None else self._def_file(name))

    def get(self, name: str) -> StreamTableDef:
        self.settle(name)
        text = self._text(self._def_file(name))
        if text is None:
            raise CatalogError(f"stream table {name!r} does not exist")
        d = StreamTableDef.from_json(text)
        slot = self._state(name, d.created_at)
        if slot is not None:
            for k, v in slot[2].items():
                if k in STATE_FIELDS:
                    setattr(d, k, v)
        # what :meth:`put` compares with, as the texts read: the values themselves are the caller's to change
        d.__dict__["_read"] = (text, slot[3] if slot is not None else None)
        return d

    def _declared(self, text: str) -> tuple[str, str]:
        """(declaration, state) of a definition file's text as canonical JSON (see :meth:`StreamTableDef._split`;
        the state: what a file from before the slots carries). Kept by text: a refresh compares with the same
        one every time, and it cost 0.1 ms a time."""
        got = self._canonical.get(text)
        if got is None:
            doc = json.loads(text)
            got = (json.dumps({k: v for k, v in doc.items() if k in _KNOWN and k not in _NOT_DECLARED},
                              sort_keys=True),
                   json.dumps({k: v for k, v in doc.items() if k in STATE_FIELDS}, sort_keys=True))
            if len(self._canonical) > 1024:
                self._canonical.clear()
            self._canonical[text] = got
        return got

    def _slot_file(self, name: str, slot: int) -> str:
        return self._at("state", f"{name.lower()}.{slot}.json")

    def _read_slot(self, name: str, slot: int) -> tuple[int, float, dict[str, Any], str] | None:
        """(sequence number, created_at, state, its line) of a state slot; None when it is missing or torn."""
        try:
            text = self._text(self._slot_file(name, slot))
        except UnicodeDecodeError:  # torn inside a character
            return None
        if text is None:
            return None
        body, _, rest = text.partition("\n")
        crc = rest.split("\n", 1)[0].strip()
        try:
            if int(crc, 16) != zlib.crc32(body.encode("utf-8")):
                return None
            doc = json.loads(body)
            return int(doc["seq"]), float(doc["created_at"]), dict(doc["state"]), body
        except (ValueError, KeyError, TypeError):
            return None

    def _state(self, name: str, created_at: float) -> tuple[int, int, dict[str, Any], str] | None:
        """(slot, sequence number, state, its line) of the newest valid slot of the definition created at
        ``created_at``."""
        best = None
        for slot in self._slots:
            got = self._read_slot(name, slot)
            if got is not None and got[1] == created_at and (best is None or got[0] > best[1]):
                best = (slot, got[0], got[2], got[3])
        return best

    def _put_state(self, d: StreamTableDef) -> str:
        """Write ``d``'s state over the older slot; the line written."""
        slots = self._slots
        newest = self._state(d.name, d.created_at)
        slot = slots[0] if newest is None else slots[(slots.index(newest[0]) + 1) % len(slots)]
        body = json.dumps({"seq": 1 if newest is None else newest[1] + 1, "created_at": d.created_at,
                           "state": d._doc(only=STATE_FIELDS)}, sort_keys=True)
        self.storage.overwrite(self._slot_file(d.name, slot), f"{body}\n{zlib.crc32(body.encode('utf-8')):08x}\n")
        return body

    def _text(self, path: str) -> str | None:
        """A definition or state file's text. A local file's is read again only when its status (inode, size,
        change and modification times) differs from the one it was read at. Why: a refresh reads its definition
        three times (before its lock, under it, and again before recording, to keep a concurrent ALTER), 0.15 ms
        each, and a scheduler polls every table's. Why it is safe: a file is replaced by a rename (a new inode)
        or written in place (new times), so a file with the status seen still holds the text read, except when a
        second write lands
        within the file system's timestamp granularity of the first and reuses its inode and size: a text
        read less than :data:`RACY_NS` after its file's times is therefore not kept (git's "racily clean"
        rule for its index)."""
        local = local_path(path) if isinstance(self.storage, LocalStorage) else None
        if local is None:
            return self.storage.read_text(path)
        kept = self._texts.get(local)
        if kept is not None:
            try:
                if _status(os.stat(local)) == kept[0]:
                    return kept[1]
            except FileNotFoundError:
                return None
        try:
            fd = os.open(local, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:  # the status of the file read, not of whatever the name points to by now
            status = _status(os.fstat(fd))
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        text = b"".join(chunks).decode("utf-8")
        if time.time_ns() - max(status[2], status[3]) > RACY_NS:
            self._texts[local] = (status, text)
        else:
            self._texts.pop(local, None)
        return text

    def all(self) -> list[StreamTableDef]:
        out = []
        for n in self.names():
            try:
                out.append(self.get(n))
            except CatalogError:  # dropped meanwhile by another process
                continue
        return out

    def put(self, d: StreamTableDef) -> None:
        """Write what changed since ``d`` was read (:meth:`get`; all of it for a new one): the state to its
        slot, then the declaration to the definition file. So a refresh leaves a concurrent ALTER's declaration
        alone, and an ALTER leaves the refresh's state alone; and a crash between the two writes leaves the
        declaration as it was (e.g. a REINITIALIZE still due, which is harmless to repeat)."""
        self.settle(d.name)
        text, body = d.__dict__.get("_read") or (None, None)
        seen = self._declared(text) if text is not None else (None, None)
        if body is not None:  # the slot's state, canonical
            seen = (seen[0], json.dumps(json.loads(body)["state"], sort_keys=True))
        now = d._split()
        # a definition file from before the slots holds its state itself, and is rewritten without it
        if now[1] != seen[1] or (body is None and now[0] != seen[0]):
            body = self._put_state(d)
        if now[0] != seen[0]:
            d.updated_at = time.time()
            text = json.dumps(d._doc(skip=STATE_FIELDS), sort_keys=True, indent=1)
            self.storage.write_text(self._def_file(d.name), text)
        d.__dict__["_read"] = (text, body)

    def delete(self, name: str) -> None:
        self.settle(name)
        self.storage.delete(self._def_file(name))
        for slot in self._slots:
            self.storage.delete(self._slot_file(name, slot))

    def dependents(self, name: str) -> list[str]:
        """Stream tables that read ``name`` directly."""
        key = name.lower()
        return [d.name for d in self.all() if key in d.sources]

    # --- history ---

    def history_files(self, name: str) -> list[str]:
        """The names of ``name``'s history records, oldest first (``<epoch microseconds>-<refresh id>.json``,
        so a reader can pick records by time without reading them)."""
        self.settle(name)
        return sorted(n for n in self.storage.list(self._at("history", name.lower())) if n.endswith(".json"))

    def history_record(self, name: str, file: str) -> dict[str, Any] | None:
        """One history record by its file name; None when it was pruned meanwhile or is unreadable."""
        self.settle(name)
        text = self.storage.read_text(self._at("history", name.lower(), file))
        try:
            return json.loads(text) if text is not None else None
        except ValueError:
            return None

    def append_history(self, name: str, record: dict[str, Any]) -> None:
        self.settle(name)
        ts = f"{record.get('started_at', time.time()):017.6f}".replace(".", "")
        self.storage.create(self._at("history", name.lower(), f"{ts}-{record['refresh_id']}.json"),
                            json.dumps(record, sort_keys=True))
        n = self._appended[name.lower()] = self._appended.get(name.lower(), 0) + 1
        if n % HISTORY_PRUNE_EVERY == 1:
            self.prune_history(name)

    def prune_history(self, name: str, keep: int | None = None) -> int:
        """Delete all but the newest ``keep`` records (default ``HISTORY_KEEP``): a table refreshed every
        second records a NO_DATA decision every second, and the history must not grow without bound."""
        keep = HISTORY_KEEP if keep is None else keep
        files = self.history_files(name)
        old = files[:max(0, len(files) - keep)]
        for f in old:
            self.storage.delete(self._at("history", name.lower(), f))
        return len(old)

    def history(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        files = self.history_files(name)[::-1][:limit]
        texts = (self.storage.read_text(self._at("history", name.lower(), f)) for f in files)
        return [json.loads(t) for t in texts if t is not None]

    def has_history(self, name: str, refresh_id: str) -> bool:
        return any(f.endswith(f"-{refresh_id}.json") for f in self.history_files(name))

    def drop_history(self, name: str) -> None:
        self.settle(name)
        self.storage.delete_tree(self._at("history", name.lower()))


#: How long after its last write a definition file's text may be kept by its status: well above any file
#: system's timestamp granularity (ext4 and XFS take a clock tick, at most 10 ms; see :meth:`Catalog._text`)
RACY_NS = 50_000_000


def _status(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


#: Longest stream table name. A name becomes file names (``stream_tables/<name>.json`` and its temporary
#: ``.<name>.json.<32 hex>.tmp``, ``history/<name>/``, ``tables/<name>/``), which most file systems cap at 255
#: bytes, and a table name in Spark's session catalog, which a Hive metastore caps at 128 characters.
NAME_MAX_LENGTH = 128


def validate_name(name: str) -> str:
    """``name`` in the catalog's (lower case) form, or CatalogError saying what a name may be. Checked
    before the name touches a file: a name too long for the file system failed with a raw OSError."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise CatalogError(f"invalid stream table name {name!r}: use letters, digits and underscores, starting "
                           "with a letter or underscore")
    if len(name) > NAME_MAX_LENGTH:
        raise CatalogError(f"invalid stream table name {name[:40]}... ({len(name)} characters): a name may have "
                           f"at most {NAME_MAX_LENGTH} characters (it names files and a Spark table); use a "
                           "shorter one")
    return name.lower()


def validate_mode(mode: str) -> str:
    m = str(mode).upper()
    if m not in MODES:
        raise CatalogError(f"invalid refresh_mode {mode!r}: expected one of {', '.join(MODES)}")
    return RefreshMode(m)
