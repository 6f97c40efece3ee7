"""Small files on any store Spark can write: a local disk, or any Hadoop FileSystem URI (``s3a://``,
``abfss://``, ``gs://``, ``hdfs://``).

The catalog (definitions and refresh history), the run lease and a few runtime state files are small JSON
files that every process reads and writes on the driver, without a Spark job. On a local disk they go
through the OS. Anywhere else they go through Spark's own Hadoop FileSystem over py4j (:class:`HadoopStorage`),
so every store the Spark session is configured for works with the same settings (``spark.hadoop.fs.s3a.*``
and so on), and nothing else (no second client, no second set of credentials) has to be configured.

What must be atomic, and how each store gets it:

* **Replacing a file** (a definition after every refresh): readers must see the old or the new text, never a
  torn one. Local: write a temporary file and ``os.replace`` it. Object stores (S3, GCS, ADLS, ...): a single
  PUT is atomic, an object appears whole on close, so the file is written in place; there is no rename (S3
  has none, and S3A's rename is a copy). HDFS and other file systems: temporary file, then
  ``FileContext.rename(..., OVERWRITE)``, atomic on HDFS.
* **Put-if-absent** (the lease, see :mod:`pipeline.lease`): the create must fail when the file exists, in
  one step, also when two processes race. Local: a hard link naming a finished file, unnamed until then
  (``O_TMPFILE``; a named temporary file where the file system has none), which fails if the name exists
  (:func:`write_whole`). S3: a PUT with ``If-None-Match: *`` (S3A's ``fs.option.create.conditional.overwrite``,
  Hadoop 3.4.2+; S3 answers 412 to the loser). HDFS, GCS and ADLS: ``create(overwrite=false)``, which their
  connectors implement atomically (the name node; a generation precondition; ``If-None-Match``).
* Stream tables, Kafka mirrors and transaction tables are Delta tables: their commits are Delta's
  put-if-absent of the next log entry (Spark's LogStore for the scheme). delta-rs commits local tables
  only: given a store's URI it would need this store's settings a second time, in its own terms, and a
  put-if-absent it gets on S3 only when told the store honours it (see :mod:`connectors.delta_rs`). On S3
  with several writing processes set
  ``spark.delta.logStore.s3a.impl=io.sparktrickle.S3ConditionalLogStore`` (``jars/src``): Delta's default S3
  log store checks-then-writes, atomic within one JVM only; ours writes each entry with ``If-None-Match``.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["Uri", "Storage", "LocalStorage", "HadoopStorage", "local_path", "strip_file_scheme", "is_local",
           "location", "join", "for_uri", "Exists", "write_new", "write_whole", "read_local",
           "clear_interrupted_create", "clear_unplanned_offsets", "uncommitted_batch"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: stores where one PUT replaces an object atomically and rename is a copy: files are written in place
OBJECT_STORES = frozenset({"s3a", "s3", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos", "r2"})


class Exists(Exception):
    """Put-if-absent found the file already there."""


def strip_file_scheme(uri: str | os.PathLike[str]) -> str:
    """``uri`` without its ``file:`` scheme (``file:/x``, ``file:///x`` -> ``/x``); any other URI or path as
    it is. Spark and Delta report local locations as ``file:`` URIs, which Python's file functions do not
    open."""
    s = os.fspath(uri)
    if s.startswith("file:"):
        rest = s[len("file:"):]
        return "/" + rest.lstrip("/") if rest.startswith("//") else rest
    return s


def local_path(uri: str | os.PathLike[str]) -> str | None:
    """The local file system path of ``uri`` (a plain path or a ``file:`` URI), None for any other scheme."""
    s = os.fspath(uri)
    if s.startswith("file:"):
        return strip_file_scheme(s)
    return None if _SCHEME.match(s) else s


def is_local(uri: str | os.PathLike[str]) -> bool:
    return local_path(uri) is not None


class Uri(str):
    """A location on a non-local store, joinable with ``/`` like a :class:`~pathlib.Path` (a ``Path`` would
    turn ``s3a://b/k`` into ``s3a:/b/k``). Code that takes a warehouse or checkpoint folder as a ``Path``
    keeps working for joins and ``str()``; what needs the disk itself goes through :func:`for_uri`."""

    def __truediv__(self, part: str | os.PathLike[str]) -> Uri:
        return Uri(self.rstrip("/") + "/" + os.fspath(part).lstrip("/"))

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    def as_posix(self) -> str:
        return str(self)


def location(value: str | os.PathLike[str]) -> Path | Uri:
    """A warehouse/checkpoint location: a resolved local :class:`Path`, or a :class:`Uri` kept as written."""
    local = local_path(value)
    if local is None:
        return Uri(os.fspath(value))
    return Path(local).expanduser().resolve()


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """``base/part/...`` for a local path or a URI alike."""
    out = os.fspath(base).rstrip("/")
    for p in parts:
        out += "/" + p.strip("/")
    return out


class Storage:
    """Read, write, list and delete small files under one store. Paths are full paths or URIs."""

    def read_text(self, path: str) -> str | None:
        """The file's text, None when it does not exist."""
        raise NotImplementedError

    def write_text(self, path: str, text: str) -> None:
        """Create or atomically replace the file (see the module docstring for how per store)."""
        raise NotImplementedError

    def put_if_absent(self, path: str, text: str) -> None:
        """Create the file with ``text`` unless it exists, in one atomic step; :class:`Exists` if it does."""
        raise NotImplementedError

    def create(self, path: str, text: str) -> None:
        """Write a file under a name nothing else writes (a history record's), appearing whole; written again
        when it exists. Here: :meth:`write_text`, where a store makes a new name no cheaper than a replace."""
        self.write_text(path, text)

    def overwrite(self, path: str, text: str) -> None:
        """Write ``text`` over the file, created when missing, where that is cheaper than a replace; readers
        may see a torn text, so only formats that detect one (see :mod:`pipeline.catalog`'s state slots) use
        it, and the file may keep trailing spaces. Here: :meth:`write_text` (an object appears whole)."""
        self.write_text(path, text)

    def list(self, folder: str) -> list[str]:
        """Names of the files directly in ``folder`` (none when it does not exist)."""
        raise NotImplementedError

    def walk(self, folder: str) -> Iterator[tuple[str, float, int]]:
        """(path relative to ``folder``, modification time in seconds, size) of every file below ``folder``,
        hidden ones included (housekeeping deletes a data file's checksum beside it); none when it is absent."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def delete(self, path: str) -> None:
        """Delete a file if present."""
        raise NotImplementedError

    def delete_tree(self, path: str) -> None:
        """Delete a folder and everything below it, if present."""
        raise NotImplementedError


class LocalStorage(Storage):
    """The local disk, through the OS."""

    def read_text(self, path: str) -> str | None:
        data = read_local(_local(path))
        return None if data is None else data.decode("utf-8")

    def write_text(self, path: str, text: str) -> None:
        p = _local(path)
        os.replace(_finished_temporary(p, text.encode("utf-8")), p)

    def create(self, path: str, text: str) -> None:
        """By :func:`write_whole`: locally one change of the folder instead of a replace's three."""
        try:
            write_whole(_local(path), text.encode("utf-8"))
        except FileExistsError:  # the same record written again
            self.write_text(path, text)

    def overwrite(self, path: str, text: str) -> None:
        """In place: no new inode (a create cost 0.3-0.9 ms on an ext4 beside churning directories, a replace
        0.4 ms more) and no truncate (ext4 flushes a truncated file on close, ``auto_da_alloc``): a shorter
        text is padded with spaces to the file's length."""
        p = _local(path)
        data = text.encode("utf-8")
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o666)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            view = memoryview(data + b" " * (size - len(data)) if size > len(data) else data)
            at = 0
            while at < len(view):
                at += os.pwrite(fd, view[at:], at)
        finally:
            os.close(fd)

    def put_if_absent(self, path: str, text: str) -> None:
        try:
            write_whole(_local(path), text.encode("utf-8"))
        except FileExistsError:
            raise Exists(path) from None

    def list(self, folder: str) -> list[str]:
        try:
            return [e.name for e in os.scandir(_local(folder)) if e.is_file() and not e.name.startswith(".")]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk(self, folder: str) -> Iterator[tuple[str, float, int]]:
        base = _local(folder)
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                full = os.path.join(dirpath, f)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                yield os.path.relpath(full, base).replace(os.sep, "/"), st.st_mtime, st.st_size

    def exists(self, path: str) -> bool:
        return os.path.exists(_local(path))

    def delete(self, path: str) -> None:
        Path(_local(path)).unlink(missing_ok=True)

    def delete_tree(self, path: str) -> None:
        import shutil

        # again when something is left: a file created in a folder while rmtree emptied it makes removing the
        # folder fail, which ignore_errors hides (a streaming query writing its checkpoint as it stops)
        for _ in range(3):
            shutil.rmtree(_local(path), ignore_errors=True)
            if not os.path.lexists(_local(path)):
                return


def write_new(path: str, data: Any, sync: bool = False) -> None:
    """Create the local file ``path`` holding ``data`` (anything with the buffer protocol); FileExistsError when
    it exists. Its folder is made only when the create finds it missing: asking first cost a system call per
    file, and a refresh writes four to six files (data, change data, log entry, history, definition).
    ``sync``: on disk before it is closed (fsync)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        _write_all(fd, data, sync)
    finally:
        os.close(fd)


def read_local(path: str) -> bytes | None:
    """The bytes of the local file ``path``, None when it does not exist. Why not ``open().read()``: Python's
    file object asks the OS nine times for a small file (open, two stats, a terminal check, two seeks, two
    reads, close), this four (open, stat, one read of it all, close), and a refresh reads a few log files of
    its sources and its own table each time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)  # a byte more than its size: a file grown since is read to its end
        if len(data) <= size:
            return data
        parts = [data]
        while chunk := os.read(fd, 1 << 20):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


