"""Unit tests of the Debezium change-event decoder (pure Python: no Spark, no JVM).

Why so many literal events: the decoder's job is to understand what a real Debezium PostgreSQL connector
writes to Kafka, so the happy paths are complete events shaped like its output (envelope with ``source``
block, JsonConverter ``{"schema", "payload"}`` wrapper, ExtractNewRecordState flattening), and every
malformed case asserts the message a person would read in the dead-letter table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pytest

from connectors.debezium import (
    UNAVAILABLE_PLACEHOLDER,
    ChangeEvent,
    DecodeError,
    SourceSchema,
    coerce,
    decode,
    decode_key,
    order_key,
)

# CREATE TABLE public.orders (id INT PRIMARY KEY, customer VARCHAR(64), amount NUMERIC(10,2), qty SMALLINT,
#   price DOUBLE PRECISION, paid BOOLEAN, order_date DATE, created_at TIMESTAMP(6), updated_at TIMESTAMPTZ,
#   note TEXT, blob BYTEA)
ORDERS = SourceSchema(
    columns=(("id", "INT"), ("customer", "STRING"), ("amount", "DECIMAL(10,2)"), ("qty", "SMALLINT"),
             ("price", "DOUBLE"), ("paid", "BOOLEAN"), ("order_date", "DATE"), ("created_at", "TIMESTAMP"),
             ("updated_at", "TIMESTAMP"), ("note", "STRING"), ("blob", "BINARY")),
    key=("id",),
)

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit
# The Python values of the row used throughout: amount 123.45 = base64 "MDk=" (unscaled 12345 = 0x3039),
# order_date 2024-01-31 = 19753 days, created_at = 1706696130123456 micros, blob = b"\x00\x01\xfe" = "AAH+".
ROW_1 = (1, "alice", Decimal("123.45"), 3, 9.5, True, date(2024, 1, 31), datetime(2024, 1, 31, 10, 15, 30, 123456),
         datetime(2024, 1, 31, 10, 15, 30, 123456), "hello", b"\x00\x01\xfe")


def enc(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# ------------------------------------------------------------------------------------ realistic literal events
# Format 1: an UPDATE with REPLICA IDENTITY FULL, JsonConverter schemas.enable=false (Debezium 2.7).
UPDATE_NO_SCHEMA = b"""{
  "before": {"id": 1, "customer": "alice", "amount": "Msc=", "qty": 2, "price": 9.5, "paid": false,
             "order_date": 19753, "created_at": 1706696130123456, "updated_at": "2024-01-31T09:00:00Z",
             "note": "hello", "blob": "AAH+"},
  "after":  {"id": 1, "customer": "alice", "amount": "MDk=", "qty": 3, "price": 9.5, "paid": true,
             "order_date": 19753, "created_at": 1706696130123456, "updated_at": "2024-01-31T10:15:30.123456Z",
             "note": "hello", "blob": "AAH+"},
  "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1706696130500,
             "snapshot": "false", "db": "shop", "sequence": "[\\"24023128\\",\\"24023184\\"]",
             "ts_us": 1706696130500123, "ts_ns": 1706696130500123000, "schema": "public", "table": "orders",
             "txId": 771, "lsn": 24023184, "xmin": null},
  "transaction": null,
  "op": "u",
  "ts_ms": 1706696130812,
  "ts_us": 1706696130812456,
  "ts_ns": 1706696130812456789
}"""

# Format 3: ExtractNewRecordState with add.fields=op,table,lsn,source.ts_ms and
# delete.tombstone.handling.mode=rewrite, schemas.enable=false.
FLAT_INSERT = b"""{"id": 1, "customer": "alice", "amount": "MDk=", "qty": 3, "price": 9.5, "paid": true,
  "order_date": 19753, "created_at": 1706696130123456, "updated_at": "2024-01-31T10:15:30.123456Z",
  "note": "hello", "blob": "AAH+", "__op": "c", "__table": "orders", "__lsn": 24023184,
  "__source_ts_ms": 1706696130500, "__deleted": "false"}"""
FLAT_DELETE = b"""{"id": 1, "customer": null, "amount": null, "qty": null, "price": null, "paid": null,
  "order_date": null, "created_at": null, "updated_at": null, "note": null, "blob": null,
  "__op": "d", "__table": "orders", "__lsn": 24023300, "__source_ts_ms": 1706696131000, "__deleted": "true"}"""

# Format 4: a TRUNCATE (skipped.operations=none).
TRUNCATE = b"""{"before": null, "after": null,
  "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1706696200000,
             "snapshot": "false", "db": "shop", "sequence": "[\\"24030000\\",\\"24030112\\"]", "ts_us": null,
             "ts_ns": null, "schema": "public", "table": "orders", "txId": 790, "lsn": 24030112, "xmin": null},
  "transaction": null, "op": "t", "ts_ms": 1706696200123}"""

AFTER_1 = json.loads(UPDATE_NO_SCHEMA)["after"]


def pg_source(lsn: int | None = 24023184, ts_ms: int | None = 1706696130500, *, snapshot: str = "false",
              txid: int = 771, sequence: str | None = "auto") -> dict[str, Any]:
    """The ``source`` block of the PostgreSQL connector."""
    if sequence == "auto":
        sequence = json.dumps([str(lsn - 56) if lsn else None, str(lsn) if lsn else None])
    return {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": ts_ms,
            "snapshot": snapshot, "db": "shop", "sequence": sequence, "ts_us": None, "ts_ns": None,
            "schema": "public", "table": "orders", "txId": txid, "lsn": lsn, "xmin": None}


def envelope(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, *, lsn: int | None = 24023184,
             src_ts: int | None = 1706696130500, ts_ms: int | None = 1706696130812, **source: Any) -> dict[str, Any]:
    return {"before": before, "after": after, "source": pg_source(lsn, src_ts, **source), "transaction": None,
            "op": op, "ts_ms": ts_ms}


# Connect field schemas of public.orders as the PostgreSQL connector describes them (schemas.enable=true).
ORDERS_FIELDS: list[dict[str, Any]] = [
    {"type": "int32", "optional": False, "default": 0, "field": "id"},
    {"type": "string", "optional": True, "field": "customer"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "amount"},
    {"type": "int16", "optional": True, "field": "qty"},
    {"type": "double", "optional": True, "field": "price"},
    {"type": "boolean", "optional": True, "field": "paid"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "order_date"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1,
     "field": "created_at"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1,
     "field": "updated_at"},
    {"type": "string", "optional": True, "field": "note"},
    {"type": "bytes", "optional": True, "field": "blob"},
]
SOURCE_FIELDS: list[dict[str, Any]] = [
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
     "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
     "default": "false", "field": "snapshot"},
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "sequence"},
    {"type": "int64", "optional": True, "field": "ts_us"},
    {"type": "int64", "optional": True, "field": "ts_ns"},
    {"type": "string", "optional": False, "field": "schema"},
    {"type": "string", "optional": False, "field": "table"},
    {"type": "int64", "optional": True, "field": "txId"},
    {"type": "int64", "optional": True, "field": "lsn"},
    {"type": "int64", "optional": True, "field": "xmin"},
]


def value_schema(row_fields: list[dict[str, Any]] = ORDERS_FIELDS) -> dict[str, Any]:
    """The JsonConverter schema of a PostgreSQL envelope."""
    row = {"type": "struct", "fields": row_fields, "optional": True, "name": "dbserver1.public.orders.Value"}
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "fields": SOURCE_FIELDS, "optional": False,
             "name": "io.debezium.connector.postgresql.Source", "field": "source"},
            {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "id"},
                                          {"type": "int64", "optional": False, "field": "total_order"},
                                          {"type": "int64", "optional": False, "field": "data_collection_order"}],
             "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
        ],
        "optional": False,
        "name": "dbserver1.public.orders.Envelope",
        "version": 2,
    }


KEY_SCHEMA = {"type": "struct", "fields": [{"type": "int32", "optional": False, "default": 0, "field": "id"}],
              "optional": False, "name": "dbserver1.public.orders.Key"}


def wrapped(schema: dict[str, Any], payload: Any) -> bytes:
    return enc({"schema": schema, "payload": payload})


# ------------------------------------------------------------------------------------------ SourceSchema
def test_source_schema_normalizes_conf_input_and_type_aliases() -> None:
    s = SourceSchema(columns=[["id", "integer"], ["name", "varchar(10)"], ["amt", "numeric(5,1)"],
                              ["at", "TIMESTAMP_NTZ"], ["n", "long"], ["f", "real"], ["d", "DECIMAL"]], key="id")
    assert s.columns[0] == ("id", "integer") and isinstance(s.columns, tuple) and s.key == ("id",)
    assert hash(s) == hash(SourceSchema(columns=tuple(tuple(c) for c in s.columns), key=("id",)))
    ev = decode(None, enc({"__op": "c", "id": 7, "name": "x", "amt": 1.25, "at": 0, "n": 2**40, "f": 1,
                           "d": "12.6"}), s)
    assert ev is not None
    assert ev.row == (7, "x", Decimal("1.3"), datetime(1970, 1, 1), 2**40, 1.0, Decimal("13"))


@pytest.mark.parametrize(("columns", "key", "message"), [
    ((("id", "INT"), ("tags", "ARRAY<STRING>")), ("id",), "unsupported Spark type 'ARRAY<STRING>'"),
    ((("id", "INT"), ("x", "INT(3)")), ("id",), "unsupported Spark type 'INT(3)'"),
    ((("id", "DECIMAL(40,2)"),), ("id",), "invalid decimal type"),
    ((("id", "INT"),), ("other",), "key ['other'] must name distinct columns"),
    ((("id", "INT"),), (), "needs a primary key"),
    ((("id", "INT"), ("id", "STRING")), ("id",), "duplicate column names"),
    ((), ("id",), "at least one column"),
])
def test_source_schema_rejects_bad_conf(columns: Any, key: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        SourceSchema(columns=columns, key=key)
    assert message in str(info.value)


def test_source_schema_rejects_unknown_decimal_handling() -> None:
    with pytest.raises(ValueError, match="decimal_handling must be one of"):
        SourceSchema(columns=(("id", "INT"),), key=("id",), decimal_handling="base64")


# ------------------------------------------------------------------------------ format 1: bare envelope
def test_update_envelope_without_schema() -> None:
    ev = decode(b'{"id": 1}', UPDATE_NO_SCHEMA, ORDERS)
    assert ev == ChangeEvent(op="u", key=(1,), row=ROW_1, before_key=None,
                             position=(24023184, 1706696130500, 1706696130812), ts_ms=1706696130500)
    assert isinstance(ev.row[2], Decimal) and str(ev.row[2]) == "123.45"


@pytest.mark.parametrize("op", ["c", "r"])
def test_create_and_snapshot_read(op: str) -> None:
    payload = envelope(op, None, AFTER_1, snapshot="true" if op == "r" else "false")
    ev = decode(b'{"id": 1}', enc(payload), ORDERS)
    assert ev is not None and (ev.op, ev.key, ev.row, ev.before_key) == (op, (1,), ROW_1, None)


def test_delete_with_full_before_image() -> None:
    ev = decode(b'{"id": 1}', enc(envelope("d", AFTER_1, None, lsn=24023300)), ORDERS)
    assert ev == ChangeEvent("d", (1,), None, None, (24023300, 1706696130500, 1706696130812), 1706696130500)


def test_delete_with_replica_identity_default_before() -> None:
    """REPLICA IDENTITY DEFAULT: ``before`` holds the key and nulls."""
    before = {name: None for name, _ in ORDERS.columns} | {"id": 42}
    ev = decode(None, enc(envelope("d", before, None)), ORDERS)
    assert ev is not None and (ev.op, ev.key, ev.row) == ("d", (42,), None)


@pytest.mark.parametrize("kafka_key", [b'{"id": 42}', wrapped(KEY_SCHEMA, {"id": 42}), '{"id": 42}'])
def test_delete_without_before_falls_back_to_kafka_key(kafka_key: bytes | str) -> None:
    ev = decode(kafka_key, enc(envelope("d", None, None)), ORDERS)
    assert ev is not None and (ev.op, ev.key) == ("d", (42,))


def test_delete_before_without_key_columns_uses_kafka_key() -> None:
    ev = decode(b'{"id": 9}', enc(envelope("d", {"customer": "bob"}, None)), ORDERS)
    assert ev is not None and ev.key == (9,)


def test_delete_without_any_key_is_an_error() -> None:
    with pytest.raises(DecodeError, match=r"delete event has no key: before is null and the Kafka key is null"):
        decode(None, enc(envelope("d", None, None)), ORDERS)


def test_update_changing_primary_key_sets_before_key() -> None:
    before = AFTER_1 | {"id": 1}
    after = AFTER_1 | {"id": 2}
    ev = decode(b'{"id": 2}', enc(envelope("u", before, after)), ORDERS)
    assert ev is not None and (ev.key, ev.before_key) == ((2,), (1,))
    # REPLICA IDENTITY DEFAULT sends the old key only: still enough.
    ev = decode(b'{"id": 2}', enc(envelope("u", {"id": 1}, after)), ORDERS)
    assert ev is not None and ev.before_key == (1,)


def test_update_without_key_change_has_no_before_key() -> None:
    for before in (None, AFTER_1, {"id": 1}, {"customer": "alice"}):  # DEFAULT sends no before at all
        ev = decode(b'{"id": 1}', enc(envelope("u", before, AFTER_1)), ORDERS)
        assert ev is not None and ev.before_key is None and ev.key == (1,)


def test_composite_key_order_follows_schema() -> None:
    s = SourceSchema(columns=(("region", "STRING"), ("id", "BIGINT"), ("v", "INT")), key=("id", "region"))
    ev = decode(None, enc(envelope("c", None, {"v": 5, "region": "eu", "id": 10})), s)
    assert ev is not None and ev.key == (10, "eu") and ev.row == ("eu", 10, 5)
    moved = decode(None, enc(envelope("u", {"region": "eu", "id": 10}, {"v": 5, "region": "us", "id": 10})), s)
    assert moved is not None and moved.before_key == (10, "eu") and moved.key == (10, "us")
    gone = decode(b'{"region": "us", "id": 10}', enc(envelope("d", None, None)), s)
    assert gone is not None and gone.key == (10, "us")


def test_missing_non_key_columns_are_null_and_extra_fields_ignored() -> None:
    after = {"id": 5, "customer": "eve", "added_later": [1, 2], "legacy": {"x": 1}}
    ev = decode(None, enc(envelope("c", None, after)), ORDERS)
    assert ev is not None and ev.row == (5, "eve") + (None,) * 9


def test_truncate() -> None:
    ev = decode(None, TRUNCATE, ORDERS)
    assert ev == ChangeEvent("t", None, None, None, (24030112, 1706696200000, 1706696200123), 1706696200000)


def test_tombstones_decode_to_none() -> None:
    assert decode(b'{"id": 1}', None, ORDERS) is None
    assert decode(b'{"id": 1}', b"", ORDERS) is None
    assert decode(b'{"id": 1}', wrapped(value_schema(), None), ORDERS) is None


def test_value_may_be_str_bytearray_or_memoryview() -> None:
    text = UPDATE_NO_SCHEMA.decode()
    expected = decode(None, UPDATE_NO_SCHEMA, ORDERS)
    assert decode(None, text, ORDERS) == expected
    assert decode(None, bytearray(UPDATE_NO_SCHEMA), ORDERS) == expected
    assert decode(None, memoryview(UPDATE_NO_SCHEMA), ORDERS) == expected


# ------------------------------------------------------------------------ format 2: schema + payload wrapper
def test_create_with_schema_wrapper() -> None:
    payload = envelope("c", None, AFTER_1)
    ev = decode(wrapped(KEY_SCHEMA, {"id": 1}), wrapped(value_schema(), payload), ORDERS)
    assert ev is not None and (ev.op, ev.key, ev.row) == ("c", (1,), ROW_1)
    assert ev.position == (24023184, 1706696130500, 1706696130812)


def test_schema_scale_is_the_connect_scale_then_rescaled_to_spark() -> None:
    fields = [f | {"parameters": {"scale": "3", "connect.decimal.precision": "12"}} if f["field"] == "amount" else f
              for f in ORDERS_FIELDS]
    after = AFTER_1 | {"amount": "AeI6"}  # unscaled 123450 at scale 3 = 123.450
    ev = decode(None, wrapped(value_schema(fields), envelope("c", None, after)), ORDERS)
    assert ev is not None and ev.row[2] == Decimal("123.45") and str(ev.row[2]) == "123.45"
    wide = SourceSchema(columns=(("id", "INT"), ("amount", "DECIMAL(14,4)")), key=("id",))
    ev = decode(None, wrapped(value_schema(fields), envelope("c", None, after)), wide)
    assert ev is not None and str(ev.row[1]) == "123.4500"


def test_schema_decimal_handling_modes() -> None:
    """decimal.handling.mode=string and =double change the Connect type; the schema says which."""
    as_string = [f if f["field"] != "amount" else {"type": "string", "optional": True, "field": "amount"}
                 for f in ORDERS_FIELDS]
    ev = decode(None, wrapped(value_schema(as_string), envelope("c", None, AFTER_1 | {"amount": "1000"})), ORDERS)
    assert ev is not None and ev.row[2] == Decimal("1000.00")  # "1000" is a number here, not base64
    as_double = [f if f["field"] != "amount" else {"type": "double", "optional": True, "field": "amount"}
                 for f in ORDERS_FIELDS]
    ev = decode(None, wrapped(value_schema(as_double), envelope("c", None, AFTER_1 | {"amount": 0.1 + 0.2})), ORDERS)
    assert ev is not None and ev.row[2] == Decimal("0.30")


def test_schema_key_change_and_delete_use_connect_types() -> None:
    s = SourceSchema(columns=(("day", "DATE"), ("v", "INT")), key=("day",))
    fields = [{"type": "int32", "optional": False, "name": "io.debezium.time.Date", "version": 1, "field": "day"},
              {"type": "int32", "optional": True, "field": "v"}]
    ev = decode(None, wrapped(value_schema(fields), envelope("u", {"day": 0, "v": None}, {"day": 1, "v": 3})), s)
    assert ev is not None and ev.key == (date(1970, 1, 2),) and ev.before_key == (date(1970, 1, 1),)
    key_schema = {"type": "struct", "fields": fields[:1], "optional": False, "name": "dbserver1.public.t.Key"}
    ev = decode(wrapped(key_schema, {"day": 19753}), wrapped(value_schema(fields), envelope("d", None, None)), s)
    assert ev is not None and ev.key == (date(2024, 1, 31),)


def test_schema_with_unknown_column_in_schema_and_missing_field() -> None:
    """Schema drift: the event's schema has a new column, and lacks one of the mirror's columns."""
    fields = [f for f in ORDERS_FIELDS if f["field"] != "note"] + [{"type": "string", "optional": True,
                                                                     "field": "new_col"}]
    after = {k: v for k, v in AFTER_1.items() if k != "note"} | {"new_col": "x"}
    ev = decode(None, wrapped(value_schema(fields), envelope("c", None, after)), ORDERS)
    assert ev is not None and ev.row == ROW_1[:9] + (None,) + ROW_1[10:]


# -------------------------------------------------------------------- format 3: ExtractNewRecordState records
def test_flattened_insert_and_rewrite_delete() -> None:
    ev = decode(b'{"id": 1}', FLAT_INSERT, ORDERS)
    assert ev == ChangeEvent("c", (1,), ROW_1, None, (24023184, 1706696130500, -1), 1706696130500)
    ev = decode(b'{"id": 1}', FLAT_DELETE, ORDERS)
    assert ev == ChangeEvent("d", (1,), None, None, (24023300, 1706696131000, -1), 1706696131000)


@pytest.mark.parametrize(("op", "deleted", "expected"), [
    ("u", False, "u"), ("r", "false", "r"), ("d", True, "d"), (None, "true", "d"), (None, "false", "u"),
    (None, False, "u"), ("c", None, "c"), ("d", None, "d"),
])
def test_flattened_op_and_deleted_flag(op: str | None, deleted: Any, expected: str) -> None:
    rec: dict[str, Any] = {"id": 3, "customer": "carol"}
    if op is not None:
        rec["__op"] = op
    if deleted is not None:
        rec["__deleted"] = deleted
    ev = decode(None, enc(rec), ORDERS)
    assert ev is not None and ev.op == expected and ev.key == (3,)
    assert ev.row == (None if expected == "d" else (3, "carol") + (None,) * 9)


def test_flattened_with_schema_wrapper() -> None:
    fields = ORDERS_FIELDS + [{"type": "string", "optional": True, "field": "__op"},
                              {"type": "string", "optional": True, "field": "__table"},
                              {"type": "int64", "optional": True, "field": "__lsn"},
                              {"type": "int64", "optional": True, "field": "__source_ts_ms"},
                              {"type": "string", "optional": True, "field": "__deleted"}]
    schema = {"type": "struct", "fields": fields, "optional": False, "name": "dbserver1.public.orders.Value"}
    ev = decode(wrapped(KEY_SCHEMA, {"id": 1}), wrapped(schema, json.loads(FLAT_INSERT)), ORDERS)
    assert ev is not None and (ev.op, ev.key, ev.row) == ("c", (1,), ROW_1)
    # The schema, not guessing, says "1000" is base64 here (unscaled -2667212 at scale 2).
    ev = decode(None, wrapped(schema, json.loads(FLAT_INSERT) | {"amount": "1000"}), ORDERS)
    assert ev is not None and ev.row[2] == Decimal("-26672.12")


def test_flattened_delete_without_key_fields_uses_kafka_key() -> None:
    ev = decode(wrapped(KEY_SCHEMA, {"id": 8}), enc({"__op": "d", "__deleted": "true"}), ORDERS)
    assert ev is not None and (ev.op, ev.key) == ("d", (8,))


def test_flattened_position_field_variants() -> None:
    a = decode(None, enc({"id": 1, "__op": "u", "__source_lsn": 500, "__source_ts_ms": 10, "__ts_ms": 20}), ORDERS)
    b = decode(None, enc({"id": 1, "__op": "u", "__source_sequence": '["400","600"]', "__ts_ms": 30}), ORDERS)
    c = decode(None, enc({"id": 1, "__op": "u", "__ts_ms": 40}), ORDERS)
    assert a is not None and a.position == (500, 10, 20) and a.ts_ms == 10
    assert b is not None and b.position == (600, -1, 30) and b.ts_ms == 30
    assert c is not None and c.position == (-1, -1, 40) and c.ts_ms == 40


def test_flattened_truncate() -> None:
    ev = decode(None, enc({"__op": "t", "__lsn": 9, "__source_ts_ms": 1}), ORDERS)
    assert ev == ChangeEvent("t", None, None, None, (9, 1, -1), 1)


# --------------------------------------------------------------------------------------------- decode_key
def test_decode_key_forms() -> None:
    assert decode_key(None, ORDERS) is None
    assert decode_key(b"", ORDERS) is None
    assert decode_key(b'{"id": 5}', ORDERS) == (5,)
    assert decode_key(wrapped(KEY_SCHEMA, {"id": 5}), ORDERS) == (5,)
    with pytest.raises(DecodeError, match=r"Kafka key lacks key column\(s\) \['id'\]: got fields \['uuid'\]"):
        decode_key(b'{"uuid": "x"}', ORDERS)
    with pytest.raises(DecodeError, match="key is not valid JSON"):
        decode_key(b"id=5", ORDERS)
    with pytest.raises(DecodeError, match="key must be a JSON object, got integer 5"):
        decode_key(b"5", ORDERS)
    with pytest.raises(DecodeError, match=r"key column 'id': expected INT, got string '5' \(at key.id\)"):
        decode_key(b'{"id": "5"}', ORDERS)
    with pytest.raises(DecodeError, match=r"\(at key.payload.id\)"):
        decode_key(wrapped(KEY_SCHEMA, {"id": 1.5}), ORDERS)
    with pytest.raises(DecodeError, match="key.payload: expected an object, got array"):
        decode_key(wrapped(KEY_SCHEMA, [1]), ORDERS)
    assert decode_key(wrapped(KEY_SCHEMA, None), ORDERS) is None
    assert decode_key(memoryview(b'{"id": 5}'), ORDERS) == (5,)
    with pytest.raises(DecodeError, match="key is not UTF-8 text"):
        decode_key(b'{"id": "\xff"}', ORDERS)


# ----------------------------------------------------------------------------------------------- coercion
MICRO_TS = {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}


@pytest.mark.parametrize(("value", "spark_type", "connect", "expected"), [
    (5, "INT", None, 5),
    (-(2**31), "INT", None, -(2**31)),
    (2**63 - 1, "BIGINT", None, 2**63 - 1),
    (-32768, "SMALLINT", {"type": "int16"}, -32768),
    (127, "TINYINT", None, 127),
    (1.5, "DOUBLE", None, 1.5),
    (3, "DOUBLE", None, 3.0),
    ("Infinity", "DOUBLE", {"type": "double"}, float("inf")),
    (2.5, "FLOAT", None, 2.5),
    ("x", "STRING", None, "x"),
    ("", "STRING", None, ""),
    (True, "BOOLEAN", None, True),
    (None, "INT", None, None),
    # decimals: base64 unscaled (precise), numeric strings (string), numbers (double), variable scale
    ("MDk=", "DECIMAL(10,2)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                               "parameters": {"scale": "2"}}, Decimal("123.45")),
    ("z8c=", "DECIMAL(10,2)", None, Decimal("-123.45")),
    ("AA==", "DECIMAL(10,2)", None, Decimal("0.00")),
    ("ZA==", "DECIMAL(5,0)", None, Decimal("100")),
    ("1000", "DECIMAL(10,2)", None, Decimal("-26672.12")),  # precise mode: base64 when it can be
    ("12.50", "DECIMAL(10,2)", None, Decimal("12.50")),
    ("-3", "DECIMAL(10,2)", None, Decimal("-3.00")),
    ("1.005", "DECIMAL(10,2)", None, Decimal("1.01")),  # HALF_UP, as Spark rounds
    (12, "DECIMAL(10,2)", None, Decimal("12.00")),
    (12.3, "DECIMAL(10,2)", None, Decimal("12.30")),
    ("1000", "DECIMAL(10,2)", {"type": "string"}, Decimal("1000.00")),
    ({"scale": 3, "value": "AeI6"}, "DECIMAL(10,3)", {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"},
     Decimal("123.450")),
    ({"scale": 0, "value": "BQ=="}, "DECIMAL(10,2)", None, Decimal("5.00")),
    ("MDk=", "DOUBLE", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                        "parameters": {"scale": "2"}}, 123.45),
    ("ZA==", "BIGINT", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                        "parameters": {"scale": "0"}}, 100),
    ("9999999999999999999999999999.9999999999", "DECIMAL(38,10)", None,
     Decimal("9999999999999999999999999999.9999999999")),
    # dates
    (19753, "DATE", {"type": "int32", "name": "io.debezium.time.Date"}, date(2024, 1, 31)),
    (-1, "DATE", {"type": "int32", "name": "org.apache.kafka.connect.data.Date"}, date(1969, 12, 31)),
    (19753, "DATE", None, date(2024, 1, 31)),
    ("2024-01-31", "DATE", None, date(2024, 1, 31)),
    # timestamps -> naive UTC
    (1706696130123456, "TIMESTAMP", MICRO_TS, datetime(2024, 1, 31, 10, 15, 30, 123456)),
    (1706696130123, "TIMESTAMP", {"type": "int64", "name": "io.debezium.time.Timestamp"},
     datetime(2024, 1, 31, 10, 15, 30, 123000)),
    (1706696130123, "TIMESTAMP", {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"},
     datetime(2024, 1, 31, 10, 15, 30, 123000)),
    (1706696130123456789, "TIMESTAMP", {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
     datetime(2024, 1, 31, 10, 15, 30, 123456)),
    ("2024-01-31T12:15:30.5+02:00", "TIMESTAMP", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
     datetime(2024, 1, 31, 10, 15, 30, 500000)),
    ("2024-01-31T10:15:30Z", "TIMESTAMP", None, datetime(2024, 1, 31, 10, 15, 30)),
    ("2024-01-31T10:15:30.123456", "TIMESTAMP_NTZ", {"type": "string", "name": "io.debezium.time.IsoTimestamp"},
     datetime(2024, 1, 31, 10, 15, 30, 123456)),
    (-1, "TIMESTAMP", None, datetime(1969, 12, 31, 23, 59, 59, 999999)),
    (1706696130123456, "TIMESTAMP", None, datetime(2024, 1, 31, 10, 15, 30, 123456)),  # micros assumed
    # binary
    ("AAH+", "BINARY", {"type": "bytes"}, b"\x00\x01\xfe"),
    ("", "BINARY", None, b""),
    # the placeholder of an unchanged TOASTed value is never returned as data
    (UNAVAILABLE_PLACEHOLDER, "STRING", None, None),
])
def test_coerce(value: Any, spark_type: str, connect: dict[str, Any] | None, expected: Any) -> None:
    out = coerce(value, spark_type, connect)
    assert out == expected and type(out) is type(expected)
    if isinstance(expected, Decimal):
        assert str(out) == str(expected)  # the Spark scale, exactly


@pytest.mark.parametrize(("value", "spark_type", "connect", "message"), [
    ("abc", "DOUBLE", None, "column 'c': expected DOUBLE, got string 'abc'"),
    ("5", "INT", None, "column 'c': expected INT, got string '5'"),
    (True, "INT", None, "expected INT, got boolean true"),
    (1.0, "BIGINT", None, "expected BIGINT, got number 1.0"),
    (2**31, "INT", None, "2147483648 is out of range for INT"),
    (40000, "SMALLINT", None, "40000 is out of range for SMALLINT"),
    (5, "STRING", None, "expected STRING, got integer 5"),
    ({"a": 1}, "STRING", None, "expected STRING, got object"),
    ([1], "STRING", None, "expected STRING, got array"),
    ("true", "BOOLEAN", None, "expected BOOLEAN, got string 'true'"),
    (1, "BOOLEAN", None, "expected BOOLEAN, got integer 1"),
    ("MD!=", "DECIMAL(10,2)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                               "parameters": {"scale": "2"}}, "invalid base64 for DECIMAL(10,2): string 'MD!='"),
    ("abc", "DECIMAL(10,2)", None, "expected DECIMAL(10,2), got string 'abc'"),
    ("NaN", "DECIMAL(10,2)", None, "DECIMAL(10,2) cannot hold string 'NaN'"),
    (float("nan"), "DECIMAL(10,2)", None, "DECIMAL(10,2) cannot hold number nan"),
    ("123456789.5", "DECIMAL(10,2)", None, "123456789.5 does not fit DECIMAL(10,2)"),
    ("99999999.999", "DECIMAL(10,2)", None, "does not fit DECIMAL(10,2)"),  # rounds up to 9 integer digits
    ("1e999999", "DECIMAL(10,2)", None, "does not fit DECIMAL(10,2)"),
    (True, "DECIMAL(10,2)", None, "expected DECIMAL(10,2), got boolean true"),
    ({"scale": "x", "value": "AA=="}, "DECIMAL(10,2)", None, "expected a VariableScaleDecimal"),
    ("MDk=", "DECIMAL(10,2)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"},
     "Connect Decimal schema has no valid parameters.scale (None)"),
    ("MDk=", "INT", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}},
     "123.45 does not fit INT"),
    ("AAH", "BINARY", None, "invalid base64 for BINARY: string 'AAH'"),
    (5, "BINARY", None, "expected BINARY, got integer 5"),
    ("31/01/2024", "DATE", None, "expected DATE as an ISO-8601 date string, got string '31/01/2024'"),
    (10**12, "DATE", None, "1000000000000 days since 1970-01-01 is out of range for DATE"),
    (19753, "DATE", {"type": "int32"}, "expected DATE (Connect type int32), got integer 19753"),
    ("2024-01-31", "DATE", {"type": "int32", "name": "io.debezium.time.Date"}, "expected DATE, got string"),
    ("yesterday", "TIMESTAMP", None, "expected TIMESTAMP as an ISO-8601 string, got string 'yesterday'"),
    (9223372036825200000, "TIMESTAMP", None, "out of range for TIMESTAMP"),  # Debezium's 'infinity'
    (1706696130123456, "TIMESTAMP", {"type": "int64"}, "expected TIMESTAMP (Connect type int64), got integer"),
    (3600000000, "TIMESTAMP", {"type": "int64", "name": "io.debezium.time.MicroTime"},
     "expected TIMESTAMP (Connect type io.debezium.time.MicroTime)"),
    (1.5, "TIMESTAMP", None, "expected TIMESTAMP, got number 1.5"),
])
def test_coerce_errors(value: Any, spark_type: str, connect: dict[str, Any] | None, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        coerce(value, spark_type, connect, column="c")
    assert message in str(info.value)
    assert str(info.value).startswith("column 'c': ")


def test_coerce_without_column_name_and_bad_type() -> None:
    with pytest.raises(DecodeError, match=r"^expected INT, got string 'x'$"):
        coerce("x", "INT")
    with pytest.raises(DecodeError, match="unsupported Spark type 'STRUCT'"):
        coerce(1, "STRUCT")


def test_decimal_string_mode_without_schema_reads_digits_as_numbers() -> None:
    """A digits-only string is valid base64 and a valid number: decimal_handling decides, never a guess."""
    precise = SourceSchema(columns=(("id", "INT"), ("amt", "DECIMAL(10,2)")), key=("id",))
    string = SourceSchema(columns=(("id", "INT"), ("amt", "DECIMAL(10,2)")), key=("id",), decimal_handling="string")
    rec = enc({"__op": "c", "id": 1, "amt": "1000"})
    assert decode(None, rec, precise).row == (1, Decimal("-26672.12"))  # type: ignore[union-attr]
    assert decode(None, rec, string).row == (1, Decimal("1000.00"))  # type: ignore[union-attr]
    assert coerce("1000", "DECIMAL(10,2)", decimal_handling="string") == Decimal("1000.00")
    with pytest.raises(DecodeError, match="expected DECIMAL"):
        decode(None, enc({"__op": "c", "id": 1, "amt": "MDk="}), string)


# --------------------------------------------------------------------------------------- unchanged TOAST
def test_unavailable_toast_placeholder_is_reported_not_written() -> None:
    after = AFTER_1 | {"note": UNAVAILABLE_PLACEHOLDER, "blob": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="}
    ev = decode(None, enc(envelope("u", None, after)), ORDERS)
    assert ev is not None and ev.unavailable == ("note", "blob")
    assert ev.row == ROW_1[:9] + (None, None)
    fresh = decode(None, enc(envelope("u", None, AFTER_1)), ORDERS)
    assert fresh is not None and fresh.unavailable == ()


def test_unavailable_key_column_is_an_error() -> None:
    s = SourceSchema(columns=(("code", "STRING"), ("v", "INT")), key=("code",))
    with pytest.raises(DecodeError, match="key column 'code' is unavailable"):
        decode(None, enc(envelope("u", None, {"code": UNAVAILABLE_PLACEHOLDER, "v": 1})), s)


# --------------------------------------------------------------------------------------------- malformed
def _env(**changes: Any) -> bytes:
    payload = envelope("u", None, AFTER_1)
    payload.update(changes)
    return enc(payload)


@pytest.mark.parametrize(("value", "message"), [
    (b"not json", "value is not valid JSON: Expecting value: line 1 column 1"),
    (b'{"op": "c", "after": {"id": 1}', "value is not valid JSON"),
    (b"\xff\xfe{}", "value is not UTF-8 text"),
    (b"[1, 2]", "value must be a JSON object, got array"),
    (b'"u"', "value must be a JSON object, got string 'u'"),
    (b"null", "value must be a JSON object, got null"),
    (b"[" * 100_000 + b"]" * 100_000, "value could not be parsed as JSON: RecursionError"),
    (wrapped(value_schema(), [1]), "payload: expected an object, got array"),
    (enc({"schema": "x", "payload": {}}), "schema: expected an object, got string 'x'"),
    (_env(op="x"), "op: unknown op string 'x'; expected one of 'c', 'u', 'd', 'r', 't'"),
    (_env(op="m"), "unknown op string 'm'"),
    (_env(op=None), "op: unknown op null"),
    (wrapped(value_schema(), json.loads(_env(op="z"))), "payload.op: unknown op string 'z'"),
    (enc({"before": None, "after": AFTER_1, "source": pg_source()}), "op: missing; a Debezium envelope needs 'op'"),
    (enc({"id": 1, "customer": "x"}), "value is not a Debezium change event: no 'op' (envelope) and no '__op'"),
    (_env(op="c", after=None), "after: op 'c' requires an 'after' row image, got null"),
    (_env(op="r", after=None), "after: op 'r' requires an 'after' row image, got null"),
    (_env(after=[1]), "after: expected an object or null, got array"),
    (_env(before="x"), "before: expected an object or null, got string 'x'"),
    (_env(source="pg"), "source: expected an object, got string 'pg'"),
    (_env(after={"customer": "x"}), "missing key column 'id' in after"),
    (_env(after={"id": None, "customer": "x"}), "key column 'id' is null in after"),
    (_env(after=AFTER_1 | {"price": "abc"}), "column 'price': expected DOUBLE, got string 'abc' (at after.price)"),
    (_env(after=AFTER_1 | {"id": "1"}), "column 'id': expected INT, got string '1' (at after.id)"),
    (_env(after=AFTER_1 | {"qty": 70000}), "column 'qty': 70000 is out of range for SMALLINT (at after.qty)"),
    (_env(after=AFTER_1 | {"paid": "yes"}), "column 'paid': expected BOOLEAN, got string 'yes'"),
    (_env(after=AFTER_1 | {"amount": "MDk"}), "column 'amount': expected DECIMAL(10,2), got string 'MDk'"),
    (_env(after=AFTER_1 | {"amount": "M!k="}), "column 'amount': expected DECIMAL(10,2), got string 'M!k='"),
    (_env(after=AFTER_1 | {"blob": "AAH"}), "column 'blob': invalid base64 for BINARY: string 'AAH' (at after.blob)"),
    (_env(after=AFTER_1 | {"order_date": "soon"}), "column 'order_date': expected DATE as an ISO-8601 date string"),
    (_env(before={"id": "1"}), "key column 'id': expected INT, got string '1' (at before.id)"),
    (_env(source=pg_source() | {"lsn": "0/16B3748"}), "source.lsn: expected an integer, got string '0/16B3748'"),
    (_env(source=pg_source(lsn=None, sequence="[oops")), "source.sequence: expected a JSON array of LSNs"),
    (_env(source=pg_source(lsn=None, sequence='[null, "x1"]')), "source.sequence: expected an integer, got string"),
    (_env(source=pg_source(lsn=None, sequence="[]")), "source.sequence: expected a JSON array of LSNs"),
    (_env(source=pg_source(lsn=None, sequence='["1", "\u00b2"]')), "source.sequence: expected an integer"),
    (_env(source=pg_source() | {"ts_ms": 1.5}), "source.ts_ms: expected an integer, got number 1.5"),
    (_env(ts_ms="now"), "ts_ms: expected an integer, got string 'now'"),
    (enc({"id": 1, "__op": "q"}), "__op: unknown op string 'q'"),
    (enc({"id": 1, "__op": "c", "__deleted": "true"}), "__deleted is string 'true' but __op is 'c'"),
    (enc({"id": 1, "__op": "d", "__deleted": False}), "__deleted is boolean false but __op is 'd'"),
    (enc({"id": 1, "__op": "u", "__deleted": "yes"}), "__deleted: expected 'true' or 'false', got string 'yes'"),
    (enc({"__op": "u", "customer": "x"}), "missing key column 'id' in value"),
    (wrapped({"type": "struct", "fields": []}, {"__op": "u", "customer": "x"}),
     "missing key column 'id' in payload"),
    (enc({"id": 1, "__op": "u", "__lsn": [1]}), "__lsn: expected an integer, got array"),
    (wrapped({"type": "struct"}, json.loads(_env())), "schema: expected a Connect struct schema with a 'fields' array"),
    (wrapped({"type": "struct", "fields": [{"field": "op"}]}, json.loads(_env())),
     "schema: envelope schema has no 'after' or 'before' field"),
    (wrapped({"type": "struct", "fields": [1]}, json.loads(_env())), "schema.fields: expected objects with a 'field'"),
    (wrapped(value_schema([f | {"parameters": {}} if f["field"] == "amount" else f for f in ORDERS_FIELDS]),
             json.loads(_env())), "column 'amount': Connect Decimal schema has no valid parameters.scale"),
    (wrapped(value_schema(), json.loads(_env(after=AFTER_1 | {"created_at": "2024-01-31"}))),
     "column 'created_at': expected TIMESTAMP, got string '2024-01-31' (at payload.after.created_at)"),
])
def test_malformed_events_raise_decode_error(value: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(b'{"id": 1}', value, ORDERS)
    assert message in str(info.value), str(info.value)


def test_decode_error_is_a_value_error_and_not_chained() -> None:
    with pytest.raises(ValueError) as info:
        decode(None, b"{", ORDERS)
    assert isinstance(info.value, DecodeError) and info.value.__cause__ is None


def test_table_with_columns_named_like_envelope_fields() -> None:
    """A flattened record of a table with an ``op`` column is not mistaken for an envelope."""
    s = SourceSchema(columns=(("id", "INT"), ("op", "STRING"), ("source", "STRING")), key=("id",))
    ev = decode(None, enc({"id": 1, "op": "x", "source": "web", "__op": "c"}), s)
    assert ev is not None and ev.row == (1, "x", "web")
    ev = decode(None, enc(envelope("c", None, {"id": 2, "op": "y", "source": "app"})), s)
    assert ev is not None and ev.row == (2, "y", "app")
    with pytest.raises(DecodeError, match="is not a Debezium change event"):
        decode(None, enc({"id": 1, "op": "x"}), s)


def _mutations(obj: Any, rng: Any) -> Any:
    """``obj`` with one randomly chosen leaf or member replaced by a value of a random JSON type."""
    junk = [None, True, 0, -1, 2**70, 1.5, float("nan"), "", "x", "AA==", "2024-13-45", [], [1, "a"], {}, {"scale": 1}]
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            paths.append((node, k))
            walk(v)

    walk(obj)
    node, k = rng.choice(paths)
    if isinstance(node, dict) and rng.random() < 0.2:
        del node[k]
    else:
        node[k] = rng.choice(junk)
    return obj


def test_fuzzed_events_raise_only_decode_error() -> None:
    """Whatever a broken producer writes, the outcome is an event, a tombstone or a DecodeError -- never
    another exception, which would fail the whole Spark batch instead of dead-lettering one record."""
    import random

    rng = random.Random(20240131)
    seeds: list[tuple[bytes | None, bytes]] = [
        (b'{"id": 1}', UPDATE_NO_SCHEMA), (None, FLAT_INSERT), (b'{"id": 1}', FLAT_DELETE), (None, TRUNCATE),
        (wrapped(KEY_SCHEMA, {"id": 1}), wrapped(value_schema(), envelope("u", AFTER_1, AFTER_1))),
        (wrapped(KEY_SCHEMA, {"id": 1}), wrapped(value_schema(), envelope("d", None, None))),
    ]
    outcomes = {"event": 0, "none": 0, "error": 0}
    for i in range(3000):
        key, value = seeds[i % len(seeds)]
        mutated = enc(_mutations(json.loads(value), rng))
        kmut = key if key is None or rng.random() < 0.7 else enc(_mutations(json.loads(key), rng))
        try:
            ev = decode(kmut, mutated, ORDERS)
        except DecodeError as e:
            assert str(e)
            outcomes["error"] += 1
            continue
        outcomes["event" if ev is not None else "none"] += 1
        if ev is not None and ev.row is not None:
            assert len(ev.row) == len(ORDERS.columns) and None not in ev.key  # type: ignore[operator]
    assert outcomes["event"] > 300 and outcomes["error"] > 300, outcomes


# ---------------------------------------------------------------------------------------------- ordering
def _ev(lsn: int | None, src_ts: int | None, ts_ms: int | None, v: int, op: str = "u", **kw: Any) -> ChangeEvent:
    ev = decode(None, enc(envelope(op, None, {"id": 1, "qty": v}, lsn=lsn, src_ts=src_ts, ts_ms=ts_ms, **kw)),
                ORDERS)
    assert ev is not None
    return ev


def test_order_by_lsn_even_when_clocks_disagree() -> None:
    events = [_ev(300, 1000, 5000, 3), _ev(100, 3000, 7000, 1), _ev(200, 2000, 1000, 2)]
    assert [e.row[3] for e in sorted(events, key=order_key)] == [1, 2, 3]  # type: ignore[index]
    assert order_key(events[0]) == (300, 1000, 5000)


def test_order_uses_sequence_when_lsn_missing() -> None:
    a = _ev(None, 1, 1, 1, sequence='["90","100"]')
    c = _ev(None, 1, 1, 3, sequence='["100","250"]')
    assert (a.position[0], c.position[0]) == (100, 250)
    # The first element is the previous transaction's commit LSN, not this event's position.
    assert _ev(None, 1, 1, 2, sequence='["100", null]').position == (-1, 1, 1)
    assert _ev(None, 1, 1, 4, sequence=None).position == (-1, 1, 1)
    # source.lsn wins over the sequence when both are present.
    assert _ev(7, 1, 1, 5, sequence='["1","2"]').position[0] == 7


def test_order_falls_back_to_source_ts_then_connector_ts() -> None:
    recs = [{"id": 1, "qty": 3, "__op": "u", "__source_ts_ms": 20, "__ts_ms": 5},
            {"id": 1, "qty": 1, "__op": "c", "__source_ts_ms": 10, "__ts_ms": 9},
            {"id": 1, "qty": 2, "__op": "u", "__source_ts_ms": 10, "__ts_ms": 11}]
    events = [decode(None, enc(r), ORDERS) for r in recs]
    assert [e.row[3] for e in sorted(events, key=order_key)] == [1, 2, 3]  # type: ignore[union-attr,index]


def test_ties_keep_kafka_offset_order_and_duplicates_compare_equal() -> None:
    first, second = _ev(None, 10, 10, 1), _ev(None, 10, 10, 2)
    assert first.position == second.position
    assert [e.row[3] for e in sorted([first, second], key=order_key)] == [1, 2]  # type: ignore[index]
    # At-least-once redelivery: the same change twice is the same event.
    assert decode(None, UPDATE_NO_SCHEMA, ORDERS) == decode(None, UPDATE_NO_SCHEMA, ORDERS)


def test_events_without_lsn_sort_before_events_with_one() -> None:
    assert order_key(_ev(None, 99, 99, 1, sequence=None)) < order_key(_ev(1, 0, 0, 2))


def test_snapshot_then_streaming_order() -> None:
    snap = _ev(24000000, 1000, 1001, 1, op="r", snapshot="last")
    upd = _ev(24000100, 1000, 1002, 2)
    assert sorted([upd, snap], key=order_key) == [snap, upd]


def test_ts_ms_prefers_database_time() -> None:
    assert _ev(1, 111, 222, 1).ts_ms == 111
    assert _ev(1, None, 222, 1).ts_ms == 222
    assert _ev(1, None, None, 1).ts_ms is None


# ------------------------------------------------------------------------------------------ environment
def test_module_imports_no_pyspark() -> None:
    code = ("import sys; import connectors.debezium; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'pyarrow')]; "
            "assert not bad, bad")
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


def test_throughput_sanity() -> None:
    """Decodes 20k realistic events; prints the rate (the machine may be busy, so only correctness is asserted)."""
    schema = SourceSchema(columns=(("id", "INT"), ("customer", "STRING"), ("qty", "SMALLINT"), ("price", "DOUBLE"),
                                   ("paid", "BOOLEAN"), ("created_at", "TIMESTAMP")), key=("id",))
    records = []
    for i in range(20_000):
        after = {"id": i, "customer": f"c{i}", "qty": i % 100, "price": i * 1.5, "paid": i % 2 == 0,
                 "created_at": 1706696130123456 + i}
        before = None if i % 3 else after | {"qty": 0}
        payload = envelope("c" if before is None else "u", before, after, lsn=24023184 + 64 * i,
                           src_ts=1706696130500 + i, ts_ms=1706696130812 + i, txid=771 + i)
        records.append((enc({"id": i}), enc(payload)))
    start = time.perf_counter()
    events = [decode(k, v, schema) for k, v in records]
    elapsed = time.perf_counter() - start
    print(f"\ndebezium decode: {len(records) / elapsed:,.0f} events/s ({elapsed * 1e6 / len(records):.1f} us/event)")
    assert len(events) == 20_000
    for i in (0, 1, 12_345, 19_999):
        ev = events[i]
        assert ev is not None and ev.key == (i,) and ev.op == ("u" if i % 3 == 0 else "c")
        assert ev.row == (i, f"c{i}", i % 100, i * 1.5, i % 2 == 0, datetime(2024, 1, 31, 10, 15, 30, 123456 + i))
        assert ev.position == (24023184 + 64 * i, 1706696130500 + i, 1706696130812 + i)
    assert [e.position for e in events] == sorted(e.position for e in events)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ transaction metadata
def test_transaction_block_gives_id_and_place_among_the_tables_events() -> None:
    from connectors.debezium import decode_transaction_end

    payload = envelope("c", None, AFTER_1)
    assert decode(b'{"id": 1}', enc(payload), ORDERS).txn is None  # type: ignore[union-attr]
    payload["transaction"] = {"id": "571:53195832", "total_order": "3", "data_collection_order": "2"}
    assert decode(b'{"id": 1}', enc(payload), ORDERS).txn == ("571", 2)  # type: ignore[union-attr]
    for op, before, after in (("d", AFTER_1, None), ("t", None, None)):
        p = {**envelope(op, before, after), "transaction": {"id": "9", "data_collection_order": 1}}
        assert decode(b'{"id": 1}', enc(p), ORDERS).txn == ("9", 1)  # type: ignore[union-attr]
    payload["transaction"] = {"id": "x", "data_collection_order": "first"}
    with pytest.raises(DecodeError, match="data_collection_order"):
        decode(b'{"id": 1}', enc(payload), ORDERS)
    end = {"status": "END", "id": "571:53195832", "event_count": 3, "ts_ms": 5,
           "data_collections": [{"data_collection": "public.orders", "event_count": 1},
                                {"data_collection": "public.lines", "event_count": 2}]}
    got = decode_transaction_end(json.dumps({"schema": {}, "payload": end}).encode())
    assert got is not None and (got.id, got.event_count, got.collections) == (
        "571", 3, {"public.orders": 1, "public.lines": 2})  # PostgreSQL's <xid>:<LSN>: the LSN differs per record
    from connectors.debezium import transaction_id

    assert transaction_id("3E11FA47-71CA-11E1-9E33-C80AA9429562:23") == "3E11FA47-71CA-11E1-9E33-C80AA9429562:23"
    assert transaction_id("00000025:00000d08:0025") == "00000025:00000d08:0025"
    assert decode_transaction_end(json.dumps({"status": "BEGIN", "id": "1"}).encode()) is None
    assert decode_transaction_end(None) is None
    with pytest.raises(DecodeError, match="status"):
        decode_transaction_end(b'{"status": "MIDDLE", "id": "1"}')


def test_a_mirror_commit_records_each_transactions_highest_place_in_arrival_order() -> None:
    from connectors.kafka_mirror import transaction_marks

    events = [("T2", 1, 0, 10), (None, None, 0, 11), ("T1", 2, 0, 5), ("T2", 3, 0, 12), ("T1", 1, 0, 4)]
    assert transaction_marks(events) == [["T1", 2], ["T2", 3]]
