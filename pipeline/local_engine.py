"""Small deltas computed on the driver by DuckDB, with no Spark job at all.

Why: a differential refresh over a handful of changed rows is mostly Spark's fixed cost: analysing and
optimising a long delta query, a Delta file-filtering job per distinct filtered scan, broadcasts, code
generation. DuckDB on the driver computes the same rows and the same row ids in a fraction of that time
(TPC-H figures in docs/BENCHMARKS.md, "Figures behind the code"). The commit is already delta-rs'
(:mod:`connectors.delta_rs`), so such a refresh now never starts a Spark job.

How: the rendered delta (Spark SQL, see :mod:`dvm.plan`) is parsed with sqlglot, its reads are pointed at
Arrow that delta-rs opens at the pinned versions (snapshots as lazily scanned datasets, into which DuckDB
pushes its filters, also on strings of files delta-rs' MERGE wrote as Arrow views: see
:func:`connectors.delta_rs.dataset`; change windows; the stored table at the version the refresh read), the
key filters are bound from DuckDB's own reads, and the tree is transpiled to DuckDB's dialect.

Why it is safe: only constructs both engines evaluate alike are let through (:data:`_ALLOWED`, reviewed one
by one); anything else raises :class:`Unsupported` and the refresh runs on Spark as before. Where the two
differ, the translation makes them agree or refuses, decided by the argument types DuckDB binds (a guard
function over ``typeof``, which DuckDB folds while planning, so it costs nothing per row):

* ``xxhash64`` (row ids: they must equal those Spark computes in FULL refreshes) is Spark's XXH64, per
  argument type as Spark hashes it (:func:`_spark_hash`); DECIMAL and timestamp arguments are refused, since
  DuckDB's precision for a decimal expression is not always Spark's, and Spark hashes a decimal by it. Where
  Spark's type of an argument is a BIGINT, an integer, a DOUBLE or a STRING, a typed step hashes the value as
  it is, a column at a time (:data:`_TYPED_HASHES`), and refuses when DuckDB's type is not that one. A hash the
  statement outputs (``__row_hash``) is computed after DuckDB, on the result's columns in blocks
  (:meth:`_Translator._deferred`, :func:`_hashed_columns`), with the same refusal as a guard.
* ``/`` on a DECIMAL, and ``AVG`` of one, are Spark's exact quotient at Spark's result type (DuckDB divides
  them in double): the operands go to :func:`_divide` as text, which rounds as Spark's ``Decimal./`` does; a
  zero divisor raises, as Spark's ANSI mode does.
* CASTs: DuckDB rounds a decimal or double cast to an integer where Spark truncates, parses and prints
  strings its own way, and so on; only the pairs in :data:`_CASTS` pass.
* ``DIV`` (Spark's integral division) of integers only, as BIGINTs truncated toward zero; ``%`` of integers
  only. A zero divisor raises in both (Spark's ANSI mode; see below for what a DuckDB error does).
* ``LIKE`` only with a literal pattern without a backslash (Spark's default escape character).
* ``EXTRACT`` / ``year`` / ``month`` / ``day`` / ``quarter`` of a DATE only, cast to Spark's INT (DuckDB gives a
  BIGINT, which hashes otherwise); ``SUBSTRING`` of a string only, from a literal position of at least 1 for
  a literal length (Spark reads position 0 as 1 and a negative length as 0, DuckDB does not).
* ``LENGTH`` of a string only, cast to Spark's INT; ``UPPER`` / ``LOWER`` of ASCII strings only (a row with
  other characters stops DuckDB: Java's case tables are not DuckDB's); ``ROW_NUMBER`` / ``RANK`` /
  ``DENSE_RANK`` / ``NTILE`` cast to Spark's INT; ``NTH_VALUE`` by a literal position; ``LAG`` / ``LEAD`` by a literal offset,
  with a default only when it is an integer literal for a numeric argument or a string literal for a string (both
  engines cast it to the argument's type); ``FIRST_VALUE`` / ``LAST_VALUE`` [IGNORE NULLS]; ``AVG`` over a window
  of integers or floating point; frames by ROWS (UNBOUNDED, CURRENT ROW, a literal count) or by RANGE (a
  literal offset only from one integer ordering value: a decimal's or a double's is typed by each engine's own
  rules).
* ``CAST(NULL AS t)`` for any ``t`` whose leaves cast alike, arrays, maps and structs included (the plain-rows
  rule's deleted rows).
* A user's ``LATERAL VIEW [OUTER] explode / posexplode`` (and ``[LEFT] JOIN LATERAL explode(...) ON θ``) of an
  array of plain values, as ``UNNEST`` joins after the FROM clause (:meth:`_Translator._lateral_views`).
* Structs only as MIN_BY / MAX_BY's rules write them: the stored value (o, v), never ordered, and the key
  (o, v IS NOT NULL, v) they are picked and compared by, with a field added so a NULL ``o`` orders first as in
  Spark (DuckDB orders a struct's NULL fields last), and plain fields only. ``VAR_POP`` / ``STDDEV_POP`` /
  ``COVAR_POP`` of numbers (DOUBLEs by the same streaming update in both); ``~`` of integers.
* A zero divisor stops DuckDB through a UDF (:func:`_nonzero_udf`), not ``error()``, which is volatile and so
  refused in a window's PARTITION BY.
* ``LATERAL`` subqueries (correlated per row in both), and ``explode`` only of the rules' own ``array(...)``
  and ``sequence(1, __dw)`` (a user's ``sequence(1, 0)`` counts down in Spark; INT bounds give INT elements).
* Fixpoints (held relations, a recursive UNION's rounds, the counting series of the UNION ALL rules) are
  evaluated round by round as :func:`pipeline.fixpoints.run` evaluates them, and Spark's own ``WITH
  RECURSIVE`` round by round too (:meth:`_Translator._recursions`: DuckDB's own would not stop where Spark
  stops with an error).
* Sources with timestamp columns, column mapping or CHAR columns are refused. Sources with deletion vectors
  are read with their marked rows left out (:mod:`connectors.vector_reads`); a change window holding a commit
  that marks rows without writing change-data files (Spark's DELETE) is refused, since only the vectors tell
  its change.
* DuckDB sums integers as HUGEINT where Spark's sum is a BIGINT: results are cast back (an overflow raises,
  as in Spark's ANSI mode).

A failure of any kind falls back to Spark. ``trickle.refresh.localEngine`` = ``verify`` (the test suite's
setting) computes every delta both ways and fails the refresh when they differ.
"""

from __future__ import annotations

import datetime
import math
import re
import struct
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from connectors import change_files, deletion_vectors, delta_rs, vector_reads
from connectors.delta_log import DeltaLog
from connectors.storage import local_path
from dvm import PREV, Context, Fixpoint, key_filter
from pipeline import spark_types
from pipeline.errors import RefreshError

#: Spark conf: ``auto`` (default: DuckDB when the delta qualifies), ``off``, or ``verify`` (both engines,
#: compared; a difference fails the refresh)
MODE = "trickle.refresh.localEngine"
#: Spark conf: rows a change window read for DuckDB may hold (more: Spark computes the delta)
MAX_CHANGE_ROWS = "trickle.refresh.localEngineChangeRows"
#: Spark conf: bytes of Delta files the snapshots a delta reads may total for DuckDB to compute it on the
#: driver (default 1 GiB; filters and key filters usually read far less of them): a delta over larger
#: tables runs where Spark runs it, on the cluster
MAX_BYTES = "trickle.refresh.localEngineBelowBytes"
#: Spark conf: bytes of Delta files a FULL refresh's (or a creation's) snapshots may total for DuckDB to compute
#: the whole result on the driver (default 4 MiB; 0: never), whose rows delta-rs then commits: a Spark job and
#: Spark's write cost a small table's creation about 1.3 s, DuckDB and delta-rs a few tens of ms. Small, since
#: a FULL reads its sources whole and a result past ``trickle.apply.fullCollectRowsBelow`` rows is computed
#: again by Spark
MAX_FULL_BYTES = "trickle.refresh.localFullBelowBytes"
#: Spark conf: the same limit for a plain-rows table that spark-trickle's own commit may write (default 256 MiB;
#: 0 turns this case off: such a table's FULL then follows the rules of any other). Its rows are the query's as they are, written by pyarrow in parallel files, whatever
#: their number: Spark's writer costs a FULL of the scan benchmark at 10M rows about 1.2x the user's own CTAS,
#: most of it a row and a field at a time (docs/BENCHMARKS.md, session 81)
MAX_PLAIN_FULL_BYTES = "trickle.refresh.localPlainFullBelowBytes"
#: Spark conf: disk DuckDB may spill to, in a folder under the system's temporary directory (default 4 GiB;
#: DuckDB's own default is the working directory, without a limit). A delta that needs more fails on
#: DuckDB, and Spark computes it
SPILL_BYTES = "trickle.refresh.localEngineSpillBytes"


class Unsupported(Exception):
    """The delta uses something DuckDB would not evaluate exactly as Spark does; Spark computes it.
    ``lasting``: the reason holds for every refresh of the table (its query or its sources' types), not
    only for this refresh's data."""

    def __init__(self, message: str, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


def mode(conf: Any) -> str:
    value = str(conf.get(MODE, "auto")).strip().lower()
    if value not in ("auto", "off", "verify"):
        raise RefreshError(f"{MODE} must be auto, off or verify, not {value!r}")
    return value


def _file_bytes(log: DeltaLog, version: int) -> int | None:
    """Bytes of the table's data files at ``version`` when it has no checksum file: from the log this process
    replays (:func:`connectors.deletion_vectors.live_bytes`), else from delta-rs; None when neither can tell."""
    size = deletion_vectors.live_bytes(log, version)
    return size if size is not None else delta_rs.table_bytes(log.path, version)


# --- Spark's xxhash64 --------------------------------------------------------------------------------------

_MASK = (1 << 64) - 1
_INTS = ("TINYINT", "SMALLINT", "INTEGER")


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def _spark_hash(value: str | None, kind: str, seed: int, spark: str | None = None) -> int:
    """Spark's ``xxhash64`` step for one argument: XXH64 of the value's bytes as Spark lays them out, seeded
    by the hash so far (a NULL leaves it unchanged). ``value`` is DuckDB's text of the value, ``kind`` its
    DuckDB type, ``spark`` Spark's type when it is a decimal (see :mod:`pipeline.spark_types`): Spark hashes a
    decimal of up to 18 digits as its unscaled long, a longer one as the unscaled integer's bytes."""
    import decimal

    import xxhash

    if value is None:
        return seed
    s = seed & _MASK
    if kind in _INTS:
        data = int(value).to_bytes(4, "little", signed=True)
    elif kind == "BOOLEAN":
        data = (1 if value == "true" else 0).to_bytes(4, "little")
    elif kind in ("BIGINT", "HUGEINT"):
        data = int(value).to_bytes(8, "little", signed=True)  # OverflowError past BIGINT: Spark would fail too
    elif kind == "VARCHAR":
        data = value.encode("utf-8")
    elif kind == "DATE":
        data = (datetime.date.fromisoformat(value) - datetime.date(1970, 1, 1)).days.to_bytes(4, "little", signed=True)
    elif kind == "DOUBLE":
        f = float(value)
        data = struct.pack("<d", 0.0 if f == 0.0 else (math.nan if math.isnan(f) else f))
    elif kind == "FLOAT":
        f = float(value)
        data = struct.pack("<f", 0.0 if f == 0.0 else (math.nan if math.isnan(f) else f))
    elif kind.startswith("DECIMAL") and spark is not None:
        p, scale = _decimal_args(spark)
        if _decimal_args(kind)[1] != scale:
            raise ValueError(f"trickle-unsupported: xxhash64 of a {kind} that Spark types {spark}")
        unscaled = int(decimal.Decimal(value).scaleb(scale))
        if p <= 18:
            data = unscaled.to_bytes(8, "little", signed=True)
        else:  # Java's BigInteger.toByteArray: big-endian two's complement, as short as it goes
            data = unscaled.to_bytes(((unscaled if unscaled >= 0 else ~unscaled).bit_length() + 8) // 8, "big",
                                     signed=True)
    else:
        raise ValueError(f"trickle-unsupported: xxhash64 of a {kind}")
    return _signed(xxhash.xxh64_intdigest(data, s))


_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)  # XXH64's primes


def _round(acc: Any, word: Any) -> Any:
    """XXH64's round: one 8-byte lane folded into an accumulator (uint64 arrays, wrapping)."""
    import numpy as np

    x = acc + word * np.uint64(_P2)
    return ((x << np.uint64(31)) | (x >> np.uint64(33))) * np.uint64(_P1)


