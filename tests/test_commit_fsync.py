"""``trickle.commit.fsync``: a commit spark-trickle writes itself leaves its files to the kernel by default (as
Spark's and delta-rs' commits on a local disk do), and with the setting on has every file it names, their
folders, the log entry and the log folder synced before the refresh returns. A power loss cannot be staged in
a test, so the calls to ``os.fsync`` are recorded (and still made) and checked against what the commit names."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from connectors.delta_log import DeltaLog
from connectors.own_commit import FSYNC


def _rows(df: Any) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def test_a_commit_is_synced_only_with_the_setting_on(spark: Any, st: Any, make_source: Any, unique_name: Any,
                                                    monkeypatch: Any) -> None:
    src = make_source("fs_src", "id INT, k STRING, v INT", rows=[(i, "abc"[i % 3], i) for i in range(30)])
    name = unique_name("fs_agg")
    query = f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {src} GROUP BY k"
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    root = Path(st.catalog.get(name).path.removeprefix("file:")).resolve()
    synced: list[Path] = []
    real = os.fsync

    def watching(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", watching)
    for cycle, setting in enumerate(["false", "true", None]):
        if setting is None:
            spark.conf.unset(FSYNC)
        else:
            spark.conf.set(FSYNC, setting)
        synced.clear()
        spark.sql(f"UPDATE {src} SET v = v + 1 WHERE id % 3 = {cycle}")
        spark.sql(f"INSERT INTO {src} VALUES ({100 + cycle}, 'new{cycle}', 1)")
        result = st.refresh_stream_table(name)
        assert (result.apply or "").startswith("MERGE (own)"), result.apply
        assert _rows(st.read(name)) == _rows(spark.sql(query)), f"cycle {cycle}"
        ours = [p for p in synced if root in (p, *p.parents)]
        if setting != "true":
            assert ours == [], f"cycle {cycle} ({FSYNC}={setting}) synced {ours}"
            continue
        version = DeltaLog(spark, str(root)).latest_version()
        entry = root / "_delta_log" / f"{version:020d}.json"
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        named = {root / a[k]["path"] for a in actions for k in ("add", "cdc") if k in a}
        assert len(named) >= 2, actions  # the rewritten file and the change-data file
        assert named <= set(ours), f"files named by the commit but not synced: {named - set(ours)}"
        assert {root, root / "_change_data", root / "_delta_log"} <= set(ours), ours
        # the entry, synced before it was linked under its name: an unnamed file (O_TMPFILE, which /proc shows as
        # "#<inode> (deleted)", the inode the entry has now) or, on file systems without those, a temporary one
        unnamed = f"#{entry.stat().st_ino} (deleted)"
        temps = [p for p in ours if p.parent == root / "_delta_log"
                 and (p.name == unnamed or p.name.startswith(f".{entry.name}."))]
        assert len(temps) == 1, ours
        # the order a power loss needs: every named file and its folder before the entry, the log folder last
        assert max(ours.index(p) for p in named | {root, root / "_change_data"}) < ours.index(temps[0])
        assert ours[-1] == root / "_delta_log"
