"""Cycles of stream tables (seed 002, issue 20): opt-in, edge classes, fixpoint evaluation, deletions.

The oracle: two mutually recursive stream tables, ``a = e UNION b`` and ``b = a JOIN e`` (a is the
transitive closure of the edges e, b its paths of two edges or more), against DuckDB's non-incremental
``WITH RECURSIVE ... UNION`` over the same edges, as multisets, after random inserts AND deletes of edges
over 20 cycles. Deletions are the point: a path that only supported itself around a cycle of the graph
must disappear when an edge it needed goes (the least fixpoint, not just any fixpoint).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import duckdb
import pytest

from pipeline import StreamTables
from pipeline.errors import CatalogError, RefreshError

A_QUERY = "SELECT src, dst FROM {e} UNION SELECT src, dst FROM {b}"
B_QUERY = "SELECT x.src AS src, y.dst AS dst FROM {a} x JOIN {e} y ON x.dst = y.src"


def closure(edges: list[tuple[int, int]]) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    """The oracle: a and b recomputed by DuckDB's recursive CTE (UNION: set semantics, ends on cycles)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE e (src INTEGER, dst INTEGER)")
    if edges:
        con.executemany("INSERT INTO e VALUES (?, ?)", edges)
    reach = ("WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM e UNION "
             "SELECT r.src, e.dst FROM r JOIN e ON r.dst = e.src) ")
    a = con.execute(reach + "SELECT src, dst FROM r").fetchall()
    b = con.execute(reach + "SELECT DISTINCT r.src, e.dst FROM r JOIN e ON r.dst = e.src").fetchall()
    return Counter(a), Counter(b)


def rows(st: StreamTables, name: str) -> Counter[tuple[int, int]]:
    """The stream table's rows as Spark reads them (``st.read``)."""
    return Counter((r[0], r[1]) for r in st.read(name).collect())


def stored(st: StreamTables, name: str) -> Counter[tuple[int, int]]:
    """The stream table's user rows at its latest version, read by delta-rs: no Spark job (Spark would first
    replay the log of a table delta-rs committed to, seconds per read on a busy machine)."""
    from deltalake import DeltaTable

    table = DeltaTable(st.catalog.get(name).path).to_pyarrow_table(columns=["src", "dst"])
    return Counter(zip(table.column("src").to_pylist(), table.column("dst").to_pylist(), strict=True))


def make_cycle(st: StreamTables, make_source: Callable[..., str], unique_name: Callable[[str], str],
               edges: list[tuple[int, int]]) -> tuple[str, str, str]:
    """Edges e, then a = e (acyclic), b = a JOIN e, then a altered to e UNION b: the cycle a <-> b."""
    e = make_source("edges", "src INT, dst INT", rows=edges or None)
    a, b = unique_name("reach_a"), unique_name("reach_b")
    st.create_stream_table(a, f"SELECT src, dst FROM {e}", schedule=None, refresh_mode="DIFFERENTIAL")
    st.create_stream_table(b, B_QUERY.format(a=a, e=e), schedule=None, refresh_mode="DIFFERENTIAL")
    st.alter_stream_table(a, query=A_QUERY.format(e=e, b=b))
    return e, a, b


@pytest.fixture
def cyclic(spark: Any, tmp_path: Any) -> StreamTables:
    return StreamTables(spark, root=str(tmp_path / "trickle"), allow_circular=True, max_fixpoint_iterations=50)


def test_cycles_are_refused_unless_the_pipeline_allows_them(st: StreamTables, make_source: Callable[..., str],
                                                            unique_name: Callable[[str], str]) -> None:
    e = make_source("edges", "src INT, dst INT", rows=[(1, 2)])
    a, b = unique_name("a"), unique_name("b")
    st.create_stream_table(a, f"SELECT src, dst FROM {e}", schedule=None)
    st.create_stream_table(b, B_QUERY.format(a=a, e=e), schedule=None)
    with pytest.raises(CatalogError, match=rf"cannot read itself \(cycle {a} -> {b} -> {a}\).*allow_circular"):
        st.alter_stream_table(a, query=A_QUERY.format(e=e, b=b))
    assert st.catalog.get(a).query == f"SELECT src, dst FROM {e}"


