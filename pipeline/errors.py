"""Errors of the runtime. Every one names the object and the problem, and says what to do."""

from __future__ import annotations

from dvm import QueryError, TrickleError, UnsupportedError

__all__ = [
    "TrickleError",
    "QueryError",
    "UnsupportedError",
    "SourceError",
    "SourceChangedError",
    "CatalogError",
    "RefreshError",
    "ConfigError",
    "ConsistencyTimeout",
]


class SourceError(TrickleError):
    """A source table cannot be used: not a Delta table, Change Data Feed off, or history vacuumed."""


class SourceChangedError(SourceError):
    """A source changed in a way the stream table cannot follow by itself: a column its query reads was
    dropped or renamed, or the change history a refresh needs was vacuumed. Retrying cannot help, so the
    stream table goes to ERROR at once; the message says what to do."""


class CatalogError(TrickleError):
    """The request conflicts with the catalog: duplicate name, unknown stream table, dependents, cycles."""


class RefreshError(TrickleError):
    """A refresh could not run (for example strict mode refused to fall back to FULL)."""


class ConfigError(TrickleError):
    """A conf file is invalid; the message names the file, the key and the problem."""


class ConsistencyTimeout(RefreshError):
    """A read-your-writes wait (``StreamTables.write``, ``wait_for``, ``read(consistent=True)``) gave up: the
    stream table did not reflect the wanted source versions in time. Whatever was written stays committed."""
