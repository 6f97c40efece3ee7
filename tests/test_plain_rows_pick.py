"""The driver's pick of a plain-rows table's change rows (pipeline/plain_rows.py), without Spark: the rule
of dvm/plan.py checked on Arrow tables by an independent count."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from pipeline import plain_rows

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

COLUMNS = ["__row_id", "k", "v", "__row_hash"]


def _delta(rows: list[tuple[int | None, str | None, int, int]]) -> pa.Table:
    """(k, v, __row_hash, __dw) tuples."""
    k, v, h, w = zip(*rows, strict=True) if rows else ([], [], [], [])
    return pa.table({"k": pa.array(k, pa.int32()), "v": pa.array(v, pa.string()),
                     "__row_hash": pa.array(h, pa.int64()), "__dw": pa.array(w, pa.int64())})


def _stored(rows: list[tuple[int, int]]) -> pa.Table:
    """(__row_id, __row_hash) pairs."""
    ids, hashes = zip(*rows, strict=True) if rows else ([], [])
    return pa.table({"__row_id": pa.array(ids, pa.int64()), "__row_hash": pa.array(hashes, pa.int64())})


def test_copies_inserted_and_deleted_per_net_weight() -> None:
    delta = _delta([(1, "a", 10, 3), (2, None, 20, -2), (None, "c", 30, -5), (4, "d", 40, 1)])
    stored = _stored([(100, 20), (101, 20), (102, 20), (103, 30), (104, 30), (105, 99)])
    out = plain_rows.changes(delta, stored, COLUMNS, salt="s1")
    assert out.column_names == [*COLUMNS, "__del"]
    ins = out.filter(pa.compute.invert(out["__del"]))
    dels = out.filter(out["__del"])
    assert Counter(zip(ins["k"].to_pylist(), ins["v"].to_pylist(), ins["__row_hash"].to_pylist(), strict=True)) \
        == Counter({(1, "a", 10): 3, (4, "d", 40): 1})
    # two of hash 20's three copies, the lowest ids; hash 30 loses all it has (2 < 5); 99 is untouched
    assert sorted(zip(dels["__row_id"].to_pylist(), dels["__row_hash"].to_pylist(), strict=True)) \
        == [(100, 20), (101, 20), (103, 30), (104, 30)]
    # a deleted copy carries its tuple's values (the change-data file of a commit with deletion vectors
    # holds them; a MERGE matches on __row_id only)
    assert sorted(zip(dels["__row_hash"].to_pylist(), dels["k"].to_pylist(), dels["v"].to_pylist(), strict=True),
                  key=repr) == sorted([(20, 2, None), (20, 2, None), (30, None, "c"), (30, None, "c")], key=repr)
    ids = out["__row_id"].to_pylist()
    assert len(set(ids)) == len(ids)


def test_insert_only_reads_no_stored_row() -> None:
    out = plain_rows.changes(_delta([(1, "a", 10, 2)]), None, COLUMNS, salt="s")
    assert out.num_rows == 2 and not any(out["__del"].to_pylist())
    assert plain_rows.negative_hashes(_delta([(1, "a", 10, 2)])).to_pylist() == []


def test_fresh_ids_avoid_the_deleted_ones_and_follow_the_salt() -> None:
    delta = _delta([(1, "a", 10, 50), (2, "b", 20, -1)])
    a = plain_rows.changes(delta, _stored([(7, 20)]), COLUMNS, salt="x")
    b = plain_rows.changes(delta, _stored([(7, 20)]), COLUMNS, salt="x")
    c = plain_rows.changes(delta, _stored([(7, 20)]), COLUMNS, salt="y")
    assert a["__row_id"].to_pylist() == b["__row_id"].to_pylist() != c["__row_id"].to_pylist()
    inserted = a.filter(pa.compute.invert(a["__del"]))["__row_id"].to_pylist()
    assert 7 not in inserted and len(set(inserted)) == 50


def test_fresh_ids_drawn_again_where_they_meet_a_deleted_id_stay_distinct() -> None:
    first = plain_rows._fresh_ids(1000, np.empty(0, np.int64), "z")
    taken = first[::7]  # the deleted ids happen to be ones the salt draws first
    again = plain_rows._fresh_ids(1000, taken, "z")
    assert len(np.unique(again)) == 1000 and not np.isin(again, taken).any()
    assert (again == first)[~np.isin(first, taken)].all()  # only the clashing ones were drawn again


def test_empty_delta() -> None:
    out = plain_rows.changes(_delta([]), None, COLUMNS, salt="s")
    assert out.num_rows == 0 and out.column_names == [*COLUMNS, "__del"]


def test_picked_copies_are_the_lowest_ids_of_each_lost_tuple_by_an_independent_count() -> None:
    """Random deltas and stored copies (duplicates, tuples losing more copies than stored, hashes not stored,
    stored rows of other tuples, a column saying where a copy is): the picked copies are, per negative tuple,
    its ``-__dw`` lowest stored ids, counted here in plain Python. Some deltas hold two tuples of one hash (a
    64-bit collision): their stored copies cannot be told apart, and the hash loses the sum of both."""
    import random

    rng = random.Random(7)
    for case in range(200):
        hashes = rng.sample(range(-50, 50), rng.randint(0, 12))
        if case % 4 == 0 and hashes:
            hashes.append(hashes[0])
        delta = _delta([(i, None, h, rng.choice([-3, -2, -1, 1, 2])) for i, h in enumerate(hashes)])
        ids = rng.sample(range(1000), rng.randint(0, 40))
        stored = _stored([(i, rng.choice([*hashes, 99, 98]) if hashes else 99) for i in ids])
        stored = stored.append_column("__file", pa.array([f"f{i % 3}" for i in ids], pa.string()))
        lost: dict[int, int] = {}
        for h, w in zip(delta["__row_hash"].to_pylist(), delta["__dw"].to_pylist(), strict=True):
            if w < 0:
                lost[h] = lost.get(h, 0) - w
        by_hash: dict[int, list[int]] = {}
        for i, h in zip(stored["__row_id"].to_pylist(), stored["__row_hash"].to_pylist(), strict=True):
            by_hash.setdefault(h, []).append(i)
        expected = sorted((i, h) for h, n in lost.items() for i in sorted(by_hash.get(h, []))[:n])
        _, deletes = plain_rows.split(delta, stored, COLUMNS, salt="s")
        assert sorted(zip(deletes["__row_id"].to_pylist(), deletes["__row_hash"].to_pylist(), strict=True)) == expected
        assert deletes["__file"].to_pylist() == [f"f{i % 3}" for i in deletes["__row_id"].to_pylist()]
