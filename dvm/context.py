"""What a delta query is rendered against: the sources and the two frontiers of one refresh.

A refresh moves a stream table from the *pre* frontier (the source versions its contents reflect) to the
*post* frontier (the versions it will reflect). Every operator renders SQL against this context: a source
at the pre or post version is a time-travel read, its change window is the Change Data Feed between the
two versions. Pure data: rendering SQL needs no Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

State = Literal["pre", "post"]


def quote(name: str) -> str:
    """Backtick-quote one identifier for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class SourceRef:
    """One source of a stream table as a refresh sees it.

    ``pre`` is None when the stream table has never been populated (a FULL refresh). ``mult_col`` names the
    multiplicity column when the source is itself a stream table stored with one row per distinct tuple.
    """

    path: str
    post: int
    pre: int | None = None
    mult_col: str | None = None

    @property
    def changed(self) -> bool:
        return self.pre is not None and self.post != self.pre


@dataclass(frozen=True)
class Context:
    """The sources of one refresh, by source key (the normalised table name used in the query)."""

    sources: dict[str, SourceRef] = field(default_factory=dict)
    #: the stream table's own Delta path: the algebraic aggregate rule reads its stored state from it
    target_path: str | None = None

    def table(self, key: str, state: State) -> str:
        ref = self.sources[key]
        version = ref.post if state == "post" or ref.pre is None else ref.pre
        return f"delta.{quote(ref.path)} VERSION AS OF {version}"

    def changes(self, key: str) -> str:
        ref = self.sources[key]
        assert ref.pre is not None, "a change window needs a pre frontier"
        return f"table_changes_by_path({sql_string(ref.path)}, {ref.pre + 1}, {ref.post})"

    def changed(self, key: str) -> bool:
        return self.sources[key].changed

    def mult_col(self, key: str) -> str | None:
        return self.sources[key].mult_col

    def target(self) -> str:
        assert self.target_path is not None
        return f"delta.{quote(self.target_path)}"
