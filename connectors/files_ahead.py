"""New local files created ahead of their writers, on a worker thread, while a refresh waits on its delta.

A refresh that commits creates four to six new files after its delta: the data file, the change-data file or
the deletion vector, the log entry's temporary file, the history record and the definition's temporary file.
Creating a file costs 0.1-0.4 ms of kernel time on this cold path (0.17 ms median, 0.9 ms a refresh of the
floor benchmark's aggregate, docs/BENCHMARKS.md), the size of what is written hardly matters, and all of it
sat between the delta and the commit. Meanwhile the delta leaves a core idle: DuckDB runs a small delta on
one thread and releases the GIL, as does a Spark job's wait on py4j.

So a writer asks for a new file by its folder and the shape of its name (:func:`create`), and gets one the
worker made earlier when there is one, else creates it then. Which files to make ahead is learnt, not
configured: a refresh makes ahead the files its table's previous refresh asked for (:class:`Scope`), so a
table's first refresh, or one that takes another commit path, simply creates its files itself. Files made
ahead and not taken are deleted when the refresh ends (on the worker: nothing waits for it). A process that
dies in between leaves them empty: hidden temporary files, or data files no log entry names, which VACUUM
removes as it removes any failed write's.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar

#: a new file's folder, and its name before and after a fresh UUID
Shape = tuple[str, str, str]

_SCOPE: ContextVar[Scope | None] = ContextVar("trickle_files_ahead", default=None)
_WORKER: ThreadPoolExecutor | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trickle-files-ahead")
        return _WORKER


def open_new(path: str) -> int:
    """A file descriptor of the new file ``path`` (open for writing); FileExistsError when it exists. Its folder
    is made only when the create finds it missing: asking first cost a system call per file."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


def create(folder: str, prefix: str, suffix: str) -> tuple[str, int]:
    """A new empty file in ``folder`` named ``prefix`` + a fresh UUID + ``suffix``, and a descriptor open for
    writing it (the caller writes and closes it). Made ahead when the refresh's scope has one of this shape."""
    shape = (os.path.normpath(folder), prefix, suffix)
    scope = _SCOPE.get()
    if scope is not None:
        scope.asked.append(shape)
        if (made := scope.take(shape)) is not None:
            return made
    path = os.path.join(shape[0], f"{prefix}{uuid.uuid4()}{suffix}")
    return path, open_new(path)


def name_uuid(path: str, prefix: str, suffix: str) -> uuid.UUID:
    """The UUID in the name of a file :func:`create` made with ``prefix`` and ``suffix``."""
    return uuid.UUID(os.path.basename(path)[len(prefix):len(os.path.basename(path)) - len(suffix)])


class Scope:
    """The files one refresh made ahead and the shapes it asked :func:`create` for (see the module docstring)."""

    def __init__(self) -> None:
        self.asked: list[Shape] = []
        self.wanted: list[Shape] = []
        self._made: dict[Shape, list[tuple[str, int]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def ahead(self, shapes: list[Shape]) -> None:
        """Make files of ``shapes`` on the worker thread (one per entry; errors are left to the writer's own
        create)."""
        if shapes:
            _worker().submit(self._make, list(shapes))

    def _make(self, shapes: list[Shape]) -> None:
        for folder, prefix, suffix in shapes:
            path = os.path.join(folder, f"{prefix}{uuid.uuid4()}{suffix}")
            try:
                fd = open_new(path)
            except OSError:
                continue
            with self._lock:
                if not self._closed:
                    self._made.setdefault((folder, prefix, suffix), []).append((path, fd))
                    continue
            _discard([(path, fd)])

    def take(self, shape: Shape) -> tuple[str, int] | None:
        with self._lock:
            made = self._made.get(shape)
            return made.pop() if made else None

    def close(self) -> None:
        """Delete the files made and not taken (on the worker thread)."""
        with self._lock:
            self._closed = True
            left = [f for files in self._made.values() for f in files]
            self._made.clear()
        if left:
            _worker().submit(_discard, left)


def settled() -> None:
    """Return once the worker finished what it was given (files made, unused ones deleted)."""
    _worker().submit(lambda: None).result()


def _discard(files: list[tuple[str, int]]) -> None:
    for path, fd in files:
        os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def want(shapes: list[Shape]) -> None:
    """Files of ``shapes`` to make ahead for the current scope, once its long wait starts (see :func:`waiting`)."""
    if (s := _SCOPE.get()) is not None:
        s.wanted = list(shapes)


def waiting() -> None:
    """Called by a delta engine right before it blocks without the GIL (DuckDB's query, a Spark job's collect):
    the worker makes the wanted files then. Why not sooner: each file's create hands the GIL to the worker and
    back, which cost the Python work beside it (planning, rendering) 0.4 ms a refresh."""
    if (s := _SCOPE.get()) is not None and s.wanted:
        s.ahead(s.wanted)
        s.wanted = []


@contextmanager
def scope() -> Iterator[Scope]:
    """Inside the block, :func:`create` takes files made ahead by the returned scope (see :meth:`Scope.ahead`);
    the ones not taken are deleted when it ends."""
    s = Scope()
    token = _SCOPE.set(s)
    try:
        yield s
    finally:
        _SCOPE.reset(token)
        s.close()
