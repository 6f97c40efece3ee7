"""pg_ivm compatibility: ``create_immv``, ``refresh_immv``, ``get_immv_def`` and the ``pg_ivm_immv`` catalog,
as thin aliases over the stream table API (seed 003's postponed Phase 2; docs/migrating-from-pg_ivm.md).

pg_ivm calls an incrementally maintained materialized view an IMMV. Here an IMMV is a stream table with
``refresh_mode='IMMEDIATE'`` and no schedule, and the pg_ivm functions map onto the API as follows:

* ``create_immv(name, query)``: ``create_stream_table(name, query, schedule=None, refresh_mode='IMMEDIATE')``,
  then (``start=True``) its streaming query in this process; returns the number of rows, as pg_ivm does.
* ``refresh_immv(name, True)``: replaces the contents by the query's result (a REINITIALIZE refresh, as
  ``REFRESH MATERIALIZED VIEW``) and resumes maintenance (status ACTIVE); returns the number of rows.
* ``refresh_immv(name, False)``: makes the IMMV *unpopulated*: maintenance stops (status SUSPENDED, the
  streaming query of this process stopped), the contents are deleted (the table stays readable, empty),
  and the next refresh of any kind REINITIALIZEs it; returns 0. Refused while other stream tables read it:
  emptying it under them would make them wrong (pg_ivm has no IMMVs over IMMVs).
* ``get_immv_def(name)``: the defining query, as it was declared (pg_ivm decompiles its parse tree instead).
* ``pg_ivm_immv``: a temporary view ``(immvrelid, viewdef, ispopulated, lastivmupdate)`` over the IMMEDIATE
  stream tables, plus a SQL function ``get_immv_def(immvrelid)``, so pg_ivm's listing query runs as is.
  ``lastivmupdate`` is the Delta version of the table's latest refresh commit (pg_ivm: the xid of the latest
  maintenance). The view is a snapshot of the catalog when registered: :func:`register` again to refresh it.

Not mapped: ``restore_immv`` and the dump helpers (the catalog lives in files next to the tables; nothing
is lost by a dump), ``DROP TABLE`` (use ``drop_stream_table``) and ``ALTER TABLE ... RENAME`` (no rename).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connectors.delta_log import DeltaLog
from pipeline.catalog import StreamTableDef, validate_name
from pipeline.errors import CatalogError
from pipeline.modes import RefreshMode, TableStatus

if TYPE_CHECKING:
    from pipeline.host import StreamTablesHost

#: The pending re-initialization an unpopulated IMMV carries (``StreamTableDef.reinitialize``): its contents
#: were deleted outside any refresh, so its frontier no longer describes them and the next refresh must
#: recompute; it also tells ``pg_ivm_immv`` the IMMV is unpopulated.
UNPOPULATED = "unpopulated by refresh_immv(with_data => false): recomputed from the query"
#: The reason recorded by ``refresh_immv(name, true)``'s refresh.
REPOPULATED = "refresh_immv(with_data => true): contents replaced by the query's result"

VIEW = "pg_ivm_immv"
FUNCTION = "get_immv_def"


def create_immv(st: StreamTablesHost, name: str, query: str, start: bool = True) -> int:
    """pg_ivm's ``create_immv``: an IMMEDIATE stream table, populated now; the number of its rows."""
    st.create_stream_table(name, query, schedule=None, refresh_mode=RefreshMode.IMMEDIATE)
    key = validate_name(name)
    if start:
        st.start(key)
    _refresh_view(st)
    return int(st.read(key).count())


