"""Bad input gets a clear, typed error that names the offender, and leaves the catalog untouched.

Why: a user who mistypes a column must learn which one from the message, and a failed
``create_stream_table`` must not leave a half-registered table that blocks the retry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline import CatalogError, QueryError, SourceError, UnsupportedError

SRC_COLUMNS = "id INT, grp INT, val DOUBLE, name STRING"
SRC_ROWS = [(1, 1, 1.5, "a"), (2, 1, None, "b"), (3, 2, 7.0, None), (4, 3, -2.0, "d"), (5, 3, 0.0, "e")]


@pytest.fixture
def src(make_source: Callable[..., str]) -> str:
    """A small Delta source with CDF on."""
    return make_source("src", SRC_COLUMNS, rows=SRC_ROWS)


def _fails_cleanly(
    spark: Any, st: Any, exc: type[Exception], call: Callable[[], object], needles: tuple[str, ...], new: str = ""
) -> str:
    """Run ``call``; assert it raises ``exc`` naming every one of ``needles`` and changes nothing."""
    before = st.status()
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    missing = [n for n in needles if n.lower() not in msg.lower()]
    assert not missing, f"{exc.__name__} message {msg!r} does not name {missing}"
    assert st.status() == before, "a failed call changed the catalog"
    if new:
        assert not spark.catalog.tableExists(new), f"failed create left a table {new} in the session catalog"
    return msg


@pytest.mark.parametrize(
    "query, token",
    [
        ("SELEC id FRM {src}", "SELEC"),
        ("SELECT id, FROM {src} WHERE", "WHERE"),
        ("SELECT id FROM {src} WHERE (val > 1", "("),
    ],
)
def test_invalid_sql_is_query_error(
    spark: Any, st: Any, src: str, unique_name: Callable[[str], str], query: str, token: str
) -> None:
    name = unique_name("bad_sql")
    _fails_cleanly(
        spark, st, QueryError,
        lambda: st.create_stream_table(name, query.format(src=src), refresh_mode="DIFFERENTIAL"),
        (name, token), new=name,
    )


def test_unknown_table_is_query_error(spark: Any, st: Any, src: str, unique_name: Callable[[str], str]) -> None:
    name, missing = unique_name("bad_table"), unique_name("no_such_table")
    _fails_cleanly(
        spark, st, QueryError,
        lambda: st.create_stream_table(
            name, f"SELECT s.id FROM {src} s JOIN {missing} m ON s.id = m.id", refresh_mode="DIFFERENTIAL"
        ),
        (missing,), new=name,
    )


@pytest.mark.parametrize(
    "query, column",
    [
        ("SELECT id, nope_col FROM {src}", "nope_col"),
        ("SELECT id FROM {src} WHERE missing_filter_col > 3", "missing_filter_col"),
        ("SELECT grp, SUM(s.not_there) AS x FROM {src} s GROUP BY grp", "not_there"),
    ],
)
def test_unknown_column_is_query_error(
    spark: Any, st: Any, src: str, unique_name: Callable[[str], str], query: str, column: str
) -> None:
    name = unique_name("bad_col")
    _fails_cleanly(
        spark, st, QueryError,
        lambda: st.create_stream_table(name, query.format(src=src), refresh_mode="DIFFERENTIAL"),
        (column,), new=name,
    )


#: Constructs that cannot be maintained differentially. LIMIT without ORDER BY and volatile functions stay
#: rejected by design (window functions are maintained now: tests/test_oracle_windows.py).
UNSUPPORTED = [
    ("SELECT id, val FROM {src} LIMIT 5", "LIMIT"),
    ("SELECT id, rand() AS r FROM {src}", "rand"),
]


@pytest.mark.parametrize("mode", ["DIFFERENTIAL", "IMMEDIATE"])
@pytest.mark.parametrize("query, construct", UNSUPPORTED)
def test_unsupported_construct_is_rejected_in_differential_modes(
    spark: Any, st: Any, src: str, unique_name: Callable[[str], str], query: str, construct: str, mode: str
) -> None:
    name = unique_name("unsupported")
    _fails_cleanly(
        spark, st, UnsupportedError,
        lambda: st.create_stream_table(name, query.format(src=src), refresh_mode=mode),
        (construct,), new=name,
    )


@pytest.mark.parametrize("query, construct", UNSUPPORTED[:2])
def test_unsupported_construct_in_auto_mode_refreshes_full_with_reason(
    spark: Any, st: Any, src: str, unique_name: Callable[[str], str], query: str, construct: str
) -> None:
    """AUTO accepts the query and says, on every refresh, why it recomputed instead of differentiating."""
    name = unique_name("auto_full")
    st.create_stream_table(name, query.format(src=src), refresh_mode="AUTO")
    spark.sql(f"INSERT INTO {src} VALUES (6, 1, 3.0, 'f')")
    r = st.refresh_stream_table(name)
    assert r.action == "FULL", f"expected FULL, got {r.action} ({r.reason!r})"
    assert r.reason and r.reason.strip(), "a FULL fallback must record its reason"
    assert construct.lower() in r.reason.lower(), f"reason {r.reason!r} does not name {construct}"
    hist = st.history(name, limit=1)
    assert hist and hist[0]["action"] == "FULL" and hist[0]["reason"], hist
    expected_rows = 5 if "LIMIT" in query else len(SRC_ROWS) + 1
    assert st.read(name).count() == expected_rows


def test_source_without_cdf_is_source_error(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    plain = make_source("no_cdf", SRC_COLUMNS, rows=SRC_ROWS, cdf=False)
    name = unique_name("on_no_cdf")
    msg = _fails_cleanly(
        spark, st, SourceError,
        lambda: st.create_stream_table(name, f"SELECT id, val FROM {plain}", refresh_mode="DIFFERENTIAL"),
        (plain,), new=name,
    )
    assert "delta.enableChangeDataFeed" in msg, msg


def test_non_delta_source_is_source_error(
    spark: Any, st: Any, make_source: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    pq = make_source("parquet_src", SRC_COLUMNS, rows=SRC_ROWS, using="parquet")
    name = unique_name("on_parquet")
    msg = _fails_cleanly(
        spark, st, SourceError,
        lambda: st.create_stream_table(name, f"SELECT id, val FROM {pq}", refresh_mode="AUTO"),
        (pq,), new=name,
    )
    assert "delta" in msg.lower(), msg


def test_duplicate_stream_table_name_is_catalog_error(
    spark: Any, st: Any, src: str, unique_name: Callable[[str], str]
) -> None:
    name = unique_name("dup")
    st.create_stream_table(name, f"SELECT id, val FROM {src}", refresh_mode="DIFFERENTIAL")
    _fails_cleanly(
        spark, st, CatalogError,
        lambda: st.create_stream_table(name, f"SELECT id, name FROM {src}", refresh_mode="DIFFERENTIAL"),
        (name,),
    )
    assert st.read(name).columns == ["id", "val"], "the original definition must survive"
    assert st.read(name).count() == len(SRC_ROWS)


def test_drop_with_dependents_is_catalog_error_naming_them(
    spark: Any, st: Any, src: str, unique_name: Callable[[str], str]
) -> None:
    up, down = unique_name("upstream"), unique_name("downstream")
    st.create_stream_table(up, f"SELECT grp, COUNT(*) AS n FROM {src} GROUP BY grp", refresh_mode="DIFFERENTIAL")
    st.create_stream_table(down, f"SELECT grp, n FROM {up} WHERE n > 1", refresh_mode="DIFFERENTIAL")
    _fails_cleanly(spark, st, CatalogError, lambda: st.drop_stream_table(up), (down,))
    assert sorted(r[0] for r in st.read(up).collect()) == [1, 2, 3], "the upstream must still be readable"
    st.drop_stream_table(down)
    st.drop_stream_table(up)
    assert {s["name"] for s in st.status()}.isdisjoint({up, down})


def test_conf_with_an_unknown_source_fails_at_start(spark: Any, st: Any, make_source: Any, tmp_path: Any) -> None:
    """`trickle run` refuses to start when a stream table reads a table nobody declared or created,
    naming the file and the key, before any ingestion query starts."""
    from types import SimpleNamespace

    from pipeline.conf import load_conf
    from pipeline.errors import ConfigError
    from pipeline.runtime import Runtime

    real = make_source("known_src", "x INT", rows=[(1,)])
    conf_file = tmp_path / "pipeline.yaml"
    conf_file.write_text(f"""
stream_tables:
  - name: fine
    query: SELECT x FROM {real}
  - name: broken
    query: SELECT f.x FROM fine f JOIN no_such_table_anywhere n ON f.x = n.x
""")
    rt = Runtime(st, load_conf(conf_file), SimpleNamespace(event=lambda *a, **k: None, error=print), tmp_path)
    with pytest.raises(ConfigError) as e:
        rt.start_sources()
    msg = str(e.value)
    assert str(conf_file) in msg and "stream_tables[1] 'broken'.query" in msg, msg
    assert "unknown source 'no_such_table_anywhere'" in msg and "declare it under 'sources'" in msg
    assert not rt.ingestion and not st.status()
