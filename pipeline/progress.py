"""A progress bar on stderr for long CLI refreshes (a FULL refresh, an initial population).

A small thread polls Spark's status tracker (``sc.statusTracker()``) while the command runs and draws the
active stages' task counts: ``[#########...........] 45% 18/40 tasks (2 stages) 12.3s``. It appears only
after :data:`DELAY_S` (a quick refresh shows nothing) and only on a terminal (or with ``--progress``), and
it erases itself when done, so the command's own output stays clean. Tasks of stages not yet submitted
are unknown, so the bar follows the stages in flight, not the whole refresh.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: seconds before the bar appears, and between two redraws
DELAY_S = 1.0
POLL_S = 0.25
WIDTH = 30


def render(stages: Iterable[tuple[int, int, int]], elapsed_s: float, width: int = WIDTH) -> str:
    """One line from ``(tasks, completed, active)`` per active stage."""
    stages = list(stages)
    total = sum(s[0] for s in stages)
    done = sum(s[1] for s in stages)
    running = sum(s[2] for s in stages)
    if total <= 0:
        return f"[{'.' * width}] waiting for Spark tasks {elapsed_s:.1f}s"
    frac = min(1.0, done / total)
    filled = int(round(frac * width))
    plural = "s" if len(stages) != 1 else ""
    return (f"[{'#' * filled}{'.' * (width - filled)}] {frac:4.0%} {done}/{total} tasks, {running} running "
            f"({len(stages)} stage{plural}) {elapsed_s:.1f}s")


def active_stages(spark: Any) -> list[tuple[int, int, int]]:
    """``(tasks, completed, active)`` of each active stage, from Spark's status tracker (no job)."""
    tracker = spark.sparkContext.statusTracker()
    out = []
    for sid in tracker.getActiveStageIds():
        info = tracker.getStageInfo(sid)
        if info is not None:
            out.append((int(info.numTasks), int(info.numCompletedTasks), int(info.numActiveTasks)))
    return out


def wanted(force: bool, stream: TextIO | None = None) -> bool:
    stream = sys.stderr if stream is None else stream
    return force or bool(getattr(stream, "isatty", lambda: False)())


@contextmanager
def progress(spark: Any, label: str, enabled: bool, stream: TextIO | None = None,
             delay_s: float = DELAY_S) -> Iterator[list[str]]:
    """Draw the bar while the ``with`` body runs; yields the list of lines drawn (for tests)."""
    drawn: list[str] = []
    if not enabled:
        yield drawn
        return
    out = sys.stderr if stream is None else stream
    stop = threading.Event()
    started = time.monotonic()

    def loop() -> None:
        if stop.wait(delay_s):
            return
        while not stop.is_set():
            try:
                line = f"{label} {render(active_stages(spark), time.monotonic() - started)}"
            except Exception:  # noqa: BLE001 - Spark stopping; the bar is decoration
                return
            drawn.append(line)
            out.write("\r\x1b[2K" + line)
            out.flush()
            stop.wait(POLL_S)

    t = threading.Thread(target=loop, name="trickle-progress", daemon=True)
    t.start()
    try:
        yield drawn
    finally:
        stop.set()
        t.join()
        if drawn:
            out.write("\r\x1b[2K")
            out.flush()
