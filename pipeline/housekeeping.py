"""Delta housekeeping owned by spark-trickle: what keeps a long-running pipeline from decaying.

Every refresh commits to its stream table and every Kafka batch to its mirror, so without care a week of
refreshes leaves tens of thousands of commit files in each ``_delta_log`` and as many small data files in
each table. :func:`maintain` runs, per stream table and mirror (never on a user's own source tables):

0. **purge**: once deletion vectors (:mod:`connectors.deletion_vectors`) mark more than ``purgeDeletedShare``
   of a table's stored rows, the marked files are rewritten without them (Spark's ``REORG ... APPLY
   (PURGE)``, a ``dataChange=false`` commit);
1. **compaction**: the table's live data files are rewritten into few (delta-rs ``optimize.compact``, a
   ``dataChange=false`` commit that readers and change feeds skip) once there are more than
   ``compactMinFiles`` of them;
2. **log checkpoint**: a checkpoint once ``checkpointEvery`` commits were made since the last one, so
   readers (and :meth:`connectors.delta_log.DeltaLog.latest_version`) start from it;
3. **VACUUM that respects frontiers**: data and ``_change_data`` files no version still needed references
   are deleted. A version is *needed* while a stream table's frontier (the committed one, in its own log, and
   the catalog's) or an IMMEDIATE table's streaming offset still reads from it: its snapshot's files, and
   every file its change feed up to the latest version reads, are kept. Files younger than ``retainHours``
   are kept whatever their state (other readers' time travel, writes still in flight);
4. **log cleanup**: commit and checkpoint files before the newest checkpoint at or below the oldest needed
   version (and the table's own last refresh commit, which holds its frontier) are deleted once older than
   ``logRetainHours``. Listing ``_delta_log`` then stays as long as a few checkpoint intervals.

Refresh history is pruned by the catalog itself (:data:`pipeline.catalog.HISTORY_KEEP`).

The runtime calls :func:`maintain` every ``trickle.housekeeping.intervalSeconds`` (see
:class:`Housekeeper`); ``trickle maintain`` runs it once. Each stream table is maintained under its refresh
lock, so compaction never races a refresh of this process; a commit race with another process fails one
side cleanly (a refresh retries from the winner's frontier; compaction is skipped until the next round).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from connectors import log_checkpoints
from connectors.delta_log import _CHECKPOINT, _COMMIT, DeltaLog
from connectors.storage import LocalStorage, Storage, for_uri, join
from pipeline.modes import RefreshMode

if TYPE_CHECKING:
    from pipeline.api import StreamTables

#: a commit's checksum file
_CRC = re.compile(r"^(\d{20})\.crc$")

PREFIX = "trickle.housekeeping."
#: Spark conf keys (``spark.conf`` or a conf file's Spark settings) and their defaults
DEFAULTS: dict[str, float] = {
    "intervalSeconds": 600.0,  # how often the runtime maintains every table (0 disables)
    "checkpointEvery": 10,  # commits since the last checkpoint before housekeeping writes one
    "compactMinFiles": 16,  # live data files above which a table is compacted
    "retainHours": 168.0,  # data files younger than this are never vacuumed (Delta's default: 7 days)
    "logRetainHours": 720.0,  # log files younger than this are never removed (Delta's default: 30 days)
    # share of a table's stored rows marked deleted by deletion vectors above which the marked files are
    # rewritten without them (Spark's REORG ... APPLY (PURGE)); readers skip marked rows but still read them
    "purgeDeletedShare": 0.2,
}


@dataclass(frozen=True)
class Settings:
    interval_seconds: float = DEFAULTS["intervalSeconds"]
    checkpoint_every: int = int(DEFAULTS["checkpointEvery"])
    compact_min_files: int = int(DEFAULTS["compactMinFiles"])
    retain_hours: float = DEFAULTS["retainHours"]
    log_retain_hours: float = DEFAULTS["logRetainHours"]
    purge_deleted_share: float = DEFAULTS["purgeDeletedShare"]

    @classmethod
    def from_conf(cls, spark: Any, **overrides: Any) -> Settings:
        """The Spark conf's ``trickle.housekeeping.*`` values over the defaults, then ``overrides``."""
        def get(key: str) -> float:
            raw = spark.conf.get(PREFIX + key, None)
            try:
                return float(raw) if raw is not None else DEFAULTS[key]
            except ValueError:
                raise ValueError(f"Spark conf {PREFIX}{key}={raw!r} is not a number") from None

        s = cls(get("intervalSeconds"), int(get("checkpointEvery")), int(get("compactMinFiles")),
                get("retainHours"), get("logRetainHours"), get("purgeDeletedShare"))
        return cls(**{**asdict(s), **{k: v for k, v in overrides.items() if v is not None}})


