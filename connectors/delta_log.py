"""Metadata reads straight from a Delta table's transaction log, with no Spark job.

A refresh that finds nothing new must cost milliseconds, so "what is the latest version of this source" and
"which frontier does this stream table's last commit record" are answered by listing and reading the
``_delta_log`` JSON files through Hadoop's FileSystem (any storage Spark can reach), never by a query.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from connectors.storage import local_path, read_local, read_whole

_COMMIT = re.compile(r"^(\d{20})\.json$")
#: classic, multi-part and V2 checkpoints: ``<v>.checkpoint.parquet``, ``<v>.checkpoint.<i>.<n>.parquet``,
#: ``<v>.checkpoint.<uuid>.(json|parquet)``
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.[^.]+)*\.(parquet|json)$")
TRICKLE_KEY = "trickle"


@dataclass(frozen=True)
class TableMeta:
    """A table's identity and shape at one version: the Delta ``metaData`` action.

    ``id`` changes when the table is dropped and re-created under the same name or path, which a version
    number alone cannot tell apart from ordinary commits."""

    id: str
    schema_json: str
    partition_columns: tuple[str, ...] = ()
    configuration: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_action(cls, m: dict[str, Any]) -> TableMeta:
        return cls(str(m.get("id")), str(m.get("schemaString") or ""), tuple(m.get("partitionColumns") or ()),
                   dict(m.get("configuration") or {}))

    def columns(self) -> list[tuple[str, str]]:
        """(name, Spark simple type) per column, as ``spark.read.load(path).schema`` would give them."""
        return list(_columns(self.schema_json))


@functools.lru_cache(maxsize=256)
def _columns(schema_json: str) -> tuple[tuple[str, str], ...]:
    """:meth:`TableMeta.columns` of one schema. Kept: a refresh asks five times (plans, schema checks, the
    local engine's types), and building PySpark's types from the JSON each time cost 0.05 ms a call."""
    from pyspark.sql.types import StructType  # pure Python: no JVM

    schema = StructType.fromJson(json.loads(schema_json))
    return tuple((f.name, f.dataType.simpleString()) for f in schema.fields)


@dataclass(frozen=True)
class SourceWindow:
    """What one source's log says about the change window (``pre``, ``post``] of a refresh, read in one pass.

    ``schema_changed_at``: the first version in the window whose ``metaData`` changed the schema or the
    partitioning (same table id); ``truncated_at``: the first that emptied the table; ``insert_only``: every
    commit in the window only added rows; ``sizes``: bytes of data files at ``pre`` / ``post`` where the
    checksum file says; ``change_bytes``: bytes of the files the window's Change Data Feed reads (its
    ``cdc`` files where a commit wrote them, else the data files it added and removed): what the delta job
    reads of this source's changes, the refresh's estimate of how large its delta can be."""

    pre: int | None
    post: int
    meta: TableMeta | None
    schema_changed_at: int | None = None
    truncated_at: int | None = None
    insert_only: bool = False
    sizes: dict[int, int] = field(default_factory=dict)
    change_bytes: int = 0
    #: the first version in the window whose commit file is gone (log retention after a checkpoint): the
    #: window's changes can no longer be read, and a differential refresh over it would miss them
    commit_gone_at: int | None = None


#: path -> the newest ``protocol`` action seen: commits without a checksum file (delta-rs writes none) and
#: without a protocol action keep the table's protocol
_PROTOCOL_SEEN: dict[str, tuple[int, dict[str, Any]]] = {}

#: path -> the latest version a probe found: the next probe starts there (see :meth:`DeltaLog.latest_version`)
_LATEST_SEEN: dict[str, int] = {}

#: path -> (version, signature of that commit file, meta): a table's metadata at a version it was last
#: read at, so the next refresh reads only the commits since (see :meth:`DeltaLog.metadata`)
_META_SEEN: dict[str, tuple[int, Any, TableMeta]] = {}


class _Reads:
    """What one refresh learnt of immutable log files (see :func:`one_read_per_refresh`), by (log folder, file
    name) or (log folder, version): their bytes, their signatures, their parsed actions and the metadata at a
    version. Why the parsed answers too: a refresh asks the same few commits for their actions and metadata
    from several places (nine times each for a small aggregate), and parsing them again cost 0.4 ms a refresh."""

    __slots__ = ("files", "signatures", "actions", "metadata")

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes | None] = {}
        self.signatures: dict[tuple[str, str], Any] = {}
        self.actions: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.metadata: dict[tuple[str, int], TableMeta] = {}


#: the log files read inside :func:`one_read_per_refresh`
_FETCHED: ContextVar[_Reads | None] = ContextVar("trickle_delta_log_fetched", default=None)

#: log files that never change once written: commits, checksums and checkpoints (not ``_last_checkpoint``)
_IMMUTABLE = re.compile(r"^\d{20}\.(json|crc|checkpoint.*)$")


@contextmanager
def one_read_per_refresh() -> Iterator[None]:
    """Inside the block, each commit, checksum and checkpoint file of any table's log is fetched from storage at
    most once, however many :class:`DeltaLog` objects ask for it.

    Why: one refresh asks a log many questions from different places (the frontier, the window, the decision,
    the context, the commit path, the driver-side readers), each with the log object it has at hand. Those
    files never change once written, so the first answer is the answer. A missing commit or checkpoint file is
    not remembered (it may be written meanwhile), a missing checksum file is (delta-rs writes none, and every
    reader of one falls back to the commits when it is missing), and ``_last_checkpoint`` is never kept: it is
    rewritten. Their signatures (a missing file's is not kept), their actions and a version's metadata are
    kept the same way; callers must not modify an answer (they never did: each is read, never written)."""
    token = _FETCHED.set(_FETCHED.get() or _Reads())
    try:
        yield
    finally:
        _FETCHED.reset(token)


class DeltaLog:
    """Reads one table's log. Local paths use the OS directly; others go through Hadoop's FileSystem."""

    def __init__(self, spark: Any, path: str) -> None:
        self.spark = spark
        self.path = path
        self.log_dir = path.rstrip("/") + "/_delta_log"
        self._actions: dict[int, list[dict[str, Any]]] = {}
        self._gone: set[int] = set()  # versions whose commit file was found missing by :meth:`actions`

    def _fs(self, name: str) -> tuple[Any, Any]:
        jvm = self.spark._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(self.log_dir + "/" + name)
        return hpath.getFileSystem(self.spark._jsc.hadoopConfiguration()), hpath

    def _signature(self, name: str) -> Any:
        """Size and modification time of a log file, None when missing: commit files are never rewritten,
        so a different signature at the same version means the table was replaced."""
        reads = _FETCHED.get()
        key = (self.log_dir, name)
        if reads is not None and (kept := reads.signatures.get(key)) is not None:
            return kept
        local = local_path(self.log_dir)
        if local is not None:
            try:
                st = os.stat(os.path.join(local, name))
            except FileNotFoundError:
                return None
            sig: Any = (st.st_size, st.st_mtime_ns)
        else:
            fs, hpath = self._fs(name)
            if not fs.exists(hpath):
                return None
            status = fs.getFileStatus(hpath)
            sig = (status.getLen(), status.getModificationTime())
        if reads is not None and _IMMUTABLE.match(name):
            reads.signatures[key] = sig
        return sig

    def commit_signature(self, version: int) -> Any:
        """The signature (see :meth:`_signature`) of the commit file of ``version``: the same signature, the
        same commit; None when the file is gone."""
        return self._signature(f"{version:020d}.json")

    def _read_bytes(self, name: str) -> bytes | None:
        reads = _FETCHED.get()
        if reads is None or not _IMMUTABLE.match(name):
            return self._fetch(name)
        fetched = reads.files
        key = (self.log_dir, name)
        if key not in fetched:
            data = self._fetch(name)
            if data is None and not name.endswith(".crc"):
                return None
            fetched[key] = data
        return fetched[key]

    def _fetch(self, name: str) -> bytes | None:
        """One log file's bytes from storage (None when missing): the only read of a log file's contents."""
        local = local_path(self.log_dir)
        if local is not None:
            return read_local(os.path.join(local, name))
        fs, hpath = self._fs(name)
        # _last_checkpoint is rewritten in place, and log cleanup deletes: see read_whole
        return read_whole(fs, hpath, lambda stream: bytes(self.spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)))

    def _list(self) -> list[str]:
        local = local_path(self.log_dir)
        if local is not None:
            try:
                return os.listdir(local)
            except FileNotFoundError:
                return []
        jvm = self.spark._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(self.log_dir)
        fs = hpath.getFileSystem(self.spark._jsc.hadoopConfiguration())
        if not fs.exists(hpath):
            return []
        return [s.getPath().getName() for s in fs.listStatus(hpath)]

    def _read(self, name: str) -> str | None:
        data = self._read_bytes(name)
        return data.decode("utf-8") if data is not None else None

    def versions(self) -> list[int]:
        """Every commit version in the log, by listing it (grows with the log: not for refreshes)."""
        return sorted(int(m.group(1)) for n in self._list() if (m := _COMMIT.match(n)))

    def latest_version(self) -> int | None:
        """The newest committed version, or None when the path holds no Delta table. Found by probing the
        commit files after the version this process last saw, else after the last checkpoint
        (``_last_checkpoint``), so the cost follows the commits since then, not the length of the log; a log
        without a checkpoint is listed."""
        start = _LATEST_SEEN.get(self.path)
        if start is None or self.commit_signature(start) is None:
            cp = self._read("_last_checkpoint")
            start = int(json.loads(cp)["version"]) if cp else None
        if start is None:
            vs = self.versions()
            latest = vs[-1] if vs else None
        else:
            latest = start
            while self.commit_signature(latest + 1) is not None:
                latest += 1
        if latest is not None:
            _LATEST_SEEN[self.path] = latest
        return latest

    def _versions_back(self, upto: int | None = None) -> Iterator[int]:
        """Commit versions from ``upto`` (default: the latest) down to the oldest commit file still in the
        log, newest first, without listing it."""
        latest = self.latest_version()
        v = latest if upto is None else min(upto, -1 if latest is None else latest)  # version 0 is a version
        while v is not None and v >= 0 and self.actions(v):
            yield v
            v -= 1

    def table_size(self, version: int) -> int | None:
        """Bytes of data files at ``version``, from the commit's checksum file; None when it has none."""
        text = self._read(f"{version:020d}.crc")
        if not text:
            return None
        try:
            return int(json.loads(text)["tableSizeBytes"])
        except (ValueError, KeyError, TypeError):
            return None

    def protocol(self, version: int) -> dict[str, Any] | None:
        """The table's ``protocol`` action at ``version``: from the newest checksum file or protocol action
        at or below it (only Spark writes checksum files; delta-rs commits keep the protocol they found),
        looking back at most 50 versions; None when not found."""
        seen = _PROTOCOL_SEEN.get(self.path)
        if seen is not None and seen[0] <= version and version - seen[0] <= 50 and all(
                "protocol" not in a for v in range(seen[0] + 1, version + 1) for a in self.actions(v)):
            # no protocol action since: the same protocol, now known at ``version`` (so a table committed to
            # only by delta-rs, which writes no checksum file, is not looked up afresh after 50 commits)
            _PROTOCOL_SEEN[self.path] = (version, seen[1])
            return seen[1]
        names: set[str] | None = None
        listed = False
        for v in range(version, max(-1, version - 50), -1):
            found = None
            text = self._read(f"{v:020d}.crc")
            if text:
                try:
                    found = json.loads(text).get("protocol")
                except ValueError:
                    found = None
            if not isinstance(found, dict):
                found = next((a["protocol"] for a in self.actions(v) if "protocol" in a), None)
            if not isinstance(found, dict):
                # a checkpoint holds the protocol as of its version (delta-rs writes one every
                # delta.checkpointInterval commits, 100 by default, and no checksum files)
                names = names if names is not None else self._checkpoint_names()
                found = self._checkpoint_action(v, names, "protocol")
                if not isinstance(found, dict) and not listed and not self.actions(v):  # below the log's
                    names, listed = set(self._list()), True  # first commit: an older checkpoint may hold it
                    found = self._checkpoint_action(v, names, "protocol")
            if isinstance(found, dict):
                _PROTOCOL_SEEN[self.path] = (v, found)
                return found
        return None

    def _checkpoint_names(self) -> set[str]:
        """The file names of the last checkpoint, from ``_last_checkpoint`` (no listing); the whole log's names
        when it has none."""
        text = self._read("_last_checkpoint")
        if not text:
            return set(self._list())
        doc = json.loads(text)
        v, parts = int(doc["version"]), doc.get("parts")
        if (doc.get("v2Checkpoint") or {}).get("path"):
            return {str(doc["v2Checkpoint"]["path"]).rsplit("/", 1)[-1]}
        if parts:
            return {f"{v:020d}.checkpoint.{i:010d}.{int(parts):010d}.parquet" for i in range(1, int(parts) + 1)}
        return {f"{v:020d}.checkpoint.parquet"}

    def actions(self, version: int) -> list[dict[str, Any]]:
        """The actions of one commit (read once per :class:`DeltaLog`: commit files never change)."""
        if version not in self._actions:
            reads = _FETCHED.get()
            kept = reads.actions.get((self.log_dir, version)) if reads is not None else None
            if kept is None:
                text = self._read(f"{version:020d}.json")
                if text is None:
                    self._gone.add(version)
                kept = [json.loads(line) for line in (text or "").splitlines() if line.strip()]
                if reads is not None and text is not None:
                    reads.actions[(self.log_dir, version)] = kept
            self._actions[version] = kept
        return self._actions[version]

    # --- identity and shape ---

    def metadata(self, version: int) -> TableMeta | None:
        """The table's ``metaData`` at ``version``: from that version's checksum file when Spark wrote one
        (one small read), else from the commits since the last version this process saw (their signature
        proves the log is still the same table's), else by walking back to the newest ``metaData`` action or
        checkpoint. None when the log has no such version."""
        reads = _FETCHED.get()
        if reads is None:
            return self._read_metadata(version)
        key = (self.log_dir, version)
        found = reads.metadata.get(key)
        if found is None and (found := self._read_metadata(version)) is not None:
            reads.metadata[key] = found
        return found

    def _read_metadata(self, version: int) -> TableMeta | None:
        crc = self._read(f"{version:020d}.crc")
        if crc:
            try:
                found = TableMeta.from_action(json.loads(crc)["metadata"])
            except (ValueError, KeyError, TypeError):
                found = None
            if found is not None:
                return self._remember(version, found)
        seen = _META_SEEN.get(self.path)
        if seen is not None and seen[0] <= version and self._signature(f"{seen[0]:020d}.json") == seen[1]:
            for v in range(version, seen[0], -1):
                m = self._meta_action(v)
                if m is not None:
                    return self._remember(version, m)
            return self._remember(version, seen[2])
        names, listed = self._checkpoint_names(), False
        for v in range(version, -1, -1):
            m = self._meta_action(v)
            if m is None:
                m = self._checkpoint_meta(v, names)
            if m is None and not listed and not self.actions(v):  # below the log's first commit: an older
                names, listed = set(self._list()), True  # checkpoint than the last one may hold it
                m = self._checkpoint_meta(v, names)
            if m is not None:
                return self._remember(version, m)
        return None

    def _remember(self, version: int, meta: TableMeta) -> TableMeta:
        sig = self._signature(f"{version:020d}.json")
        if sig is not None:
            _META_SEEN[self.path] = (version, sig, meta)
        return meta

    def _meta_action(self, version: int) -> TableMeta | None:
        for a in self.actions(version):
            if "metaData" in a:
                return TableMeta.from_action(a["metaData"])
        return None

    def _checkpoint_meta(self, version: int, names: set[str]) -> TableMeta | None:
        found = self._checkpoint_action(version, names, "metaData")
        return TableMeta.from_action(found) if found is not None else None

    def _checkpoint_action(self, version: int, names: set[str], kind: str) -> dict[str, Any] | None:
        """The first ``kind`` action (``metaData``, ``protocol``) of the checkpoint at ``version`` (any of its
        parts, JSON or Parquet; fields a Parquet checkpoint leaves null dropped); None without one."""
        for name in sorted(n for n in names if (m := _CHECKPOINT.match(n)) and int(m.group(1)) == version):
            data = self._read_bytes(name)
            if data is None:
                continue
            if name.endswith(".json"):
                for line in data.decode("utf-8").splitlines():
                    if line.strip() and kind in (a := json.loads(line)):
                        return dict(a[kind])
                continue
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pq.read_table(pa.BufferReader(data), columns=[kind])
            for m in table.column(kind).to_pylist():
                if m:
                    return {k: v for k, v in m.items() if v is not None}
        return None

    def window(self, pre: int | None, post: int) -> SourceWindow:
        """One pass over the commits of (``pre``, ``post``]: see :class:`SourceWindow`. With ``pre`` None (a FULL
        refresh) only the metadata at ``post`` is read."""
        meta = self.metadata(post)
        if pre is None or post <= pre:
            return SourceWindow(pre, post, meta)
        schema_changed = truncated = None
        insert_only = True
        change_bytes = 0
        for v in range(pre + 1, post + 1):
            actions = self.actions(v)
            if not actions:
                insert_only = False
            # cdc files are always marked dataChange=false (the protocol's rule: they are not table data)
            cdc = [a["cdc"] or {} for a in actions if "cdc" in a]
            files = [f for a in actions for f in [a.get("add") or a.get("remove")]
                     if f and f.get("dataChange", True)] if not cdc else cdc
            change_bytes += sum(int(f.get("size") or 0) for f in files)
            for a in actions:
                if "metaData" in a:
                    insert_only = False
                    m = TableMeta.from_action(a["metaData"])
                    if schema_changed is None and self._shape_changed(pre, v, m):
                        schema_changed = v
                elif "remove" in a and (a["remove"] or {}).get("dataChange", True):
                    # a cdc file alone does not end it: rows are changed or deleted only by removing the
                    # file that holds them (a deletion vector re-adds it), and delta-rs' MERGE writes cdc
                    # files for its inserts too
                    insert_only = False
            if truncated is None and _is_truncate(self.commit_info(v)):
                truncated = v
        sizes = {v: size for v in (pre, post) if (size := self.table_size(v)) is not None}
        gone = min((v for v in self._gone if pre < v <= post), default=None)
        return SourceWindow(pre, post, meta, schema_changed, truncated, insert_only, sizes, change_bytes, gone)

    def _shape_changed(self, pre: int, version: int, m: TableMeta) -> bool:
        """Whether the ``metaData`` committed at ``version`` changes the schema or partitioning relative to
        the table at ``pre`` (a properties-only change, e.g. SET TBLPROPERTIES, does not)."""
        before = self.metadata(version - 1) if version - 1 >= pre else None
        if before is None:
            return True
        return (before.schema_json, before.partition_columns) != (m.schema_json, m.partition_columns)

    def commit_info(self, version: int) -> dict[str, Any]:
        for a in self.actions(version):
            if "commitInfo" in a:
                return a["commitInfo"]
        return {}

    def trickle_metadata(self, version: int) -> dict[str, Any] | None:
        """The refresh record spark-trickle wrote into this commit's ``userMetadata``, if any."""
        meta = self.commit_info(version).get("userMetadata")
        if not meta:
            return None
        try:
            doc = json.loads(meta)
        except ValueError:
            return None
        return doc.get(TRICKLE_KEY) if isinstance(doc, dict) else None

    def mirror_batch(self, version: int) -> dict[str, Any] | None:
        """What a Kafka mirror's batch recorded in this commit (:mod:`connectors.kafka_mirror`): its source,
        batch id, truncate flag and transaction marks. Spark's MERGE writes it at the top of
        ``userMetadata``, delta-rs inside the ``trickle`` record."""
        meta = self.commit_info(version).get("userMetadata")
        if not meta or "trickle_mirror" not in meta:
            return None
        try:
            doc = json.loads(meta)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        return doc.get("trickle_mirror") or (doc.get(TRICKLE_KEY) or {}).get("trickle_mirror")

    def trickle_metadata_at(self, version: int) -> dict[str, Any] | None:
        """The refresh record the table's contents reflect at ``version``: that commit's, or the newest
        one before it (a commit without a record, e.g. a user's OPTIMIZE, changes no contents)."""
        for v in self._versions_back(version):
            meta = self.trickle_metadata(v)
            if meta is not None:
                return meta
        return None

    def truncated_between(self, after: int, upto: int) -> int | None:
        """The first version in (``after``, ``upto``] that emptied the table: a mirror batch that applied a
        CDC truncate (recorded by :mod:`connectors.kafka_mirror`), ``TRUNCATE TABLE``, or a ``DELETE``
        without a condition. Reads only commit infos (small local JSON files, no Spark job)."""
        for v in range(after + 1, upto + 1):
            if _is_truncate(self.commit_info(v)):
                return v
        return None

    def marked_without_changes_between(self, after: int, upto: int) -> int | None:
        """The first version in (``after``, ``upto``] whose change only its deletion vectors tell: a
        data-changing ``add`` or ``remove`` with a vector and no change-data (``cdc``) file in the commit, as
        Spark's DELETE writes it; None when there is none. A missing commit file counts (what it did cannot be
        checked). Reads only the commit files (no Spark job; see :mod:`connectors.vector_reads`)."""
        for v in range(after + 1, upto + 1):
            actions = self.actions(v)
            if not actions:
                return v
            if any("cdc" in a for a in actions):
                continue
            if any(f.get("deletionVector") and f.get("dataChange", True)
                   for a in actions for f in [a.get("add") or a.get("remove")] if f):
                return v
        return None

    def last_trickle_commit(self) -> tuple[int, dict[str, Any]] | None:
        """The newest commit carrying a refresh record: the frontier the table's contents reflect."""
        for v in self._versions_back():
            meta = self.trickle_metadata(v)
            if meta is not None:
                return v, meta
        return None


def _is_truncate(info: dict[str, Any]) -> bool:
    """A commit that emptied the table: ``TRUNCATE TABLE``, a ``DELETE`` without a condition, or a mirror
    batch that applied a CDC truncate (recorded by :mod:`connectors.kafka_mirror`)."""
    op = str(info.get("operation", "")).upper()
    if op == "TRUNCATE" or (op == "DELETE" and (info.get("operationParameters") or {}).get("predicate")
                            in ("[]", '["true"]', "", None)):
        return True
    meta = info.get("userMetadata")
    if meta and "truncate" in meta:
        try:
            doc = json.loads(meta)
        except ValueError:
            return False
        return isinstance(doc, dict) and bool((doc.get("trickle_mirror") or {}).get("truncate"))
    return False
