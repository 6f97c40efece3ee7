"""Stream tables as named tables of a metastore database, for other Spark applications to read by name.

Every stream table is registered in the session catalog under its own name (``StreamTables._register``).
On the embedded default that catalog lives in memory and dies with the process; with a Hive-compatible
metastore (``spark.sql.catalogImplementation=hive``) the same registration is persistent, in the current
database. The Spark conf ``trickle.metastore.database`` adds a registration in a database of the user's
choice: ``CREATE TABLE <db>.<name> USING DELTA LOCATION '<the stream table's path>'``, an external table
over the files the refreshes write, so any engine that reads Delta through that metastore (``spark-sql``,
the Thrift server, another job) sees the stream table's latest committed version.

Kept in sync: created with the stream table, re-created on every start of :class:`StreamTables` when it is
missing (a metastore restored from an older backup), dropped with it. ``alter`` changes neither the
location nor the schema, so it needs nothing here. Only the user columns are meant to be read: the
hidden ``__`` columns some layouts store are visible to readers of the table (as in ``delta.`path```).
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.errors import CatalogError

__all__ = ["DATABASE_KEY", "database", "publish", "unpublish"]

#: The Spark conf key naming the metastore database stream tables are registered in (unset: none).
DATABASE_KEY = "trickle.metastore.database"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def database(spark: Any) -> str | None:
    """The configured database, validated: a name that is not a plain identifier is an error, not SQL."""
    value = (spark.conf.get(DATABASE_KEY, "") or "").strip()
    if not value:
        return None
    if not _IDENTIFIER.fullmatch(value):
        raise CatalogError(f"{DATABASE_KEY}={value!r} is not a database name (letters, digits, underscores)")
    return value.lower()


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _location(spark: Any, qualified: str) -> str:
    return str(spark.sql(f"DESCRIBE DETAIL {qualified}").first()["location"])


def _same_location(a: str, b: str) -> bool:
    strip = lambda p: p.removeprefix("file://").removeprefix("file:").rstrip("/")  # noqa: E731
    return strip(a) == strip(b)


def publish(spark: Any, name: str, path: str) -> str | None:
    """Register the stream table ``name`` stored at ``path`` as ``<database>.<name>``; returns that name
    (None when no database is configured). A table of that name over other files is an error: it is not
    this stream table, and replacing it would lose someone's table."""
    db = database(spark)
    if db is None:
        return None
    qualified = f"`{db}`.`{name}`"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    if spark.catalog.tableExists(f"{db}.{name}"):
        where = _location(spark, qualified)
        if not _same_location(where, path):
            raise CatalogError(f"{db}.{name} already exists in the metastore over {where}, which is not the "
                               f"stream table's {path}; drop or rename that table, or set {DATABASE_KEY}")
        return f"{db}.{name}"
    spark.sql(f"CREATE TABLE IF NOT EXISTS {qualified} USING DELTA LOCATION {_sql_string(path)}")
    return f"{db}.{name}"


def unpublish(spark: Any, name: str, path: str | None = None) -> None:
    """Drop ``<database>.<name>`` from the metastore when it is the registration of the stream table stored
    at ``path`` (an external table: dropping it leaves the files, which are the caller's to delete)."""
    db = database(spark)
    if db is None or not spark.catalog.tableExists(f"{db}.{name}"):
        return
    qualified = f"`{db}`.`{name}`"
    if path is not None and not _same_location(_location(spark, qualified), path):
        return  # not the stream table's registration: someone's own table, left alone
    spark.sql(f"DROP TABLE IF EXISTS {qualified}")
