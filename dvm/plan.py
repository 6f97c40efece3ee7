"""The top of a stream table: its storage layout, its full-refresh query and its change rows.

Two layouts, chosen from the shape of the tree:

* **keyed** — the query ends in an aggregate (GROUP BY, a global aggregate, or DISTINCT), optionally
  under HAVING and a projection. One stored row per group; ``__row_id`` = xxhash64 of the group key; the
  group's state (``__cnt`` and per-aggregate ``__agg<i>_*`` columns) is stored beside the user columns, so
  a refresh reads the old state from the stream table itself instead of rescanning sources. FULL and
  DIFFERENTIAL refreshes compute ``__row_id`` with the same expression.
* **bag** (plain rows) — anything else. The table holds exactly the query's rows: one physical row per
  copy, duplicates as separate rows, so Spark SQL, delta-rs, DuckDB or Polars read the query's result by
  selecting the user columns, with no expansion step. Two hidden columns: ``__row_hash`` = xxhash64 of the
  user tuple (:func:`row_hash`; floating columns canonicalised), equal for all copies of a tuple, and
  ``__row_id``, unique per physical row. A FULL refresh numbers rows with ``xxhash64(salt) ^
  monotonically_increasing_id()`` (no shuffle, no GROUP BY); a DIFFERENTIAL refresh nets its delta per
  distinct tuple (``__dw``), gives each new copy ``xxhash64(salt, __row_hash, copy)`` and deletes ``-__dw``
  stored copies picked by ``__row_hash``. ``salt`` is :attr:`Context.salt`, fresh per refresh, so ids of
  rows inserted by different refreshes do not repeat. Ids therefore differ between a table refreshed FULL
  and one refreshed DIFFERENTIAL; their user columns are the same multiset.
  When the query ends in ORDER BY ... LIMIT (a TopK, optionally under the projection dropping hidden sort
  columns) the stored rows are the top of the pre snapshot: a refresh computes the top of the post snapshot
  and nets it against the stored rows (each weighing -1), never reading the pre snapshot.

Change rows — the contract between the rules here and whatever applies a DIFFERENTIAL refresh (Spark's
MERGE, :meth:`Plan.merge_statement`, or a delta-rs commit), the same for both layouts:

* :meth:`Plan.merge_source_sql` returns rows with the columns :meth:`Plan.stored_columns` (every stored
  column in table order, ``__row_id`` first: ``__row_id``, the user columns, then the layout's other hidden
  columns: ``__row_hash`` for bag, ``__cnt`` and the aggregate state for keyed), plus ``__del`` BOOLEAN.
  ``__row_id`` is unique among them.
* ``__del`` true: delete the stored row with that ``__row_id`` (its other columns are NULL or meaningless).
* ``__del`` false: keyed — upsert (update the stored row with that ``__row_id``, or insert it); bag — insert:
  its ``__row_id`` is fresh, so it never matches a stored row, and a change without ``__del`` rows can be
  committed as a plain append.

So the apply is one MERGE on ``__row_id``: ``WHEN MATCHED AND __del THEN DELETE``, ``WHEN MATCHED THEN UPDATE``
(keyed only), ``WHEN NOT MATCHED AND NOT __del THEN INSERT`` the stored columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dvm.context import FLOAT_IDENTITIES, FLOAT_IDENTITY, Context, Fixpoint, quote, sql_string
from dvm.dialect import SPARK, rendered_once
from dvm.operators import Aggregate, Filter, Node, Project, RecursiveCte, TopK
from dvm.operators.aggregate import Branch, key_match
from dvm.operators.base import W, col_list, union_all
from dvm.operators.cte import with_shared

ROW_ID = "__row_id"
ROW_HASH = "__row_hash"
CNT = "__cnt"
DEL = "__del"
DW = "__dw"


FLOATING = ("double", "float")

def _canonical(col: str, ty: str, identity: str = FLOAT_IDENTITY) -> str:
    """The identity of a value for ``__row_hash`` and for netting a delta per tuple: the value itself, but
    floating values rounded (:func:`_float_identity`) and, in tables of ``bits37+nested``, arrays, maps and
    structs rewritten by :func:`_nested_identity`."""
    if identity not in FLOAT_IDENTITIES:
        raise ValueError(f"unknown float identity {identity!r} (a stream table's catalog file says how it hashes "
                         f"floats: one of {', '.join(FLOAT_IDENTITIES)})")
    if ty.lower() in FLOATING:
        return _float_identity(col, identity)
    if identity.endswith("+nested") and ty.lower().startswith(NESTED):
        return _nested_identity(col, nested_type(ty), identity, 0)
    return col


def _float_identity(col: str, identity: str) -> str:
    """A floating value rounded. A SUM over doubles recomputed in another order can differ in its last bits,
    and the row it must delete has to be found all the same. Veltkamp: with ``c = x * (2^16 + 1)``,
    ``c - (c - x)`` is ``x`` rounded to 53 - 16 bits; the guard keeps ``c`` finite, ``+ 0.0`` makes -0.0 0.0.
    Either form can still split two sums that straddle a rounding boundary (measured on random 20-term sums
    in two orders: 17 in 200,000 for ``bits37``, 54 for ``digits12``)."""
    if identity == "digits12":
        return f"format_string('%.12g', {col} + 0.0)"
    x = f"CAST({col} AS DOUBLE)"
    return f"(CASE WHEN abs({x}) < 1e300D THEN {x} * 65537D - ({x} * 65537D - {x}) ELSE {x} END + 0.0D)"


NESTED = ("array", "map", "struct")

#: a type as :func:`nested_type` reads it: a scalar type's name, or ("array", element), ("map", key, value),
#: ("struct", [(field name, type), ...])
NestedType = str | tuple


def nested_type(ty: str) -> NestedType:
    """Spark's ``simpleString`` of a type (how the catalog stores a stream table's column types) read into
    :data:`NestedType`. Not sqlglot's type parser: it reads ``struct<a b:int>`` as a struct of no field and
    ``struct<end:int,select:int>`` as one of ``end`` alone, and an identity missing a field would make
    distinct rows one. Field names are taken up to their first ``:``; a type that Spark shortened (``... 3
    more fields``, past ``spark.sql.debug.maxToStringFields``) is refused."""
    t = ty.strip()
    low = t.lower()
    if "more field" in low:
        raise ValueError(f"the column type {ty!r} was shortened by Spark: raise spark.sql.debug.maxToStringFields "
                         "above the widest struct's field count and re-create the stream table")
    for kind in NESTED:
        if low.startswith(f"{kind}<") and t.endswith(">"):
            parts = _top_level_split(t[len(kind) + 1:-1])
            if kind == "array" and len(parts) == 1:
                return ("array", nested_type(parts[0]))
            if kind == "map" and len(parts) == 2:
                return ("map", nested_type(parts[0]), nested_type(parts[1]))
            if kind == "struct" and all(":" in p for p in parts):
                return ("struct", [(p.split(":", 1)[0], nested_type(p.split(":", 1)[1])) for p in parts])
            raise ValueError(f"cannot read the column type {ty!r}")
    return low


def _top_level_split(inner: str) -> list[str]:
    """``inner`` split at the commas outside ``<...>`` and ``(...)`` (a decimal's precision and scale)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += (c in "<(") - (c in ">)")
        if c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    return [*parts, inner[start:]] if inner else parts


def _nested_identity(col: str, ty: NestedType, identity: str, depth: int) -> str:
    """An array, map or struct as a value Spark can hash, group and sort, equal for two values exactly when
    they are equal element by element. Spark's ``xxhash64`` skips NULLs inside nested values (``[1, NULL]``
    and ``[NULL, 1]`` hash alike) and refuses maps; GROUP BY refuses maps too. So every element of an array,
    value of a map and field of a struct becomes ``named_struct('n', <is NULL>, 'v', <its identity>)``, and a
    map becomes the array of its entries sorted (its keys are unique and never NULL). Floats inside are
    rounded as at the top. The top-level NULL is left to :func:`row_hash`'s marker."""
    if isinstance(ty, str):
        return _float_identity(col, identity) if ty in FLOATING else col
    if ty[0] == "array":
        x = f"__e{depth}"
        return _sized(col, f"transform({col}, {x} -> {_flagged(x, ty[1], identity, depth + 1)})")
    if ty[0] == "map":
        e = f"__e{depth}"
        entry = (f"named_struct('k', {_nested_identity(f'{e}.key', ty[1], identity, depth + 1)}, "
                 f"'v', {_flagged(f'{e}.value', ty[2], identity, depth + 1)})")
        return _sized(col, f"array_sort(transform(map_entries({col}), {e} -> {entry}))")
    fields = ", ".join(f"{sql_string(f'f{i}')}, {_flagged(f'{col}.{quote(name)}', t, identity, depth)}"
                       for i, (name, t) in enumerate(ty[1]))
    return f"IF(({col}) IS NULL, NULL, named_struct({fields}))"


def _sized(col: str, elements: str) -> str:
    """A collection's identity led by its size: an empty one hashes to the seed, as NULL does, and a one-column
    table's ``__row_hash`` has no NULL marker to tell them apart."""
    return f"IF(({col}) IS NULL, NULL, named_struct('size', size({col}), 'e', {elements}))"


def _flagged(col: str, ty: NestedType, identity: str, depth: int) -> str:
    """``col`` (inside a nested value) with its NULL flagged, so a NULL element counts in the hash."""
    return f"named_struct('n', ({col}) IS NULL, 'v', {_nested_identity(col, ty, identity, depth)})"


def row_hash(keys: list[str]) -> str:
    """``xxhash64`` of ``keys`` (SQL expressions) that tells NULLs apart by position. Spark's hash skips NULL
    arguments, so ('a', NULL) and (NULL, 'a') hash alike: rows of an outer join padded on different sides,
    or groups (NULL, 1) and (1, NULL), would share a ``__row_id``. A marker of the NULL positions is
    appended; it is itself NULL (so skipped) when no key is NULL, which keeps NULL-free ids unchanged.

    The marker string is built only for a row with a NULL key (``CASE WHEN <any key NULL> THEN concat(...)
    END``, the same value as ``nullif(concat(...), '00..0')``): building it for every row cost a FULL refresh
    of 10M plain rows about 1 s of its 1.5 s of hashing (docs/BENCHMARKS.md, "FULL against the user's CTAS")."""
    if len(keys) < 2:
        return f"xxhash64({', '.join(keys)})"
    flags = ", ".join(f"IF(({k}) IS NULL, '1', '0')" for k in keys)
    any_null = " OR ".join(f"({k}) IS NULL" for k in keys)
    return f"xxhash64({', '.join(keys)}, CASE WHEN {any_null} THEN concat({flags}) END)"


def _hash_keys(names: list[str], types: list[str], identity: str) -> list[str]:
    """The user columns as :func:`row_hash` reads them (floating values canonicalised)."""
    return [_canonical(quote(n), ty, identity) for n, ty in zip(names, types, strict=True)]


def plain_rows_sql(inner: str, names: list[str], types: list[str], salt: str,
                   identity: str = FLOAT_IDENTITY) -> str:
    """Every stored row of a bag (plain-rows) table from ``inner`` (the query's rows, user columns named
    ``names``): the rows as they are, with ``__row_hash`` and a ``__row_id`` unique per row.

    No GROUP BY, no shuffle, no window: ``monotonically_increasing_id()`` is unique within one evaluation,
    and XOR with a constant keeps it so (a bijection), unlike a hash of it, which could collide. The constant
    is a hash of the refresh's ``salt``, so two FULL refreshes number their rows differently and a later
    DIFFERENTIAL refresh's hashed ids meet a FULL's only by 64-bit chance."""
    return (f"SELECT xxhash64({sql_string(salt)}) ^ monotonically_increasing_id() AS {ROW_ID}, "
            f"{col_list(names)}, {row_hash(_hash_keys(names, types, identity))} AS {ROW_HASH} FROM ({inner})")


def bag_delta_sql(inner: str, names: list[str], types: list[str], weight: str,
                  identity: str = FLOAT_IDENTITY) -> str:
    """Net a Z-set (``inner``: the user columns and ``weight``) per distinct tuple: the tuple, its
    ``__row_hash`` and its net weight ``__dw`` (tuples netting to 0 dropped). Floating columns are grouped
    by their canonical form (:func:`_canonical`) so copies recomputed in another summation order net out, and
    nested values by theirs (a map cannot be grouped at all)."""
    keys, picks = [], []
    for n, ty in zip(names, types, strict=True):
        q = quote(n)
        key = _canonical(q, ty, identity)
        keys.append(key)
        # the group's one value: equal by their identity, copies differ at most in a float's last bits
        picks.append(q if key == q else f"{'MAX' if ty.lower() in FLOATING else 'any_value'}({q}) AS {q}")
    return (f"SELECT {', '.join(picks)}, {row_hash(keys)} AS {ROW_HASH}, SUM({weight}) AS {DW} FROM ({inner}) "
            f"GROUP BY {', '.join(keys)} HAVING SUM({weight}) <> 0")


def bag_changes_sql(delta: str, names: list[str], types: list[str], target: str, salt: str,
                    broadcast: bool = False) -> str:
    """Change rows (see the module docstring) of a bag table from ``delta`` (a relation with the columns
    of :func:`bag_delta_sql`), which the query reads twice:

    * each tuple with ``__dw`` > 0 becomes ``__dw`` new rows, ``__row_id = xxhash64(salt, __row_hash, copy)``
      (unique within the refresh, and ``salt`` makes it new to the table);
    * for each tuple with ``__dw`` < 0, ``-__dw`` of its stored copies (found by ``__row_hash``, numbered by
      ``__row_id``: which copies go does not matter, they are equal) become ``__del`` rows.

    Only two columns of the table are read, by an inner join with the negative tuples. No join hint: Spark
    knows the table's size but not the held delta's, so it broadcasts a table under
    ``spark.sql.autoBroadcastJoinThreshold`` and sort-merges a larger one; broadcasting the negative tuples
    instead would save that shuffle, but a window deleting very many distinct rows would then fill the
    driver's memory. ``broadcast`` (the refresh executor knows the window is small, see
    :attr:`dvm.context.Context.small_delta`): broadcast the negative tuples, so the table is only scanned,
    never shuffled (at 10M stored rows the sort-merge join shuffled both hidden columns)."""
    users = col_list(names)
    ins = (f"SELECT xxhash64({sql_string(salt)}, {ROW_HASH}, __copy) AS {ROW_ID}, {users}, {ROW_HASH}, "
           f"FALSE AS {DEL} FROM (SELECT * FROM {delta} WHERE {DW} > 0) "
           f"LATERAL VIEW explode(sequence(1, {DW})) __copies AS __copy")
    nulls = ", ".join(f"CAST(NULL AS {ty}) AS {quote(n)}" for n, ty in zip(names, types, strict=True))
    hint = "/*+ BROADCAST(__d) */ " if broadcast else ""
    ranked = (f"SELECT {hint}__t.{ROW_ID}, __t.{ROW_HASH}, __d.{DW}, "
              f"row_number() OVER (PARTITION BY __t.{ROW_HASH} ORDER BY __t.{ROW_ID}) AS __copy "
              f"FROM {target} __t JOIN (SELECT {ROW_HASH}, {DW} FROM {delta} WHERE {DW} < 0) __d "
              f"ON __t.{ROW_HASH} = __d.{ROW_HASH}")
    dels = f"SELECT {ROW_ID}, {nulls}, {ROW_HASH}, TRUE AS {DEL} FROM ({ranked}) WHERE __copy <= -{DW}"
    return f"{ins}\nUNION ALL\n{dels}"


def _layered(sql: str, per_call: list[list[list[tuple[str, str]]]]) -> str:
    """``sql`` with successive layers of added columns; layer i gathers every call's i-th layer, so a
    column may use those of the layers before it (nothing is inlined: the SQL stays linear in size)."""
    for i in range(max((len(p) for p in per_call), default=0)):
        cols = [f"{sql_} AS {c}" for p in per_call if len(p) > i for c, sql_ in p[i]]
        if cols:
            sql = f"SELECT *, {', '.join(cols)} FROM ({sql})"
    return sql


@dataclass
class KeyedTop:
    agg: Aggregate
    having: exp.Expression | None
    project: list[tuple[str, exp.Expression]]  # positional output expressions over agg.cols

    @property
    def group_names(self) -> list[str]:
        """The columns identifying a stored group: its keys, and with GROUPING SETS the set ordinal."""
        return self.agg.key_names()

    def state_cols(self) -> list[str]:
        return [CNT] + [c for a in self.agg.aggs for c, _ in a.state()]

    def row_id(self, prefix: str = "") -> str:
        if not self.group_names:
            return "CAST(0 AS BIGINT)"
        return row_hash([prefix + quote(c) for c in self.group_names])

    @property
    def strategy(self) -> str:
        if self.having is not None:
            return "group rescan (HAVING hides groups, so they have no stored state)"
        families = {a.family for a in self.agg.aggs}
        if "group rescan" in families:
            return "group rescan of the groups a delta touches (state kept in hidden columns; see each aggregate)"
        if "semi-algebraic" in families or any(a.needs_rescan() for a in self.agg.aggs):
            return "algebraic, with a rescan of the groups a deletion leaves ambiguous (see each aggregate)"
        return "algebraic (state kept in hidden columns)"

    def recompute(self) -> str | None:
        """Why the top recomputes the groups a change touches: HAVING hides groups (no stored state), or a
        call has no algebraic rule (family *group rescan*). MIN / MAX-like calls and the moment family
        rescan a group only when a deletion leaves its value ambiguous: that stays a delta rule."""
        if self.having is not None:
            return self.strategy
        return "; ".join(dict.fromkeys(a.rule() for a in self.agg.aggs if a.family == "group rescan")) or None

    def call_lines(self) -> list[str]:
        """One line per aggregate call for ``explain``: its strategy and state columns."""
        out = []
        for a in self.agg.aggs:
            how = "group rescan (HAVING)" if self.having is not None else a.rule()
            cols = ", ".join(c for c, _ in a.state()) or (CNT if a.func == "count_star" else "shared")
            out.append(f"{a.sql()}  [{cols}]  -- {how}")
        return out


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


def topk_top(root: Node) -> TopK | None:
    """The TopK at the top of the tree: the root, or under a projection that only picks its columns."""
    if isinstance(root, TopK):
        return root
    if isinstance(root, Project) and isinstance(root.child, TopK) and all(
        isinstance(e, exp.Column) for _, e in root.items
    ):
        return root.child
    return None


@dataclass
class Plan:
    """A compiled defining query."""

    root: Node
    names: list[str]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.keyed = keyed_top(self.root)
        self.topk = topk_top(self.root) if self.keyed is None else None

    @property
    def layout(self) -> str:
        return "keyed" if self.keyed else "bag"

    def hidden_columns(self) -> list[str]:
        """The stored columns that are not the query's, in table order."""
        return [ROW_ID] + (self.keyed.state_cols() if self.keyed else [ROW_HASH])

    def stored_columns(self) -> list[str]:
        """Every column of the stream table in table order (what :meth:`full_sql` writes): ``__row_id``, the
        user columns, the layout's other hidden columns. Change rows carry these plus ``__del`` (see the
        module docstring)."""
        kept = self.__dict__.get("_stored_columns")  # rendered once per plan: a refresh asks twice or more,
        if kept is None:  # and the aggregates' state columns are named through sqlglot (0.1 ms each time)
            hidden = self.hidden_columns()
            kept = self.__dict__["_stored_columns"] = tuple(hidden[:1] + list(self.names) + hidden[1:])
        return list(kept)

    # --- shared pieces ---

    def _cast(self, types: list[str]) -> str:
        """The root's columns as the user columns, cast to the query's own result types."""
        return ", ".join(f"CAST({quote(i)} AS {ty}) AS {quote(n)}"
                         for i, n, ty in zip(self.root.cols, self.names, types, strict=True))

    def _user_select(self, types: list[str], deleted: str | None = None) -> str:
        """User columns from the keyed top's projection, cast to the query's own result types."""
        assert self.keyed is not None
        rendered = rendered_once(self, "_project_sql", [e for _, e in self.keyed.project])
        out = []
        for sql, name, ty in zip(rendered, self.names, types, strict=True):
            value = f"CAST({sql} AS {ty})"
            if deleted:
                value = f"CASE WHEN {deleted} THEN NULL ELSE {value} END"
            out.append(f"{value} AS {quote(name)}")
        return ", ".join(out)

    def _with_outputs(self, sql: str) -> str:
        """Add each aggregate's value (computed from its state) under its internal name."""
        assert self.keyed is not None
        outs = [f"{a.output()} AS {quote(a.name)}" for a in self.keyed.agg.aggs]
        return f"SELECT *{', ' if outs else ''}{', '.join(outs)} FROM ({sql})"

    def _full_state_select(self, branch: Branch | None = None) -> str:
        assert self.keyed is not None
        agg = self.keyed.agg
        items = [agg.group_select(branch)] if self.keyed.group_names else []
        items.append(f"COUNT(*) AS {CNT}")
        items += [f"{sql} AS {c}" for a in agg.aggs for c, sql in a.state()]
        return ", ".join(items)

    def _full_state(self, ctx: Context, state: str = "post") -> str:
        """Every group's state, computed from the child's snapshot (one GROUP BY per grouping set)."""
        assert self.keyed is not None
        agg = self.keyed.agg
        child = self._state_pre(agg.child.snapshot(ctx, state))  # type: ignore[arg-type]
        out = union_all([f"SELECT {self._full_state_select(b)} FROM ({child}){agg.group_by(b)}"
                         for b in agg.branches()])
        assert out is not None
        return out

    def _state_pre(self, child: str) -> str:
        """The child's rows with the per-row columns the state aggregates read (``AggCall.state_pre``)."""
        assert self.keyed is not None
        return _layered(child, [[a.state_pre()] for a in self.keyed.agg.aggs])

    def _state_list(self, prefix: str = "") -> str:
        assert self.keyed is not None
        return ", ".join(prefix + c for c in self.keyed.state_cols())

    # --- full refresh ---

    def full_sql(self, ctx: Context, types: list[str]) -> str:
        """Every stored row (user and hidden columns) of the stream table at the post frontier."""
        return with_shared(self._full_sql(ctx, types), self.root, ctx)

    def _full_sql(self, ctx: Context, types: list[str]) -> str:
        if self.keyed is None:
            return plain_rows_sql(f"SELECT {self._cast(types)} FROM ({self.root.snapshot(ctx, 'post')})",
                                  self.names, types, ctx.salt, ctx.float_identity)
        k = self.keyed
        state = self._full_state(ctx)
        where = f" WHERE {k.having.sql(SPARK)}" if k.having is not None else ""
        return (f"SELECT {k.row_id()} AS {ROW_ID}, {self._user_select(types)}, {self._state_list()} "
                f"FROM ({self._with_outputs(state)}){where}")

    # --- differential refresh ---

    def stored_recursive(self) -> tuple[RecursiveCte, list[int]] | None:
        """The recursive CTE whose rows the stream table stores as they are (``SELECT <each CTE column once>
        FROM cte``, bag layout), with the user column position of each CTE column: its rule then reads the
        old result from the stream table instead of recomputing it."""
        root = self.root
        if self.keyed is not None or not isinstance(root, Project) or not isinstance(root.child, RecursiveCte):
            return None
        rec = root.child
        pos: dict[str, int] = {}
        for j, (_, e) in enumerate(root.items):
            if not isinstance(e, exp.Column) or e.name not in rec.cols or e.name in pos:
                return None
            pos[e.name] = j
        if len(pos) != len(rec.cols):
            return None
        return rec, [pos[c] for c in rec.cols]

    def merge_source_sql(self, ctx: Context, types: list[str]) -> str | None:
        """Rows to MERGE into the stream table on ``__row_id``; None when provably nothing changed."""
        stored = self.stored_recursive()
        if stored is not None:
            stored[0].stored = [self.names[j] for j in stored[1]]
        sql = self._merge_source_sql(ctx, types)
        return None if sql is None else with_shared(sql, self.root, ctx)

    def netted_delta_sql(self, ctx: Context, types: list[str]) -> str | None:
        """A plain-rows table's delta netted per distinct tuple (the user columns, ``__row_hash`` and
        ``__dw``, see :func:`bag_delta_sql`), without picking the stored copies to delete: for an executor
        that picks them itself from the stored ``(__row_id, __row_hash)`` of just the negative tuples (see
        :mod:`pipeline.plain_rows`) instead of joining the whole table in Spark. None when provably nothing
        changed. Only for plans that :meth:`nets_on_driver`."""
        assert self.nets_on_driver()
        d = self._bag_delta(ctx, types)
        return None if d is None else with_shared(d, self.root, ctx)

    def nets_on_driver(self) -> bool:
        """Whether :meth:`netted_delta_sql` applies: plain rows whose delta reads no stored row (keyed, TopK
        and a stored recursive CTE read them anyway, so :meth:`merge_source_sql` picks the copies there)."""
        return self.keyed is None and self.topk is None and self.stored_recursive() is None

    def _merge_source_sql(self, ctx: Context, types: list[str]) -> str | None:
        if self.keyed is None:
            d = self._topk_delta(ctx, types) if self.topk is not None else self._bag_delta(ctx, types)
            return None if d is None else self._bag_changes(ctx, d, types)
        fin = self._rescan_groups(ctx) if self.keyed.having is not None else self._algebraic(ctx)
        if fin is None:
            return None
        k = self.keyed
        conds = [f"{CNT} <= 0"] if k.group_names else []
        if k.having is not None:
            conds.append(f"NOT COALESCE(({k.having.sql(SPARK)}), FALSE)")
        deleted = " OR ".join(f"({c})" for c in conds) if conds else "FALSE"
        return (f"SELECT {k.row_id()} AS {ROW_ID}, {self._user_select(types, DEL)}, {self._state_list()}, "
                f"{DEL} FROM (SELECT *, {deleted} AS {DEL} FROM ({self._with_outputs(fin)}))")

    def _bag_delta(self, ctx: Context, types: list[str]) -> str | None:
        d = self.root.delta(ctx)
        if d is None:
            return None
        return bag_delta_sql(f"SELECT {self._cast(types)}, {W} FROM ({d})", self.names, types, W,
                             ctx.float_identity)

    def _topk_delta(self, ctx: Context, types: list[str]) -> str | None:
        """TopK at the top: the stored rows are TopK(pre) (whatever tied rows it kept), so the change is
        TopK(post) − stored, each stored row weighing -1; the table then holds exactly the new top."""
        if not self.root.changed(ctx):
            return None
        post = f"SELECT {self._cast(types)}, CAST(1 AS BIGINT) AS {W} FROM ({self.root.snapshot(ctx, 'post')})"
        stored = f"SELECT {col_list(self.names)}, CAST(-1 AS BIGINT) AS {W} FROM {ctx.target()}"
        return bag_delta_sql(f"{post} UNION ALL {stored}", self.names, types, W, ctx.float_identity)

    def _bag_changes(self, ctx: Context, delta: str, types: list[str]) -> str:
        """Change rows of a bag table from its netted delta (see :func:`bag_changes_sql`), which they read
        twice. Spark inlines a WITH query at every reference, so in a refresh (``materialize_changes``) the
        netted delta is held once (a :class:`Fixpoint` without step, filled by the first job reading it)
        instead of its whole delta rule running twice; otherwise (tests, plain rendering) it is a WITH query.
        The held query is self-contained: the shared CTEs it names are defined inside it."""
        if ctx.materialize_changes:
            held = ctx.fixpoint(Fixpoint([], with_shared(delta, self.root, ctx), None))
            return bag_changes_sql(held, self.names, types, ctx.target(), ctx.salt, ctx.small_delta)
        body = bag_changes_sql("__trickle_bd", self.names, types, ctx.target(), ctx.salt, ctx.small_delta)
        return f"WITH __trickle_bd AS ({delta})\n{body}"

    def _delta_summary(self, dchild: str, branch: Branch) -> str:
        """The child's delta summarised per group of one branch: ``__d_cnt`` and every call's delta terms."""
        k = self.keyed
        assert k is not None
        agg = k.agg
        src = _layered(dchild, [[a.state_pre(), *a.delta_pre(agg.partition(branch))] for a in agg.aggs])
        items = ([agg.group_select(branch)] if k.group_names else []) + [f"COALESCE(SUM({W}), 0) AS __d_cnt"]
        items += [f"{sql} AS {c}" for a in agg.aggs for c, sql in a.delta_terms()]
        return f"SELECT {', '.join(items)} FROM ({src}){agg.group_by(branch)}"

    def _algebraic(self, ctx: Context) -> str | None:
        """Old state (read from the stream table) merged with the delta summaries, per group; groups whose
        merged state cannot be trusted (``needs_rescan``) are recomputed from the child's post snapshot.

        The child's delta and the merged groups are CTEs (``__trickle_dc``, ``__trickle_n``): each is read
        twice or more (per grouping set; kept and rescanned groups), and SQL text repeated instead costs
        Spark analysis and optimisation time in proportion."""
        k = self.keyed
        assert k is not None
        agg = k.agg
        dchild = agg.child.delta(ctx)
        if dchild is None:
            return None
        dc = "__trickle_dc"
        d = union_all([self._delta_summary(f"SELECT * FROM {dc}", b) for b in agg.branches()])
        old = [f"__o.{CNT} AS __o_cnt"] + [
            f"__o.{c} AS {c.replace('__agg', '__o', 1)}" for a in agg.aggs for c, _ in a.state()
        ]
        cur = (f"SELECT __d.*, {', '.join(old)} FROM ({d}) __d LEFT JOIN {ctx.target()} __o "
               f"ON __o.{ROW_ID} = {k.row_id('__d.')}")
        cur = _layered(cur, [a.merge_steps() for a in agg.aggs])
        merged = [f"COALESCE(__o_cnt, 0) + __d_cnt AS {CNT}"]
        merged += [f"{sql} AS {c}" for a in agg.aggs for c, sql in a.merged_state()]
        rescans = [c for a in agg.aggs if (c := a.needs_rescan())]
        flag = f"({' OR '.join(rescans)})" if rescans else "FALSE"
        # The flag goes through a generator: Spark pushes a filter down through projections by inlining
        # their expressions, and the merge layers inlined into WHERE __rescan grow exponentially (figures in
        # docs/BENCHMARKS.md, "Figures behind the code"); a filter on a generated column stays where it is.
        n = (f"SELECT * FROM (SELECT *, {', '.join(merged)} FROM ({cur})) "
             f"LATERAL VIEW explode(array({flag})) __r AS __rescan")
        keys_cols = col_list(k.group_names)
        kept = f"SELECT {keys_cols + ', ' if keys_cols else ''}{self._state_list()} FROM __trickle_n"
        with_ = f"WITH {dc} AS ({dchild}), __trickle_n AS ({n}) "
        if not rescans:
            return with_ + kept
        keys = f"SELECT {keys_cols or '1 AS __one'} FROM __trickle_n WHERE __rescan"
        return f"{with_}{kept} WHERE NOT __rescan UNION ALL SELECT * FROM ({self._rescanned(ctx, keys)})"

    def _rescanned(self, ctx: Context, keys: str) -> str:
        """The state of the groups in ``keys`` recomputed at the post frontier (0 rows -> ``__cnt`` 0)."""
        k = self.keyed
        assert k is not None
        rescanned = k.agg.restricted(ctx, "post", keys, self._full_state_select, self._state_pre)
        fresh_state = ", ".join([f"COALESCE(__s.{CNT}, 0) AS {CNT}"] + [f"__s.{c}" for c in k.state_cols()[1:]])
        keys_cols = col_list(k.group_names, "__k.")
        return (f"SELECT {keys_cols + ', ' if keys_cols else ''}{fresh_state} "
                f"FROM ({keys}) __k LEFT JOIN ({rescanned}) __s ON {key_match('__k', '__s', k.group_names)}")

    def _rescan_groups(self, ctx: Context) -> str | None:
        k = self.keyed
        assert k is not None
        keys = k.agg.affected_keys(ctx)
        if keys is None:
            return None
        return self._rescanned(ctx, keys)

    def merge_statement(self, target: str, source_sql: str) -> str:
        """Spark's MERGE applying change rows (see the module docstring): the same statement for both
        layouts, except that only keyed rows are updated in place (a bag row is never matched unless
        deleted: inserted rows have fresh ids)."""
        stored = self.stored_columns()
        update = ""
        if self.keyed is not None:
            sets = ", ".join(f"{quote(c)} = __s.{quote(c)}" for c in stored if c != ROW_ID)
            update = f"WHEN MATCHED THEN UPDATE SET {sets}\n"
        return (
            f"MERGE INTO {target} __t USING ({source_sql}) __s ON __t.{ROW_ID} = __s.{ROW_ID}\n"
            f"WHEN MATCHED AND __s.{DEL} THEN DELETE\n{update}"
            f"WHEN NOT MATCHED AND NOT __s.{DEL} THEN INSERT ({col_list(stored)}) "
            f"VALUES ({col_list(stored, '__s.')})"
        )

    # --- explain ---

    def how(self, n: Node) -> tuple[str, str | None]:
        """How one operator is maintained: its strategy and, when its delta rule recomputes part of its
        output from snapshots, why (see :meth:`Node.recompute`)."""
        if self.keyed is not None and n is self.keyed.agg:
            return self.keyed.strategy, self.keyed.recompute()
        return n.strategy(), n.recompute()

    def recomputes(self) -> list[tuple[Node, str]]:
        """The operators whose delta rule recomputes a scope (the groups, partitions or rows a change
        touches), with why; empty when every operator derives its delta from the changes alone. A query
        with any is *recompute-scoped* (still a DIFFERENTIAL refresh)."""
        return [(n, r) for n in self.root.walk() if (r := self.how(n)[1])]

    def tree_text(self) -> str:
        lines: list[str] = []
        scoped = self.recomputes()
        if scoped:
            lines.append(f"[maintenance: DIFFERENTIAL, recompute-scoped: {len(scoped)} operator(s) recompute what "
                         "a change touches (marked RECOMPUTE); the others apply delta rules]")
        else:
            lines.append("[maintenance: DIFFERENTIAL: every operator applies a delta rule to the changes]")
        if self.keyed is not None:
            lines.append(f"[top: keyed layout; {self.keyed.strategy}]")
        elif self.topk is not None:
            lines.append("[top: bag layout (plain rows) holding exactly the top rows; a refresh recomputes the top "
                         "of the post snapshot when a source changed and applies its difference with the stored "
                         "rows]")
        else:
            lines.append("[top: bag layout (plain rows): one stored row per result row, duplicates as separate rows "
                         "(__row_hash: the tuple's hash; __row_id: unique per row); a change is netted per distinct "
                         "row, new copies inserted, deleted copies picked among the stored ones by __row_hash]")

        def walk(n: Node, depth: int) -> None:
            top = self.keyed is not None and n is self.keyed.agg
            how, recompute = self.how(n)
            if n is self.topk:
                how = "top of the stream table: TopK of the post snapshot merged against the stored rows"
            lines.append("  " * depth + f"{n.label()}    -- {'RECOMPUTE: ' if recompute else ''}{how}")
            if top and self.keyed is not None:
                lines.extend("  " * (depth + 1) + "· " + line for line in self.keyed.call_lines())
            for c in n.children:
                walk(c, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines)
