"""The top of a stream table: its storage layout, its full-refresh query and its MERGE.

Two layouts, chosen from the shape of the tree:

* **keyed** — the query ends in an aggregate (GROUP BY, a global aggregate, or DISTINCT), optionally
  under HAVING and a projection. One stored row per group; ``__row_id`` = xxhash64 of the group key; the
  group's state (``__cnt`` and per-aggregate ``__agg<i>_*`` columns) is stored beside the user columns, so
  a refresh reads the old state from the stream table itself instead of rescanning sources.
* **bag** — anything else. One stored row per distinct output tuple; ``__row_id`` = xxhash64 of the tuple;
  ``__mult`` counts its duplicates, so bags are exact without relying on unique hashes per duplicate.

Both the FULL and the DIFFERENTIAL path compute ``__row_id`` with the same expression, so a table refreshed
either way is bit-for-bit the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dvm.context import Context, quote
from dvm.operators import Aggregate, Filter, Node, Project
from dvm.operators.aggregate import key_match
from dvm.operators.base import W, col_list

ROW_ID = "__row_id"
MULT = "__mult"
CNT = "__cnt"
DEL = "__del"
DW = "__dw"


FLOATING = ("double", "float")


def _canonical(col: str, ty: str) -> str:
    """The identity of a value for ``__row_id``. Floating values are identified by 12 significant
    digits: a SUM over doubles recomputed in another order can differ in its last bits, and the row it
    must delete has to be found all the same."""
    if ty.lower() in FLOATING:
        return f"format_string('%.12g', {col} + 0.0)"
    return col


def bag_rows_sql(inner: str, names: list[str], types: list[str], weight: str | None) -> str:
    """Consolidate a bag (``weight`` None: count rows) or Z-set (``weight``: sum it) on the user columns
    into one row per distinct tuple, with its ``__row_id`` and multiplicity (``__mult`` or ``__dw``)."""
    keys, picks = [], []
    for n, ty in zip(names, types, strict=True):
        q = quote(n)
        if ty.lower() in FLOATING:
            keys.append(_canonical(q, ty))
            picks.append(f"MAX({q}) AS {q}")
        else:
            keys.append(q)
            picks.append(q)
    group = ", ".join(keys)
    if weight is None:
        return f"SELECT {', '.join(picks)}, xxhash64({group}) AS {ROW_ID}, COUNT(*) AS {MULT} FROM ({inner}) GROUP BY {group}"
    return (f"SELECT {', '.join(picks)}, xxhash64({group}) AS {ROW_ID}, SUM({weight}) AS {DW} FROM ({inner}) "
            f"GROUP BY {group} HAVING SUM({weight}) <> 0")


@dataclass
class KeyedTop:
    agg: Aggregate
    having: exp.Expression | None
    project: list[tuple[str, exp.Expression]]  # positional output expressions over agg.cols

    @property
    def group_names(self) -> list[str]:
        return [n for n, _ in self.agg.groups]

    def state_cols(self) -> list[str]:
        return [CNT] + [c for a in self.agg.aggs for c, _ in a.state()]

    def row_id(self, prefix: str = "") -> str:
        if not self.agg.groups:
            return "CAST(0 AS BIGINT)"
        return f"xxhash64({col_list(self.group_names, prefix)})"

    @property
    def strategy(self) -> str:
        if self.having is not None:
            return "group rescan (HAVING hides groups, so they have no stored state)"
        if any(a.func in ("min", "max") for a in self.agg.aggs):
            return "algebraic, with a rescan of groups whose MIN/MAX value was deleted"
        return "algebraic (state kept in hidden columns)"


def keyed_top(root: Node) -> KeyedTop | None:
    """Recognise Project? ∘ Filter(HAVING)? ∘ Aggregate at the top of the tree."""
    if isinstance(root, Aggregate):
        return KeyedTop(root, None, [(n, exp.column(n, quoted=True)) for n in root.cols])
    if isinstance(root, Project):
        below = root.child
        having = None
        if isinstance(below, Filter) and isinstance(below.child, Aggregate):
            having, below = below.predicate, below.child
        if isinstance(below, Aggregate):
            return KeyedTop(below, having, list(root.items))
    return None


@dataclass
class Plan:
    """A compiled defining query."""

    root: Node
    names: list[str]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.keyed = keyed_top(self.root)

    @property
    def layout(self) -> str:
        return "keyed" if self.keyed else "bag"

    def hidden_columns(self) -> list[str]:
        return [ROW_ID] + (self.keyed.state_cols() if self.keyed else [MULT])

    # --- shared pieces ---

    def _user_select(self, types: list[str], deleted: str | None = None) -> str:
        """User columns from the keyed top's projection, cast to the query's own result types."""
        assert self.keyed is not None
        out = []
        for (_, e), name, ty in zip(self.keyed.project, self.names, types, strict=True):
            value = f"CAST({e.sql(dialect='spark')} AS {ty})"
            if deleted:
                value = f"CASE WHEN {deleted} THEN NULL ELSE {value} END"
            out.append(f"{value} AS {quote(name)}")
        return ", ".join(out)

    def _with_outputs(self, sql: str) -> str:
        """Add each aggregate's value (computed from its state) under its internal name."""
        assert self.keyed is not None
        outs = [f"{a.output()} AS {quote(a.name)}" for a in self.keyed.agg.aggs]
        return f"SELECT *{', ' if outs else ''}{', '.join(outs)} FROM ({sql})"

    def _full_state_select(self) -> str:
        assert self.keyed is not None
        agg = self.keyed.agg
        items = [agg.group_select()] if agg.groups else []
        items.append(f"COUNT(*) AS {CNT}")
        items += [f"{sql} AS {c}" for a in agg.aggs for c, sql in a.state()]
        return ", ".join(items)

    def _state_list(self, prefix: str = "") -> str:
        assert self.keyed is not None
        return ", ".join(prefix + c for c in self.keyed.state_cols())

    # --- full refresh ---

    def full_sql(self, ctx: Context, types: list[str]) -> str:
        """Every stored row (user and hidden columns) of the stream table at the post frontier."""
        if self.keyed is None:
            cast = ", ".join(f"CAST({quote(i)} AS {ty}) AS {quote(n)}"
                             for i, n, ty in zip(self.root.cols, self.names, types, strict=True))
            return bag_rows_sql(f"SELECT {cast} FROM ({self.root.snapshot(ctx, 'post')})", self.names, types, None)
        k = self.keyed
        agg = k.agg
        state = f"SELECT {self._full_state_select()} FROM ({agg.child.snapshot(ctx, 'post')}){agg.group_by()}"
        where = f" WHERE {k.having.sql(dialect='spark')}" if k.having is not None else ""
        return (f"SELECT {k.row_id()} AS {ROW_ID}, {self._user_select(types)}, {self._state_list()} "
                f"FROM ({self._with_outputs(state)}){where}")

    # --- differential refresh ---

    def merge_source_sql(self, ctx: Context, types: list[str]) -> str | None:
        """Rows to MERGE into the stream table on ``__row_id``; None when provably nothing changed."""
        if self.keyed is None:
            d = self.root.delta(ctx)
            if d is None:
                return None
            cast = ", ".join(f"CAST({quote(i)} AS {ty}) AS {quote(n)}"
                             for i, n, ty in zip(self.root.cols, self.names, types, strict=True))
            return bag_rows_sql(f"SELECT {cast}, {W} FROM ({d})", self.names, types, W)
        fin = self._rescan_groups(ctx) if self.keyed.having is not None else self._algebraic(ctx)
        if fin is None:
            return None
        k = self.keyed
        conds = [f"{CNT} <= 0"] if k.agg.groups else []
        if k.having is not None:
            conds.append(f"NOT COALESCE(({k.having.sql(dialect='spark')}), FALSE)")
        deleted = " OR ".join(f"({c})" for c in conds) if conds else "FALSE"
        return (f"SELECT {k.row_id()} AS {ROW_ID}, {self._user_select(types, DEL)}, {self._state_list()}, "
                f"{DEL} FROM (SELECT *, {deleted} AS {DEL} FROM ({self._with_outputs(fin)}))")

    def _algebraic(self, ctx: Context) -> str | None:
        k = self.keyed
        assert k is not None
        agg = k.agg
        dchild = agg.child.delta(ctx)
        if dchild is None:
            return None
        groups = [agg.group_select()] if agg.groups else []
        d_items = groups + [f"COALESCE(SUM({W}), 0) AS __d_cnt"]
        d_items += [f"{sql} AS {c}" for a in agg.aggs for c, sql in a.delta_terms()]
        d = f"SELECT {', '.join(d_items)} FROM ({dchild}){agg.group_by()}"
        old = [f"__o.{CNT} AS __o_cnt"] + [
            f"__o.{c} AS {c.replace('__agg', '__o', 1)}" for a in agg.aggs for c, _ in a.state()
        ]
        j = (f"SELECT __d.*, {', '.join(old)} FROM ({d}) __d LEFT JOIN {ctx.target()} __o "
             f"ON __o.{ROW_ID} = {k.row_id('__d.')}")
        rescans = [c for a in agg.aggs if (c := a.needs_rescan())]
        n_items = ([col_list(k.group_names)] if agg.groups else []) + [f"COALESCE(__o_cnt, 0) + __d_cnt AS {CNT}"]
        n_items += [f"{sql} AS {c}" for a in agg.aggs for c, sql in a.merged_state()]
        n_items.append(f"({' OR '.join(rescans) if rescans else 'FALSE'}) AS __rescan")
        n = f"SELECT {', '.join(n_items)} FROM ({j})"
        if not rescans:
            return n
        state = self._state_list()
        keys = f"SELECT {col_list(k.group_names) if agg.groups else '1 AS __one'} FROM ({n}) WHERE __rescan"
        rescanned = agg.restricted(ctx, "post", keys, self._full_state_select())
        kept = f"SELECT {col_list(k.group_names) + ', ' if agg.groups else ''}{state} FROM ({n}) WHERE NOT __rescan"
        fresh_state = ", ".join([f"COALESCE(__s.{CNT}, 0) AS {CNT}"] + [f"__s.{c}" for c in k.state_cols()[1:]])
        redone = (f"SELECT {col_list(k.group_names, '__k.') + ', ' if agg.groups else ''}{fresh_state} "
                  f"FROM ({keys}) __k LEFT JOIN ({rescanned}) __s ON {key_match('__k', '__s', k.group_names)}")
        return f"SELECT * FROM ({kept}) UNION ALL SELECT * FROM ({redone})"

    def _rescan_groups(self, ctx: Context) -> str | None:
        k = self.keyed
        assert k is not None
        agg = k.agg
        keys = agg.affected_keys(ctx)
        if keys is None:
            return None
        rescanned = agg.restricted(ctx, "post", keys, self._full_state_select())
        fresh_state = ", ".join([f"COALESCE(__s.{CNT}, 0) AS {CNT}"] + [f"__s.{c}" for c in k.state_cols()[1:]])
        return (f"SELECT {col_list(k.group_names, '__k.') + ', ' if agg.groups else ''}{fresh_state} "
                f"FROM ({keys}) __k LEFT JOIN ({rescanned}) __s ON {key_match('__k', '__s', k.group_names)}")

    def merge_statement(self, target: str, source_sql: str) -> str:
        users = col_list(self.names)
        if self.keyed is None:
            return (
                f"MERGE INTO {target} __t USING ({source_sql}) __s ON __t.{ROW_ID} = __s.{ROW_ID}\n"
                f"WHEN MATCHED AND __t.{MULT} + __s.{DW} <= 0 THEN DELETE\n"
                f"WHEN MATCHED THEN UPDATE SET {MULT} = __t.{MULT} + __s.{DW}\n"
                f"WHEN NOT MATCHED AND __s.{DW} > 0 THEN INSERT ({users}, {ROW_ID}, {MULT}) "
                f"VALUES ({col_list(self.names, '__s.')}, __s.{ROW_ID}, __s.{DW})"
            )
        cols = self.names + self.keyed.state_cols()
        sets = ", ".join(f"{quote(c)} = __s.{quote(c)}" for c in cols)
        return (
            f"MERGE INTO {target} __t USING ({source_sql}) __s ON __t.{ROW_ID} = __s.{ROW_ID}\n"
            f"WHEN MATCHED AND __s.{DEL} THEN DELETE\n"
            f"WHEN MATCHED THEN UPDATE SET {sets}\n"
            f"WHEN NOT MATCHED AND NOT __s.{DEL} THEN INSERT ({ROW_ID}, {col_list(cols)}) "
            f"VALUES (__s.{ROW_ID}, {col_list(cols, '__s.')})"
        )

    # --- explain ---

    def tree_text(self) -> str:
        lines: list[str] = []

        def walk(n: Node, depth: int) -> None:
            how = self.keyed.strategy if self.keyed is not None and n is self.keyed.agg else n.strategy()
            lines.append("  " * depth + f"{n.label()}    -- {how}")
            for c in n.children:
                walk(c, depth + 1)

        if self.keyed is not None:
            lines.append(f"[top: keyed layout; {self.keyed.strategy}]")
        else:
            lines.append("[top: bag layout; rows consolidated on all columns, duplicates in __mult]")
        walk(self.root, 0)
        return "\n".join(lines)
