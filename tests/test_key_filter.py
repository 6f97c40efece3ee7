"""Key filters (dvm.key_filter): a join input read only where a small delta's keys fall.

The pure parts (which equalities qualify, how keys become ranges, how the rule is rendered) are checked without
Spark; the oracle then runs inner joins, nested and under an aggregate, and outer, semi, anti and mark joins, with the threshold at one byte and no
snapshot held, so that every join of every refresh filters, over int, string and date keys with NULLs, key updates and deletes.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import sqlglot
from oracle import Col, TableSpec, run_oracle

import dvm
from dvm import Context, SourceRef
from dvm.key_filter import MAX_IN, MAX_RANGES, KeyFilter, keys_query, predicate, ranges
from dvm.operators.join import equi_keys
from tests.conftest import local_engine_mode

_engine = local_engine_mode("off")  # this module tests Spark's own delta job (one test: DuckDB's, verified)

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))

SCHEMAS = {
    "emp": [("id", "int"), ("name", "string"), ("dept", "int"), ("sal", "double")],
    "dept": [("id", "int"), ("dname", "string")],
}


def test_ranges_split_at_the_widest_gaps() -> None:
    assert ranges([5, 1, 2, 3, 100, 101, 50], 3) == [(1, 5), (50, 50), (100, 101)]
    assert ranges([3, 3, 3]) == [(3, 3)]
    assert ranges([]) == []
    assert len(ranges(list(range(0, 1000, 7)))) == MAX_RANGES
    d = datetime.date
    assert ranges([d(2024, 1, 1), d(2024, 1, 2), d(2030, 5, 5)], 2) == [(d(2024, 1, 1), d(2024, 1, 2)),
                                                                        (d(2030, 5, 5), d(2030, 5, 5))]


def test_predicate_keeps_every_key() -> None:
    assert predicate([], "`k`") == "FALSE"
    assert predicate([7], "`k`") == "(`k` = 7)"
    assert predicate([1, 2, 3, 90], "`k`", 2) == "(`k` BETWEEN 1 AND 3 OR `k` = 90)"
    assert predicate([1, 40, 90], "`k`") == "(`k` IN (1, 40, 90))"
    assert predicate(["b", "a'x"], "`k`") == "(`k` IN ('a\\'x', 'b'))"
    assert predicate([datetime.date(2024, 2, 29)], "`k`") == "(`k` = DATE'2024-02-29')"
    # what it cannot render or would not pay: no filter
    assert predicate([1.5], "`k`") == "TRUE"
    assert predicate([True], "`k`") == "TRUE"
    assert predicate([1, "a"], "`k`") == "TRUE"
    assert predicate([str(i) for i in range(MAX_IN + 1)], "`k`") == "TRUE"
    assert predicate([datetime.datetime(2024, 1, 1)], "`k`") == "TRUE"


def test_keys_of_all_filters_are_read_in_one_query_a_column_per_type() -> None:
    q = keys_query([(KeyFilter("h1", "`a`", "`x`"), "bigint"), (KeyFilter("h2", "`b`", "`y`"), "date")])
    assert q == ("SELECT 0 AS i, slice(collect_set(`a`), 1, 50001), CAST(NULL AS ARRAY<date>) FROM h1 UNION ALL "
                 "SELECT 1 AS i, CAST(NULL AS ARRAY<bigint>), slice(collect_set(`b`), 1, 50001) FROM h2")


def test_only_equalities_between_the_inputs_qualify() -> None:
    cond = sqlglot.parse_one("a1 = b1 AND a2 + 1 = b2 AND a3 > b3 AND b4 = a4 AND a1 <=> b5", read="spark")
    assert equi_keys(cond, ["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4", "b5"]) == [("a1", "b1"), ("a2 + 1", "b2")]
    assert equi_keys(cond, ["b1", "b2", "b3", "b4", "b5"], ["a1", "a2", "a3", "a4"]) == [("b1", "a1"), ("b4", "a4")]
    assert equi_keys(sqlglot.parse_one("a1 > b1", read="spark"), ["a1"], ["b1"]) == []
    assert equi_keys(None, ["a1"], ["b1"]) == []


def _ctx(big: int, small: bool = True) -> Context:
    return Context({"emp": SourceRef("/w/emp", 5, 4, sizes={4: big, 5: big}, change_bytes=10),
                    "dept": SourceRef("/w/dept", 9, 8, sizes={8: big, 9: big}, change_bytes=10)},
                   target_path="/w/st", small_delta=small, key_filter_above=1 << 20)


def test_large_post_snapshots_are_filtered_by_the_held_deltas_keys() -> None:
    plan = dvm.compile_query("SELECT e.name, d.dname FROM emp e JOIN dept d ON e.dept = d.id", SCHEMAS)
    ctx = _ctx(big=64 << 20)
    sql = plan.merge_source_sql(ctx, ["string", "string"])
    assert sql is not None
    assert [s.column for _, s in ctx.key_filters] == ["`__t4`", "`__t2`"]  # dept.id by Δemp, emp.dept by Δdept
    for token, spec in ctx.key_filters:
        assert token in sql and spec.held in sql
        assert spec.held in dict(ctx.fixpoints)  # the delta whose keys are read is held, computed once
    assert any(n.startswith("key filter") for n in ctx.notes)
    # small inputs, or a delta too large to collect: nothing held, no filter
    for small_ctx in (_ctx(big=1 << 10), _ctx(big=64 << 20, small=False)):
        assert plan.merge_source_sql(small_ctx, ["string", "string"]) is not None
        assert small_ctx.key_filters == [] and small_ctx.fixpoints == []


def test_rows_a_change_affects_and_their_partners_are_read_where_the_keys_fall() -> None:
    # EXISTS with both inputs changed: emp's both snapshots by the keys of Δemp and Δdept, dept's by both too
    plan = dvm.compile_query("SELECT e.name FROM emp e WHERE EXISTS (SELECT 1 FROM dept d WHERE d.id = e.dept)",
                             SCHEMAS)
    ctx = _ctx(big=64 << 20)
    sql = plan.merge_source_sql(ctx, ["string"])
    assert sql is not None
    specs = {(s.held, s.key, s.column) for _, s in ctx.key_filters}
    dept, emp = sorted({s.held for _, s in ctx.key_filters})  # the two deltas, held in the order rendered
    assert specs == {(dept, "`__t4`", "`__t2`"),  # emp.dept where Δdept's ids fall (post, and both states)
                     (emp, "`__t2`", "`__t2`"),  # emp.dept where Δemp's depts fall (both states)
                     (dept, "`__t4`", "`__t4`"),  # dept.id where Δdept's ids fall (both states)
                     (emp, "`__t2`", "`__t4`")}  # dept.id where Δemp's depts fall (both states)
    assert "IS NULL" in sql  # a NULL-keyed changed emp row is affected too
    assert sum("rows a change affects" in n for n in ctx.notes) == 2
    # two marks whose subqueries both changed: a partner is not bounded by the other subquery's keys
    plan = dvm.compile_query("SELECT e.name FROM emp e WHERE EXISTS (SELECT 1 FROM dept d WHERE d.id = e.dept) "
                             "OR e.id IN (SELECT d2.id FROM dept d2)", SCHEMAS)
    ctx = _ctx(big=64 << 20)
    assert plan.merge_source_sql(ctx, ["string"]) is not None
    assert not any("partners" in n for n in ctx.notes) and any("rows a change affects" in n for n in ctx.notes)


A = TableSpec("a", (Col("k", "jkey", domain=(1, 6)), Col("s", "string"), Col("v", "int", domain=(0, 5))),
              key="id", rows=14, max_changes=3)
B = TableSpec("b", (Col("k", "jkey", domain=(1, 6)), Col("s", "string"), Col("x", "int", domain=(0, 9))),
              key=None, rows=10, dup_fraction=0.3, max_changes=3)  # keyless: exact duplicates
C = TableSpec("c", (Col("k", "jkey", domain=(1, 6)), Col("y", "int", domain=(0, 9))), key="id", rows=6,
              max_changes=2)
VIEWS = {"bd": "CREATE TEMPORARY VIEW {bd} AS SELECT k, s, x, DATE_ADD(DATE'2024-02-27', k) AS d FROM {b}"}

QUERIES = {
    # int keys, both joins of a nested inner join filtered (one with a non-equi conjunct beside)
    "kf_int_nested": "SELECT a.id, b.x, c.y FROM {a} a JOIN {b} b ON a.k = b.k JOIN {c} c ON c.k = b.k AND c.y > a.v",
    # string and date keys (an expression on the delta's side), under an aggregate
    "kf_str_date_agg": "SELECT a.s, COUNT(*) AS n, SUM(b.x) AS sx FROM {a} a JOIN {bd} b "
                       "ON a.s = b.s AND DATE_ADD(DATE'2024-02-27', a.v) = b.d GROUP BY a.s",
    # the rows a change affects in outer, semi, anti and mark joins, and ΔL against an unchanged R
    "kf_semi_left": "SELECT 'left' AS b, a.id, c.y AS v FROM {a} a LEFT JOIN {c} c ON a.k = c.k "
                    "UNION ALL SELECT 'semi', a.id, a.v FROM {a} a "
                    "WHERE EXISTS (SELECT 1 FROM {b} b WHERE b.k = a.k AND b.x > a.v) "
                    "UNION ALL SELECT 'anti', a.id, a.v FROM {a} a WHERE NOT EXISTS (SELECT 1 FROM {c} c WHERE c.k = a.k) "
                    "UNION ALL SELECT 'marks', a.id, a.v FROM {a} a "
                    "WHERE a.v > 3 OR a.k IN (SELECT b.k FROM {b} b WHERE b.x = 2)",
    # aggregates below the filtered joins: a nested aggregate read as a relation, and one as the partner of
    # an IN (its snapshots read where the affected rows' keys fall; TPC-H Q18's shape)
    "kf_nested_agg": "SELECT b.k, b.n, b.sx FROM (SELECT k, COUNT(*) AS n, SUM(x) AS sx FROM {b} GROUP BY k) b "
                     "WHERE b.n > 1 UNION ALL SELECT a.id, a.v, 0 FROM {a} a "
                     "WHERE a.k IN (SELECT k FROM {b} GROUP BY k HAVING SUM(x) > 5)",
    # two marks over inputs that both change (neither partner filtered by the other's keys), and a left join
    # under an aggregate (TPC-H Q13's shape)
    "kf_marks_agg": "SELECT 'marks' AS b, a.id, a.v AS n FROM {a} a WHERE EXISTS (SELECT 1 FROM {b} b WHERE b.k = a.k) "
                    "OR NOT EXISTS (SELECT 1 FROM {c} c WHERE c.k = a.k AND c.y > a.v) "
                    "UNION ALL SELECT 'count', a.k, COUNT(c.y) FROM {a} a LEFT JOIN {c} c ON a.k = c.k AND c.y > 2 "
                    "GROUP BY a.k",
}


#: The oracle's seed and length: 5 changing cycles (6 with the empty one) of seed 54 hold every kind of
#: change of the 8 (10 cycles) of seed 31 used before, and more (deletes and key updates of ``a``, NULL join
#: keys inserted and deleted, deletes of duplicated keyless rows) in 6 cycles instead of 10; pinned by
#: test_the_oracle_batches_hold_every_kind_of_change below.
SEED, ORACLE_CYCLES = 54, 5


def _change_kinds(spec: TableSpec, op: Any) -> set[str]:
    """What one row change of a generated batch is, as the key filter sees it (its join key is ``k``)."""
    at = (1 if spec.key else 0) + [c.name for c in spec.cols].index("k")
    row = op.new if op.op == "I" else op.old
    kinds = {op.op} | ({f"{op.op} of duplicates"} if op.count > 1 else set())
    if op.op != "U":
        return kinds | ({f"{op.op} with a NULL join key"} if row[at] is None else set())
    if spec.key and op.old[0] != op.new[0]:
        kinds.add("U of the primary key")
    if op.old[at] != op.new[at]:
        kinds.add("U of the join key" + (" to NULL" if op.new[at] is None else
                                          " from NULL" if op.old[at] is None else ""))
    return kinds


def test_the_oracle_batches_hold_every_kind_of_change(monkeypatch: Any) -> None:
    """No Spark: the batches the key-filter oracle below applies (its seed, its cycles with the empty cycle
    2, the Delta commits skipped) hold every kind of change whose keys a filter must keep, in each table. A
    change of ChangeGenerator's draws that made this short run miss one fails here, not silently."""
    import oracle

    monkeypatch.setattr(oracle.ChangeGenerator, "_merge", lambda self, src, ops: None)
    monkeypatch.setattr(oracle.ChangeGenerator, "_append_delta_rs", lambda self, src, ops: None)  # initial rows
    gen = oracle.ChangeGenerator(type("NoSpark", (), {"sql": lambda self, q: None})(), [A, B, C], SEED)
    gen.create()
    seen: dict[str, set[str]] = {n: set() for n in gen.sources}
    for cycle in range(1, ORACLE_CYCLES + 2):  # as run_oracle draws them
        changed = gen.cycle(empty=(cycle == 2))
        # every stream table reads a: a change of it in each other cycle means the oracle stops after these
        assert ("a" in changed) == (cycle != 2), (cycle, changed)
        for name, ops in gen.last_ops.items():
            seen[name] |= set().union(set(), *(_change_kinds(gen.sources[name].spec, op) for op in ops))
    both = {"I", "U", "D", "U of the join key"}
    assert seen["a"] >= both | {"U of the primary key", "U of the join key to NULL", "D with a NULL join key"}, \
        seen["a"]
    assert seen["b"] >= both | {"U of duplicates", "D of duplicates", "U of the join key from NULL",
                                "I with a NULL join key"}, seen["b"]
    assert seen["c"] >= both | {"U of the primary key", "U of the join key from NULL", "I with a NULL join key"}, \
        seen["c"]


