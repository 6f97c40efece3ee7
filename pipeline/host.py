"""What the modules that carry out parts of the API use of it: a :class:`StreamTablesHost` protocol.

:mod:`pipeline.alter` (changing a query), :mod:`pipeline.pg_ivm` (pg_ivm's names) and
:mod:`pipeline.read_your_writes` (writes that wait for IMMEDIATE tables) each implement methods of
:class:`pipeline.api.StreamTables`, which calls them. Typing their ``st`` parameter by that class would tie
each of them and the API in a circle of imports; this protocol names what they use instead, and
``StreamTables`` satisfies it as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: catalog and refresh import nothing of the API's helpers
    from pipeline.catalog import Catalog, StreamTableDef
    from pipeline.decision import RefreshResult
    from pipeline.refresh import Refresher


class StreamTablesHost(Protocol):
    spark: Any
    catalog: Catalog
    refresher: Refresher
    #: the cycle settings (:class:`pipeline.cycles.Settings`)
    cycles: Any
    #: name -> the running streaming query of an IMMEDIATE table
    _queries: dict[str, Any]

    def create_stream_table(self, name: str, query: str, schedule: str | None = ..., refresh_mode: str = ...,
                            initialize: bool = ..., dialect: str = ...) -> None: ...

    def refresh_stream_table(self, name: str) -> RefreshResult: ...

    def read(self, name: str, consistent: bool = ..., timeout: float = ..., refresh: bool | None = ...) -> Any: ...

    def start(self, name: str, follow: set[str] | None = ...) -> Any: ...

    def stop(self, name: str) -> None: ...

    def _definition(self, key: str, query: str, schedule: str | None, mode: str,
                    dialect: str = ...) -> tuple[StreamTableDef, dict[str, int]]: ...

    def _register(self, name: str, path: str) -> None: ...
