"""Decoder for Debezium change events (PostgreSQL connector, Kafka Connect JsonConverter) read from Kafka.

Why this module exists: a Kafka topic written by Debezium is applied to a Delta "mirror" of the source table,
and events that cannot be understood go to a dead-letter table. Both need one function that turns a Kafka
``(key, value)`` pair into a typed, ordered :class:`ChangeEvent` -- or raises :class:`DecodeError` with a
message a person can act on. Nothing is ever dropped silently: a record is a tombstone (``None``), an event,
or an error.

Why pure Python and stdlib only: it runs inside Spark Python workers (``mapInArrow`` / ``foreachBatch``) and in
unit tests without a JVM; importing pyspark or third-party packages here would slow worker start-up and tie
the decoder to a Spark version. Why it is written the way it is: per-column converters are chosen once per
(Spark type, Connect type) and cached, each value is parsed with a single ``json.loads``, and the common case
(an ``int`` for an ``INT`` column, a ``str`` for a ``STRING`` column) costs one class check.

Accepted inputs (see the tests for complete examples):

* the Debezium envelope ``{"before", "after", "source", "op", "ts_ms", "transaction"}``, bare or wrapped by
  JsonConverter ``schemas.enable=true`` as ``{"schema": ..., "payload": ...}``; with the wrapper, the Connect
  field schemas (``io.debezium.time.Date``, ``org.apache.kafka.connect.data.Decimal`` + ``parameters.scale``,
  ...) drive conversion;
* records flattened by ``io.debezium.transforms.ExtractNewRecordState``: row fields at top level plus
  ``__op`` (``add.fields=op``) and/or ``__deleted`` (``delete.tombstone.handling.mode=rewrite``), optionally
  ``__lsn``/``__source_lsn``, ``__source_sequence``, ``__source_ts_ms``, ``__ts_ms``; bare or wrapped;
* truncates (``op: "t"``) and tombstones (null/empty value, or a wrapper whose payload is null). A tombstone
  decodes to ``None``: after a ``d`` event it only serves log compaction. A topic flattened with the SMT's
  default ``delete.tombstone.handling.mode=tombstone`` carries deletes *only* as tombstones; its consumer
  must turn them into deletes itself with :func:`decode_key` (use ``rewrite`` to avoid that).

Fields of the row image that are not mirror columns are ignored and mirror columns missing from it are NULL
(schema drift in either direction); a missing or null key column is an error. The flattened metadata
prefix is assumed to be the default ``__``.

Ordering (:attr:`ChangeEvent.position`, :func:`order_key`): a 3-tuple of ints
``(lsn, source_ts_ms, connector_ts_ms)``, each ``-1`` when absent:

1. ``lsn``: ``source.lsn`` (flattened: ``__lsn`` or ``__source_lsn``), else the last element of
   ``source.sequence`` (``["<last commit lsn>", "<lsn>"]``). PostgreSQL row locks make the LSNs of the
   changes to one row strictly increasing, so this alone orders the events of a key; it is what an event's
   position really is.
2. ``source_ts_ms``: when the change was made in the database (commit time). The fallback when the LSN was
   not carried (a flattened record without ``add.fields=lsn``); millisecond resolution, so it can tie.
3. ``connector_ts_ms``: the top-level ``ts_ms`` (``__ts_ms``), when the connector processed the event; a
   last tie-break, non-decreasing for one connector task.

Events without an LSN sort before events with one (``-1``); one topic normally carries one kind. Equal
positions are either the same change delivered twice (Debezium is at-least-once; applying either copy is the
same) or a genuine tie of the timestamp fallback; ``sorted`` is stable, so feed events in Kafka offset order
and ties keep it -- within a partition the offset order is the connector's emission order.

Timestamps: Spark ``TIMESTAMP`` values come back as *naive* ``datetime`` objects holding UTC wall-clock time.
``timestamptz`` arrives as ``io.debezium.time.ZonedTimestamp`` (ISO string with offset) and is converted to
UTC; ``timestamp`` arrives as ``io.debezium.time.MicroTimestamp`` (its wall-clock value encoded as if UTC) and
is kept as is. Without a Connect schema, an integer for a ``TIMESTAMP`` column is taken as microseconds since
the epoch -- what Debezium's default ``time.precision.mode=adaptive`` produces for ``timestamp(4..6)``; with
``time.precision.mode=connect`` (milliseconds), enable schemas so the unit is known. An integer for a
``DATE`` column is days since the epoch.

Unchanged TOASTed values: PostgreSQL does not send large unchanged values on UPDATE, and Debezium puts the
placeholder ``__debezium_unavailable_value`` in their place. Writing it to the mirror would corrupt the
column, so the decoder sets the value to ``None`` and names the column in :attr:`ChangeEvent.unavailable`;
the applier must keep the mirror's current value for those columns.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

from connectors.column_types import ColumnType, parse_column_type

__all__ = [
    "OPS",
    "UNAVAILABLE_PLACEHOLDER",
    "ChangeEvent",
    "DecodeError",
    "SourceSchema",
    "coerce",
    "decode",
    "decode_key",
    "order_key",
]

OPS = frozenset({"c", "u", "d", "r", "t"})
"""Debezium ``op`` codes accepted: create, update, delete, read (snapshot; an upsert downstream), truncate."""

UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
"""Debezium's default ``unavailable.value.placeholder`` for unchanged TOASTed columns."""

