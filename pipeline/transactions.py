"""Transactions stay whole across topics: the versions of a stream table's Kafka mirrors that a refresh may
read together, so that every source transaction is in all of them or in none.

The rule. A PostgreSQL transaction T that writes ``orders`` and ``lines`` reaches two topics and two
mirrors, committed by separate ingestion queries at separate moments. With Debezium's transaction metadata
each event carries ``(T, data_collection_order)`` (its 1-based place among T's events of that table), each
mirror commit records the highest such order per transaction it applied (its *marks*,
:func:`connectors.kafka_mirror.transaction_marks`), and T's END record in the transaction topic says how
many events T wrote per table (:mod:`connectors.kafka_transactions`). Then, for a stream table reading
mirrors M1..Mk of one connector:

- T is *whole* at versions (v1..vk) when its END is known and, for every Mi whose table T wrote, the marks
  of Mi in (pre_i, v_i] reach T's count for that table;
- the *cut* starts at each mirror's latest version and, while some mirror Mi holds events of a T that is not
  whole, moves Mi back to just before its first version holding T's events; this repeats until nothing
  moves (each step only lowers a version, never below the frontier, so it ends). The result holds whole
  transactions only, and is the latest such cut reachable this way.

Why the frontier is a safe floor: every earlier refresh read a cut, so no transaction is split across it;
the events of a transaction still *pending* (END known, not yet whole) are all after the frontier. The
stream table carries its pending ENDs in its refresh commit (with the transaction mirror's version read
up to) instead of re-reading the whole transaction topic each time: see :class:`TxnState`.

Events without transaction metadata (the initial snapshot, a connector without it) have no marks and are
never held back. What a user gives up without metadata: each topic is applied as it arrives, so a join of
two tables can show one side of a transaction for a refresh or two (README, "Transactions").

Pure: commit metadata in, versions out (tests/test_transactions.py); :mod:`pipeline.refresh` reads the logs
and pins the versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MirrorWindow:
    """One mirror's unread commits: its table (``public.orders``, as the END records name it), the version the
    stream table reflects (``pre``, None before its first refresh), its latest version, and the marks of
    each version in (pre, latest]: ``[(transaction id, highest data_collection_order), ...]``."""

    collection: str
    pre: int | None
    latest: int
    marks: Mapping[int, list[tuple[str, int]]] = field(default_factory=dict)


@dataclass
class TxnState:
    """What a stream table remembers between refreshes: the transaction mirror's version read through and
    the ENDs of its tables' transactions that were not whole yet (id -> table -> count)."""

    version: int | None = None
    pending: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"version": self.version, "pending": self.pending}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> TxnState:
        if not doc:
            return cls()
        return cls(doc.get("version"), {str(t): {str(c): int(n) for c, n in counts.items()}
                                        for t, counts in (doc.get("pending") or {}).items()})


def relevant(ends: list[tuple[str, dict[str, int]]], collections: set[str]) -> dict[str, dict[str, int]]:
    """The ENDs that wrote to one of ``collections``, restricted to them."""
    out: dict[str, dict[str, int]] = {}
    for txn, counts in ends:
        mine = {c: n for c, n in counts.items() if c in collections and n > 0}
        if mine:
            out[txn] = mine
    return out


def cut(mirrors: Mapping[str, MirrorWindow], pending: Mapping[str, Mapping[str, int]]
        ) -> tuple[dict[str, int], set[str]]:
    """The versions to read (mirror key -> version) and the pending transactions they hold whole (see the
    module docstring). ``pending`` are the known ENDs not yet whole, restricted to these mirrors' tables."""
    floor = {k: (m.pre if m.pre is not None else -1) for k, m in mirrors.items()}
    at = {k: m.latest for k, m in mirrors.items()}
    by_collection: dict[str, list[str]] = {}
    for k, m in mirrors.items():
        by_collection.setdefault(m.collection, []).append(k)

    seen: dict[str, dict[str, list[tuple[int, int]]]] = {k: {} for k in mirrors}  # mirror -> txn -> (v, order)
    for k, m in mirrors.items():
        for v, marks in m.marks.items():
            if v > floor[k]:
                for t, dco in marks:
                    seen[k].setdefault(t, []).append((v, dco))

    def reached(k: str, txn: str) -> int:
        return max((dco for v, dco in seen[k].get(txn, ()) if v <= at[k]), default=0)

    def whole(txn: str) -> bool:
        counts = pending.get(txn)
        if counts is None:
            return False  # its END is not read yet
        return all(any(reached(k, txn) >= n for k in by_collection.get(c, ())) or c not in by_collection
                   for c, n in counts.items())

    moved = True
    while moved:
        moved = False
        for k, m in mirrors.items():
            for v in sorted(v for v in m.marks if floor[k] < v <= at[k]):
                split = next((t for t, _ in m.marks[v] if not whole(t)), None)
                if split is not None:
                    at[k] = max(floor[k], v - 1)
                    moved = True
                    break
    done = {t for t in pending if whole(t)}
    return {k: max(at[k], 0) for k in mirrors}, done
