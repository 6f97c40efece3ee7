"""Delta housekeeping (pipeline/housekeeping.py) on real Delta tables, checked by the oracle.

- Compaction, checkpoints, VACUUM and log cleanup of stream tables keep every file and commit a frontier
  still reads: a downstream table left behind refreshes differentially afterwards and equals its query.
- Once the log is cleaned, finding the latest version and the last refresh commit starts from the
  checkpoint: the ``_delta_log`` directory is never listed.
- A change history removed under a frontier (commit files deleted by log retention, files by VACUUM): AUTO
  recomputes with the reason in its history, DIFFERENTIAL and strict mode fail with an error naming the
  source and the versions.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

from connectors import delta_log
from connectors.delta_log import DeltaLog
from pipeline import SourceChangedError, StreamTables, housekeeping

#: everything due at once: housekeeping's effects show after a few commits, not after days
EAGER = housekeeping.Settings(checkpoint_every=1, compact_min_files=1, retain_hours=0, log_retain_hours=0)


def rows(df: Any) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def data_files(path: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(path):
        if "_delta_log" not in dirpath:
            out += [os.path.join(dirpath, f) for f in files if f.endswith(".parquet")]
    return out


def log_commits(path: str) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(os.path.join(path, "_delta_log")) if n.endswith(".json")
                  and n[:20].isdigit())


def test_housekeeping_keeps_what_frontiers_need(spark: Any, st: Any, make_source: Any, unique_name: Any,
                                                capsys: Any) -> None:
    """An upstream table refreshed many times (many small files and commits) while its downstream lags:
    housekeeping compacts, checkpoints, vacuums and cleans the upstream's log, yet keeps the versions the
    downstream's frontier reads, so the downstream then refreshes DIFFERENTIAL and equals its query."""
    src = make_source("hk_src", "id INT, g INT, v INT", rows=[(i, i % 3, i) for i in range(20)])
    up, down = unique_name("hk_up"), unique_name("hk_down")
    up_q = f"SELECT id, g, v FROM {src} WHERE v >= 0"
    st.create_stream_table(up, up_q, refresh_mode="DIFFERENTIAL")
    down_q = f"SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {up} GROUP BY g"
    st.create_stream_table(down, down_q, refresh_mode="DIFFERENTIAL")
    up_path = st.catalog.get(up).path
    for i in range(4):  # the upstream moves on alone: refresh commits the downstream has not read
        spark.sql(f"UPDATE {src} SET v = v + 1 WHERE id = {i}")
        spark.sql(f"INSERT INTO {src} VALUES ({100 + i}, {i % 3}, {i})")
        assert st.refresh_stream_table(up).action == "DIFFERENTIAL"
    needed = DeltaLog(spark, st.catalog.get(down).path).last_trickle_commit()[1]["frontier"][up]
    files_before = len(data_files(up_path))

    reports = {r.name: r for r in housekeeping.maintain(st, settings=EAGER)}
    r = reports[up]
    assert not r.skipped, r
    assert r.needed_from == needed and r.checkpoint is not None, r
    assert r.compacted or housekeeping.live_file_count(up_path) <= EAGER.compact_min_files, r
    assert r.vacuumed_files == 0, r  # every removed file is still read by the downstream's window
    assert len(data_files(up_path)) >= files_before
    assert log_commits(up_path)[0] <= needed

    got = st.refresh_stream_table(down)
    assert got.action == "DIFFERENTIAL", got
    assert rows(st.read(down)) == rows(spark.sql(down_q))

    # now nothing reads the old versions: the next round deletes their files and commits
    spark.sql(f"INSERT INTO {src} VALUES (200, 1, 5)")
    assert st.refresh_stream_table(up).action == "DIFFERENTIAL"
    assert st.refresh_stream_table(down).action == "DIFFERENTIAL"
    rounds = [{r.name: r for r in housekeeping.maintain(st, settings=EAGER)}[up] for _ in range(2)]
    assert not [r.skipped for r in rounds if r.skipped], rounds
    assert sum(r.vacuumed_files for r in rounds) > 0 and sum(r.log_files_removed for r in rounds) > 0, rounds
    assert len(data_files(up_path)) < files_before
    assert log_commits(up_path)[0] > needed
    for i in range(2):
        spark.sql(f"UPDATE {src} SET v = v * 2 WHERE g = {i}")
        assert st.refresh_stream_table(up).action == "DIFFERENTIAL"
        assert st.refresh_stream_table(down).action == "DIFFERENTIAL"
        assert rows(st.read(up)) == rows(spark.sql(up_q))
        assert rows(st.read(down)) == rows(spark.sql(down_q))
    assert rows(spark.read.format("delta").load(up_path).select("id", "g", "v")) == rows(spark.sql(up_q))

    # `trickle maintain NAME`: the same, one line per table
    from pipeline.cli import _cmd_maintain, build_parser

    assert _cmd_maintain(build_parser().parse_args(["maintain", up]), st, None) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"{up}: ") and "skipped" not in out[0], out


