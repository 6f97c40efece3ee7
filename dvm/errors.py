"""Errors raised while compiling a defining query. Pure Python: no Spark needed to raise or catch them."""

from __future__ import annotations


class TrickleError(Exception):
    """Base of every error spark-trickle raises on purpose (bad input, bad state, bad config)."""


class QueryError(TrickleError):
    """The defining query is not valid: a syntax error, an unknown table or an unknown column."""


class UnsupportedError(TrickleError):
    """The query is valid SQL but a construct in it cannot be maintained differentially.

    ``construct`` names the construct; the message says what to do instead. AUTO mode turns this into a
    FULL refresh with the message recorded as the reason; DIFFERENTIAL and IMMEDIATE modes raise it.
    """

    def __init__(self, construct: str, message: str) -> None:
        super().__init__(message)
        self.construct = construct
