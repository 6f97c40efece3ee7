"""Reads tables with deletion vectors on the driver as Spark reads them: the rows a file's vector marks are left out.

Why: spark-trickle's own commits mark a plain-rows stream table's deleted rows in deletion vectors
(:mod:`connectors.deletion_vectors`), and users' tables get them from Spark's DELETE, UPDATE and MERGE with
``delta.enableDeletionVectors``. delta-rs (1.6) refuses such tables in its pyarrow readers
(``to_pyarrow_dataset``, ``to_pyarrow_table``), so every delta reading one ran on Spark (about a second more
than DuckDB on the driver, see :mod:`pipeline.local_engine`). delta-rs' own ``scan()`` applies vectors but
returns a one-shot stream into which no filter can be pushed after the fact; the snapshots a delta reads must
stay lazily scanned datasets (DuckDB pushes its filters and key filters into them).

How: delta-rs still replays the log at the pinned version, lists the live files with their statistics (the
same fragments its ``to_pyarrow_dataset`` builds) and decodes every file's vector (``deletion_vectors()``:
storage types ``u``, ``i`` and ``p`` alike, see the Delta protocol, "Deletion Vector Format"); the dataset
(:func:`connectors.delta_rs.dataset`) reads a file with a vector whole, in file order, drops the marked
positions, and only then applies the scan's filter. Files without a vector are scanned as before. Statistics
of a file with a vector describe its physical rows (a superset of the live ones), so skipping files by them
stays right.

Change feeds: a commit that marks rows (an ``add`` or ``remove`` of data with a vector) describes its change
only through the difference of two vectors unless it also carries change-data (``cdc``) files, which readers
use instead. spark-trickle's commits and Spark's UPDATE and MERGE write them; Spark's DELETE does not, and a
window holding such a commit is left to Spark (:meth:`connectors.delta_log.DeltaLog.marked_without_changes_between`). (delta-rs 1.6.6's ``load_cdf`` derives such
a change from the two vectors, and matched ``table_changes`` on the windows tried, but that path is recent in
delta-rs and failed on a partitioned table; it is not relied on here.)
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

FEATURE = "deletionVectors"


def enabled(protocol: dict[str, Any] | None) -> bool:
    """Whether the ``protocol`` action lists the deletion vectors reader feature (files may carry vectors)."""
    return protocol is not None and FEATURE in (protocol.get("readerFeatures") or ())


def table_enabled(table: Any) -> bool:
    """:func:`enabled` for a table delta-rs opened."""
    return FEATURE in (table.protocol().reader_features or ())


def deleted_positions(table: Any) -> dict[str, np.ndarray]:
    """The marked row positions of every live data file with a vector in a table delta-rs opened, by the file's
    absolute local path, ascending. delta-rs decodes the vectors; a selection vector shorter than its file
    keeps the rows past its end (the protocol's reading)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    vectors = pa.table(table.deletion_vectors())
    keeps = [chunk[i].values for chunk in vectors.column("selection_vector").chunks for i in range(len(chunk))]
    out: dict[str, np.ndarray] = {}
    for uri, keep in zip(vectors.column("filepath").to_pylist(), keeps, strict=True):
        kept = pc.fill_null(keep, True).to_numpy(zero_copy_only=False).astype(bool)
        out[local_file(uri)] = np.flatnonzero(~kept).astype(np.int64)
    return out


def local_file(uri: str) -> str:
    """The absolute local path of a ``file:`` URI (or a plain path), percent-decoded."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"a data file outside the local file system: {uri}")
    return os.path.normpath(unquote(parsed.path) if parsed.scheme else uri)


def fragments(table: Any, root: str) -> tuple[list[Any], Any, Any, Any]:
    """The fragments, schema, format and file system of the table's live files, as delta-rs'
    ``to_pyarrow_dataset`` builds them (each file's partition values and statistics as its partition
    expression, so that a filter skips files), built here for every table: that method refuses tables with
    vectors, and its statistics can skip files that hold matching rows (:func:`_misleading_statistics`)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    schema = pa.schema(table.schema().to_arrow())
    misleading = _misleading_statistics(table, schema)
    stated = pa.schema([f for f in schema if f.name not in misleading])
    filesystem = local_filesystem(root)
    file_format = pads.ParquetFileFormat(default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
    made = [file_format.make_fragment(file, filesystem=filesystem, partition_expression=expression)
            for file, expression in table._table.dataset_partitions(stated, None)]
    return made, schema, file_format, filesystem


def _misleading_statistics(table: Any, schema: Any) -> set[str]:
    """The top-level columns whose Delta statistics, as delta-rs (1.6) turns them into a file's pyarrow
    guarantee, would skip files holding matching rows; their statistics are left out of every file's guarantee.

    Why: for a file whose statistics give a column's null count but no minimum or maximum, delta-rs writes
    ``(c >= null OR is_null(c))``, from which pyarrow concludes the column is all NULL there; where the null
    count is missing too it writes ``c >= null``, from which pyarrow concludes nothing matches, not even
    ``c IS NULL``. Spark writes the first shape for BOOLEAN and BINARY columns (it keeps no minimum for them) in
    every file holding both NULLs and values (for a string column of that shape, pyarrow's ``c == 'x'`` skipped a
    file holding 'x'; a Spark BOOLEAN filtered through DuckDB was not seen to); the second for every file written
    before ``ALTER TABLE ADD COLUMNS`` (the column is absent from its statistics), so ``WHERE added IS NULL``
    read none of them (tests/test_local_engine.py fails on it without this). A file without statistics at all
    gets no guarantee and is kept, and a column that is NULL in every row of a file gets ``is_null(c)``, which
    is right."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(table.get_add_actions(flatten=True))
    names = set(actions.column_names)
    if not len(actions) or "num_records" not in names:
        return set()
    records = actions.column("num_records")
    stated = pc.is_valid(records)
    out = set()
    for field in schema:
        leaves = [n[len("null_count."):] for n in names
                  if n == f"null_count.{field.name}" or n.startswith(f"null_count.{field.name}.")]
        for leaf in leaves:
            nulls = actions.column(f"null_count.{leaf}")
            valued = pc.less(nulls, records)  # null where the null count is missing
            bounded = [pc.is_valid(actions.column(f"{side}.{leaf}")) if f"{side}.{leaf}" in names
                       else pa.repeat(False, len(actions)) for side in ("min", "max")]
            fine = pc.or_kleene(pc.invert(valued), pc.and_(*bounded))
            if pc.any(pc.and_(stated, pc.invert(pc.fill_null(fine, False)))).as_py():
                out.add(field.name)
                break
    return out


def local_filesystem(root: str) -> Any:
    """Arrow's own file system for the files of the local table at ``root`` (paths relative to it, as the log
    names them, percent-decoded as delta-rs hands them over). Why not delta-rs' default: it reads through a
    file system implemented in Python (``PyFileSystem`` over ``DeltaStorageHandler``), so Arrow's I/O threads
    take the GIL for every read, and a scan started by a caller holding the GIL can deadlock: DuckDB opens a
    dataset's reader (``Scanner.to_reader``, which keeps the GIL) and waits on the scan's lock while an I/O
    thread holding it waits for the GIL. A TPC-H refresh hung so for good (session 51); Arrow's own file
    system reads without Python, and faster."""
    import pyarrow.fs as pafs

    return pafs.SubTreeFileSystem(os.path.abspath(root), pafs.LocalFileSystem())
