"""Changing a stream table's defining query in place (issue 19, point 1): the API, the CLI and an edited conf
file under a running ``trickle run``. After every alter, and after further source changes and refreshes, the
table equals its (new) query (the oracle); a bad new query leaves the old one in place and running; the
re-initialization is in the history (kept) as REINITIALIZE with its reason; dependents are re-validated."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cluster_env import short_lived_jvm
from oracle import assert_matches

from pipeline import StreamTables
from pipeline.errors import CatalogError, QueryError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _actions(st: Any, name: str) -> list[tuple[str | None, str | None]]:
    """(action, reason) of the table's refreshes that ran (not NO_DATA), oldest first."""
    return [(h["action"], h["reason"]) for h in reversed(st.history(name, limit=100))
            if h["status"] == "OK" and h["action"] != "NO_DATA"]


def test_alter_query_reinitializes_keeps_history_and_revalidates_dependents(
        spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """The API: a new query (new column, new filter, a second source) replaces the contents with a
    REINITIALIZE "query changed", the history before it is kept, the dependent is re-initialized over the new
    columns, and later changes are maintained differentially against the new definition."""
    orders = make_source("orders", "id INT, customer STRING, amount INT",
                         rows=[(1, "ann", 5), (2, "bob", 7), (3, "ann", 1)])
    regions = make_source("regions", "customer STRING, region STRING", rows=[("ann", "north"), ("bob", "south")])
    totals, big = unique_name("totals"), unique_name("big")
    st.create_stream_table(totals, f"SELECT customer, SUM(amount) AS total FROM {orders} GROUP BY customer",
                           refresh_mode="DIFFERENTIAL")
    q_big = f"SELECT * FROM {totals} WHERE total > 2"
    st.create_stream_table(big, q_big, refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {orders} VALUES (4, 'bob', 3)")
    st.refresh_stream_table(big)

    q_new = (f"SELECT r.region, o.customer, SUM(o.amount) AS total, COUNT(*) AS n FROM {orders} o "
             f"JOIN {regions} r ON o.customer = r.customer WHERE o.amount > 1 GROUP BY r.region, o.customer")
    st.alter_stream_table(totals, query=q_new)
    d = st.catalog.get(totals)
    assert d.query == q_new and d.names == ["region", "customer", "total", "n"] and d.reinitialize is None
    assert set(d.sources) == {orders, regions}
    assert_matches(spark, st, totals, q_new, "after the alter")
    # the oracle reads the upstream's user columns (SELECT * of its Delta table shows the hidden ones too)
    q_big_now = f"SELECT region, customer, total, n FROM {totals} WHERE total > 2"
    assert_matches(spark, st, big, q_big_now, "the dependent after the alter")
    acts = _actions(st, totals)
    assert acts[0] == ("FULL", "initial population") and acts[1][0] == "DIFFERENTIAL", acts
    assert acts[-1] == ("REINITIALIZE", "query changed"), acts
    dep = _actions(st, big)[-1]
    assert dep[0] == "REINITIALIZE" and f"source {totals} was altered" in str(dep[1]), dep
    assert st.catalog.get(big).names == ["region", "customer", "total", "n"]

    spark.sql(f"INSERT INTO {orders} VALUES (5, 'ann', 9), (6, 'cy', 4)")
    spark.sql(f"INSERT INTO {regions} VALUES ('cy', 'east')")
    spark.sql(f"UPDATE {orders} SET amount = 20 WHERE id = 2")
    assert st.refresh_stream_table(big).action == "DIFFERENTIAL"
    assert _actions(st, totals)[-1][0] == "DIFFERENTIAL"
    assert_matches(spark, st, totals, q_new, "after changes and a refresh")
    assert_matches(spark, st, big, q_big_now, "the dependent after changes and a refresh")


def test_bad_new_query_keeps_the_old_one_running(spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """An unknown column, a cycle through a dependent, a non-differentiable query for a DIFFERENTIAL table:
    each raises a clear error, and the old definition, contents and refreshes go on untouched."""
    src = make_source("src", "id INT, k STRING, v INT", rows=[(1, "a", 2), (2, "b", 3)])
    up, down = unique_name("up"), unique_name("down")
    q_up = f"SELECT k, SUM(v) AS s FROM {src} GROUP BY k"
    st.create_stream_table(up, q_up, refresh_mode="DIFFERENTIAL")
    st.create_stream_table(down, f"SELECT k FROM {up}", refresh_mode="DIFFERENTIAL")
    before = st.catalog.get(up)
    version = spark.sql(f"DESCRIBE HISTORY delta.`{before.path}`").first()["version"]

    with pytest.raises(QueryError) as e:
        st.alter_stream_table(up, query=f"SELECT k, SUM(nope) AS s FROM {src} GROUP BY k")
    assert "nope" in str(e.value) and "old query stays in place" in str(e.value), e.value
    with pytest.raises(CatalogError) as c:
        st.alter_stream_table(up, query=f"SELECT k, 1 AS s FROM {down}")
    assert f"cycle {up} -> {down} -> {up}" in str(c.value), c.value
    with pytest.raises(Exception) as u:
        st.alter_stream_table(up, query=f"SELECT k, rand() AS s FROM {src}")
    assert "DIFFERENTIAL" in str(u.value), u.value
    with pytest.raises(QueryError):
        st.alter_stream_table(up, query="SELEC nothing")

    after = st.catalog.get(up)
    assert (after.query, after.names, after.sources, after.reinitialize) == (
        before.query, before.names, before.sources, None)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{before.path}`").first()["version"] == version
    spark.sql(f"INSERT INTO {src} VALUES (3, 'a', 10)")
    assert st.refresh_stream_table(up).action == "DIFFERENTIAL"
    assert_matches(spark, st, up, q_up, "the old query after refused alters")


def test_dependent_that_no_longer_compiles_goes_to_error_naming_the_column(
        spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """The new query drops a column a dependent reads: the alter succeeds, the dependent goes to ERROR with a
    message naming the column; altering the dependent to a query over the new columns brings it back."""
    src = make_source("src", "id INT, k STRING, v INT", rows=[(1, "a", 2), (2, "b", 3), (3, "a", 4)])
    up, down = unique_name("up"), unique_name("down")
    st.create_stream_table(up, f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {src} GROUP BY k")
    st.create_stream_table(down, f"SELECT k, total FROM {up} WHERE n > 0")
    q_up = f"SELECT k, COUNT(*) AS n, MAX(v) AS top FROM {src} GROUP BY k"
    st.alter_stream_table(up, query=q_up)
    assert_matches(spark, st, up, q_up, "after the alter")
    row = next(r for r in st.status() if r["name"] == down)
    assert row["status"] == "ERROR", row
    assert "column total of " + up + " went missing" in row["last_error"], row["last_error"]
    assert st.history(down, limit=1)[0]["status"] == "ERROR"

    q_down = f"SELECT k, top FROM {up} WHERE n > 0"
    st.alter_stream_table(down, query=q_down)
    assert next(r for r in st.status() if r["name"] == down)["status"] == "ACTIVE"
    spark.sql(f"INSERT INTO {src} VALUES (4, 'b', 30)")
    st.refresh_stream_table(down)
    assert_matches(spark, st, up, q_up, "after changes")
    assert_matches(spark, st, down, q_down, "the repaired dependent after changes")


def test_cli_alter_query(spark: Any, tmp_path: Path, unique_name: Any, monkeypatch: Any,
                         capsys: Any) -> None:
    """`trickle alter NAME --query SQL`: a bad query exits non-zero with the error and changes nothing (run
    in this process over the test's session: one JVM start less); `--query-file F` in a real `trickle`
    process re-initializes the table (another process: the catalog is the contract)."""
    from pipeline import cli

    warehouse = tmp_path / "wh"
    src = unique_name("src")
    spark.sql(f"CREATE TABLE {src} (id INT, k STRING, v INT) USING delta LOCATION '{warehouse / src}' "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO {src} VALUES (1, 'a', 2), (2, 'b', 3)")
    st = StreamTables(spark, root=str(warehouse / "_trickle"))
    name = unique_name("totals")
    q_old = f"SELECT k, SUM(v) AS s FROM {src} GROUP BY k"
    st.create_stream_table(name, q_old)

    monkeypatch.setattr(cli, "_open", lambda *a, **k: (spark, st))
    monkeypatch.setattr(cli, "_quiet_stop", lambda s: None)
    code = cli.main(["--warehouse", str(warehouse), "alter", name, "--query",
                     f"SELECT k, SUM(missing_col) AS s FROM {src} GROUP BY k"])
    err = capsys.readouterr().err
    assert code != 0 and "error:" in err and "missing_col" in err and "old query stays in place" in err, err
    assert st.catalog.get(name).query == q_old
    assert cli.main(["alter", name]) != 0 and "give at least one of --query" in capsys.readouterr().err
    assert cli.main(["alter", name, "--dialect", "nosuch"]) != 0 and "nosuch" in capsys.readouterr().err
    q_pg = f"SELECT k, SUM(v)::BIGINT AS s FROM {src} GROUP BY k"  # PostgreSQL's cast syntax
    assert cli.main(["--warehouse", str(warehouse), "alter", name, "--dialect", "postgres", "--query", q_pg]) == 0
    assert st.catalog.get(name).dialect == "postgres"
    assert_matches(spark, st, name, f"SELECT k, CAST(SUM(v) AS BIGINT) AS s FROM {src} GROUP BY k", "postgres")
    monkeypatch.undo()

    q_new = f"SELECT k, SUM(v) AS s, MIN(id) AS first_id FROM {src} WHERE v > 2 GROUP BY k"
    (tmp_path / "new.sql").write_text(q_new + "\n")
    env = short_lived_jvm({**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})
    good = subprocess.run([str(Path(sys.executable).parent / "trickle"), "--warehouse", str(warehouse), "alter",
                           name, "--query-file", str(tmp_path / "new.sql")], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"altered stream table {name}" in good.stdout
    assert st.catalog.get(name).query == q_new
    assert _actions(st, name)[-1] == ("REINITIALIZE", "query changed")
    assert_matches(spark, st, name, q_new, "after the CLI alter")
    spark.sql(f"INSERT INTO {src} VALUES (3, 'a', 9), (4, 'c', 1)")
    st.refresh_stream_table(name)
    assert_matches(spark, st, name, q_new, "after changes")


def test_conf_file_edited_under_a_running_trickle_run(
        spark: Any, tmp_path: Path, make_source: Any, unique_name: Any) -> None:
    """The run loop re-reads its edited conf file: a bad query is logged and the old one keeps running; a
    good one (an IMMEDIATE table now joining a second source) is an alter, whose streaming query is restarted
    on the new sources; a changed runtime section is logged as not applied."""
    from pipeline.conf import load_conf
    from pipeline.runtime import Runtime

    orders = make_source("orders", "id INT, customer STRING, amount INT", rows=[(1, "ann", 5), (2, "bob", 7)])
    regions = make_source("regions", "customer STRING, region STRING", rows=[("ann", "north")])
    name = unique_name("live")
    q_old = f"SELECT customer, SUM(amount) AS total FROM {orders} GROUP BY customer"
    q_new = (f"SELECT r.region, SUM(o.amount) AS total FROM {orders} o JOIN {regions} r "
             f"ON o.customer = r.customer GROUP BY r.region")
    conf_file = tmp_path / "pipeline.yaml"

    def write(query: str, tick: float = 0.5) -> None:
        conf_file.write_text(f"""
sources:
  - name: {orders}
    kind: delta
  - name: {regions}
    kind: delta
checkpoints: ckpt
stream_tables:
  - name: {name}
    refresh_mode: IMMEDIATE
    query: "{query}"
runtime:
  tick_seconds: {tick}
""")

    write(q_old)
    events: list[tuple[str, dict[str, Any]]] = []
    errors: list[str] = []
    log = SimpleNamespace(event=lambda what, **f: events.append((what, f)), error=errors.append,
                          refresh=lambda r, note=None: None)
    st = StreamTables(spark, root=str(tmp_path / "trickle"))
    runtime = Runtime(st, load_conf(conf_file), log, tmp_path)
    stop = threading.Event()
    runtime.start_sources()
    runtime.create_stream_tables(stop)
    loop = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
    loop.start()

    def until(cond: Any, what: str, timeout_s: float = 120) -> None:
        deadline = time.time() + timeout_s
        while not cond():
            if time.time() > deadline or not loop.is_alive():
                raise AssertionError(f"{what}: not reached; events {events[-10:]}, errors {errors[-5:]}")
            time.sleep(0.3)

    try:
        until(lambda: name in runtime.immediate, "the streaming query started")
        write(f"SELECT customer, SUM(nope) AS total FROM {orders} GROUP BY customer")
        until(lambda: any("ALTER of stream table" in e for e in errors), "the bad query reported")
        assert any("nope" in e and "old definition keeps running" in e for e in errors), errors
        assert st.catalog.get(name).query == q_old
        spark.sql(f"INSERT INTO {orders} VALUES (3, 'ann', 1)")
        until(lambda: st.catalog.get(name).frontier.get(orders, 0) >= _version(spark, orders), "caught up (old)")
        assert_matches(spark, st, name, q_old, "the old query still running")

        write(q_new, tick=0.4)
        until(lambda: _actions(st, name)[-1] == ("REINITIALIZE", "query changed"), "the alter")
        assert_matches(spark, st, name, q_new, "after the conf alter")
        assert any(w == "conf_not_applied" and "'runtime' changed" in f["detail"] for w, f in events), events
        spark.sql(f"INSERT INTO {regions} VALUES ('bob', 'south')")  # the new source: the restarted query follows it
        until(lambda: (st.catalog.get(name).frontier or {}).get(regions, -1) >= _version(spark, regions),
              "caught up with the new source")
        assert_matches(spark, st, name, q_new, "after a change of the new source")
        spark.sql(f"INSERT INTO {orders} VALUES (4, 'bob', 10)")
        until(lambda: (st.catalog.get(name).frontier or {}).get(orders, -1) >= _version(spark, orders),
              "caught up with the old source")
        assert_matches(spark, st, name, q_new, "after a change of the old source")
    finally:
        stop.set()
        loop.join(60)
        runtime.stop()


def _version(spark: Any, table: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {table}").first()["version"])


def test_conf_changes_say_what_is_applied_and_what_is_not(tmp_path: Path) -> None:
    """No Spark: which edits of a conf file become ALTERs and which are logged as not applied; a touch
    without an edit is no change."""
    from pipeline.conf import load_conf
    from pipeline.conf_reload import Alter, ConfFile, changes

    f = tmp_path / "c.yaml"

    def conf(tables: str, tick: float = 1) -> Any:
        f.write_text(f"stream_tables:\n{tables}\nruntime:\n  tick_seconds: {tick}\n")
        return load_conf(f)

    a = "  - {name: a, query: SELECT x FROM s}\n"
    b = "  - {name: b, query: SELECT y FROM s, schedule: 5m}\n"
    old = conf(a + b)
    watched = ConfFile(f)
    assert not watched.changed()
    f.write_text(f.read_text())
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not watched.changed(), "a touch without an edit"
    new = conf("  - {name: a, query: 'SELECT x, z FROM s'}\n  - {name: b, query: SELECT y FROM s, schedule: 10s}\n"
               "  - {name: c, query: SELECT 1 AS one FROM s}\n", tick=2)
    assert watched.changed() and not watched.changed()
    current = {"a": "SELECT x FROM s", "b": "SELECT y FROM s", "gone": "SELECT 2 AS two FROM s"}
    alters, ignored = changes(old, new, current)
    assert alters == [Alter("a", query="SELECT x, z FROM s"), Alter("b", schedule="10s")]
    assert any("stream table c was added" in n for n in ignored), ignored
    assert any("'runtime' changed" in n for n in ignored), ignored
    alters, ignored = changes(new, conf(a), {**current, "a": "SELECT x, z FROM s", "c": "SELECT 1 AS one FROM s"})
    assert alters == [Alter("a", query="SELECT x FROM s")]
    assert any("stream table b was removed" in n and "not dropped" in n for n in ignored), ignored
    # the catalog already holds the conf's new query (altered from the CLI): nothing to do
    assert changes(old, new, {**current, "a": "SELECT x, z FROM s"})[0] == [Alter("b", schedule="10s")]


def test_alter_restarts_an_immediate_tables_streaming_query(
        spark: Any, st: Any, make_source: Any, unique_name: Any) -> None:
    """An IMMEDIATE table running in this process: the alter stops its streaming query and starts it again
    over the new query's sources (a fresh checkpoint: the old one follows other sources), so a change of the
    source the new query added reaches the table."""
    orders = make_source("orders", "id INT, customer STRING, amount INT", rows=[(1, "ann", 5), (2, "bob", 7)])
    regions = make_source("regions", "customer STRING, region STRING", rows=[("ann", "north")])
    name = unique_name("imm")
    st.create_stream_table(name, f"SELECT customer, SUM(amount) AS total FROM {orders} GROUP BY customer",
                           refresh_mode="IMMEDIATE")
    old = st.start(name)
    q_new = (f"SELECT r.region, SUM(o.amount) AS total FROM {orders} o JOIN {regions} r "
             f"ON o.customer = r.customer GROUP BY r.region")
    st.alter_stream_table(name, query=q_new)
    assert not old.isActive and st._queries[name].isActive and st._queries[name] is not old
    assert_matches(spark, st, name, q_new, "after the alter")
    spark.sql(f"INSERT INTO {regions} VALUES ('bob', 'south')")
    version = _version(spark, regions)
    deadline = time.time() + 180
    while (st.catalog.get(name).frontier or {}).get(regions, -1) < version:
        assert time.time() < deadline and st._queries[name].isActive, st._queries[name].exception()
        time.sleep(0.3)
    assert_matches(spark, st, name, q_new, "after a change of the new source, refreshed by the streaming query")
