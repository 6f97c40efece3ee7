"""Spark Declarative Pipelines projects run by spark-trickle (pipeline/sdp.py).

The proof runs the example project (examples/sdp_shop: two Delta sources, a temporary view, three
materialized views in a chain, one of them a Python file) twice over the same sources, through several
change cycles (inserts, updates, deletes, NULLs, duplicate rows): with the real ``spark-pipelines run``,
which recomputes every materialized view, and with spark-trickle, which refreshes them. After each cycle
both must hold the same rows (multisets), and every trickle refresh must have been DIFFERENTIAL.

How ``spark-pipelines`` runs here: it is a Spark Connect client (``SparkPipelines`` hands its arguments to
spark-submit with ``--remote``; the Python CLI loads the spec and registers the files with the server,
which runs the pipeline). Started alone it starts a local Spark Connect server, a second JVM with Delta to
configure, ~20 s per run on two cores. So the test starts a Spark Connect server inside the suite's shared
JVM (``SparkConnectService.start``, the jar ships with pyspark) and runs the unchanged ``spark-pipelines``
command with ``--remote sc://127.0.0.1:<port>`` (the first cycle; the later ones run the Python program it
launches directly, see :func:`_spark_pipelines`): SDP's own CLI, registration and execution, over the same
Delta sources. Its tables go to their own database (the spec's ``database``), whose tables point at the
sources' locations, so both runs read the same data and write different tables.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oracle import compare_rows, format_diff, unique_suffix

from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "sdp_shop"
VENV_BIN = Path(sys.executable).parent
NAMES = ("shop_orders", "shop_customers", "paid_orders", "customer_totals", "region_totals", "top_regions")
TABLES = ("customer_totals", "region_totals", "top_regions")  # in dependency order

#: Change cycles on the sources ({o}: orders, {c}: customers): inserts with NULLs in every role and
#: duplicate rows (a duplicated customer doubles its orders in the join); updates of the filter column, the
#: join key and the group key (to and from NULL); deletes, and duplicates inserted again.
CYCLES = [
    ["INSERT INTO {o} VALUES (7, 1, 80.00, 'paid'), (8, 3, 15.50, 'paid'), (8, 3, 15.50, 'paid'), "
     "(9, NULL, 40.00, 'paid'), (10, 4, NULL, 'paid'), (11, 1, 99.99, NULL)",
     "INSERT INTO {c} VALUES (4, 'dora', 'south'), (5, 'erin', NULL), (5, 'erin', NULL)"],
    ["UPDATE {o} SET status = 'paid' WHERE id = 3",
     "UPDATE {o} SET customer_id = 5 WHERE id = 7",
     "UPDATE {c} SET region = 'north' WHERE id = 2",
     "UPDATE {c} SET region = NULL WHERE id = 4"],
    ["DELETE FROM {o} WHERE id IN (1, 8)",
     "DELETE FROM {c} WHERE id = 3",
     "INSERT INTO {o} VALUES (12, 5, 120.00, 'paid'), (12, 5, 120.00, 'paid')"],
]


class _Log:
    """The ``log`` of pipeline.sdp.create (cli._Logger's shape): events kept for the asserts."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, what: str, **fields: Any) -> None:
        self.events.append((what, fields))


@pytest.fixture(scope="module")
def connect_url(spark: Any) -> Iterator[str]:
    """A Spark Connect server in the shared JVM, on a free port, for ``spark-pipelines --remote``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sc = spark.sparkContext._jsc.sc()
    sc.conf().set("spark.connect.grpc.binding.address", "127.0.0.1")
    sc.conf().set("spark.connect.grpc.binding.port", str(port))
    service = spark._jvm.org.apache.spark.sql.connect.service.SparkConnectService
    service.start(sc)
    yield f"sc://127.0.0.1:{port}"
    # stop(timeout: Option[Long] = None, unit: Option[TimeUnit] = None): Scala defaults, by name from py4j
    service.stop(getattr(service, "stop$default$1")(), getattr(service, "stop$default$2")())


def _copy_project(dest: Path, sfx: str, database: str | None = None) -> Path:
    """The example project with every name suffixed (the session catalog is shared by the whole suite),
    its storage in ``dest``, and for the reference run its own database."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    for f in dest.rglob("*"):
        if f.suffix in (".sql", ".py"):
            text = f.read_text()
            for n in NAMES:
                text = re.sub(rf"\b{n}\b", f"{n}_{sfx}", text)
            f.write_text(text)
    spec = dest / "spark-pipeline.yml"
    text = re.sub(r"(?m)^storage: .*$", f"storage: {(dest / 'storage').as_uri()}", spec.read_text())
    spec.write_text(text + (f"database: {database}\n" if database else ""))
    return spec


def _spark_pipelines(url: str, spec: Path, launcher: bool) -> None:
    """``spark-pipelines run`` against the server at ``url``. With ``launcher`` the real command; else the
    program it ends up running, ``pyspark/pipelines/cli.py`` with ``SPARK_REMOTE`` set (what spark-submit
    does for ``--remote``): the same SDP client, without the launcher JVM that costs ~15 s on a busy
    two-core machine."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if launcher:
        cmd = [str(VENV_BIN / "spark-pipelines"), "--remote", url, "run", "--spec", str(spec)]
    else:
        import pyspark.pipelines

        env["SPARK_REMOTE"] = url
        cmd = [sys.executable, str(Path(pyspark.pipelines.__file__).parent / "cli.py"), "run", "--spec", str(spec)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Run is COMPLETED" in r.stdout, f"spark-pipelines failed:\n{r.stdout}\n{r.stderr}"


def _assert_same(spark: Any, st: Any, ref_db: str, name: str, context: str) -> None:
    spark.catalog.refreshTable(f"{ref_db}.{name}")  # SDP rewrote its files: drop the cached listing
    expected = spark.table(f"{ref_db}.{name}").collect()
    actual = st.read(name).collect()
    missing, extra = compare_rows(expected, actual)
    assert not missing and not extra, f"{context}: " + format_diff(
        name, st.read(name).columns, missing, extra, len(expected), len(actual))


def test_sdp_project_matches_spark_pipelines(spark: Any, st: Any, tmp_path: Path, connect_url: str) -> None:
    from pipeline.sdp import create, load_project

    sfx = unique_suffix()
    n = {k: f"{k}_{sfx}" for k in NAMES}
    ref_db = f"sdp_ref_{sfx}"
    o, c = n["shop_orders"], n["shop_customers"]
    cdf = "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    spark.sql(f"CREATE TABLE {o} (id INT, customer_id INT, amount DECIMAL(10,2), status STRING) USING delta {cdf}")
    spark.sql(f"CREATE TABLE {c} (id INT, name STRING, region STRING) USING delta {cdf}")
    spark.sql(f"INSERT INTO {c} VALUES (1, 'ann', 'north'), (2, 'bob', 'south'), (3, 'cy', NULL)")
    spark.sql(f"INSERT INTO {o} VALUES (1, 1, 120.00, 'paid'), (2, 2, 30.00, 'paid'), (3, 2, 50.00, 'open'), "
              "(4, 3, 70.00, 'paid'), (5, 1, 10.00, 'refunded'), (6, 1, 10.00, 'paid')")
    spark.sql(f"CREATE DATABASE {ref_db}")
    for src in (o, c):  # the reference run reads the same Delta tables through its own database
        location = spark.sql(f"DESCRIBE DETAIL {src}").collect()[0]["location"]
        spark.sql(f"CREATE TABLE {ref_db}.{src} USING delta LOCATION '{location}'")
    ref_spec = _copy_project(tmp_path / "project_sdp", sfx, database=ref_db)
    project = load_project(_copy_project(tmp_path / "project_trickle", sfx), spark)

    specs = {s.name: s for s in project.conf.stream_tables}
    assert {k: (s.refresh_mode, s.schedule) for k, s in specs.items()} == {
        n["customer_totals"]: ("DIFFERENTIAL", "30s"),   # TBLPROPERTIES
        n["region_totals"]: ("DIFFERENTIAL", "CALCULATED"),  # COMMENT
        n["top_regions"]: ("DIFFERENTIAL", "30s"),  # a Python file's table_properties
    }
    assert [v.name for v in project.views] == [n["paid_orders"]]
    assert sorted(s.name for s in project.conf.sources) == sorted([o, c])

    log = _Log()
    create(st, project, log)
    assert [f["name"] for what, f in log.events if what == "created"] == [n[t] for t in TABLES]
    assert st.catalog.get(n["customer_totals"]).views == [n["paid_orders"]]  # inlined, as views are

    for cycle, changes in enumerate([[], *CYCLES]):
        for sql in changes:
            spark.sql(sql.format(o=o, c=c))
        _spark_pipelines(connect_url, ref_spec, launcher=cycle == 0)
        for t in TABLES:
            if cycle:
                r = st.refresh_stream_table(n[t])
                assert r.action == "DIFFERENTIAL", f"cycle {cycle}: {n[t]}: {r.action} ({r.reason})"
            _assert_same(spark, st, ref_db, n[t], f"cycle {cycle}")
    assert st.read(n["top_regions"]).count() > 0  # the chain's end is not trivially empty


# ------------------------------------------------------------------------------ what does not map


def _project(tmp_path: Path, files: dict[str, str], spec_extra: str = "") -> Path:
    (tmp_path / "t").mkdir()
    for name, text in files.items():
        (tmp_path / "t" / name).write_text(text)
    spec = tmp_path / "spark-pipeline.yml"
    spec.write_text(f"name: p\nstorage: {(tmp_path / 's').as_uri()}\nlibraries:\n  - glob:\n"
                    f"      include: t/**\n{spec_extra}")
    return spec


@pytest.mark.parametrize("files, message", [
    ({"a.sql": "CREATE MATERIALIZED VIEW ok AS SELECT 1 AS x;\n\nCREATE VIEW pv AS SELECT * FROM ok;"},
     r"t/a\.sql:3: 'CREATE VIEW pv AS .*': not supported: a persisted view"),
    ({"a.sql": "CREATE MATERIALIZED VIEW m AS\n  SELECT * FROM STREAM(src);"},
     r"t/a\.sql:1: CREATE MATERIALIZED VIEW m: reads STREAM\(src\)"),
    ({"a.sql": "SET spark.sql.shuffle.partitions = 2;"},
     r"t/a\.sql:1: .*per-flow Spark settings are not mapped"),
    ({"a.sql": "CREATE STREAMING TABLE s;\nCREATE FLOW f1 AS INSERT INTO s BY NAME SELECT * FROM STREAM(a);\n"
               "CREATE FLOW f2 AS INSERT INTO s BY NAME SELECT * FROM STREAM(b);"},
     r"t/a\.sql:3: CREATE FLOW f2: s is fed by 2 flows"),
    ({"a.sql": "CREATE MATERIALIZED VIEW m TBLPROPERTIES ('trickle.schedule' = 'often') AS SELECT 1 AS x;"},
     r"t/a\.sql:1: CREATE MATERIALIZED VIEW m: invalid 'schedule' 'often'"),
    ({"m.py": "from pyspark import pipelines as dp\n\n@dp.materialized_view\ndef m():\n"
              "    return spark.range(10)\n"},
     r"t/m\.py:3: @dp\.materialized_view m\(\): not supported: its body must be a single `return "
     r"spark\.sql\(\"<SQL>\"\)`"),
    ({"a.sql": "CREATE MATERIALIZED VIEW a AS SELECT 1 AS x;\nCREATE MATERIALIZED VIEW m AS\n"
               "  SELECT * FROM a JOIN nowhere_to_be_found USING (x);"},
     r"t/a\.sql:2: CREATE MATERIALIZED VIEW m: reads nowhere_to_be_found, which the project does not declare"),
    ({"a.sql": "CREATE MATERIALIZED VIEW db.m AS SELECT 1 AS x;"},
     r"t/a\.sql:1: qualified name db\.m: stream tables live in the session's default database"),
    ({"m.py": "import pyspark.pipelines as sdp\n\n@sdp.append_flow(target='x')\ndef f():\n"
              "    return spark.sql('SELECT 1')\n"},
     r"t/m\.py:3: @dp\.append_flow on f\(\): not supported"),
])
def test_unmapped_declarations_name_file_line_and_construct(spark: Any, tmp_path: Path, files: dict[str, str],
                                                            message: str) -> None:
    from pipeline.sdp import load_project

    with pytest.raises(ConfigError, match=message):
        load_project(_project(tmp_path, files), spark)


def test_python_and_streaming_declarations_map(spark: Any, tmp_path: Path, make_source: Any) -> None:
    """A streaming table over STREAM(t), one fed by a flow, a Kafka source and a Python temporary view."""
    from pipeline.sdp import load_project, spec_path

    orders = make_source("orders", "id INT, amount DOUBLE")
    spec = _project(tmp_path, {
        "a.sql": f"CREATE STREAMING TABLE big AS SELECT id, amount FROM STREAM({orders}) WHERE amount > 10;\n"
                 "CREATE STREAMING TABLE copy;\n"
                 f"CREATE FLOW fill AS INSERT INTO copy BY NAME SELECT * FROM STREAM {orders};\n"
                 "CREATE STREAMING TABLE events (id BIGINT, note STRING) TBLPROPERTIES (\n"
                 "  'trickle.kafka.topic' = 'shop.public.events', 'trickle.kafka.bootstrap_servers' = "
                 "'127.0.0.1:9092', 'trickle.kafka.key' = 'id');\n"
                 "CREATE MATERIALIZED VIEW hourly COMMENT 'x' TBLPROPERTIES ('pipelines.trigger.interval' = "
                 "'1 hour') AS SELECT COUNT(*) AS stream FROM recent;",  # a column named stream is no STREAM
        "v.py": "from pyspark.pipelines import temporary_view as tv\n\n@tv(name='recent')\ndef r():\n"
                "    '''doc'''\n    return spark.sql(\"SELECT * FROM events WHERE id > 0\")\n",
    })
    assert spec_path(tmp_path) == spec  # a folder, as spark-pipelines finds it
    project = load_project(spec, spark)
    tables = {s.name: (s.refresh_mode, s.schedule, " ".join(s.query.split())) for s in project.conf.stream_tables}
    assert tables == {
        "big": ("IMMEDIATE", None, f"SELECT id, amount FROM {orders} WHERE amount > 10"),
        "copy": ("IMMEDIATE", None, f"SELECT * FROM {orders}"),
        "hourly": ("AUTO", "1h", "SELECT COUNT(*) AS stream FROM recent"),
    }
    kafka = [s for s in project.conf.sources if s.kind == "kafka"]
    assert [(s.name, s.topic, s.key, s.columns) for s in kafka] == [
        ("events", "shop.public.events", ("id",), (("id", "BIGINT"), ("note", "STRING")))]
    assert [(v.name, v.where) for v in project.views] == [("recent", "t/v.py:3")]
    assert {s.name for s in project.conf.sources if s.kind == "delta"} == {orders}


def test_spec_is_told_apart_from_conf_files(tmp_path: Path) -> None:
    """No Spark: ``trickle run`` tells an SDP spec from a conf file, and a spec edited under a running
    ``trickle run`` is refused by the conf loader with what to do (conf_reload logs it)."""
    from pipeline.conf import load_conf
    from pipeline.sdp import spec_path

    conf = tmp_path / "pipeline.yaml"
    conf.write_text("stream_tables: []\n")
    assert spec_path(conf) is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no Spark Declarative Pipelines spec \(spark-pipeline.yaml or "
                                          r"spark-pipeline.yml\) in this directory or above it"):
        spec_path(tmp_path / "empty")
    spec = _project(tmp_path, {"a.sql": "CREATE MATERIALIZED VIEW m AS SELECT 1 AS x;"})
    assert spec_path(spec) == spec_path(tmp_path / "empty") == spec.resolve()  # a folder: upwards, as SDP looks
    with pytest.raises(ConfigError, match="a Spark Declarative Pipelines spec, not a conf file: run it with trickle "
                                          "run spark-pipeline.yml; edits to its definitions are applied when"):
        load_conf(spec)


@pytest.mark.slow
def test_trickle_run_of_an_sdp_project(spark: Any, tmp_path: Path) -> None:
    """``trickle run <project folder>`` end to end, in its own process: it creates the example's stream tables
    (views first where they are read), refreshes them DIFFERENTIAL after a change of a source, and stops on
    SIGTERM with status 0. Slow (a JVM of its own, ~1 min): ``pytest -m slow``."""
    import json
    import signal
    import time

    warehouse = tmp_path / "wh"
    project = _copy_project(tmp_path / "project", "x").parent  # the test's own process: any names do
    names = {k: f"{k}_x" for k in NAMES}
    cdf = "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    orders, customers = warehouse / names["shop_orders"], warehouse / names["shop_customers"]
    # By path only: the job registers the warehouse's Delta tables by their folder names.
    spark.sql(f"CREATE TABLE delta.`{orders}` (id INT, customer_id INT, amount DECIMAL(10,2), status STRING) "
              f"USING delta {cdf}")
    spark.sql(f"CREATE TABLE delta.`{customers}` (id INT, name STRING, region STRING) USING delta {cdf}")
    spark.sql(f"INSERT INTO delta.`{customers}` VALUES (1, 'ann', 'north'), (2, 'bob', NULL)")
    spark.sql(f"INSERT INTO delta.`{orders}` VALUES (1, 1, 120.00, 'paid'), (2, 2, 30.00, 'open')")
    log = tmp_path / "run.log"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        job = subprocess.Popen([str(VENV_BIN / "trickle"), "run", str(project), "--warehouse", str(warehouse),
                                "--json"], env=env, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def events() -> list[dict[str, Any]]:
            return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]

        def wait(cond: Any, timeout_s: float = 300) -> None:
            deadline = time.time() + timeout_s
            while not cond():
                assert job.poll() is None, f"trickle run exited: {log.read_text()[-3000:]}"
                assert time.time() < deadline, f"timed out: {log.read_text()[-3000:]}"
                time.sleep(0.5)

        wait(lambda: any(e["event"] == "running" for e in events()))
        assert [e["name"] for e in events() if e["event"] == "created"] == [names[t] for t in TABLES]
        spark.sql(f"UPDATE delta.`{orders}` SET status = 'paid' WHERE id = 2")
        wait(lambda: any(e["event"] == "refresh" and e.get("action") == "DIFFERENTIAL"
                         and e.get("rows_inserted", 0) + e.get("rows_updated", 0) > 0 for e in events()))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
        assert job.wait(120) == 0, log.read_text()[-3000:]


def test_refused_create_names_the_declaration(spark: Any, st: Any, tmp_path: Path, make_source: Any) -> None:
    """What only the create finds out (here: DIFFERENTIAL asked of a query it cannot maintain so) is
    refused naming the file, the line and the construct too, and leaves no stream table behind."""
    from pipeline.errors import UnsupportedError
    from pipeline.sdp import create, load_project

    src = make_source("events", "id INT, amount DOUBLE", rows=[(1, 2.0)])
    spec = _project(tmp_path, {"a.sql": f"CREATE MATERIALIZED VIEW ok_{src} AS SELECT id FROM {src};\n\n"
                                        "CREATE MATERIALIZED VIEW noisy TBLPROPERTIES ('trickle.refresh_mode' = "
                                        f"'DIFFERENTIAL') AS SELECT id, rand() AS r FROM {src};"})
    with pytest.raises(UnsupportedError, match=r"^t/a\.sql:3: CREATE MATERIALIZED VIEW noisy: .*rand"):
        create(st, load_project(spec, spark), _Log())
    assert not st.catalog.exists("noisy")
