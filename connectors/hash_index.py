"""Where each stored row's ``__row_hash`` sits, per data file, kept in the driver's memory between refreshes.

The rule: a Delta data file never changes once written (a deletion marks its rows in a vector beside it), so
its ``__row_hash`` column, sorted once with each hash's position and ``__row_id``, answers every later
refresh's "where are the copies of these tuples" by binary search: O(changed tuples x log rows) instead of
reading and probing the whole column, 8 bytes of every stored row, at every refresh.

Why: a plain-rows stream table committed with deletion vectors (:mod:`connectors.deletion_vectors`) must find
the stored copies a change deletes. Read afresh each time, that search was 0.05 s of a 0.28 s refresh at 1M
stored rows and 0.30 s of 0.56 s at 10M, so the refresh's cost followed the table's size, not the change's
(figures in docs/BENCHMARKS.md, "Stored copies found by binary search").

An index is keyed by the file's absolute path and size (a path is a fresh UUID per written file; the size
guards against a rewritten file of the same name); a table's indexes of files no longer live are dropped at
each lookup (:meth:`Indexes.retain`), and all indexes together hold at most the budget given
(``trickle.apply.hashIndexBytes``, 20 bytes a row), least recently used first out. A file without an index is
read and probed by a linear scan (:func:`probe`), as before, and its index is built in a background thread
for the next refresh (:meth:`Indexes.build_later`); a file beyond the budget is probed so every time. A file
spark-trickle writes gets its index from the rows in hand, and a process that restarts builds them again.

A table refreshed by small commits gains a small file per refresh; the small files' indexes are searched
together, as one :class:`Joint` per table kept between refreshes (:meth:`Indexes.together`), so a refresh
pays one binary search for them, not one per file.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: bytes an index holds per stored row: the sorted hash, the row's id and its position
ROW_BYTES = 8 + 8 + 4
#: default of ``trickle.apply.hashIndexBytes``: about 50M stored rows
DEFAULT_BUDGET = 1 << 30
#: files of at most this many rows are searched together, in one :class:`Joint` per table (see
#: :meth:`Indexes.together`), of at most :data:`JOINT_ROWS` rows; and :data:`JOINTS_KEPT` tables' joints are
#: kept (at most 20 bytes x 32K rows x 64 = 42 MB, beside the budget)
SMALL_FILE_ROWS = 4096
JOINT_ROWS = 32768
JOINTS_KEPT = 64


class FileIndex(NamedTuple):
    """One data file's rows sorted by ``__row_hash``: the hashes, and each one's ``__row_id`` and position."""

    hashes: np.ndarray
    ids: np.ndarray
    positions: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.ids.nbytes + self.positions.nbytes)


class Found(NamedTuple):
    """The rows of one file whose hash was wanted, in position order."""

    positions: np.ndarray
    ids: np.ndarray
    hashes: np.ndarray


def build(hashes: np.ndarray, ids: np.ndarray) -> FileIndex:
    """The index of a file whose rows have these ``__row_hash`` and ``__row_id`` values, in file order."""
    order = np.argsort(hashes, kind="quicksort")  # ties are put in position order by find
    return FileIndex(np.ascontiguousarray(hashes[order], dtype=np.int64),
                     np.ascontiguousarray(ids[order], dtype=np.int64), order.astype(np.int32))


def find(index: FileIndex, wanted: np.ndarray) -> Found:
    """Every row of the file whose hash is in ``wanted`` (sorted, unique), by binary search."""
    starts = _runs(index.hashes, wanted)
    if len(starts) == 0:
        return _NONE
    at = starts[np.argsort(index.positions[starts], kind="stable")]
    return Found(index.positions[at].astype(np.int64), index.ids[at], index.hashes[at])


def find_joint(joint: Joint, wanted: np.ndarray) -> dict[tuple[str, int], Found]:
    """:func:`find` in each file of a :class:`Joint`, by one binary search: the files with a wanted hash."""
    starts = _runs(joint.index.hashes, wanted)
    if len(starts) == 0:
        return {}
    files = joint.files[starts]
    order = np.lexsort((joint.index.positions[starts], files))
    at, files = starts[order], files[order]
    out = {}
    for run in np.split(at, np.flatnonzero(np.diff(files)) + 1):
        out[joint.keys[joint.files[run[0]]]] = Found(joint.index.positions[run].astype(np.int64),
                                                     joint.index.ids[run], joint.index.hashes[run])
    return out


def _runs(hashes: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where in ``hashes`` (sorted) each value of ``wanted`` sits: every copy, a run per wanted hash."""
    lo = np.searchsorted(hashes, wanted, side="left")
    counts = np.searchsorted(hashes, wanted, side="right") - lo
    hit = counts > 0
    lo, counts = lo[hit], counts[hit]
    total = int(counts.sum())
    # each hit's run of equal hashes, flattened: start of its run + offset within it
    return np.repeat(lo, counts) + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts))


_NONE = Found(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))


class Joint(NamedTuple):
    """Several small files' indexes as one: their rows sorted by hash, each with its file's place in ``keys``."""

    keys: tuple[tuple[str, int], ...]
    index: FileIndex
    files: np.ndarray