@dataclass
class TableReport:
    """What housekeeping did to one table."""

    path: str
    name: str | None = None
    needed_from: int | None = None  # the oldest version a frontier still reads (None: none reads it)
    purged_rows: int | None = None  # rows marked deleted that a purge dropped from the files, when it ran
    compacted: dict[str, Any] | None = None  # delta-rs' metrics, when it compacted
    checkpoint: int | None = None  # the version checkpointed, when it wrote one
    vacuumed_files: int = 0
    vacuumed_bytes: int = 0
    log_files_removed: int = 0
    log_from: int | None = None  # the oldest commit the log keeps after cleanup
    skipped: list[str] = field(default_factory=list)  # steps not done, and why

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


# --- what frontiers need ---

def needed_versions(st: StreamTables) -> tuple[dict[str, int], dict[str, int]]:
    """(path -> the oldest version of that table a stream table still reads from, stream table path -> the
    version of its own newest refresh commit). A source's needed version is the smallest of every reader's
    committed frontier (from its log), its catalog frontier and soft frontier, and, for IMMEDIATE tables, the
    source version its streaming query's last offset starts after."""
    needed: dict[str, int] = {}
    own: dict[str, int] = {}

    def need(path: str, version: int) -> None:
        key = path.rstrip("/")
        needed[key] = min(version, needed.get(key, version))

    for d in st.catalog.all():
        log = DeltaLog(st.spark, d.path)
        committed = log.last_trickle_commit()
        if committed is not None:
            own[d.path.rstrip("/")] = committed[0]
        soft = d.soft_frontier_over(log.latest_version(), committed[1]) if committed is not None else None
        if soft is not None:
            # the soft frontier holds (see pipeline.refresh): the next refresh reads from it, not from the
            # committed one, and housekeeping keeps it valid across its compaction commits
            frontiers = [soft.get("frontier")]
        else:
            frontiers = [committed[1].get("frontier") if committed else None, (d.soft_frontier or {}).get("frontier")]
        for frontier in frontiers:
            for key, version in (frontier or {}).items():
                if key in d.sources:
                    need(d.sources[key].path, int(version))
        if d.refresh_mode == RefreshMode.IMMEDIATE:
            for path, version in streaming_offsets(st, d).items():
                need(path, version)
    return needed, own


def streaming_offsets(st: StreamTables, d: Any) -> dict[str, int]:
    """Source path -> the version an IMMEDIATE table's streaming query reads next from (its newest offset
    log entry, matched to the sources by Delta table id): its next micro-batch reads that version's change
    feed, which may be older than the frontier its last refresh reached."""
    folder = join(st.catalog.checkpoint_path(d.name), "offsets")
    storage = for_uri(folder, st.spark)
    batches = sorted((int(n) for n in storage.list(folder) if n.isdigit()), reverse=True)
    if not batches:
        return {}
    ids: dict[str, str] = {}
    for src in d.sources.values():
        log = DeltaLog(st.spark, src.path)
        latest = log.latest_version()
        meta = log.metadata(latest) if latest is not None else None
        if meta is not None:
            ids[meta.id] = src.path
    out: dict[str, int] = {}
    for line in (storage.read_text(join(folder, str(batches[0]))) or "").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("reservoirId") in ids and "reservoirVersion" in doc:
            path = ids[doc["reservoirId"]]
            out[path] = min(int(doc["reservoirVersion"]) - 1, out.get(path, 1 << 62))
    return out