def test_a_cycle_through_a_non_monotone_edge_is_refused_naming_edge_and_operator(
        cyclic: StreamTables, make_source: Callable[..., str], unique_name: Callable[[str], str]) -> None:
    e = make_source("edges", "src INT, dst INT", rows=[(1, 2)])
    a, b = unique_name("a"), unique_name("b")
    cyclic.create_stream_table(a, f"SELECT src, dst FROM {e}", schedule=None)
    cyclic.create_stream_table(b, f"SELECT src, dst FROM {e} x WHERE NOT EXISTS (SELECT 1 FROM {a} y "
                               "WHERE y.src = x.dst)", schedule=None)
    with pytest.raises(CatalogError, match=rf"non-monotone edge {a} -> {b} \(NOT EXISTS / NOT IN"):
        cyclic.alter_stream_table(a, query=A_QUERY.format(e=e, b=b))
    c = unique_name("c")  # an aggregate's input in the cycle: refused too
    cyclic.create_stream_table(c, f"SELECT src, MAX(dst) AS dst FROM {a} GROUP BY src", schedule=None)
    with pytest.raises(CatalogError, match=rf"non-monotone edge {a} -> {c} \(aggregate input"):
        cyclic.alter_stream_table(a, query=A_QUERY.format(e=e, b=c))
    assert cyclic.catalog.get(a).scc is None


def test_transitive_closure_over_two_tables_matches_recursive_cte_under_inserts_and_deletes(
        cyclic: StreamTables, spark: Any, make_source: Callable[..., str],
        unique_name: Callable[[str], str]) -> None:
    rng = random.Random(2002)
    nodes = range(5)  # few nodes: short paths, so few rounds per refresh (each round is a Spark job)
    edges = {(0, 1), (1, 2), (2, 0)}  # a cycle in the graph from the start
    e, a, b = make_cycle(cyclic, make_source, unique_name, sorted(edges))
    status = {r["name"]: r for r in cyclic.status()}
    assert status[a]["scc"] == status[b]["scc"] is not None
    assert status[a]["stratum"] == status[b]["stratum"] == 0
    assert status[a]["fixpoint_iterations"] >= 2
    deletions_seen = 0
    for cycle in range(20):
        adds = {(rng.choice(nodes), rng.choice(nodes)) for _ in range(rng.randint(0, 2))} - edges
        drops = set(rng.sample(sorted(edges), min(len(edges), rng.randint(0, 2))))
        if cycle % 6 == 5 and edges:  # now and then a deletion alone
            adds, drops = set(), {sorted(edges)[0]}
        if drops:
            spark.sql(f"DELETE FROM {e} WHERE " + " OR ".join(f"(src = {s} AND dst = {d})" for s, d in drops))
        if adds:
            spark.sql(f"INSERT INTO {e} VALUES " + ", ".join(f"({s}, {d})" for s, d in sorted(adds)))
        edges = (edges - drops) | adds
        deletions_seen += len(drops)
        result = cyclic.refresh_stream_table(b if cycle % 2 else a)
        want_a, want_b = closure(sorted(edges))
        assert stored(cyclic, a) == want_a, f"cycle {cycle}: a differs from the closure of {sorted(edges)}"
        assert stored(cyclic, b) == want_b, f"cycle {cycle}: b differs from the closure of {sorted(edges)}"
        assert result.action in ("FULL", "NO_DATA")
        assert result.action == "NO_DATA" or "rounds on DuckDB" in result.reason, result.reason
    assert deletions_seen >= 10
    assert (rows(cyclic, a), rows(cyclic, b)) == closure(sorted(edges))  # as Spark reads them too
    again = cyclic.refresh_stream_table(a)
    assert again.action == "NO_DATA"


def test_deleting_the_edge_a_self_supporting_cycle_needs_empties_both_members(
        cyclic: StreamTables, spark: Any, make_source: Callable[..., str],
        unique_name: Callable[[str], str]) -> None:
    """Seed 002's sketch misses this: with a = e UNION b and b = a (here a JOIN e), deleting the edges must
    remove the rows from both, although each member alone would keep deriving them from the other."""
    e, a, b = make_cycle(cyclic, make_source, unique_name, [(1, 2), (2, 1)])
    assert rows(cyclic, a) == Counter({(1, 2): 1, (2, 1): 1, (1, 1): 1, (2, 2): 1})
    spark.sql(f"DELETE FROM {e} WHERE src = 2")
    before = spark.conf.get("trickle.refresh.localEngine", "auto")
    spark.conf.set("trickle.refresh.localEngine", "off")  # the rounds on Spark here (DuckDB in the oracle)
    try:
        result = cyclic.refresh_stream_table(a)
    finally:
        spark.conf.set("trickle.refresh.localEngine", before)
    assert "rounds on Spark" in result.reason, result.reason
    assert rows(cyclic, a) == Counter({(1, 2): 1})
    assert rows(cyclic, b) == Counter()


