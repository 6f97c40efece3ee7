"""``pipeline.heap.settle``: the heap frozen once per process after a refresh, unless the conf says not to, and
garbage made after it still collected."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from pipeline import heap


class _Node:
    """A reference cycle's member (as a sqlglot node and its parent)."""

    other: Any = None


@pytest.mark.unit
def test_frozen_once_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_frozen", False)
    gc.unfreeze()
    try:
        assert not heap.settle({heap.FREEZE: "false"}) and gc.get_freeze_count() == 0
        assert not heap.settle({heap.FREEZE: " FALSE "}) and gc.get_freeze_count() == 0
        kept = _Node()
        assert heap.settle({}) and gc.get_freeze_count() > 0
        assert not heap.settle({})  # once per process
        assert gc.is_tracked(kept)  # frozen, not dropped
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None  # a cycle made after the freeze is collected
    finally:
        gc.unfreeze()
