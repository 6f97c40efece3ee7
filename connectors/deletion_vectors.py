"""Commits a plain-rows stream table's change rows with deletion vectors: deleted rows are marked, not rewritten.

The rule: a change deletes some stored copies (found by ``__row_hash``, see :mod:`pipeline.plain_rows`) and
inserts new rows. Copy-on-write (delta-rs' MERGE, Spark's MERGE without deletion vectors) rewrites every data
file that holds a deleted row, and scattered deletions touch every file, so the commit costs as much as
rewriting the table: at 10M stored rows, nearly all of a refresh that deletes a few dozen rows. Here each touched
file keeps its bytes and gets a *deletion vector* (Delta's ``deletionVectors`` table feature) listing the
positions of its deleted rows; what the commit costs is a binary search of each live file's sorted hashes
(:mod:`connectors.hash_index`, built from one read of its ``__row_hash`` column the first time), a file of
inserted rows, a change-data file and the commit.

Why written here: delta-rs reads deletion vectors but writes none (delta-io/delta-rs#4512), and Spark's MERGE
with them still joins the whole table to find the matched rows (figures in docs/BENCHMARKS.md, "Deletions
marked, not rewritten").

One commit carries everything a Spark MERGE would, so readers and the frontier protocol cannot tell the
difference:

* ``remove`` + ``add`` of each touched file (same path, the union of its old and new vector; its statistics
  kept but marked not tight, as Spark does), or only a ``remove`` when every row of the file is gone;
* ``add`` of one file with the inserted rows (statistics: row and null counts, bounds of integer and date
  columns);
* ``cdc``: one change-data file with every deleted row (values from the netted delta) and inserted row, so the
  change feed is read from it and never derived from vectors (an insert-only commit has no vector and no
  ``cdc``: its added file is the change feed, and downstream tables keep their insert-only rules);
* the refresh record as ``userMetadata`` and the idempotent-transaction marker, as delta-rs and Spark commits
  of a refresh carry them (see :mod:`connectors.delta_sink`).

The commit file is created by put-if-absent (a hard link of a finished temporary file), so it lands at
exactly the version after the one the refresh read, or not at all (:class:`~connectors.delta_rs.CommitFailed`).
That is atomic on a local file system only; :func:`unusable` refuses other stores. The writing itself
(files, statistics, the commit file) is :mod:`connectors.own_commit`'s.

Formats (Delta protocol, "Deletion Vector Format"): a vector is a ``RoaringBitmapArray`` (magic 1681511377,
then the number of 32-bit bitmaps, then each one's high-32-bit key and its portable Roaring serialization,
little-endian); a vector file is a version byte (1), then per vector its size (big-endian int32), the bytes
and their CRC-32; an ``add`` names the file by a Z85-encoded UUID (storage type ``u``) and the vector's
offset (of its size field) and size.
"""

from __future__ import annotations

import array
import functools
import json
import os
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from connectors import hash_index, own_commit
from connectors.delta_log import DeltaLog
from connectors.delta_rs import CommitFailed
from connectors.storage import local_path, write_new

_MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
ROW_ID, ROW_HASH = "__row_id", "__row_hash"
FILE, POSITION = "__file", "__position"


# --- formats ---

