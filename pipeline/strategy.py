"""How a refresh applies its delta: the apply strategy, chosen per refresh and recorded with it.

A differential refresh computes its change rows (see :mod:`dvm.plan`) with one Spark job; what it then
costs is mostly the commit. Like Databricks' Enzyme, the strategy is chosen per refresh from what is known
then, and the choice and its reason go into the refresh history and ``explain``:

* ``NONE`` -- the delta changed nothing: no commit at all (the catalog keeps a soft frontier).
* ``APPEND`` -- only new rows (no ``__del`` row) into a table whose inserted rows carry fresh ids (the
  plain-rows layout): one append commit, no MERGE and no read of the table.
* ``MERGE`` -- the change rows applied on ``__row_id``.
* ``SPARK_MERGE`` -- Spark's MERGE over the delta kept in the cluster, for deltas too large for the driver.

Each runs on an *engine*: ``delta-rs`` (the ``deltalake`` package, tens of milliseconds per commit; used
when the delta was collected to the driver and the table's features and store allow it, see
:func:`connectors.delta_rs.unusable`) or ``spark`` (several jobs and about a second per commit, but any
table and any store). The delta is collected to the driver, in the same job that computes it, when the
change feeds it reads are small (``trickle.apply.collectBelowBytes``); a collected delta larger than
``trickle.apply.deltaRsRowsBelow`` rows still goes through Spark, from the collected rows.

Pure decisions over numbers, testable without Spark; :mod:`pipeline.refresh` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Spark conf: collect the delta to the driver when the change feeds of the window total fewer bytes.
COLLECT_BELOW = "trickle.apply.collectBelowBytes"
#: Spark conf: a collected delta of at most this many rows is committed by delta-rs (when usable).
DELTA_RS_ROWS = "trickle.apply.deltaRsRowsBelow"
#: Spark conf: ``false`` turns the delta-rs commit path off (every commit through Spark).
DELTA_RS = "trickle.apply.deltaRs"

NONE, APPEND, MERGE, SPARK_MERGE = "NONE", "APPEND", "MERGE", "SPARK_MERGE"


@dataclass(frozen=True)
class Limits:
    collect_below_bytes: int = 256 << 20
    delta_rs_rows: int = 2_000_000
    delta_rs: bool = True

    @classmethod
    def from_conf(cls, conf: Any) -> Limits:
        """From a Spark conf (anything with ``get(key, default)``)."""
        d = cls()
        return cls(int(conf.get(COLLECT_BELOW, str(d.collect_below_bytes))),
                   int(conf.get(DELTA_RS_ROWS, str(d.delta_rs_rows))),
                   str(conf.get(DELTA_RS, "true")).strip().lower() != "false")


@dataclass(frozen=True)
class Choice:
    strategy: str
    engine: str
    reason: str

    def describe(self) -> str:
        return f"{self.strategy} ({self.engine}): {self.reason}" if self.engine else f"{self.strategy}: {self.reason}"


def collect_first(change_bytes: int, limits: Limits) -> bool:
    """Whether the delta job should hand its rows to the driver (and the commit be chosen afterwards)."""
    return change_bytes <= limits.collect_below_bytes


def choose(rows: int, deletes: int, appendable: bool, delta_rs_unusable: str | None, limits: Limits) -> Choice:
    """The strategy for a collected delta of ``rows`` change rows, ``deletes`` of them ``__del`` rows.

    ``appendable``: the layout's inserted rows carry fresh ids (never match a stored row), so a delta
    without deletions is a plain append. ``delta_rs_unusable``: why delta-rs may not commit to this table
    (None: it may)."""
    if rows == 0:
        return Choice(NONE, "", "the delta has no rows")
    if not limits.delta_rs:
        engine, why = "spark", f"delta-rs is off ({DELTA_RS}=false)"
    elif delta_rs_unusable is not None:
        engine, why = "spark", delta_rs_unusable
    elif rows > limits.delta_rs_rows:
        engine, why = "spark", f"{rows} change rows, above {DELTA_RS}RowsBelow={limits.delta_rs_rows}"
    else:
        engine, why = "delta-rs", f"{rows} change rows collected to the driver"
    if appendable and deletes == 0:
        return Choice(APPEND, engine, f"insert-only delta; {why}")
    return Choice(MERGE, engine, f"{deletes} of {rows} change rows delete; {why}")


def uncollected(change_bytes: int, limits: Limits) -> Choice:
    """The strategy for a delta too large to collect: Spark's MERGE from the cluster."""
    return Choice(SPARK_MERGE, "spark", f"the change feeds total {change_bytes} bytes, above "
                  f"{COLLECT_BELOW}={limits.collect_below_bytes}: the delta stays in the cluster")
