"""Source schema evolution of Delta sources (issue 19 point 2), each case provoked on real Delta tables.

- A column added that the query does not read: the refresh stays DIFFERENTIAL and its reason notes the column.
- A column the query reads widened (Delta type widening, INT -> BIGINT), or dropped and added again under the
  same name (column mapping): REINITIALIZE with the reason, then DIFFERENTIAL again.
- A column the query reads dropped or renamed (column mapping): ERROR naming the column and the remedy, the
  table's rows untouched, and the scheduler does not retry it; restoring the column and resuming brings it
  back.

Every refresh that produces rows is checked against the query recomputed from scratch (tests/oracle.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from oracle import assert_matches

from pipeline import SourceChangedError
from pipeline.scheduler import Scheduler
from pipeline.source_schema import Verdict, compare, is_widening, record

MAPPED = "delta.enableChangeDataFeed = true, 'delta.columnMapping.mode' = 'name'"


def _source(spark: Any, name: str, columns: str, rows: str, props: str = MAPPED) -> str:
    spark.sql(f"CREATE TABLE {name} ({columns}) USING delta TBLPROPERTIES ({props})")
    spark.sql(f"INSERT INTO {name} VALUES {rows}")
    return name


def _status(st: Any, name: str) -> dict[str, Any]:
    return next(s for s in st.status() if s["name"] == name)


# --- the pure comparison ------------------------------------------------------------------------------------


def _schema(*fields: tuple[str, str, int | None]) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True,
         "metadata": {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": f"col-{i}"} if i else {}}
        for n, t, i in fields]})


def test_compare_decides_each_kind_of_change() -> None:
    seen = record(_schema(("id", "integer", 1), ("v", "integer", 2), ("w", "string", 3)), read=["id", "v"])

    def verdict(*fields: tuple[str, str, int | None]) -> Verdict:
        out = Verdict()
        compare("t", "src", seen, _schema(*fields), out)
        return out

    same = verdict(("id", "integer", 1), ("v", "integer", 2), ("w", "string", 3))
    assert (same.action, same.notes) == ("NONE", [])
    added = verdict(("id", "integer", 1), ("v", "integer", 2), ("w", "string", 3), ("x", "double", 4))
    assert added.action == "NONE" and "added column x double" in added.notes[0]
    widened = verdict(("id", "integer", 1), ("v", "long", 2), ("w", "string", 3))
    assert widened.action == "REINITIALIZE" and "v widened from int to bigint" in widened.reason
    readded = verdict(("id", "integer", 1), ("w", "string", 3), ("v", "integer", 5))
    assert readded.action == "REINITIALIZE" and "dropped and added again" in readded.reason
    renamed = verdict(("id", "integer", 1), ("vv", "integer", 2), ("w", "string", 3))
    assert renamed.action == "ERROR" and "column v of source src was renamed to vv" in renamed.reason
    dropped = verdict(("id", "integer", 1), ("w", "string", 3))
    assert dropped.action == "ERROR" and "was dropped" in dropped.reason and "add column v back" in dropped.reason
    unread = verdict(("id", "integer", 1), ("v", "integer", 2))
    assert unread.action == "REINITIALIZE" and "w, which the query does not read, was dropped" in unread.reason
    star = Verdict()
    compare("t", "src", {**seen, "star": True}, _schema(("id", "integer", 1), ("v", "integer", 2),
                                                        ("w", "string", 3), ("x", "double", 4)), star)
    assert star.action == "REINITIALIZE" and "selects *" in star.reason


def test_distinct_schemas_of_raw_records() -> None:
    from connectors.kafka_mirror import _distinct_schemas

    events = [_event("c", {"id": i, "v": i}, {"id": INT32, "v": INT32}, i)[1] for i in range(3)]
    events.append(_event("c", {"id": 9, "v": "x"}, {"id": INT32, "v": STRING}, 9)[1])
    spaced = json.dumps(json.loads(events[-1])).encode()  # not laid out as the converter does: parsed whole
    found = _distinct_schemas([*events, spaced, None, b"not json"])
    assert len(found) == 3 and found[0] == json.loads(events[0])["schema"]
    assert found[1] == found[2] == json.loads(events[-1])["schema"]


def test_read_columns_and_star() -> None:
    import dvm
    from pipeline.source_schema import read_columns, selects_star

    schemas = {"a": [("id", "int"), ("x", "int")], "b": [("id", "int"), ("v", "int"), ("w", "string")]}
    plan = dvm.compile_query("SELECT a.id, SUM(b.v) AS s FROM a JOIN b ON a.id = b.id WHERE b.v > 0 GROUP BY a.id",
                             schemas)
    assert read_columns(plan.root) == {"a": {"id"}, "b": {"id", "v"}}
    assert read_columns(dvm.compile_query("SELECT COUNT(*) AS n FROM b", schemas).root) == {"b": set()}
    assert selects_star("SELECT * FROM a") and selects_star("SELECT a.*, b.v FROM a JOIN b ON a.id = b.id")
    assert not selects_star("SELECT COUNT(*) AS n FROM a") and not selects_star("SELECT id FROM a")


def test_type_widening_rules() -> None:
    assert is_widening("int", "bigint") and is_widening("tinyint", "int") and is_widening("float", "double")
    assert is_widening("int", "double") and is_widening("date", "timestamp_ntz")
    assert is_widening("decimal(10,2)", "decimal(12,2)") and is_widening("int", "decimal(12,2)")
    assert not is_widening("bigint", "int") and not is_widening("int", "string")
    assert not is_widening("bigint", "double") and not is_widening("decimal(10,2)", "decimal(10,3)")
    assert not is_widening("int", "decimal(10,2)")


def test_debezium_schema_evolution_decisions() -> None:
    from connectors import debezium_schema as ds

    def envelope(**types: dict[str, Any]) -> dict[str, Any]:
        fields = [{**t, "field": n} for n, t in types.items()]
        return {"type": "struct", "fields": [{"type": "struct", "fields": fields, "field": "after"},
                                             {"type": "string", "field": "op"}]}

    dec = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": "2", "connect.decimal.precision": "10"}}
    ts = {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}
    assert ds.columns(envelope(id=INT32, amount=dec, at=ts, s=STRING)) == [
        ("id", "INT"), ("amount", "DECIMAL(10,2)"), ("at", "TIMESTAMP"), ("s", "STRING")]
    mirror = [("id", "int"), ("amount", "decimal(10,2)"), ("n", "bigint")]
    same = ds.evolve(mirror, [envelope(id=INT32, amount=dec, n={"type": "int32"})])  # narrower: fits
    assert not same.changes and not same.conflicts
    wider = {**dec, "parameters": {"scale": "2", "connect.decimal.precision": "14"}}
    ev = ds.evolve(mirror, [envelope(id=INT32, amount=wider, n=INT64, extra=STRING)], "src")
    assert ev.added == [("extra", "STRING")] and ev.widened == [("amount", "DECIMAL(10,2)", "DECIMAL(14,2)")]
    bad = ds.evolve(mirror, [envelope(id=INT32, amount=STRING, n=INT64)], "src")
    assert list(bad.conflicts) == ["amount"] and "dead-letter" in bad.conflicts["amount"][1]
    assert ds.conflicting(envelope(id=INT32, amount=STRING), bad.conflicts) is not None
    assert ds.conflicting(envelope(id=INT32, amount=dec), bad.conflicts) is None
    assert ds.key_columns({"type": "struct", "fields": [{"type": "int32", "field": "id"}]}) == ["id"]


# --- on real Delta tables -----------------------------------------------------------------------------------


def test_added_column_the_query_does_not_read_is_a_note(spark: Any, st: Any, unique_name: Any) -> None:
    src = _source(spark, unique_name("src"), "id INT, k STRING, v INT", "(1, 'a', 10), (2, 'b', 20), (3, 'a', 30)",
                  props="delta.enableChangeDataFeed = true")
    rows_t, sums_t = unique_name("rows"), unique_name("sums")
    q_rows = f"SELECT id, v FROM {src} WHERE v > 10"
    q_sums = f"SELECT k, SUM(v) AS s, COUNT(*) AS n FROM {src} GROUP BY k"
    st.create_stream_table(rows_t, q_rows, refresh_mode="DIFFERENTIAL")
    st.create_stream_table(sums_t, q_sums, refresh_mode="DIFFERENTIAL")
    spark.sql(f"ALTER TABLE {src} ADD COLUMNS (note STRING)")
    spark.sql(f"INSERT INTO {src} VALUES (4, 'b', 40, 'new'), (5, 'c', 5, NULL)")
    spark.sql(f"UPDATE {src} SET v = v + 1, note = 'touched' WHERE id = 2")
    spark.sql(f"DELETE FROM {src} WHERE id = 3")
    for name, query in ((rows_t, q_rows), (sums_t, q_sums)):
        r = st.refresh_stream_table(name)
        assert r.action == "DIFFERENTIAL", r
        assert f"source {src} added column note string (not read by the query)" in r.reason, r.reason
        assert_matches(spark, st, name, query)
        assert st.catalog.history(name, limit=1)[0]["reason"] == r.reason
    spark.sql(f"UPDATE {src} SET note = 'only the unread column' WHERE id = 1")
    spark.sql(f"INSERT INTO {src} VALUES (6, 'a', 60, 'x')")
    for name, query in ((rows_t, q_rows), (sums_t, q_sums)):
        r = st.refresh_stream_table(name)
        assert r.action == "DIFFERENTIAL" and "added column" not in r.reason, r  # noted once
        assert_matches(spark, st, name, query)


def test_added_column_of_a_star_query_is_an_error_naming_the_columns(spark: Any, st: Any, unique_name: Any) -> None:
    src = _source(spark, unique_name("src"), "id INT, v INT", "(1, 10)", props="delta.enableChangeDataFeed = true")
    star = unique_name("star")
    st.create_stream_table(star, f"SELECT * FROM {src}", refresh_mode="DIFFERENTIAL")
    spark.sql(f"ALTER TABLE {src} ADD COLUMNS (w INT)")
    with pytest.raises(SourceChangedError, match=r"query's output columns changed.*instead of \*"):
        st.refresh_stream_table(star)
    assert _status(st, star)["status"] == "ERROR"
    assert_matches(spark, st, star, f"SELECT id, v FROM {src}")  # the old rows, nothing half-applied


def test_type_widening_reinitializes(spark: Any, st: Any, unique_name: Any) -> None:
    src = _source(spark, unique_name("src"), "id INT, k INT, v INT", "(1, 1, 10), (2, 1, 20), (3, 2, 30)",
                  props="delta.enableChangeDataFeed = true, 'delta.enableTypeWidening' = true")
    rows_t, sums_t = unique_name("rows"), unique_name("sums")
    q_rows = f"SELECT id, v FROM {src}"
    q_sums = f"SELECT k, SUM(v) AS s FROM {src} GROUP BY k"
    st.create_stream_table(rows_t, q_rows, refresh_mode="DIFFERENTIAL")
    st.create_stream_table(sums_t, q_sums, refresh_mode="AUTO")
    spark.sql(f"ALTER TABLE {src} ALTER COLUMN v TYPE BIGINT")
    spark.sql(f"INSERT INTO {src} VALUES (4, 2, {2 ** 40})")
    for name, query in ((rows_t, q_rows), (sums_t, q_sums)):
        r = st.refresh_stream_table(name)
        assert r.action == "REINITIALIZE", r
        assert f"source {src} changed its schema: column v widened from int to bigint" in r.reason, r.reason
        assert_matches(spark, st, name, query)
    assert st.catalog.get(rows_t).types == ["int", "bigint"]
    assert dict(st.read(rows_t).dtypes)["v"] == "bigint"
    spark.sql(f"INSERT INTO {src} VALUES (5, 1, {2 ** 41})")
    spark.sql(f"UPDATE {src} SET v = v * 2 WHERE id = 1")
    for name, query in ((rows_t, q_rows), (sums_t, q_sums)):
        r = st.refresh_stream_table(name)
        assert r.action in ("DIFFERENTIAL", "FULL") and "schema" not in r.reason, r
        assert_matches(spark, st, name, query)


def test_readded_column_reinitializes(spark: Any, st: Any, unique_name: Any) -> None:
    src = _source(spark, unique_name("src"), "id INT, v INT, w INT", "(1, 10, 1), (2, 20, 2)")
    name = unique_name("reads_v")
    query = f"SELECT id, v, w FROM {src}"
    st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"ALTER TABLE {src} DROP COLUMN v")
    spark.sql(f"ALTER TABLE {src} ADD COLUMNS (v INT)")
    spark.sql(f"INSERT INTO {src} (id, w, v) VALUES (3, 3, 30)")
    r = st.refresh_stream_table(name)
    assert r.action == "REINITIALIZE", r
    assert "column v was dropped and added again" in r.reason and "old values are gone" in r.reason, r.reason
    assert_matches(spark, st, name, query)  # rows 1 and 2 now have v NULL, as the source says
    spark.sql(f"UPDATE {src} SET v = 11 WHERE id = 1")
    r = st.refresh_stream_table(name)
    assert r.action == "DIFFERENTIAL", r
    assert_matches(spark, st, name, query)


def test_dropped_or_renamed_read_column_is_an_error_that_is_not_retried(spark: Any, st: Any,
                                                                         unique_name: Any) -> None:
    src = _source(spark, unique_name("src"), "id INT, v INT, w INT", "(1, 10, 1), (2, 20, 2)")
    reads_v, reads_w = unique_name("reads_v"), unique_name("reads_w")
    q_v, q_w = f"SELECT id, v FROM {src}", f"SELECT id, w FROM {src}"
    st.create_stream_table(reads_v, q_v, refresh_mode="DIFFERENTIAL")
    st.create_stream_table(reads_w, q_w, refresh_mode="DIFFERENTIAL")
    before = sorted(tuple(r) for r in st.read(reads_v).collect())
    spark.sql(f"ALTER TABLE {src} RENAME COLUMN v TO vv")
    spark.sql(f"INSERT INTO {src} VALUES (3, 30, 3)")

    calls: list[str] = []

    def refresh(name: str) -> Any:
        calls.append(name)
        return st.refresh_stream_table(name)

    clock = [time.time() + 3600]
    sched = Scheduler(refresh, lambda n, s, r: None, clock=lambda: clock[0], max_consecutive_errors=3)
    with sched:
        sched.sync([s for s in st.status() if s["name"] in (reads_v, reads_w)])
        outcomes = {o.name: o for o in sched.tick()}
        assert outcomes[reads_w].ok  # the column it reads is untouched
        assert not outcomes[reads_v].ok
        error = str(outcomes[reads_v].error)
        assert f"column v of source {src} was renamed to vv, and stream table {reads_v} reads it" in error, error
        assert "Alter the stream table's query to read vv" in error and "rename the column back" in error
        status = _status(st, reads_v)
        assert status["status"] == "ERROR" and "renamed to vv" in status["last_error"]
        assert sorted(tuple(r) for r in st.read(reads_v).collect()) == before  # no wrong rows
        for _ in range(3):  # hours later: still not retried
            clock[0] += 3600
            sched.sync([s for s in st.status() if s["name"] in (reads_v, reads_w)])
            sched.tick()
        assert calls.count(reads_v) == 1, calls
    reinit = [h for h in st.catalog.history(reads_w, limit=20) if h["action"] == "REINITIALIZE"]
    assert len(reinit) == 1 and "v, which the query does not read, was renamed to vv" in reinit[0]["reason"], reinit
    assert_matches(spark, st, reads_w, q_w)

    # restore the column and resume: it follows the source again
    spark.sql(f"ALTER TABLE {src} RENAME COLUMN vv TO v")
    st.alter_stream_table(reads_v, status="ACTIVE")
    r = st.refresh_stream_table(reads_v)
    assert r.action == "REINITIALIZE", r
    assert_matches(spark, st, reads_v, q_v)
    assert _status(st, reads_v)["status"] == "ACTIVE"

    spark.sql(f"ALTER TABLE {src} DROP COLUMN v")
    with pytest.raises(SourceChangedError, match=rf"column v of source {src} was dropped.*add column v back"):
        st.refresh_stream_table(reads_v)
    assert _status(st, reads_v)["status"] == "ERROR"


# --- Debezium sources: the mirror follows the events' Connect schemas ---------------------------------------

INT32, INT64, STRING = {"type": "int32"}, {"type": "int64"}, {"type": "string"}


def _event(op: str, row: dict[str, Any], types: dict[str, dict[str, Any]], lsn: int) -> tuple[bytes, bytes]:
    """A Debezium envelope (JsonConverter with schemas) for ``row``, whose fields have the Connect ``types``."""
    fields = [{**t, "field": n, "optional": n != "id"} for n, t in types.items()]
    schema = {"type": "struct", "name": "shop.public.t.Envelope", "fields": [
        {"type": "struct", "fields": fields, "optional": True, "field": "before"},
        {"type": "struct", "fields": fields, "optional": True, "field": "after"},
        {"type": "struct", "fields": [{"type": "int64", "field": "lsn"}], "field": "source"},
        {"type": "string", "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
    payload = {"before": None if op != "d" else row, "after": None if op == "d" else row,
               "source": {"lsn": lsn}, "op": op, "ts_ms": lsn}
    key = {"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}, "payload": {"id": row["id"]}}
    compact = (",", ":")  # as Kafka's JsonConverter writes it
    return (json.dumps(key, separators=compact).encode(),
            json.dumps({"schema": schema, "payload": payload}, separators=compact).encode())


def test_mirror_follows_added_and_widened_columns_and_dead_letters_a_type_change(
        spark: Any, unique_name: Any, tmp_path: Any) -> None:
    """Through :func:`kafka_mirror.apply_batch` (both apply paths: the driver's delta-rs commit for the small
    batches, Spark's MERGE once the mirror uses type widening): a column added in the source is added to the
    mirror and filled; a widened column is widened; a type the mirror cannot hold sends its events to the
    dead-letter table with the reason and flags the source. The mirror equals the rows sent, every batch."""
    from connectors import debezium_schema, kafka_mirror
    from connectors.debezium import SourceSchema

    mirror = unique_name("evolving_mirror")
    v1 = {"id": INT32, "v": INT32}
    first = [_event("r", {"id": i, "v": i * 10}, v1, 100 + i) for i in range(1, 4)]
    columns = debezium_schema.columns(json.loads(first[0][1])["schema"])
    assert columns == [("id", "INT"), ("v", "INT")]
    src = kafka_mirror.KafkaSource(mirror, "t", "127.0.0.1:1", SourceSchema(tuple(columns), ("id",)), evolve=True)
    kafka_mirror.create_tables(spark, src)
    app = kafka_mirror._app_id(str(tmp_path / "ckpt"))
    expected: dict[int, tuple[Any, ...]] = {}
    offset = 0

    def apply(batch_id: int, events: list[tuple[bytes, bytes]]) -> dict[str, int]:
        nonlocal offset
        rows = [(k, v, "t", 0, offset + i) for i, (k, v) in enumerate(events)]
        offset += len(rows)
        frame = spark.createDataFrame(rows, "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT")
        return kafka_mirror.apply_batch(frame, batch_id, src, app)

    def check(where: str, names: list[str]) -> None:
        got = sorted(tuple(r) for r in spark.table(mirror).select(*names).collect())
        want = sorted(tuple(list(r) + [None] * (len(names) - len(r))) for r in expected.values())
        assert got == want, f"{where}: {got} != {want}"

    apply(0, first)
    expected.update({i: (i, i * 10) for i in range(1, 4)})
    check("snapshot", ["id", "v"])

    v2 = {"id": INT32, "v": INT32, "note": STRING}  # ALTER TABLE t ADD COLUMN note text
    apply(1, [_event("u", {"id": 1, "v": 11, "note": "one"}, v2, 200),
              _event("c", {"id": 4, "v": 40, "note": None}, v2, 201)])
    expected.update({1: (1, 11, "one"), 4: (4, 40, None)})
    assert kafka_mirror.mirror_columns(spark, mirror) == [("id", "int"), ("v", "int"), ("note", "string")]
    check("added column", ["id", "v", "note"])

    v3 = {"id": INT32, "v": INT64, "note": STRING}  # ALTER TABLE t ALTER COLUMN v TYPE bigint
    apply(2, [_event("u", {"id": 2, "v": 2 ** 40, "note": "big"}, v3, 300)])
    expected[2] = (2, 2 ** 40, "big")
    assert dict(kafka_mirror.mirror_columns(spark, mirror))["v"] == "bigint"
    check("widened column", ["id", "v", "note"])
    assert kafka_mirror.schema_problem(mirror) is None

    v4 = {"id": INT32, "v": STRING, "note": STRING}  # ALTER TABLE t ALTER COLUMN v TYPE text
    done = apply(3, [_event("u", {"id": 3, "v": "thirty", "note": "x"}, v4, 400),
                     _event("c", {"id": 5, "v": 2 ** 41, "note": "ok"}, v3, 401)])
    expected[5] = (5, 2 ** 41, "ok")
    assert done["dead_letters"] == 1, done
    check("type change", ["id", "v", "note"])  # row 3 untouched, row 5 applied
    dead = spark.table(src.dead_letter_table).collect()
    assert len(dead) == 1 and "column v of source" in dead[0]["error"] and "dead-letter" in dead[0]["error"]
    assert "BIGINT column cannot hold" in dead[0]["error"], dead[0]["error"]
    problem = kafka_mirror.schema_problem(mirror)
    assert problem is not None and "column v" in problem
    # a restart takes the columns from the mirror and the key from its property, without reading the topic
    again = kafka_mirror.discover_schema(spark, mirror, "t", "127.0.0.1:1", {})
    assert again.key == ("id",) and again.columns == (("id", "int"), ("v", "bigint"), ("note", "string"))
