"""Views as sources: a defining query that reads a (temporary or catalog) view is maintained over the view's
base tables, by inlining the view's SQL text (nested views too) as a derived table before compiling.

Why inline: a view has no versions and no Change Data Feed; its base tables do. Inlined, the query's
sources are the base tables, so frontiers, dependencies and change windows are theirs, and the view's
operators are differentiated like the rest of the query.

Pure: :func:`inline_views` walks the SQL; the caller answers, for every table name it meets, whether it is
a view (and gives its text) or a table (and how to name it), which needs the Spark catalog
(``pipeline.api``). The view's definition is captured once, when the stream table is created.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from dvm.dialect import dialect_of
from dvm.errors import QueryError
from dvm.parser import cte_names, parse, table_key
from dvm.rewrite import retarget

#: deepest nesting of views followed before giving up (Spark itself refuses cycles)
MAX_DEPTH = 32


@dataclass(frozen=True)
class ViewDef:
    """A view as the catalog describes it.

    ``name``: its key (lower case, as the resolver names it); ``sql``: its SELECT text; ``columns``: its
    column names, positional to the SELECT's outputs (they may differ: ``CREATE VIEW v (a, b) AS ...``);
    ``context``: anything the resolver needs to resolve the names inside the view's text (its catalog and
    namespace, whether it is temporary); passed back to the resolver untouched."""

    name: str
    sql: str
    columns: list[str]
    context: dict[str, object] = field(default_factory=dict, compare=False)


#: resolve(name, inside) -> the key to read the table by, or the view to inline. ``name`` is the normalised
#: table name as written (``db.t`` or ``t``); ``inside`` the view whose text names it (None: the query).
Resolver = Callable[[str, "ViewDef | None"], "str | ViewDef"]


def inline_views(sql: str, resolve: Resolver, dialect: str = "spark") -> tuple[str, list[str]]:
    """``sql`` with every view it reads replaced by ``(<view text>) AS <alias>(<view columns>)``, and the
    views inlined (outermost first). Without views the text comes back unchanged."""
    tree = parse(sql, dialect)
    inlined: list[str] = []
    changed = _expand(tree, None, resolve, inlined, [], dialect)
    return (tree.sql(dialect=dialect_of(dialect)) if changed else sql), inlined


def _expand(tree: exp.Expression, inside: ViewDef | None, resolve: Resolver, inlined: list[str],
            chain: list[str], dialect: str) -> bool:
    ctes = cte_names(tree)
    changed = False
    for t in list(tree.find_all(exp.Table)):
        if not t.name or isinstance(t.this, exp.Func) or (not t.db and t.name.lower() in ctes):
            continue
        key = table_key(t)
        target = resolve(key, inside)
        if isinstance(target, str):
            if target != key:  # a name inside a view, qualified by the view's namespace
                parts = target.split(".")
                retarget(t, parts[-1], parts[-2] if len(parts) > 1 else None,
                         parts[-3] if len(parts) > 2 else None)
                changed = True
            continue
        view = target
        if view.name in chain or len(chain) >= MAX_DEPTH:
            raise QueryError(f"views nest too deeply or form a cycle: {' -> '.join(chain + [view.name])}")
        for arg in ("version", "when", "sample", "changes"):
            if t.args.get(arg) is not None:
                raise QueryError(f"view {view.name} cannot be read with {arg.upper()} (only tables have "
                                 "versions)")
        try:
            body = parse(view.sql, "spark")
        except QueryError as e:
            raise QueryError(f"the text of view {view.name} cannot be read: {e}") from None
        inlined.append(view.name)
        _expand(body, view, resolve, inlined, chain + [view.name], dialect)
        given = t.args.get("alias")
        columns = [c.name for c in given.columns] if given is not None and given.columns else view.columns
        alias = exp.TableAlias(this=exp.to_identifier(t.alias_or_name),
                               columns=[exp.to_identifier(c) for c in columns])
        t.replace(exp.Subquery(this=body, alias=alias))
        changed = True
    return changed