def _rotl(x: Any, r: int) -> Any:
    import numpy as np

    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _xxh64_fixed(words: Any, width: int, seeds: Any) -> Any:
    """XXH64 of each 4- or 8-byte little-endian word (``words``: uint64 numpy array holding them) seeded by
    ``seeds`` (uint64), vectorised: a refresh hashes every change row of a plain-rows table."""
    import numpy as np

    u = np.uint64
    with np.errstate(over="ignore"):
        h = seeds + u(_P5) + u(width)
        return _avalanche(_word8(h, words) if width == 8 else _word4(h, words))


def _word8(h: Any, word: Any) -> Any:
    """XXH64's step over one 8-byte word after the stripes (uint64 arrays, wrapping; callers ignore overflow)."""
    import numpy as np

    return _rotl(h ^ _round(np.uint64(0), word), 27) * np.uint64(_P1) + np.uint64(_P4)


def _word4(h: Any, word: Any) -> Any:
    """XXH64's step over the one 4-byte word that may follow the 8-byte ones (``word``: its value as uint64)."""
    import numpy as np

    return _rotl(h ^ (word * np.uint64(_P1)), 23) * np.uint64(_P2) + np.uint64(_P3)


def _avalanche(h: Any) -> Any:
    """XXH64's final mix."""
    import numpy as np

    u = np.uint64
    h = h ^ (h >> u(33))
    h = h * u(_P2)
    h = h ^ (h >> u(29))
    h = h * u(_P3)
    return h ^ (h >> u(32))


