"""Algebraic aggregates: the state is a set of sums, and a delta adds to it.

Rule: for every group, new state = old state + the weighted sums of the delta rows (``SUM(__w * f(x))``);
no source is read again, whatever was deleted. A group disappears when its ``__cnt`` reaches 0.

| call | state (hidden columns) | value |
|---|---|---|
| COUNT(*) | the group's ``__cnt`` | ``__cnt`` |
| COUNT(x) (also COUNT(x, y), COUNT_IF(b), COUNT(*) FILTER, rewritten to COUNT(x)) | ``_nn`` non-NULL count | ``_nn`` |
| SUM(x) | ``_sum``, ``_nn`` | ``_sum`` if ``_nn > 0`` |
| AVG(x) | ``_sum``, ``_nn`` | ``_sum / _nn`` |
| BOOL_AND / EVERY, BOOL_OR / SOME / ANY | ``_nn``, ``_t`` count of TRUE | ``_t = _nn`` / ``_t > 0`` if ``_nn > 0`` |
| BIT_XOR(x) | ``_x`` XOR of the values, ``_nn`` | ``_x`` if ``_nn > 0`` |

BIT_XOR is its own inverse: deleting a value XORs it in again, so the delta's contribution is the XOR of the
values whose weight is odd (a value inserted twice cancels). SUM keeps the argument's own type, so integer
and DECIMAL sums are exact; a DOUBLE sum drifts by rounding as values come and go (relative 1e-16 of the
largest magnitudes seen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dvm.operators.aggregates.base import AggCall, Cols


def _add(o: str, d: str) -> str:
    """Old + delta where either may be NULL (a new group; a delta without non-NULL values)."""
    return f"CASE WHEN {o} IS NULL THEN {d} WHEN {d} IS NULL THEN {o} ELSE {o} + {d} END"


def _nn_delta(a: str) -> str:
    return f"SUM(CASE WHEN ({a}) IS NULL THEN 0 ELSE __w END)"


@dataclass(eq=False)
class CountStar(AggCall):
    family: ClassVar[str] = "algebraic"

    def sql(self) -> str:
        return "COUNT(*)"

    def rule(self) -> str:
        return "algebraic: the group's row count __cnt"

    def state(self) -> Cols:
        return []

    def output(self) -> str:
        return "__cnt"

    def merged_state(self) -> Cols:
        return []

    def needs_rescan(self) -> str | None:
        return None


@dataclass(eq=False)
class Count(AggCall):
    family: ClassVar[str] = "algebraic"

    def sql(self) -> str:
        return f"COUNT({self.a()})"

    def rule(self) -> str:
        return "algebraic: running non-NULL count"

    def state(self) -> Cols:
        return [(f"{self.p}_nn", self.sql())]

    def output(self) -> str:
        return f"{self.p}_nn"

    def delta_terms(self) -> Cols:
        return [(f"{self.d}_nn", _nn_delta(self.a()))]

    def merged_state(self) -> Cols:
        return [(f"{self.p}_nn", f"COALESCE({self.o}_nn, 0) + COALESCE({self.d}_nn, 0)")]

    def needs_rescan(self) -> str | None:
        return None


@dataclass(eq=False)
class SumAvg(AggCall):
    """SUM and AVG share a running sum (in the argument's type) and a non-NULL count."""

    family: ClassVar[str] = "algebraic"

    def sql(self) -> str:
        return f"{self.func.upper()}({self.a()})"

    def rule(self) -> str:
        return "algebraic: running sum and non-NULL count"

    def state(self) -> Cols:
        a = self.a()
        return [(f"{self.p}_sum", f"SUM({a})"), (f"{self.p}_nn", f"COUNT({a})")]

    def output(self) -> str:
        p = self.p
        if self.func == "sum":
            return f"CASE WHEN {p}_nn > 0 THEN {p}_sum END"
        # the division Spark's AVG does: DOUBLE for integral and floating sums, DECIMAL (then cast to the
        # result type) for DECIMAL ones, so decimal averages round exactly like Spark's
        return f"CASE WHEN {p}_nn > 0 THEN {p}_sum / {p}_nn END"

    def delta_terms(self) -> Cols:
        a = self.a()
        return [(f"{self.d}_sum", f"SUM(__w * ({a}))"), (f"{self.d}_nn", _nn_delta(a))]

    def merged_state(self) -> Cols:
        p, d, o = self.p, self.d, self.o
        return [(f"{p}_sum", _add(f"{o}_sum", f"{d}_sum")),
                (f"{p}_nn", f"COALESCE({o}_nn, 0) + COALESCE({d}_nn, 0)")]

    def needs_rescan(self) -> str | None:
        return None


@dataclass(eq=False)
class BoolAndOr(AggCall):
    """BOOL_AND / BOOL_OR from the counts of non-NULL and of TRUE values."""

    family: ClassVar[str] = "algebraic"

    def sql(self) -> str:
        return f"{self.func.upper()}({self.a()})"

    def rule(self) -> str:
        return "algebraic: counts of non-NULL and of TRUE values"

    def state(self) -> Cols:
        a = self.a()
        return [(f"{self.p}_nn", f"COUNT({a})"), (f"{self.p}_t", f"COUNT(CASE WHEN {a} THEN 1 END)")]

    def output(self) -> str:
        p = self.p
        test = f"{p}_t = {p}_nn" if self.func == "bool_and" else f"{p}_t > 0"
        return f"CASE WHEN {p}_nn > 0 THEN {test} END"

    def delta_terms(self) -> Cols:
        a = self.a()
        return [(f"{self.d}_nn", _nn_delta(a)), (f"{self.d}_t", f"SUM(CASE WHEN {a} THEN __w ELSE 0 END)")]

    def merged_state(self) -> Cols:
        p, d, o = self.p, self.d, self.o
        return [(f"{p}_nn", f"COALESCE({o}_nn, 0) + COALESCE({d}_nn, 0)"),
                (f"{p}_t", f"COALESCE({o}_t, 0) + COALESCE({d}_t, 0)")]

    def needs_rescan(self) -> str | None:
        return None


@dataclass(eq=False)
class BitXor(AggCall):
    """BIT_XOR: XOR is self-inverse, so a value deleted is XORed in again; weight parity decides."""

    family: ClassVar[str] = "algebraic"

    def sql(self) -> str:
        return f"BIT_XOR({self.a()})"

    def rule(self) -> str:
        return "algebraic: XOR of the values with odd weight (XOR is its own inverse)"

    def state(self) -> Cols:
        a = self.a()
        return [(f"{self.p}_x", f"BIT_XOR({a})"), (f"{self.p}_nn", f"COUNT({a})")]

    def output(self) -> str:
        return f"CASE WHEN {self.p}_nn > 0 THEN {self.p}_x END"

    def delta_terms(self) -> Cols:
        a = self.a()
        # x ^ x is a zero of x's own type: an even weight contributes nothing, but keeps the sum non-NULL
        odd = f"CASE WHEN ({a}) IS NULL THEN NULL WHEN __w % 2 <> 0 THEN {a} ELSE ({a}) ^ ({a}) END"
        return [(f"{self.d}_x", f"BIT_XOR({odd})"), (f"{self.d}_nn", _nn_delta(a))]

    def merged_state(self) -> Cols:
        p, d, o = self.p, self.d, self.o
        return [(f"{p}_x", f"CASE WHEN {o}_x IS NULL THEN {d}_x WHEN {d}_x IS NULL THEN {o}_x "
                           f"ELSE {o}_x ^ {d}_x END"),
                (f"{p}_nn", f"COALESCE({o}_nn, 0) + COALESCE({d}_nn, 0)")]

    def needs_rescan(self) -> str | None:
        return None
