"""Group-rescan aggregates: no algebraic rule, so every group a delta touches is recomputed.

Rule: the state column ``__agg<i>_v`` holds the aggregate's value; a refresh recomputes it for the groups
occurring in the delta, from the child's post-state restricted to those groups (one LEFT SEMI JOIN on the
group key). Groups the delta does not touch are not read. This is pg_trickle's group-rescan strategy.

Covered: COUNT(DISTINCT ...) and every other aggregate with DISTINCT (SUM, AVG, STDDEV, ... DISTINCT),
COLLECT_LIST / ARRAY_AGG, COLLECT_SET, STRING_AGG / LISTAGG, PERCENTILE, PERCENTILE_APPROX, MEDIAN, MODE,
KURTOSIS, SKEWNESS, APPROX_COUNT_DISTINCT.

Deterministic rules (Spark leaves these orders undefined; the rule picks one answer Spark may give, so a
rescanned group, a FULL refresh and a differential one always agree):

* COLLECT_LIST(x) / ARRAY_AGG(x) / COLLECT_SET(x) are stored sorted ascending (``array_sort``); element types
  must be orderable (not MAP).
* STRING_AGG / LISTAGG(x[, sep]) without WITHIN GROUP concatenate in ascending order of x; with
  WITHIN GROUP (ORDER BY k...) the value x is appended as the last key, so ties on k are ordered too.
* MODE(x) is ``mode(x, true)``: among equally frequent values the least one.

PERCENTILE_APPROX's answer is exact for groups smaller than its accuracy (default 10000 values); for larger
groups its sketch depends on the order it is fed rows in, so a rescan may return a different (equally
accurate) value than a recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dvm.operators.aggregates.base import AggCall


@dataclass(eq=False)
class GroupRescan(AggCall):
    family: ClassVar[str] = "group rescan"
