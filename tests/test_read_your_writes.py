"""Read-your-writes (issue 20, seed 003): a write through the API returns only once every IMMEDIATE stream
table reading its table reflects it, and ``read(consistent=True)`` reads at a frontier covering every source
commit made before the call. Real Spark, real Delta, a running IMMEDIATE streaming query."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from oracle import assert_matches, check_many, compare_rows, format_diff

from connectors.delta_log import DeltaLog
from pipeline import CatalogError, ConsistencyTimeout, QueryError
from pipeline.read_your_writes import consistent_snapshot, normalized, reflected


def _path(spark: Any, table: str) -> str:
    return normalized(spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]["location"])


def test_reader_never_sees_a_stream_table_behind_a_returned_write(spark: Any, st: Any, make_source: Any,
                                                                  unique_name: Any) -> None:
    """A writer thread writes through ``st.write`` (a DataFrame, a SELECT, a MERGE, a DELETE) while a
    reader thread reads: every stream table the reader sees reflects at least the last write that had
    returned before it looked; a consistent read covers the source's latest version at call time, and holds
    the query's rows at the version it reflects. ``agg`` is maintained by its streaming query (the writer
    waits for it); ``top`` reads ``agg`` and runs no query here, so the writer refreshes it itself."""
    src = make_source("ryw_orders", "id INT, region STRING, amount INT",
                      rows=[(1, "n", 10), (2, "s", 5), (3, "n", 1)])
    agg, top = unique_name("ryw_agg"), unique_name("ryw_top")

    def agg_query(ref: str) -> str:
        return f"SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM {ref} GROUP BY region"

    def top_query(ref: str) -> str:
        return f"SELECT region, total FROM ({agg_query(ref)}) WHERE total > 10"

    st.create_stream_table(agg, agg_query(src), schedule=None, refresh_mode="IMMEDIATE")
    st.create_stream_table(top, f"SELECT region, total FROM {agg} WHERE total > 10", schedule=None,
                           refresh_mode="IMMEDIATE")
    st.start(agg)
    path = _path(spark, src)
    writes: list[Any] = [
        spark.createDataFrame([(4, "e", 7), (5, "n", 3)], "id INT, region STRING, amount INT"),
        f"SELECT id + 10 AS id, region, amount * 2 AS amount FROM {src} WHERE region = 's'",
        f"MERGE INTO {src} AS t USING (SELECT 1 AS id) AS s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET amount = t.amount + 100",
        f"DELETE FROM {src} WHERE region = 'e'",
    ]
    acked = [-1]  # the source version of the last write that returned
    done = threading.Event()
    failures: list[str] = []
    looks: list[tuple[str, int, int]] = []  # (table, acked when looking, version of the source reflected)
    consistent: dict[int, int] = {}  # agg's versions a consistent read chose -> the source version reflected

    def writer() -> None:
        try:
            for data in writes:
                acked[0] = st.write(src, data, timeout=300)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            failures.append(f"writer: {type(e).__name__}: {e}")
        finally:
            done.set()

    def look(name: str, before: int, now: Any, what: str) -> None:
        got = now.base.get(path, -1)
        looks.append((name, before, got))
        if got < before:
            failures.append(f"{what} of {name} reflects version {got} of {src}, behind version {before}")

    def reader() -> None:
        """Only log reads while the writer runs (no Spark job competing with it); rows are checked after."""
        try:
            while not done.is_set() and not failures:
                for name in (agg, top):
                    before = acked[0]  # read first: the write it names had returned before we look
                    look(name, before, reflected(st, name), "a plain read")
                latest = DeltaLog(spark, path).latest_version()
                at = consistent_snapshot(st, agg, timeout=300, refresh=False)
                look(agg, latest, at, "a consistent read")
                consistent[at.version] = at.base[path]
                time.sleep(0.2)
        except Exception as e:  # noqa: BLE001
            failures.append(f"reader: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not failures, "\n".join(failures)
    assert any(before >= 0 for _, before, _ in looks), f"the reader never looked after a returned write: {looks}"
    # what a consistent read returned: the stream table at that version holds the query's rows at the source
    # version it reflects (every pair in one Spark job)
    d = st.catalog.get(agg)
    pairs = [(f"SELECT region, n, total FROM delta.`{d.path}` VERSION AS OF {version}",
              agg_query(f"{src} VERSION AS OF {source_version}")) for version, source_version in consistent.items()]
    tagged = " UNION ALL ".join(f"SELECT {i} AS i, '{side}' AS side, * FROM ({q})"
                                for i, pair in enumerate(pairs) for side, q in zip("ae", pair, strict=True))
    got: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
    for r in spark.sql(tagged).collect():
        got.setdefault((r["i"], r["side"]), []).append(tuple(r)[2:])
    for i, pair in enumerate(pairs):
        missing, extra = compare_rows(got.get((i, "e"), []), got.get((i, "a"), []))
        assert not (missing or extra), format_diff(agg, d.names, missing, extra, 0, 0) + f"\n{pair}"
    st.stop(agg)
    # after the last write returned, both tables already reflect it: no refresh, no wait
    assert all(reflected(st, name).base[path] >= acked[0] for name in (agg, top))
    assert not check_many(spark, st, {agg: agg_query(src), top: top_query(src)})


def test_waiting_without_a_maintainer_times_out_with_a_clear_error(spark: Any, st: Any, make_source: Any,
                                                                   unique_name: Any) -> None:
    """No streaming query and ``refresh=False``: the wait gives up naming the versions; the default then
    refreshes in the caller. Misuse is refused before anything waits, and a SUSPENDED table is skipped by
    writers and refused by consistent reads."""
    src = make_source("ryw_clicks", "id INT, page STRING", rows=[(1, "a")])
    per_page = unique_name("ryw_per_page")
    query = f"SELECT page, COUNT(*) AS n FROM {src} GROUP BY page"
    st.create_stream_table(per_page, query, schedule=None, refresh_mode="IMMEDIATE")
    # its first commit (version 0 of the stream table) already says what it reflects
    assert reflected(st, per_page).base == {_path(spark, src): DeltaLog(spark, _path(spark, src)).latest_version()}
    spark.sql(f"INSERT INTO {src} VALUES (2, 'b')")
    version = spark.sql(f"DESCRIBE HISTORY {src} LIMIT 1").collect()[0]["version"]
    with pytest.raises(ConsistencyTimeout, match=rf"did not reflect version {version} of {src} within 0.3 s"):
        st.wait_for(per_page, src, version, timeout=0.3, refresh=False)
    with pytest.raises(ConsistencyTimeout, match="did not reflect the latest versions"):
        st.read(per_page, consistent=True, timeout=0.1, refresh=False)
    got = st.wait_for(per_page, src, version)  # the caller refreshes it
    assert got["base_frontier"][_path(spark, src)] >= version
    assert_matches(spark, st, per_page, query)

    other = make_source("ryw_other", "id INT", rows=[(1,)])
    with pytest.raises(CatalogError, match="does not read"):
        st.wait_for(per_page, other, 1)
    with pytest.raises(CatalogError, match="is a stream table"):
        st.write(per_page, f"SELECT * FROM {per_page}")
    with pytest.raises(QueryError, match="not " + src):
        st.write(src, f"INSERT INTO {other} VALUES (2)")

    st.alter_stream_table(per_page, status="SUSPENDED")
    before = reflected(st, per_page)
    st.write(src, f"INSERT INTO {src} VALUES (3, 'c')")  # returns at once: nobody maintains it
    assert reflected(st, per_page) == before
    with pytest.raises(CatalogError, match="SUSPENDED"):
        st.read(per_page, consistent=True)
