"""Files made ahead of their writers (connectors/files_ahead.py): a writer gets the file the worker made, of the
shape it asks for; outside a scope, or before the worker made one, it creates its own; and the files not taken
are gone when the scope ends (no Spark needed)."""

from __future__ import annotations

import os
from typing import Any

from connectors import files_ahead
from connectors.storage import write_fresh


def _names(folder: Any) -> set[str]:
    """The files directly in ``folder``."""
    return {e.name for e in os.scandir(folder) if e.is_file()}


def test_a_writer_takes_the_file_made_ahead_of_its_shape(tmp_path: Any) -> None:
    data, logs = str(tmp_path / "t"), str(tmp_path / "t" / "_delta_log")
    shapes = [(data, "part-00000-", ".parquet"), (logs, ".", ".tmp"), (logs, ".", ".tmp")]
    with files_ahead.scope() as scope:
        files_ahead.want(shapes)
        assert not os.path.exists(data)  # wanted, not made before the engine waits
        files_ahead.waiting()
        files_ahead.settled()
        made = _names(data) | _names(logs)
        assert len(made) == 3 and all(os.path.getsize(os.path.join(d, n)) == 0
                                      for d in (data, logs) for n in _names(d))
        path = write_fresh(data, "part-00000-", ".parquet", b"rows")
        assert os.path.basename(path) in made and open(path, "rb").read() == b"rows"
        temp = write_fresh(logs, ".", ".tmp", b"entry", sync=True)
        assert os.path.basename(temp) in made
        other = write_fresh(data, "cdc-00000-", ".parquet", b"changes")  # no such shape made: created now
        assert os.path.basename(other) not in made
        assert scope.asked == [shapes[0], shapes[1], (os.path.normpath(data), "cdc-00000-", ".parquet")]
    files_ahead.settled()
    # the second log temporary file was not taken: deleted; the written ones stay
    assert _names(logs) == {os.path.basename(temp)}
    assert _names(data) == {os.path.basename(path), os.path.basename(other)}


def test_outside_a_scope_every_file_is_created_by_its_writer(tmp_path: Any) -> None:
    files_ahead.want([(str(tmp_path), ".", ".tmp")])  # no scope: nothing is remembered
    files_ahead.waiting()
    files_ahead.settled()
    assert _names(tmp_path) == set()
    path = write_fresh(str(tmp_path / "new"), "x-", ".bin", b"1")
    assert open(path, "rb").read() == b"1" and os.path.basename(path).startswith("x-")


def test_a_file_made_after_its_scope_ended_is_deleted(tmp_path: Any, monkeypatch: Any) -> None:
    # the worker may finish a file after the refresh ended (a delta shorter than the creates): it must not stay
    import threading

    gate = threading.Event()
    real = files_ahead.open_new

    def slow(path: str) -> int:
        gate.wait(5)
        return real(path)

    monkeypatch.setattr(files_ahead, "open_new", slow)
    with files_ahead.scope():
        files_ahead.want([(str(tmp_path), ".", ".tmp")])
        files_ahead.waiting()
    gate.set()
    files_ahead.settled()
    assert _names(tmp_path) == set()