def joined(parts: list[tuple[tuple[str, int], FileIndex]], onto: Joint | None = None) -> Joint:
    """The :class:`Joint` of ``onto``'s files and ``parts``. A stable sort of runs already sorted (``onto``'s,
    then each part's) merges them (NumPy's timsort), so adding a file costs a merge, not a sort."""
    base = [] if onto is None else [(onto.index, onto.files)]
    offset = 0 if onto is None else len(onto.keys)
    pieces = base + [(index, np.full(len(index.hashes), offset + i, np.int32)) for i, (_, index) in enumerate(parts)]
    hashes = np.concatenate([p[0].hashes for p in pieces])
    order = np.argsort(hashes, kind="stable")
    index = FileIndex(hashes[order], np.concatenate([p[0].ids for p in pieces])[order],
                      np.concatenate([p[0].positions for p in pieces])[order])
    keys = (() if onto is None else onto.keys) + tuple(k for k, _ in parts)
    return Joint(keys, index, np.concatenate([p[1] for p in pieces])[order])


def probe(hashes: np.ndarray, ids: np.ndarray, wanted: np.ndarray) -> Found:
    """:func:`find` without an index: one linear pass over a file's columns (a file beyond the budget)."""
    at = np.flatnonzero(pc.is_in(pa.array(hashes), value_set=pa.array(wanted)).to_numpy(zero_copy_only=False))
    return Found(at.astype(np.int64), ids[at].astype(np.int64), hashes[at].astype(np.int64))


class Indexes:
    """The process's file indexes, least recently used first, within a byte budget."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self._held: OrderedDict[tuple[str, int], FileIndex] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], Future[None]] = {}
        self._joints: OrderedDict[str, Joint] = OrderedDict()  # by table folder, see :meth:`together`
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trickle-hash-index")

    def build_later(self, key: tuple[str, int], hashes: np.ndarray, ids: np.ndarray) -> None:
        """Sort a file's columns (already read by a linear :func:`probe`) into its index off the refresh's path:
        the sort costs several times the probe (about 0.3 s per 2.5M rows), and a refresh after a FULL one, whose
        files are all new, would otherwise pay it for every file at once."""
        if not self.fits(len(hashes)):
            return
        with self._lock:
            if key in self._held or key in self._pending:
                return
            self._pending[key] = self._builder.submit(self._build, key, hashes, ids)

    def _build(self, key: tuple[str, int], hashes: np.ndarray, ids: np.ndarray) -> None:
        try:
            self.put(key, build(hashes, ids))
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def wait(self) -> None:
        """Until the indexes being built are held (tests; a process about to measure a refresh)."""
        with self._lock:
            pending = list(self._pending.values())
        for future in pending:
            future.result()

    def get(self, key: tuple[str, int]) -> FileIndex | None:
        with self._lock:
            index = self._held.get(key)
            if index is not None:
                self._held.move_to_end(key)
            return index

    def fits(self, rows: int) -> bool:
        """Whether an index of this many rows may be held at all."""
        return rows * ROW_BYTES <= self.budget

    def put(self, key: tuple[str, int], index: FileIndex) -> None:
        """Hold ``index``, dropping the least recently used ones beyond the budget."""
        if index.nbytes > self.budget:
            return
        with self._lock:
            old = self._held.pop(key, None)
            self._bytes += index.nbytes - (old.nbytes if old is not None else 0)
            self._held[key] = index
            self._shrink()

    def limit(self, budget: int) -> None:
        """Hold at most ``budget`` bytes from now on (the setting may change between refreshes)."""
        with self._lock:
            self.budget = budget
            self._shrink()

    def _shrink(self) -> None:
        while self._bytes > self.budget and self._held:
            _, dropped = self._held.popitem(last=False)
            self._bytes -= dropped.nbytes

    def retain(self, folder: str, live: set[tuple[str, int]]) -> None:
        """Drop the indexes of files under ``folder`` (a table's root, ending in a separator) not in ``live``."""
        with self._lock:
            for key in [k for k in self._held if k[0].startswith(folder) and k not in live]:
                self._bytes -= self._held.pop(key).nbytes

    def together(self, folder: str, parts: list[tuple[tuple[str, int], FileIndex]]) -> Joint:
        """One :class:`Joint` of these small files of the table under ``folder``, kept for its next refresh:
        the same files answer from it again, and files added since are merged into it. Why: a table refreshed
        by small commits gains a small file per refresh, and one binary search per file cost ~20 us each (0.7 ms
        of a 40 ms refresh of the floor's filter table over ~30 files, session 59)."""
        keys = frozenset(k for k, _ in parts)
        with self._lock:
            old = self._joints.get(folder)
        if old is not None and len(old.keys) == len(keys) and keys.issuperset(old.keys):
            joint = old
        elif old is not None and keys.issuperset(old.keys):
            have = set(old.keys)
            joint = joined([(k, i) for k, i in parts if k not in have], onto=old)
        else:
            joint = joined(parts)
        with self._lock:
            self._joints[folder] = joint
            self._joints.move_to_end(folder)
            while len(self._joints) > JOINTS_KEPT:
                self._joints.popitem(last=False)
        return joint

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._held)


#: the driver's indexes, shared by every table this process refreshes
INDEXES = Indexes()
