"""spark-trickle runtime: the public API is :func:`spark_session` and :class:`StreamTables`."""

from pipeline.api import RefreshResult, StreamTables
from pipeline.errors import (
    CatalogError,
    ConfigError,
    ConsistencyTimeout,
    QueryError,
    RefreshError,
    SourceChangedError,
    SourceError,
    TrickleError,
    UnsupportedError,
)
from pipeline.session import spark_session

__all__ = [
    "spark_session",
    "StreamTables",
    "RefreshResult",
    "TrickleError",
    "QueryError",
    "UnsupportedError",
    "SourceChangedError",
    "SourceError",
    "CatalogError",
    "RefreshError",
    "ConfigError",
    "ConsistencyTimeout",
]
