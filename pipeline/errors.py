"""Errors of the runtime. Every one names the object and the problem, and says what to do."""

from __future__ import annotations

from dvm.errors import QueryError, TrickleError, UnsupportedError

__all__ = [
    "TrickleError",
    "QueryError",
    "UnsupportedError",
    "SourceError",
    "CatalogError",
    "RefreshError",
    "ConfigError",
]


class SourceError(TrickleError):
    """A source table cannot be used: not a Delta table, Change Data Feed off, or history vacuumed."""


class CatalogError(TrickleError):
    """The request conflicts with the catalog: duplicate name, unknown stream table, dependents, cycles."""


class RefreshError(TrickleError):
    """A refresh could not run (for example strict mode refused to fall back to FULL)."""


class ConfigError(TrickleError):
    """A conf file is invalid; the message names the file, the key and the problem."""
