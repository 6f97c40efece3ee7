"""Scan: a source table.

Delta rule: ΔScan = the Change Data Feed of the window, netted per tuple. ``insert`` and
``update_postimage`` rows weigh +1, ``delete`` and ``update_preimage`` rows -1. A source that is a stream
table needs nothing more: it stores plain rows (one physical row per copy, see :mod:`dvm.plan`), so each row
of its snapshot or change feed is one copy, and its hidden columns are simply not selected. Consolidating on the
*used* columns only makes an update that touches no column the query reads vanish right here, and collapses
update chains inside one window into -first +last.
"""

from __future__ import annotations

from dataclasses import dataclass

from dvm.context import Context, State, quote
from dvm.operators.base import Node, W, consolidate


@dataclass(eq=False)
class Scan(Node):
    source: str
    #: (source column, internal name); empty when the query reads no column (e.g. COUNT(*))
    columns: list[tuple[str, str]]
    #: internal name of the constant column emitted when ``columns`` is empty
    placeholder: str

    def __post_init__(self) -> None:
        self.children = []
        self.cols = [i for _, i in self.columns] or [self.placeholder]

    def sources(self) -> set[str]:
        return {self.source}

    def _select_list(self) -> str:
        if not self.columns:
            return f"1 AS {quote(self.placeholder)}"
        return ", ".join(f"{quote(s)} AS {quote(i)}" for s, i in self.columns)

    def snapshot(self, ctx: Context, state: State) -> str:
        return f"SELECT {self._select_list()} FROM {ctx.table(self.source, state)}"

    def delta(self, ctx: Context) -> str | None:
        if not ctx.changed(self.source):
            return None
        sign = "CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 ELSE -1 END"
        return consolidate(
            f"SELECT {self._select_list()}, CAST({sign} AS BIGINT) AS {W} FROM {ctx.changes(self.source)}",
            self.cols,
        )

    def label(self) -> str:
        used = ", ".join(s for s, _ in self.columns) or "-"
        return f"Scan {self.source} [{used}]"