_UNAVAILABLE_B64 = binascii.b2a_base64(UNAVAILABLE_PLACEHOLDER.encode(), newline=False).decode()
_DECIMAL_HANDLING = ("precise", "string", "double")
_EPOCH = datetime(1970, 1, 1)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MICROSECOND = timedelta(microseconds=1)
# Enough digits for any DECIMAL(38, s) value and its rescaling; HALF_UP is how Spark rounds decimals.
_DEC_CTX = Context(prec=100, rounding=ROUND_HALF_UP)
_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_FLOAT_SPECIALS = frozenset({"NaN", "Infinity", "-Infinity"})  # Jackson quotes non-finite doubles

_DECIMAL_NAMES = frozenset({"org.apache.kafka.connect.data.Decimal"})
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_DATE_NAMES = frozenset({"io.debezium.time.Date", "org.apache.kafka.connect.data.Date"})
_TS_MICROS = frozenset({"io.debezium.time.MicroTimestamp"})
_TS_MILLIS = frozenset({"io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"})
_TS_NANOS = frozenset({"io.debezium.time.NanoTimestamp"})

# Flattened-record metadata fields (ExtractNewRecordState with the default add.fields.prefix "__").
_F_OP, _F_DELETED = "__op", "__deleted"
_F_LSN = ("__lsn", "__source_lsn")
_F_SEQUENCE = ("__source_sequence", "__sequence")
_F_SOURCE_TS, _F_TS = "__source_ts_ms", "__ts_ms"
_ENVELOPE_FIELDS = ("before", "after", "source")
_json = json.JSONDecoder().decode


class DecodeError(ValueError):
    """A Kafka record that is not a usable Debezium change event.

    Why a dedicated type: the caller dead-letters exactly these (with the message) and lets any other
    exception fail the batch, because those are bugs rather than bad input. The message names what was wrong
    and where (a field path such as ``payload.after.amount``)."""


class _Mismatch(ValueError):
    """A value that does not fit its column; :func:`_row` adds the column name and path."""


class _Unavailable:
    """Sentinel returned by converters for Debezium's unavailable-value placeholder. Compared by identity, so
    it must stay one object when pickled: Spark's Python workers get the converters by value (cloudpickle
    copies nested functions with the globals they read), and a copied sentinel went unrecognised there, left
    in the row, and failed the whole micro-batch ("Expected bytes, got a '_Unavailable' object")."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unavailable>"

    def __reduce__(self) -> str:
        return "_UNAVAILABLE"  # pickled as a reference to this module's one instance


_UNAVAILABLE = _Unavailable()


#: integer type -> the bits of its largest value
_INT_BOUNDS = {"TINYINT": 7, "SMALLINT": 15, "INT": 31, "BIGINT": 63}


# --------------------------------------------------------------------------------------------- value helpers
def _describe(v: Any) -> str:
    """A value as the JSON that carried it, for messages: ``string 'abc'``, ``integer 5``, ``object``."""
    if v is None:
        return "null"
    if v is True or v is False:
        return f"boolean {'true' if v else 'false'}"
    if isinstance(v, int):
        return f"integer {v}"
    if isinstance(v, float):
        return f"number {v!r}"
    if isinstance(v, str):
        return f"string {v[:60]!r}" + ("..." if len(v) > 60 else "")
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return type(v).__name__


def _expected(label: str, v: Any) -> _Mismatch:
    return _Mismatch(f"expected {label}, got {_describe(v)}")


def _b64(v: str, label: str) -> bytes:
    try:
        return binascii.a2b_base64(v, strict_mode=True)
    except binascii.Error:
        raise _Mismatch(f"invalid base64 for {label}: {_describe(v)}") from None


def _unscaled(v: str, scale: int, label: str) -> Decimal:
    """A Connect ``Decimal``: base64 of the big-endian two's complement unscaled integer."""
    raw = _b64(v, label)
    # Via the string "<unscaled>E<-scale>": exact, and about twice as fast as Decimal(int).scaleb().
    return Decimal(f"{int.from_bytes(raw, 'big', signed=True)}E{-scale}")


def _numeric_string(v: str, label: str) -> Decimal:
    try:
        d = Decimal(v)
    except InvalidOperation:
        raise _expected(label, v) from None
    if not d.is_finite():
        raise _Mismatch(f"{label} cannot hold {_describe(v)}")
    return d


def _to_decimal(v: Any, label: str, strings: str, scale: int) -> Decimal:
    """Any of Debezium's decimal encodings as an exact Decimal.

    ``strings`` says what a JSON string is: ``"base64"`` (Connect ``Decimal``, scale ``scale``), ``"numeric"``
    (``decimal.handling.mode=string``), or ``"auto"`` (no schema, ``precise`` mode assumed): base64 when the
    string can be base64 (only base64 characters, length a multiple of 4), otherwise a number -- so
    ``"12.50"`` and ``"-3"`` read as numbers and ``"MDk="`` as base64."""
    c = v.__class__
    if c is str:
        if strings == "base64" or (strings == "auto" and len(v) % 4 == 0 and v and not v.strip(_B64_CHARS)):
            return _unscaled(v, scale, label)
        return _numeric_string(v, label)
    if c is int:
        return Decimal(v)
    if c is float:
        if v != v or v in (float("inf"), float("-inf")):
            raise _Mismatch(f"{label} cannot hold {_describe(v)}")
        return Decimal(repr(v))
    if c is dict:  # io.debezium.data.VariableScaleDecimal {"scale": s, "value": base64}
        s, raw = v.get("scale"), v.get("value")
        if s.__class__ is not int or raw.__class__ is not str:
            raise _Mismatch(f"expected a VariableScaleDecimal {{'scale': int, 'value': base64}} for {label}")
        return _unscaled(raw, s, label)
    raise _expected(label, v)


