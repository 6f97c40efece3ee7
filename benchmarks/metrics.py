"""Where does a refresh's time go? Spark jobs, time inside them, rows read, Delta commits.

A refresh on a small machine is mostly fixed costs: each Spark job pays scheduling and task launch, and
each query pays analysis and planning (resolving Delta snapshots, time travel) on the driver before any
job runs. ``measure`` runs a function under its own job group and reads Spark's status store afterwards,
so the benchmark can print "N jobs, X ms inside jobs, the rest on the driver" per refresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measured:
    """One measured call: its result, wall time, and what Spark did meanwhile."""

    result: Any
    wall_s: float
    jobs: int
    job_s: float  # union of the jobs' [submission, completion] intervals: time with a job running
    rows_read: int  # input records of every stage of those jobs (files and local checkpoints read)

    @property
    def driver_s(self) -> float:
        """Wall time with no job running: query analysis, planning, Delta log work, Python."""
        return max(0.0, self.wall_s - self.job_s)


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def measure(spark: Any, fn: Callable[[], Any]) -> Measured:
    """Run ``fn`` in a fresh job group and return its result with the Spark work it caused."""
    sc = spark.sparkContext
    group = f"bench-{time.time_ns()}"
    sc.setJobGroup(group, group)
    t = time.perf_counter()
    try:
        out = fn()
    finally:
        wall = time.perf_counter() - t
        sc.setJobGroup("", "")
    ids = list(sc.statusTracker().getJobIdsForGroup(group))
    jsc = sc._jsc.sc()  # noqa: SLF001 - the status store has the timings the Python tracker lacks
    jsc.listenerBus().waitUntilEmpty()  # the store is filled by the listener bus, asynchronously
    store = jsc.statusStore()
    intervals: list[tuple[int, int]] = []
    rows = 0
    for jid in ids:
        job = store.job(jid)
        sub, done = job.submissionTime(), job.completionTime()
        if sub.isDefined() and done.isDefined():
            intervals.append((sub.get().getTime(), done.get().getTime()))
        stages = job.stageIds()
        for i in range(stages.size()):
            try:
                rows += store.lastStageAttempt(stages.apply(i)).inputRecords()
            except Exception:  # noqa: BLE001 - a skipped stage (reused shuffle) has no attempt
                pass
    return Measured(out, wall, len(ids), _union_length(intervals) / 1000.0, rows)
