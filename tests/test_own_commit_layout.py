"""The Parquet layout of the files spark-trickle's own commits write (no Spark): they follow the stream
table's properties as Spark's writer and delta-rs do, so a table's files are alike whoever wrote them, and a
collected FULL's file stays as small as Spark's (session 78: 39 against 26 MiB with Arrow's defaults)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.delta_rs import parquet_layout
from connectors.own_commit import LEAN_BELOW_ROWS, write_parquet

PROPS = {"parquet.writer.version": "v2", "parquet.enable.dictionary#__row_id": "false",
         "parquet.enable.dictionary#__row_hash": "false", "delta.enableChangeDataFeed": "true"}


def _rows(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({"__row_id": pa.array(np.arange(n, dtype=np.int64)), "region": pa.array(rng.integers(0, 5, n)),
                     "name": pa.array([f"n{i % 7}" for i in range(n)]),
                     "__row_hash": pa.array(rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64))})


def _encodings(root: Path, rel: str) -> dict[str, set[str]]:
    md = pq.ParquetFile(root / rel).metadata
    out: dict[str, set[str]] = {}
    for g in range(md.num_row_groups):
        for i in range(md.num_columns):
            c = md.row_group(g).column(i)
            out.setdefault(c.path_in_schema, set()).update(c.encodings)
    return out


def test_the_layout_read_from_a_tables_properties() -> None:
    assert parquet_layout(PROPS) == (frozenset({"__row_id", "__row_hash"}), frozenset({"__row_id"}))
    v1 = {**PROPS, "parquet.writer.version": "v1"}
    assert parquet_layout(v1) == (frozenset({"__row_id", "__row_hash"}), frozenset())
    assert parquet_layout({}) == (frozenset(), frozenset())


def test_a_large_file_of_an_own_commit_follows_the_tables_layout(tmp_path: Path) -> None:
    rows = _rows(LEAN_BELOW_ROWS * 5)
    rel, size = write_parquet(str(tmp_path), "", "part-00000", rows, PROPS)
    got = _encodings(tmp_path, rel)
    assert got["__row_id"] & {"DELTA_BINARY_PACKED"} and not got["__row_id"] & {"PLAIN_DICTIONARY",
                                                                                 "RLE_DICTIONARY"}, got
    assert not got["__row_hash"] & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}, got
    assert got["name"] & {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}, got  # the user's columns keep theirs
    assert pq.read_table(tmp_path / rel).equals(rows)
    rel_default, size_default = write_parquet(str(tmp_path), "", "part-00000", rows, None)
    assert _encodings(tmp_path, rel_default)["__row_id"] & {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}
    assert size < size_default, (size, size_default)  # the counter packs, the hash's dictionary is gone


def test_a_small_file_stays_lean_whatever_the_properties(tmp_path: Path) -> None:
    rows = _rows(LEAN_BELOW_ROWS // 10)
    rel, _ = write_parquet(str(tmp_path), "", "part-00000", rows, PROPS)
    got = _encodings(tmp_path, rel)
    assert all(not e & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} for e in got.values()), got
    assert pq.read_table(tmp_path / rel).equals(rows)


def test_nested_columns_keep_their_dictionaries(tmp_path: Path) -> None:
    """pyarrow sets a dictionary per leaf column: the nested user columns' leaves (a struct's fields, a list's
    elements, a map's keys and values) keep theirs while the hidden columns go without."""
    n = LEAN_BELOW_ROWS * 2
    rows = pa.table({"__row_id": pa.array(np.arange(n, dtype=np.int64)),
                     "s": pa.array([{"a": i % 3, "b": "x"} for i in range(n)]),
                     "l": pa.array([[i % 2, None] for i in range(n)]),
                     "m": pa.array([[("k", i % 4)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
                     "__row_hash": pa.array(np.arange(n, dtype=np.int64) * 7919)})
    rel, _ = write_parquet(str(tmp_path), "", "part-00000", rows, PROPS)
    got = _encodings(tmp_path, rel)
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    for leaf in ("s.a", "s.b", "l.list.element", "m.key_value.key", "m.key_value.value"):
        assert got[leaf] & dictionary, (leaf, got)
    assert not (got["__row_id"] | got["__row_hash"]) & dictionary, got
    assert pq.read_table(tmp_path / rel).equals(rows)
