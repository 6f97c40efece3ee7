"""What an operator sees (issue 19 point 4): staleness, refresh times and counts, Kafka lag, the DAG, the
progress bar. The arithmetic is tested as pure functions; one test computes the status of a real stream
table from its real refresh history and its source's Delta log."""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline import dag, monitor, progress
from pipeline.conf import load_conf
from pipeline.errors import ConfigError, TrickleError

# ------------------------------------------------------------------------------------------- pure parts


def test_staleness_is_the_age_of_the_oldest_change_not_reflected() -> None:
    # caught up: nothing pending -> 0, however old the reflected change is (a quiet source is not stale)
    s = monitor.staleness(1000.0, {"a": 100.0, "b": 900.0}, {"a": None, "b": None})
    assert s.staleness_s == 0.0 and s.data_age_s == 100.0 and s.behind == {}
    # b has two unreflected changes since t=950 and a one since 980: the oldest decides
    s = monitor.staleness(1000.0, {"a": 970.0, "b": 900.0}, {"a": 980.0, "b": 950.0})
    assert s.staleness_s == 50.0 and s.data_age_s == 30.0 and s.behind == {"a": 980.0, "b": 950.0}
    # never refreshed: unknown, not zero
    assert monitor.staleness(1000.0, {}, {}).staleness_s is None


def _rec(t: float, action: str | None, ms: float, status: str = "OK") -> dict[str, Any]:
    return {"started_at": t, "action": action, "status": status, "duration_ms": ms}


def test_history_stats_last_p95_and_counts_by_action() -> None:
    now = 10_000.0
    recs = [_rec(now - 7200, "FULL", 9000.0)]  # two hours ago: in p95, not in the hour's counts
    recs += [_rec(now - 3000 + i, "DIFFERENTIAL", float(100 + i)) for i in range(19)]  # 100..118 ms
    recs += [_rec(now - 100 + i, "NO_DATA", 2.0) for i in range(5)]  # no work: not in last/p95
    recs += [_rec(now - 50, None, 30.0, status="ERROR"), _rec(now - 40, None, 0.0, status="RETRY")]
    stats = monitor.history_stats(reversed(recs), now)
    assert stats.last_refresh_ms == 118.0 and stats.last_refresh_action == "DIFFERENTIAL"
    # 20 refreshes that did work: nearest rank of 95% is the 19th smallest (118), not the FULL outlier
    assert stats.p95_refresh_ms == 118.0
    assert stats.refreshes_last_hour == {"DIFFERENTIAL": 19, "ERROR": 1, "NO_DATA": 5}
    assert monitor.percentile([5.0], 0.95) == 5.0 and monitor.percentile([], 0.95) is None
    assert monitor.percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_kafka_lag_in_offsets_and_seconds() -> None:
    lag = monitor.KafkaLag()
    lag.observe(100.0, 10)  # the topic ended at offset 10 at t=100
    lag.observe(105.0, 15)
    lag.observe(110.0, 40)
    assert lag.lag(110.0, 40, 40) == (0, 0.0)  # caught up
    # consumed 12: message 12 was produced after t=100 (end 10) and by t=105 (end 15)
    assert lag.lag(112.0, 12, 40) == (28, 7.0)
    assert lag.lag(112.0, 20, 40) == (20, 2.0)
    assert monitor.offsets_total('{"t": {"0": 5, "1": 7}, "u": {"0": 100}}', "t") == 12
    assert monitor.offsets_total({"t": {"0": 3}}) == 3 and monitor.offsets_total(None) is None
    assert monitor.offsets_total("{'t': {'0': 2, '1': 1}}", "t") == 3  # what pyspark 4.1's endOffset gives


def test_seconds_are_formatted_for_a_terminal_column() -> None:
    assert [monitor.fmt_seconds(s) for s in (None, 0.42, 12, 185, 7800, 90000)] == [
        "", "0.4s", "12s", "3m05s", "2h10m", "1d1h"]