def refresh_immv(st: StreamTablesHost, name: str, with_data: bool = True, start: bool = True) -> int:
    """pg_ivm's ``refresh_immv``: repopulate and resume (``with_data``), or unpopulate and stop; the number
    of rows the IMMV then holds."""
    key = validate_name(name)
    d = st.catalog.get(key)
    if not with_data:
        _unpopulate(st, d)
        _refresh_view(st)
        return 0
    d.status = TableStatus.ACTIVE
    d.consecutive_errors = 0
    d.reinitialize = REPOPULATED if d.reinitialize in (None, UNPOPULATED) else d.reinitialize
    st.catalog.put(d)
    st.refresh_stream_table(key)
    if start and d.refresh_mode == RefreshMode.IMMEDIATE:
        st.start(key)
    _refresh_view(st)
    return int(st.read(key).count())


def get_immv_def(st: StreamTablesHost, name: str) -> str:
    """pg_ivm's ``get_immv_def``: the query the IMMV (any stream table) was declared with."""
    return st.catalog.get(validate_name(name)).query


def is_populated(d: StreamTableDef) -> bool:
    """False between ``refresh_immv(name, false)`` and the next refresh."""
    return d.reinitialize != UNPOPULATED


def catalog_rows(st: StreamTablesHost) -> list[tuple[str, str, bool, int | None]]:
    """``pg_ivm_immv``'s rows: one per IMMEDIATE stream table, by name."""
    rows = []
    for d in st.catalog.all():
        if d.refresh_mode != RefreshMode.IMMEDIATE:
            continue
        found = DeltaLog(st.spark, d.path).last_trickle_commit()
        rows.append((d.name, d.query, is_populated(d), found[0] if found is not None else None))
    return rows


def register(st: StreamTablesHost) -> Any:
    """Register the temporary view ``pg_ivm_immv`` and the SQL function ``get_immv_def(immvrelid)`` in this
    session; return the view as a DataFrame."""
    spark = st.spark
    df = spark.createDataFrame(catalog_rows(st), "immvrelid STRING, viewdef STRING, ispopulated BOOLEAN, "
                                                 "lastivmupdate BIGINT")
    df.createOrReplaceTempView(VIEW)
    # a SQL function reading the view at call time; its parameter is not named like the view's column
    spark.sql(f"CREATE OR REPLACE TEMPORARY FUNCTION {FUNCTION}(immv STRING) RETURNS STRING "
              f"RETURN (SELECT first(viewdef) FROM {VIEW} WHERE immvrelid = lower(immv))")
    return spark.table(VIEW)


def _refresh_view(st: StreamTablesHost) -> None:
    """Keep an already registered ``pg_ivm_immv`` current after create_immv / refresh_immv."""
    try:
        registered = bool(st.spark.catalog.tableExists(VIEW))
    except Exception:  # noqa: BLE001 - no view: nothing to keep current
        registered = False
    if registered:
        register(st)


def _unpopulate(st: StreamTablesHost, d: StreamTableDef) -> None:
    """Stop maintaining ``d`` and delete its rows. The order matters: the catalog first says SUSPENDED and
    "re-initialize", so that no refresh (of this process or another) applies a delta to the emptied table;
    then the rows go; then the mark is written again, in case a refresh that was already running cleared
    it meanwhile."""
    deps = st.catalog.dependents(d.name)
    if deps:
        raise CatalogError(f"cannot unpopulate {d.name}: stream tables {', '.join(deps)} read it and would "
                           f"become wrong; drop them first, or only stop maintaining it with "
                           f"alter_stream_table({d.name!r}, status='SUSPENDED')")
    st.stop(d.name)
    d.status = TableStatus.SUSPENDED
    d.reinitialize = UNPOPULATED
    st.catalog.put(d)
    if DeltaLog(st.spark, d.path).latest_version() is not None:
        from dvm import quote

        st.spark.sql(f"DELETE FROM delta.{quote(d.path)}")
    fresh = st.catalog.get(d.name)
    if fresh.reinitialize != UNPOPULATED or fresh.status != TableStatus.SUSPENDED:
        fresh.status = TableStatus.SUSPENDED
        fresh.reinitialize = UNPOPULATED
        st.catalog.put(fresh)
