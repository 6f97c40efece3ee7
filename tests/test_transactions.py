"""The transactional cut (pipeline/transactions.py), pure: which mirror versions a refresh may read together so
that every source transaction is in all of them or in none."""

from __future__ import annotations

import random

import pytest

from pipeline.transactions import MirrorWindow, TxnState, cut, relevant

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit


def test_a_transaction_split_across_topics_waits_until_both_sides_are_in() -> None:
    # T1 wrote 1 order and 2 lines; the lines mirror has only the first line at version 3
    orders = MirrorWindow("public.orders", pre=1, latest=2, marks={2: [("T1", 1)]})
    lines = MirrorWindow("public.lines", pre=1, latest=3, marks={2: [("T0", 1)], 3: [("T1", 1)]})
    pending = {"T0": {"public.lines": 1}, "T1": {"public.orders": 1, "public.lines": 2}}
    versions, done = cut({"o": orders, "l": lines}, pending)
    assert versions == {"o": 1, "l": 2} and done == {"T0"}
    lines = MirrorWindow("public.lines", pre=1, latest=4, marks={2: [("T0", 1)], 3: [("T1", 1)], 4: [("T1", 2)]})
    versions, done = cut({"o": orders, "l": lines}, pending)
    assert versions == {"o": 2, "l": 4} and done == {"T0", "T1"}


def test_an_end_not_read_yet_holds_its_transaction_back_and_what_came_after_it() -> None:
    orders = MirrorWindow("public.orders", pre=0, latest=3, marks={1: [("T1", 1)], 2: [("T2", 1)], 3: [("T3", 1)]})
    pending = {"T1": {"public.orders": 1}, "T3": {"public.orders": 1}}  # T2's END is not in yet
    versions, done = cut({"o": orders}, pending)
    assert versions == {"o": 1} and done == {"T1"}


def test_moving_one_mirror_back_moves_the_other_back_too() -> None:
    # T5 (orders + lines) is whole; T6 wrote orders and lines, but its line is not in yet; the orders mirror
    # committed T5 and T6 in one version, so the cut must leave out T5 too, on both sides
    orders = MirrorWindow("public.orders", pre=0, latest=1, marks={1: [("T5", 1), ("T6", 1)]})
    lines = MirrorWindow("public.lines", pre=0, latest=1, marks={1: [("T5", 1)]})
    pending = {"T5": {"public.orders": 1, "public.lines": 1}, "T6": {"public.orders": 1, "public.lines": 1}}
    versions, done = cut({"o": orders, "l": lines}, pending)
    assert versions == {"o": 0, "l": 0} and done == set()


def test_events_without_metadata_are_never_held_back() -> None:
    orders = MirrorWindow("public.orders", pre=None, latest=5, marks={})
    assert cut({"o": orders}, {}) == ({"o": 5}, set())


def test_relevant_keeps_only_the_tables_read() -> None:
    ends = [("T1", {"public.orders": 1, "public.audit": 4}), ("T2", {"public.audit": 1})]
    assert relevant(ends, {"public.orders", "public.lines"}) == {"T1": {"public.orders": 1}}
    state = TxnState(7, {"T1": {"public.orders": 1}})
    assert TxnState.from_json(state.as_json()) == state


def test_random_interleavings_never_show_a_transaction_in_part() -> None:
    """Random transactions over three tables, committed to three mirrors in random batch sizes and ENDs read
    late: every cut holds each transaction whole or not at all, and the cut reaches the end once all is in."""
    rng = random.Random(7)
    for _ in range(200):
        tables = ["a", "b", "c"]
        txns = []
        for i in range(rng.randrange(1, 12)):
            txns.append((f"T{i}", {t: rng.randrange(1, 4) for t in tables if rng.random() < 0.6} or {"a": 1}))
        streams = {t: [(txn, k + 1) for txn, counts in txns for k in range(counts.get(t, 0))] for t in tables}
        marks: dict[str, dict[int, list[tuple[str, int]]]] = {}
        for t, events in streams.items():
            marks[t], v, i = {}, 0, 0
            while i < len(events):
                n = rng.randrange(1, 4)
                v += 1
                top: dict[str, int] = {}
                for txn, dco in events[i:i + n]:
                    top[txn] = max(top.get(txn, 0), dco)
                marks[t][v] = list(top.items())
                i += n
        ends_known = {txn: counts for txn, counts in txns if rng.random() < 0.8}
        for t in tables:
            latest = rng.randrange(0, len(marks[t]) + 1)
            window = {t: MirrorWindow(t, None, latest, {v: m for v, m in marks[t].items() if v <= latest})
                      for t in tables}
            got, _ = cut(window, {x: {c: n for c, n in counts.items()} for x, counts in ends_known.items()})
            for txn, counts in txns:
                held = {c: max((d for v, ms in marks[c].items() if v <= got[c] for x, d in ms if x == txn), default=0)
                        for c in counts}
                parts = {c: held[c] == counts[c] for c in counts}
                some = any(held[c] > 0 for c in counts)
                assert not some or all(parts.values()), (txn, counts, held, got)
        full = {t: MirrorWindow(t, None, len(marks[t]), marks[t]) for t in tables}
        got, done = cut(full, {x: dict(c) for x, c in txns})
        assert got == {t: len(marks[t]) for t in tables} and done == {x for x, _ in txns}
