"""The Python garbage collector of a refreshing process: the import-time heap frozen, young garbage left to die.

Why: a refresh makes thousands of sqlglot nodes (the delta's SQL parsed, translated, generated), and every
node points to its parent, so they are reference cycles that only the collector frees. With Python's default
thresholds (700, 10, 10) a young pass runs every 700 allocations, in the middle of each refresh: the trees
then in use are promoted, die in the oldest generation, and pile up until a full pass scans it, with the
~100-150K objects that importing Spark, sqlglot, DuckDB, delta-rs and Arrow leaves behind (modules,
functions, types, none ever garbage): pauses of 20-100 ms that turned 50 ms refreshes into 100-220 ms ones
(docs/BENCHMARKS.md, "Session 47").

So after the process's first refresh, once: everything then alive is collected and frozen (``gc.freeze``:
never scanned again), and the young generation's threshold goes to 50,000 allocations (20 young passes per
middle one), so most of a refresh's trees are garbage by the time a pass looks at them and go in a young
pass. Freezing alone makes full passes smaller but more frequent (frozen objects no longer count towards
the quarter of long-lived ones that starts one): a floor run with the heap frozen still collected for 1.1 s,
15 full passes; with the threshold raised too, 390 ms, one full pass. A process that set its own thresholds
keeps them.

The cost: up to 50,000 objects of garbage wait for a pass (a few MB), and an object alive at the freeze that
becomes cyclic garbage later is never freed (a one-time, bounded amount: the garbage of that moment is
collected first). ``trickle.refresh.tuneGarbageCollector=false`` (read at each refresh until applied) leaves
the collector alone, e.g. in a notebook that itself builds and drops large cyclic structures.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

#: Spark conf: tune the collector after the process's first refresh (default true; see the module docstring)
TUNE = "trickle.refresh.tuneGarbageCollector"
#: Python's own thresholds: only these are replaced
DEFAULT_THRESHOLDS = (700, 10, 10)
THRESHOLDS = (50_000, 20, 10)

_settled = False
_lock = threading.Lock()


def settle(conf: Any) -> bool:
    """Collect, freeze and set the thresholds, once per process, unless ``conf`` turns it off; whether it did
    so now."""
    global _settled
    if _settled or str(conf.get(TUNE, "true")).strip().lower() == "false":
        return False
    with _lock:
        if _settled:
            return False
        gc.collect()
        gc.freeze()
        if gc.get_threshold() == DEFAULT_THRESHOLDS:
            gc.set_threshold(*THRESHOLDS)
        _settled = True
    return True
