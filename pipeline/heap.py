"""The Python heap of a refreshing process, kept out of the garbage collector's full passes.

Why: once Spark, sqlglot, DuckDB, delta-rs and Arrow are imported, a refreshing process tracks ~150K Python
objects (modules, functions, types, their dicts) that never become garbage. A delta's sqlglot trees are
reference cycles (every node points to its parent) that only the collector frees; those a young-generation
pass finds still in use are promoted, and pile up until a full pass, which scans the whole heap: 30-100 ms
every dozen small refreshes on the benchmark machine, turning a 50 ms refresh into 130-220 ms
(docs/BENCHMARKS.md, "Session 47"). So after the process's first refresh, everything then alive is
collected once and frozen (``gc.freeze``): later full passes scan only what was made since.

The cost: an object alive at that moment that becomes cyclic garbage later is never freed, a one-time,
bounded amount (the garbage of that moment is collected first). ``trickle.refresh.freezeHeap=false``
(read at each refresh until it froze) leaves the collector alone, e.g. in a notebook that itself holds large
cyclic structures it drops later.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

#: Spark conf: freeze the heap after the process's first refresh (default true; see the module docstring)
FREEZE = "trickle.refresh.freezeHeap"

_frozen = False
_lock = threading.Lock()


def settle(conf: Any) -> bool:
    """Collect and freeze the heap, once per process, unless ``conf`` turns it off; whether it froze now."""
    global _frozen
    if _frozen or str(conf.get(FREEZE, "true")).strip().lower() == "false":
        return False
    with _lock:
        if _frozen:
            return False
        gc.collect()
        gc.freeze()
        _frozen = True
    return True