def _parse_timestamp(v: str, label: str) -> datetime:
    try:
        if v[-1:] == "Z":  # ZonedTimestamp of a timestamptz is always UTC: skip the time-zone arithmetic
            return datetime.fromisoformat(v[:-1])
        d = datetime.fromisoformat(v)
    except ValueError:
        raise _Mismatch(f"expected {label} as an ISO-8601 string, got {_describe(v)}") from None
    if d.tzinfo is not None:
        d = d.astimezone(UTC).replace(tzinfo=None)
    return d


def _parse_date(v: str, label: str) -> date:
    try:
        return date.fromisoformat(v)
    except ValueError:
        raise _Mismatch(f"expected {label} as an ISO-8601 date string, got {_describe(v)}") from None


# --------------------------------------------------------------------------------------------- converters
Converter = Callable[[Any], Any]
_CONVERTERS: dict[tuple[Any, ...], Converter] = {}


def _converter(t: ColumnType, connect: Mapping[str, Any] | None, decimal_handling: str) -> Converter:
    """The (cached) function converting one non-null JSON value of a column.

    ``connect`` is the column's Connect field schema when the event carried one; its logical ``name`` (and
    ``parameters.scale``) then decide how the JSON value is read. Without it, the Spark type decides."""
    if connect is None:
        ckey: tuple[Any, ...] = (t, None, None, None, decimal_handling)
    else:
        params = connect.get("parameters")
        scale = params.get("scale") if params.__class__ is dict else None
        ckey = (t, connect.get("name"), connect.get("type"), scale, decimal_handling)
    conv = _CONVERTERS.get(ckey)
    if conv is None:
        if len(_CONVERTERS) > 4096:  # only odd input makes this many; keep memory bounded
            _CONVERTERS.clear()
        conv = _CONVERTERS[ckey] = _make_converter(t, connect is not None, *ckey[1:])
    return conv


def _make_converter(t: ColumnType, has_schema: bool, logical: str | None, ctype: str | None, scale: Any,
                    decimal_handling: str) -> Converter:
    label = t.name
    kind = t.kind
    # How a string is read when a decimal is expected, and with which scale.
    dec_scale = t.scale
    if logical in _DECIMAL_NAMES:
        strings = "base64"
        try:
            dec_scale = int(scale)
        except (TypeError, ValueError):
            raise _Mismatch(f"Connect Decimal schema has no valid parameters.scale ({scale!r})") from None
    elif has_schema:
        strings = "numeric" if ctype == "string" else "base64"
    else:
        strings = "numeric" if decimal_handling == "string" else "auto"
    decimal_source = logical in _DECIMAL_NAMES or logical == _VARIABLE_DECIMAL

    if kind == "int":
        bits = _INT_BOUNDS[label]
        lo, hi = -(1 << bits), (1 << bits) - 1

        def conv_int(v: Any) -> Any:
            if v.__class__ is int:
                if lo <= v <= hi:
                    return v
                raise _Mismatch(f"{v} is out of range for {label}")
            if decimal_source:
                d = _to_decimal(v, label, strings, dec_scale)
                if d != d.to_integral_value() or not lo <= d <= hi:
                    raise _Mismatch(f"{d} does not fit {label}")
                return int(d)
            raise _expected(label, v)

        return conv_int

    if kind == "float":

        def conv_float(v: Any) -> Any:
            c = v.__class__
            if c is float:
                return v
            if c is int:
                return float(v)
            if c is str and v in _FLOAT_SPECIALS:
                return float(v)
            if decimal_source:
                return float(_to_decimal(v, label, strings, dec_scale))
            raise _expected(label, v)

        return conv_float

    if kind == "decimal":
        exp = Decimal(1).scaleb(-t.scale)
        int_digits = t.precision - t.scale

        same_scale = dec_scale == t.scale
        always_b64, auto = strings == "base64", strings == "auto"
        bound = 10**t.precision

        def conv_decimal(v: Any) -> Any:
            if same_scale and v.__class__ is str and (
                    always_b64 or (auto and len(v) % 4 == 0 and v and not v.strip(_B64_CHARS))):
                # Fast path (Connect Decimal with the mirror's scale): no rescaling, an integer range check.
                n = int.from_bytes(_b64(v, label), "big", signed=True)
                if -bound < n < bound:
                    return Decimal(f"{n}E{-dec_scale}")
                raise _Mismatch(f"{Decimal(f'{n}E{-dec_scale}')} does not fit {label}")
            d = _to_decimal(v, label, strings, dec_scale)
            try:
                q = d.quantize(exp, context=_DEC_CTX)
            except InvalidOperation:
                raise _Mismatch(f"{d} does not fit {label}") from None
            if q and q.adjusted() >= int_digits:
                raise _Mismatch(f"{d} does not fit {label}")
            return q

        return conv_decimal

    if kind == "string":

        def conv_string(v: Any) -> Any:
            if v.__class__ is str:
                return _UNAVAILABLE if v == UNAVAILABLE_PLACEHOLDER else v
            raise _expected(label, v)

        return conv_string

    if kind == "bool":

        def conv_bool(v: Any) -> Any:
            if v is True or v is False:
                return v
            raise _expected(label, v)

        return conv_bool

    if kind == "binary":

        def conv_binary(v: Any) -> Any:
            if v.__class__ is str:
                return _UNAVAILABLE if v == _UNAVAILABLE_B64 else _b64(v, label)
            raise _expected(label, v)

        return conv_binary

    if kind == "date":
        # With a schema, an integer is days only when the logical type says so (a plain int32 column mapped to
        # DATE is a conf mistake, not something to guess at); without one, integers are days.
        ints = logical in _DATE_NAMES or not has_schema
        strs = not has_schema or ctype == "string"

        def conv_date(v: Any) -> Any:
            c = v.__class__
            if c is int and ints:
                try:
                    return date.fromordinal(_EPOCH_ORDINAL + v)
                except (ValueError, OverflowError):
                    raise _Mismatch(f"{v} days since 1970-01-01 is out of range for {label}") from None
            if c is str and strs:
                return _parse_date(v, label)
            raise _expected(label if (ints or strs) else f"{label} (Connect type {logical or ctype})", v)

        return conv_date

    if kind == "timestamp":
        unit: str | None
        if logical in _TS_MICROS or (not has_schema):
            unit = "micros"  # no schema: Debezium's default time.precision.mode=adaptive -> MicroTimestamp
        elif logical in _TS_MILLIS:
            unit = "millis"
        elif logical in _TS_NANOS:
            unit = "nanos"
        else:
            unit = None
        strs = not has_schema or ctype == "string"  # ZonedTimestamp, IsoTimestamp, or a plain string

        def conv_timestamp(v: Any) -> Any:
            c = v.__class__
            if c is int and unit is not None:
                micros = v if unit == "micros" else v * 1000 if unit == "millis" else v // 1000
                try:
                    return _EPOCH + _MICROSECOND * micros  # exact; faster than timedelta(microseconds=...)
                except OverflowError:
                    raise _Mismatch(f"{v} {unit} since the epoch is out of range for {label}") from None
            if c is str and strs:
                return _parse_timestamp(v, label)
            raise _expected(label if (unit or strs) else f"{label} (Connect type {logical or ctype})", v)

        return conv_timestamp

    raise AssertionError(f"no converter for {t}")  # pragma: no cover - parse_column_type admits no other kind


