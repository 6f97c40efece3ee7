"""The background writer of log checkpoints (connectors/log_checkpoints.py), on delta-rs tables, no Spark:
what it writes reads back as the table, ``settle`` waits for it, and a table dropped before its turn does not
come back as a folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa

from connectors import log_checkpoints


def _table(path: Path, commits: int) -> None:
    from deltalake import write_deltalake

    for i in range(commits):
        write_deltalake(str(path), pa.table({"i": pa.array([i, i + 100], pa.int64())}), mode="append")


def test_written_in_the_background_and_read_back(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    path = tmp_path / "t"
    _table(path, 11)
    futures = [log_checkpoints.write_later(str(path), v) for v in (5, 10)]
    log_checkpoints.settle(str(path))
    assert all(f.done() for f in futures) and [f.result() for f in futures] == [True, True]
    names = os.listdir(path / "_delta_log")
    assert {f"{v:020d}.checkpoint.parquet" for v in (5, 10)} <= set(names), sorted(names)
    assert json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"] == 10  # in order
    os.remove(path / "_delta_log" / f"{3:020d}.json")  # only the checkpoint can give version 10 now
    got = sorted(DeltaTable(str(path), version=10).to_pyarrow_table().column("i").to_pylist())
    assert got == sorted([i for i in range(10 + 1)] + [i + 100 for i in range(10 + 1)])
    assert log_checkpoints.write_later(str(path), 10).result() is False  # one there already


def test_a_dropped_table_gets_no_folder_back(tmp_path: Path) -> None:
    path = tmp_path / "gone"
    _table(path, 2)
    shutil.rmtree(path)
    assert log_checkpoints.write_later(str(path), 1).result() is False
    assert not path.exists()


def test_a_failure_is_logged_not_raised(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "broken"
    _table(path, 2)
    (path / "_delta_log" / f"{0:020d}.json").write_text("not json\n")
    assert log_checkpoints.write_later(str(path), 1).result() is False
    log_checkpoints.settle()
    assert "no log checkpoint" in caplog.text