def z85(data: bytes) -> str:
    """Z85 text of ``data`` (a multiple of 4 bytes), the encoding Delta uses for a vector file's UUID."""
    out = []
    for i in range(0, len(data), 4):
        n = int.from_bytes(data[i:i + 4], "big")
        out.append("".join(_Z85[(n // 85 ** k) % 85] for k in range(4, -1, -1)))
    return "".join(out)


def unz85(text: str) -> bytes:
    out = bytearray()
    for i in range(0, len(text), 5):
        n = 0
        for c in text[i:i + 5]:
            n = n * 85 + _Z85.index(c)
        out += n.to_bytes(4, "big")
    return bytes(out)


def _split(positions: np.ndarray) -> dict[int, Any]:
    """The row positions as one 32-bit roaring bitmap per high key (one, below 4G rows), built from the array's
    buffer rather than a Python list: a vector of a million positions costs milliseconds, not a second."""
    from pyroaring import BitMap

    positions = np.asarray(positions, dtype=np.uint64)
    if not len(positions):
        return {}
    if int(positions.max()) < 1 << 32:
        return {0: BitMap(array.array("I", positions.astype(np.uint32).tobytes()))}
    keys = positions >> np.uint64(32)
    return {int(key): BitMap(array.array("I", (positions[keys == key] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
                                        .tobytes())) for key in np.unique(keys)}


def _serialize(bitmaps: dict[int, Any]) -> bytes:
    """A ``RoaringBitmapArray`` of bitmaps by high key."""
    parts = [struct.pack("<iq", _MAGIC, len(bitmaps))]
    for key in sorted(bitmaps):
        bitmap = bitmaps[key]
        bitmap.run_optimize()
        parts.append(struct.pack("<i", key) + bitmap.serialize())
    return b"".join(parts)


def _bitmaps(data: bytes) -> dict[int, Any]:
    """The bitmaps of a ``RoaringBitmapArray`` by high key."""
    from pyroaring import BitMap

    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != _MAGIC:
        raise ValueError(f"not a deletion vector (magic {magic})")
    at, out = 12, {}
    for i in range(count):
        (key,) = struct.unpack_from("<i", data, at)
        bitmap = BitMap.deserialize(data[at + 4:])
        if i + 1 < count:  # where the next one starts (a table under 2^32 rows per file has one bitmap)
            at += 4 + len(bitmap.serialize())
        out[key] = bitmap
    return out


def _positions(bitmaps: dict[int, Any]) -> np.ndarray:
    out = [np.frombuffer(bitmaps[key].to_array(), dtype=np.uint32).astype(np.uint64) | (np.uint64(key) << np.uint64(32))
           for key in sorted(bitmaps)]
    return np.concatenate(out) if out else np.empty(0, dtype=np.uint64)


def encode(positions: np.ndarray) -> bytes:
    """A ``RoaringBitmapArray`` of the row positions (any order, no duplicates needed)."""
    return _serialize(_split(positions))


def decode(data: bytes) -> np.ndarray:
    """The row positions of a ``RoaringBitmapArray``, ascending."""
    return _positions(_bitmaps(data))


def with_marked(old: bytes | None, fresh: np.ndarray) -> tuple[bytes, int]:
    """The vector marking ``old``'s positions (a ``RoaringBitmapArray``, None for none) and ``fresh``'s, and how
    many it marks. A union of roaring bitmaps: a refresh pays for the positions it marks, not again for every
    position marked since the file was written (decoding, merging and re-encoding them as arrays grew with each
    refresh: 0.1 s at the first refresh of a 10M-row table, 1.7 s at the fifteenth)."""
    bitmaps = _bitmaps(old) if old is not None else {}
    for key, bitmap in _split(fresh).items():
        if key in bitmaps:
            bitmaps[key] |= bitmap
        else:
            bitmaps[key] = bitmap
    return _serialize(bitmaps), sum(len(b) for b in bitmaps.values())


def marked_among(root: str, descriptor: dict[str, Any], positions: np.ndarray) -> np.ndarray:
    """Whether each of ``positions`` is already marked in the vector ``descriptor`` names: an intersection of
    bitmaps, whose cost follows the positions asked about rather than the vector's size."""
    vector = _bitmaps(vector_bytes(root, descriptor))
    common = {key: bitmap & vector[key] for key, bitmap in _split(positions).items() if key in vector}
    return np.isin(np.asarray(positions, dtype=np.uint64), _positions(common))


@functools.lru_cache(maxsize=4096)
def _vector_path(root: str, storage_type: str, stored: str) -> str:
    """:func:`_vector_file`, absolute, kept by its inputs: a refresh asks again for the vectors of the files it
    searches and marks, and decoding the name each time cost 30 us a vector (0.2 ms of a 40 ms refresh of the
    floor's filter table, session 59)."""
    return os.path.abspath(_vector_file(root, {"storageType": storage_type, "pathOrInlineDv": stored}))


def _vector_file(root: str, descriptor: dict[str, Any]) -> str:
    stored = str(descriptor["pathOrInlineDv"])
    if descriptor["storageType"] == "p":  # an absolute URI, percent-encoded as Spark writes and reads it
        local = local_path(stored)
        if local is None:
            raise ValueError(f"deletion vector outside the local file system: {stored}")
        return unquote(local) if stored.startswith("file:") else local
    prefix, encoded = stored[:-20], stored[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=unz85(encoded))}.bin"
    return os.path.join(root, prefix, name) if prefix else os.path.join(root, name)


#: vectors this process wrote or read, by file and offset, newest last: a vector file never changes after it is
#: written and its name is unique. Why: a refresh reads each touched file's vector twice (are the found rows
#: already deleted, then the union with the new positions), and the previous refresh usually wrote it: the
#: reads cost 2.2 ms of a 65 ms refresh of the floor's filter table (docs/BENCHMARKS.md, session 45)
_VECTORS: OrderedDict[tuple[str, int], bytes] = OrderedDict()
_VECTORS_LOCK = threading.Lock()
_VECTORS_KEPT = 64 << 20
_vectors_bytes = 0


def _keep_vector(key: tuple[str, int], data: bytes) -> None:
    global _vectors_bytes
    with _VECTORS_LOCK:
        if key in _VECTORS:
            _VECTORS.move_to_end(key)
            return
        _VECTORS[key] = data
        _vectors_bytes += len(data)
        while _vectors_bytes > _VECTORS_KEPT:
            _vectors_bytes -= len(_VECTORS.popitem(last=False)[1])


def vector_bytes(root: str, descriptor: dict[str, Any]) -> bytes:
    """The ``RoaringBitmapArray`` a descriptor (an ``add``'s ``deletionVector``) names, inline or in a file."""
    if descriptor["storageType"] == "i":
        return unz85(str(descriptor["pathOrInlineDv"]))[: int(descriptor["sizeInBytes"])]
    key = (_vector_path(root, descriptor["storageType"], str(descriptor["pathOrInlineDv"])),
           int(descriptor.get("offset") or 1))
    with _VECTORS_LOCK:
        kept = _VECTORS.get(key)
    if kept is not None and len(kept) == int(descriptor["sizeInBytes"]):
        return kept
    with open(key[0], "rb") as f:
        f.seek(key[1])
        (size,) = struct.unpack(">i", f.read(4))
        data = f.read(size)
        (crc,) = struct.unpack(">I", f.read(4))
    if size != int(descriptor["sizeInBytes"]) or crc != zlib.crc32(data):
        raise ValueError(f"deletion vector of {descriptor} is damaged (size or checksum)")
    _keep_vector(key, data)
    return data


def read_vector(root: str, descriptor: dict[str, Any]) -> np.ndarray:
    """The deleted positions a descriptor (an ``add``'s ``deletionVector``) names, ascending."""
    return decode(vector_bytes(root, descriptor))


def _write_vectors(root: str, vectors: list[bytes]) -> tuple[str, list[int]]:
    """One vector file holding ``vectors``: its Z85 name and each vector's offset."""
    ident = uuid.uuid4()
    offsets, at, body = [], 1, bytearray(b"\x01")
    for data in vectors:
        offsets.append(at)
        body += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        at = len(body)
    full = os.path.abspath(os.path.join(root, f"deletion_vector_{ident}.bin"))
    write_new(full, body, sync=own_commit.syncing())
    for data, offset in zip(vectors, offsets, strict=True):
        _keep_vector((full, offset), data)
    return z85(ident.bytes), offsets


# --- the live files of a version ---

#: the live ``add`` actions of each table at the version last replayed, with that commit's signature (see
#: :func:`live_files`); a refresh only replays the commits since
_LIVE: dict[str, tuple[int, Any, dict[str, dict[str, Any]]]] = {}  # by identity, see _identity
_LIVE_LOCK = threading.Lock()


class Unusable(Exception):
    """This table's change cannot be committed here (the caller uses another commit path)."""


def live_files(log: DeltaLog, version: int) -> dict[str, dict[str, Any]]:
    """The ``add`` action of every live data file at ``version``, by its path in the log. Replayed from the
    state this process last saw (while that commit file is the same file), else from the last checkpoint,
    else from the first commit."""
    key = os.path.abspath(local_path(log.path) or log.path)
    with _LIVE_LOCK:
        seen = _LIVE.get(key)
    files: dict[str, dict[str, Any]] | None = None
    start = -1
    if seen is not None and seen[0] <= version and log.commit_signature(seen[0]) == seen[1]:
        files, start = dict(seen[2]), seen[0]
    if files is None:
        files, start = _from_checkpoint(log, version)
    for v in range(start + 1, version + 1):
        actions = log.actions(v)
        if not actions:
            raise Unusable(f"commit {v} of {log.path} is missing")
        for a in actions:  # a file is live by (path, vector): Spark lists a touched file's add before its remove
            if a.get("add"):
                files[_identity(a["add"])] = a["add"]
            elif a.get("remove"):
                files.pop(_identity(a["remove"]), None)
    signature = log.commit_signature(version)
    if signature is not None:
        with _LIVE_LOCK:
            _LIVE[key] = (version, signature, files)
    return {add["path"]: add for add in files.values()}


#: rows of each data file (its statistics' ``numRecords``) by table and path: a data file never changes, so
#: its statistics are parsed once (see :func:`live_rows`); emptied when it holds too many
_FILE_ROWS: dict[tuple[str, str], int] = {}
_FILE_ROWS_KEPT = 1_000_000


def live_rows(log: DeltaLog, version: int) -> int | None:
    """Rows of the table at ``version``: each live file's ``numRecords`` less the rows its deletion vector marks;
    None when a file has no statistics. Why from the log: the refresh replays it anyway (:func:`live_files`,
    incrementally), while opening the table with delta-rs for its files' row counts cost 0.4 ms of a 45 ms
    refresh (docs/BENCHMARKS.md, session 45), and counted the rows vectors mark as deleted."""
    total = 0
    for add in live_files(log, version).values():
        key = (log.path, add["path"])
        rows = _FILE_ROWS.get(key)
        if rows is None:
            stats = add.get("stats")
            records = json.loads(stats).get("numRecords") if stats else None
            if records is None:
                return None
            if len(_FILE_ROWS) >= _FILE_ROWS_KEPT:
                _FILE_ROWS.clear()
            rows = _FILE_ROWS[key] = int(records)
        total += rows - int((add.get("deletionVector") or {}).get("cardinality") or 0)
    return total


def live_bytes(log: DeltaLog, version: int) -> int | None:
    """Bytes of the table's live data files at ``version`` (each ``add``'s ``size``); None when the log cannot
    tell (a commit gone, an ``add`` without a size). Why from the log: a table whose latest commit came from
    delta-rs or spark-trickle's own commit has no checksum file to read its size from, and asking delta-rs cost
    every small refresh reading its stream table 3-4.5 ms of 30-60 ms (docs/BENCHMARKS.md, session 78), while
    the refresh has replayed the log to that version already."""
    try:
        return sum(int(add["size"]) for add in live_files(log, version).values())
    except (Unusable, KeyError, TypeError, ValueError):
        return None


def _identity(action: dict[str, Any]) -> str:
    """A logical file's key in the log: its path and its vector's unique id (the protocol's reconciliation)."""
    vector = action.get("deletionVector") or {}
    return "\0".join([action["path"], str(vector.get("storageType", "")), str(vector.get("pathOrInlineDv", "")),
                       str(vector.get("offset", ""))])


def _from_checkpoint(log: DeltaLog, version: int) -> tuple[dict[str, dict[str, Any]], int]:
    text = log._read("_last_checkpoint")
    if text:
        doc = json.loads(text)
        at = int(doc["version"])
        if at <= version:
            if (doc.get("v2Checkpoint") or {}).get("path"):
                raise Unusable("a V2 checkpoint (not read here)")
            files: dict[str, dict[str, Any]] = {}
            for name in sorted(log._checkpoint_names()):
                data = log._read_bytes(name)
                if data is None or not name.endswith(".parquet"):
                    raise Unusable(f"checkpoint {name} is unreadable here")
                for a in pq.read_table(pa.BufferReader(data), columns=["add"]).column("add").to_pylist():
                    if a:
                        a = {k: v for k, v in a.items() if v is not None}
                        if isinstance(a.get("deletionVector"), dict):
                            a["deletionVector"] = {k: v for k, v in a["deletionVector"].items() if v is not None}
                        files[_identity(a)] = a
            for a in files.values():
                if isinstance(a.get("partitionValues"), list):  # a Parquet map reads as key/value pairs
                    a["partitionValues"] = dict(a["partitionValues"])
            return files, at
    if not log.actions(0):
        raise Unusable("the log's first commit is gone and no checkpoint precedes the version")
    return {}, -1


# --- finding the deleted rows ---

def unusable(path: str, protocol: dict[str, Any] | None, configuration: dict[str, str],
             partitioned: bool) -> str | None:
    """Why this module may not commit to the table (None: it may): :func:`connectors.own_commit.unusable`, and
    deletion vectors must be on."""
    why = own_commit.unusable(path, protocol, configuration, partitioned)
    if why is not None:
        return why
    assert protocol is not None
    if ("deletionVectors" not in (protocol.get("writerFeatures") or ())
            or "deletionVectors" not in (protocol.get("readerFeatures") or ())):
        return "deletion vectors are not enabled on the table"
    return None


#: wanted hashes from which the binary searches of indexes held in memory run in a thread pool (see :func:`locate`)
SEARCHES_SIDE_BY_SIDE = 4096


def locate(path: str, files: dict[str, dict[str, Any]], hashes: pa.Array,
           index_bytes: int = hash_index.DEFAULT_BUDGET) -> pa.Table:
    """``__file``, ``__position``, ``__row_id`` and ``__row_hash`` of every live stored row whose hash is in
    ``hashes``, found in each live file's :mod:`connectors.hash_index` (a file without one yet has its two id
    columns read and probed, and its index built in the background; files whose hash bounds hold none are
    skipped), leaving out positions its vector already deletes. ``index_bytes``: the budget of the indexes kept
    between refreshes."""
    root = local_path(path)
    if root is None:
        raise Unusable(f"{path} is not on a local file system")
    wanted = np.unique(hashes.to_numpy(zero_copy_only=False).astype(np.int64))
    empty = pa.table({FILE: pa.array([], pa.string()), POSITION: pa.array([], pa.int64()),
                      ROW_ID: pa.array([], pa.int64()), ROW_HASH: pa.array([], pa.int64())})
    if len(wanted) == 0:
        return empty
    indexes = hash_index.INDEXES
    indexes.limit(index_bytes)
    base = os.path.abspath(root)  # once: per file it cost a table of a few hundred files 0.15 ms per refresh
    keys = {rel: _key_at(base, rel, int(add["size"])) for rel, add in files.items()}
    indexes.retain(os.path.join(base, ""), set(keys.values()))

    def scan(rel: str, index: hash_index.FileIndex | None) -> hash_index.Found | None:
        if index is not None:
            return live(rel, hash_index.find(index, wanted))
        columns = pq.read_table(keys[rel][0], columns=[ROW_HASH, ROW_ID])
        stored, ids = (columns[c].to_numpy().astype(np.int64, copy=False) for c in (ROW_HASH, ROW_ID))
        indexes.build_later(keys[rel], stored, ids)
        return live(rel, hash_index.probe(stored, ids, wanted))

    def live(rel: str, found: hash_index.Found | None) -> hash_index.Found | None:
        if found is not None and len(found.positions) and files[rel].get("deletionVector"):
            alive = ~marked_among(root, files[rel]["deletionVector"], found.positions)
            found = hash_index.Found(*(column[alive] for column in found))
        return found if found is not None and len(found.positions) else None

    todo = files_bounding(files, ROW_HASH, wanted)
    held = {rel: indexes.get(keys[rel]) for rel in todo}
    # files read from disk, and many wanted hashes, go side by side (both release the GIL); a few wanted
    # hashes in indexes held in memory are searched here: the pool cost more than the searches (0.5 ms of
    # a 65 ms refresh of the floor's filter table, session 45), and the small files among them together
    alone = {rel for rel, index in held.items() if index is not None and len(wanted) < SEARCHES_SIDE_BY_SIDE}
    small = _joinable({rel: held[rel] for rel in todo if rel in alone})
    found: dict[str, hash_index.Found | None] = {}
    if len(small) > 1:
        joint = hash_index.find_joint(indexes.together(os.path.join(base, ""), [(keys[r], held[r]) for r in small]),
                                      wanted)
        found.update((rel, live(rel, joint.get(keys[rel]))) for rel in small)
    found.update((rel, scan(rel, held[rel])) for rel in todo if rel in alone and rel not in found)
    rest = [rel for rel in todo if rel not in alone]
    if rest:
        with ThreadPoolExecutor(max_workers=4) as pool:
            found.update(zip(rest, pool.map(lambda rel: scan(rel, held[rel]), rest), strict=True))
    hits = [(rel, f) for rel in todo if (f := found[rel]) is not None]
    if not hits:
        return empty
    return pa.table({FILE: pa.array([rel for rel, f in hits for _ in range(len(f.positions))], pa.string()),
                     POSITION: pa.array(np.concatenate([f.positions for _, f in hits]), pa.int64()),
                     ROW_ID: pa.array(np.concatenate([f.ids for _, f in hits]), pa.int64()),
                     ROW_HASH: pa.array(np.concatenate([f.hashes for _, f in hits]), pa.int64())})


def _joinable(held: dict[str, Any]) -> list[str]:
    """The files whose indexes are searched as one :class:`connectors.hash_index.Joint`: those of at most
    ``SMALL_FILE_ROWS`` rows, in order, up to ``JOINT_ROWS`` rows in all."""
    out, rows = [], 0
    for rel, index in held.items():
        n = len(index.hashes)
        if n <= hash_index.SMALL_FILE_ROWS and rows + n <= hash_index.JOINT_ROWS:
            out.append(rel)
            rows += n
    return out


#: each file's bounds on a column, by the file's statistics text and the column: a refresh asks for every live
#: file, and parsing each file's statistics again cost a table of a few hundred files 0.2-0.3 ms per refresh
_BOUNDS: dict[tuple[str, str], tuple[int, int] | None] = {}
_BOUNDS_KEPT = 200_000


def _bounds(stats: str, column: str) -> tuple[int, int] | None:
    key = (stats, column)
    try:
        return _BOUNDS[key]
    except KeyError:
        doc = json.loads(stats)
        low, high = (doc.get("minValues") or {}).get(column), (doc.get("maxValues") or {}).get(column)
        if len(_BOUNDS) >= _BOUNDS_KEPT:
            _BOUNDS.clear()
        found = _BOUNDS[key] = (int(low), int(high)) if low is not None and high is not None else None
        return found


def files_bounding(files: dict[str, dict[str, Any]], column: str, wanted: np.ndarray) -> list[str]:
    """The live files whose statistics' bounds on the integer ``column`` may hold one of ``wanted`` (sorted
    ascending); every file without such bounds."""
    out = []
    for rel, add in files.items():
        bounds = _bounds(add["stats"], column) if add.get("stats") else None
        if bounds is not None:
            i = np.searchsorted(wanted, bounds[0])
            if not (i < len(wanted) and wanted[i] <= bounds[1]):
                continue
        out.append(rel)
    return out


def _index_key(root: str, rel: str, size: int) -> tuple[str, int]:
    """A data file's key in :data:`connectors.hash_index.INDEXES`: its absolute path and its size."""
    return _key_at(os.path.abspath(root), rel, size)


def _key_at(base: str, rel: str, size: int) -> tuple[str, int]:
    """:func:`_index_key` under the table's absolute path ``base``."""
    return os.path.join(base, unquote(rel)), size


# --- the commit ---

def _loose(stats: str | None) -> str | None:
    """A touched file's statistics once rows are marked deleted: its bounds may now be loose."""
    if not stats:
        return None
    doc = json.loads(stats)
    doc["tightBounds"] = False
    return json.dumps(doc, separators=(",", ":"))


def commit(path: str, read_version: int, files: dict[str, dict[str, Any]], schema: pa.Schema,
           inserts: pa.Table, deleted: pa.Table, record: dict[str, Any], txn_version: int,
           app_id: str, configuration: dict[str, str] | None = None) -> dict[str, int]:
    """Commit ``inserts`` (the table's columns) and the deletion of ``deleted`` (``__file``, ``__position`` and
    the table's columns: the rows :func:`locate` found, with their values) as version ``read_version + 1``.
    ``files``: :func:`live_files` at ``read_version``; ``schema``: the table's Arrow schema; ``configuration``:
    its properties (the Parquet layout of the written files)."""
    root = local_path(path)
    assert root is not None
    now = own_commit.now_ms()
    names = schema.names
    stored = {"insert": inserts.select(names).cast(schema), "delete": deleted.select(names).cast(schema)}
    actions: list[dict[str, Any]] = []
    if inserts.num_rows:
        add, rel, size = own_commit.add_action(root, stored["insert"], now, configuration)
        actions.append(add)
        if ROW_HASH in names and ROW_ID in names and hash_index.INDEXES.fits(inserts.num_rows):
            # the new file's index from the rows in hand: the next refresh finds its copies without reading it
            hash_index.INDEXES.put(_index_key(root, rel, size), hash_index.build(
                *(stored["insert"][c].to_numpy().astype(np.int64, copy=False) for c in (ROW_HASH, ROW_ID))))
    actions += _mark(root, files, deleted, now)
    if deleted.num_rows:
        actions.append(own_commit.cdc_action(root, pa.concat_tables(
            [own_commit.with_change_type(rows, kind) for kind, rows in stored.items()]), configuration))
    metrics = {"numTargetRowsInserted": inserts.num_rows, "numTargetRowsUpdated": 0,
               "numTargetRowsDeleted": deleted.num_rows,
               "numTargetDeletionVectorsAdded": sum(1 for a in actions if "add" in a and a["add"].get("deletionVector"))}
    if deleted.num_rows:
        operation, parameters = "MERGE", {"predicate": f"t.{ROW_ID} = s.{ROW_ID}"}
    else:
        operation, parameters = "WRITE", {"mode": "Append"}
    own_commit.commit(root, read_version, actions, operation, parameters, metrics, record, txn_version, app_id,
                      "deletion vectors", blind_append=deleted.num_rows == 0, now=now)
    return {"inserted": inserts.num_rows, "updated": 0, "deleted": deleted.num_rows}


def _mark(root: str, files: dict[str, dict[str, Any]], deleted: pa.Table, now: int) -> list[dict[str, Any]]:
    """The ``remove`` / ``add`` pairs that mark ``deleted``'s positions in their files' vectors."""
    if not deleted.num_rows:
        return []
    removes, kept, vectors = [], [], []
    for rel, fresh in _by_file(deleted):
        add = files[rel]
        old = add.get("deletionVector")
        data, cardinality = with_marked(vector_bytes(root, old) if old else None, fresh)
        remove = {"path": rel, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                  "partitionValues": add.get("partitionValues") or {}, "size": add["size"]}
        if old:
            remove["deletionVector"] = old
        removes.append({"remove": remove})
        records = json.loads(add["stats"]).get("numRecords") if add.get("stats") else None
        if records is not None and cardinality >= int(records):
            continue  # every row of the file is gone: the remove alone
        kept.append((add, cardinality, len(data)))
        vectors.append(data)
    adds = []
    if vectors:
        name, offsets = _write_vectors(root, vectors)
        for (add, cardinality, size), offset in zip(kept, offsets, strict=True):
            new = {k: v for k, v in add.items() if k not in ("deletionVector", "stats", "tags")}
            new.update(dataChange=True, deletionVector={"storageType": "u", "pathOrInlineDv": name,
                                                         "offset": offset, "sizeInBytes": size,
                                                         "cardinality": cardinality})
            if (loose := _loose(add.get("stats"))) is not None:
                new["stats"] = loose
            adds.append({"add": new})
    return removes + adds


def _by_file(deleted: pa.Table) -> Iterable[tuple[str, np.ndarray]]:
    """Each file's deleted positions, grouped by the file names' dictionary codes (a Python loop over the rows
    cost 0.1 s per 85K deleted rows)."""
    names = deleted[FILE].combine_chunks().dictionary_encode()
    codes = names.indices.to_numpy(zero_copy_only=False)
    positions = deleted[POSITION].to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    dictionary = names.dictionary.to_pylist()
    for group in np.split(order, np.flatnonzero(np.diff(codes[order])) + 1):
        yield dictionary[codes[group[0]]], positions[group]


# --- turning vectors on ---

def with_vectors(protocol: dict[str, Any] | None) -> dict[str, Any] | None:
    """The protocol a table would have once deletion vectors are turned on (what Spark's upgrade gives:
    reader 3 / writer 7, the older versions' implied features listed)."""
    if protocol is None:
        return None
    reader, writer = int(protocol.get("minReaderVersion", 1)), int(protocol.get("minWriterVersion", 2))
    writers = set(protocol.get("writerFeatures") or ())
    if writer < 7:
        implied = {2: {"appendOnly", "invariants"}, 3: {"checkConstraints"}, 4: {"changeDataFeed",
                                                                                 "generatedColumns"},
                   5: {"columnMapping"}, 6: {"identityColumns"}}
        writers |= {f for v, fs in implied.items() if v <= writer for f in fs}
    readers = set(protocol.get("readerFeatures") or ()) | ({"columnMapping"} if reader == 2 else set())
    return {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": sorted(readers | {"deletionVectors"}),
            "writerFeatures": sorted(writers | {"deletionVectors"})}


def after_enabling(log: DeltaLog, read_version: int) -> int:
    """The version to commit after once turning deletion vectors on made the commit after ``read_version``:
    that commit, when it changed only the protocol and properties; else CommitFailed (another writer
    committed meanwhile, and the refresh starts again)."""
    fresh = DeltaLog(log.spark, log.path)
    latest = fresh.latest_version()
    if latest != read_version + 1 or any(k not in ("commitInfo", "protocol", "metaData")
                                         for a in fresh.actions(latest) for k in a):
        raise CommitFailed(f"the table moved past version {read_version} while deletion vectors were turned on")
    return latest


def arrow_schema(meta: Any) -> pa.Schema:
    """The Arrow schema Spark reads the table's Parquet files with (from its ``metaData`` schema)."""
    return _arrow_schema(meta.schema_json)


@functools.lru_cache(maxsize=256)
def _arrow_schema(schema_json: str) -> pa.Schema:
    """Kept by the schema's text (an Arrow schema is immutable): converting it cost a small table's MERGE 0.07
    ms a refresh, for the same schema every time."""
    from pyspark.sql.pandas.types import to_arrow_schema  # pure Python
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)))
