"""The driver's sorted ``__row_hash`` indexes (connectors/hash_index.py) and ``deletion_vectors.locate`` over them:
the same rows as a linear probe, duplicates and vectors included, kept within the budget, and answered without
reading a file again."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors import deletion_vectors as dv
from connectors import hash_index as hi

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit


def test_find_returns_every_copy_of_each_wanted_hash_in_position_order() -> None:
    rng = np.random.default_rng(7)
    hashes = rng.integers(-50, 50, size=2_000).astype(np.int64)  # many duplicates, negatives
    ids = rng.permutation(2_000).astype(np.int64) + 10_000
    wanted = np.unique(rng.integers(-60, 60, size=40).astype(np.int64))  # some absent
    found = hi.find(hi.build(hashes, ids), wanted)
    expect = np.flatnonzero(np.isin(hashes, wanted))
    assert found.positions.tolist() == expect.tolist()
    assert found.ids.tolist() == ids[expect].tolist() and found.hashes.tolist() == hashes[expect].tolist()
    assert all(a.tolist() == b.tolist() for a, b in zip(hi.probe(hashes, ids, wanted), found, strict=True))
    assert len(hi.find(hi.build(hashes, ids), np.array([1_000], np.int64)).positions) == 0


def test_indexes_keep_to_their_budget_and_drop_files_no_longer_live() -> None:
    one = hi.build(np.arange(100, dtype=np.int64), np.arange(100, dtype=np.int64))  # 2,000 bytes
    store = hi.Indexes(budget=5_000)
    for name in ("a", "b", "c"):
        store.put((f"/t/{name}.parquet", 1), one)
    assert len(store) == 2 and store.nbytes == 4_000 and store.get(("/t/a.parquet", 1)) is None  # oldest out
    store.get(("/t/b.parquet", 1))  # b used last: c goes first
    store.limit(2_000)
    assert store.get(("/t/b.parquet", 1)) is not None and store.get(("/t/c.parquet", 1)) is None
    store.put(("/u/x.parquet", 1), hi.build(np.arange(10, dtype=np.int64), np.arange(10, dtype=np.int64)))
    store.retain("/t/", set())  # /t's files all gone; /u's kept
    assert store.get(("/t/b.parquet", 1)) is None and store.get(("/u/x.parquet", 1)) is not None
    assert not store.fits(101) and hi.Indexes(budget=0).fits(1) is False


def _file(root: str, name: str, hashes: list[int], first_id: int) -> tuple[str, dict[str, Any]]:
    table = pa.table({"v": pa.array([str(h) for h in hashes]), "__row_id": pa.array(
        range(first_id, first_id + len(hashes)), pa.int64()), "__row_hash": pa.array(hashes, pa.int64())})
    pq.write_table(table, os.path.join(root, name))
    return name, {"path": name, "size": os.path.getsize(os.path.join(root, name))}


def test_locate_answers_from_the_index_without_reading_the_file_again(tmp_path: Any) -> None:
    """The second locate finds the same rows with the files gone from disk: only the index answered. A
    position the file's vector already deletes is not found again; a budget of 0 reads the file each time."""
    root = str(tmp_path)
    files = dict([_file(root, "a.parquet", [5, 7, 5, 9], 100), _file(root, "b.parquet", [7, 11], 200)])
    wanted = pa.array([5, 7, 42], pa.int64())
    first = dv.locate(root, files, wanted).sort_by([("__file", "ascending"), ("__position", "ascending")])
    expect = [("a.parquet", 0, 100, 5), ("a.parquet", 1, 101, 7), ("a.parquet", 2, 102, 5), ("b.parquet", 0, 200, 7)]
    assert list(zip(*(first[c].to_pylist() for c in ("__file", "__position", "__row_id", "__row_hash")),
                    strict=True)) == expect
    dv.hash_index.INDEXES.wait()  # the files' indexes, built in the background after the first read
    for name in files:
        os.rename(os.path.join(root, name), os.path.join(root, name + ".away"))
    again = dv.locate(root, files, wanted).sort_by([("__file", "ascending"), ("__position", "ascending")])
    assert again.equals(first)
    vector = {"storageType": "i", "pathOrInlineDv": dv.z85(_padded(dv.encode(np.array([2], np.int64)))),
              "sizeInBytes": len(dv.encode(np.array([2], np.int64))), "cardinality": 1}
    marked = {**files, "a.parquet": {**files["a.parquet"], "deletionVector": vector}}
    assert (2 not in dv.locate(root, marked, wanted).filter(
        pa.compute.equal(pa.compute.field("__file"), "a.parquet"))["__position"].to_pylist())
    # many wanted hashes search the held indexes side by side (a thread pool), a few in place: the same rows
    side_by_side = dv.SEARCHES_SIDE_BY_SIDE
    try:
        dv.SEARCHES_SIDE_BY_SIDE = 1
        assert dv.locate(root, files, wanted).sort_by(
            [("__file", "ascending"), ("__position", "ascending")]).equals(first)
    finally:
        dv.SEARCHES_SIDE_BY_SIDE = side_by_side
    with pytest.raises(FileNotFoundError):
        dv.locate(root, files, wanted, index_bytes=0)  # no index kept: the file is read, and it is gone


