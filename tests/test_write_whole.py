"""``connectors.storage.write_whole``: a local file that appears whole or not at all, and not over another
(what a Delta commit's log entry, the lease and the history records need), by an unnamed file where the file
system has them and a named temporary one elsewhere; both ways give the same answers and leave nothing
behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from connectors import own_commit, storage


@pytest.fixture(params=["unnamed", "named"])
def way(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    folder = tmp_path / "log"
    if request.param == "named":
        storage._NO_TMPFILE.add(str(folder))
    yield folder
    storage._NO_TMPFILE.discard(str(folder))


def test_appears_whole_and_never_over_another(way: Path) -> None:
    target = way / "00000000000000000001.json"
    storage.write_whole(str(target), b"first\n")  # the folder made on the way
    assert target.read_bytes() == b"first\n"
    with pytest.raises(FileExistsError):
        storage.write_whole(str(target), b"second\n")
    assert target.read_bytes() == b"first\n"
    assert os.listdir(way) == [target.name]  # no temporary file left, whichever way it went


def test_commit_and_lease_semantics(way: Path) -> None:
    entry = way / "00000000000000000007.json"
    own_commit.put_if_absent(str(entry), '{"commitInfo":{}}\n', sync=True)
    with pytest.raises(own_commit.CommitFailed, match="version 7 was committed by another writer"):
        own_commit.put_if_absent(str(entry), '{"other":1}\n')
    assert entry.read_text() == '{"commitInfo":{}}\n'
    store = storage.LocalStorage()
    store.put_if_absent(str(way / "lease.json"), "mine")
    with pytest.raises(storage.Exists):
        store.put_if_absent(str(way / "lease.json"), "theirs")
    assert (way / "lease.json").read_text() == "mine"
    assert sorted(os.listdir(way)) == [entry.name, "lease.json"]


def test_a_file_system_without_unnamed_files_is_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if getattr(os, "O_TMPFILE", None) is None:
        pytest.skip("no O_TMPFILE on this platform: the named way is the only one")  # not Linux
    real_open, refused = os.open, []

    def no_unnamed(path, flags, *args):  # type: ignore[no-untyped-def]
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            refused.append(path)
            raise OSError(95, "Operation not supported")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_unnamed)
    folder = tmp_path / "fs"
    folder.mkdir()
    for i in range(3):
        storage.write_whole(str(folder / f"f{i}"), b"x")
    assert refused == [str(folder)] and sorted(os.listdir(folder)) == ["f0", "f1", "f2"]
    storage._NO_TMPFILE.discard(str(folder))


def test_a_forked_child_names_its_own_files(tmp_path: Path) -> None:
    storage.write_whole(str(tmp_path / "parent"), b"p")  # the parent's /proc/self/fd is open now
    pid = os.fork()
    if pid == 0:  # the child: its file descriptors are its own, so must its /proc folder be
        code = 1
        try:
            storage.write_whole(str(tmp_path / "child"), b"from the child")
            code = 0 if (tmp_path / "child").read_bytes() == b"from the child" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "child").read_bytes() == b"from the child"


def test_read_local_reads_what_was_written(tmp_path: Path) -> None:
    assert storage.read_local(str(tmp_path / "missing")) is None
    for size in (0, 1, 4096, 3 << 20):
        data = os.urandom(size)
        storage.write_whole(str(tmp_path / f"f{size}"), data)
        assert storage.read_local(str(tmp_path / f"f{size}")) == data
    assert storage.LocalStorage().read_text(str(tmp_path / "missing")) is None


def test_create_writes_a_new_name_and_writes_it_again(way: Path) -> None:
    store = storage.LocalStorage()
    target = str(way / "1796-abc.json")
    store.create(target, '{"a": 1}')  # the folder made on the way
    assert store.read_text(target) == '{"a": 1}'
    store.create(target, '{"a": 2}')  # the same record again: replaced, not refused
    assert store.read_text(target) == '{"a": 2}'
    assert os.listdir(way) == ["1796-abc.json"]


@pytest.mark.unit
def test_unplanned_offsets_cleared_and_a_planned_checkpoint_kept(tmp_path: Path) -> None:
    """``clear_unplanned_offsets``: the temporary files a first batch cut short left in ``offsets/`` go, the
    rest of the checkpoint (a Kafka source's initial offsets) stays; a checkpoint with a planned batch, or
    none at all, is not touched."""
    local = storage.LocalStorage()
    ckpt = tmp_path / "ckpt"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "sources" / "0").mkdir(parents=True)
    (ckpt / "sources" / "0" / "0").write_text("v1\n{}")
    (ckpt / "offsets" / ".0.5f1c.tmp").write_bytes(b"")
    (ckpt / "offsets" / "..0.5f1c.tmp.crc").write_bytes(b"")
    assert sorted(storage.clear_unplanned_offsets(local, str(ckpt))) == ["..0.5f1c.tmp.crc", ".0.5f1c.tmp"]
    assert list((ckpt / "offsets").iterdir()) == [] and (ckpt / "sources" / "0" / "0").is_file()

    (ckpt / "offsets" / "0").write_text("v1\n")
    (ckpt / "offsets" / ".1.77aa.tmp").write_bytes(b"")  # a later batch cut short: Spark's own to handle
    assert storage.clear_unplanned_offsets(local, str(ckpt)) == []
    assert sorted(p.name for p in (ckpt / "offsets").iterdir()) == [".1.77aa.tmp", "0"]
    assert storage.clear_unplanned_offsets(local, str(tmp_path / "none")) == []


@pytest.mark.unit
def test_an_interrupted_table_creation_is_cleared_and_anything_else_kept(tmp_path: Path) -> None:
    """``clear_interrupted_create``: a folder holding only the ``_delta_log`` of a first commit that never
    landed (empty, or its temporary file) goes; a table with a commit or a checkpoint, a folder with anything
    outside ``_delta_log``, or no folder at all, stays."""
    local = storage.LocalStorage()
    empty = tmp_path / "empty"
    (empty / "_delta_log").mkdir(parents=True)
    assert storage.clear_interrupted_create(local, str(empty)) and not empty.exists()
    cut = tmp_path / "cut"
    (cut / "_delta_log" / "_staged_commits").mkdir(parents=True)
    (cut / "_delta_log" / ".00000000000000000000.json.5f1c.tmp").write_bytes(b"{}")
    assert storage.clear_interrupted_create(local, str(cut)) and not cut.exists()

    for name, entry in (("committed", "00000000000000000000.json"),
                        ("checkpointed", "00000000000000000010.checkpoint.parquet")):
        kept = tmp_path / name
        (kept / "_delta_log").mkdir(parents=True)
        (kept / "_delta_log" / entry).write_bytes(b"{}")
        assert not storage.clear_interrupted_create(local, str(kept)) and (kept / "_delta_log" / entry).is_file()
    data = tmp_path / "data"
    (data / "_delta_log").mkdir(parents=True)
    (data / "part-0000.parquet").write_bytes(b"PAR1")
    assert not storage.clear_interrupted_create(local, str(data)) and (data / "part-0000.parquet").is_file()
    plain = tmp_path / "plain"  # a folder with no Delta log at all: not Delta's, not ours
    plain.mkdir()
    assert not storage.clear_interrupted_create(local, str(plain)) and plain.is_dir()
    assert not storage.clear_interrupted_create(local, str(tmp_path / "none"))


@pytest.mark.unit
def test_the_batch_planned_and_not_committed_is_found(tmp_path: Path) -> None:
    """``uncommitted_batch``: the last planned batch when ``commits/`` lacks it; None when every planned batch
    committed or nothing was planned (temporary files are not batches)."""
    local = storage.LocalStorage()
    ckpt = tmp_path / "ckpt"
    assert storage.uncommitted_batch(local, str(ckpt)) is None
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "commits").mkdir()
    (ckpt / "offsets" / ".0.5f1c.tmp").write_bytes(b"")
    assert storage.uncommitted_batch(local, str(ckpt)) is None
    for n in (0, 1, 2):
        (ckpt / "offsets" / str(n)).write_text("v1\n")
    for n in (0, 1):
        (ckpt / "commits" / str(n)).write_text("v1\n")
    assert storage.uncommitted_batch(local, str(ckpt)) == 2
    (ckpt / "commits" / "2").write_text("v1\n")
    assert storage.uncommitted_batch(local, str(ckpt)) is None
