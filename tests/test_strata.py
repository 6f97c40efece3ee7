"""Strata and skipping (seed 002 S-2, issue 20): the graph analysis (pure) and a three-layer DAG whose
first layer's refresh applies no net row, so that the layers below record NO_DATA without a Spark job.

Spark's delta job is what the skip saves, so this module runs with the local engine off (with it on, a
small delta runs on DuckDB and no layer would start a Spark job either way)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import local_engine_mode
from oracle import assert_matches

from pipeline import StreamTables, strata
from pipeline.catalog import SourceInfo

_spark_delta_job = local_engine_mode("off")


@dataclass
class _Def:
    name: str
    sources: dict[str, SourceInfo]
    edge_classes: dict[str, str] = field(default_factory=dict)


def _graph(edges: dict[str, dict[str, str]]) -> list[_Def]:
    """reader -> {source: edge class}; sources that are no reader are base tables."""
    return [_Def(r, {s: SourceInfo(f"/{s}", "stream_table" if s in edges else "delta") for s in srcs}, srcs)
            for r, srcs in edges.items()]


M, N = "monotone", "non-monotone (aggregate input)"


@pytest.mark.parametrize("edges, want", [
    ({"a": {"base": M}, "b": {"a": M}, "c": {"b": M}}, {"a": 0, "b": 0, "c": 0}),  # 002:L580: monotone chain
    ({"a": {"base": M}, "b": {"a": M}, "c": {"b": N}}, {"a": 0, "b": 0, "c": 1}),
    ({"a": {"base": M}, "b": {"a": M}, "c": {"a": N}, "d": {"b": M, "c": M}},  # the diamond of 002:L590
     {"a": 0, "b": 0, "c": 1, "d": 1}),
    ({"a": {"base": M, "b": M}, "b": {"a": M}, "c": {"b": N}}, {"a": 0, "b": 0, "c": 1}),  # a monotone cycle
])
def test_strata_are_the_minimum_stratification(edges: dict[str, dict[str, str]], want: dict[str, int]) -> None:
    assert strata.analyse(_graph(edges)).stratum == want


def test_sccs_and_the_check() -> None:
    cyclic = strata.analyse(_graph({"a": {"e": M, "b": M}, "b": {"a": M}, "c": {"b": M}}))
    assert cyclic.scc == {"a": "scc:a", "b": "scc:a", "c": None}
    strata.check(cyclic, True, "a")
    with pytest.raises(Exception, match="allow_circular"):
        strata.check(cyclic, False, "a")
    negated = strata.analyse(_graph({"a": {"e": M, "b": M}, "b": {"a": "non-monotone (EXCEPT right side)"}}))
    with pytest.raises(Exception, match=r"non-monotone edge a -> b \(EXCEPT right side in the query of b\)"):
        strata.check(negated, True, "b")
    deep = {f"t{i}": {f"t{i - 1}" if i else "e": M} for i in range(3000)}  # no recursion limit on a long chain
    assert strata.analyse(_graph(deep)).stratum["t2999"] == 0


def _jobs(spark: Any, tag: str, run: Callable[[], Any]) -> tuple[Any, int]:
    """``run()`` and the number of Spark jobs it started (its thread's job group)."""
    sc = spark.sparkContext
    sc.setJobGroup(tag, tag)
    try:
        return run(), len(sc.statusTracker().getJobIdsForGroup(tag))
    finally:
        sc.setJobGroup("", "")


def test_a_layer_whose_refresh_applies_no_row_stops_the_wave_below_it(
        st: StreamTables, spark: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]) -> None:
    base = make_source("base", "k INT, v INT", rows=[(1, 5), (1, 3), (2, 7)])
    l1, l2, l3 = unique_name("layer1"), unique_name("layer2"), unique_name("layer3")
    st.create_stream_table(l1, f"SELECT k, SUM(v) AS s FROM {base} GROUP BY k", schedule=None,
                           refresh_mode="DIFFERENTIAL")
    st.create_stream_table(l2, f"SELECT k, s * 2 AS s2 FROM {l1} WHERE s > 0", schedule=None,
                           refresh_mode="DIFFERENTIAL")
    st.create_stream_table(l3, f"SELECT k, s2 + 1 AS s3 FROM {l2}", schedule=None, refresh_mode="DIFFERENTIAL")
    # a change that cancels out in layer one: group 1's sum stays 8 (its row is re-written with the same values)
    spark.sql(f"UPDATE {base} SET v = v + 1 WHERE v = 5")
    spark.sql(f"UPDATE {base} SET v = v - 1 WHERE v = 3")
    first, jobs1 = _jobs(spark, "layer1", lambda: st.refresher._refresh_tree(l1, set(), {}))
    assert first.action == "DIFFERENTIAL" and jobs1 > 0, (first, jobs1)  # the counting sees a refresh's jobs
    assert first.rows_updated == 1  # a commit, but of the same values
    spark.conf.set(strata.SKIP_QUIET, "false")  # without the skip, layer two runs its delta job (as before)
    try:
        spark.sql(f"UPDATE {base} SET v = v + 1 WHERE v = 6")
        spark.sql(f"UPDATE {base} SET v = v - 1 WHERE v = 2")
        st.refresher._refresh_tree(l1, set(), {})
        unskipped, jobs = _jobs(spark, "unskipped", lambda: st.refresher._refresh_tree(l2, {l1}, {}))
        assert unskipped.action == "DIFFERENTIAL" and jobs > 0, (unskipped, jobs)
    finally:
        spark.conf.unset(strata.SKIP_QUIET)
    spark.sql(f"UPDATE {base} SET v = v - 1 WHERE k = 1 AND v = 7")  # and once more, with the skip
    spark.sql(f"UPDATE {base} SET v = v + 1 WHERE k = 1 AND v = 1")
    assert st.refresher._refresh_tree(l1, set(), {}).rows_updated == 1
    for name in (l2, l3):
        result, jobs = _jobs(spark, name, lambda name=name: st.refresher._refresh_tree(name, {l1, l2} - {name}, {}))
        assert result.action == "NO_DATA", (name, result)
        assert jobs == 0, f"{name} ran {jobs} Spark jobs after a layer-one refresh that applied no row"
    assert "net to no changed row" in st.history(l2, 1)[-1]["reason"]
    # the skip moved layer two's frontier on: its next refresh reads nothing again
    assert st.refresh_stream_table(l3).action == "NO_DATA"
    # and a change that does not cancel still flows through every layer
    spark.sql(f"INSERT INTO {base} VALUES (2, 1)")
    st.refresh_stream_table(l3)
    for name, query in ((l2, f"SELECT k, SUM(v) * 2 AS s2 FROM {base} GROUP BY k"),
                        (l3, f"SELECT k, SUM(v) * 2 + 1 AS s3 FROM {base} GROUP BY k")):
        assert_matches(spark, st, name, query)