def coerce(value: Any, spark_type: str, connect_type: Mapping[str, Any] | None = None, *,
           column: str | None = None, decimal_handling: str = "precise") -> Any:
    """Converts one Debezium JSON value to the Python value of a ``spark_type`` column.

    Why public: tests and tools (e.g. re-validating dead letters) need the same conversion the decoder uses.
    ``connect_type`` is the column's Connect field schema (``{"type": "bytes", "name":
    "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}``) when known. ``None`` stays
    ``None``. Raises :class:`DecodeError` (naming ``column`` when given) if the value does not fit."""
    if value is None:
        return None
    try:
        t = parse_column_type(spark_type)
        out = _converter(t, connect_type, decimal_handling)(value)
    except (ValueError, ArithmeticError, TypeError) as e:
        where = f"column {column!r}: " if column is not None else ""
        raise DecodeError(f"{where}{e}") from None
    return None if out is _UNAVAILABLE else out


# --------------------------------------------------------------------------------------------- public types
@dataclass(frozen=True)
class SourceSchema:
    """The mirror table's columns and primary key, from the conf file.

    ``decimal_handling`` mirrors the connector option ``decimal.handling.mode`` and matters only for events
    without a Connect schema: ``"precise"`` (Debezium's default; a DECIMAL string is base64 unless it cannot
    be, e.g. ``"12.50"``) or ``"string"`` (a DECIMAL string is always a number). It exists because a digits-
    only string such as ``"1000"`` is valid in both encodings and guessing would corrupt values silently."""

    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    decimal_handling: str = "precise"
    _types: tuple[ColumnType, ...] = field(init=False, repr=False, compare=False)
    _plan: tuple[tuple[int, str, ColumnType, Converter], ...] = field(init=False, repr=False, compare=False)
    _fast: tuple[tuple[str, Converter], ...] = field(init=False, repr=False, compare=False)
    _toastable: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _key_idx: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Conf files give lists; freeze them so the schema is hashable and safe to share across threads.
        columns = tuple((str(n), str(t)) for n, t in self.columns)
        key = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        names = [n for n, _ in columns]
        if not columns:
            raise ValueError("SourceSchema needs at least one column")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column names in {names}")
        if not key:
            raise ValueError("SourceSchema needs a primary key: the mirror is maintained by key")
        missing = [k for k in key if k not in names]
        if missing or len(set(key)) != len(key):
            raise ValueError(f"key {list(key)} must name distinct columns of {names}")
        if self.decimal_handling not in _DECIMAL_HANDLING:
            raise ValueError(f"decimal_handling must be one of {_DECIMAL_HANDLING}, got {self.decimal_handling!r}")
        types = tuple(parse_column_type(t) for _, t in columns)
        key_idx = tuple(names.index(k) for k in key)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "_types", types)
        object.__setattr__(self, "_plan", tuple((i, n, t, _converter(t, None, self.decimal_handling))
                                                for i, (n, t) in enumerate(zip(names, types, strict=True))))
        object.__setattr__(self, "_fast", tuple((n, conv) for _, n, _, conv in self._plan))
        # Columns whose Debezium value can be the unchanged-TOAST placeholder (varlena text and bytes).
        object.__setattr__(self, "_toastable", tuple(i for i, t in enumerate(types) if t.kind in ("string", "binary")))
        object.__setattr__(self, "_key_idx", key_idx)
        object.__setattr__(self, "_names", frozenset(names))