#: folders where the file system refused an unnamed file (``O_TMPFILE``): :func:`write_whole` names a temporary one
_NO_TMPFILE: set[str] = set()


def write_whole(path: str, data: Any, sync: bool = False) -> None:
    """Create the local file ``path`` holding ``data``, appearing whole or not at all (a reader never sees it
    empty or torn); FileExistsError when it exists, in the same step (a put-if-absent). ``sync``: the file on
    disk before it appears (the folder's entry is the caller's to sync).

    How: the data goes into an unnamed file in the folder (Linux's ``O_TMPFILE``), which a hard link then
    names; where the file system has no unnamed files, into a named temporary file linked the same way and
    then removed. Why not always the latter: it is two more changes of the folder (the temporary name made,
    then removed), and a refresh's commit and history record each paid them (docs/BENCHMARKS.md, "Session
    60")."""
    folder = os.path.dirname(path) or "."
    unnamed = getattr(os, "O_TMPFILE", None)
    if unnamed is not None and folder not in _NO_TMPFILE:
        try:
            fd = os.open(folder, unnamed | os.O_WRONLY, 0o666)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            return write_whole(path, data, sync)
        except OSError:  # EOPNOTSUPP, EISDIR, EINVAL: this file system has no unnamed files
            _NO_TMPFILE.add(folder)
        else:
            try:
                _write_all(fd, data, sync)
                if (fds := _own_fds()) is not None:
                    # linkat(AT_SYMLINK_FOLLOW) of the file's /proc entry; os.link calls plain link() unless
                    # given a folder descriptor, and link() does not follow it
                    os.link(str(fd), path, src_dir_fd=fds, follow_symlinks=True)
                    return
                _NO_TMPFILE.add(folder)  # no /proc to name the file by: named temporary files
            finally:
                os.close(fd)
    temp = _finished_temporary(path, data, sync)
    try:
        os.link(temp, path)  # a hard link fails when the name exists
    finally:
        os.unlink(temp)


