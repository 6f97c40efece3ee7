"""The own MERGE's row logic (connectors/small_merge.py), without Spark: over random stored rows spread over
several files and random change rows (updates, deletes, inserts, deletes of absent rows), the files the
commit leaves and its change-data file must be what a plain-Python MERGE on ``__row_id`` gives, for a keyed
table (a matched row is replaced) and a plain-rows one (a matched row stays as it is)."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

SCHEMA = pa.schema([pa.field("__row_id", pa.int64(), nullable=False), pa.field("k", pa.string()),
                    pa.field("v", pa.int64(), nullable=False)])


def _expected(stored: dict[int, tuple[Any, ...]], changes: list[tuple[int, bool, Any, Any]],
              update: bool) -> tuple[Counter, Counter]:
    after, feed = dict(stored), Counter()
    for rid, gone, k, v in changes:
        old = stored.get(rid)
        if old is not None and gone:
            del after[rid]
            feed[("delete", *old)] += 1
        elif old is not None and update:
            after[rid] = (rid, k, v)
            feed[("update_preimage", *old)] += 1
            feed[("update_postimage", rid, k, v)] += 1
        elif old is None and not gone:
            after[rid] = (rid, k, v)
            feed[("insert", rid, k, v)] += 1
    return Counter(after.values()), feed


@pytest.mark.parametrize("update", [True, False])
def test_own_merge_rows_and_change_feed_match_a_plain_merge(tmp_path: Any, update: bool) -> None:
    from connectors import own_commit, small_merge

    rnd = random.Random(16 + update)
    for case in range(40):
        root = str(tmp_path / f"{case}")
        os.makedirs(os.path.join(root, "_delta_log"))
        ids = rnd.sample(range(-50, 200), rnd.randint(0, 40))
        stored = {i: (i, rnd.choice(["a", "b", None]), rnd.randint(0, 9)) for i in ids}
        files: dict[str, dict[str, Any]] = {}
        chunks = sorted(ids)
        for part in (chunks[: len(chunks) // 3], chunks[len(chunks) // 3:]):  # two files, disjoint id ranges
            if part:
                table = pa.Table.from_pylist([dict(zip(SCHEMA.names, stored[i], strict=True)) for i in part], SCHEMA)
                add = own_commit.add_action(root, table, own_commit.now_ms())[0]["add"]
                files[add["path"]] = add
        changed = rnd.sample(range(-60, 220), rnd.randint(1, 25))
        changes = [(i, gone, None if gone else rnd.choice(["x", None]), None if gone else rnd.randint(10, 19))
                   for i in changed for gone in [rnd.random() < 0.35]]
        rows = pa.table({"__row_id": pa.array([c[0] for c in changes], pa.int64()),
                         "k": pa.array([c[2] for c in changes], pa.string()),
                         "v": pa.array([c[3] for c in changes], pa.int64()),
                         "__del": pa.array([c[1] for c in changes], pa.bool_())})
        counts = small_merge.merge(root, 0, files, SCHEMA, rows, update, {}, 1, "test")
        want_rows, want_feed = _expected(stored, changes, update)
        actions = [json.loads(line) for line in open(os.path.join(root, "_delta_log", f"{1:020d}.json"))]
        removed = {a["remove"]["path"] for a in actions if "remove" in a}
        live = [p for p in files if p not in removed] + [a["add"]["path"] for a in actions if "add" in a]
        got = Counter(tuple(r.values()) for p in live for r in pq.read_table(os.path.join(root, p)).to_pylist())
        assert got == want_rows, (case, update)
        feed = Counter()
        for a in actions:
            if "cdc" in a:
                feed += Counter((r.pop("_change_type"), *r.values())
                                for r in pq.read_table(os.path.join(root, a["cdc"]["path"])).to_pylist())
        if not removed:  # nothing matched: the added file alone is the change feed (all inserts)
            feed = Counter(("insert", *r) for r in got - Counter(stored.values()))
        assert feed == want_feed, (case, update)
        assert counts == {kind: sum(n for f, n in want_feed.items() if f[0] == change)
                          for kind, change in (("inserted", "insert"), ("updated", "update_postimage"),
                                               ("deleted", "delete"))}, (case, update)
