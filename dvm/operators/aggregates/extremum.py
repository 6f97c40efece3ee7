"""Semi-algebraic aggregates: merge insertions cheaply, rescan a group only when a deletion may matter.

Rule for MIN / MAX: new = LEAST / GREATEST(old, inserted values); a group is rescanned from the source
only when a deleted value is <= the stored MIN (>= the stored MAX), i.e. the extremum may have left.

Rule for BIT_AND / BIT_OR: new = old AND / OR the inserted values; a group is rescanned only when a
deleted value could change a bit that no inserted value pins: for BIT_OR a bit set in a deleted value and
in no inserted one, for BIT_AND a bit cleared in a deleted value and in no inserted one.

Deterministic rules for Spark's order-dependent aggregates (Spark leaves the choice among several rows
undefined, so these are answers Spark itself may give, and FULL and DIFFERENTIAL refreshes agree):

* FIRST(x) / LAST(x) / ANY_VALUE(x), with or without IGNORE NULLS, are maintained as MIN(x): the least
  non-NULL value of the group (NULL when it has none). Equal to Spark's result whenever the value is
  determined by the group (e.g. a column functionally dependent on the key), which is what they are for.
* MIN_BY(x, y) / MAX_BY(x, y) are the extremum of the struct (y, x) over the rows where y is not NULL, then
  its x: ties on y go to the least x (MIN_BY) / the greatest x (MAX_BY), NULL x ordering first.
  The struct (y, x) is what the table stores, but it is never compared itself: it is picked by a key
  (y, x IS NOT NULL, x), which orders a NULL x first without a NULL field ever deciding a comparison. Spark
  orders a struct's NULL fields first, DuckDB last; over the key both engines agree (the local engine,
  :mod:`pipeline.local_engine`, computes these deltas too), and Spark's answer is the struct's own extremum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dvm.operators.aggregates.base import AggCall, Cols


@dataclass(eq=False)
class Extremum(AggCall):
    """MIN / MAX of ``value()``; FIRST / LAST / ANY_VALUE (as MIN) and MIN_BY / MAX_BY (over a struct)."""

    family: ClassVar[str] = "semi-algebraic"

    @property
    def pick(self) -> str:
        return "MAX" if self.func in ("max", "max_by") else "MIN"

    @property
    def by(self) -> bool:
        return self.func in ("min_by", "max_by")

    def value(self) -> str:
        if self.by:
            x, y = self.a(0), self.a(1)
            return f"CASE WHEN ({y}) IS NOT NULL THEN named_struct('o', {y}, 'v', {x}) END"
        return self.a()

    def key(self) -> str:
        """MIN_BY / MAX_BY: the order of :meth:`value`, NULL where it is NULL (see the module docstring)."""
        x, y = self.a(0), self.a(1)
        return f"CASE WHEN ({y}) IS NOT NULL THEN named_struct('o', {y}, 'n', ({x}) IS NOT NULL, 'v', {x}) END"

    @staticmethod
    def stored_key(ext: str) -> str:
        """:meth:`key` of a stored (or merged) struct ``ext``."""
        return f"named_struct('o', ({ext}).o, 'n', ({ext}).v IS NOT NULL, 'v', ({ext}).v)"

    def extremum(self, when: str = "") -> str:
        """The aggregate of :meth:`value` over the rows where ``when`` holds (all rows if empty)."""
        v, k = self.value(), self.key() if self.by else ""
        if when:
            v, k = f"CASE WHEN {when} THEN {v} END", f"CASE WHEN {when} THEN {k} END"
        return f"{self.pick}_BY({v}, {k})" if self.by else f"{self.pick}({v})"

    def unwrap(self, ext: str) -> str:
        return f"({ext}).v" if self.by else ext

    def sql(self) -> str:
        if self.func in ("min", "max"):
            return f"{self.pick}({self.a()})"
        return self.unwrap(self.extremum())

    def rule(self) -> str:
        what = {"first": "FIRST", "last": "LAST", "any_value": "ANY_VALUE"}.get(self.func)
        extra = ""
        if what:
            extra = f"; {what} is kept deterministic as the least non-NULL value"
        elif self.func in ("min_by", "max_by"):
            extra = f"; {self.func.upper()} is the {self.pick} of (ordering, value): ties go to the " \
                    f"{'greatest' if self.pick == 'MAX' else 'least'} value"
        return (f"semi-algebraic: {'GREATEST' if self.pick == 'MAX' else 'LEAST'} with inserted values, group "
                f"rescan only when a deleted value reaches the stored {self.pick}{extra}")

    def state(self) -> Cols:
        return [(f"{self.p}_ext", self.extremum())]

    def output(self) -> str:
        return self.unwrap(f"{self.p}_ext")

    def delta_terms(self) -> Cols:
        return [(f"{self.d}_ins", self.extremum("__w > 0")), (f"{self.d}_del", self.extremum("__w < 0"))]

    def _ordered(self, a: str, cmp: str, b: str) -> str:
        return f"{self.stored_key(a)} {cmp} {self.stored_key(b)}" if self.by else f"{a} {cmp} {b}"

    def merged_state(self) -> Cols:
        p, d, o = self.p, self.d, self.o
        cmp = ">=" if self.pick == "MAX" else "<="
        best = (f"CASE WHEN {self._ordered(f'{o}_ext', cmp, f'{d}_ins')} THEN {o}_ext ELSE {d}_ins END" if self.by
                else f"{'GREATEST' if self.pick == 'MAX' else 'LEAST'}({o}_ext, {d}_ins)")
        return [(f"{p}_ext", f"CASE WHEN {o}_ext IS NULL THEN {d}_ins WHEN {d}_ins IS NULL THEN {o}_ext "
                             f"ELSE {best} END")]

    def needs_rescan(self) -> str | None:
        d, o = self.d, self.o
        cmp = ">=" if self.pick == "MAX" else "<="
        return f"({d}_del IS NOT NULL AND {o}_ext IS NOT NULL AND {self._ordered(f'{d}_del', cmp, f'{o}_ext')})"


@dataclass(eq=False)
class BitAndOr(AggCall):
    family: ClassVar[str] = "semi-algebraic"

    @property
    def op(self) -> str:
        return "&" if self.func == "bit_and" else "|"

    def sql(self) -> str:
        return f"{self.func.upper()}({self.a()})"

    def rule(self) -> str:
        return (f"semi-algebraic: {self.op} with inserted values; group rescan only when a deleted value "
                "could change a bit no inserted value pins")

    def state(self) -> Cols:
        a = self.a()
        return [(f"{self.p}_v", self.sql()), (f"{self.p}_nn", f"COUNT({a})")]

    def output(self) -> str:
        return f"CASE WHEN {self.p}_nn > 0 THEN {self.p}_v END"

    def delta_terms(self) -> Cols:
        a, f = self.a(), self.func.upper()
        return [(f"{self.d}_ins", f"{f}(CASE WHEN __w > 0 THEN {a} END)"),
                (f"{self.d}_del", f"{f}(CASE WHEN __w < 0 THEN {a} END)"),
                (f"{self.d}_nn", f"SUM(CASE WHEN ({a}) IS NULL THEN 0 ELSE __w END)")]

    def merged_state(self) -> Cols:
        p, d, o = self.p, self.d, self.o
        nn = f"COALESCE({o}_nn, 0) + COALESCE({d}_nn, 0)"
        return [(f"{p}_v", f"CASE WHEN {nn} <= 0 THEN NULL WHEN {o}_v IS NULL THEN {d}_ins "
                           f"WHEN {d}_ins IS NULL THEN {o}_v ELSE {o}_v {self.op} {d}_ins END"),
                (f"{p}_nn", nn)]

    def needs_rescan(self) -> str | None:
        d = self.d
        ins, dele = f"{d}_ins", f"{d}_del"
        zero = f"({dele} ^ {dele})"  # 0 in the argument's own type
        if self.func == "bit_or":
            lost = f"({dele} & ~COALESCE({ins}, {zero}))"
        else:
            lost = f"(~{dele} & COALESCE({ins}, ~{zero}))"
        return f"({dele} IS NOT NULL AND {lost} <> 0)"
