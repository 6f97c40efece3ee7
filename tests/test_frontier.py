"""Frontier protocol: crash recovery, DAG ordering, cycles, and IMMEDIATE restarts."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from pipeline import CatalogError


def rows(df: Any) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def test_crash_between_commit_and_catalog_is_recovered(spark: Any, st: Any, make_source: Any) -> None:
    """A failure injected after the stream table's commit and before the catalog update loses nothing
    and applies nothing twice: the next refresh continues from the frontier in the commit."""
    src = make_source("orders", "id INT, region STRING, amount INT", rows=[(1, "n", 10), (2, "s", 5)])
    query = f"SELECT region, SUM(amount) AS total, COUNT(*) AS n FROM {src} GROUP BY region"
    st.create_stream_table("totals", query, refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} VALUES (3, 'n', 7)")

    def boom(name: str) -> None:
        raise RuntimeError("injected crash after commit")

    st.refresher.after_commit = boom
    with pytest.raises(RuntimeError, match="injected"):
        st.refresh_stream_table("totals")
    st.refresher.after_commit = lambda name: None
    # the data is already in (the commit happened) and must not be applied a second time
    assert rows(st.read("totals")) == rows(spark.sql(query))
    r = st.refresh_stream_table("totals")
    assert r.action == "NO_DATA" and r.recovered
    assert rows(st.read("totals")) == rows(spark.sql(query))
    hist = st.history("totals")
    assert any("recovered" in (h.get("reason") or "") for h in hist)
    spark.sql(f"UPDATE {src} SET amount = amount + 1 WHERE region = 'n'")
    r = st.refresh_stream_table("totals")
    assert r.action == "DIFFERENTIAL"
    assert rows(st.read("totals")) == rows(spark.sql(query))


def test_downstream_refresh_brings_upstream_along(spark: Any, st: Any, make_source: Any) -> None:
    src = make_source("events", "id INT, k STRING, v INT", rows=[(1, "a", 1), (2, "b", 2), (3, "a", 3)])
    st.create_stream_table("per_k", f"SELECT k, SUM(v) AS s FROM {src} GROUP BY k", refresh_mode="DIFFERENTIAL")
    st.create_stream_table("big_k", "SELECT k, s FROM per_k WHERE s > 2", refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} VALUES (4, 'b', 5), (5, 'c', 1)")
    spark.sql(f"DELETE FROM {src} WHERE id = 1")
    r = st.refresh_stream_table("big_k")
    assert r.action == "DIFFERENTIAL"
    expected = rows(spark.sql(f"SELECT k, s FROM (SELECT k, SUM(v) AS s FROM {src} GROUP BY k) WHERE s > 2"))
    assert rows(st.read("big_k")) == expected
    assert st.history("per_k")[0]["action"] == "DIFFERENTIAL"
    with pytest.raises(CatalogError, match="big_k"):
        st.drop_stream_table("per_k")
    st.drop_stream_table("big_k")
    st.drop_stream_table("per_k")


def test_self_reference_is_a_cycle(st: Any, make_source: Any) -> None:
    src = make_source("t", "id INT")
    before = st.status()
    with pytest.raises(CatalogError, match="cycle"):
        st.create_stream_table("loop", f"SELECT id FROM loop JOIN {src} USING (id)")
    assert st.status() == before


def _wait_for(pred: Any, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError("condition not reached in time")


def test_immediate_mode_follows_changes_and_resumes_after_restart(spark: Any, st: Any, make_source: Any) -> None:
    src = make_source("clicks", "id INT, page STRING", rows=[(1, "a"), (2, "b")])
    query = f"SELECT page, COUNT(*) AS n FROM {src} GROUP BY page"
    st.create_stream_table("clicks_per_page", query, refresh_mode="IMMEDIATE")
    st.start("clicks_per_page")
    spark.sql(f"INSERT INTO {src} VALUES (3, 'a'), (4, 'c')")
    _wait_for(lambda: rows(st.read("clicks_per_page")) == rows(spark.sql(query)))
    st.stop("clicks_per_page")
    # changes while stopped are picked up after the restart, exactly once
    spark.sql(f"DELETE FROM {src} WHERE page = 'b'")
    spark.sql(f"INSERT INTO {src} VALUES (5, 'a')")
    st.start("clicks_per_page")
    _wait_for(lambda: rows(st.read("clicks_per_page")) == rows(spark.sql(query)))
    spark.sql(f"UPDATE {src} SET page = 'c' WHERE id = 1")
    _wait_for(lambda: rows(st.read("clicks_per_page")) == rows(spark.sql(query)))
    st.stop("clicks_per_page")
    actions = [h["action"] for h in st.history("clicks_per_page", limit=50)]
    assert "DIFFERENTIAL" in actions and "FULL" in actions
