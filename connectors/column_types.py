"""The Spark SQL types a mirrored source column may have: one grammar for the conf file and the decoder.

A Kafka source's conf lists its columns' Spark types (:mod:`pipeline.conf`), and the Debezium decoder
(:mod:`connectors.debezium`) fills values of those types. Both parse the names here, so the conf accepts
exactly what the decoder can fill, and both spell each type the same way (aliases such as ``LONG``,
``SHORT`` or ``TIMESTAMP_LTZ`` resolved to one canonical name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["ColumnType", "SUPPORTED_TYPES", "parse_column_type", "normalize_type"]

#: What an error message lists: the Spark SQL types the decoder can fill (aliases in brackets).
SUPPORTED_TYPES = (
    "BOOLEAN, TINYINT (BYTE), SMALLINT (SHORT), INT (INTEGER), BIGINT (LONG), FLOAT (REAL), DOUBLE, "
    "DECIMAL(p,s) (NUMERIC(p,s); 1 <= p <= 38, 0 <= s <= p), STRING (VARCHAR(n), CHAR(n)), "
    "DATE, TIMESTAMP (TIMESTAMP_LTZ), TIMESTAMP_NTZ, BINARY"
)


@dataclass(frozen=True)
class ColumnType:
    """A parsed column type: ``name`` is its canonical spelling (``BIGINT``, ``DECIMAL(10,2)``), ``kind``
    selects the decoder's converter."""

    kind: str  # int | float | decimal | string | bool | date | timestamp | binary
    name: str
    precision: int = 0
    scale: int = 0


#: upper-case name or alias of a type without parameters -> (kind, canonical name)
_SIMPLE_TYPES: dict[str, tuple[str, str]] = {
    "BOOLEAN": ("bool", "BOOLEAN"),
    "TINYINT": ("int", "TINYINT"), "BYTE": ("int", "TINYINT"),
    "SMALLINT": ("int", "SMALLINT"), "SHORT": ("int", "SMALLINT"),
    "INT": ("int", "INT"), "INTEGER": ("int", "INT"),
    "BIGINT": ("int", "BIGINT"), "LONG": ("int", "BIGINT"),
    "FLOAT": ("float", "FLOAT"), "REAL": ("float", "FLOAT"), "DOUBLE": ("float", "DOUBLE"),
    "STRING": ("string", "STRING"),
    "DATE": ("date", "DATE"),
    # Spark's TIMESTAMP is the local-time-zone timestamp; TIMESTAMP_LTZ is its explicit name
    "TIMESTAMP": ("timestamp", "TIMESTAMP"), "TIMESTAMP_LTZ": ("timestamp", "TIMESTAMP"),
    "TIMESTAMP_NTZ": ("timestamp", "TIMESTAMP_NTZ"),
    "BINARY": ("binary", "BINARY"),
}
_TYPE_RE = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$")


def parse_column_type(text: str) -> ColumnType:
    """The column type ``text`` names; ValueError (with the supported list) for a type the decoder cannot
    fill. DECIMAL without parameters is Spark's DECIMAL(10,0) and DECIMAL(p) is DECIMAL(p,0); VARCHAR(n)
    and CHAR(n) are strings, and need their length, as in Spark."""
    if not isinstance(text, str):
        raise ValueError(f"unsupported Spark type {text!r} (supported: {SUPPORTED_TYPES})")
    return _parse(text)


@lru_cache(maxsize=256)
def _parse(text: str) -> ColumnType:
    m = _TYPE_RE.match(text)
    if m is None:
        raise ValueError(f"unsupported Spark type {text!r} (supported: {SUPPORTED_TYPES})")
    name, p, s = m.group(1).upper(), m.group(2), m.group(3)
    if name in ("DECIMAL", "NUMERIC", "DEC"):
        precision = int(p) if p is not None else 10
        scale = int(s) if s is not None else 0
        if not 1 <= precision <= 38 or scale > precision:
            raise ValueError(
                f"invalid decimal type {text!r}: need 1 <= precision <= 38 and 0 <= scale <= precision"
            )
        return ColumnType("decimal", f"DECIMAL({precision},{scale})", precision, scale)
    if name in ("VARCHAR", "CHAR"):
        if p is None or s is not None or int(p) < 1:
            raise ValueError(f"invalid type {text!r}: {name} needs a positive length, e.g. {name}(255)")
        return ColumnType("string", "STRING")
    if name in _SIMPLE_TYPES and p is None:
        kind, canonical = _SIMPLE_TYPES[name]
        return ColumnType(kind, canonical)
    raise ValueError(f"unsupported Spark type {text!r} (supported: {SUPPORTED_TYPES})")


def normalize_type(text: str) -> str:
    """Canonical upper-case form of a supported Spark SQL type; ValueError (with the supported list) if not.

    Public so that other entry points (a CLI flag, a test) accept exactly what a conf file accepts."""
    return parse_column_type(text).name