def _padded(data: bytes) -> bytes:
    return data + b"\x00" * (-len(data) % 4)  # Z85 encodes 4-byte groups


def test_a_joint_of_small_files_finds_what_each_file_finds_as_files_come_and_go() -> None:
    """Several small files searched as one (``Indexes.together``): the same rows per file as :func:`find`,
    when the joint is built, when files are merged into the kept one, and when a file leaves (rebuilt)."""
    rng = np.random.default_rng(11)
    parts = []
    for i in range(6):
        hashes = rng.integers(-30, 30, size=int(rng.integers(1, 40))).astype(np.int64)  # duplicates across files
        parts.append(((f"/t/{i}.parquet", i), hi.build(hashes, rng.permutation(len(hashes)).astype(np.int64) + 100 * i)))
    wanted = np.unique(rng.integers(-35, 35, size=25).astype(np.int64))
    store = hi.Indexes()

    def check(joint: hi.Joint, picked: list[Any]) -> None:
        got = hi.find_joint(joint, wanted)
        for key, index in picked:
            expect = hi.find(index, wanted)
            if len(expect.positions) == 0:
                assert key not in got
            else:
                assert all(a.tolist() == b.tolist() for a, b in zip(got[key], expect, strict=True)), key
        assert set(got) <= {k for k, _ in picked}

    first = store.together("/t/", parts[:3])
    check(first, parts[:3])
    assert store.together("/t/", list(reversed(parts[:3]))) is first  # the same files: kept
    grown = store.together("/t/", parts[:5])  # two files added: merged into the kept one
    check(grown, parts[:5])
    assert grown.keys[:3] == first.keys
    assert grown.index.hashes.tolist() == sorted(grown.index.hashes.tolist())
    shrunk = store.together("/t/", parts[1:6])  # one file gone: built again
    check(shrunk, parts[1:6])
    assert parts[0][0] not in shrunk.keys


def test_locate_over_many_small_files_finds_the_same_rows_with_and_without_the_joint(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path)
    rng = np.random.default_rng(3)
    files = dict(_file(root, f"f{i}.parquet", rng.integers(0, 40, size=8).tolist(), 1000 * i) for i in range(12))
    wanted = pa.array(rng.integers(0, 45, size=10), pa.int64())
    order = [("__file", "ascending"), ("__position", "ascending")]
    dv.locate(root, files, wanted)
    dv.hash_index.INDEXES.wait()
    joints, real = [], hi.find_joint
    monkeypatch.setattr(hi, "find_joint", lambda joint, wanted: joints.append(len(joint.keys)) or real(joint, wanted))
    joint = dv.locate(root, files, wanted).sort_by(order)
    assert joints == [len(files)]  # every file, in one search
    small = dv.hash_index.SMALL_FILE_ROWS
    try:
        dv.hash_index.SMALL_FILE_ROWS = 0  # every file searched on its own
        alone = dv.locate(root, files, wanted).sort_by(order)
    finally:
        dv.hash_index.SMALL_FILE_ROWS = small
    assert joint.num_rows > 0 and joint.equals(alone)
    stored = pa.concat_tables(pq.read_table(os.path.join(root, f)).append_column(
        "__file", pa.array([f] * 8)) for f in files)
    expect = stored.filter(pa.compute.is_in(stored["__row_hash"], value_set=wanted))
    assert sorted(zip(joint["__file"].to_pylist(), joint["__row_id"].to_pylist(), strict=True)) == sorted(
        zip(expect["__file"].to_pylist(), expect["__row_id"].to_pylist(), strict=True))