# --- files, on the local disk or through Hadoop's FileSystem ---

def _delete(storage: Storage, root: str, rel: str) -> None:
    """Delete ``rel`` below ``root`` and, on a local disk, the checksum file Hadoop wrote beside it."""
    storage.delete(join(root, rel))
    if isinstance(storage, LocalStorage):
        storage.delete(join(root, _hadoop_crc(rel)))


def _hadoop_crc(rel: str) -> str:
    """The checksum file Hadoop's local file system writes beside ``rel`` (``dir/.name.crc``)."""
    head, _, name = rel.rpartition("/")
    return f"{head}/.{name}.crc" if head else f".{name}.crc"


def _is_data_file(rel: str) -> bool:
    """A file VACUUM may consider: data files and change data files. Not the log, not deletion vectors
    (kept: their names are encoded in the add actions), not hidden or checksum files."""
    parts = rel.split("/")
    if parts[0] == "_delta_log" or parts[-1].startswith((".", "_")) or parts[-1].startswith("deletion_vector_"):
        return False
    return all(not p.startswith((".", "_")) or p == "_change_data" for p in parts[:-1])


# --- the steps ---

def _live_files(path: str, version: int | None = None) -> set[str]:
    from deltalake import DeltaTable

    dt = DeltaTable(path, version=version) if version is not None else DeltaTable(path)
    return {unquote(p) for p in dt.get_add_actions(flatten=True).column("path").to_pylist()}


def _referenced_since(log: DeltaLog, after: int, latest: int) -> set[str]:
    """Files the commits of (``after``, ``latest``] add, remove or write change data to: what the change
    feed of that window reads."""
    out = set()
    for v in range(after + 1, latest + 1):
        for a in log.actions(v):
            for kind in ("add", "remove", "cdc"):
                if kind in a and (a[kind] or {}).get("path"):
                    out.add(unquote(a[kind]["path"]))
    return out


def live_file_count(path: str) -> int:
    """The data files of the table's latest version."""
    from deltalake import DeltaTable

    return len(DeltaTable(path).get_add_actions(flatten=True))


def purge(spark: Any, path: str, report: TableReport, settings: Settings) -> None:
    """Rewrite the files whose rows deletion vectors mark (see :mod:`connectors.deletion_vectors`) once more
    than ``purgeDeletedShare`` of the table's stored rows are marked: a ``dataChange=false`` commit by Spark,
    which change feeds skip. delta-rs' compaction only bin-packs small files, so a large marked file would
    otherwise keep its deleted rows for good."""
    from connectors import deletion_vectors

    log = DeltaLog(spark, path)
    latest = log.latest_version()
    if latest is None or "deletionVectors" not in ((log.protocol(latest) or {}).get("writerFeatures") or []):
        return
    files = deletion_vectors.live_files(log, latest).values()
    stored = sum(int(json.loads(a["stats"]).get("numRecords", 0)) for a in files if a.get("stats"))
    marked = sum(int((a.get("deletionVector") or {}).get("cardinality", 0)) for a in files)
    if stored and marked > settings.purge_deleted_share * stored:
        spark.sql(f"REORG TABLE delta.`{path}` APPLY (PURGE)")
        report.purged_rows = marked


def compact(path: str, report: TableReport, settings: Settings) -> None:
    from deltalake import DeltaTable

    if live_file_count(path) <= settings.compact_min_files:
        return
    report.compacted = dict(DeltaTable(path).optimize.compact())


def checkpoint(spark: Any, path: str, report: TableReport, settings: Settings) -> None:
    from deltalake import DeltaTable

    log = DeltaLog(spark, path)
    latest = log.latest_version()
    text = log._read("_last_checkpoint")
    last = int(json.loads(text)["version"]) if text else -1
    if latest is not None and latest - last >= settings.checkpoint_every:
        DeltaTable(path).create_checkpoint()
        report.checkpoint = latest


