"""Running sqlglot's recursive parser on a stack of known depth: a thread of its own under a raised
recursion limit, so whether a deeply nested query parses does not depend on the caller's stack."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

#: The recursion limit sqlglot's parser runs under, on a thread of its own (:func:`on_own_stack`). Its parser
#: recurses 8-35 frames per level of nesting (parentheses, CASE in CASE, function calls, subqueries), so
#: under the caller's limit whether a deeply nested query parses would depend on the caller's stack (a
#: query accepted by create_stream_table from a shallow stack could fail every refresh from a deeper one)
#: and on the sqlglot release (one more frame a level tipped 40 levels of CASE over the default 1000). A
#: fresh thread starts at the same depth from everywhere, and this limit leaves the parser several times
#: what :data:`dvm.parser.MAX_NESTING` levels need.
PARSER_FRAMES = 6000

#: The C stack of that thread: Python frames that re-enter the interpreter from C (constructors, dunder
#: dispatch) take C stack too; 6000 of them fit with a wide margin (only touched pages are committed).
PARSER_STACK_BYTES = 512 * 1024 * 1024

_T = TypeVar("_T")
_deep = threading.Lock()


def on_own_stack(call: Callable[[], _T]) -> _T:
    """``call()`` on a thread of its own, under a recursion limit of :data:`PARSER_FRAMES` (see there for
    why). One at a time: the limit is process-wide, raised for the call and restored after it (a raised
    limit only lets other threads recurse further, never less)."""
    out: list[_T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(e)

    with _deep:
        limit = sys.getrecursionlimit()
        size = threading.stack_size()
        try:
            threading.stack_size(PARSER_STACK_BYTES)
            worker = threading.Thread(target=run, name="trickle-parse", daemon=True)
        finally:
            threading.stack_size(size)
        sys.setrecursionlimit(max(limit, PARSER_FRAMES))
        try:
            worker.start()
            worker.join()
        finally:
            sys.setrecursionlimit(limit)
    if error:
        raise error[0]
    return out[0]