def _xxh64_block(block: Any, seeds: Any) -> Any:
    """XXH64 of each row of ``block`` (a (rows, length) uint8 array: strings of one length), seeded by ``seeds``
    (uint64), as Spark's ``XXH64.hashUnsafeBytes`` computes it (the reference algorithm): 32-byte stripes in four
    lanes when there are any, then 8-byte words, one 4-byte word, single bytes, and the final mix."""
    import numpy as np

    u = np.uint64
    rows, length = block.shape
    words = np.ascontiguousarray(block[:, :length // 8 * 8]).view("<u8") if length >= 8 else None
    with np.errstate(over="ignore"):
        if length >= 32:
            lanes = [seeds + u(_P1) + u(_P2), seeds + u(_P2), seeds.copy(), seeds - u(_P1)]
            for stripe in range(length // 32):
                lanes = [_round(v, words[:, 4 * stripe + i]) for i, v in enumerate(lanes)]
            h = _rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12) + _rotl(lanes[3], 18)
            for v in lanes:
                h = (h ^ _round(u(0), v)) * u(_P1) + u(_P4)
            done = length // 32 * 4
        else:
            h = seeds + u(_P5)
            done = 0
        h = h + u(length)
        for i in range(done, length // 8):
            h = _word8(h, words[:, i])
        at = length // 8 * 8
        if length - at >= 4:
            h = _word4(h, np.ascontiguousarray(block[:, at:at + 4]).view("<u4").ravel().astype(u))
            at += 4
        for i in range(at, length):
            h = _rotl(h ^ (block[:, i].astype(u) * u(_P5)), 11) * u(_P1)
        return _avalanche(h)


def _xxh64_strings(values: Any, seeds: Any) -> Any:
    """XXH64 of each string's UTF-8 bytes (``values``: an Arrow string column) seeded by ``seeds`` (uint64),
    vectorised per distinct length; a NULL's entry is meaningless (the caller keeps the seed there). Why: row by
    row in Python this was a third of a small refresh of a plain-rows table with a string column (session 80)."""
    import numpy as np
    import pyarrow as pa

    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    arr = arr.cast(pa.large_string()) if arr.type != pa.large_string() else arr
    out = np.zeros(len(arr), dtype=np.uint64)
    if len(arr) == 0:
        return out
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    lone = []
    for length, count in zip(*np.unique(lengths, return_counts=True), strict=True):
        rows = np.flatnonzero(lengths == length)
        if count < _BLOCK_ROWS:  # a few strings of this length: the C hash per string costs less than a block
            lone.append(rows)
            continue
        block = data[starts[rows, None] + np.arange(int(length))] if length else np.zeros((len(rows), 0), np.uint8)
        out[rows] = _xxh64_block(block, seeds[rows])
    if lone:
        import xxhash

        for row in np.concatenate(lone):
            out[row] = xxhash.xxh64_intdigest(data[starts[row]:starts[row] + lengths[row]].tobytes(), int(seeds[row]))
    return out


#: strings of one length hashed as one block from this many on (:func:`_xxh64_strings`): a block costs ~25
#: array operations plus one per 8 bytes, a string alone one call of the ``xxhash`` package
_BLOCK_ROWS = 16


def _seeded(values: Any, hashed: Any, seeds: Any) -> Any:
    """Spark's step result: the hash where the value is not NULL, the seed where it is (Spark skips NULLs)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    return pa.array(np.where(valid, hashed, seeds).view(np.int64), pa.int64())


def _hash_vectorised(values: Any, kind: str, seeds: Any) -> Any | None:
    """:func:`_spark_hash` over a whole column of one kind: fixed-width ones and strings; None for the others
    (row by row)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "VARCHAR":
        seed = seeds.to_numpy(zero_copy_only=False).astype(np.uint64)
        return _seeded(values, _xxh64_strings(values, seed), seed)
    if kind in _INTS or kind == "DATE" or kind == "BOOLEAN":
        width = 4
        if kind == "DATE":
            typed = pc.cast(pc.cast(values, pa.date32()), pa.int32())
        elif kind == "BOOLEAN":
            typed = pc.cast(pc.equal(values, "true"), pa.int32())
        else:
            typed = pc.cast(values, pa.int32())
        ints = pc.fill_null(typed, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        words = ints.view(np.uint64) & np.uint64(0xFFFFFFFF)
    elif kind in ("BIGINT", "HUGEINT"):
        width = 8
        words = pc.fill_null(pc.cast(values, pa.int64()), 0).to_numpy(zero_copy_only=False).view(np.uint64)
    elif kind == "DOUBLE":
        width = 8
        f = pc.fill_null(pc.cast(values, pa.float64()), 0.0).to_numpy(zero_copy_only=False).copy()
        f[f == 0.0] = 0.0  # Spark hashes -0.0 as 0.0, and every NaN as the canonical one
        f[np.isnan(f)] = np.nan
        words = f.view(np.uint64)
    else:
        return None
    seed = seeds.to_numpy(zero_copy_only=False).astype(np.uint64)
    return _seeded(values, _xxh64_fixed(words, width, seed), seed)


#: rows hashed at a time by :func:`_hashed_columns`: numpy's passes over a block this size stay in the processor's
#: cache; over the whole column each pass went to memory (0.06 against 0.9 s for 10M BIGINTs, session 81)
HASH_BLOCK_ROWS = 1 << 17


def _hashed_columns(table: Any, deferred: dict[str, list[str]]) -> Any:
    """``table`` with each deferred hash column (a struct of the hash's arguments, see
    :meth:`_Translator._deferred`) replaced by Spark's ``xxhash64`` of them: seed 42, each argument's step
    seeded by the one before, a NULL argument skipped. Blocks of :data:`HASH_BLOCK_ROWS` rows are hashed on
    as many threads as DuckDB runs (numpy computes without the interpreter's lock)."""
    import numpy as np
    import pyarrow as pa

    for name, kinds in deferred.items():
        packed = table.column(name).combine_chunks()
        fields = [packed.field(i) for i in range(len(kinds))]
        out = np.empty(len(packed), dtype=np.int64)

        def block(at: int, fields: list[Any] = fields, kinds: list[str] = kinds, out: Any = out) -> None:
            n = min(HASH_BLOCK_ROWS, len(out) - at)
            h = pa.array(np.full(n, 42, dtype=np.int64))
            for values, kind in zip(fields, kinds, strict=True):
                part = values.slice(at, n)
                if part.null_count < n:  # a step over NULLs only keeps its seed (the plain rows' NULL mask, mostly)
                    h = _hash_vectorised(part, kind, h)
            out[at:at + n] = h.to_numpy(zero_copy_only=False)

        starts = range(0, len(packed), HASH_BLOCK_ROWS)
        if len(starts) > 1 and THREADS > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(THREADS, thread_name_prefix="trickle-hash") as pool:
                list(pool.map(block, starts))
        else:
            for at in starts:
                block(at)
        table = table.set_column(table.column_names.index(name), name, pa.array(out, pa.int64()))
    return table


#: the typed hash steps :meth:`_Translator._rewrite` calls where Spark's type of an ``xxhash64`` argument is
#: known: Spark type -> (function, the DuckDB type the value is cast to, the DuckDB types it may have been)
_TYPED_HASHES = {
    "BIGINT": ("__trickle_h8", "BIGINT", ("BIGINT", "HUGEINT")),
    "INT": ("__trickle_h4", "INTEGER", _INTS), "SMALLINT": ("__trickle_h4", "INTEGER", _INTS),
    "TINYINT": ("__trickle_h4", "INTEGER", _INTS),
    "DOUBLE": ("__trickle_hd", "DOUBLE", ("DOUBLE",)),
    "STRING": ("__trickle_hs", "VARCHAR", ("VARCHAR",)),
}


def _typed_hash_udf(cast_to: str) -> Callable[[Any, Any, Any], Any]:
    """The step of :data:`_TYPED_HASHES` for values cast to ``cast_to``: ``(value, seed, DuckDB's type of the
    value before the cast)``. Why typed: casting every value to text and parsing it back cost a small refresh of
    a plain-rows table more than the hashing (session 80). The type (a constant DuckDB folds while planning) is
    checked against Spark's, which chose this step: where they differ, the text step would have hashed by
    DuckDB's type, so the delta is left to Spark instead."""
    def step(values: Any, seeds: Any, before: Any) -> Any:
        if len(before):
            _check_hash_type(cast_to, before[0].as_py())
        if seeds.null_count:
            raise ValueError("trickle-unsupported: xxhash64 with a NULL seed")
        hashed = _hash_vectorised(values, cast_to, seeds)
        assert hashed is not None
        return hashed

    return step


def _check_hash_type(cast_to: str, seen: str | None) -> None:
    """Refuses a typed hash step (cast to ``cast_to``) of a value whose DuckDB type ``seen`` is not one Spark's type
    of it allows (:data:`_TYPED_HASHES`): the text step would have hashed by DuckDB's type, not Spark's."""
    if seen is not None and seen not in {spec[1]: spec[2] for spec in _TYPED_HASHES.values()}[cast_to]:
        raise ValueError(f"trickle-unsupported: xxhash64 of a {seen} that Spark types as {cast_to}")


def _decimal_args(kind: str) -> tuple[int, int]:
    p, _, s = kind[kind.find("(") + 1:kind.rfind(")")].partition(",")
    return int(p), int(s)


def _hash_udf(values: Any, kinds: Any, seeds: Any, sparks: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    distinct = pc.unique(kinds).to_pylist()
    if len(distinct) == 1 and seeds.null_count == 0:
        fast = _hash_vectorised(values, distinct[0], seeds)
        if fast is not None:
            return fast
    return pa.array([_spark_hash(v, k, h, t) for v, k, h, t in
                     zip(values.to_pylist(), kinds.to_pylist(), seeds.to_pylist(), sparks.to_pylist(), strict=True)],
                    pa.int64())


def _divide(a: str | None, b: str | None, scale: int) -> str | None:
    """Spark's quotient of two decimals (given as text), as ``Decimal./`` computes it: ``BigDecimal.divide``
    to 39 decimal places, then rounded to the result's ``scale``, both HALF_UP (ties away from zero). In
    integers, so that neither rounding is approximated.

    Called once per row of every decimal division and AVG of a decimal that DuckDB computes (TPC-H Q17's delta
    averages 198K groups twice), so the plain texts DuckDB writes for DECIMAL and integer values are read
    without the ``decimal`` module (a third of the time per row); any other text goes through it."""
    if a is None or b is None:
        return None
    x, y = _plain_decimal(a), _plain_decimal(b)
    if x is None or y is None:
        import decimal

        dx, dy = decimal.Decimal(a).as_tuple(), decimal.Decimal(b).as_tuple()
        x, y = (_unscaled(dx), -int(dx.exponent)), (_unscaled(dy), -int(dy.exponent))
    num, den = x[0], y[0]
    if den == 0:
        raise ValueError("division by zero")
    negative = (num < 0) != (den < 0)
    num, den = abs(num), abs(den)
    shift = 39 - x[1] + y[1]  # x / y * 10**39, as num / den
    if shift >= 0:
        num *= _TENS[shift] if shift < len(_TENS) else 10 ** shift
    else:
        den *= _TENS[-shift] if -shift < len(_TENS) else 10 ** -shift
    q39, r = divmod(num, den)  # both roundings on magnitudes: ties away from zero
    if 2 * r >= den:
        q39 += 1
    unit = _TENS[39 - scale]
    q, r = divmod(q39, unit)
    if 2 * r >= unit:
        q += 1
    digits = str(q).rjust(scale + 1, "0")
    text = f"{digits[:len(digits) - scale]}.{digits[len(digits) - scale:]}" if scale else digits
    return f"-{text}" if negative and q else text


_TENS = tuple(10 ** i for i in range(80))

#: an AVG of a decimal is computed by DuckDB's integer arithmetic (see ``_Translator._average``), not by
#: :func:`_divide`, where its argument's scale plus its result's is at most this: the result's scale is then at
#: most 20 (exact), and the sum, held at both scales while it is scaled, overflows DuckDB's 38 digits only from
#: 10^18 on (then Spark computes the delta)
_NATIVE_AVERAGE_SCALE = 20


def _plain_decimal(text: str) -> tuple[int, int] | None:
    """(unscaled value, scale) of ``[-]digits[.digits]``; None for any other text."""
    whole, _, frac = text.partition(".")
    negative = whole.startswith("-")
    body = (whole[1:] if negative else whole) + frac
    if not (body.isascii() and body.isdigit()):
        return None
    return (-int(body) if negative else int(body)), len(frac)


def _unscaled(t: Any) -> int:
    n = int("".join(map(str, t.digits)) or "0")
    return -n if t.sign else n


def _divide_udf(a: Any, b: Any, scales: Any) -> Any:
    import pyarrow as pa

    return pa.array([_divide(x, y, s) for x, y, s in
                     zip(a.to_pylist(), b.to_pylist(), scales.to_pylist(), strict=True)], pa.string())


# --- the type guard ----------------------------------------------------------------------------------------

_INTEGRAL = {*_INTS, "BIGINT", "HUGEINT"}
#: (DuckDB type of the operand, family of the CAST's target) pairs both engines convert alike
_CASTS: dict[str, Callable[[str], bool]] = {
    "INT": lambda t: t in _INTEGRAL or t == "BOOLEAN",
    "FLOAT": lambda t: t in _INTEGRAL or t in ("DOUBLE", "FLOAT") or t.startswith("DECIMAL"),
    "DECIMAL": lambda t: t in _INTEGRAL or t.startswith("DECIMAL"),
    "VARCHAR": lambda t: t in _INTEGRAL or t in ("VARCHAR", "BOOLEAN", "DATE"),
    "DATE": lambda t: t in ("DATE", "TIMESTAMP"),
    "BOOLEAN": lambda t: t == "BOOLEAN",
}


#: DuckDB's type of an array whose elements are plain values both engines compare and print alike
_PLAIN_ARRAY = re.compile(r"(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\)|VARCHAR|BOOLEAN|DATE)\[\]")


def _guard(kind: str, a: str, b: str | None) -> bool:
    """True when an operation on operands of DuckDB types ``a`` (and ``b``) means in DuckDB what it means in
    Spark; raises otherwise (DuckDB folds this while planning: see the module docstring)."""
    if a == '"NULL"' or b == '"NULL"':
        return True
    if kind == "avg":
        if not (a in _INTEGRAL or a in ("DOUBLE", "FLOAT")):
            raise ValueError(f"trickle-unsupported: AVG of a {a} (Spark averages decimals exactly)")
        return True
    if kind == "avgdec":  # Spark's argument is a decimal: DuckDB's must sum exactly too
        if not (a.startswith("DECIMAL") or a in _INTEGRAL):
            raise ValueError(f"trickle-unsupported: AVG of a {a} where Spark averages a decimal")
        return True
    if kind == "divdec":  # an exact decimal quotient: both operands decimal or integral in DuckDB too
        for t in (a, b or ""):
            if not (t.startswith("DECIMAL") or t in _INTEGRAL):
                raise ValueError(f"trickle-unsupported: a decimal division over a {t}")
        return True
    if kind == "mod":
        if a not in _INTEGRAL or (b or "") not in _INTEGRAL:
            raise ValueError(f"trickle-unsupported: {a} % {b} (only integers)")
        return True
    if kind == "intdiv":  # a DECIMAL's (Spark's exact quotient) or a DOUBLE's DIV is left to Spark
        if a not in _INTEGRAL or (b or "") not in _INTEGRAL:
            raise ValueError(f"trickle-unsupported: {a} DIV {b} (only integers)")
        return True
    if kind in ("date", "string"):  # a date part of a DATE, a substring of a VARCHAR; nothing Spark would cast first
        if a != {"date": "DATE", "string": "VARCHAR"}[kind]:
            raise ValueError(f"trickle-unsupported: {kind} function over a {a}")
        return True
    if kind == "div":
        if a.startswith("DECIMAL") or (b or "").startswith("DECIMAL"):
            raise ValueError(f"trickle-unsupported: division of {a} by {b} (Spark divides decimals exactly)")
        return True
    if kind == "integral":
        if a not in _INTEGRAL:
            raise ValueError(f"trickle-unsupported: an integer operation on a {a}")
        return True
    if kind == "moment":
        for t in (a, b or "DOUBLE"):
            if not (t in _INTEGRAL or t in ("DOUBLE", "FLOAT") or t.startswith("DECIMAL")):
                raise ValueError(f"trickle-unsupported: a moment of a {t}")
        return True
    if kind == "plain":  # a struct's fields: no nested value
        for t in (a, b or ""):
            if any(n in t for n in ("[", "STRUCT", "MAP", "UNION")):
                raise ValueError(f"trickle-unsupported: a struct field of type {t}")
        return True
    if kind == "explode":  # an array of plain values (not a map, not nested: their orders differ)
        if not _PLAIN_ARRAY.fullmatch(a):
            raise ValueError(f"trickle-unsupported: explode of a {a}")
        return True
    if kind == "default:int":  # an integer literal cast to an integer, a floating or a decimal argument
        if not (a in _INTEGRAL or a in ("DOUBLE", "FLOAT") or a.startswith("DECIMAL")):
            raise ValueError(f"trickle-unsupported: an integer default for a {a}")
        return True
    if kind.startswith("xxhash:"):  # a deferred hash's argument (see _Translator._deferred)
        _check_hash_type(kind.split(":", 1)[1], a)
        return True
    if kind == "default:string":
        if a != "VARCHAR":
            raise ValueError(f"trickle-unsupported: a string default for a {a}")
        return True
    family = kind.split(":", 1)[1]
    if not _CASTS[family](a):
        raise ValueError(f"trickle-unsupported: CAST of a {a} to {family}")
    return True


def _nonzero_udf(zero: Any) -> Any:
    """Raises where a divisor is zero (Spark's ANSI mode does), else true. A UDF rather than DuckDB's ``error()``,
    which is volatile, and DuckDB refuses a volatile expression in a window's PARTITION BY (the moment rules'
    pivot partitions by the group key, ``x % 2`` say)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.any(pc.fill_null(zero, False)).as_py():
        raise ValueError("division by zero")
    return pa.array([True] * len(zero), pa.bool_())


def _nonzero(zero: Any, value: Any) -> Any:
    """``value`` where ``zero`` (the divisor = 0) is not true; stops DuckDB where it is (:func:`_nonzero_udf`)."""
    from sqlglot import exp

    return exp.Case(ifs=[exp.If(this=exp.Anonymous(this="__trickle_nonzero", expressions=[zero]), true=value)])


def _guard_udf(kinds: Any, a: Any, b: Any) -> Any:
    import pyarrow as pa

    return pa.array([_guard(k, x, y) for k, x, y in
                     zip(kinds.to_pylist(), a.to_pylist(), b.to_pylist(), strict=True)], pa.bool_())


# --- translation -------------------------------------------------------------------------------------------

def _allowed() -> tuple[type, ...]:
    from sqlglot import exp

    return (exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Union, exp.Except,
            exp.Intersect, exp.With, exp.CTE, exp.Subquery, exp.Table, exp.TableAlias, exp.Alias, exp.Identifier,
            exp.Star, exp.Column, exp.Paren, exp.Limit, exp.Order, exp.Ordered, exp.Distinct, exp.Literal,
            exp.Null, exp.Boolean, exp.DataType, exp.DataTypeParam, exp.Version, exp.Var, exp.Hint, exp.JoinHint,
            exp.And, exp.Or, exp.Not, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In,
            exp.Between, exp.NullSafeEQ, exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Div, exp.IntDiv, exp.Case, exp.If,
            exp.Coalesce, exp.Nullif, exp.Cast, exp.TryCast, exp.Sum, exp.Count, exp.Min, exp.Max, exp.Exists,
            exp.Window, exp.RowNumber, exp.Rank, exp.DenseRank, exp.Lateral, exp.Explode, exp.Array,
            exp.GenerateSeries, exp.Concat, exp.Like, exp.Interval, exp.Anonymous, exp.Tuple, exp.Greatest,
            exp.Least, exp.Avg, exp.Abs, exp.Sqrt, exp.BitwiseXor, exp.BitwiseAnd, exp.BitwiseOr, exp.Mod,
            exp.Values, exp.TsOrDsAdd, exp.Extract, exp.Year, exp.Month, exp.Day, exp.Quarter, exp.Substring,
            exp.TsOrDsToDate, exp.LogicalOr, exp.LogicalAnd, exp.BitwiseXorAgg, exp.BitwiseAndAgg, exp.BitwiseOrAgg,
            exp.Upper, exp.Lower, exp.Length, exp.Lag, exp.Lead, exp.Ntile, exp.Offset, exp.NthValue,
            exp.PercentRank, exp.CumeDist, exp.ColumnDef, exp.FirstValue, exp.LastValue,
            exp.IgnoreNulls, exp.WindowSpec, exp.Struct, exp.PropertyEQ, exp.Dot, exp.ArgMin, exp.ArgMax,
            exp.VariancePop, exp.StddevPop, exp.CovarPop, exp.BitwiseNot)


_CAST_FAMILY = {"BIGINT": "INT", "INT": "INT", "SMALLINT": "INT", "TINYINT": "INT", "DOUBLE": "FLOAT",
                "FLOAT": "FLOAT", "DECIMAL": "DECIMAL", "VARCHAR": "VARCHAR", "TEXT": "VARCHAR",
                "CHAR": None, "DATE": "DATE", "BOOLEAN": "BOOLEAN"}


_DATE_PARTS = ("YEAR", "MONTH", "DAY", "QUARTER")


def _null_type_ok(to: Any, nested: bool = True) -> bool:
    """Whether ``CAST(NULL AS to)`` is the same typed NULL in DuckDB: a type whose every leaf casts between the
    engines (:data:`_CAST_FAMILY`; a DECIMAL with its precision, whose default differs), nested in arrays,
    maps and structs (sqlglot writes each in DuckDB's spelling). ``nested`` False: a leaf type only, the targets
    a CAST of a value may have."""
    from sqlglot import exp

    if not isinstance(to, exp.DataType):
        return False
    kind = to.this.name if hasattr(to.this, "name") else str(to.this)
    if kind in ("ARRAY", "MAP", "STRUCT"):
        parts = [p.args.get("kind") if isinstance(p, exp.ColumnDef) else p for p in to.expressions]
        return nested and bool(parts) and all(_null_type_ok(p) for p in parts)
    family = _CAST_FAMILY.get(kind)
    return family is not None and not (family == "DECIMAL" and not to.expressions)


def _struct_keys(node: Any) -> tuple[str, ...]:
    from sqlglot import exp

    return tuple(e.this.name if isinstance(e, exp.PropertyEQ) else "" for e in node.expressions)


_ORDERED = ("LT", "LTE", "GT", "GTE", "EQ", "NEQ", "NullSafeEQ", "Min", "Max", "Least", "Greatest", "ArgMin",
            "ArgMax")


def _rules_struct(node: Any) -> bool:
    """Whether struct ``node`` is one MIN_BY / MAX_BY's rules write, where they write it: the value (o, v), which
    is stored and never ordered, or the key (o, n, v) with ``n`` = ``v IS NOT NULL``, which orders (a comparison
    of keys, or the ordering of MIN_BY / MAX_BY). A NULL field would order first in Spark, last in DuckDB: the
    key's ``n`` decides where ``v`` is NULL, and :meth:`_Translator._rewrite` adds a field deciding where ``o``
    is."""
    from sqlglot import exp

    keys = _struct_keys(node)
    arg, up = node, node.parent
    while isinstance(up, exp.Paren | exp.Case | exp.If):
        arg, up = up, up.parent
    # MIN_BY / MAX_BY order by their second argument only
    ordered = type(up).__name__ in _ORDERED and not (isinstance(up, exp.ArgMin | exp.ArgMax) and arg is up.this)
    if keys == ("o", "v"):
        return not ordered
    if keys != ("o", "n", "v"):
        return False
    v, n = node.expressions[2].expression, node.expressions[1].expression
    is_null = n.this if isinstance(n, exp.Not) else None
    is_null = is_null.this if isinstance(is_null, exp.Paren) else is_null
    if not (isinstance(is_null, exp.Is) and isinstance(is_null.expression, exp.Null)
            and (is_null.this.this if isinstance(is_null.this, exp.Paren) else is_null.this) == v):
        return False
    return ordered


def _ordering_key(node: Any) -> bool:
    """Whether ``node`` is MIN_BY / MAX_BY's ordering key (:class:`dvm.operators.aggregates.extremum.Extremum`):
    NULL, or a struct (o, n, v), maybe under CASEs."""
    from sqlglot import exp

    if isinstance(node, exp.Paren):
        return _ordering_key(node.this)
    if isinstance(node, exp.Null):
        return True
    if isinstance(node, exp.Struct):
        return _struct_keys(node) == ("o", "n", "v")
    if isinstance(node, exp.Case):
        return all(_ordering_key(i.args["true"]) for i in node.args.get("ifs") or []) and (
            node.args.get("default") is None or _ordering_key(node.args["default"]))
    return False


def _plain_frame(spec: Any) -> bool:
    """A window frame both engines bound alike: ROWS by UNBOUNDED, CURRENT ROW or a literal count of rows, RANGE
    by UNBOUNDED or CURRENT ROW (its peers); not RANGE by an offset (added to the ordering value by each engine's
    own type rules) nor EXCLUDE."""
    from sqlglot import exp

    bounds = [spec.args.get("start"), spec.args.get("end")]
    named = lambda b: b is None or b in ("UNBOUNDED", "CURRENT ROW")  # noqa: E731
    counted = lambda b: isinstance(b, exp.Literal) and not b.is_string and b.name.isdigit()  # noqa: E731
    if spec.args.get("exclude") or spec.args.get("kind") not in ("ROWS", "RANGE"):
        return False
    if spec.args["kind"] == "RANGE" and not all(named(b) for b in bounds):
        # by an offset from one ordering value, which :meth:`_Translator._rewrite` guards to be an integer
        order = spec.parent.args.get("order") if isinstance(spec.parent, exp.Window) else None
        return order is not None and len(order.expressions) == 1 and all(named(b) or counted(b) for b in bounds)
    return all(named(b) or counted(b) for b in bounds)


def _range_by_offset(window: Any) -> bool:
    from sqlglot import exp

    spec = window.args.get("spec")
    return (spec is not None and spec.args.get("kind") == "RANGE"
            and any(isinstance(b, exp.Literal) for b in (spec.args.get("start"), spec.args.get("end"))))


def _default_kind(node: Any) -> str | None:
    """``int`` for an integer literal (maybe negated), ``string`` for a string literal: a LAG / LEAD default whose
    cast to the argument's type both engines make alike, for the argument types :func:`_guard` lets through."""
    from sqlglot import exp

    inner = node.this if isinstance(node, exp.Neg) else node
    if not isinstance(inner, exp.Literal):
        return None
    if inner.is_string:
        return None if isinstance(node, exp.Neg) else "string"
    return "int" if inner.name.isdigit() else None


def _positive_literal(node: Any) -> bool:
    from sqlglot import exp

    return isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit() and int(node.name) >= 1


def _copies(node: Any) -> bool:
    """Whether ``node`` is the plain-rows rule's ``sequence(1, __dw)`` (a BIGINT weight, read only where it is
    positive: the same BIGINTs in both engines)."""
    from sqlglot import exp

    start, end = node.args.get("start"), node.args.get("end")
    return (isinstance(node, exp.GenerateSeries) and isinstance(start, exp.Literal) and start.name == "1"
            and isinstance(end, exp.Column) and end.name == "__dw" and node.args.get("step") is None)


#: Spark SQL parsed, by its text with the refresh's run id replaced by :data:`_RUN_ID_STAND_IN` and its time
#: travel versions by :data:`_VERSION_STAND_IN` numbers, most recently used last (see :func:`_parsed`)
_PARSED: OrderedDict[str, Any] = OrderedDict()
_PARSED_MAX = 64
_PARSED_LOCK = threading.Lock()
_RUN_ID_STAND_IN = "trickle0run0id"
_VERSION_STAND_IN = "7340000000"  # + the occurrence's number, 3 digits
_VERSION = re.compile(r"\bVERSION AS OF (\d+)\b")


def _parsed(sql: str, run_id: str) -> Any:
    """``sql`` parsed as Spark SQL: a tree of the caller's own, to change at will.

    Why kept: a refresh's delta SQL is the previous refresh's text but for the run id in its fixpoints'
    relation names (``dvm.Context.run_id``) and the versions its snapshots read (``VERSION AS OF n``), and
    sqlglot's parse of it was 4 ms of a 31 ms aggregate delta (a copy of the kept tree: 0.8 ms;
    docs/BENCHMARKS.md, "Session 47"); with the versions in the text, one parse in six missed in an oracle of
    set operations and joins over three tables, 12 s of its refresh threads' 80 s ("Session 56"). The run id
    goes back into every string of the copy that holds the stand-in, each version into the number that stood
    in for it. A text where the run id occurs anywhere but right after ``__trickle_fx_`` or
    ``__trickle_keys_`` (a run id of digits only inside a number, say), or that holds a stand-in itself, is
    parsed as it is: there the stand-in could change what the text's tokens are; so is one where ``VERSION AS
    OF n`` also stands in a string or a comment, which the copy could not give back."""
    import sqlglot
    from sqlglot import exp

    from dvm import SPARK

    if not run_id or _RUN_ID_STAND_IN in sql or _VERSION_STAND_IN in sql or sql.count(run_id) != len(
            re.findall(r"__trickle_(?:fx|keys)_" + re.escape(run_id), sql)):
        return sqlglot.parse_one(sql, read=SPARK)
    versions: dict[str, str] = {}  # stand-in -> the version it stands for

    def stand_in(m: re.Match[str]) -> str:
        number = f"{_VERSION_STAND_IN}{len(versions):03d}"
        versions[number] = m.group(1)
        return f"VERSION AS OF {number}"

    key = _VERSION.sub(stand_in, sql.replace(run_id, _RUN_ID_STAND_IN))
    with _PARSED_LOCK:
        kept = _PARSED.get(key)
        if kept is not None:
            _PARSED.move_to_end(key)
    if kept is None:
        kept = sqlglot.parse_one(key, read=SPARK)
        with _PARSED_LOCK:
            _PARSED[key] = kept
            while len(_PARSED) > _PARSED_MAX:
                _PARSED.popitem(last=False)
    tree = kept.copy()
    if key != sql:
        put_back = 0
        for node in tree.walk():
            if versions and isinstance(node, exp.Literal) and not node.is_string and node.this in versions:
                node.set("this", versions[node.this])
                put_back += 1
                continue
            for name, value in list(node.args.items()):
                if isinstance(value, str) and _RUN_ID_STAND_IN in value:
                    node.set(name, value.replace(_RUN_ID_STAND_IN, run_id))
            if node.comments:
                node.comments = [c.replace(_RUN_ID_STAND_IN, run_id) for c in node.comments]
        if put_back != len(versions):  # "VERSION AS OF n" inside a string or a comment: not a version
            return sqlglot.parse_one(sql, read=SPARK)
    return tree


class _Translator:
    """Spark SQL of one refresh to DuckDB SQL over the relations :class:`LocalEngine` registered."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        from sqlglot import exp

        self.exp = exp
        self.allowed = _allowed()
        #: the node types :meth:`_rewrite` may change
        self.rewritten = (exp.Table, exp.Anonymous, exp.Div, exp.IntDiv, exp.Mod, exp.TsOrDsAdd, exp.Extract, exp.Year,
                          exp.Month, exp.Day, exp.Quarter, exp.TsOrDsToDate, exp.Substring, exp.Cast, exp.TryCast,
                          exp.Avg, exp.Concat, exp.GenerateSeries, exp.Hint, exp.JoinHint, exp.Upper, exp.Lower,
                          exp.Length, exp.Window, exp.Join, exp.Select, exp.Struct, exp.VariancePop,
                          exp.StddevPop, exp.CovarPop, exp.BitwiseNot)
        #: set by :meth:`final`: the outermost SELECT whose hashed columns may be deferred, and those deferred
        #: (column -> the DuckDB types of its hash's arguments, in order)
        self._root: Any = None
        self.deferred: dict[str, list[str]] = {}

    def __call__(self, sql: str) -> str:
        return self._translated(_parsed(sql, self.engine.ctx.run_id))

    def final(self, sql: str) -> str:
        """The statement whose rows a refresh takes, with the hashes it outputs deferred (:meth:`_deferred`):
        :attr:`deferred` names them."""
        self.deferred = {}
        tree = _parsed(sql, self.engine.ctx.run_id)
        self._root = tree if isinstance(tree, self.exp.Select) and not tree.args.get("distinct") else None
        try:
            return self._translated(tree)
        finally:
            self._root = None

    def expression(self, sql: str) -> str:
        """A Spark SQL expression (a key filter's predicate) as DuckDB's."""
        import sqlglot

        from dvm import SPARK

        return self._translated(sqlglot.parse_one(sql, read=SPARK))

    def _translated(self, tree: Any) -> str:
        targets = []  # one walk: the check, and the nodes the later steps look at
        for node in tree.walk():
            self._check(node)
            if isinstance(node, self.rewritten):
                targets.append(node)
        if self._recursions(tree):  # CTE bodies replaced: their nodes are no longer in the tree
            targets = [n for n in tree.walk() if isinstance(n, self.rewritten)]
        self._spark_types(targets)
        return self._bottom_up(tree, targets).sql("duckdb", copy=False)

    def _recursions(self, tree: Any) -> bool:
        """Spark's own recursive CTEs (``name AS (anchor UNION ALL step)``) evaluated first, round by round, by
        :meth:`LocalEngine.recursion`, each CTE's body then reading the result. Why not DuckDB's WITH
        RECURSIVE: Spark stops a recursion at ``spark.sql.cteRecursionLevelLimit`` levels (and
        ``cteRecursionRowLimit`` rows) with an error, DuckDB would go on (forever, on a cycle); the rounds
        here stop well before Spark's limits and leave the rest to Spark."""
        from dvm import SPARK

        exp = self.exp

        def reads_itself(cte: Any) -> bool:
            return any(t.name == cte.alias and not t.db for t in cte.this.find_all(exp.Table))

        changed = False
        while True:  # one CTE at a time, outermost first: its anchor and step are translated (and theirs) anew
            found = next(((w, i, c) for w in tree.find_all(exp.With) if w.args.get("recursive")
                          for i, c in enumerate(w.expressions) if reads_itself(c)), None)
            if found is None:
                return changed
            changed = True
            with_, i, cte = found
            body = cte.this
            if not (isinstance(body, exp.Union) and not body.args.get("distinct")) or any(
                    t.name == cte.alias and not t.db for t in body.this.find_all(exp.Table)):
                raise Unsupported("a recursive CTE other than <anchor> UNION ALL <step>")
            prefix = [c.copy() for c in with_.expressions[:i]]
            anchor, step = body.this.copy(), body.expression.copy()
            prev = self.engine.fresh("__trickle_rec_prev")
            for t in step.find_all(exp.Table):
                if t.name == cte.alias and not t.db:
                    t.set("this", exp.to_identifier(prev))
                    if not t.args.get("alias"):
                        t.set("alias", exp.TableAlias(this=exp.to_identifier(cte.alias)))
            head = f"WITH {', '.join(c.sql(dialect=SPARK) for c in prefix)} " if prefix else ""
            columns = [c.name for c in cte.args["alias"].columns] if cte.args.get("alias") else []
            name = self.engine.recursion(columns, self(head + anchor.sql(dialect=SPARK)),
                                         self(head + step.sql(dialect=SPARK)), prev)
            cte.set("this", exp.select("*").from_(name))

    def outputs(self, sql: str) -> dict[str, Any] | None:
        """Spark's types of the columns of query ``sql`` (a held relation's seed)."""
        tree = _parsed(sql, self.engine.ctx.run_id)
        for table in tree.find_all(self.exp.Table):
            self.engine.declare(table)
        return spark_types.Scopes(self.engine.types).outputs(tree, {})

    def _spark_types(self, targets: list[Any]) -> None:
        """Note Spark's types where DuckDB needs them (see :mod:`pipeline.spark_types`): a division's operands
        and ``xxhash64``'s arguments (among ``targets``, the tree's nodes :meth:`_rewrite` looks at), in the
        nodes' ``meta``."""
        exp = self.exp
        wanted = [n for n in targets if isinstance(n, exp.Div | exp.Avg) or (
            isinstance(n, exp.Anonymous) and n.name.lower() == "xxhash64")]
        if not wanted:
            return
        for table in targets:
            if isinstance(table, exp.Table):
                self.engine.declare(table)
        scopes = spark_types.Scopes(self.engine.types)
        for node in wanted:
            select, ctes = scopes.context(node)
            operands = ([node.this, node.expression] if isinstance(node, exp.Div) else
                        [node.this] if isinstance(node, exp.Avg) else node.expressions)
            node.meta["spark"] = [scopes.type_of(a, select, ctes) if select is not None else None for a in operands]

    def _bottom_up(self, tree: Any, targets: list[Any]) -> Any:
        """``tree`` with every node :meth:`_rewrite` changes replaced, children before their parents, so that a
        rewrite wraps operands already rewritten. Only ``targets`` are visited, the nodes of the types it
        rewrites in breadth-first order (a delta holds thousands of nodes, few of which change)."""
        for node in reversed(targets):  # breadth-first, reversed: deeper nodes first
            new = self._rewrite(node)
            if new is node:
                continue
            if node is tree:
                tree = new
            elif new is None:
                node.pop()
            else:
                node.replace(new)
        return tree

    def _check(self, node: Any) -> None:
        exp = self.exp
        if not isinstance(node, self.allowed):
            raise Unsupported(f"{type(node).__name__} ({node.sql('spark')[:80]})")
        if isinstance(node, exp.Anonymous) and node.name.lower() not in ("xxhash64", "table_changes_by_path",
                                                                          "monotonically_increasing_id"):
            raise Unsupported(f"function {node.name}")
        if isinstance(node, exp.Anonymous) and node.name.lower() == "monotonically_increasing_id" and not (
                isinstance(node.parent, exp.BitwiseXor) and isinstance(node.parent.parent, exp.Alias)
                and node.parent.parent.alias == "__row_id"):
            raise Unsupported("monotonically_increasing_id other than as a plain-rows table's row number")
        if isinstance(node, exp.Like):
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string and "\\" not in pattern.name):
                raise Unsupported("LIKE with a pattern that is not a literal without backslashes")
        if isinstance(node, exp.Lateral) and not (
                isinstance(node.this, exp.Explode) and not node.args.get("outer")
                and (isinstance(node.this.this, exp.Array) or _copies(node.this.this))) and not (
                isinstance(node.this, exp.Subquery) and not node.args.get("view")) and not (
                isinstance(node.this, exp.Explode) and not isinstance(node.this.this, exp.GenerateSeries)
                and (node.args.get("view") or type(node.this) is exp.Explode)):
            # the rules' own explode(array(...)) and explode(sequence(1, __dw)), lateral subqueries (a correlated
            # subquery per row in both), and a user's [OUTER] explode / posexplode of an array of plain values
            # (:meth:`_lateral_views`, guarded by the array's type: a map's or a nested value's order differs);
            # Spark's sequence(1, 0) counts down where DuckDB's is empty
            raise Unsupported("LATERAL other than a subquery, or LATERAL VIEW explode / posexplode of an array, or "
                              "explode(sequence(1, __dw))")
        if isinstance(node, exp.Lag | exp.Lead):
            offset, default = node.args.get("offset"), node.args.get("default")
            if not ((offset is None or _positive_literal(offset)) and (
                    default is None or isinstance(default, exp.Null) or _default_kind(default))):
                # a default is cast to the argument's type by both engines; only literals whose cast agrees pass
                raise Unsupported(f"{type(node).__name__.upper()} other than by a literal offset with an integer "
                                  "or string literal default")
        if isinstance(node, exp.Struct) and not _rules_struct(node):
            raise Unsupported(f"a struct other than MIN_BY / MAX_BY's ({node.sql('spark')[:80]})")
        if isinstance(node, exp.PropertyEQ) and not isinstance(node.parent, exp.Struct):
            raise Unsupported(f"PropertyEQ ({node.sql('spark')[:80]})")
        if isinstance(node, exp.Dot) and node.name not in ("o", "v"):
            raise Unsupported(f"a struct field other than MIN_BY / MAX_BY's ({node.sql('spark')[:80]})")
        if isinstance(node, exp.ArgMin | exp.ArgMax) and not _ordering_key(node.expression):
            # ties on an ordering are Spark's to break: only the rules' own key, unique per value, passes
            raise Unsupported(f"{node.sql('spark')[:80]} other than by MIN_BY / MAX_BY's key")
        if isinstance(node, exp.VariancePop | exp.StddevPop | exp.CovarPop) and isinstance(node.parent, exp.Window):
            raise Unsupported(f"{type(node).__name__} as a window function")
        if isinstance(node, exp.WindowSpec) and not _plain_frame(node):
            raise Unsupported(f"WindowSpec ({node.sql('spark')[:80]})")
        if isinstance(node, exp.IgnoreNulls) and not (
                isinstance(node.this, exp.FirstValue | exp.LastValue) and isinstance(node.parent, exp.Window)):
            raise Unsupported(f"IGNORE NULLS ({node.sql('spark')[:80]})")
        if isinstance(node, exp.FirstValue | exp.LastValue) and not isinstance(node.parent, exp.Window | exp.IgnoreNulls):
            raise Unsupported(f"{type(node).__name__} outside a window")
        if isinstance(node, exp.NthValue) and not (_positive_literal(node.args.get("offset"))
                                                    and node.args.get("from_first") is None):
            raise Unsupported("NTH_VALUE other than by a literal position")
        if isinstance(node, exp.Ntile) and not _positive_literal(node.this):
            raise Unsupported("NTILE of other than a positive literal")
        if isinstance(node, exp.Explode) and not isinstance(node.parent, exp.Lateral):
            raise Unsupported("explode outside LATERAL VIEW")
        if isinstance(node, exp.Extract) and node.name.upper() not in _DATE_PARTS:
            raise Unsupported(f"EXTRACT({node.name} ...)")
        if isinstance(node, exp.TsOrDsToDate) and node.args.get("format") is not None:
            raise Unsupported("to_date with a format")
        if isinstance(node, exp.Substring):
            start, length = node.args.get("start"), node.args.get("length")
            if not (_positive_literal(start) and (length is None or _positive_literal(length))):
                # Spark reads a start of 0 as 1 and a negative length as 0, unlike DuckDB
                raise Unsupported("SUBSTRING other than from a literal position for a literal length")
        if isinstance(node, exp.Cast | exp.TryCast):
            if isinstance(node.this, exp.Null) and _null_type_ok(node.to):
                return  # a typed NULL (the plain-rows rule's deleted rows): no value to convert
            if not _null_type_ok(node.to, nested=False):
                raise Unsupported(f"CAST to {node.to.sql('spark')}")

    def _deferred(self, node: Any, kinds: list[Any]) -> Any | None:
        """An ``xxhash64`` that is a column of the outermost SELECT, when Spark's type of every argument has a typed
        step (:data:`_TYPED_HASHES`): its arguments, each cast to that step's type under a guard of DuckDB's type
        of it, packed in a struct that :func:`_hashed_columns` hashes once DuckDB is done. None otherwise.

        Why: a hash in DuckDB is a Python call per 2048-row vector and per argument, one at a time under the
        interpreter's lock; the FULL refresh of the scan benchmark's 10M rows spent 5.3 of its 6.1 s in them. A
        column of the result is hashed in blocks of :data:`HASH_BLOCK_ROWS`, whose arrays stay in the processor's
        cache (docs/BENCHMARKS.md, session 81)."""
        exp = self.exp
        alias = node.parent
        if (self._root is None or not isinstance(alias, exp.Alias) or alias.parent is not self._root
                or alias.arg_key != "expressions" or not node.expressions):
            return None
        typed = [_TYPED_HASHES.get(k) if isinstance(k, str) else None for k in kinds]
        if any(t is None for t in typed) or any(
                c.name == alias.alias for key in ("group", "having", "qualify", "order", "limit", "offset")
                if isinstance(part := self._root.args.get(key), exp.Expression)
                for c in part.find_all(exp.Column)):  # grouped, filtered or ordered by the hash: DuckDB needs it
            return None
        self.deferred[alias.alias] = [t[1] for t in typed]
        return exp.Anonymous(this="struct_pack", expressions=[
            exp.PropertyEQ(this=exp.to_identifier(f"a{i}"),
                           expression=self._guarded(f"xxhash:{t[1]}", a, None, exp.cast(a.copy(), t[1])))
            for i, (a, t) in enumerate(zip(node.expressions, typed, strict=True))])

    def _guarded(self, kind: str, a: Any, b: Any | None, value: Any) -> Any:
        exp = self.exp
        typeof = lambda x: exp.Anonymous(this="typeof", expressions=[x.copy()])  # noqa: E731
        args = [exp.Literal.string(kind), typeof(a), typeof(b) if b is not None else exp.Null()]
        return exp.Paren(this=exp.Case(ifs=[exp.If(this=exp.Anonymous(this="__trickle_ok", expressions=args),
                                                   true=value)]))

    def _rewrite(self, node: Any) -> Any:
        exp = self.exp
        if isinstance(node, exp.Table):
            return self.engine.relation(node)
        if isinstance(node, exp.Anonymous) and node.name.lower() == "monotonically_increasing_id":
            # a plain-rows FULL's row numbers (dvm.plan.plain_rows_sql; a user's query may not call it): only
            # their uniqueness within the evaluation counts, which DuckDB's row numbers have too
            return exp.Paren(this=exp.Sub(this=exp.cast(exp.Window(this=exp.RowNumber()), "BIGINT"),
                                          expression=exp.Literal.number(1)))
        if isinstance(node, exp.Anonymous) and node.name.lower() == "xxhash64":
            kinds = node.meta.get("spark") or [None] * len(node.expressions)
            if (deferred := self._deferred(node, kinds)) is not None:
                return deferred
            h: Any = exp.cast(exp.Literal.number(42), "BIGINT")
            for a, kind in zip(node.expressions, kinds, strict=True):
                typed = _TYPED_HASHES.get(kind) if isinstance(kind, str) else None
                if typed is not None:
                    h = exp.Anonymous(this=typed[0], expressions=[
                        exp.cast(a.copy(), typed[1]), h, exp.Anonymous(this="typeof", expressions=[a.copy()])])
                    continue
                spark = (exp.Literal.string(f"DECIMAL({kind.precision},{kind.scale})")
                         if isinstance(kind, spark_types.Decimal) else exp.Null())
                h = exp.Anonymous(this="__trickle_h", expressions=[
                    exp.cast(a.copy(), "VARCHAR"), exp.Anonymous(this="typeof", expressions=[a.copy()]), h, spark])
            return h
        if isinstance(node, exp.Div) and any(isinstance(t, spark_types.Decimal) for t in node.meta.get("spark") or []):
            a, b = node.meta["spark"]
            lit = lambda x: x.name if isinstance(x, exp.Literal) and x.name.isdigit() else None  # noqa: E731
            result = spark_types.arithmetic("/", a, b, lit(node.this), lit(node.expression))
            if not isinstance(result, spark_types.Decimal):
                raise Unsupported(f"a division of {a} by {b}")
            quotient = exp.Anonymous(this="__trickle_div", expressions=[
                exp.cast(node.this.copy(), "VARCHAR"), exp.cast(node.expression.copy(), "VARCHAR"),
                exp.Literal.number(result.scale)])
            return self._guarded("divdec", node.this, node.expression,
                                 exp.cast(quotient, f"DECIMAL({result.precision}, {result.scale})"))
        if isinstance(node, exp.Mod):  # integers only: Spark's sign (the dividend's) is DuckDB's
            zero = exp.EQ(this=node.expression.copy(), expression=exp.Literal.number(0))
            value = _nonzero(zero, exp.Mod(this=node.this.copy(), expression=node.expression.copy()))
            return self._guarded("mod", node.this, node.expression, value)
        if isinstance(node, exp.IntDiv):
            # Spark's DIV (IntegralDivide) of integers: both operands cast to BIGINT (INT_MIN DIV -1 is 2^31),
            # the quotient truncated toward zero (DuckDB's // of integers too), a BIGINT. A zero divisor
            # raises, as Spark's ANSI mode does (DuckDB 1.x's // gives NULL), and so does BIGINT's overflow
            # (-2^63 DIV -1) in both; DuckDB's error leaves the delta to Spark, which also returns NULL or
            # wraps where ANSI mode is off.
            a, b = exp.cast(node.this.copy(), "BIGINT"), exp.cast(node.expression.copy(), "BIGINT")
            zero = exp.EQ(this=b.copy(), expression=exp.Literal.number(0))
            value = _nonzero(zero, exp.IntDiv(this=a, expression=b))
            return self._guarded("intdiv", node.this, node.expression, value)
        if isinstance(node, exp.TsOrDsAdd):  # date_add(d, n): a DATE in Spark, where DuckDB's d + n days is a TIMESTAMP
            unit = node.args.get("unit")
            if unit is not None and unit.name.upper() != "DAY":
                raise Unsupported(f"date_add by {unit.name}")
            days = exp.Interval(this=node.expression.copy(), unit=exp.var("DAY"))
            return exp.cast(exp.Add(this=node.this.copy(), expression=days), "DATE")
        if isinstance(node, exp.Extract | exp.Year | exp.Month | exp.Day | exp.Quarter):
            # an INT in Spark, a BIGINT in DuckDB (row ids hash the two differently)
            part = node.name.upper() if isinstance(node, exp.Extract) else type(node).__name__.upper()
            arg = node.expression if isinstance(node, exp.Extract) else node.this
            value = exp.cast(exp.Extract(this=exp.var(part), expression=arg.copy()), "INT")
            return self._guarded("date", arg, None, value)
        if isinstance(node, exp.TsOrDsToDate):  # year(d) reads as year(to_date(d)): only a DATE passes
            return self._guarded("date", node.this, None, node.this.copy())
        if isinstance(node, exp.Substring):
            return self._guarded("string", node.this, None, node.copy())
        if isinstance(node, exp.Length):  # characters (code points) of a VARCHAR in both; Spark's INT
            # (the cast of a VARCHAR to itself changes nothing; it keeps DuckDB's binder from failing on
            # another type before the guard refuses it, lastingly)
            text = exp.cast(node.this.copy(), "VARCHAR")
            return self._guarded("string", node.this, None, exp.cast(exp.Length(this=text), "INT"))
        if isinstance(node, exp.Upper | exp.Lower):
            # Java's and DuckDB's case tables differ past ASCII ('ß' upper is 'SS' in Spark): a row with other
            # characters (more bytes than characters) stops DuckDB, and Spark computes the delta
            text = lambda: exp.cast(node.this.copy(), "VARCHAR")  # noqa: E731 - as for LENGTH above
            ascii_only = exp.EQ(this=exp.Anonymous(this="strlen", expressions=[text()]),
                                expression=exp.Length(this=text()))
            value = exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Paren(this=ascii_only)), true=exp.Anonymous(
                this="error", expressions=[exp.Literal.string(
                    f"trickle-unsupported: {type(node).__name__.upper()} of a string past ASCII")]))],
                default=type(node)(this=text()))
            return self._guarded("string", node.this, None, value)
        if isinstance(node, exp.Window) and isinstance(node.this, exp.RowNumber | exp.Rank | exp.DenseRank | exp.Ntile):
            return exp.cast(node.copy(), "INT")  # an INT in Spark, a BIGINT in DuckDB (hashed otherwise)
        if isinstance(node, exp.Window) and _range_by_offset(node):
            # RANGE n PRECEDING / FOLLOWING: the same frame in both over an integer ordering value (NULLs are
            # each other's peers); a decimal's or a double's offset is typed by each engine's own rules
            ordered = node.args["order"].expressions[0]
            ordered.set("this", self._guarded("integral", ordered.this, None, ordered.this.copy()))
            if isinstance(node.this, exp.Avg):
                return self._guarded("avg", node.this.this, None, node.copy())
            return node
        if isinstance(node, exp.Window) and isinstance(node.this, exp.Avg):
            # of integers or floating point only, a DOUBLE in both (a decimal's exact average is left to Spark);
            # the argument's type is probed outside the window, where it is a plain (or grouped) expression
            return self._guarded("avg", node.this.this, None, node.copy())
        if isinstance(node, exp.Window) and isinstance(node.this, exp.Lag | exp.Lead) and (
                kind := _default_kind(node.this.args.get("default"))):
            # both engines cast the default to the argument's type (DuckDB's overflow is an error: Spark decides)
            return self._guarded(f"default:{kind}", node.this.this, None, node.copy())
        if isinstance(node, exp.Div):
            zero = exp.EQ(this=node.expression.copy(), expression=exp.Literal.number(0))
            value = _nonzero(zero, exp.Div(this=node.this.copy(), expression=node.expression.copy()))
            return self._guarded("div", node.this, node.expression, value)
        if isinstance(node, exp.Cast | exp.TryCast):
            if isinstance(node.this, exp.Null):
                return exp.Cast(this=exp.Null(), to=node.to.copy())
            name = node.to.this.name if hasattr(node.to.this, "name") else str(node.to.this)
            cast = exp.Cast(this=node.this.copy(), to=node.to.copy())
            if _CAST_FAMILY[name] == "DATE" and isinstance(node.this, exp.Literal) and _ISO_DATE.fullmatch(node.this.name):
                return cast  # DATE '1994-01-01': both engines read an ISO date literal alike
            return self._guarded(f"cast:{_CAST_FAMILY[name]}", node.this, None, cast)
        if isinstance(node, exp.Avg) and not isinstance(node.parent, exp.Window):
            # typeof(min(x)): the argument's type, inside the aggregate's context
            probe = exp.Min(this=node.this.copy())
            kind = (node.meta.get("spark") or [None])[0]
            if isinstance(kind, spark_types.Decimal):  # Spark's Average: the exact SUM / COUNT at its result type
                result = spark_types.bounded(kind.precision + 4, kind.scale + 4)
                if kind.scale + result.scale <= _NATIVE_AVERAGE_SCALE:
                    quotient = self._average(node.this, result.scale)
                else:
                    quotient = exp.Anonymous(this="__trickle_div", expressions=[
                        exp.cast(exp.Sum(this=node.this.copy()), "VARCHAR"),
                        exp.cast(exp.Count(this=node.this.copy()), "VARCHAR"), exp.Literal.number(result.scale)])
                return self._guarded("avgdec", probe, None,
                                     exp.cast(quotient, f"DECIMAL({result.precision}, {result.scale})"))
            return self._guarded("avg", probe, None, exp.Avg(this=node.this.copy()))
        if isinstance(node, exp.Concat):
            return exp.Concat(expressions=[self._guarded("cast:VARCHAR", a, None, exp.cast(a.copy(), "VARCHAR"))
                                           for a in node.expressions], safe=node.args.get("safe"))
        if isinstance(node, exp.GenerateSeries):
            return exp.GenerateSeries(start=exp.cast(node.args["start"].copy(), "BIGINT"),
                                      end=exp.cast(node.args["end"].copy(), "BIGINT"))
        if isinstance(node, exp.Hint | exp.JoinHint):
            return None
        if isinstance(node, exp.Join) and isinstance(node.this, exp.Lateral):
            return self._lateral_join(node)
        if isinstance(node, exp.BitwiseNot):  # two's complement of an integer, its own type, in both
            return self._guarded("integral", node.this, None, node.copy())
        if isinstance(node, exp.VariancePop | exp.StddevPop | exp.CovarPop) and not isinstance(node.parent, exp.Window):
            # of numbers only, as DOUBLEs in both (Spark casts a string; Welford's update in both), probed inside
            # the aggregate's context as AVG's argument is
            b = node.expression if isinstance(node, exp.CovarPop) else None
            return self._guarded("moment", exp.Min(this=node.this.copy()),
                                 exp.Min(this=b.copy()) if b is not None else None, node.copy())
        if isinstance(node, exp.Struct):
            # MIN_BY / MAX_BY's struct and key: their fields must be plain values, whose order both engines share
            # (a nested value's NULL fields order first in Spark, last in DuckDB)
            fields = {e.this.name: e.expression for e in node.expressions}
            struct = node.copy()
            if "n" in fields:  # the key: a NULL ``o`` first, as in Spark (DuckDB orders NULL fields last)
                struct.set("expressions", [exp.PropertyEQ(this=exp.to_identifier("z"), expression=exp.Not(
                    this=exp.Is(this=fields["o"].copy(), expression=exp.Null()))), *struct.expressions])
            return self._guarded("plain", fields["o"], fields["v"], struct)
        if isinstance(node, exp.Select) and node.args.get("laterals"):
            self._lateral_views(node)
        return node

    def _average(self, arg: Any, scale: int) -> Any:
        """AVG of a decimal ``arg`` at the result ``scale`` as Spark computes it (:func:`_divide` of its SUM by its
        COUNT), in DuckDB's own integer arithmetic: ``sign(A) * ((2|A| + N) // 2N)`` with ``A`` the sum in units
        of ``10^-scale`` (a HUGEINT, exact: the sum has at most ``scale`` decimals) and ``N`` the count, read back
        as a decimal of that scale. A sum too large for it stops DuckDB with an overflow, and Spark computes the
        delta (DuckDB's decimal product keeps the sum's own scale, so the sum must stay below
        ``10^(38 - its scale - scale)``).

        Why: :func:`_divide` is Python called per group; TPC-H Q17's delta averages 198K groups at both states
        (docs/BENCHMARKS.md, "Session 66"). Exact where ``scale`` <= 20 (:data:`_NATIVE_AVERAGE_SCALE`): Spark rounds
        the quotient to 39 places first, and rounding twice differs from rounding once to ``scale`` only where
        the quotient's fraction lies less than ``10^(scale-39)/2`` below a tie; a fraction of a count ``N`` lies
        at least ``1/2N`` from one, and ``N < 2^63 < 10^19 <= 10^(39-scale)``."""
        exp = self.exp
        hugeint = lambda x: exp.cast(x, "HUGEINT")  # noqa: E731
        total = hugeint(exp.Mul(this=exp.Sum(this=arg.copy()), expression=hugeint(exp.Literal.number(10 ** scale))))
        count = exp.Count(this=arg.copy())
        two = exp.Literal.number(2)
        magnitude = exp.IntDiv(
            this=exp.Paren(this=exp.Add(this=exp.Mul(this=two.copy(), expression=exp.Abs(this=total.copy())),
                                        expression=count.copy())),
            expression=exp.Paren(this=exp.Mul(this=two.copy(), expression=count.copy())))
        units = exp.Mul(this=exp.Anonymous(this="sign", expressions=[total.copy()]), expression=magnitude)
        unit = exp.cast(exp.Literal.number(f"0.{'0' * (scale - 1)}1" if scale else "1"), f"DECIMAL({scale + 1}, {scale})")
        value = exp.Mul(this=exp.cast(units, "DECIMAL(38, 0)"), expression=unit)
        return exp.Case(ifs=[exp.If(this=exp.GT(this=count.copy(), expression=exp.Literal.number(0)), true=value)])

    def _lateral_join(self, join: Any) -> Any:
        """``L [CROSS] JOIN LATERAL explode(array(...)) AS r(c) [ON θ]`` as DuckDB's ``UNNEST`` in FROM, which
        is lateral there (sqlglot renders the LATERAL for DuckDB as a second CROSS JOIN, which does not
        parse). An outer one is refused: Spark keeps a left row whose array yields no row, and that needs
        checking first. Lateral subqueries keep their form."""
        exp = self.exp
        lateral = join.this
        if not isinstance(lateral.this, exp.Explode):
            return join
        side = (join.side or "").upper()
        rules_own = isinstance(lateral.this.this, exp.Array)
        if side in ("RIGHT", "FULL") or (side == "LEFT" and rules_own):
            raise Unsupported(f"{side} JOIN LATERAL explode(...)")
        on = join.args.get("on")
        array = lateral.this.this.copy() if rules_own else self._plain_array(lateral.this.this)
        unnest = exp.Unnest(expressions=[array], alias=lateral.args["alias"].copy())
        if side == "LEFT":  # a left row no element matches is kept once, NULL-padded, in both
            return exp.Join(this=unnest, side="LEFT", on=on.copy() if on is not None else exp.true())
        return exp.Join(this=unnest, on=on.copy()) if on is not None else exp.Join(this=unnest, kind="CROSS")

    def _plain_array(self, array: Any) -> Any:
        """A user's array to unnest, guarded: an array of plain values (a map's entries, or a nested value
        whose NULL fields order otherwise in DuckDB, are left to Spark)."""
        return self._guarded("explode", array, None, array.copy())

    def _lateral_views(self, select: Any) -> None:
        """A SELECT's ``LATERAL VIEW [OUTER] explode / posexplode(arr) t AS ...`` clauses, when one explodes a
        user's array, as joins after its FROM clause, in their order (a later one may read an earlier one's
        columns): ``CROSS JOIN`` an ``UNNEST`` for an inner one, ``LEFT JOIN ... ON TRUE`` for an outer one, which
        keeps a row whose array is NULL or empty once, NULL-padded, as Spark does. posexplode's position is
        DuckDB's ordinality less one, an INT as in Spark."""
        import sqlglot

        exp = self.exp
        views = select.args.get("laterals") or []
        rules_own = lambda g: isinstance(g.this, exp.Array) or _copies(g.this)  # noqa: E731
        outer = lambda v: bool(v.args.get("outer")) or type(v.this) in (exp._ExplodeOuter, exp.PosexplodeOuter)  # noqa: E731
        if all(type(v.this) is exp.Explode and rules_own(v.this) and not outer(v) for v in views):
            return  # the rules' own explode(array(...)) / explode(sequence(...)): sqlglot renders them
        for view in views:
            g, alias = view.this, view.args["alias"]
            array = g.this.copy() if rules_own(g) else self._plain_array(g.this)
            cols = [_q(c.name) for c in alias.columns]
            if isinstance(g, exp.Posexplode):
                if len(cols) != 2:
                    raise Unsupported("posexplode without two column names")
                body = (f"SELECT CAST(__o - 1 AS INT) AS {cols[0]}, __x AS {cols[1]} "
                        f"FROM UNNEST({array.sql('duckdb')}) WITH ORDINALITY AS __u(__x, __o)")
            else:
                if len(cols) != 1:
                    raise Unsupported("explode of an array into other than one column")
                body = f"SELECT __x AS {cols[0]} FROM UNNEST({array.sql('duckdb')}) AS __u(__x)"
            join = "LEFT JOIN" if outer(view) else "CROSS JOIN"
            on = " ON TRUE" if outer(view) else ""
            item = sqlglot.parse_one(f"SELECT 1 FROM __l {join} LATERAL ({body}) AS {_q(alias.name)}{on}",
                                     read="duckdb").args["joins"][0]
            select.append("joins", item)
        select.set("laterals", None)


# --- the engine --------------------------------------------------------------------------------------------

_FX_TABLE = re.compile(r"^__trickle_fx_")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


#: DuckDB's worker threads (its own thread included) for a statement reading more than
#: :data:`SMALL_INPUT_BYTES`; one below it
THREADS = 2
#: bytes of input (Delta files of the snapshots read, Arrow bytes of the change windows) up to which a
#: statement runs on DuckDB's calling thread alone. Why: on a few thousand rows a second worker has nothing
#: to split, and the worker DuckDB keeps busy between and after the statement's tasks takes the core the
#: refresh's own work runs on: with one thread, the floor benchmark's aggregate delta (20-30 KB of input)
#: took 26.3 instead of 28.5 ms and the commit and bookkeeping after it 5.0 instead of 6.6 ms. A join and
#: aggregate over Arrow took 20% less with one thread at 250 KB of input, 7% more at 2.5 MB, 68% more at
#: 25 MB (docs/BENCHMARKS.md, session 48)
SMALL_INPUT_BYTES = 1 << 20

# :meth:`LocalEngine.run` takes a small delta's rows from DuckDB's DB-API on purpose (see there)
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result makes an extra copy", category=UserWarning)


class _Database:
    """The process's DuckDB database for one spill limit, with the UDFs the translation calls, and how many
    worker threads it runs now. DuckDB's thread count is the database's, not a connection's (``SET threads``
    is refused locally), so it is changed only when the wanted count differs, and never lowered while a
    statement that wanted more runs (:meth:`fitted`)."""

    def __init__(self, spill_bytes: int) -> None:
        import tempfile

        import duckdb

        self.con = duckdb.connect(config={"threads": THREADS,
                                          "temp_directory": f"{tempfile.gettempdir()}/trickle-duckdb",
                                          "max_temp_directory_size": f"{spill_bytes}B"})
        # Parquet footers kept between refreshes: a Delta table's files never change, and every refresh that
        # reads a snapshot with DuckDB's reader binds its files' schemas (connectors.delta_rs.parquet_scan)
        self.con.execute("SET parquet_metadata_cache = true")
        for name, fn, args, out in (
                ("__trickle_h", _hash_udf, ["VARCHAR", "VARCHAR", "BIGINT", "VARCHAR"], "BIGINT"),
                *((name, _typed_hash_udf(cast_to), [cast_to, "BIGINT", "VARCHAR"], "BIGINT")
                  for name, cast_to, _ in {spec[0]: spec for spec in _TYPED_HASHES.values()}.values()),
                ("__trickle_div", _divide_udf, ["VARCHAR", "VARCHAR", "INTEGER"], "VARCHAR"),
                ("__trickle_ok", _guard_udf, ["VARCHAR", "VARCHAR", "VARCHAR"], "BOOLEAN"),
                ("__trickle_nonzero", _nonzero_udf, ["BOOLEAN"], "BOOLEAN")):
            self.con.create_function(name, fn, args, out, type="arrow", side_effects=False, null_handling="special")
        self.threads = THREADS
        self._large = 0  # statements running that read more than SMALL_INPUT_BYTES
        self._lock = threading.Lock()

    @contextmanager
    def fitted(self, cursor: Any, input_bytes: int) -> Iterator[None]:
        """Run the block (a statement on ``cursor`` and the fetch of its rows) with the threads its input
        calls for. The count only changes how fast DuckDB works, never what it answers, so a statement that
        started under another count is still right. The last large statement to end sets the count back to one
        itself. Why: going from two threads to one waits for DuckDB's second thread to wind down the large
        statement's work, 68 ms after a FULL of 10M rows, which the next small refresh paid (in the 10M matrix
        the first refresh after each FULL took 0.15-0.17 s against 0.07-0.09 s; docs/BENCHMARKS.md, session
        81); the large statement takes seconds."""
        large = input_bytes > SMALL_INPUT_BYTES
        with self._lock:
            self._large += large
            want = THREADS if self._large else 1
            if want != self.threads:
                cursor.execute(f"SET threads = {want}")
                self.threads = want
        try:
            yield
        finally:
            if large:
                with self._lock:
                    self._large -= 1
                    if not self._large and self.threads != 1:
                        try:
                            cursor.execute("SET threads = 1")
                            self.threads = 1
                        except Exception:  # noqa: BLE001 - the next statement sets the count again
                            pass


#: the process's databases, one per spill limit
_DATABASES: dict[int, _Database] = {}
_DATABASES_LOCK = threading.Lock()


def database(spill_bytes: int = 4 << 30) -> _Database:
    """The process's DuckDB database for ``spill_bytes``; take a connection of its own with ``.con.cursor()``
    (close it after use).

    Why shared: opening a database costs 12-17 ms and closing it 3 ms, a fifth of a small refresh computed
    here (the floor benchmark: 60-80 ms); a connection to an open one costs 1.5 ms. Nothing of a refresh
    outlives its connection: its registered Arrow views and TEMP tables and views are the connection's own,
    dropped when it closes, and two refreshes on two threads each have their own. The UDFs are the
    database's, pure functions of their arguments. The spill limit is a database setting, so each limit
    read from the conf gets its database."""
    with _DATABASES_LOCK:
        base = _DATABASES.get(spill_bytes)
        if base is None:
            base = _DATABASES[spill_bytes] = _Database(spill_bytes)
        return base


@dataclass(frozen=True)
class _ParquetScan:
    """A snapshot read by DuckDB's own Parquet reader (:func:`connectors.delta_rs.parquet_scan`), and how to
    open its Arrow dataset instead."""

    sql: str
    fallback: Callable[[], Any]


def _parquet_scan(path: str, version: int) -> str | None:
    try:
        return delta_rs.parquet_scan(path, version)
    except Exception:  # noqa: BLE001 - the Arrow dataset reads it (or says why it cannot)
        return None


class LocalEngine:
    """One refresh's delta evaluated by DuckDB: the relations it reads, registered once each."""

    def __init__(self, spark: Any, ctx: Context, read_version: int | None, max_change_rows: int,
                 max_bytes: int = 1 << 30, spill_bytes: int = 4 << 30) -> None:
        self.spark, self.ctx, self.read_version = spark, ctx, read_version
        self.max_change_rows, self.max_bytes, self.bytes = max_change_rows, max_bytes, 0
        self.input_bytes = 0  # of the relations registered so far: snapshots' Delta files, windows' Arrow
        self.db = database(spill_bytes)
        self.con = self.db.con.cursor()
        #: Spark's column types of each relation the queries read, by the name a FROM item gives it
        self.types: dict[str, dict[str, Any]] = {}
        self._checked: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.names: dict[tuple[Any, ...], str] = {}
        self.keep: list[Any] = []
        self.translate = _Translator(self)
        self.predicates: dict[str, str] = {}
        self._fresh = 0

    def _register(self, key: tuple[Any, ...], make: Callable[[], Any]) -> str:
        """The name a relation is read by in this refresh's connection: an Arrow object registered, or a view
        over DuckDB's own Parquet reader (a :class:`_ParquetScan`, its Arrow dataset registered instead when
        DuckDB cannot bind the view)."""
        if key not in self.names:
            import duckdb

            obj = make()
            name = f"__trickle_local_{len(self.names)}"
            if isinstance(obj, _ParquetScan):
                try:
                    self.con.execute(f"CREATE TEMP VIEW {name} AS {obj.sql}")
                    self.names[key] = name
                    return name
                except duckdb.Error:
                    obj = obj.fallback()
            self.con.register(name, obj)
            self.keep.append(obj)
            self.names[key] = name
        return self.names[key]

    def declare(self, node: Any) -> None:
        """Note Spark's column types of the relation a FROM item reads (see :meth:`_Translator.outputs`)."""
        from sqlglot import exp

        if isinstance(node.this, exp.Anonymous):
            a = node.this.expressions
            if node.this.name.lower() == "table_changes_by_path" and len(a) == 3:
                key = f"changes:{a[0].name}"
                if key not in self.types:
                    cols = self._readable(a[0].name, int(a[2].name))
                    self.types[key] = {**cols, "_change_type": "STRING", "_commit_version": "BIGINT"}
        elif node.db == "delta" and f"delta.{node.name}" not in self.types:
            version = node.args.get("version")
            v = int(version.expression.name) if version is not None else self.read_version
            if v is not None:
                self.types[f"delta.{node.name}"] = self._readable(node.name, v)

    def _readable(self, path: str, *versions: int) -> dict[str, Any]:
        """Spark's column types of the table at ``path``; raises :class:`Unsupported` when delta-rs may read
        it otherwise than Spark (at any of ``versions``). Read once per refresh: typing the query
        (:meth:`declare`) and registering its relations both ask."""
        key = (path, *versions)
        if key not in self._checked:
            self._checked[key] = self._check_readable(path, versions)
        return self._checked[key]

    def _check_readable(self, path: str, versions: tuple[int, ...]) -> dict[str, Any]:
        from pipeline.fixpoints import _read_like_spark

        if local_path(path) is None:
            raise Unsupported(f"{path} is not on a local file system")
        log = DeltaLog(self.spark, path)
        schemas = set()
        for v in versions:
            meta = _read_like_spark(log, v)
            if meta is None:
                raise Unsupported(f"delta-rs may not read {path} at version {v} as Spark does")
            if '"timestamp' in meta.schema_json.lower():
                raise Unsupported(f"{path} has timestamp columns")
            schemas.add(meta.schema_json)
        if len(schemas) > 1:
            raise Unsupported(f"the schema of {path} changed inside the window")
        return {name: spark_types.parse_type(kind) for name, kind in meta.columns()}

    def snapshot(self, path: str, version: int) -> str:
        def make() -> Any:
            self._readable(path, version)
            log = DeltaLog(self.spark, path)
            size = log.table_size(version)
            if size is None:
                size = _file_bytes(log, version)
            if size is None:
                raise Unsupported(f"the size of {path} at version {version} is unknown", lasting=False)
            self.bytes += size
            self.input_bytes += size
            if self.bytes > self.max_bytes:
                raise Unsupported(f"the snapshots read total more than {self.max_bytes} bytes ({MAX_BYTES})",
                                  lasting=False)
            return _ParquetScan(scan, dataset) if (scan := _parquet_scan(path, version)) else dataset()

        def dataset() -> Any:
            try:
                return delta_rs.dataset(path, version)
            except Exception as e:  # noqa: BLE001 - e.g. a deletion vector delta-rs cannot decode: Spark reads it
                why = (str(e).splitlines() or [type(e).__name__])[0][:200]
                raise Unsupported(f"delta-rs cannot open {path} at version {version}: {why}", lasting=False) from e

        return self._register(("snapshot", path, version), make)

    def changes(self, path: str, first: int, last: int) -> str:
        def make() -> Any:
            if first < 1:
                raise Unsupported("a change window from version 0")
            self._readable(path, first - 1, last)
            log = DeltaLog(self.spark, path)
            if vector_reads.enabled(log.protocol(last)):
                marked = log.marked_without_changes_between(first - 1, last)
                if marked is not None:
                    raise Unsupported(f"commit {marked} of {path} marks deleted rows in deletion vectors and "
                                      "writes no change-data file (Spark's DELETE does so): Spark derives its "
                                      "change feed from the vectors", lasting=False)
            table = change_files.read(path, first, last)
            if table is None:
                table = delta_rs.read_changes(path, first, last, self.max_change_rows)
            elif table.num_rows > self.max_change_rows:  # read whole already: delta-rs would read it again
                table = None
            if table is None:
                raise Unsupported(f"the change window {first}..{last} of {path} is too large or unreadable",
                                  lasting=False)
            self.input_bytes += table.nbytes
            # no _commit_timestamp, as when the driver reads a window for Spark (pipeline.fixpoints)
            return table.select([c for c in table.column_names if c != "_commit_timestamp"])

        return self._register(("changes", path, first, last), make)

    def relation(self, node: Any) -> Any:
        """A FROM item of the Spark SQL as a DuckDB relation name (see :class:`_Translator`)."""
        from sqlglot import exp

        alias = node.args.get("alias")
        if isinstance(node.this, exp.Anonymous):  # table_changes_by_path('path', first, last)
            a = node.this.expressions
            name = self.changes(a[0].name, int(a[1].name), int(a[2].name))
        elif node.db == "delta":
            version = node.args.get("version")
            if version is not None:
                v = int(version.expression.name)
            elif self.read_version is not None and node.name == self.ctx.target_path:
                v = self.read_version
            else:
                raise Unsupported(f"an unpinned read of {node.name}")
            name = self.snapshot(node.name, v)
        elif node.db == "global_temp" and _FX_TABLE.match(node.name):
            name = node.name
        elif not node.db:  # a CTE of the query (anything else fails DuckDB's binding: Unsupported)
            return node
        else:
            raise Unsupported(f"a read of {node.sql('spark')}")
        return exp.Table(this=exp.to_identifier(name), alias=alias.copy() if alias else None)

    def bind(self, translated: str) -> str:
        """``translated`` (DuckDB SQL) with its key filters' tokens replaced by predicates (see
        :func:`pipeline.fixpoints.bind`), their keys read by DuckDB. Why after the translation, the tokens
        left in as identifiers: the keys differ at every refresh, and a text holding them would miss
        :func:`_parsed`'s kept parse every time (a join's delta over a large table, the one that is key
        filtered, parsed anew at each refresh); the predicates are translated on their own."""
        for token, spec in self.ctx.key_filters:
            if token not in translated:
                continue
            if token not in self.predicates:
                q = self.translate(f"SELECT DISTINCT {spec.key} AS k FROM {spec.held} "
                                   f"WHERE {spec.key} IS NOT NULL LIMIT {key_filter.MAX_KEYS + 1}")
                with self.db.fitted(self.con, self.input_bytes):
                    keys = [r[0] for r in self.con.execute(q).fetchall()]
                self.predicates[token] = f"({self.translate.expression(key_filter.predicate(keys, spec.column))})"
            translated = translated.replace(token, self.predicates[token])
        return translated

    def run(self, sql: str) -> Any:
        for name, spec in self.ctx.fixpoints:
            view = name.split(".", 1)[1]
            outputs = self.translate.outputs(spec.seed)
            if outputs is not None and spec.columns:
                outputs = dict(zip(spec.columns, outputs.values(), strict=False))
            if outputs is not None:
                self.types[name] = outputs
            seed = self._netted(spec, self.bind(self.translate(spec.seed)))
            if spec.step is not None:
                self._loop(view, spec, seed)
                continue
            # a source read stays lazy (scanned where referenced, filters pushed into it); a computed one is
            # evaluated once
            kind = "VIEW" if spec.reads_source() else "TABLE"
            with self.db.fitted(self.con, self.input_bytes):
                self.con.execute(f"CREATE TEMP {kind} {_q(view)} AS {seed}")
        query = self.bind(self.translate.final(sql))
        deferred = self.translate.deferred
        with self.db.fitted(self.con, self.input_bytes):
            if self.input_bytes <= SMALL_INPUT_BYTES:
                # DuckDB's DB-API runs the statement once; a relation binds it first for its schema, then runs
                # it: 285 against 218 ms (median) for an aggregate oracle's deltas, which are large SQL on tiny
                # inputs. Its Arrow output is a copy of the rows, cheap for what a small input gives.
                cursor = self.con.execute(query)
                arrow = getattr(cursor, "to_arrow_table", None) or cursor.fetch_arrow_table  # DuckDB 2, 1
                table, types = arrow(), [str(d[1]) for d in cursor.description]
            else:
                result = self.con.sql(query)
                table, types = result.to_arrow_table(), [str(t) for t in result.types]
        if deferred:
            table = _hashed_columns(table, deferred)
            types = ["BIGINT" if name in deferred else t for name, t in zip(table.column_names, types, strict=True)]
        return _spark_types(table, types)

    @staticmethod
    def _netted(spec: Fixpoint, sql: str) -> str:
        """Rows of ``sql`` named by the fixpoint's columns; weighted: one row per tuple with its summed weight
        (as :func:`pipeline.fixpoints.run` nets them; Spark's sum of the weights is a BIGINT)."""
        cols = [_q(c) for c in spec.columns]
        if cols:
            sql = f"SELECT * FROM ({sql}) AS __s({', '.join(cols)})"
        if not spec.weighted:
            return sql
        keys, w = ", ".join(cols[:-1]), cols[-1]
        return (f"SELECT {keys}, CAST(SUM({w}) AS BIGINT) AS {w} FROM ({sql}) AS __r GROUP BY ALL "
                f"HAVING SUM({w}) <> 0")

    def _loop(self, view: str, spec: Fixpoint, seed: str) -> None:
        """A recursive fixpoint evaluated round by round as :func:`pipeline.fixpoints.run` evaluates it on
        Spark: each round's step reads the previous round's new tuples as :data:`dvm.context.PREV`; a set
        keeps only tuples no round found before, a weighted series stops at its first empty round. The rounds
        are kept apart and unioned at the end, so column types widen across rounds as Spark's union widens
        them (row ids hash the widened type)."""
        from pipeline.fixpoints import LEVEL_LIMIT

        limit = int(self.spark.conf.get(LEVEL_LIMIT, "100")) if self.spark is not None else 100
        step = self._netted(spec, self.bind(self.translate(spec.step or "")))

        def body(rounds: list[str]) -> str:
            if 0 <= limit < len(rounds):  # Spark raises the error the user should see
                raise Unsupported(f"a recursive fixpoint past {limit} rounds", lasting=False)
            return step if spec.weighted else f"SELECT * FROM ({step}) AS __n EXCEPT SELECT * FROM ({_union(rounds)}) AS __seen"

        self._rounds(view, seed if spec.weighted else f"SELECT DISTINCT * FROM ({seed}) AS __d", body, PREV)

    def fresh(self, prefix: str) -> str:
        """A relation name no other relation of this refresh has."""
        self._fresh += 1
        return f"{prefix}_{self._fresh}"

    def recursion(self, columns: list[str], anchor: str, step: str, prev: str) -> str:
        """The rows of a recursive CTE ``anchor UNION ALL step`` (DuckDB SQL; ``step`` reads the previous
        round's rows as ``prev``), as Spark's recursion computes them: rounds until one adds no row, every
        round's rows kept, in the anchor's column types (a round of other types is left to Spark, whose
        union would widen them). Refused well before Spark's level and row limits, where Spark raises the
        error the user should see."""
        conf = (lambda k, d: int(self.spark.conf.get(k, d))) if self.spark is not None else (lambda k, d: int(d))
        levels, max_rows = conf("spark.sql.cteRecursionLevelLimit", "100"), conf("spark.sql.cteRecursionRowLimit",
                                                                                 "1000000")
        named = f" AS __r({', '.join(_q(c) for c in columns)})" if columns else " AS __r"
        anchor, step = self.bind(anchor), self.bind(step)  # run here, inside the query's translation
        name = self.fresh("__trickle_rec")
        types: list[str] = []
        total = [0]

        def done(table: str) -> None:  # every round, the anchor's included
            kinds = [str(t) for t in self.con.sql(f"SELECT * FROM {_q(table)}").types]
            if types and kinds != types:
                raise Unsupported("a recursive step of other column types than its anchor")
            types[:] = kinds
            total[0] += self._rows(table)

        def body(rounds: list[str]) -> str:
            if 0 <= levels and len(rounds) >= levels - 1 or 0 <= max_rows and 2 * total[0] > max_rows:
                raise Unsupported("a recursion near Spark's level or row limit", lasting=False)
            return f"SELECT * FROM ({step}){named}"

        self._rounds(name, f"SELECT * FROM ({anchor}){named}", body, prev, done)
        return name

    def _rounds(self, name: str, first: str, body: Callable[[list[str]], str], prev: str,
                done: Callable[[str], None] | None = None) -> None:
        """Table ``name``: the rows of ``first`` and of every following round until one is empty, each round
        ``body(rounds so far)`` reading the last round as the view ``prev``, and ``done(round)`` called on each
        (both may refuse, see :class:`Unsupported`). Spark's fixpoints and recursions both run so (see the
        callers)."""
        rounds = [f"{name}__round0"]
        self.con.execute(f"CREATE TEMP TABLE {_q(rounds[0])} AS {first}")
        if done is not None:
            done(rounds[0])
        while self._rows(rounds[-1]):
            sql = body(rounds)
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW {_q(prev)} AS SELECT * FROM {_q(rounds[-1])}")
            rounds.append(f"{name}__round{len(rounds)}")
            self.con.execute(f"CREATE TEMP TABLE {_q(rounds[-1])} AS {sql}")
            if done is not None:
                done(rounds[-1])
        self.con.execute(f"CREATE TEMP TABLE {_q(name)} AS {_union(rounds)}")

    def _rows(self, table: str) -> int:
        row = self.con.execute(f"SELECT COUNT(*) FROM {_q(table)}").fetchone()
        return int(row[0]) if row else 0


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _union(tables: list[str]) -> str:
    return " UNION ALL ".join(f"SELECT * FROM {_q(t)}" for t in tables)


def _spark_types(table: Any, duck_types: list[str]) -> Any:
    """DuckDB's result with Spark's types where they differ: a HUGEINT (DuckDB's sum of integers) is the
    BIGINT Spark's sum gives; a TIMESTAMP (DuckDB's date plus interval) is refused unless cast before."""
    import pyarrow as pa

    cols = []
    for i, kind in enumerate(duck_types):
        col = table.column(i)
        if kind == "HUGEINT":
            col = col.cast(pa.int64())
        elif kind.startswith("TIMESTAMP"):
            raise Unsupported(f"a result column of type {kind}")
        elif pa.types.is_large_string(col.type) or pa.types.is_string_view(col.type):
            col = col.cast(pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def collect(spark: Any, ctx: Context, sql: str, read_version: int | None, conf: Any = None,
            max_bytes: int | None = None) -> Any:
    """The delta ``sql`` (rendered against ``ctx``) computed by DuckDB, as Arrow; raises :class:`Unsupported`
    when it must run on Spark (see the module docstring). ``conf``: where settings are read (default: the
    session's). ``max_bytes``: the snapshots' limit instead of :data:`MAX_BYTES` (a FULL reads them whole)."""
    import duckdb

    conf = conf if conf is not None else spark.conf
    limit = max_bytes if max_bytes is not None else int(conf.get(MAX_BYTES, str(1 << 30)))
    engine = LocalEngine(spark, ctx, read_version, int(conf.get(MAX_CHANGE_ROWS, "1000000")), limit,
                         int(conf.get(SPILL_BYTES, str(4 << 30))))
    try:
        return engine.run(sql)
    except RecursionError as e:  # a predicate of thousands of ORs: its tree is deeper than Python recurses
        raise Unsupported("an expression nested too deeply to translate") from e
    except duckdb.Error as e:
        message = str(e).splitlines()[0]
        lasting = "trickle-unsupported: " in message
        raise Unsupported(message.split("trickle-unsupported: ", 1)[-1][:300] if lasting else
                          f"DuckDB: {message[:300]}", lasting=lasting) from e
    finally:
        engine.con.close()


def same_rows(a: Any, b: Any) -> str | None:
    """None when two deltas hold the same rows (a multiset; doubles to 12 significant digits, since the
    engines add them in different orders), else what differs."""
    if sorted(a.column_names) != sorted(b.column_names):
        return f"columns {a.column_names} against {b.column_names}"
    b = b.select(a.column_names)

    def norm(v: Any) -> Any:
        return float(f"{v:.12g}") if isinstance(v, float) else v

    def rows(t: Any) -> list[tuple[Any, ...]]:
        return sorted((tuple(norm(v) for v in r.values()) for r in t.to_pylist()), key=repr)

    ra, rb = rows(a), rows(b)
    if ra == rb:
        return None
    only_a = [r for r in ra if r not in rb][:3]
    only_b = [r for r in rb if r not in ra][:3]
    return f"{len(ra)} rows against {len(rb)}; only in the first: {only_a}; only in the second: {only_b}"
