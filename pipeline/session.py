"""A SparkSession with Delta wired in and defaults sized for a small machine.

Everything here can be overridden from a conf file (``spark:`` mapping) or by the caller, so the same code
runs on a laptop (``local[2]``, embedded warehouse) and on a real cluster.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]

#: Defaults chosen for a 2-core machine: few shuffle partitions, no UI, Delta snapshot state built with
#: little parallelism. Each Spark job has a fixed cost that dominates small refreshes, so anything that
#: removes tasks or jobs matters more than parallelism here.
SMALL_MACHINE_DEFAULTS: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.stateReconstructionValidation.enabled": "false",
    # AQE turns every query stage into its own Spark job, and small tables keep their file list in the .crc
    # checksum, so a new snapshot is loaded without a state-reconstruction job. A refresh's fixed cost is its
    # number of jobs (figures in docs/BENCHMARKS.md, "Figures behind the code").
    "spark.sql.adaptive.enabled": "false",
    "spark.databricks.delta.allFilesInCrc.enabled": "true",
    "spark.databricks.delta.allFilesInCrc.verificationMode.enabled": "false",
    # the MERGE source of a refresh reads pinned versions only, so it is deterministic: no need to
    # materialise it first (one job less)
    "spark.databricks.delta.merge.materializeSource": "none",
    "spark.driver.memory": "4g",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    # A refresh runs inside a streaming query's thread (IMMEDIATE foreachBatch), already deep in frames;
    # a join + aggregate delta is long SQL text, and a JDK regex over it recursed past the default 1 MB
    # thread stack (docs/BENCHMARKS.md, "Figures behind the code"). Stacks are reserved lazily, so a larger
    # default costs address space, not memory.
    "spark.driver.extraJavaOptions": "-Xss16m",
    # Spark keeps the classes it compiles for a query's stages in a cache of 100 by default. A process that
    # keeps many stream tables fresh plans many distinct queries (a FULL refresh's salt, a pinned version or a
    # cycle's literal is inlined into the generated code), so the cache churns and every query compiles again,
    # Delta's own file-skipping stages included: a FULL refresh of a 1M-row join compiled 6-18 classes (40-260
    # ms) where the same query in a fresh cache compiled 2 (docs/BENCHMARKS.md, session 65). A static setting:
    # it holds from the session's start.
    "spark.sql.codegen.cache.maxEntries": "1000",
    # A plain-rows table's __row_hash and __row_id are unique per row, so Parquet's dictionary encoding fills
    # a dictionary page for nothing before falling back to plain values: about a tenth of the task CPU of
    # writing 1M rows with them (docs/BENCHMARKS.md, session 40). Per-column Parquet settings; no user
    # column is named so (``__`` names are reserved). New stream tables carry the same as table properties
    # (connectors.delta_sink.table_properties), which hold in any session; this covers tables made before.
    **{f"spark.hadoop.parquet.enable.dictionary#{c}": "false" for c in ("__row_hash", "__row_id")},
}


#: jars put on the JVMs' classpath in place instead of shipped with ``spark.jars``: the AWS SDK bundle is
#: 640 MB, and every session copied each ``spark.jars`` entry into its own scratch folder (seconds and
#: 640 MB of disk per session). On a cluster, install them on the nodes or pass them to spark-submit.
CLASSPATH_ONLY_JARS = ("bundle-", "hadoop-aws-")


def jars_dir(fetch: bool = True) -> Path:
    """Where the Delta and Kafka jars are: ``TRICKLE_JARS_DIR``, else ``jars/lib`` of a source checkout (filled
    by ``./dev setup``), else the per-user cache an installed package fills with Maven on first use (see
    :mod:`pipeline.jvm_jars`)."""
    from pipeline import jvm_jars

    return jvm_jars.jars_dir(fetch)


def local_jars() -> list[str]:
    # Under spark-submit the driver's classpath is fixed already: its --jars are the ones that count, and
    # an installed package does not fetch its own then (see _require_delta for the error without them)
    d = jars_dir(fetch="PYSPARK_GATEWAY_PORT" not in os.environ)
    return sorted(str(p) for p in d.glob("*.jar")) if d.is_dir() else []


def _launcher_settings(candidates: Mapping[str, str]) -> list[str]:
    """Which of ``candidates`` the process's launcher already set: when ``spark-submit`` (or the
    ``pyspark`` shell) started the JVM first, its settings are in the JVM's system properties, and a
    default of ours must not silently replace, say, ``--master yarn`` with ``local[2]``."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return []
    from pyspark import SparkConf, SparkContext

    # SparkConf() reads the JVM's system properties only once pyspark is attached to that JVM; before,
    # it is an empty dict and spark-submit's --master would be replaced by local[2]
    SparkContext._ensure_initialized()
    preset = SparkConf()  # loads spark.* system properties from the launcher's JVM
    return [k for k in candidates if preset.contains(k)]