def _finished_temporary(path: str, data: Any, sync: bool = False) -> str:
    """A finished, hidden temporary file beside ``path`` holding ``data`` (its folder made when missing, see
    :func:`write_new`), for a rename or a link to name."""
    folder, name = os.path.split(path)
    temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    write_new(temp, data, sync=sync)
    return temp


#: this process's open ``/proc/self/fd`` folder (see :func:`_own_fds`), and whether opening it failed
_FDS: int | None = None
_NO_FDS = False
_FDS_LOCK = threading.Lock()


def _own_fds() -> int | None:
    """A descriptor of this process's ``/proc/self/fd`` folder, opened once (a forked child opens its own)."""
    global _FDS, _NO_FDS
    if _FDS is None and not _NO_FDS:
        with _FDS_LOCK:  # two threads' first files: one descriptor
            if _FDS is None and not _NO_FDS:
                try:
                    _FDS = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                except OSError:
                    _NO_FDS = True
    return _FDS


def _forked() -> None:
    global _FDS
    if _FDS is not None:
        with contextlib.suppress(OSError):
            os.close(_FDS)
    _FDS = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _write_all(fd: int, data: Any, sync: bool) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]
    if sync:
        os.fsync(fd)


def _local(path: str) -> str:
    p = local_path(path)
    if p is None:
        raise ValueError(f"not a local path: {path}")
    return p