def test_the_iteration_limit_puts_every_member_in_error_with_the_count(
        spark: Any, tmp_path: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]) -> None:
    st = StreamTables(spark, root=str(tmp_path / "trickle"), allow_circular=True, max_fixpoint_iterations=3)
    e, a, b = make_cycle(st, make_source, unique_name, [(0, 1)])  # converges in 2 rounds
    spark.sql(f"INSERT INTO {e} VALUES " + ", ".join(f"({i}, {i + 1})" for i in range(1, 8)))
    with pytest.raises(RefreshError, match="within 3 iterations"):  # a path of 8 edges needs 7 rounds
        st.refresh_stream_table(b)
    for name in (a, b):
        d = st.catalog.get(name)
        assert d.status == "ERROR" and d.last_fixpoint_iterations == 3, (name, d.status, d.last_error)
        assert "within 3 iterations" in (d.last_error or "")
    assert rows(st, a) == Counter({(0, 1): 1}), "nothing of the unfinished fixpoint was written"


def test_a_lost_commit_race_recomputes_the_cycle_and_losing_every_one_is_a_clear_error(
        cyclic: StreamTables, spark: Any, make_source: Callable[..., str], unique_name: Callable[[str], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits to the second member after the first member's commit: the refresh starts again
    from the frontiers then committed and both members hold the closure; losing every race is a RefreshError
    that names it, with nothing applied twice."""
    from connectors import delta_sink
    from pipeline import cycles

    e, a, b = make_cycle(cyclic, make_source, unique_name, [(0, 1)])
    spark.sql(f"INSERT INTO {e} VALUES (1, 2)")
    original = cycles._Component._overwrite
    calls: list[str] = []

    def second_loses(self: Any, d: Any, *args: Any) -> None:
        calls.append(d.name)
        if len(calls) == 2:
            raise delta_sink.CommitLost("injected: another writer committed first")
        original(self, d, *args)

    monkeypatch.setattr(cycles._Component, "_overwrite", second_loses)
    result = cyclic.refresh_stream_table(a)
    assert len(calls) >= 3, calls  # both members written, the second lost, then written again
    assert result.action == "FULL", result
    want_a, want_b = closure([(0, 1), (1, 2)])
    assert (stored(cyclic, a), stored(cyclic, b)) == (want_a, want_b)

    def lose(self: Any, d: Any, *args: Any) -> None:
        raise delta_sink.CommitLost("injected")

    monkeypatch.setattr(cycles._Component, "_overwrite", lose)
    spark.sql(f"INSERT INTO {e} VALUES (2, 3)")
    with pytest.raises(RefreshError, match=r"cycle .* lost \d+ commit races in a row"):
        cyclic.refresh_stream_table(b)
    assert (stored(cyclic, a), stored(cyclic, b)) == (want_a, want_b), "nothing of the lost refreshes written"
    assert all("commit races" in (cyclic.catalog.get(m).last_error or "") for m in (a, b))


def test_explain_shows_edge_classes(cyclic: StreamTables, make_source: Callable[..., str],
                                   unique_name: Callable[[str], str]) -> None:
    e, a, b = make_cycle(cyclic, make_source, unique_name, [(1, 2)])
    text = cyclic.explain(b)
    assert f"{a} -> {b}: monotone" in text
    assert "in cycle scc:" in text
    c = unique_name("c")
    cyclic.create_stream_table(c, f"SELECT src, COUNT(*) AS n FROM {a} GROUP BY src", schedule=None)
    assert f"{a} -> {c}: non-monotone (aggregate input)" in cyclic.explain(c)
    assert {r["name"]: r["stratum"] for r in cyclic.status()}[c] == 1


def test_a_conf_file_declares_a_cycle_and_trickle_run_creates_it(
        spark: Any, tmp_path: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]) -> None:
    import threading
    from types import SimpleNamespace

    from pipeline import strata
    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime

    e = make_source("edges", "src INT, dst INT", rows=[(1, 2), (2, 3), (3, 1)])
    a, b = unique_name("reach_a"), unique_name("reach_b")
    conf_file = tmp_path / "conf.yaml"
    conf_file.write_text(f"""
allow_circular: true
sources:
  - name: {e}
    kind: delta
stream_tables:
  - name: {b}
    query: "{B_QUERY.format(a=a, e=e)}"
    schedule: 1h
  - name: {a}
    query: "{A_QUERY.format(e=e, b=b)}"
    schedule: 1h
""")
    conf = load_conf(conf_file)
    events: list[str] = []
    log = SimpleNamespace(event=lambda what, **f: events.append(what), error=events.append,
                          refresh=lambda r, note=None: None)
    st = StreamTables(spark, root=str(tmp_path / "trickle"), allow_circular=conf.spark[strata.ALLOW_CIRCULAR] == "true")
    Runtime(st, conf, log, tmp_path).create_stream_tables(threading.Event())
    assert events == ["created", "created", "cycle_closed"], events
    assert st.catalog.get(a).query == A_QUERY.format(e=e, b=b) and st.catalog.get(a).scc is not None
    want_a, want_b = closure([(1, 2), (2, 3), (3, 1)])
    assert (stored(st, a), stored(st, b)) == (want_a, want_b)
