"""Shared fixtures: ONE SparkSession per test run, a fresh StreamTables catalog per test, unique sources.

Why one session: starting a JVM with Delta costs 10-20 s on the 2-core test machine, and a JVM holds one
SparkContext anyway. Why unique names: the session catalog is in memory and shared by every test, so
two tests creating ``orders`` would collide; suffixing a counter keeps tests independent.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = TESTS_DIR.parent
for _p in (str(PROJECT_ROOT), str(TESTS_DIR)):  # `pipeline` and the `oracle` helper, however pytest runs
    if _p not in sys.path:
        sys.path.insert(0, _p)

from oracle import sql_literal, unique_suffix  # noqa: E402


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The single SparkSession of the run, with its warehouse in a temporary directory."""
    warehouse = tmp_path_factory.mktemp("warehouse")
    # The tests' own queries (source changes, the oracle's recomputations) run over tiny tables, where
    # compiling generated code costs far more than it saves; refreshes decide this for themselves.
    from connectors.delta_sink import INTERPRETED
    from pipeline.session import driver_java_options, spark_session

    # TRICKLE_TEST_SPARK_CONF (a JSON object) adds or overrides settings, e.g. to try JVM options.
    extra = json.loads(os.environ.get("TRICKLE_TEST_SPARK_CONF", "{}"))
    # Test tables hold tens of rows: one partition per shuffle and per snapshot means fewer tasks per job
    # (measured on a refresh loop: 3.0 s instead of 3.3 s per refresh).
    tiny = {"spark.sql.shuffle.partitions": "1", "spark.default.parallelism": "1",
            "spark.databricks.delta.snapshotPartitions": "1",
            # each pyspark.sql.functions call first sends its Python call site to the JVM for error messages
            # (five more py4j calls): the tests' failures show their own traces
            "spark.python.sql.dataFrameDebugging.enabled": "false"}
    # Small deltas run on DuckDB (pipeline/local_engine.py) as in production, so every oracle checks that
    # engine; the modules that must exercise Spark's delta job, or compare both, set it themselves
    # (local_engine_mode below). TRICKLE_TEST_LOCAL_ENGINE=verify runs the whole suite with both engines
    # compared on every delta (about 1.5x the time), =off with Spark only.
    verify = {"trickle.refresh.localEngine": os.environ.get("TRICKLE_TEST_LOCAL_ENGINE", "auto")}
    # The parallel collector instead of G1 for the test JVM (not the product's: its pauses are longer, and a
    # streaming driver keeps G1's): 6% less CPU on two oracle modules run as CI runs them (two workers,
    # 562 against 600 CPU-s; docs/BENCHMARKS.md, session 72). The option string replaces the session's,
    # so it carries the session's own options and class archive along.
    java = driver_java_options("-XX:+UseParallelGC")
    session = spark_session(app_name="trickle-tests", warehouse=str(warehouse),
                            conf={**INTERPRETED, **tiny, **verify, "spark.driver.extraJavaOptions": java, **extra})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Kafka broker per test process (each xdist worker), started on first use and shared by the modules
    that only create, produce to and consume their own topics. Why shared: a broker start is two JVMs
    (storage format, server), about 9 s and 13 CPU-seconds on the 2-core machine, and seven modules started
    one each. Modules that stop, restart or lose their broker (tests/test_kafka_service.py,
    tests/test_kafka_unreachable.py) start their own, under other names."""
    from services.kafka import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


def local_engine_mode(mode: str) -> Any:
    """A module-wide autouse fixture running that module's refreshes with ``trickle.refresh.localEngine``
    = ``mode``: ``off`` where a module tests Spark's own delta job (key filters, driver reads, job
    settings), ``verify`` where it compares both engines on every delta (pipeline/local_engine.py)."""

    @pytest.fixture(autouse=True, scope="module")
    def _local_engine_mode(spark: Any) -> Iterator[None]:
        key = "trickle.refresh.localEngine"
        before = spark.conf.get(key, None)
        spark.conf.set(key, mode)
        yield
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)

    return _local_engine_mode


@pytest.fixture
def st(spark: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh StreamTables catalog rooted in this test's own temporary directory."""
    from pipeline import StreamTables

    tables = StreamTables(spark, root=str(tmp_path / "trickle"))
    yield tables
    stop_all = getattr(tables, "stop_all", None)
    if callable(stop_all):
        try:
            stop_all()
        except Exception:  # noqa: BLE001 - teardown must not mask the test's own result
            pass