T = TypeVar("T")
_REREADS = 10  # reads of an object replaced while being read, over about 1.3 s, before giving up


def _missing(e: Exception) -> bool:
    return "FileNotFoundException" in str(e)


def read_whole(fs: Any, hpath: Any, read: Callable[[Any], T]) -> T | None:
    """``read`` of a Hadoop file's open stream; None when the file is missing. Why it may read twice: an object
    store opens with a HEAD and reads with a GET pinned to the HEAD's ETag, so an object replaced in between (a
    lease renewed, a state slot or ``_last_checkpoint`` rewritten by another process) fails the GET with
    RemoteFileChangedException, and one deleted in between with FileNotFoundException. Every replacement is a
    whole object, so reading again gives a whole, newer one; a deleted one is missing."""
    for attempt in range(_REREADS):
        try:
            stream = fs.open(hpath)
        except Exception as e:
            if _missing(e):
                return None
            raise
        try:
            return read(stream)
        except Exception as e:
            if _missing(e):
                return None
            if "RemoteFileChangedException" not in str(e) or attempt == _REREADS - 1:
                raise
            time.sleep(min(0.01 * 2 ** attempt, 0.25))  # let a writer that keeps replacing it finish its PUT
        finally:
            stream.close()
    raise AssertionError("unreachable")