def test_key_filtered_joins_match_the_query(spark: Any, st: Any) -> None:
    # every join filtered: any size qualifies, and no snapshot is held (a held one is read whole, once)
    settings = {"trickle.refresh.keyFilterAboveBytes": "1", "trickle.refresh.holdSnapshotsBelowBytes": "0"}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        run_oracle(spark, st, [A, B, C], QUERIES, cycles=min(CYCLES, ORACLE_CYCLES), seed=SEED, views=VIEWS)
        names = [s["name"] for s in st.status() if s["name"].startswith(tuple(QUERIES))]
        assert len(names) == len(QUERIES)
        for name in names:  # every join of every refresh was filtered
            reasons = [h["reason"] for h in st.history(name) if h["action"] == "DIFFERENTIAL"]
            assert reasons and all("key filter" in r for r in reasons), reasons
    finally:
        for k in settings:
            spark.conf.unset(k)


def test_null_keyed_rows_a_change_affects_are_kept(spark: Any, st: Any, make_source: Any) -> None:
    """A row of the affected input whose key is NULL is affected when it is inserted or deleted, and must
    survive the key filter on that input's both snapshots (an anti join keeps it, a left join pads it)."""
    from oracle import assert_matches

    a = make_source("kfa", "id INT, k INT", rows=[(1, 1), (2, None), (3, 2)])
    c = make_source("kfc", "id INT, k INT", rows=[(1, 1), (2, 3)])
    queries = {f"{a}_anti": f"SELECT a.id FROM {a} a WHERE NOT EXISTS (SELECT 1 FROM {c} c WHERE c.k = a.k)",
               f"{a}_left": f"SELECT a.id, c.id AS cid FROM {a} a LEFT JOIN {c} c ON a.k = c.k"}
    settings = {"trickle.refresh.keyFilterAboveBytes": "1", "trickle.refresh.holdSnapshotsBelowBytes": "0"}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        for name, q in queries.items():
            st.create_stream_table(name, q, refresh_mode="DIFFERENTIAL")
        steps = [(f"INSERT INTO {a} VALUES (4, NULL), (5, 3)", f"INSERT INTO {c} VALUES (3, 2)"),
                 (f"DELETE FROM {a} WHERE id = 2", f"DELETE FROM {c} WHERE id = 1"),
                 (f"UPDATE {a} SET k = NULL WHERE id = 5", f"UPDATE {c} SET k = 1 WHERE id = 3")]
        for i, (change_a, change_c) in enumerate(steps):
            spark.sql(change_a)
            spark.sql(change_c)
            for name, q in queries.items():
                r = st.refresh_stream_table(name)
                assert r.action == "DIFFERENTIAL" and "rows a change affects" in r.reason, (i, r.reason)
                assert_matches(spark, st, name, q, f"step {i}")
    finally:
        for k in settings:
            spark.conf.unset(k)


