"""A metastore, not only paths: stream tables read by name from another Spark application.

One process (the writer) runs with Spark's embedded Hive metastore (Derby, in a temporary folder) and
``trickle.metastore.database=analytics``: it creates a source, two stream tables, changes the source,
refreshes, drops one stream table, and prints the oracle (the query recomputed over the source). Then
the ``spark-sql`` shell of the pip-installed Spark, another application on the same metastore, reads
``analytics.order_totals`` by name: its rows must be the oracle's, and the dropped table must be gone.
Embedded Derby admits one process at a time, so the two run one after the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cluster_env import PROJECT_ROOT, clean_env, short_lived_jvm, spark_home, submit_jars

WRITER = r'''
import json, sys
from pipeline import StreamTables
from pipeline.session import spark_session

conf = json.loads(sys.argv[1])
spark = spark_session(app_name="trickle-metastore-writer", warehouse=sys.argv[2], conf=conf)
st = StreamTables(spark)
spark.sql("CREATE TABLE orders (id INT, customer STRING, amount DECIMAL(10,2)) USING delta "
          "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
spark.sql("INSERT INTO orders VALUES (1, 'ann', 10.50), (2, 'bob', 3.25), (3, 'ann', 7.00), (4, 'cy', NULL)")
query = "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer"
st.create_stream_table("order_totals", query, refresh_mode="DIFFERENTIAL")
st.create_stream_table("big_orders", "SELECT id, amount FROM orders WHERE amount > 5", refresh_mode="AUTO")
spark.sql("INSERT INTO orders VALUES (5, 'dee', 1.00), (6, 'bob', 2.00)")
spark.sql("UPDATE orders SET amount = 99.99 WHERE id = 2")
spark.sql("DELETE FROM orders WHERE id = 3")
result = st.refresh_stream_table("order_totals")
st.alter_stream_table("order_totals", schedule="5m")
st.drop_stream_table("big_orders")
oracle = spark.sql(f"SELECT customer, CAST(total AS STRING), CAST(n AS STRING) FROM ({query})").collect()
print("RESULT " + json.dumps({"action": result.action,
                              "oracle": [[None if v is None else str(v) for v in r] for r in oracle]}))
spark.stop()
'''


def _metastore_conf(tmp: Path) -> dict[str, str]:
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={tmp / 'metastore_db'};create=true",
        "trickle.metastore.database": "analytics",
        "spark.sql.shuffle.partitions": "1",
    }


def _spark_sql(tmp: Path, warehouse: Path, sql: str) -> list[list[str | None]]:
    """Run ``sql`` in the ``spark-sql`` shell (its own JVM and application) and return its rows."""
    from pipeline.session import SMALL_MACHINE_DEFAULTS

    home = spark_home(tmp)
    conf = {**_metastore_conf(tmp), "spark.sql.warehouse.dir": str(warehouse),
            "spark.sql.extensions": SMALL_MACHINE_DEFAULTS["spark.sql.extensions"],
            "spark.sql.catalog.spark_catalog": SMALL_MACHINE_DEFAULTS["spark.sql.catalog.spark_catalog"],
            "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1"}
    cmd = [str(home / "bin" / "spark-sql"), "--master", "local[1]", *submit_jars(), "-S"]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    proc = subprocess.run([*cmd, "-e", sql], cwd=tmp, env=short_lived_jvm(clean_env(SPARK_HOME=str(home))),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"spark-sql failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return [[None if v == "NULL" else v for v in line.split("\t")] for line in proc.stdout.splitlines() if line]


def test_stream_tables_are_named_tables_another_application_reads(tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    writer = subprocess.run(
        [sys.executable, "-c", WRITER, json.dumps(_metastore_conf(tmp_path)), str(warehouse)],
        cwd=tmp_path, env=short_lived_jvm(clean_env(PYTHONPATH=str(PROJECT_ROOT))), capture_output=True, text=True, timeout=600)
    assert writer.returncode == 0, f"the writer failed:\n{writer.stdout[-2000:]}\n{writer.stderr[-4000:]}"
    (line,) = [ln for ln in writer.stdout.splitlines() if ln.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    assert result["action"] == "DIFFERENTIAL", result
    oracle = result["oracle"]
    assert len(oracle) == 4  # ann, bob, cy, dee

    rows = _spark_sql(tmp_path, warehouse,
                      "SHOW TABLES IN analytics; SELECT customer, total, n FROM analytics.order_totals")
    tables = [r[0] for r in rows if len(r) == 1]  # the shell prints SHOW TABLES as bare names, Hive-style
    data = [r for r in rows if len(r) > 1]
    assert tables == ["order_totals"], f"analytics should hold order_totals only (big_orders was dropped): {rows}"
    assert Counter(map(tuple, data)) == Counter(map(tuple, oracle)), (
        f"analytics.order_totals read by spark-sql differs from the query:\n{data}\n!=\n{oracle}")


def test_metastore_database_follows_create_and_drop_and_refuses_a_foreign_table(
    spark: Any, st: Any, make_source: Any, unique_name: Any, tmp_path: Path
) -> None:
    """The same registration on the test session's in-memory catalog: ``<db>.<name>`` appears with the
    stream table and goes with it, a bad database name is a clear error, and a table of that name over
    other files is never taken over (the create fails and leaves nothing behind)."""
    from pipeline import StreamTables
    from pipeline.errors import CatalogError
    from pipeline.metastore import DATABASE_KEY

    db = unique_name("analytics")
    src = make_source("orders", "id INT, amount DOUBLE", rows=[(1, 2.0), (2, 3.5)])
    spark.conf.set(DATABASE_KEY, db)
    try:
        name = unique_name("big")
        st.create_stream_table(name, f"SELECT id, amount FROM {src} WHERE amount > 3", refresh_mode="DIFFERENTIAL")
        assert [tuple(r) for r in spark.sql(f"SELECT id, amount FROM {db}.{name}").collect()] == [(2, 3.5)]
        spark.sql(f"INSERT INTO {src} VALUES (3, 9.0)")
        st.refresh_stream_table(name)
        assert sorted(r.id for r in spark.sql(f"SELECT id FROM {db}.{name}").collect()) == [2, 3]
        StreamTables(spark, root=str(tmp_path / "trickle"))  # a restart finds it registered: no error
        st.drop_stream_table(name)
        assert not spark.catalog.tableExists(f"{db}.{name}")

        foreign = unique_name("taken")
        spark.sql(f"CREATE TABLE {db}.{foreign} USING delta LOCATION '{tmp_path / 'elsewhere'}' AS SELECT 1 AS x")
        with pytest.raises(CatalogError, match="not the stream table"):
            st.create_stream_table(foreign, f"SELECT id FROM {src}")
        assert not st.catalog.exists(foreign) and not spark.catalog.tableExists(foreign)
        assert [tuple(r) for r in spark.sql(f"SELECT x FROM {db}.{foreign}").collect()] == [(1,)]

        spark.conf.set(DATABASE_KEY, "bad-name; DROP")
        with pytest.raises(CatalogError, match="is not a database name"):
            st.create_stream_table(unique_name("x"), f"SELECT id FROM {src}")
    finally:
        spark.conf.unset(DATABASE_KEY)