def test_progress_line_from_stage_task_counts() -> None:
    line = progress.render([(40, 10, 2), (10, 8, 2)], 12.34, width=10)
    assert line == "[####......]  36% 18/50 tasks, 4 running (2 stages) 12.3s"
    assert "waiting for Spark tasks" in progress.render([], 1.0)
    assert not progress.wanted(False, io.StringIO()) and progress.wanted(True, io.StringIO())


def _def(name: str, sources: list[str], status: str = "ACTIVE", mode: str = "AUTO", schedule: str = "1m") -> Any:
    return SimpleNamespace(name=name, sources={s: None for s in sources}, status=status, refresh_mode=mode,
                           schedule=schedule)


def test_dag_text_and_dot() -> None:
    defs = [_def("totals", ["orders"], mode="IMMEDIATE", schedule=None),
            _def("big", ["totals", "customers"], status="ERROR"),
            _def("region", ["orders", "regions"])]
    g = dag.build(defs, {"orders": "shop.public.orders"})
    text = dag.render_text(g)
    assert text.splitlines() == [
        "customers [delta]",
        "└── big [AUTO, 1m, ERROR]",
        "orders [kafka shop.public.orders]",
        "├── region [AUTO, 1m]",
        "└── totals [IMMEDIATE, -]",
        "    └── big [AUTO, 1m, ERROR]",
        "regions [delta]",
        "└── region [AUTO, 1m]",
    ]
    dot = dag.render_dot(g)
    assert '"orders" -> "totals";' in dot and '"totals" -> "big";' in dot and "fillcolor" in dot
    assert 'color="red"' in dot  # the table in ERROR
    assert dag.layers(g) == {"big": 2, "customers": 0, "orders": 0, "region": 1, "regions": 0, "totals": 1}


def test_dag_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = dag.build([_def("t", ["s"])])
    assert dag.write(g, tmp_path / "g.dot") == "DOT" and "digraph" in (tmp_path / "g.dot").read_text()
    with pytest.raises(TrickleError, match="give a .dot"):
        dag.write(g, tmp_path / "g.txt")
    # no Graphviz and no matplotlib: the error says what to install
    monkeypatch.setattr(dag.shutil, "which", lambda _name: None)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(TrickleError, match="apt-get install graphviz.*pip install matplotlib"):
        dag.write(g, tmp_path / "g.png")