def test_a_conf_file_opts_in_to_cycles(tmp_path: Any) -> None:
    from pipeline.conf import load_conf
    from pipeline.errors import ConfigError

    tables = ("stream_tables:\n"
              "  - {name: reach_a, query: 'SELECT src, dst FROM edges UNION SELECT src, dst FROM reach_b'}\n"
              "  - {name: reach_b, query: 'SELECT a.src, e.dst FROM reach_a a JOIN edges e ON a.dst = e.src'}\n")
    path = tmp_path / "conf.yaml"
    path.write_text(tables)
    with pytest.raises(ConfigError, match="cycle reach_a -> reach_b -> reach_a"):
        load_conf(path)
    path.write_text("allow_circular: true\nmax_fixpoint_iterations: 7\n" + tables)
    conf = load_conf(path)
    assert conf.spark[strata.ALLOW_CIRCULAR] == "true" and conf.spark[strata.MAX_ITERATIONS] == "7"
    path.write_text("allow_circular: true\nmax_fixpoint_iterations: 0\n" + tables)
    with pytest.raises(ConfigError, match="max_fixpoint_iterations' must be an integer from 1 to 10000"):
        load_conf(path)
    # trickle run creates reach_a over its branch that reads no peer, then closes the cycle with an ALTER
    assert strata.bootstrap_query(conf.stream_tables[0].query, {"reach_b"}) == "SELECT src, dst FROM edges"
    assert strata.bootstrap_query(conf.stream_tables[1].query, {"reach_a"}) is None