@pytest.fixture
def python_in_scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files a snapshot dataset (``connectors.delta_rs.dataset``) read in Python after its scan was planned,
    i.e. while Arrow (or DuckDB) consumed batches a Python generator handed it (see
    ``delta_rs.READ_WHOLE_BYTES``): every such batch waits for the GIL, and Arrow threads waiting for the GIL
    inside a scan is how DuckDB's scans once deadlocked. Empty when every file read in Python was read while
    ``scanner()`` ran, before the scan started."""
    import threading

    from connectors import delta_rs

    cls = delta_rs._plain_strings_dataset()
    planning = threading.local()
    late: list[str] = []
    real_scanner, real_rows = cls.scanner, cls._live_rows

    def scanner(self: Any, *args: Any, **kwargs: Any) -> Any:
        planning.depth = getattr(planning, "depth", 0) + 1
        try:
            return real_scanner(self, *args, **kwargs)
        finally:
            planning.depth -= 1

    def live_rows(self: Any, fragment: Any, columns: Any) -> Any:
        if not getattr(planning, "depth", 0):
            late.append(fragment.path)
        return real_rows(self, fragment, columns)

    monkeypatch.setattr(cls, "scanner", scanner)
    monkeypatch.setattr(cls, "_live_rows", live_rows)
    return late


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """``unique_name("orders")`` -> ``orders_<pid>_<n>``: a name no other test of the run uses."""
    return lambda prefix: f"{prefix}_{unique_suffix()}"


@pytest.fixture
def make_source(spark: Any, unique_name: Callable[[str], str]) -> Callable[..., str]:
    """Create a uniquely named source table in the default database and return its name.

    ``make_source("orders", "id INT, amount DOUBLE", rows=[(1, 2.0)])`` makes a Delta table with the
    Change Data Feed on; ``cdf=False`` or ``using="parquet"`` make the bad sources error tests need.
    """

    def make(
        prefix: str,
        columns: str,
        rows: list[tuple[Any, ...]] | None = None,
        cdf: bool = True,
        using: str = "delta",
    ) -> str:
        name = unique_name(prefix)
        props = " TBLPROPERTIES (delta.enableChangeDataFeed = true)" if cdf and using == "delta" else ""
        spark.sql(f"CREATE TABLE {name} ({columns}) USING {using}{props}")
        if rows:
            values = ", ".join("(" + ", ".join(sql_literal(v) for v in r) + ")" for r in rows)
            spark.sql(f"INSERT INTO {name} VALUES {values}")
        return name

    return make


#: The longest modules, longest first (seconds of one xdist worker: the slowest tests of the 28-minute CI run
#: of session 36, the spark-submit, crash, metastore and key-filter modules as cut that session): run first,
#: so that with ``--dist loadfile`` the short files fill in around them instead of one worker finishing a
#: long module alone at the end (longest-processing-time-first scheduling). Files not named here run after
#: them in file order, so a new module of more than a minute belongs here too.
LONG_MODULES = ("test_oracle_aggregates", "test_oracle_setops", "test_oracle_windows", "test_oracle_recursive",
                "test_oracle_lateral", "test_cluster", "test_kafka_unreachable", "test_crash", "test_key_filter",
                "test_object_store", "test_wheel", "test_oracle_joins", "test_oracle_operators",
                "test_oracle_operator_joins", "test_metastore", "test_oracle_generated", "test_oracle_seed_examples",
                "test_postgres_e2e", "test_sdp", "test_apply_strategies", "test_plain_rows", "test_ui",
                "test_deletion_vectors", "test_pg_ivm", "test_read_your_writes", "test_cycles")


def pytest_configure(config: pytest.Config) -> None:
    """Keep the order below under ``--dist loadfile``: pytest-xdist 3 re-sorts the files by their number of
    tests, most first, unless ``--no-loadscope-reorder`` is given, and the long modules with few tests
    (spark-submit, crash, metastore: one or two each) were then the very last files of the run."""
    if hasattr(config.option, "loadscopereorder"):  # xdist installed
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {m: i for i, m in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: file order kept otherwise
    check_unit_marks(items)


def check_unit_marks(items: list[pytest.Item]) -> None:
    """Refuse a test marked ``unit`` that asks for the Spark session, directly or through a fixture (``st``,
    ``make_source``, ...): ``./dev test -m unit`` promises seconds and no JVM, and a wrong mark would
    quietly start one."""
    wrong = [item.nodeid for item in items
             if item.get_closest_marker("unit") is not None and "spark" in getattr(item, "fixturenames", ())]
    if wrong:
        raise pytest.UsageError(f"tests marked unit use the Spark session (remove the mark): {', '.join(wrong)}")