def test_conf_max_staleness_metrics_port_and_webhook(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("stream_tables:\n  - {name: a, query: SELECT 1 AS x, max_staleness: 5m}\n"
                 "  - {name: b, query: SELECT 1 AS x, max_staleness: 90}\n  - {name: c, query: SELECT 1 AS x}\n"
                 "runtime: {metrics_port: 9464, alert_webhook: 'http://127.0.0.1:9/hook'}\n")
    conf = load_conf(f)
    assert [s.max_staleness_seconds for s in conf.stream_tables] == [300.0, 90.0, None]
    assert conf.runtime.metrics_port == 9464 and conf.runtime.alert_webhook == "http://127.0.0.1:9/hook"
    f.write_text("stream_tables:\n  - {name: a, query: SELECT 1 AS x, max_staleness: soon}\n")
    with pytest.raises(ConfigError, match="'a': invalid 'max_staleness' 'soon'"):
        load_conf(f)
    f.write_text("runtime: {alert_webhook: 'ftp://x'}\n")
    with pytest.raises(ConfigError, match="alert_webhook must be an http"):
        load_conf(f)


# ----------------------------------------------------------------------------------- on a real table


def test_status_of_a_real_stream_table_from_its_history_and_its_source_log(
        spark: Any, st: Any, make_source: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_source("orders", "id INT, amount INT", rows=[(1, 10), (2, 20)])
    name = f"tot_{src}"
    st.create_stream_table(name, f"SELECT SUM(amount) AS total FROM {src}", schedule="1h",
                           refresh_mode="DIFFERENTIAL")
    spark.sql(f"INSERT INTO {src} VALUES (3, 30)")
    st.refresh_stream_table(name)  # DIFFERENTIAL
    st.refresh_stream_table(name)  # NO_DATA
    caught_up = monitor.status_rows(spark, st.catalog)[0]
    assert caught_up["staleness_s"] == 0.0 and caught_up["data_age_s"] is not None
    counts = caught_up["refreshes_last_hour"]
    assert counts.get("DIFFERENTIAL") == 1 and counts.get("NO_DATA") == 1, counts
    assert caught_up["last_refresh_action"] == "DIFFERENTIAL" and caught_up["p95_refresh_ms"] > 0
    assert caught_up["consecutive_errors"] == 0

    before = time.time()
    spark.sql(f"INSERT INTO {src} VALUES (4, 40)")  # not refreshed: the table is behind since this commit
    later = time.time() + 30
    row = monitor.status_rows(spark, st.catalog, now=later)[0]
    path = st.catalog.get(name).sources[src].path
    (pending_at,) = row["staleness_s"] and [later - row["staleness_s"]]
    assert before - 2 <= pending_at <= later - 29, (before, pending_at)  # the INSERT's commit time
    assert list(monitor.table_staleness(spark, st.catalog.get(name), later).behind) == [path]

    st.refresh_stream_table(name)
    assert monitor.status_rows(spark, st.catalog)[0]["staleness_s"] == 0.0

    # the CLI's view: the same numbers as a table
    from pipeline import cli

    args = argparse.Namespace(json=False, warehouse_path=Path(st.catalog.root).parent, watch=None)
    cli._print_status(args, st, None)
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:6] == ["name", "status", "refresh_mode", "schedule", "staleness", "data_age"], header
    assert "diff=2" in out and "nodata=1" in out, out

    # --watch: cleared and redrawn in place until Ctrl-C (here: the second sleep is "interrupted")
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", nap)
    assert cli._cmd_status(argparse.Namespace(**{**vars(args), "watch": 0.5}), st, None) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.count("\x1b[H\x1b[2J") == 2 and out.count(name) == 2 and naps == [0.5, 0.5], out


def test_progress_bar_follows_the_tasks_of_a_running_spark_job(spark: Any) -> None:
    out = io.StringIO()
    # 8 tasks of 0.4 s each on 2 cores: long enough for several redraws
    with progress.progress(spark, "refreshing t", True, stream=out, delay_s=0.0) as drawn:
        spark.range(0, 8, 1, 8).selectExpr("reflect('java.lang.Thread', 'sleep', CAST(400 AS BIGINT))").collect()
    assert drawn, "no progress line was drawn"
    assert any("/8 tasks" in line for line in drawn), drawn
    assert all(line.startswith("refreshing t [") for line in drawn)
    assert out.getvalue().endswith("\r\x1b[2K")  # erased when done


def test_cli_options_of_the_operator_commands() -> None:
    from pipeline.cli import build_parser

    p = build_parser()
    assert p.parse_args(["status"]).watch is None
    assert p.parse_args(["status", "--watch"]).watch == 2.0
    assert p.parse_args(["status", "--watch", "10"]).watch == 10.0
    assert p.parse_args(["dag", "--out", "g.png"]).out == "g.png"
    assert p.parse_args(["run", "c.yaml", "--metrics-port", "9464"]).metrics_port == 9464
    assert p.parse_args(["run", "c.yaml"]).metrics_port is None  # the conf's runtime.metrics_port then
    assert p.parse_args(["refresh", "t", "--progress"]).progress
    assert p.parse_args(["create", "t", "--query", "SELECT 1", "--progress"]).progress


def test_dag_png_with_matplotlib_when_graphviz_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib  # noqa: F401 - a test dependency: this test must not skip itself
    monkeypatch.setattr(dag.shutil, "which", lambda _name: None)
    g = dag.build([_def("t", ["s"]), _def("u", ["t", "s"], status="ERROR")])
    assert dag.write(g, tmp_path / "g.png") == "matplotlib"
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