def test_log_listing_starts_from_the_checkpoint(spark: Any, st: Any, make_source: Any, unique_name: Any,
                                                monkeypatch: Any) -> None:
    """After housekeeping, the latest version, the last refresh commit and a NO_DATA refresh are found
    without listing ``_delta_log`` (listing is made to fail), and the log holds only the commits since the
    checkpoint (the source's too: ``sources=True`` maintains it)."""
    src = make_source("ck_src", "id INT, v INT", rows=[(1, 1)])
    name = unique_name("ck_st")
    query = f"SELECT id, v FROM {src}"
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    for i in range(4):
        spark.sql(f"INSERT INTO {src} VALUES ({10 + i}, {i})")
        st.refresh_stream_table(name)
    path = st.catalog.get(name).path
    housekeeping.maintain(st, settings=EAGER, sources=True)
    spark.sql(f"INSERT INTO {src} VALUES (99, 99)")
    st.refresh_stream_table(name)
    housekeeping.maintain(st, settings=EAGER, sources=True)
    assert len(log_commits(path)) <= 3, log_commits(path)
    st.refresh_stream_table(name)  # reads past the source's compaction commit (a window with no change)

    delta_log._LATEST_SEEN.clear()

    def no_listing(self: Any) -> list[str]:
        raise AssertionError(f"listed {self.log_dir}")

    monkeypatch.setattr(DeltaLog, "_list", no_listing)
    log = DeltaLog(spark, path)
    latest = log.latest_version()
    assert latest == max(log_commits(path))
    assert log.last_trickle_commit() is not None
    assert st.refresh_stream_table(name).action == "NO_DATA"
    spark.sql(f"INSERT INTO {src} VALUES (100, 100)")
    assert st.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert rows(st.read(name)) == rows(spark.sql(query))


def _remove_history(spark: Any, src: str) -> None:
    """Checkpoint the source and delete its commit files before the checkpoint, as Delta's log retention
    (``delta.logRetentionDuration``) does, with delta-rs' own cleanup."""
    from deltalake import DeltaTable

    location = str(spark.sql(f"DESCRIBE DETAIL {src}").first()["location"])
    dt = DeltaTable(location)
    dt.create_checkpoint()
    dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    DeltaTable(location).cleanup_metadata()
    DeltaTable(location).create_checkpoint()
    DeltaTable(location).cleanup_metadata()


def test_change_history_removed_by_log_retention(spark: Any, st: Any, make_source: Any,
                                                 unique_name: Any) -> None:
    """The commits a frontier reads are gone: AUTO recomputes and records why; strict mode and DIFFERENTIAL
    fail naming the source, the versions and the remedy."""
    src = make_source("lr_src", "id INT, v INT")
    spark.sql(f"INSERT INTO {src} SELECT CAST(id AS INT), CAST(id % 7 AS INT) FROM range(1, 5001)")
    query = f"SELECT v, COUNT(*) AS n FROM {src} GROUP BY v"
    auto_t, diff_t = unique_name("lr_auto"), unique_name("lr_diff")
    st.create_stream_table(auto_t, query, refresh_mode="AUTO")
    st.create_stream_table(diff_t, query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"UPDATE {src} SET v = 5 WHERE id = 1")
    spark.sql(f"DELETE FROM {src} WHERE id = 2")
    _remove_history(spark, src)
    strict = StreamTables(spark, root=str(st.catalog.root), strict=True)
    with pytest.raises(SourceChangedError, match=rf"source {src} between versions 1 and \d+") as e:
        strict.refresh_stream_table(auto_t)
    assert "strict mode" in str(e.value) and "refresh_mode" in str(e.value)
    r = st.refresh_stream_table(auto_t)
    assert r.action == "FULL" and "no longer readable" in r.reason and src in r.reason, r
    assert st.history(auto_t)[0]["reason"] == r.reason
    assert rows(st.read(auto_t)) == rows(spark.sql(query))
    with pytest.raises(SourceChangedError, match=rf"source {src} between versions 1 and \d+"):
        st.refresh_stream_table(diff_t)
    status = {s["name"]: s for s in st.status()}
    assert status[diff_t]["status"] == "ERROR" and src in status[diff_t]["last_error"]


def test_history_stays_bounded(tmp_path: Any, monkeypatch: Any) -> None:
    """A table refreshed every second records a decision every second: the catalog keeps the newest
    ``HISTORY_KEEP`` records, pruning every ``HISTORY_PRUNE_EVERY`` appends, so the history never holds
    more than their sum, and the newest records survive."""
    from pipeline import catalog

    monkeypatch.setattr(catalog, "HISTORY_KEEP", 30)
    cat = catalog.Catalog(tmp_path / "trickle")
    for i in range(450):
        cat.append_history("busy", {"refresh_id": f"r{i:04d}", "started_at": 1_000_000.0 + i, "action": "NO_DATA"})
        held = len(os.listdir(tmp_path / "trickle" / "history" / "busy"))
        assert held <= catalog.HISTORY_KEEP + catalog.HISTORY_PRUNE_EVERY, (i, held)
    assert [r["refresh_id"] for r in cat.history("busy", limit=3)] == ["r0449", "r0448", "r0447"]
