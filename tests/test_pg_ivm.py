"""pg_ivm compatibility (issue 20, seed 003 Phase 2): the examples of pg_ivm's README, translated to Spark
SQL and run through ``create_immv`` / ``refresh_immv`` / ``get_immv_def`` / ``pg_ivm_immv`` and the CLI, with
the oracle comparing every IMMV with its query. The pgbench tables are scaled down to 30 accounts in 3
branches; pg_ivm's expected results are rescaled accordingly."""

from __future__ import annotations

import json
from typing import Any

from oracle import check_many

from pipeline import cli


def _cli(capsys: Any, st: Any, *argv: str) -> str:
    """Run one ``trickle`` command in this process, on ``st``'s catalog; its standard output."""
    args = cli.build_parser().parse_args(list(argv))
    capsys.readouterr()
    assert cli._COMPAT_HANDLERS[args.command](args, st, None) == cli.EXIT_OK
    return capsys.readouterr().out


def test_pg_ivm_readme_examples(spark: Any, st: Any, make_source: Any, unique_name: Any, capsys: Any) -> None:
    # SELECT pgivm.create_immv('m', 'SELECT * FROM t0');  -- 3; INSERT INTO t0 VALUES (4); m is updated
    t0 = make_source("t0", "i INT", rows=[(1,), (2,), (3,)])
    m = unique_name("m")
    assert _cli(capsys, st, "create-immv", m, f"SELECT * FROM {t0}").strip() == "3"
    st.write(t0, f"INSERT INTO {t0} VALUES (4)")
    assert sorted(tuple(r) for r in st.read(m).collect()) == [(1,), (2,), (3,), (4,)]

    accounts = make_source("pgbench_accounts", "aid INT, bid INT, abalance INT, filler STRING",
                           rows=[(aid, (aid - 1) // 10 + 1, 0, None) for aid in range(1, 31)])
    branches = make_source("pgbench_branches", "bid INT, bbalance INT, filler STRING",
                           rows=[(bid, 0, None) for bid in (1, 2, 3)])

    # SELECT pgivm.create_immv('immv', 'SELECT a.aid, b.bid, a.abalance, b.bbalance FROM pgbench_accounts a
    #   JOIN pgbench_branches b USING(bid)');  -- every account
    immv = unique_name("immv")
    immv_def = (f"SELECT a.aid, b.bid, a.abalance, b.bbalance FROM {accounts} a JOIN {branches} b USING(bid)")
    assert st.create_immv(immv, immv_def, start=False) == 30
    # UPDATE pgbench_accounts SET abalance = 1234 WHERE aid = 1; SELECT * FROM immv WHERE aid = 1;
    st.write(accounts, f"UPDATE {accounts} SET abalance = 1234 WHERE aid = 1")
    assert [tuple(r) for r in st.read(immv).where("aid = 1").collect()] == [(1, 1, 1234, 0)]

    # SELECT pgivm.create_immv('immv_agg', 'SELECT bid, count(*), sum(abalance), avg(abalance)
    #   FROM pgbench_accounts JOIN pgbench_branches USING(bid) GROUP BY bid');  -- one row per branch
    # (Spark names count(*) "count(1)": the columns get pg's names as aliases)
    immv_agg = unique_name("immv_agg")
    agg_def = (f"SELECT bid, count(*) AS count, sum(abalance) AS sum, avg(abalance) AS avg FROM {accounts} "
               f"JOIN {branches} USING(bid) GROUP BY bid")
    assert st.create_immv(immv_agg, agg_def) == 3  # maintained by its streaming query from now on
    assert st.refresh_immv(immv_agg, True) == 3
    assert any(h["action"] == "REINITIALIZE" and "refresh_immv" in h["reason"] for h in st.history(immv_agg, 5))
    # UPDATE pgbench_accounts SET abalance = abalance + 1000 WHERE aid = 12 AND bid = 2;
    st.write(accounts, f"UPDATE {accounts} SET abalance = abalance + 1000 WHERE aid = 12 AND bid = 2")
    assert [tuple(r) for r in st.read(immv_agg).where("bid = 2").collect()] == [(2, 10, 1000, 100.0)]
    queries = {m: f"SELECT * FROM {t0}", immv: immv_def, immv_agg: agg_def}
    assert not check_many(spark, st, queries)

    # SELECT immvrelid AS immv, pgivm.get_immv_def(immvrelid) AS immv_def FROM pgivm.pg_ivm_immv;
    st.pg_ivm_immv()
    listing = "SELECT immvrelid AS immv, get_immv_def(immvrelid) AS immv_def FROM pg_ivm_immv"
    assert dict(tuple(r) for r in spark.sql(listing).collect()) == queries
    assert st.get_immv_def(immv_agg) == agg_def
    assert _cli(capsys, st, "get-immv-def", immv).strip() == immv_def
    # DROP TABLE immv;  -- gone from the catalog
    st.drop_stream_table(immv)
    st.pg_ivm_immv()
    assert {r["immv"] for r in spark.sql(listing).collect()} == {m, immv_agg}

    # refresh_immv(name, false): unpopulated, empty, no longer maintained; true: repopulated and maintained
    assert st.refresh_immv(immv_agg, False) == 0
    assert st.read(immv_agg).count() == 0
    populated = {r["immvrelid"]: r["ispopulated"] for r in spark.table("pg_ivm_immv").collect()}
    assert populated == {m: True, immv_agg: False}
    st.write(accounts, f"UPDATE {accounts} SET abalance = abalance - 5 WHERE bid = 3")  # nothing waits for it
    assert st.read(immv_agg).count() == 0
    cli_rows = json.loads(_cli(capsys, st, "pg-ivm-immv", "--json"))
    assert {r["immvrelid"]: r["ispopulated"] for r in cli_rows} == populated
    assert st.refresh_immv(immv_agg, True) == 3  # holds the update made while it was unpopulated
    assert {r["name"]: r["running"] for r in st.status()}[immv_agg]
    assert not check_many(spark, st, {immv_agg: agg_def})
    assert spark.sql(f"SELECT ispopulated FROM pg_ivm_immv WHERE immvrelid = '{immv_agg}'").collect()[0][0]

    # a writer outside the API: `trickle wait-for` after its own commit
    spark.sql(f"INSERT INTO {t0} VALUES (5)")
    version = spark.sql(f"DESCRIBE HISTORY {t0} LIMIT 1").collect()[0]["version"]
    out = json.loads(_cli(capsys, st, "wait-for", m, t0, str(version), "--json"))
    assert max(out["base_frontier"].values()) >= version
    assert sorted(tuple(r) for r in st.read(m).collect()) == [(1,), (2,), (3,), (4,), (5,)]