def vacuum(spark: Any, path: str, needed: int | None, report: TableReport, settings: Settings,
           now: float) -> None:
    """Delete the data and change data files no needed version reads (see the module docstring)."""
    log = DeltaLog(spark, path)
    latest = log.latest_version()
    if latest is None:
        return
    keep = _live_files(path, latest)
    if needed is not None and needed < latest:
        if not log.actions(needed + 1):
            report.skipped.append(f"vacuum: commit {needed + 1}, which a frontier reads, is already gone")
            return
        keep |= _live_files(path, needed) | _referenced_since(log, needed, latest)
    cutoff = now - settings.retain_hours * 3600
    files = for_uri(path, spark)
    for rel, mtime, size in list(files.walk(path)):
        if mtime < cutoff and _is_data_file(rel) and rel not in keep:
            _delete(files, path, rel)
            report.vacuumed_files += 1
            report.vacuumed_bytes += size


def clean_log(spark: Any, path: str, floor: int | None, report: TableReport, settings: Settings,
              now: float) -> None:
    """Delete commit, checksum and checkpoint files before the newest checkpoint at or below ``floor`` (the
    oldest version anything still reads; None: the latest version)."""
    log = DeltaLog(spark, path)
    latest = log.latest_version()
    if latest is None:
        return
    floor = latest if floor is None else min(floor, latest)
    names = log._list()
    checkpoints = sorted({int(m.group(1)) for n in names if (m := _CHECKPOINT.match(n))})
    usable = [c for c in checkpoints if c <= floor]
    if not usable:  # nothing to clean yet: the next round's checkpoint will be below the floor
        return
    base = usable[-1]
    cutoff = now - settings.log_retain_hours * 3600
    files = for_uri(log.log_dir, spark)
    for rel, mtime, _size in list(files.walk(log.log_dir)):
        if "/" in rel or mtime >= cutoff:
            continue
        m = _COMMIT.match(rel) or _CHECKPOINT.match(rel) or _CRC.match(rel)
        if m and int(m.group(1)) < base:
            _delete(files, log.log_dir, rel)
            report.log_files_removed += 1
    report.log_from = base


def maintain_table(spark: Any, path: str, needed: int | None, floor: int | None, settings: Settings,
                   name: str | None = None, now: float | None = None) -> TableReport:
    """All five steps on one table; a step that fails is reported and skipped, the others still run."""
    report = TableReport(path, name, needed)
    now = time.time() if now is None else now
    log_checkpoints.settle(path)  # the table's log is housekeeping's alone while it runs
    steps = [("purge", lambda: purge(spark, path, report, settings)),
             ("compaction", lambda: compact(path, report, settings)),
             ("checkpoint", lambda: checkpoint(spark, path, report, settings)),
             ("vacuum", lambda: vacuum(spark, path, needed, report, settings, now)),
             ("log cleanup", lambda: clean_log(spark, path, floor, report, settings, now))]
    for what, step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - housekeeping must never stop the pipeline; say what failed
            first = (str(e).strip().splitlines() or [""])[0][:300]
            report.skipped.append(f"{what}: {type(e).__name__}: {first}")
    return report


def maintain(st: StreamTables, names: Iterable[str] | None = None, mirrors: Iterable[str] = (),
             settings: Settings | None = None, sources: bool = False) -> list[TableReport]:
    """Maintain the stream tables ``names`` (default: all) and the mirror tables at the paths ``mirrors``;
    with ``sources``, also the base Delta tables the stream tables read (a user's own tables: only when the
    user hands their upkeep to spark-trickle). A stream table is maintained under its refresh lock."""
    settings = settings or Settings.from_conf(st.spark)
    needed, own = needed_versions(st)
    wanted = None if names is None else {n.lower() for n in names}
    reports = []
    for d in st.catalog.all():
        if wanted is not None and d.name not in wanted:
            continue
        key = d.path.rstrip("/")
        floor = _floor(key, needed.get(key), own.get(key), st.spark)
        with st.refresher.lock(d.name):
            before = DeltaLog(st.spark, d.path).latest_version()
            report = maintain_table(st.spark, d.path, needed.get(key), floor, settings, d.name)
            if report.compacted:
                _carry_soft_frontier(st, d.name, before)
            reports.append(report)
    base = {src.path.rstrip("/") for d in st.catalog.all() for src in d.sources.values()
            if src.kind != "stream_table"} if sources else set()
    for path in [*mirrors, *sorted(base - {m.rstrip("/") for m in mirrors})]:
        key = path.rstrip("/")
        reports.append(maintain_table(st.spark, path, needed.get(key), needed.get(key), settings))
    return reports