class HadoopStorage(Storage):
    """Any Hadoop FileSystem URI, through the Spark session's JVM and Hadoop configuration (so the store's
    settings are Spark's: ``spark.hadoop.fs.<scheme>.*``)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._jvm = spark._jvm

    def _fs(self, path: str) -> tuple[Any, Any]:
        hpath = self._jvm.org.apache.hadoop.fs.Path(path)
        return hpath.getFileSystem(self.spark._jsc.hadoopConfiguration()), hpath

    @staticmethod
    def _missing(e: Exception) -> bool:
        return _missing(e)

    def read_text(self, path: str) -> str | None:
        fs, hpath = self._fs(path)
        return read_whole(fs, hpath, lambda stream: self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))

    def _write(self, out: Any, text: str) -> None:
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()  # an object store PUTs here: the object appears whole, or not at all

    def write_text(self, path: str, text: str) -> None:
        fs, hpath = self._fs(path)
        if fs.getScheme().lower() in OBJECT_STORES:
            self._write(fs.create(hpath, True), text)
            return
        tmp = self._jvm.org.apache.hadoop.fs.Path(hpath.getParent(), f".{hpath.getName()}.{uuid.uuid4().hex}.tmp")
        self._write(fs.create(tmp, False), text)
        fc = self._jvm.org.apache.hadoop.fs.FileContext.getFileContext(fs.getUri(),
                                                                       self.spark._jsc.hadoopConfiguration())
        overwrite = self.spark._gateway.new_array(self._jvm.org.apache.hadoop.fs.Options.Rename, 1)
        overwrite[0] = self._jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
        fc.rename(tmp, hpath, overwrite)

    def put_if_absent(self, path: str, text: str) -> None:
        fs, hpath = self._fs(path)
        builder = fs.createFile(hpath).overwrite(False)
        if fs.getScheme().lower() in ("s3a", "s3"):
            # If-None-Match: * on the PUT: the store, not a HEAD before it, decides who wins a race
            builder = builder.must("fs.option.create.conditional.overwrite", True)
        try:
            self._write(builder.build(), text)
        except Exception as e:
            s = str(e)
            if any(m in s for m in ("FileAlreadyExistsException", "412", "PreconditionFailed")):
                raise Exists(path) from None
            raise

    def list(self, folder: str) -> list[str]:
        fs, hpath = self._fs(folder)
        try:
            statuses = fs.listStatus(hpath)
        except Exception as e:
            if self._missing(e):
                return []
            raise
        return [s.getPath().getName() for s in statuses
                if s.isFile() and not s.getPath().getName().startswith(".")]

    def walk(self, folder: str) -> Iterator[tuple[str, float, int]]:
        fs, hpath = self._fs(folder)
        if not fs.exists(hpath):
            return
        prefix = len(str(fs.makeQualified(hpath).toString()).rstrip("/")) + 1
        it = fs.listFiles(hpath, True)
        while it.hasNext():
            s = it.next()
            yield str(s.getPath().toString())[prefix:], s.getModificationTime() / 1000.0, s.getLen()

    def exists(self, path: str) -> bool:
        fs, hpath = self._fs(path)
        return bool(fs.exists(hpath))

    def delete(self, path: str) -> None:
        fs, hpath = self._fs(path)
        with contextlib.suppress(Exception):
            fs.delete(hpath, False)

    def delete_tree(self, path: str) -> None:
        fs, hpath = self._fs(path)
        with contextlib.suppress(Exception):
            fs.delete(hpath, True)


def for_uri(uri: str | os.PathLike[str], spark: Any = None) -> Storage:
    """The storage for ``uri``: the OS for local paths, else the Hadoop FileSystem of ``spark`` (default: the
    active Spark session; a URI store needs one, since its settings are Spark's)."""
    if is_local(uri):
        return LocalStorage()
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError(f"{uri} is on a Hadoop file system: start a Spark session configured for it first")
    return HadoopStorage(spark)


def clear_unplanned_offsets(storage: Storage, checkpoint: str) -> list[str]:
    """Delete what a streaming query's ``checkpoint/offsets`` holds while it holds no batch (no file named by a
    number), and return the names deleted. Why: a process killed while Spark wrote ``offsets/0`` leaves
    ``.0.<uuid>.tmp`` and its checksum there, and Spark 4.1 then refuses every start of the query on that
    checkpoint ("STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ... offsets should be empty on batch 0"): a Kafka
    source stayed DOWN for good after a kill -9 (tests/test_crash.py). Only ``offsets/`` is touched: the rest
    holds what batch 0 must still see, such as a Kafka source's initial offsets (``sources/0/0``, where a
    ``latest`` query starts)."""
    folder = join(checkpoint, "offsets")
    names = [rel for rel, _, _ in storage.walk(folder) if "/" not in rel]
    if not names or any(n.isdigit() for n in names):
        return []
    for n in names:
        storage.delete(join(folder, n))
    return names


#: a Delta log entry that makes a folder a table: a commit (``00000000000000000000.json``) or a checkpoint
_LOG_ENTRY = re.compile(r"^\d{20}\.(json|checkpoint(\.\d+\.\d+)?(\.[0-9a-f-]+)?\.parquet)$")


def _holds_commit(log_names: Iterable[str]) -> bool:
    """Whether a ``_delta_log`` listing (file names) holds a commit or a checkpoint, i.e. names a Delta table
    at some version. Temporary files, checksums and ``_staged_commits`` of a first commit that never landed
    do not."""
    return any(_LOG_ENTRY.match(n) for n in log_names)


def clear_interrupted_create(storage: Storage, folder: str) -> bool:
    """Delete ``folder`` when all it holds is the ``_delta_log`` of a table whose first commit never landed;
    True when it did. Why: a process killed inside ``CREATE TABLE`` leaves ``_delta_log/`` (empty,
    or with the commit's temporary file), and Delta then refuses every later ``CREATE TABLE`` there
    ("DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION") and every registration of it by name
    ("DELTA_CREATE_EXTERNAL_TABLE_WITHOUT_TXN_LOG"): a Kafka mirror stayed uncreatable for good after a
    kill -9 (tests/test_crash.py). Nothing committed is lost: without a commit no reader sees any row. A folder
    holding anything outside ``_delta_log`` (data a user put there) is left alone, and Delta's error stands."""
    if not storage.exists(folder) or not storage.exists(join(folder, "_delta_log")):
        return False
    files = [rel for rel, _, _ in storage.walk(folder)]
    if any(not f.startswith("_delta_log/") for f in files) or _holds_commit(f.rsplit("/", 1)[-1] for f in files):
        return False
    storage.delete_tree(folder)
    return True


def uncommitted_batch(storage: Storage, checkpoint: str) -> int | None:
    """The micro-batch a streaming query's checkpoint planned (``offsets/<n>``) but never committed
    (no ``commits/<n>``): the batch Spark re-runs, with the same offsets, when the query starts. None when
    every planned batch committed, or nothing was planned."""
    def numbered(folder: str) -> set[int]:
        return {int(rel) for rel, _, _ in storage.walk(join(checkpoint, folder)) if rel.isdigit()}

    planned = numbered("offsets")
    if not planned:
        return None
    last = max(planned)
    return None if last in numbered("commits") else last
