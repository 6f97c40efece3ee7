"""TopK: ``ORDER BY ... LIMIT n [OFFSET m]`` (also ``OFFSET m`` alone, and PostgreSQL's ``FETCH FIRST n ROWS
ONLY``): the rows at positions m+1 .. m+n of the child in the given order.

Delta rule, nested (TopK in a subquery, a CTE, a subquery predicate): recompute both snapshots,

    ΔTopK = TopK(child_post) − TopK(child_pre)     (consolidated; nothing when no source moved)

which costs two sort-limits of the child (Spark runs each as a bounded heap, one pass). At the top of a stream
table :mod:`dvm.plan` does better: the stored table already *is* TopK(child_pre), so a refresh computes only
TopK(child_post) and merges the difference with the stored rows — no pre snapshot, and the table always holds
exactly the rows of the new top (``min(n, rows − m)`` of them).

Ties. Which of two rows tied at the boundary makes the top is up to Spark, and with the nested rule the pre
snapshot must be recomputed exactly as it was stored. Every column of the child is therefore appended to the
ORDER BY as a tie-breaker (ascending, NULLS FIRST; map-typed columns skipped): the top is one of the answers
the query allows, always the same one for the same input, and rows equal in every column are
interchangeable. A plain ``spark.sql(query)`` may pick other tied rows: compare with a tie-free ORDER BY.

LIMIT without ORDER BY picks arbitrary rows and is rejected by the builder; ``FETCH ... WITH TIES`` too (Spark
has no such clause).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.dialect import SPARK
from dvm.operators.base import Node, W, consolidate, union_all


@dataclass(eq=False)
class TopK(Node):
    child: Node
    #: sort keys over the child's columns, as written
    keys: list[exp.Ordered]
    limit: int | None  # None: OFFSET without LIMIT
    offset: int = 0
    #: the child's columns usable as tie-breakers (not map-typed)
    tie_cols: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.children = [self.child]
        self.cols = list(self.child.cols)

    def order_sql(self) -> str:
        keys = [k.sql(SPARK) for k in self.keys]
        present = {k.this.sql(SPARK) for k in self.keys}
        keys += [f"{quote(c)} ASC NULLS FIRST" for c in self.tie_cols if quote(c) not in present]
        return ", ".join(keys)

    def _bounds(self) -> str:
        out = f" LIMIT {self.limit}" if self.limit is not None else ""
        return out + (f" OFFSET {self.offset}" if self.offset else "")

    def snapshot(self, ctx: Context, state: State) -> str:
        return f"SELECT * FROM ({self.child.snapshot(ctx, state)}) ORDER BY {self.order_sql()}{self._bounds()}"

    def delta(self, ctx: Context) -> str | None:
        if not self.changed(ctx):
            return None
        parts = [f"SELECT *, CAST({sign} AS BIGINT) AS {W} FROM ({self.snapshot(ctx, state)})"  # type: ignore[arg-type]
                 for state, sign in (("post", 1), ("pre", -1))]
        return consolidate(union_all(parts), self.cols)  # type: ignore[arg-type]

    def strategy(self) -> str:
        return "TopK recompute of both snapshots when a source changed (tie-broken on every column)"

    def label(self) -> str:
        where = (f" LIMIT {self.limit}" if self.limit is not None else "") + (f" OFFSET {self.offset}" if self.offset else "")
        return f"TopK ORDER BY {', '.join(k.sql(SPARK) for k in self.keys)}{where}"
