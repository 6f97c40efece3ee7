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
    assert len([p for p in reader._texts if p.endswith("t.json")]) == 1
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


def _files(tmp_path: Any) -> dict[str, int]:
    root = tmp_path / "trickle"
    return {str(p.relative_to(root)): p.stat().st_ino for p in root.rglob("*") if p.is_file()}


def test_a_refresh_writes_its_state_in_place_and_leaves_the_definition_alone(tmp_path: Any) -> None:
    writer, reader = Catalog(tmp_path / "trickle"), Catalog(tmp_path / "trickle")
    writer.put(_definition("10s"))
    for version in range(1, 6):  # what a refresh records
        d = writer.get("t")
        d.frontier, d.last_refresh_id, d.cost_model = {"s": version}, f"r{version}", {"full_s": version / 10}
        before = _files(tmp_path)
        writer.put(d)
        after = _files(tmp_path)
        got = reader.get("t")
        assert (got.frontier, got.last_refresh_id, got.cost_model) == ({"s": version}, f"r{version}",
                                                                       {"full_s": version / 10})
        if version >= 2:  # both slots exist by now (the create wrote one): no file made, none replaced
            assert after == before
    assert "frontier" not in (tmp_path / "trickle" / "stream_tables" / "t.json").read_text()
    assert "\"frontier\"" in got.to_json()  # the whole definition, as the catalog views show it


def test_a_torn_state_slot_falls_back_to_the_one_before(tmp_path: Any) -> None:
    c = Catalog(tmp_path / "trickle")
    c.put(_definition("10s"))
    for version in (1, 2):
        d = c.get("t")
        d.frontier = {"s": version}
        c.put(d)
    (newest,) = [p for p in (tmp_path / "trickle" / "state").glob("t.*.json") if '"s": 2' in p.read_text()]
    newest_text = newest.read_text()
    newest.write_text(newest_text.replace('"s": 2', '"s": 7'))  # a torn write: the line and its CRC disagree
    assert c.get("t").frontier == {"s": 1}
    d = c.get("t")
    d.frontier = {"s": 3}
    c.put(d)  # over the torn slot, not over the valid one
    assert c.get("t").frontier == {"s": 3}


def test_a_dropped_tables_state_is_not_read_by_its_successor(tmp_path: Any) -> None:
    c = Catalog(tmp_path / "trickle")
    c.put(_definition("10s"))
    d = c.get("t")
    d.frontier = {"s": 9}
    c.put(d)
    slots = {p.name: p.read_text() for p in (tmp_path / "trickle" / "state").glob("t.*.json")}
    c.delete("t")
    assert not list((tmp_path / "trickle" / "state").glob("t.*.json"))
    for name, text in slots.items():  # as if a crash had left them behind
        (tmp_path / "trickle" / "state" / name).write_text(text)
    again = _definition("10s")
    again.created_at = 1.0
    c.put(again)
    assert c.get("t").frontier is None


def test_an_alter_and_a_refresh_from_the_same_read_keep_each_others_change(tmp_path: Any) -> None:
    c = Catalog(tmp_path / "trickle")
    c.put(_definition("10s"))
    altering, refreshing = c.get("t"), c.get("t")
    refreshing.frontier = {"s": 4}
    c.put(refreshing)
    altering.schedule = "1m"
    c.put(altering)  # its stale state (no frontier) is not written back
    got = c.get("t")
    assert (got.schedule, got.frontier) == ("1m", {"s": 4})
    refreshing.last_action = "DIFFERENTIAL"
    c.put(refreshing)  # nor its stale declaration
    got = c.get("t")
    assert (got.schedule, got.frontier, got.last_action) == ("1m", {"s": 4}, "DIFFERENTIAL")


def _legacy_catalog(tmp_path: Any) -> Catalog:
    """A catalog holding ``t`` as written before the state slots: its state (frontier {"s": 5}, last refresh
    "r5") inside the definition file, and no slot."""
    c = Catalog(tmp_path / "trickle")
    legacy = _definition("10s")
    legacy.frontier, legacy.last_refresh_id = {"s": 5}, "r5"
    (tmp_path / "trickle" / "stream_tables" / "t.json").write_text(legacy.to_json())
    return c


def test_a_definition_from_before_the_state_slots_keeps_its_state(tmp_path: Any) -> None:
    import json

    c = _legacy_catalog(tmp_path)
    d = c.get("t")
    assert (d.frontier, d.last_refresh_id) == ({"s": 5}, "r5")
    d.frontier = {"s": 6}
    c.put(d)
    assert json.loads((tmp_path / "trickle" / "stream_tables" / "t.json").read_text())["frontier"] == {"s": 5}
    assert Catalog(tmp_path / "trickle").get("t").frontier == {"s": 6}  # the slot overrides the old key


def test_an_alter_of_a_definition_from_before_the_state_slots_keeps_its_state(tmp_path: Any) -> None:
    """The definition file is rewritten without state keys, so a state that lived only in it goes to a slot."""
    c = _legacy_catalog(tmp_path)
    d = c.get("t")
    d.schedule = "1m"  # the declaration only
    c.put(d)
    got = Catalog(tmp_path / "trickle").get("t")
    assert (got.schedule, got.frontier, got.last_refresh_id) == ("1m", {"s": 5}, "r5")
