"""Driver-side reads of tables with deletion vectors (connectors/vector_reads.py) against Spark's own reads.

* every reader the driver uses (the lazily scanned dataset DuckDB filters, ``read_small``, ``rows_with``) at
  every version of a table whose vectors Spark wrote (storage type ``u``) and of a commit made here with an
  inline (``i``) and an absolute-path (``p``) vector, which Spark reads too: the same rows as Spark;
* change windows: read from change-data files (Spark's UPDATE and MERGE) as ``table_changes`` gives them,
  refused where only the vectors tell the change (Spark's DELETE, the hand-made commit);
* the oracle: a user's source with deletion vectors, a plain-rows stream table over it committed with
  spark-trickle's own vectors, and stream tables downstream of both, over random changes with duplicates and
  NULLs, equal to their queries after every cycle, their deltas computed by DuckDB wherever the change feed is
  in change-data files.
"""

from __future__ import annotations

import json
import os
import random
import struct
import time
import zlib
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
from oracle import assert_matches

from connectors import deletion_vectors as dv
from connectors import delta_rs, vector_reads
from connectors.delta_log import DeltaLog
from pipeline import strategy


def _bag(rows: Any) -> Counter:
    return Counter(tuple(r) for r in rows)


def _arrow_bag(table: Any, columns: list[str]) -> Counter:
    return Counter(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def _hand_made_commit(path: str, version: int, spark: Any) -> None:
    """Version ``version + 1``: more rows of one marked file deleted by an inline vector, and another file's
    vector moved to an absolute path outside the table with more rows deleted (no change-data file)."""
    files = dv.live_files(DeltaLog(spark, path), version)
    marked = sorted(rel for rel, add in files.items() if add.get("deletionVector"))
    plain = sorted(rel for rel, add in files.items() if not add.get("deletionVector"))
    inline_file, absolute_file = marked[0], plain[0]
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": now, "operation": "DELETE",
                                                      "operationParameters": {}, "isBlindAppend": False}}]
    for rel, storage in ((inline_file, "i"), (absolute_file, "p")):
        add = files[rel]
        old = dv.read_vector(path, add["deletionVector"]) if add.get("deletionVector") else np.empty(0, np.uint64)
        stats = json.loads(add["stats"])
        positions = np.union1d(old.astype(np.int64), np.arange(1, int(stats["numRecords"]), 3)[:3])
        data = dv.encode(positions)
        if storage == "i":
            padded = data + b"\0" * (-len(data) % 4)
            vector = {"storageType": "i", "pathOrInlineDv": dv.z85(padded), "sizeInBytes": len(data),
                      "cardinality": len(positions)}
        else:
            target = os.path.join(os.path.dirname(path), "vectors elsewhere", "absolute.bin")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(b"\x01" + struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data)))
            vector = {"storageType": "p", "pathOrInlineDv": "file://" + target.replace(" ", "%20"), "offset": 1,
                      "sizeInBytes": len(data), "cardinality": len(positions)}
        remove = {"path": rel, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                  "partitionValues": {}, "size": add["size"]}
        if add.get("deletionVector"):
            remove["deletionVector"] = add["deletionVector"]
        stats["tightBounds"] = False
        new = {**{k: v for k, v in add.items() if k not in ("deletionVector", "stats")},
               "dataChange": True, "deletionVector": vector, "stats": json.dumps(stats)}
        actions += [{"remove": remove}, {"add": new}]
    with open(os.path.join(path, "_delta_log", f"{version + 1:020d}.json"), "x", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")


def test_driver_readers_leave_out_what_vectors_mark(spark: Any, tmp_path: Any, monkeypatch: Any,
                                                    python_in_scans: list[str]) -> None:
    path = str(tmp_path / "t")
    (spark.range(0, 300).selectExpr("id", "CASE WHEN id % 10 = 0 THEN NULL ELSE CAST(id % 7 AS STRING) END AS s")
     .repartitionByRange(3, "id").write.format("delta").option("delta.enableDeletionVectors", "true")
     .option("delta.enableChangeDataFeed", "true").save(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0 AND id < 90")  # v1: one file marked, no cdc
    spark.sql(f"UPDATE delta.`{path}` SET s = 'u' WHERE id % 11 = 0 AND id < 90")  # v2: marked, with cdc
    _hand_made_commit(path, 2, spark)  # v3: inline and absolute-path vectors, no cdc
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT id FROM range(0, 300) WHERE id % 5 = 2) m ON t.id = m.id "
              "WHEN MATCHED AND m.id > 200 THEN DELETE WHEN MATCHED THEN UPDATE SET s = 'm'")  # v4: with cdc
    log = DeltaLog(spark, path)
    assert log.latest_version() == 4 and delta_rs.unreadable(log.protocol(4)) is None
    storage = {a["deletionVector"]["storageType"] for a in dv.live_files(log, 3).values() if a.get("deletionVector")}
    assert storage == {"i", "p"}, storage

    import duckdb

    wanted = pa.array([1, 4, 9, 14, 22, 33, 150, 202, 299], pa.int64())
    whole_bytes = delta_rs.READ_WHOLE_BYTES
    for v in (1, 2, 3, 4):
        truth = _bag(spark.sql(f"SELECT id, s FROM delta.`{path}` VERSION AS OF {v}").collect())
        data = delta_rs.dataset(path, v)
        assert _arrow_bag(data.to_table(), ["id", "s"]) == truth, v
        assert _arrow_bag(delta_rs.read_small(path, v, 1 << 30, 10**6), ["id", "s"]) == truth, v
        picked = delta_rs.rows_with(path, v, ["id", "s"], "id", wanted)
        assert _arrow_bag(picked, ["id", "s"]) == Counter({r: n for r, n in truth.items() if r[0] in wanted.to_pylist()})
        # a string filter DuckDB pushes into the scan, and a count: the marked files held in memory and scanned
        # by Arrow alone, and (above delta_rs.READ_WHOLE_BYTES) streamed to it by Python one at a time
        for held in (True, False):
            monkeypatch.setattr(delta_rs, "READ_WHOLE_BYTES", whole_bytes if held else 0)
            python_in_scans.clear()
            con = duckdb.connect()
            con.register("t", data)
            got = con.execute("SELECT id, s FROM t WHERE s = '3' OR s IS NULL").fetchall()
            assert _bag(got) == Counter({r: n for r, n in truth.items() if r[1] in ("3", None)}), (v, held)
            assert con.execute("SELECT COUNT(*) FROM t").fetchone()[0] == sum(truth.values())
            con.close()
            assert bool(python_in_scans) != held, (v, held, python_in_scans)
        monkeypatch.setattr(delta_rs, "READ_WHOLE_BYTES", whole_bytes)  # the readers above, as shipped
        # delta-rs' decoding of every vector equals the protocol's, read here (u, i and p)
        opened = delta_rs.opened(path, v)
        decoded = vector_reads.deleted_positions(opened)
        for rel, add in dv.live_files(DeltaLog(spark, path), v).items():
            if add.get("deletionVector"):
                assert decoded[os.path.join(path, rel)].tolist() == sorted(
                    dv.read_vector(path, add["deletionVector"]).tolist()), (v, rel)

    def feed(first: int, last: int) -> Counter:
        return _bag(spark.sql(f"SELECT id, s, _change_type, _commit_version FROM table_changes_by_path('{path}', "
                              f"{first}, {last})").collect())

    for first, last in ((2, 2), (4, 4)):
        changes = delta_rs.read_changes(path, first, last, 10**6)
        assert changes is not None and _arrow_bag(changes, ["id", "s", "_change_type", "_commit_version"]) == \
            feed(first, last), (first, last)
    assert [DeltaLog(spark, path).marked_without_changes_between(v - 1, v) for v in range(1, 5)] == [1, None, 3, None]
    assert delta_rs.read_changes(path, 1, 1, 10**6) is None and delta_rs.read_changes(path, 2, 4, 10**6) is None


def test_stream_tables_over_vectors_keep_their_deltas_on_duckdb(
        spark: Any, st: Any, unique_name: Any) -> None:
    """A user's source with deletion vectors (Spark's MERGE and UPDATE, which write change-data files, and
    DELETE, which does not), a plain-rows stream table over it committed with spark-trickle's own vectors, and
    stream tables reading that one and both: every refresh equals the query, and every delta reading only
    change-data files is computed by DuckDB."""
    rng = random.Random(38)
    src = unique_name("dvr_src")
    spark.sql(f"CREATE TABLE {src} (k INT, v INT, s STRING) USING delta TBLPROPERTIES "
              "(delta.enableChangeDataFeed = true, delta.enableDeletionVectors = true)")

    def row() -> str:
        v = "NULL" if rng.random() < 0.2 else str(rng.randrange(5))
        s = "NULL" if rng.random() < 0.2 else f"'{rng.choice('abc')}'"
        return f"({rng.randrange(1, 12)}, {v}, {s})"

    spark.sql(f"INSERT INTO {src} VALUES {', '.join([row() for _ in range(30)] * 2)}")  # every row twice
    names = {n: unique_name(f"dvr_{n}") for n in ("rows", "groups", "joined")}
    queries = {
        "rows": f"SELECT k, v, s FROM {src} WHERE v IS NULL OR v <> 3",
        "groups": f"SELECT s, COUNT(*) AS n, SUM(v) AS total FROM {names['rows']} GROUP BY s",
        "joined": f"SELECT r.k, r.s, x.v FROM {names['rows']} r JOIN {src} x ON r.k = x.k AND r.s = x.s",
    }
    spark.conf.set(strategy.VECTORS_ABOVE_ROWS, "0")
    try:
        for n in ("rows", "groups", "joined"):
            st.create_stream_table(names[n], queries[n], refresh_mode="DIFFERENTIAL")
        applied: list[tuple[int, str, str]] = []
        for cycle in range(3):
            gone, moved = rng.sample(range(1, 12), 2)  # one MERGE: inserts (each twice), a delete, an update
            changes = [f"('I', {r[1:]}" for r in [row() for _ in range(3)] * 2] + \
                [f"('D', {gone}, NULL, NULL)", f"('U', {moved}, NULL, NULL)"]
            spark.sql(f"MERGE INTO {src} t USING (SELECT * FROM VALUES {', '.join(changes)} AS m(op, k, v, s)) m "
                      "ON m.op <> 'I' AND t.k = m.k "
                      f"WHEN MATCHED AND m.op = 'D' AND (t.v IS NULL OR t.v = {rng.randrange(5)}) THEN DELETE "
                      f"WHEN MATCHED AND m.op = 'U' THEN UPDATE SET s = 'm{cycle}', v = NULL "
                      "WHEN NOT MATCHED AND m.op = 'I' THEN INSERT (k, v, s) VALUES (m.k, m.v, m.s)")
            if cycle == 1:
                spark.sql(f"DELETE FROM {src} WHERE k = {rng.randrange(1, 12)} OR v = 4")
            for n in ("rows", "groups", "joined"):
                r = st.refresh_stream_table(names[n])
                assert r.action in ("DIFFERENTIAL", "NO_DATA"), (n, r.action, r.reason)
                if r.action == "DIFFERENTIAL":
                    applied.append((cycle, n, r.apply or ""))
                assert_matches(spark, st, names[n], queries[n], f"cycle {cycle}")
        assert {n for _, n, _ in applied} == set(names), applied
        for cycle, n, apply in applied:
            if cycle == 1 and n != "groups":  # src's window holds the DELETE: only vectors tell its change
                assert "delta computed by spark" in apply and "deletion vectors" in apply, (cycle, n, apply)
            else:
                assert apply.endswith("delta computed by duckdb"), (cycle, n, apply)
        assert any(apply.startswith("MERGE (vectors)") for _, n, apply in applied if n == "rows"), applied
        assert vector_reads.enabled(DeltaLog(spark, st.catalog.get(names["rows"]).path).protocol(
            DeltaLog(spark, st.catalog.get(names["rows"]).path).latest_version()))
    finally:
        spark.conf.unset(strategy.VECTORS_ABOVE_ROWS)
