"""The fused path's decisions (pipeline/fused.py), pure Python: which IMMEDIATE tables a mirror's micro-batch
refreshes and in what order, and which sources a table's own streaming query must still follow."""

from __future__ import annotations

import pytest

from pipeline import fused
from pipeline.catalog import SourceInfo, StreamTableDef

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit


def _def(name: str, sources: dict[str, str], mode: str = "IMMEDIATE", status: str = "ACTIVE") -> StreamTableDef:
    return StreamTableDef(name=name, query="SELECT 1", schedule=None, refresh_mode=mode, path=f"/st/{name}",
                          sources={k: SourceInfo(f"/p/{k}", kind) for k, kind in sources.items()}, names=["x"],
                          types=["INT"], layout="bag", status=status)


# orders, lines: Kafka mirrors; products: a Delta table written by someone else
DEFS = [
    _def("order_totals", {"orders": "delta", "lines": "delta"}),
    _def("big_orders", {"order_totals": "stream_table"}),                       # IMMEDIATE over a fused table
    _def("priced", {"lines": "delta", "products": "delta"}),                    # one mirror, one Delta source
    _def("priced_top", {"priced": "stream_table"}),                             # over a partly followed table
    _def("daily", {"orders": "delta"}, mode="DIFFERENTIAL"),                    # scheduled, not fused
    _def("daily_view", {"daily": "stream_table"}),                              # IMMEDIATE over a scheduled one
    _def("paused", {"orders": "delta"}, status="SUSPENDED"),
]
MIRRORS = {"orders", "lines"}


def test_a_batch_refreshes_the_immediate_tables_it_feeds_upstream_first() -> None:
    assert fused.fed_by(reversed(DEFS), "orders") == ["order_totals", "big_orders"]
    assert fused.fed_by(DEFS, "LINES") == ["order_totals", "big_orders", "priced", "priced_top"]


def test_only_sources_no_batch_pushes_are_followed_by_a_streaming_query() -> None:
    pushed = fused.pushed_sources(DEFS, MIRRORS)
    assert pushed == {"orders", "lines", "order_totals", "big_orders"}
    by_name = {d.name: d for d in DEFS}
    assert fused.followed(by_name["order_totals"], pushed) == set()     # no query at all
    assert fused.followed(by_name["big_orders"], pushed) == set()
    assert fused.followed(by_name["priced"], pushed) == {"products"}
    assert fused.followed(by_name["priced_top"], pushed) == {"priced"}  # priced also changes with products
    assert fused.followed(by_name["daily_view"], pushed) == {"daily"}   # a scheduled table's commits


def test_without_mirrors_everything_is_followed_as_before() -> None:
    pushed = fused.pushed_sources(DEFS, set())
    assert pushed == set()
    assert all(fused.followed(d, pushed) == set(d.sources) for d in DEFS)
