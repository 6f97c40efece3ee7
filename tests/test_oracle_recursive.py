"""Oracle tests of WITH RECURSIVE: every stream table equals Spark's own evaluation of its query after each
of >= 20 random change cycles, refreshed DIFFERENTIAL (run_oracle fails on any other action).

Sources: ``org`` (an org chart by parent pointers: keyed, ids from a small range so deleted ids come back;
NULL parents are roots; random parent updates reparent whole subtrees and can close parent cycles that
no root reaches; deletes remove inner nodes; :class:`Subtree` inserts whole new branches) and ``edges``
(a keyless graph over 6 nodes: cycles, self-loops, exact duplicate edges, NULL ends). About a third of the
cycles only insert, so each table meets both its insert-only rule (semi-naive) and its general rule
(counting for UNION ALL, DRed for UNION); the test checks from the refresh history that both ran.

Stream tables:

* ``org_paths`` — the demo's tree (UNION ALL, path strings and depth); the stream table stores the CTE's
  rows, so the old result is read from it.
* ``subtree_sizes`` — a keyed aggregate over a recursion from EVERY node, bounded by depth (parent cycles
  are walked round until the bound): the old result is recomputed on the old snapshot.
* ``reach`` — graph reachability with UNION (set semantics) over a graph with cycles. Spark cannot run a
  recursive UNION, so the oracle runs an equivalent UNION ALL that never revisits a node of its path,
  then DISTINCT.
* ``dag_paths`` — path enumeration with UNION ALL over the forward edges (src < dst, a DAG) through nodes
  that exist in ``org``: duplicate edges double path counts (bag semantics), and the recursive term reads
  two sources (the rule's telescoping over occurrences).
* ``org_leaves`` — a recursive term with a LEFT JOIN (not monotone in its source): recompute-diff.
"""

from __future__ import annotations

import os
from typing import Any

from coverage_rows import Row
from oracle import Col, Subtree, TableSpec, run_oracle

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

ORG = TableSpec(
    "org",
    (Col("parent", "jkey", domain=(1, 12)), Col("name", "string", nullable=False)),
    key="id",
    key_range=(1, 12),
    rows=9,
    null_p=0.2,
    max_changes=3,
)
EDGES = TableSpec(
    "edges",
    (Col("src", "jkey", domain=(1, 6)), Col("dst", "jkey", domain=(1, 6))),
    key=None,
    rows=10,
    dup_fraction=0.25,
    null_p=0.08,
    max_changes=3,
)

QUERIES = {
    "org_paths": (
        "WITH RECURSIVE t AS (SELECT id, name, parent, name AS path, 0 AS depth FROM {org} WHERE parent IS NULL "
        "UNION ALL SELECT o.id, o.name, o.parent, concat(t.path, ' > ', o.name) AS path, t.depth + 1 AS depth "
        "FROM {org} o JOIN t ON o.parent = t.id) "
        "SELECT id, name, parent, path, depth FROM t"
    ),
    "subtree_sizes": (
        "WITH RECURSIVE s(top, id, lvl) AS (SELECT id, id, 0 FROM {org} "
        "UNION ALL SELECT s.top, o.id, s.lvl + 1 FROM s JOIN {org} o ON o.parent = s.id WHERE s.lvl < 5) "
        "SELECT top, COUNT(*) AS n, MAX(lvl) AS height, SUM(id) AS ids FROM s GROUP BY top"
    ),
    "reach": (
        "WITH RECURSIVE r(a, b) AS (SELECT src, dst FROM {edges} "
        "UNION SELECT r.a, e.dst FROM r JOIN {edges} e ON r.b = e.src) "
        "SELECT a, b FROM r"
    ),
    "dag_paths": (
        "WITH RECURSIVE p(a, b, hops, route) AS ("
        "SELECT src, dst, 1, concat(CAST(src AS STRING), '>', CAST(dst AS STRING)) FROM {edges} WHERE src < dst "
        "UNION ALL SELECT p.a, e.dst, p.hops + 1, concat(p.route, '>', CAST(e.dst AS STRING)) "
        "FROM p JOIN {edges} e ON p.b = e.src JOIN {org} o ON o.id = e.dst WHERE e.src < e.dst) "
        "SELECT a, b, hops, route FROM p"
    ),
    "org_leaves": (
        "WITH RECURSIVE t(id, depth) AS (SELECT id, 0 FROM {org} WHERE parent IS NULL "
        "UNION ALL SELECT o.id, t.depth + 1 FROM t LEFT JOIN {org} o ON o.parent = t.id WHERE t.id IS NOT NULL) "
        "SELECT id, depth FROM t"
    ),
}

