"""Where does a refresh's time go? Spark jobs, time inside them, rows read, Delta commits.

A refresh on a small machine is mostly fixed costs: each Spark job pays scheduling and task launch, and
each query pays analysis and planning (resolving Delta snapshots, time travel) on the driver before any
job runs. ``measure`` runs a function under its own job group and reads Spark's status store afterwards,
so the benchmark can print "N jobs, X ms inside jobs, the rest on the driver" per refresh.
"""

from __future__ import annotations

import os
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


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int | str) -> float:
    """utime + stime of one process (all its threads) from /proc/<pid>/stat, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # fields 14 and 15 of proc(5)


def cpu_seconds(spark: Any) -> float:
    """CPU-seconds (user + system) used so far by this Python process plus the Spark driver JVM, from
    /proc/<pid>/stat (Linux only). Wall time on a shared 2-core machine hides what a refresh costs: a FULL
    refresh keeps every core busy, a small differential one mostly waits on the driver; the difference of
    two calls is what the code between them cost. In local mode the executors are threads of the driver
    JVM, so they are counted; on a cluster the executors' CPU is not."""
    jvm_pid = getattr(spark, "_trickle_jvm_pid", None)
    if jvm_pid is None:
        jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # noqa: SLF001
        spark._trickle_jvm_pid = jvm_pid  # noqa: SLF001 - one py4j round trip per session, not per call
    return _proc_cpu("self") + (_proc_cpu(jvm_pid) if jvm_pid != os.getpid() else 0.0)
