"""Mirror columns from the Connect schemas Debezium's JSON converter puts in every event, and how a mirror
follows its PostgreSQL table's DDL.

Why: a Kafka source's conf may leave its column list out; the mirror's columns and types then come from the
events themselves (``value.converter.schemas.enable=true`` carries each field's Connect type), and a column
added in PostgreSQL (``ALTER TABLE ... ADD COLUMN``) reaches the mirror as a new column instead of being
dropped by the decoder. Per micro-batch, :func:`evolve` compares the distinct event schemas of the batch with
the mirror's columns:

* a field the mirror lacks is *added* (Delta ``ADD COLUMNS``; older rows read NULL there, as in PostgreSQL);
* a field whose type is wider than the mirror's column (``int`` -> ``bigint``, ``real`` -> ``double``, a
  larger ``numeric``) *widens* the column (Delta type widening);
* a field whose type the mirror's column already holds (a narrower one) changes nothing;
* any other type change *conflicts*: the mirror cannot take those values without rewriting it, so the events
  that carry that type go to the dead-letter table with the reason, and the source is flagged in status.

Pure and stdlib only, like :mod:`connectors.debezium`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Connect logical names -> Spark type (the decoder's converters read these)
_LOGICAL = {
    "io.debezium.time.Date": "DATE", "org.apache.kafka.connect.data.Date": "DATE",
    "io.debezium.time.MicroTimestamp": "TIMESTAMP", "io.debezium.time.Timestamp": "TIMESTAMP",
    "io.debezium.time.NanoTimestamp": "TIMESTAMP", "org.apache.kafka.connect.data.Timestamp": "TIMESTAMP",
    "io.debezium.time.ZonedTimestamp": "TIMESTAMP",
    # numeric without a declared precision: Debezium sends value and scale; 38 digits, 10 after the point
    "io.debezium.data.VariableScaleDecimal": "DECIMAL(38,10)",
}
_DECIMAL_LOGICAL = "org.apache.kafka.connect.data.Decimal"
#: Connect primitive types -> Spark type
_PRIMITIVE = {"int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float32": "FLOAT",
              "float64": "DOUBLE", "boolean": "BOOLEAN", "string": "STRING", "bytes": "BINARY"}
#: metadata fields of flattened records (ExtractNewRecordState, prefix ``__``): not row columns
_META_PREFIX = "__"

_INTEGRAL = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_INTEGRAL_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INT": 10, "BIGINT": 20}
_DECIMAL = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")
_ALIASES = {"INTEGER": "INT", "LONG": "BIGINT", "SHORT": "SMALLINT", "BYTE": "TINYINT", "REAL": "FLOAT"}


def canonical(spark_type: str) -> str:
    """A Spark type in one spelling: upper case, aliases resolved (``int`` -> ``INT``, ``long`` -> ``BIGINT``),
    ``decimal(10, 2)`` -> ``DECIMAL(10,2)``."""
    t = re.sub(r"\s+", "", spark_type.upper())
    return _ALIASES.get(t, t)


def is_widening(old: str, new: str) -> bool:
    """Whether Delta type widening (``delta.enableTypeWidening``, Delta 4.x) turns Spark type ``old`` into
    ``new``: byte -> short -> int -> long, float -> double, byte/short/int -> double, date -> timestamp_ntz, a
    decimal to a larger one, an integral type to a decimal that holds it."""
    old, new = canonical(old), canonical(new)
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL.index(old) < _INTEGRAL.index(new)
    if (old, new) in (("FLOAT", "DOUBLE"), ("DATE", "TIMESTAMP_NTZ")):
        return True
    if old in _INTEGRAL[:3] and new == "DOUBLE":
        return True
    m_new = _DECIMAL.match(new)
    if m_new is None:
        return False
    p2, s2 = int(m_new.group(1)), int(m_new.group(2))
    if old in _INTEGRAL_DIGITS:
        return p2 - s2 >= _INTEGRAL_DIGITS[old]
    m_old = _DECIMAL.match(old)
    if m_old is None:
        return False
    p1, s1 = int(m_old.group(1)), int(m_old.group(2))
    return (p1, s1) != (p2, s2) and s2 >= s1 and p2 - s2 >= p1 - s1


def spark_type(connect: Mapping[str, Any]) -> str | None:
    """The Spark type of a Connect field schema, or None when the mirror cannot hold it (arrays, maps,
    structs other than the variable-scale decimal, time-of-day types)."""
    name = connect.get("name")
    if name in _LOGICAL:
        return _LOGICAL[name]
    if name == _DECIMAL_LOGICAL:
        params = connect.get("parameters") or {}
        try:
            scale = int(params.get("scale", 0))
            precision = int(params.get("connect.decimal.precision", 38))
        except (TypeError, ValueError):
            return None
        precision = min(max(precision, scale, 1), 38)
        return f"DECIMAL({precision},{min(scale, precision)})"
    if name is not None and str(name).startswith("io.debezium.time.") and connect.get("type") != "string":
        return None  # MicroTime, Time, ...: no Spark type fits a time of day
    return _PRIMITIVE.get(str(connect.get("type")))


def signature(connect: Mapping[str, Any]) -> str:
    """A Connect field schema's type, without its name and optionality: equal signatures, equal types."""
    return json.dumps([connect.get("type"), connect.get("name"), connect.get("parameters")], sort_keys=True)