def test_duckdb_keeps_one_parse_of_a_key_filtered_join(spark: Any, st: Any, make_source: Any) -> None:
    """A key-filtered join's delta on DuckDB (``verify``: Spark computes it too, and they must agree) over
    refreshes whose changed keys differ: each is key filtered, computed by DuckDB and equal to the query, and
    its delta's text is parsed once. The keys differ at every refresh, so a text that held them missed the
    kept parse every time (pipeline/local_engine.py, ``LocalEngine.bind``)."""
    from oracle import assert_matches, session_conf

    from connectors.storage import strip_file_scheme
    from pipeline import local_engine

    a = make_source("kpa", "id INT, k INT", rows=[(i, i % 5) for i in range(20)])
    c = make_source("kpc", "id INT, k INT", rows=[(i, i % 7) for i in range(14)])
    name, query = f"{a}_join", f"SELECT a.id, c.id AS cid FROM {a} a JOIN {c} c ON a.k = c.k"
    settings = {"trickle.refresh.keyFilterAboveBytes": "1", "trickle.refresh.holdSnapshotsBelowBytes": "0",
                "trickle.refresh.localEngine": "verify"}
    path = strip_file_scheme(spark.sql(f"DESCRIBE DETAIL {a}").first()["location"])

    def kept() -> set[str]:  # the kept parses of this join's delta
        return {k for k in local_engine._PARSED if path in k and "__trickle_keys_" in k}  # noqa: SLF001

    with session_conf(spark, settings):  # then back to what was set (this module: engine "off")
        st.create_stream_table(name, query, refresh_mode="DIFFERENTIAL")
        seen: list[set[str]] = []
        for i in range(4):  # both sources change at every step: the same delta rule, other keys
            spark.sql(f"INSERT INTO {a} VALUES ({100 + i}, {10 + 3 * i}), ({200 + i}, {i})")
            spark.sql(f"UPDATE {c} SET k = {10 + 3 * i} WHERE id = {i}")
            r = st.refresh_stream_table(name)
            assert r.action == "DIFFERENTIAL" and "key filter" in r.reason, (i, r.reason)
            assert r.apply is not None and "delta computed by duckdb" in r.apply, (i, r.apply)
            assert_matches(spark, st, name, query, f"step {i}")
            seen.append(kept())
        assert seen[0] and all(s == seen[0] for s in seen), seen