def _carry_soft_frontier(st: StreamTables, name: str, before: int | None) -> None:
    """A compaction commit changes no row: a soft frontier valid at ``before`` stays valid after it (else
    the next refresh would re-read every window since the table's last refresh commit)."""
    d = st.catalog.get(name)
    soft = d.soft_frontier
    if soft is not None and before is not None and soft.get("table_version") == before:
        d.soft_frontier = {**soft, "table_version": DeltaLog(st.spark, d.path).latest_version()}
        st.catalog.put(d)


def _floor(path: str, needed: int | None, own: int | None, spark: Any) -> int | None:
    """The oldest commit a stream table's log must keep: its own newest refresh commit (its frontier) and the
    refresh commit that holds what its readers' needed version reflects (read by downstream refreshes)."""
    floors = [v for v in (own,) if v is not None]
    if needed is not None:
        log = DeltaLog(spark, path)
        at = next((v for v in log._versions_back(needed) if log.trickle_metadata(v) is not None), None)
        floors.append(at if at is not None else needed)
    return min(floors) if floors else None


def describe(r: TableReport) -> str:
    """One line per table for the CLI."""
    done = []
    if r.purged_rows:
        done.append(f"purged {r.purged_rows} rows marked deleted")
    if r.compacted:
        done.append(f"compacted {r.compacted.get('numFilesRemoved', '?')} files into "
                    f"{r.compacted.get('numFilesAdded', '?')}")
    if r.checkpoint is not None:
        done.append(f"checkpoint at version {r.checkpoint}")
    if r.vacuumed_files:
        done.append(f"vacuumed {r.vacuumed_files} files ({r.vacuumed_bytes} bytes)")
    if r.log_files_removed:
        done.append(f"removed {r.log_files_removed} log files (the log starts at version {r.log_from})")
    kept = f"; versions from {r.needed_from} kept for frontiers" if r.needed_from is not None else ""
    skipped = f"; skipped: {'; '.join(r.skipped)}" if r.skipped else ""
    return f"{r.name or r.path}: {', '.join(done) or 'nothing to do'}{kept}{skipped}"


def mirror_paths(spark: Any, conf: Any) -> list[str]:
    """The locations of a conf file's Kafka mirrors (tables spark-trickle writes, so maintains); none without
    a conf file or before the pipeline created them."""
    if conf is None:
        return []
    from pipeline.conf import KafkaSourceSpec

    out = []
    for spec in conf.sources:
        if isinstance(spec, KafkaSourceSpec) and spark.catalog.tableExists(spec.name):
            from connectors.kafka_mirror import _location

            out.append(_location(spark, spec.name))
    return out


class Housekeeper:
    """Runs :func:`maintain` from the runtime's loop every ``intervalSeconds`` (the first time one interval
    after start)."""

    def __init__(self, st: StreamTables, mirrors: Any = (), settings: Settings | None = None) -> None:
        self.st = st
        self.mirrors = mirrors  # a list, or a callable giving the mirror paths when it runs
        self.settings = settings or Settings.from_conf(st.spark)
        self.next_at = time.time() + self.settings.interval_seconds

    def due(self, now: float | None = None) -> bool:
        return self.settings.interval_seconds > 0 and (time.time() if now is None else now) >= self.next_at

    def run_if_due(self) -> list[TableReport] | None:
        if not self.due():
            return None
        mirrors = self.mirrors() if callable(self.mirrors) else self.mirrors
        try:
            return maintain(self.st, mirrors=mirrors, settings=self.settings)
        finally:
            self.next_at = time.time() + self.settings.interval_seconds