def row_fields(value_schema: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The row's field schemas of an event's Connect schema: the envelope's ``after`` (or ``before``) struct,
    or, for a flattened record, the top-level fields without the ``__`` metadata. Empty when none."""
    fields = value_schema.get("fields") if isinstance(value_schema, Mapping) else None
    if not isinstance(fields, list):
        return {}
    top = {f.get("field"): f for f in fields if isinstance(f, Mapping)}
    struct = top.get("after") or top.get("before")
    if isinstance(struct, Mapping) and isinstance(struct.get("fields"), list) and "op" in top:
        return {f["field"]: f for f in struct["fields"] if isinstance(f, Mapping) and isinstance(f.get("field"), str)}
    return {n: f for n, f in top.items() if isinstance(n, str) and not n.startswith(_META_PREFIX)}


def columns(value_schema: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The mirror columns of an event's Connect schema, in field order (fields without a Spark type left
    out: :func:`evolve` reports them)."""
    return [(n, t) for n, f in row_fields(value_schema).items() if (t := spark_type(f)) is not None]


def key_columns(key_schema: Mapping[str, Any]) -> list[str]:
    """The primary key's columns, from the Kafka key's Connect schema (a struct of the key fields)."""
    fields = key_schema.get("fields") if isinstance(key_schema, Mapping) else None
    return [f["field"] for f in fields or () if isinstance(f, Mapping) and isinstance(f.get("field"), str)]


@dataclass
class Evolution:
    """What one batch's event schemas ask of the mirror (see the module docstring)."""

    added: list[tuple[str, str]] = field(default_factory=list)
    widened: list[tuple[str, str, str]] = field(default_factory=list)  # (column, mirror type, new type)
    #: column -> (Connect type signatures the mirror cannot take, the reason): events carrying them are dead
    #: letters
    conflicts: dict[str, tuple[set[str], str]] = field(default_factory=dict)
    #: fields the mirror cannot hold at all (their values are not mirrored), with the reason
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def changes(self) -> bool:
        return bool(self.added or self.widened)

    def problems(self) -> list[str]:
        return [why for _, why in self.conflicts.values()] + list(self.skipped.values())


def evolve(mirror: Sequence[tuple[str, str]], schemas: Iterable[Mapping[str, Any]], source: str = "") -> Evolution:
    """Compare a batch's distinct event schemas (Connect value schemas) with the mirror's columns."""
    have = {n.lower(): (n, canonical(t)) for n, t in mirror}
    out = Evolution()
    wanted: dict[str, str] = {}  # column (lower) -> the widest type asked for so far
    for vs in schemas:
        for name, f in row_fields(vs).items():
            t = spark_type(f)
            key = name.lower()
            if t is None:
                if key not in have:
                    out.skipped[key] = (f"column {name} of source {source} has Connect type "
                                        f"{f.get('name') or f.get('type')}, which the mirror cannot hold; it is not "
                                        "mirrored")
                else:
                    _conflict(out, name, f, have[key][1], source)
                continue
            t = canonical(t)
            if key not in have:
                if key not in wanted or is_widening(wanted[key], t):
                    wanted[key] = t
                    out.added = [(n, x) for n, x in out.added if n.lower() != key] + [(name, t)]
                continue
            current = wanted.get(key, have[key][1])
            if t == current or is_widening(t, current):
                continue  # the column already holds every value of this type
            if is_widening(current, t):
                wanted[key] = t
                out.widened = [w for w in out.widened if w[0].lower() != key] + [(have[key][0], have[key][1], t)]
                continue
            _conflict(out, name, f, current, source)
    return out


def _conflict(out: Evolution, name: str, f: Mapping[str, Any], current: str, source: str) -> None:
    sigs, _ = out.conflicts.get(name.lower(), (set(), ""))
    sigs.add(signature(f))
    out.conflicts[name.lower()] = (sigs, (
        f"column {name} of source {source} changed its type in the source to {f.get('name') or f.get('type')} "
        f"({spark_type(f) or 'no Spark type'}), which the mirror's {current} column cannot hold without rewriting "
        "the mirror: events of that type go to the dead-letter table. Change the column back in the source, or "
        "rebuild the mirror (drop it and its checkpoint, and let the ingestion read the topic again)"))


def conflicting(value_schema: Mapping[str, Any] | None, conflicts: Mapping[str, tuple[set[str], str]]) -> str | None:
    """The reason an event must be a dead letter, when its schema carries a type the mirror cannot take."""
    if not conflicts or not isinstance(value_schema, Mapping):
        return None
    for name, f in row_fields(value_schema).items():
        hit = conflicts.get(name.lower())
        if hit is not None and signature(f) in hit[0]:
            return hit[1]
    return None