def driver_java_options(*extra: str) -> str:
    """The driver JVM's options of a local session: the small-machine defaults, the class archive the session
    maps (see :mod:`pipeline.jvm_cds`), then ``extra``. For a caller that sets ``spark.driver.extraJavaOptions``
    itself (a conf entry replaces the whole string) and wants to keep these."""
    from pipeline import jvm_cds

    return " ".join(filter(None, (SMALL_MACHINE_DEFAULTS["spark.driver.extraJavaOptions"], jvm_cds.java_options(),
                                  *extra)))


def spark_session(
    app_name: str = "spark-trickle",
    warehouse: str | os.PathLike[str] | None = None,
    conf: Mapping[str, Any] | None = None,
    log_level: str = "ERROR",
):
    """Return a (possibly existing) SparkSession with Delta configured.

    ``warehouse`` is the root of the embedded default: managed tables, stream tables and the trickle
    catalog live below it. It defaults to ``$TRICKLE_WAREHOUSE`` or ``./warehouse``. ``conf`` entries win
    over the small-machine defaults; on a cluster pass ``{"spark.master": ...}`` or use spark-submit, whose
    settings are left alone when a session already exists.
    """
    from pyspark.sql import SparkSession

    settings = dict(SMALL_MACHINE_DEFAULTS)
    from connectors.storage import location

    wh = location(warehouse or os.environ.get("TRICKLE_WAREHOUSE", "warehouse"))  # a URI stays as written
    settings["spark.sql.warehouse.dir"] = str(wh)
    settings["spark.driver.extraJavaOptions"] = driver_java_options()
    jars = [j for j in local_jars() if not Path(j).name.startswith(CLASSPATH_ONLY_JARS)]
    if jars:
        settings["spark.jars"] = ",".join(jars)
    big = [j for j in local_jars() if Path(j).name.startswith(CLASSPATH_ONLY_JARS)]
    if big:  # read in place: driver and executors on this machine (local, local-cluster, a local worker)
        for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
            settings[key] = os.pathsep.join(big)
    for k in _launcher_settings(settings):
        del settings[k]  # spark-submit's --master / --conf / --jars win over our defaults
    for k, v in (conf or {}).items():
        settings[str(k)] = str(v)
    if settings.get("spark.master", "").startswith("local"):
        # Python workers (Kafka event decoding) must run this interpreter, whose packages (pyarrow) we know;
        # pyspark reads the worker's interpreter from this variable when it creates the SparkContext
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # stay on loopback: no lookup of the machine's own name, nothing exposed on the network
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        _require_delta(spark)
    return spark


def _require_delta(spark: Any) -> None:
    """Under spark-submit the driver's classpath is fixed before this code runs, so the Delta jars must
    have been given to spark-submit itself; say how instead of failing later on the first table."""
    from py4j.java_gateway import JavaClass

    if not isinstance(spark._jvm.org.apache.spark.sql.delta.catalog.DeltaCatalog, JavaClass):
        from pipeline.errors import ConfigError

        raise ConfigError(
            "Delta Lake is not on the driver's classpath. Under spark-submit pass the jars set-up fetched: "
            "--jars \"$(ls jars/lib/*.jar | grep -v -e /bundle- -e /hadoop-aws- | paste -sd, -)\" (or --packages with io.delta:delta-spark_2.13 "
            "and org.apache.spark:spark-sql-kafka-0-10_2.13 at the versions in jars/pom.xml)")
