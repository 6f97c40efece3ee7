"""A refresh's bookkeeping on the background worker (pipeline/bookkeeping.py): the catalog never reads behind it,
a failure is written again by the next reader, and the worker never waits for itself. No Spark."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pipeline import bookkeeping
from pipeline.catalog import Catalog, StreamTableDef


def _table(name: str) -> StreamTableDef:
    return StreamTableDef(name=name, query="SELECT 1", schedule=None, refresh_mode="DIFFERENTIAL",
                          path=f"/nowhere/{name}", sources={}, names=["x"], types=["int"], layout="keyed")


def test_catalog_reads_wait_for_the_queued_state_and_record(tmp_path: Any) -> None:
    cat = Catalog(tmp_path / "trickle")
    cat.put(_table("t"))
    gate = threading.Event()

    def job() -> None:
        gate.wait(5)
        fresh = cat.get("t")  # on the worker: does not wait for itself
        fresh.frontier, fresh.last_refresh_id = {"src": 7}, "r1"
        cat.put(fresh)
        cat.append_history("t", {"refresh_id": "r1", "started_at": 1000.0, "action": "DIFFERENTIAL"})

    cat.later("t", job)
    threading.Timer(0.2, gate.set).start()
    t0 = time.perf_counter()
    d = cat.get("t")  # waits for the job, which waits for the gate
    assert time.perf_counter() - t0 >= 0.15
    assert d.frontier == {"src": 7} and d.last_refresh_id == "r1"
    assert [h["refresh_id"] for h in cat.history("t")] == ["r1"]
    # a second catalog of the same root waits too (the key is the definition file)
    other = Catalog(tmp_path / "trickle")
    gate.clear()
    cat.later("t", lambda: (gate.wait(5), cat.append_history("t", {"refresh_id": "r2", "started_at": 1001.0})))
    threading.Timer(0.1, gate.set).start()
    assert [h["refresh_id"] for h in other.history("t")] == ["r2", "r1"]


def test_a_failed_job_is_written_again_by_the_next_reader(tmp_path: Any) -> None:
    cat = Catalog(tmp_path / "trickle")
    cat.put(_table("t"))
    calls: list[str] = []

    def flaky() -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise OSError("No space left on device")
        cat.append_history("t", {"refresh_id": "r1", "started_at": 1000.0})

    cat.later("t", flaky)
    assert [h["refresh_id"] for h in cat.history("t")] == ["r1"]  # run again here, in this thread
    assert len(calls) == 2 and calls[0].startswith("trickle-bookkeeping")
    assert calls[1] == threading.current_thread().name
    cat.settle()  # nothing left queued

    def broken() -> None:
        raise OSError("No space left on device")

    cat.later("t", broken)
    with pytest.raises(OSError, match="No space left"):
        cat.get("t")


def test_other_tables_do_not_wait(tmp_path: Any) -> None:
    cat = Catalog(tmp_path / "trickle")
    cat.put(_table("slow"))
    cat.put(_table("quick"))
    gate = threading.Event()
    cat.later("slow", lambda: gate.wait(5))
    t0 = time.perf_counter()
    assert cat.get("quick").name == "quick"
    assert time.perf_counter() - t0 < 2
    gate.set()
    bookkeeping.settle()
    assert cat.get("slow").name == "slow"


def test_a_forked_child_does_not_wait_for_its_parents_worker(tmp_path: Any) -> None:
    """A child forked while a job is queued has no worker to finish it: its catalog calls go on at once."""
    import os

    cat = Catalog(tmp_path / "trickle")
    cat.put(_table("t"))
    gate = threading.Event()
    cat.later("t", lambda: gate.wait(5))
    pid = os.fork()
    if pid == 0:  # the child: exits 0 when its get returned quickly
        t0 = time.perf_counter()
        cat.get("t")
        os._exit(0 if time.perf_counter() - t0 < 2 else 1)
    _, status = os.waitpid(pid, 0)
    gate.set()
    bookkeeping.settle()
    assert os.WEXITSTATUS(status) == 0


def test_a_failed_job_is_not_lost_when_another_is_queued_for_its_table(tmp_path: Any) -> None:
    """A job queued for a table whose last job failed on the worker first writes the failed one, here."""
    cat = Catalog(tmp_path / "trickle")
    cat.put(_table("t"))
    calls: list[str] = []

    def flaky() -> None:
        calls.append("flaky")
        if len(calls) == 1:
            raise OSError("No space left on device")
        cat.append_history("t", {"refresh_id": "r1", "started_at": 1000.0})

    cat.later("t", flaky)
    deadline = time.time() + 5
    while calls != ["flaky"] and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the failed future is done
    cat.later("t", lambda: cat.append_history("t", {"refresh_id": "r2", "started_at": 1001.0}))
    assert [h["refresh_id"] for h in cat.history("t")] == ["r2", "r1"]
    assert calls == ["flaky", "flaky"]
