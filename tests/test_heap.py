"""``pipeline.heap.settle``: the collector tuned once per process after a refresh (heap frozen, young threshold
raised, a process's own thresholds kept), unless the conf says not to; garbage made after it still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline import heap


class _Node:
    """A reference cycle's member (as a sqlglot node and its parent)."""

    other: Any = None


@pytest.fixture
def untuned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(heap, "_settled", False)
    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(*heap.DEFAULT_THRESHOLDS)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.unit
def test_tuned_once_unless_turned_off(untuned: None) -> None:
    assert not heap.settle({heap.TUNE: "false"}) and not heap.settle({heap.TUNE: " FALSE "})
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == heap.DEFAULT_THRESHOLDS
    kept = _Node()
    assert heap.settle({}) and gc.get_freeze_count() > 0 and gc.get_threshold() == heap.THRESHOLDS
    assert not heap.settle({})  # once per process
    assert gc.is_tracked(kept)  # frozen, not dropped
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None  # a cycle made after the freeze is collected


@pytest.mark.unit
def test_own_thresholds_kept(untuned: None) -> None:
    gc.set_threshold(1000, 5, 5)
    assert heap.settle({}) and gc.get_threshold() == (1000, 5, 5)
