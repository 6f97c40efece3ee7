"""A delta job's session settings follow the bytes of Delta files it reads (``Context.bytes_read``): under
``trickle.refresh.onePartitionBelowBytes`` one partition per shuffle and per local relation, under
``trickle.refresh.interpretedBelowBytes`` code generation off; neither when what it reads is unknown, and a
limit of 0 turns its setting off. Why it matters: both trade a fixed cost per query (tasks, compiling
generated code) against a cost per row, and a wrong side costs seconds (a 1M-row window interpreted: 2.45 s
against 0.95 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dvm
from dvm import Context, SourceRef
from pipeline.catalog import Catalog
from pipeline.refresh import INTERPRETED_BELOW, ONE_PARTITION, ONE_PARTITION_BELOW, Refresher
from tests.conftest import local_engine_mode

_engine = local_engine_mode("off")  # this module tests Spark's own delta job

SCHEMAS = {"a": [("k", "int"), ("x", "int")]}


def _delta_sql(change_bytes: int | None) -> tuple[Context, str]:
    plan = dvm.compile_query("SELECT k, SUM(x) AS s FROM a GROUP BY k", SCHEMAS)
    ctx = Context({"a": SourceRef("/w/a", 5, 4, sizes={4: 900, 5: 1000}, change_bytes=change_bytes)},
                  materialize_changes=True, target_path="/w/st", target_relation="global_temp.held")
    return ctx, ctx.unshare_single_reads(plan.merge_source_sql(ctx, ["int", "bigint"]) or "")


def test_small_reads_run_on_one_partition_and_interpreted(spark: Any, tmp_path: Path) -> None:
    refresher = Refresher(spark, Catalog(tmp_path / "catalog"))
    small_ctx, small = _delta_sql(10 << 10)
    large_ctx, large = _delta_sql(50 << 20)
    unknown_ctx, unknown = _delta_sql(None)
    assert small_ctx.bytes_read(small) is not None and small_ctx.bytes_read(small) < 256 << 10
    assert refresher._interpreted(small_ctx, small)
    assert ONE_PARTITION.items() <= refresher._job_conf(small_ctx, small).items()
    for ctx, sql in ((large_ctx, large), (unknown_ctx, unknown)):
        assert not refresher._interpreted(ctx, sql)
        assert not ONE_PARTITION.items() & refresher._job_conf(ctx, sql).items()
    try:
        spark.conf.set(INTERPRETED_BELOW, "0")
        spark.conf.set(ONE_PARTITION_BELOW, "0")
        assert not refresher._interpreted(small_ctx, small)
        assert not ONE_PARTITION.items() & refresher._job_conf(small_ctx, small).items()
    finally:
        spark.conf.unset(INTERPRETED_BELOW)
        spark.conf.unset(ONE_PARTITION_BELOW)
