"""The catalog's definition files as two processes see them: a text kept by its file status is never served after
another writer changed the file (no Spark needed)."""

from __future__ import annotations

import os
import time
from typing import Any

from pipeline import catalog
from pipeline.catalog import Catalog, SourceInfo, StreamTableDef


def _definition(schedule: str) -> StreamTableDef:
    return StreamTableDef(name="t", query="SELECT 1 AS x", schedule=schedule, refresh_mode="AUTO", path="/nowhere",
                          sources={"s": SourceInfo("/s", "delta")}, names=["x"], types=["int"], layout="keyed",
                          created_at=0.0)


def _opens(monkeypatch: Any) -> list[str]:
    seen: list[str] = []
    real = os.open

    def counted(path: Any, *args: Any, **kwargs: Any) -> int:
        seen.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(catalog.os, "open", counted)
    return seen


def _kept(tmp_path: Any) -> tuple[Catalog, Catalog]:
    """A writer and a reader that keeps the definition the writer wrote (read after the racy window)."""
    writer, reader = Catalog(tmp_path / "trickle"), Catalog(tmp_path / "trickle")
    writer.put(_definition("10s"))
    time.sleep(catalog.RACY_NS / 1e9 + 0.02)
    assert reader.get("t").schedule == "10s"
    return writer, reader


def test_a_kept_definition_is_read_again_once_another_writer_replaced_it(tmp_path: Any, monkeypatch: Any) -> None:
    writer, reader = Catalog(tmp_path / "trickle"), Catalog(tmp_path / "trickle")
    writer.put(_definition("10s"))
    assert reader.get("t").schedule == "10s"
    assert reader._texts == {}  # read within the racy window of its write: not kept
    writer.put(_definition("20s"))  # the same size, within the file system's timestamp granularity
    assert reader.get("t").schedule == "20s"
    time.sleep(catalog.RACY_NS / 1e9 + 0.02)
    opens = _opens(monkeypatch)
    assert reader.get("t").schedule == "20s"  # read, and now kept: written long enough ago
    assert len(reader._texts) == 1
    assert reader.get("t").schedule == "20s"
    assert reader.get("t").schedule == "20s"
    assert len([p for p in opens if p.endswith("t.json")]) == 1, opens
    writer.put(_definition("30s"))  # a rename: another inode
    assert reader.get("t").schedule == "30s"


def test_an_in_place_edit_of_a_kept_definition_is_seen(tmp_path: Any) -> None:
    writer, reader = _kept(tmp_path)
    path = tmp_path / "trickle" / "stream_tables" / "t.json"
    before = path.stat().st_ino
    time.sleep(0.02)  # past the timestamp granularity of the read
    path.write_text(path.read_text().replace('"10s"', '"40s"'))  # in place: the same inode and size
    assert path.stat().st_ino == before
    assert reader.get("t").schedule == "40s"


def test_a_deleted_definition_is_gone_for_every_reader(tmp_path: Any) -> None:
    writer, reader = _kept(tmp_path)
    writer.delete("t")
    assert not reader.exists("t")
    try:
        reader.get("t")
    except catalog.CatalogError as e:
        assert "does not exist" in str(e)
    else:
        raise AssertionError("a dropped definition was still served")