#: What Spark evaluates for the oracle where it cannot run the query as written (recursive UNION): every
#: reachable pair is reached by a walk that repeats no node after its start, so pruning repeats finds them.
ORACLE_QUERIES = {
    "reach": (
        "WITH RECURSIVE r(a, b, seen) AS (SELECT src, dst, array(dst) FROM {edges} "
        "UNION ALL SELECT r.a, e.dst, array_append(r.seen, e.dst) FROM r JOIN {edges} e ON r.b = e.src "
        "WHERE e.dst IS NULL OR NOT array_contains(r.seen, e.dst)) "
        "SELECT DISTINCT a, b FROM r"
    ),
}

#: which rules each table must have used at least once (from the notes in its refresh history)
EXPECTED_RULES = {
    "org_paths": {"semi-naive", "counting"},
    "subtree_sizes": {"semi-naive", "counting"},
    "reach": {"semi-naive", "DRed"},
    "dag_paths": {"semi-naive", "counting"},
    "org_leaves": {"recompute-diff"},
}

COVERAGE = [
    Row("WITH RECURSIVE ... UNION ALL (trees, path strings, path counting)", "DIFFERENTIAL",
        "WITH RECURSIVE t AS (SELECT id, k, 0 AS d FROM a WHERE k IS NULL UNION ALL SELECT a.id, a.k, t.d + 1 "
        "FROM a JOIN t ON a.k = t.id) SELECT id, k, d FROM t",
        "test_recursive_differential"),
    Row("WITH RECURSIVE ... UNION (set semantics, cycles)", "DIFFERENTIAL",
        "WITH RECURSIVE r(x, y) AS (SELECT id, k FROM a UNION SELECT r.x, a.k FROM r JOIN a ON a.id = r.y) "
        "SELECT x, y FROM r",
        "test_recursive_differential"),
    Row("WITH RECURSIVE with an outer join, DISTINCT or subquery in the recursive term", "recompute-scoped",
        "WITH RECURSIVE t AS (SELECT id FROM a WHERE k IS NULL UNION ALL SELECT a.id FROM t LEFT JOIN a "
        "ON a.k = t.id WHERE t.id IS NOT NULL) SELECT id FROM t",
        "test_recursive_differential",
        "the recursive term is not monotone in its sources: the recursion is evaluated on the new snapshot "
        "and diffed against the old result"),
]


def _rules(st: Any) -> dict[str, set[str]]:
    """Rules each stream table's DIFFERENTIAL refreshes used, from the reasons in its history."""
    out: dict[str, set[str]] = {}
    for s in st.status():
        logical = next((n for n in QUERIES if str(s["name"]).startswith(n + "_")), None)
        if logical is None:
            continue
        for h in st.history(s["name"], limit=200):
            for rule in ("semi-naive", "counting", "DRed", "recompute-diff"):
                if f": {rule} (" in str(h.get("reason") or ""):
                    out.setdefault(logical, set()).add(rule)
    return out


def test_recursive_differential(spark: Any, st: Any) -> None:
    """Trees (reparenting, inner deletes, subtree inserts), graph reachability with cycles under UNION,
    bag-semantics path enumeration, a depth-bounded recursion over cycles under an aggregate and a
    non-monotone recursive term, each equal to Spark's evaluation after every cycle."""
    run_oracle(spark, st, [ORG, EDGES], QUERIES, cycles=CYCLES, seed=606,
               subtrees=[Subtree("org", "parent")], insert_only_p=0.35, oracle_queries=ORACLE_QUERIES)
    used = _rules(st)
    missing = {n: sorted(want - used.get(n, set())) for n, want in EXPECTED_RULES.items() if want - used.get(n, set())}
    assert not missing, f"rules never exercised: {missing} (used: {used})"