@dataclass(frozen=True, init=False)
class ChangeEvent:
    """One decoded change, ready to be ordered per key and applied to the mirror.

    ``op``: ``c`` | ``u`` | ``r`` (all upserts of ``row``), ``d`` (delete ``key``), ``t`` (truncate: empty the
    mirror; ``key`` and ``row`` are None). ``key`` follows ``SourceSchema.key``; it comes from the row image
    (``after`` for c/u/r, ``before`` for d), else the Kafka key. ``row`` follows ``SourceSchema.columns``.
    ``before_key`` is set only when an update changed the primary key (the old row must be deleted).
    ``position`` orders events (see the module docstring); ``ts_ms`` is when the change happened in the
    database (``source.ts_ms``), else when the connector processed it. ``unavailable`` names columns whose
    value PostgreSQL did not send (unchanged TOAST); their ``row`` entry is None and the mirror must keep its
    current value. ``txn`` is ``(transaction id, data_collection_order)`` when the connector provides
    transaction metadata (``provide.transaction.metadata``; the envelope's ``transaction`` block): the
    event's 1-based position among its transaction's events of this table (:mod:`pipeline.transactions`)."""

    op: str
    key: tuple[Any, ...] | None
    row: tuple[Any, ...] | None
    before_key: tuple[Any, ...] | None
    position: tuple[int, int, int]
    ts_ms: int | None
    unavailable: tuple[str, ...] = ()
    txn: tuple[str, int] | None = None

    def __init__(self, op: str, key: tuple[Any, ...] | None, row: tuple[Any, ...] | None,
                 before_key: tuple[Any, ...] | None, position: tuple[int, int, int], ts_ms: int | None,
                 unavailable: tuple[str, ...] = (), txn: tuple[str, int] | None = None) -> None:
        # Hand-written because the generated frozen __init__ (one object.__setattr__ per field) cost ~0.8 us
        # of a ~10 us decode; the instance stays immutable (the frozen __setattr__ still applies).
        d = self.__dict__
        d["op"] = op
        d["key"] = key
        d["row"] = row
        d["before_key"] = before_key
        d["position"] = position
        d["ts_ms"] = ts_ms
        d["unavailable"] = unavailable
        d["txn"] = txn


def order_key(e: ChangeEvent) -> tuple[int, int, int]:
    """Sort key putting the events of one primary key in source order: ``(lsn, source ts_ms, connector
    ts_ms)``; see the module docstring. Use with a stable sort over events in Kafka offset order."""
    return e.position


# --------------------------------------------------------------------------------------------- decoding
def _as_int(v: Any, path: str) -> int:
    """A position component: int, or a decimal string (Debezium writes LSNs in ``sequence`` as strings)."""
    if v is None:
        return -1
    if v.__class__ is int:
        return v
    if v.__class__ is str and v.isascii() and v.isdigit():
        return int(v)
    raise DecodeError(f"{path}: expected an integer, got {_describe(v)}")


def _sequence_lsn(seq: Any, path: str) -> int:
    """The event's own LSN from a PostgreSQL ``sequence`` string ``'["<last commit lsn>", "<lsn>"]'``: the
    last element. The first one is the commit LSN of the *previous* transaction, shared by every event of this
    one, so it is not a position of this event and is not used (-1 when the last element is null)."""
    if seq is None:
        return -1
    try:
        items = json.loads(seq) if seq.__class__ is str else seq
    except ValueError:
        items = None
    if items.__class__ is not list or not items:
        raise DecodeError(f"{path}: expected a JSON array of LSNs, got {_describe(seq)}")
    return _as_int(items[-1], path)


_ENVELOPE_POSITION_FIELDS = ("source.lsn", "source.sequence", "source.ts_ms", "ts_ms")


def _position(lsn: Any, seq: Any, src_ts: Any, conn_ts: Any, prefix: str, fields: tuple[str, str, str, str]
              ) -> tuple[tuple[int, int, int], int | None]:
    """``(position, ts_ms)``; ``prefix`` + ``fields`` name the four inputs in messages."""
    n = lsn if lsn.__class__ is int else _as_int(lsn, prefix + fields[0])
    if n < 0:
        n = _sequence_lsn(seq, prefix + fields[1])
    s = src_ts if src_ts.__class__ is int else _as_int(src_ts, prefix + fields[2])
    c = conn_ts if conn_ts.__class__ is int else _as_int(conn_ts, prefix + fields[3])
    return (n, s, c), (s if s >= 0 else c if c >= 0 else None)


