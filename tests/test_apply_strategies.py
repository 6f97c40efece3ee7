"""Every apply strategy (pipeline/strategy.py) under the oracle: the same plain-rows and keyed stream tables,
refreshed DIFFERENTIALly over random changes (duplicates, NULLs, key and join-key updates, deletes) with the
settings that force each way of committing, must equal their query after every cycle, and the refresh
results must show that the forced strategy really ran.

* default: collected deltas, plain-rows deletions picked on the driver by delta-rs (pipeline/plain_rows.py),
  appended by delta-rs, merged by spark-trickle's own commit (connectors/small_merge.py: small tables);
* ``trickle.apply.ownMergeRowsBelow=-1``: the same merged by delta-rs;
* ``trickle.apply.deltaRs=false``: the same collected rows committed by Spark (append or MERGE);
* ``trickle.apply.deletionVectorsAboveRows=0`` (own vectors off): Spark's MERGE with deletion vectors; once the table has them
  plain-rows deletions are picked on the driver with the marked rows left out (connectors/vector_reads.py);
* ``trickle.apply.vectorsAboveRows=0``: plain-rows deletions marked in deletion vectors by spark-trickle's own
  commit (connectors/deletion_vectors.py), read back by Spark;
* ``trickle.apply.collectBelowBytes=-1``: nothing collected: Spark's MERGE over the delta kept in the cluster
  (the plain-rows deletions picked by a join with the table, dvm.plan.bag_changes_sql).

FULL's two paths (delta-rs overwrite of a collected result, Spark's overwrite) are covered by the oracle of
test_oracle_seed_examples and test_auto. Few cycles each: the operators are proved by the other oracles; here
the commit paths are.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from oracle import Churn, Col, TableSpec, run_oracle

CYCLES = int(os.environ.get("TRICKLE_STRATEGY_CYCLES", "3"))

FACT = TableSpec("fact", (Col("dim", "jkey", domain=(1, 6)), Col("amount", "int", domain=(0, 9))),
                 key=None, rows=40, dup_fraction=0.3, max_changes=6)
DIM = TableSpec("dim", (Col("name", "string"),), key="id", key_range=(1, 6), rows=5, max_changes=2)

QUERIES = {
    "rows": "SELECT f.dim, f.amount, d.name FROM {fact} f JOIN {dim} d ON f.dim = d.id WHERE f.amount <> 3",
    "groups": "SELECT d.name, SUM(f.amount) AS total, COUNT(*) AS n FROM {fact} f JOIN {dim} d ON f.dim = d.id "
              "GROUP BY d.name",
}

#: variant -> (settings, strategies that must run, strategies that may run besides)
VARIANTS = {
    # small tables: the files a change touches rewritten by spark-trickle's own commit (connectors/small_merge.py)
    "own": ({}, {"MERGE (own)"}, {"APPEND (delta-rs)"}),
    "delta-rs": ({"trickle.apply.ownMergeRowsBelow": "-1"}, {"MERGE (delta-rs)"}, {"APPEND (delta-rs)"}),
    "spark": ({"trickle.apply.deltaRs": "false"}, {"MERGE (spark)"}, {"APPEND (spark)"}),
    # an insert-only delta into plain rows is an append (delta-rs until the table has deletion vectors)
    "deletion-vectors": ({"trickle.apply.deletionVectorsAboveRows": "0", "trickle.apply.vectorsAboveRows": "-1"},
                         {"MERGE (spark-dv)"}, {"APPEND (delta-rs)", "APPEND (spark)"}),
    # plain rows: deletions marked by spark-trickle's own commit (vectors turned on at the first one); keyed
    # rows: the own MERGE as by default
    "vectors": ({"trickle.apply.vectorsAboveRows": "0"}, {"MERGE (vectors)", "MERGE (own)"},
                {"APPEND (vectors)", "APPEND (delta-rs)"}),
    "uncollected": ({"trickle.apply.collectBelowBytes": "-1"}, {"SPARK_MERGE (spark)"}, set()),
}


class _Recording:
    """The stream tables API, recording the apply strategy of every refresh."""

    def __init__(self, st: Any) -> None:
        self._st = st
        self.applied: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._st, name)

    def refresh_stream_table(self, name: str) -> Any:
        result = self._st.refresh_stream_table(name)
        if result.action == "DIFFERENTIAL" and result.apply:
            self.applied[result.apply.split(":")[0]] += 1
        return result


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_apply_strategy_keeps_the_query(spark: Any, st: Any, variant: str) -> None:
    conf, required, allowed = VARIANTS[variant]
    recording = _Recording(st)
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        run_oracle(spark, recording, [FACT, DIM], QUERIES, cycles=CYCLES, seed=16,
                   churn=[Churn("fact", "dim", "dim")])
    finally:
        for k in conf:
            spark.conf.unset(k)
    ran = set(recording.applied)
    assert required <= ran, f"{variant}: expected {sorted(required)} to run, saw {dict(recording.applied)}"
    assert ran <= required | allowed | {"NONE"}, f"{variant}: other strategies ran too: {dict(recording.applied)}"
