"""Window: window functions over the child's rows — ROW_NUMBER, RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST,
NTILE, LAG, LEAD, FIRST_VALUE, LAST_VALUE, NTH_VALUE and any aggregate OVER a window, with ROWS / RANGE frames,
several windows with different PARTITION BYs side by side. The output is the child's columns plus one column
per window function.

Delta rule: *partition-scoped recompute*. A window function's value for a row depends only on the rows of its
partition, so only partitions the child's delta touches can change. For one PARTITION BY list P, with K the
distinct values of P among the rows of Δchild (a row moving between partitions is a −old and a +new row of the
delta, so both its partitions are in K; NULL keys match NULL, ``<=>``):

    ΔW = W(child_post ⋉ K) − W(child_pre ⋉ K)

Several windows with different PARTITION BYs P_1..P_k (specs): a row must be recomputed when its partition
under ANY spec was touched, A = {r : ∃s P_s(r) ∈ K_s}, and each of its windows must see the whole partition
of its own spec. The rows read are therefore the closure S = {r : ∃s P_s(r) ∈ P_s(A)}: S holds, for every row
of A and every spec, its entire partition, and S ⊆ child, so a window evaluated over S is exact for the rows
of A (not for the other rows of S, which are dropped):

    ΔW = σ_A W(S_post) − σ_A W(S_pre),   P_s(A) taken over A_post ∪ A_pre

A window without PARTITION BY has one partition, the whole input: any change recomputes every row (both
snapshots), which :meth:`Window.strategy` says. The result is consolidated, so rows whose window values did not
change cancel out here and operators above see only real changes.

Determinism. The rule subtracts a recomputation of the pre snapshot, so a window function must be a function
of its input: recomputed twice over the same rows it must give the same values. Ties in the ORDER BY break
this for the *positional* functions (ROW_NUMBER, NTILE, LAG, LEAD, and anything over a ROWS frame or over a
whole unordered partition, e.g. FIRST_VALUE(x) OVER (PARTITION BY g)): which of two tied rows comes first is
up to Spark, and may differ between the refresh that stored a row and the one that subtracts it. These get
every input column appended to their ORDER BY as a tie-breaker (ascending, NULLS FIRST; map-typed columns
are skipped), which picks one of the answers the query allows, always the same one; rows equal in every
column are interchangeable anyway. Peer-based functions (RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST, and
aggregates over a RANGE frame — the default frame with ORDER BY) are deterministic as written: tied rows are
peers and get the same value. The remaining case cannot be tie-broken without changing its frame:
order-sensitive functions (FIRST_VALUE, LAST_VALUE, NTH_VALUE, first, last, collect_list, ...) over a RANGE
frame with ties in the ORDER BY; their value among tied rows is whatever Spark picks, so write an ORDER BY
that is unique within each partition (e.g. add the primary key) or use a ROWS frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dvm.context import Context, State, quote
from dvm.dialect import SPARK
from dvm.operators.base import Node, W, col_list, consolidate, union_all
from dvm.operators.join import Inputs

#: wrappers sqlglot puts around a window's function (``FIRST_VALUE(x) IGNORE NULLS OVER (...)``)
WRAPPERS = (exp.IgnoreNulls, exp.RespectNulls)
#: functions whose value depends on the order of rows and that take no frame: always tie-broken
POSITIONAL = (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead)
#: functions whose value is the same for tied rows (peers): never need a tie-breaker
PEER_BASED = (exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist)
#: functions whose value depends on which row of the frame comes first / last
ORDER_SENSITIVE = (exp.FirstValue, exp.LastValue, exp.NthValue, exp.First, exp.Last, exp.AnyValue,
                   exp.ArrayAgg, exp.GroupConcat)
_ORDER_SENSITIVE_NAMES = {"first_value", "last_value", "nth_value", "first", "last", "any_value",
                          "collect_list", "array_agg", "string_agg", "listagg", "try_element_at"}


def window_function(w: exp.Window) -> exp.Expression:
    """The function a window applies, without IGNORE / RESPECT NULLS around it."""
    f = w.this
    while isinstance(f, WRAPPERS):
        f = f.this
    return f


def owning_window(n: exp.Expression) -> exp.Window | None:
    """The window whose function ``n`` is (``n`` in ``n OVER (...)``), else None: such an aggregate node is
    evaluated by the window, not by the GROUP BY around it."""
    child, p = n, n.parent
    while isinstance(p, (*WRAPPERS, exp.WithinGroup)) and child.arg_key == "this":
        child, p = p, p.parent
    return p if isinstance(p, exp.Window) and child.arg_key == "this" else None


def _order_sensitive(f: exp.Expression) -> bool:
    if isinstance(f, ORDER_SENSITIVE):
        return True
    return isinstance(f, exp.Anonymous) and f.name.lower() in _ORDER_SENSITIVE_NAMES


def needs_tie_break(w: exp.Window) -> bool:
    """Whether the value of ``w`` may depend on how Spark orders tied rows (see the module doc)."""
    f = window_function(w)
    if isinstance(f, PEER_BASED):
        return False
    if isinstance(f, POSITIONAL):
        return True
    spec = w.args.get("spec")
    if spec is not None and str(spec.args.get("kind") or "").upper() == "ROWS":
        return True
    # no frame clause: the whole partition without ORDER BY, RANGE ... CURRENT ROW with it
    return spec is None and w.args.get("order") is None and _order_sensitive(f)


def tie_broken(w: exp.Window, cols: list[str]) -> exp.Window:
    """``w`` with ``cols`` appended to its ORDER BY when it needs a tie-breaker. A function over a whole
    unordered partition gets the explicit frame it had (ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED
    FOLLOWING), since an ORDER BY alone would shrink its default frame to the rows up to the current one."""
    if not needs_tie_break(w) or not cols:
        return w
    w = w.copy()
    order = w.args.get("order")
    had_order = order is not None
    keys = list(order.expressions) if order is not None else []
    present = {k.this.sql(SPARK) for k in keys if isinstance(k, exp.Ordered)}
    keys += [exp.Ordered(this=exp.column(c, quoted=True), desc=False, nulls_first=True)
             for c in cols if quote(c) not in present and c not in present]
    w.set("order", exp.Order(expressions=keys))
    if not had_order and w.args.get("spec") is None and not isinstance(window_function(w), POSITIONAL):
        w.set("spec", exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
                                     end="UNBOUNDED", end_side="FOLLOWING"))
    return w


@dataclass(eq=False)
class Window(Node):
    child: Node
    #: (internal output name, window expression over the child's columns), as the query wrote it
    funcs: list[tuple[str, exp.Window]]
    #: the child's columns usable as tie-breakers (not map-typed)
    tie_cols: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.children = [self.child]
        self.cols = list(self.child.cols) + [n for n, _ in self.funcs]
        self.computed = [(n, tie_broken(w, self.tie_cols)) for n, w in self.funcs]
        self.specs: list[list[exp.Expression]] = []  # distinct PARTITION BY lists
        seen: set[str] = set()
        for _, w in self.funcs:
            part = list(w.args.get("partition_by") or [])
            key = "|".join(p.sql(SPARK) for p in part)
            if key not in seen:
                seen.add(key)
                self.specs.append(part)

    @property
    def whole_input(self) -> bool:
        """Some window has no PARTITION BY: every change recomputes every row."""
        return any(not s for s in self.specs)

    def _windows(self) -> str:
        return ", ".join(f"{w.sql(SPARK)} AS {quote(n)}" for n, w in self.computed)

    def snapshot(self, ctx: Context, state: State) -> str:
        return f"SELECT *, {self._windows()} FROM ({self.child.snapshot(ctx, state)})"

    # --- delta ---

    @staticmethod
    def _key_cols(s: int, part: list[exp.Expression]) -> list[str]:
        return [f"__wk{s}_{i}" for i in range(len(part))]

    def _match(self, s: int, part: list[exp.Expression], alias: str) -> str:
        return " AND ".join(f"({p.sql(SPARK)}) <=> {alias}.{k}"
                            for p, k in zip(part, self._key_cols(s, part), strict=True))

    def _keys(self, s: int, part: list[exp.Expression], rows: str) -> str:
        """The distinct partition keys of spec ``s`` among ``rows``."""
        sel = ", ".join(f"{p.sql(SPARK)} AS {k}" for p, k in zip(part, self._key_cols(s, part), strict=True))
        return f"SELECT DISTINCT {sel} FROM ({rows})"

    def _evaluated(self, rows: str, sign: int, where: str = "") -> str:
        inner = f"SELECT *, {self._windows()} FROM ({rows})"
        return (f"SELECT {col_list(self.cols)}, CAST({sign} AS BIGINT) AS {W} FROM ({inner})"
                f"{' WHERE ' + where if where else ''}")

    def delta(self, ctx: Context) -> str | None:
        inputs = Inputs(ctx, child=self.child)
        d = inputs.delta("child")
        if d is None:
            return None
        snap = {state: inputs.snapshot("child", state) for state in ("post", "pre")}
        if self.whole_input:
            parts = [self._evaluated(f"SELECT * FROM ({snap[st]}) WHERE EXISTS ({d})", sign)
                     for st, sign in (("post", 1), ("pre", -1))]
        elif len(self.specs) == 1:
            part = self.specs[0]
            keys = inputs.share(self._keys(0, part, d))
            parts = [self._evaluated(f"SELECT __c.* FROM ({snap[st]}) __c LEFT SEMI JOIN ({keys}) __k0 "
                                     f"ON {self._match(0, part, '__k0')}", sign)
                     for st, sign in (("post", 1), ("pre", -1))]
        else:
            parts = self._closure_parts(inputs, d, snap)
        body = union_all(parts)
        assert body is not None
        return inputs.wrap(consolidate(body, self.cols))

    def _closure_parts(self, inputs: Inputs, d: str, snap: dict[str, str]) -> list[str]:
        """Several specs: A = rows touched under some spec (flags ``__h<s>``, over both snapshots), the
        closure keys P_s(A) with ``__in<s>`` = "this key was touched itself", then S per snapshot with
        ``__aff`` = "the row is in A", windows over S, rows of A kept."""
        specs = list(enumerate(self.specs))
        touched = [inputs.share(f"SELECT *, TRUE AS __hit FROM ({self._keys(s, p, d)})") for s, p in specs]
        both = f"SELECT * FROM ({snap['post']}) UNION ALL SELECT * FROM ({snap['pre']})"
        flags = ", ".join(f"COALESCE(__k{s}.__hit, FALSE) AS __h{s}" for s, _ in specs)
        joins = " ".join(f"LEFT JOIN ({touched[s]}) __k{s} ON {self._match(s, p, f'__k{s}')}" for s, p in specs)
        a = inputs.share(f"SELECT __c.*, {flags} FROM ({both}) __c {joins}")
        any_hit = " OR ".join(f"__h{s}" for s, _ in specs)
        closure = []
        for s, p in specs:
            sel = ", ".join(f"{e.sql(SPARK)} AS {k}" for e, k in zip(p, self._key_cols(s, p), strict=True))
            group = ", ".join(e.sql(SPARK) for e in p)
            closure.append(inputs.share(f"SELECT {sel}, BOOL_OR(__h{s}) AS __in FROM ({a}) WHERE {any_hit} "
                                        f"GROUP BY {group}"))
        in_s = " OR ".join(f"__q{s}.__in IS NOT NULL" for s, _ in specs)
        aff = " OR ".join(f"COALESCE(__q{s}.__in, FALSE)" for s, _ in specs)
        cjoins = " ".join(f"LEFT JOIN ({closure[s]}) __q{s} ON {self._match(s, p, f'__q{s}')}" for s, p in specs)
        parts = []
        for st, sign in (("post", 1), ("pre", -1)):
            rows = f"SELECT __c.*, ({aff}) AS __aff FROM ({snap[st]}) __c {cjoins} WHERE {in_s}"
            parts.append(self._evaluated(rows, sign, "__aff"))
        return parts

    def strategy(self) -> str:
        ties = " (positional functions tie-broken on every input column)" if any(
            needs_tie_break(w) for _, w in self.funcs) else ""
        if self.whole_input:
            return ("whole-input recompute: a window without PARTITION BY has one partition, so any change "
                    "recomputes every row on both snapshots" + ties)
        if len(self.specs) > 1:
            return (f"partition-scoped recompute over {len(self.specs)} PARTITION BY lists: rows whose partition "
                    "under any of them the delta touched, each window over its whole partition" + ties)
        return "partition-scoped recompute of the partitions the delta touches (both snapshots)" + ties

    def label(self) -> str:
        return "Window " + ", ".join(w.sql(SPARK) for _, w in self.funcs)