def _parse_object(data: bytes | str, what: str) -> dict[str, Any]:
    """One JSON object from a Kafka key or value (bytes, bytearray, memoryview or str)."""
    try:
        # Decoding UTF-8 ourselves skips json.loads' encoding sniffing (Kafka Connect writes UTF-8).
        c = data.__class__
        obj = _json(data.decode("utf-8") if c is bytes else data if c is str else bytes(data).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DecodeError(f"{what} is not UTF-8 text: {e}") from None
    except ValueError as e:  # JSONDecodeError
        raise DecodeError(f"{what} is not valid JSON: {e}") from None
    except (TypeError, RecursionError) as e:  # not bytes-like; absurdly deep nesting
        raise DecodeError(f"{what} could not be parsed as JSON: {type(e).__name__}: {e}") from None
    if obj.__class__ is not dict:
        raise DecodeError(f"{what} must be a JSON object, got {_describe(obj)}")
    return obj


def _unwrap(obj: Any) -> tuple[Any, Any, str]:
    """Splits a JsonConverter ``{"schema", "payload"}`` wrapper; returns (payload, schema or None, path prefix)."""
    if obj.__class__ is dict and len(obj) == 2 and "payload" in obj and "schema" in obj:
        s = obj["schema"]
        if s is not None and s.__class__ is not dict:
            raise DecodeError(f"schema: expected an object, got {_describe(s)}")
        return obj["payload"], s, "payload."
    return obj, None, ""


def _payload(raw: bytes | str | None, what: str) -> tuple[dict[str, Any], Any, str] | None:
    """A Kafka key or value (``what``) as (payload object, Connect schema or None, path prefix); None for a
    tombstone: null, empty, or a schema-wrapped null payload. DecodeError when the payload is no object."""
    if raw is None or len(raw) == 0:
        return None
    payload, schema, prefix = _unwrap(_parse_object(raw, what))
    if payload is None:
        return None
    if payload.__class__ is not dict:
        where = "payload" if what == "value" else f"{what}.payload"
        raise DecodeError(f"{where}: expected an object, got {_describe(payload)}")
    return payload, schema, prefix


def _fields(struct: Any, path: str) -> dict[str, Any]:
    """``{field name: Connect field schema}`` of a Connect struct schema."""
    fields = struct.get("fields") if struct.__class__ is dict else None
    if fields.__class__ is not list:
        raise DecodeError(f"{path}: expected a Connect struct schema with a 'fields' array")
    out: dict[str, Any] = {}
    for f in fields:
        if f.__class__ is not dict or f.get("field").__class__ is not str:
            raise DecodeError(f"{path}.fields: expected objects with a 'field' name, got {_describe(f)}")
        out[f["field"]] = f
    return out


def _envelope_row_fields(vs: dict[str, Any]) -> dict[str, Any]:
    """Column schemas of an envelope schema: those of its ``after`` (or ``before``) struct."""
    top = _fields(vs, "schema")
    struct = top.get("after") or top.get("before")
    if struct is None:
        raise DecodeError("schema: envelope schema has no 'after' or 'before' field")
    return _fields(struct, "schema.after")


def _row(image: dict[str, Any], schema: SourceSchema, connect: dict[str, Any] | None, path: str
         ) -> tuple[list[Any], tuple[str, ...]]:
    """Converts a row image to a list in column order; missing columns are NULL, extra fields are ignored.

    The hot path is one list comprehension over the precomputed converters; only when it fails is the row
    walked again column by column, to name the culprit in the message."""
    get = image.get
    try:
        if connect is None:
            row = [None if (v := get(name)) is None else conv(v) for name, conv in schema._fast]
        else:
            handling = schema.decimal_handling
            cget = connect.get
            row = [None if (v := get(name)) is None else _converter(t, cget(name), handling)(v)
                   for _, name, t, _ in schema._plan]
    except (ValueError, ArithmeticError, TypeError):
        _raise_row_error(image, schema, connect, path)
        raise  # pragma: no cover - _raise_row_error always raises
    unavailable: tuple[str, ...] = ()
    for i in schema._toastable:
        if row[i] is _UNAVAILABLE:
            row[i] = None
            unavailable += (schema.columns[i][0],)
    return row, unavailable


def _raise_row_error(image: dict[str, Any], schema: SourceSchema, connect: dict[str, Any] | None,
                     path: str) -> None:
    for _, name, t, conv in schema._plan:
        v = image.get(name)
        if v is None:
            continue
        try:
            if connect is not None:
                conv = _converter(t, connect.get(name), schema.decimal_handling)
            conv(v)
        except (ValueError, ArithmeticError, TypeError) as e:
            raise DecodeError(f"column {name!r}: {e} (at {path}.{name})") from None
    raise DecodeError(f"{path}: row image could not be converted")  # pragma: no cover - not reproducible


def _check_key(row: list[Any], image: dict[str, Any], schema: SourceSchema, path: str,
               unavailable: tuple[str, ...]) -> tuple[Any, ...]:
    idx = schema._key_idx
    key = (row[idx[0]],) if len(idx) == 1 else tuple([row[i] for i in idx])
    if None in key:
        for k, v in zip(schema.key, key, strict=True):
            if v is None:
                if k not in image:
                    raise DecodeError(f"missing key column {k!r} in {path}")
                if k in unavailable:
                    raise DecodeError(f"key column {k!r} is unavailable (TOAST placeholder) in {path}")
                raise DecodeError(f"key column {k!r} is null in {path}")
    return key


def _image_key(image: dict[str, Any], schema: SourceSchema, connect: dict[str, Any] | None, path: str
               ) -> tuple[Any, ...] | None:
    """The key of a row image, or None when the image lacks a key column (e.g. REPLICA IDENTITY NOTHING)."""
    out = []
    for i in schema._key_idx:
        _, name, t, conv = schema._plan[i]
        v = image.get(name)
        if v is None:
            return None
        try:
            if connect is not None:
                conv = _converter(t, connect.get(name), schema.decimal_handling)
            x = conv(v)
        except (ValueError, ArithmeticError, TypeError) as e:
            raise DecodeError(f"key column {name!r}: {e} (at {path}.{name})") from None
        if x is _UNAVAILABLE:
            return None
        out.append(x)
    return tuple(out)


def decode_key(key: bytes | str | None, schema: SourceSchema) -> tuple[Any, ...] | None:
    """The primary key carried by a Kafka message key (``{"id": 1}`` or its schema-wrapped form).

    Why public: a tombstone has only a key, and with ``ExtractNewRecordState``'s default
    ``delete.tombstone.handling.mode=tombstone`` the tombstone *is* the delete -- a caller consuming such a
    topic turns ``decode(...) is None`` into a delete of ``decode_key(...)`` (ordered by Kafka offset). Returns
    None for a null/empty key; raises :class:`DecodeError` for a malformed one or a missing key column."""
    unwrapped = _payload(key, "key")
    if unwrapped is None:
        return None
    payload, ks, prefix = unwrapped
    connect = _fields(ks, "key.schema") if ks is not None else None
    out = _image_key(payload, schema, connect, f"key.{prefix}".rstrip("."))
    if out is None:
        absent = [k for k in schema.key if payload.get(k) is None]
        raise DecodeError(f"Kafka key lacks key column(s) {absent}: got fields {sorted(payload)}")
    return out


def _delete_key(image: Any, kafka_key: bytes | str | None, schema: SourceSchema,
                connect: dict[str, Any] | None, path: str) -> tuple[Any, ...]:
    if image is not None:
        k = _image_key(image, schema, connect, path)
        if k is not None:
            return k
    k = decode_key(kafka_key, schema)
    if k is None:
        why = "is null" if image is None else f"lacks key column(s) {list(schema.key)}"
        raise DecodeError(f"delete event has no key: {path} {why} and the Kafka key is null")
    return k


def _decode_envelope(p: dict[str, Any], vs: dict[str, Any] | None, prefix: str, kafka_key: bytes | str | None,
                     schema: SourceSchema) -> ChangeEvent:
    op = p.get("op")
    if op.__class__ is not str or op not in OPS:
        raise DecodeError(f"{prefix}op: unknown op {_describe(op)}; expected one of 'c', 'u', 'd', 'r', 't'")
    src = p.get("source")
    if src is None:
        src = {}
    elif src.__class__ is not dict:
        raise DecodeError(f"{prefix}source: expected an object, got {_describe(src)}")
    position, ts = _position(src.get("lsn"), src.get("sequence"), src.get("ts_ms"), p.get("ts_ms"), prefix,
                             _ENVELOPE_POSITION_FIELDS)
    txn = _transaction(p.get("transaction"), prefix)
    if op == "t":
        return ChangeEvent("t", None, None, None, position, ts, (), txn)
    before, after = p.get("before"), p.get("after")
    if before is not None and before.__class__ is not dict:
        raise DecodeError(f"{prefix}before: expected an object or null, got {_describe(before)}")
    if after is not None and after.__class__ is not dict:
        raise DecodeError(f"{prefix}after: expected an object or null, got {_describe(after)}")
    connect = _envelope_row_fields(vs) if vs is not None else None
    if op == "d":
        key = _delete_key(before, kafka_key, schema, connect, prefix + "before")
        return ChangeEvent("d", key, None, None, position, ts, (), txn)
    if after is None:
        raise DecodeError(f"{prefix}after: op {op!r} requires an 'after' row image, got null")
    path = prefix + "after"
    row, unavailable = _row(after, schema, connect, path)
    key = _check_key(row, after, schema, path, unavailable)
    before_key = None
    if op == "u" and before is not None:
        bk = _image_key(before, schema, connect, prefix + "before")
        if bk is not None and bk != key:
            before_key = bk
    return ChangeEvent(op, key, tuple(row), before_key, position, ts, unavailable, txn)


_PG_TXN_ID = re.compile(r"^(\d+):\d+$")


def transaction_id(raw: Any) -> str:
    """A transaction's id as both its events and its END record give it. The PostgreSQL connector writes
    ``<xid>:<LSN>`` with the LSN of the record at hand, so the events of one transaction and its END differ
    after the colon (seen: events ``733:22047416``, END ``733:22047592``); the xid alone names it. Other
    connectors' ids (a MySQL GTID ``<uuid>:<n>``, SQL Server's ``<hex>:<hex>:<hex>``) are kept whole."""
    text = str(raw)
    m = _PG_TXN_ID.match(text)
    return m.group(1) if m else text


def _transaction(t: Any, prefix: str) -> tuple[str, int] | None:
    """The envelope's ``transaction`` block as ``(id, data_collection_order)``; None without metadata."""
    if t is None:
        return None
    if t.__class__ is not dict or t.get("id") is None:
        raise DecodeError(f"{prefix}transaction: expected an object with an 'id', got {_describe(t)}")
    try:
        return transaction_id(t["id"]), int(t.get("data_collection_order"))
    except (TypeError, ValueError):
        raise DecodeError(f"{prefix}transaction.data_collection_order: expected an integer, got "
                          f"{_describe(t.get('data_collection_order'))}") from None


@dataclass(frozen=True)
class TransactionEnd:
    """An END record of a Debezium transaction topic: how many events the transaction wrote per table
    (``data_collection`` -> count, e.g. ``public.orders``)."""

    id: str
    event_count: int
    collections: dict[str, int]
    ts_ms: int | None


def decode_transaction_end(value: bytes | str | None) -> TransactionEnd | None:
    """One record of ``<topic.prefix>.transaction``: its END as :class:`TransactionEnd`, None for a BEGIN or
    a tombstone. Raises :class:`DecodeError` for anything else."""
    unwrapped = _payload(value, "value")
    if unwrapped is None:
        return None
    p, _vs, prefix = unwrapped
    status = p.get("status")
    if status == "BEGIN":
        return None
    if status != "END":
        raise DecodeError(f"{prefix}status: expected 'BEGIN' or 'END', got {_describe(status)}")
    collections: dict[str, int] = {}
    for i, c in enumerate(p.get("data_collections") or ()):
        try:
            collections[str(c["data_collection"])] = int(c["event_count"])
        except (TypeError, KeyError, ValueError):
            raise DecodeError(f"{prefix}data_collections[{i}]: expected data_collection and event_count, got "
                              f"{_describe(c)}") from None
    if p.get("id") is None:
        raise DecodeError(f"{prefix}id: missing")
    ts = p.get("ts_ms")
    return TransactionEnd(transaction_id(p["id"]), int(p.get("event_count") or sum(collections.values())), collections,
                          int(ts) if isinstance(ts, int | float) else None)


def _decode_flattened(p: dict[str, Any], vs: dict[str, Any] | None, prefix: str,
                      kafka_key: bytes | str | None, schema: SourceSchema) -> ChangeEvent:
    flag = p.get(_F_DELETED)
    if flag is None:
        deleted = None
    elif flag is True or flag == "true":
        deleted = True
    elif flag is False or flag == "false":
        deleted = False
    else:
        raise DecodeError(f"{prefix}{_F_DELETED}: expected 'true' or 'false', got {_describe(flag)}")
    op = p.get(_F_OP)
    if op is None:
        op = "d" if deleted else "u"  # no add.fields=op: only "deleted or not" is known; c/u/r all upsert
    elif op.__class__ is not str or op not in OPS:
        raise DecodeError(f"{prefix}{_F_OP}: unknown op {_describe(op)}; expected one of 'c', 'u', 'd', 'r', 't'")
    elif deleted is not None and deleted != (op == "d"):
        raise DecodeError(f"{prefix}{_F_DELETED} is {_describe(flag)} but {prefix}{_F_OP} is {op!r}")
    lsn_field = _F_LSN[0] if _F_LSN[0] in p else _F_LSN[1]
    seq_field = _F_SEQUENCE[0] if _F_SEQUENCE[0] in p else _F_SEQUENCE[1]
    position, ts = _position(p.get(lsn_field), p.get(seq_field), p.get(_F_SOURCE_TS), p.get(_F_TS), prefix,
                             (lsn_field, seq_field, _F_SOURCE_TS, _F_TS))
    if op == "t":
        return ChangeEvent("t", None, None, None, position, ts)
    connect = _fields(vs, "schema") if vs is not None else None
    path = prefix.rstrip(".") or "value"
    if op == "d":
        return ChangeEvent("d", _delete_key(p, kafka_key, schema, connect, path), None, None, position, ts)
    row, unavailable = _row(p, schema, connect, path)
    key = _check_key(row, p, schema, path, unavailable)
    return ChangeEvent(op, key, tuple(row), None, position, ts, unavailable)


def decode(key: bytes | str | None, value: bytes | str | None, schema: SourceSchema) -> ChangeEvent | None:
    """Decodes one Kafka record of a Debezium topic.

    Returns None for a tombstone (null or empty value): after a delete Debezium writes one for log
    compaction, and the delete event itself already carried the change. Raises :class:`DecodeError` for
    anything else that is not a valid change event of ``schema`` -- the caller dead-letters it."""
    unwrapped = _payload(value, "value")  # a schema-wrapped null payload is a tombstone too
    if unwrapped is None:
        return None
    p, vs, prefix = unwrapped
    names = schema._names
    if _F_OP in p or _F_DELETED in p:
        return _decode_flattened(p, vs, prefix, key, schema)
    if "op" in p and ("source" in p or "op" not in names):
        return _decode_envelope(p, vs, prefix, key, schema)
    if any(f in p and f not in names for f in _ENVELOPE_FIELDS):
        raise DecodeError(f"{prefix}op: missing; a Debezium envelope needs 'op'")
    raise DecodeError(f"{'payload' if prefix else 'value'} is not a Debezium change event: no 'op' (envelope) and "
                      "no '__op'/'__deleted' (ExtractNewRecordState with add.fields=op or "
                      "delete.tombstone.handling.mode=rewrite)")
