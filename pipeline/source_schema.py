"""Source schema evolution of Delta sources: what a refresh does when a source's columns changed.

A stream table is compiled against its sources' schemas. Each successful refresh records, per base source,
the columns it saw (name, type, and under column mapping the column's id) and the columns the query reads
(``StreamTableDef.source_schema``). The next refresh compares that record with the source's ``metaData`` at
the new frontier (read anyway, no Spark job) and decides:

* nothing changed, or only columns the query does not read were *added*: carry on (DIFFERENTIAL stays
  DIFFERENTIAL) and leave a note in the refresh's reason;
* a column was widened (Delta type widening, e.g. INT -> BIGINT) or changed type, a column
  was dropped and added again under the same name (column mapping gives it a new id: its old values are
  gone), or a column the query does not read was dropped or renamed (the change feed cannot be read across
  that): REINITIALIZE, with the reason;
* a column the query reads was dropped or renamed: ERROR, naming the column and the remedy. Nothing is
  applied, and an ERROR table is not scheduled again until a user resumes it.

A query that selects ``*`` reads every column, the ones added later too: an added column then
REINITIALIZEs (and the refresh's output check says the query's columns changed).

Pure: it reads schema JSON and a compiled plan, never Spark.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from connectors.debezium_schema import is_widening
from dvm import Node, Scan

MAPPING_ID = "delta.columnMapping.id"

__all__ = ["SourceColumn", "Verdict", "columns_of", "compare", "is_widening", "read_columns", "record",
           "selects_star"]

@dataclass(frozen=True)
class SourceColumn:
    """One top-level column of a source as a stream table saw it."""

    name: str
    type: str
    #: the column-mapping id (``delta.columnMapping.id``): a column dropped and added again gets a new one;
    #: None without column mapping
    id: int | None = None


@functools.lru_cache(maxsize=256)
def _columns(schema_json: str) -> tuple[SourceColumn, ...]:
    from pyspark.sql.types import StructType  # pure Python: no JVM

    schema = StructType.fromJson(json.loads(schema_json))
    out = []
    for f in schema.fields:
        raw = (f.metadata or {}).get(MAPPING_ID)
        out.append(SourceColumn(f.name, f.dataType.simpleString(), int(raw) if raw is not None else None))
    return tuple(out)


def columns_of(schema_json: str) -> list[SourceColumn]:
    """The top-level columns of a Delta ``schemaString`` (parsed once per distinct schema)."""
    return list(_columns(schema_json))


def record(schema_json: str, read: Iterable[str] | None, star: bool = False) -> dict[str, Any]:
    """What a stream table stores about one source: its columns and the ones the query reads (None: not
    known, treat every column as read), and whether the query selects ``*``."""
    return {"columns": [[c.name, c.type, c.id] for c in columns_of(schema_json)],
            "read": sorted({r.lower() for r in read}) if read is not None else None, "star": star}


@dataclass
class Verdict:
    """The decision for one refresh over all sources: ``action`` is NONE, REINITIALIZE or ERROR."""

    action: str = "NONE"
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the source keys compared
    checked: set[str] = field(default_factory=set)

    def add(self, action: str, reason: str) -> None:
        rank = {"NONE": 0, "REINITIALIZE": 1, "ERROR": 2}
        if rank[action] > rank[self.action]:
            self.action, self.reasons = action, []
        if action == self.action:
            self.reasons.append(reason)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def compare(table: str, source: str, seen: Mapping[str, Any], schema_json: str, verdict: Verdict) -> bool:
    """Add to ``verdict`` what ``source``'s schema now (``schema_json``) means for stream table ``table``,
    which was compiled against ``seen`` (a :func:`record`). False when the columns are the same as seen."""
    before = [SourceColumn(n, t, i) for n, t, i in seen["columns"]]
    after = columns_of(schema_json)
    if before == after:
        return False
    now = {c.name.lower(): c for c in after}
    by_id = {c.id: c for c in after if c.id is not None}
    read = set(seen["read"]) if seen.get("read") is not None else {c.name.lower() for c in before}
    for old in before:
        key = old.name.lower()
        new = now.get(key)
        moved = by_id.get(old.id) if old.id is not None else None
        reads = key in read
        if new is None:
            what = f"renamed to {moved.name}" if moved is not None else "dropped"
            if reads:
                to = f"to read {moved.name}" if moved is not None else "so that it no longer reads it"
                back = "rename the column back" if moved is not None else f"add column {old.name} back to {source}"
                verdict.add("ERROR", f"column {old.name} of source {source} was {what}, and stream table {table} "
                                     f"reads it. Alter the stream table's query {to} (or drop and re-create the "
                                     f"stream table), or restore the column ({back}); then resume the table "
                                     "(alter its status to ACTIVE)")
            else:
                verdict.add("REINITIALIZE", f"source {source} changed its schema: column {old.name}, which the "
                                            f"query does not read, was {what} (the change feed cannot be read "
                                            "across it)")
            continue
        if old.id is not None and new.id is not None and old.id != new.id:
            verdict.add("REINITIALIZE", f"source {source} changed its schema: column {old.name} was dropped and "
                                        f"added again (column mapping id {old.id} -> {new.id}); its old values are "
                                        "gone")
        elif old.type != new.type:
            how = "widened" if is_widening(old.type, new.type) else "changed its type"
            unread = "" if reads else " (not read by the query, but the change feed is not read across it)"
            verdict.add("REINITIALIZE", f"source {source} changed its schema: column {old.name} {how} from "
                                        f"{old.type} to {new.type}{unread}")
    known = {c.name.lower() for c in before}
    for c in after:
        if c.name.lower() not in known:
            if seen.get("star"):
                verdict.add("REINITIALIZE", f"source {source} changed its schema: column {c.name} {c.type} was "
                                            "added, and the query selects *")
            else:
                verdict.notes.append(f"source {source} added column {c.name} {c.type} (not read by the query)")
    return True


def read_columns(plan: Node | None) -> dict[str, set[str]]:
    """Per source key, the source columns the compiled plan reads (its scans' columns, lower case). A source
    the walk finds no scan of is absent: the caller treats every column of it as read."""
    out: dict[str, set[str]] = {}
    seen: set[int] = set()
    stack: list[Any] = [plan] if plan is not None else []
    while stack:
        n = stack.pop()
        if isinstance(n, (list, tuple)):
            stack.extend(n)
            continue
        if isinstance(n, dict):
            stack.extend(n.values())
            continue
        if not isinstance(n, Node) or id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, Scan):
            out.setdefault(n.source.lower(), set()).update(s.lower() for s, _ in n.columns)
        stack.extend(v for v in vars(n).values() if isinstance(v, (Node, list, tuple, dict)))
    return out


@functools.lru_cache(maxsize=1024)
def selects_star(query: str, dialect: str = "spark") -> bool:
    """Whether the query selects ``*`` or ``t.*`` anywhere (not ``COUNT(*)``): such a query reads columns a
    source gains later."""
    try:
        tree = sqlglot.parse_one(query, read=dialect)
    except sqlglot.errors.ParseError:
        return True  # unknown: the cautious answer
    for star in tree.find_all(exp.Star):
        parent = star.parent
        if isinstance(parent, exp.Column):
            parent = parent.parent
        if isinstance(parent, exp.Select):
            return True
    return False
