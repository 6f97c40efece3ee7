"""The contract every aggregate call fulfils, and the default strategy: group rescan.

A stream table whose top operator is an aggregate stores each group's state in hidden columns
``__agg<i>_*`` (``i`` = the call's ordinal). :mod:`dvm.plan` maintains them in five steps, each asking
every call for its piece of SQL:

1. ``delta_pre(partition)`` — layers of extra per-row columns over the child's delta rows (e.g. a window
   pivot);
2. ``delta_terms()`` — per-group summaries of the weighted delta (``__w`` = +n / -n), named ``__d<i>_*``;
3. the old state is read back from the stream table as ``__o<i>_*`` (NULL for a new group);
4. ``merge_steps()`` / ``merged_state()`` — the new state from old state and delta (intermediate columns
   ``__m<i>_*`` in successive layers, then the new ``__agg<i>_*``);
5. ``needs_rescan()`` — a condition (over all of the above) under which the merged state cannot be trusted;
   those groups are recomputed from the child's post-state (a *rescan*) instead.

``state()`` says how a full computation fills the state columns (FULL refreshes and rescans), ``output()``
turns state into the aggregate's value and ``sql()`` is the call itself, evaluated directly by Spark over a
group's rows (nested aggregates, and the label in ``explain``).

The base class is the **group rescan** strategy: the state is the aggregate's value itself and any change to
a group rescans it. Subclasses in :mod:`.algebraic`, :mod:`.moments` and :mod:`.extremum` do better.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from sqlglot import exp

from dvm.dialect import SPARK

Cols = list[tuple[str, str]]


def spark(e: exp.Expression) -> str:
    return e.sql(SPARK)


@dataclass(eq=False)
class AggCall:
    """One aggregate call of a GROUP BY (or global aggregate).

    ``func`` is the canonical name (``count_star``, ``sum``, ``stddev_samp``, ``collect_list``, ...), ``args``
    the translated argument expressions (over internal column names), ``options`` function-specific
    settings (a separator, ORDER BY keys, literal parameters).
    """

    name: str  # internal output column
    func: str
    args: list[exp.Expression]
    ordinal: int  # position among the aggregate's calls; names the hidden state columns
    distinct: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    _rendered: dict[int, tuple[exp.Expression, str]] = field(default_factory=dict, init=False, repr=False,
                                                             compare=False)

    #: strategy family shown by ``explain``: algebraic | semi-algebraic | group rescan
    family: ClassVar[str] = "group rescan"

    # --- naming helpers ---

    @property
    def arg(self) -> exp.Expression | None:
        return self.args[0] if self.args else None

    def a(self, i: int = 0) -> str:
        """Argument ``i`` as Spark SQL; rendered once per argument expression (every refresh renders the
        delta rules again, and sqlglot's generator cost each call 30 us)."""
        arg = self.args[i]
        kept = self._rendered.get(i)
        if kept is None or kept[0] is not arg:
            kept = self._rendered[i] = (arg, spark(arg))
        return kept[1]

    @property
    def p(self) -> str:
        return f"__agg{self.ordinal}"

    @property
    def d(self) -> str:
        return f"__d{self.ordinal}"

    @property
    def o(self) -> str:
        return f"__o{self.ordinal}"

    @property
    def m(self) -> str:
        return f"__m{self.ordinal}"

    # --- the call itself ---

    def sql(self) -> str:
        """The (deterministic) value over a group's rows, evaluated by Spark."""
        return self.options["sql"]

    def rule(self) -> str:
        """One line for ``explain``: how this call is maintained at the top of a stream table."""
        why = self.options.get("why", "no algebraic rule")
        return f"group rescan: every group it touches is recomputed from the source ({why})"

    # --- stored state ---

    def state_pre(self) -> Cols:
        """Per-row columns computed over the child before ``state()`` aggregates it (and before
        ``delta_pre``): a long argument expression named once instead of repeated in every state sum."""
        return []

    def state(self) -> Cols:
        return [(f"{self.p}_v", self.sql())]

    def output(self) -> str:
        return f"{self.p}_v"

    def delta_pre(self, partition: str) -> list[Cols]:
        """Layers of columns added to each delta row before it is summarised (a layer may use the columns
        of the layers before it); ``partition`` is the window clause body grouping rows like the aggregate
        (``PARTITION BY <group exprs>``, empty for one group)."""
        return []

    def delta_terms(self) -> Cols:
        return []

    def merge_steps(self) -> list[Cols]:
        return []

    def merged_state(self) -> Cols:
        # never trusted (every touched group is rescanned) but the column must exist in the kept branch
        return [(f"{self.p}_v", f"{self.o}_v")]

    def needs_rescan(self) -> str | None:
        return "TRUE"
