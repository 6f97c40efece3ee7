"""How a refresh applies its delta: the apply strategy, chosen per refresh and recorded with it.

A differential refresh computes its change rows (see :mod:`dvm.plan`) with one Spark job; what it then
costs is mostly the commit. Like Databricks' Enzyme, the strategy is chosen per refresh from what is known
then, and the choice and its reason go into the refresh history and ``explain``:

* ``NONE`` -- the delta changed nothing: no commit at all (the catalog keeps a soft frontier).
* ``APPEND`` -- only new rows (no ``__del`` row) into a table whose inserted rows carry fresh ids (the
  plain-rows layout): one append commit, no MERGE and no read of the table.
* ``MERGE`` -- the change rows applied on ``__row_id``.
* ``SPARK_MERGE`` -- Spark's MERGE over the delta kept in the cluster, for deltas too large for the driver.

Each runs on an *engine*: ``delta-rs`` (the ``deltalake`` package, tens of milliseconds per commit; used
when the delta was collected to the driver and the table's features and store allow it, see
:func:`connectors.delta_rs.unusable`), ``vectors`` (a plain-rows table's deleted copies marked in deletion
vectors by spark-trickle's own commit, :mod:`connectors.deletion_vectors`, see :func:`marks`), ``own`` (a
small keyed table's MERGE, :mod:`connectors.small_merge`, or a FULL's collected result replacing a table
delta-rs does not write, :mod:`connectors.own_overwrite`; see :func:`collect_full`), ``spark-dv``
(Spark's MERGE with deletion vectors) or ``spark`` (several jobs and about a second per commit, but any
table and any store). The delta is collected to the driver, in the same job that computes it, when the
change feeds it reads are small (``trickle.apply.collectBelowBytes``); a collected delta larger than
``trickle.apply.deltaRsRowsBelow`` rows still goes through Spark, from the collected rows.

Pure decisions over numbers, testable without Spark; :mod:`pipeline.refresh` runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeline.modes import RefreshAction

#: the two actions AUTO chooses between
DIFFERENTIAL, FULL = RefreshAction.DIFFERENTIAL, RefreshAction.FULL

#: Spark conf: collect the delta to the driver when the change feeds of the window total fewer bytes.
COLLECT_BELOW = "trickle.apply.collectBelowBytes"
#: Spark conf: a collected delta of at most this many rows is committed by delta-rs (when usable).
DELTA_RS_ROWS = "trickle.apply.deltaRsRowsBelow"
#: Spark conf: ``false`` turns the delta-rs commit path off (every commit through Spark).
DELTA_RS = "trickle.apply.deltaRs"
#: Spark conf: a delta that deletes or updates rows of a table holding more rows than this is merged by Spark
#: with deletion vectors (turned on for the table when first needed): delta-rs rewrites every file a change
#: touches, and scattered changes touch every file of a big table, so its cost grows with the table. Still,
#: Spark's MERGE with deletion vectors costs more than delta-rs' rewrite at 10M rows (it reads the table
#: several times; figures in docs/BENCHMARKS.md, "Figures behind the code"). Above 50M rows (not compared)
#: deletion vectors are assumed to pay.
DV_ABOVE_ROWS = "trickle.apply.deletionVectorsAboveRows"
#: Spark conf: when the files a change deletes rows from are expected to hold more rows than this (see
#: :func:`rewritten_rows`), a plain-rows table has those rows marked in deletion vectors by spark-trickle's own
#: commit (:mod:`connectors.deletion_vectors`; turned on for the table when first needed) instead of the files
#: rewritten: copy-on-write rewrites every file a deleted row is in, and scattered deletions touch every file,
#: so its cost follows the table's size; marking costs a binary search of the files' hash indexes
#: (:mod:`connectors.hash_index`). -1: never (then a table with deletion vectors on is merged by Spark). A table
#: with vectors stays so, and every reader must support them; the deltas of stream tables reading it still run
#: on DuckDB (the driver's readers leave marked rows out: :mod:`connectors.vector_reads`). Why 50K: rewriting
#: costs about 0.4 us a row, marking 10-20 ms whatever the size, so they break even near there (floor of the
#: filter shape, 99K stored rows in one file: 0.150 s rewritten by the own MERGE, 0.111 s marked); below it
#: a rewrite keeps a small table in one file, where marking adds a file per refresh until compaction. Figures
#: in docs/BENCHMARKS.md ("Deletions marked, not rewritten", and session 38's floor).
VECTORS_ABOVE_ROWS = "trickle.apply.vectorsAboveRows"
#: Spark conf: bytes of driver memory the sorted ``__row_hash`` indexes of plain-rows tables' data files may hold
#: between refreshes (:mod:`connectors.hash_index`, 20 bytes a stored row; default 1 GiB, about 50M rows): with
#: them a commit with deletion vectors finds the copies it deletes by binary search instead of reading every
#: stored hash. 0: none kept (each refresh reads the hash columns again).
HASH_INDEX_BYTES = "trickle.apply.hashIndexBytes"
#: Spark conf: a collected change that delta-rs would MERGE into a table of at most this many rows is written by
#: spark-trickle's own commit instead (:mod:`connectors.small_merge`: the touched files read and rewritten on
#: the driver, no DataFusion plan): delta-rs' MERGE costs 22-28 ms of its own for a few rows, most of what a
#: small aggregate's refresh adds to its delta. -1: never.
OWN_MERGE_ROWS = "trickle.apply.ownMergeRowsBelow"
#: Spark conf: a FULL refresh of a table that held at most this many rows collects its result to the driver
#: and commits it with delta-rs (a small aggregate recomputed over a large source).
FULL_COLLECT_ROWS = "trickle.apply.fullCollectRowsBelow"
#: Spark conf: ... and so does one of a table whose data files totalled at most this many bytes, whatever its
#: rows. Why: Spark's Delta writer costs a fixed second or so and writes a row a field at a time, while the
#: collected rows cost about twice as much per row to hand over and write but no fixed part; they break even
#: near 3M rows of the benchmark's scan table (about 35 MB of files). At 1M rows a plain-rows table's FULL
#: refresh took 0.79 s collected against 1.70 s through Spark's writer and 1.28 s for the user's CTAS of the
#: same query (scan; join 1.20 / 2.08 / 1.53 s; at 10M rows collected 5.5-7.5 s against 5.0-5.6 s): figures
#: in docs/BENCHMARKS.md, session 78. Bytes, not rows, bound what the driver holds: a wide row weighs more.
#: A result much larger than the table it replaces is refused by ``spark.driver.maxResultSize`` and written
#: by Spark instead. 0: by rows only.
FULL_COLLECT_BYTES = "trickle.apply.fullCollectBytesBelow"

NONE, APPEND, MERGE, SPARK_MERGE = "NONE", "APPEND", "MERGE", "SPARK_MERGE"


@dataclass(frozen=True)
class Limits:
    collect_below_bytes: int = 256 << 20
    delta_rs_rows: int = 2_000_000
    delta_rs: bool = True
    full_collect_rows: int = 100_000
    dv_above_rows: int = 50_000_000
    vectors_above_rows: int = 50_000
    hash_index_bytes: int = 1 << 30
    own_merge_rows: int = 100_000
    full_collect_bytes: int = 32 << 20

    @classmethod
    def from_conf(cls, conf: Any) -> Limits:
        """From a Spark conf (anything with ``get(key, default)``)."""
        d = cls()
        return cls(int(conf.get(COLLECT_BELOW, str(d.collect_below_bytes))),
                   int(conf.get(DELTA_RS_ROWS, str(d.delta_rs_rows))),
                   str(conf.get(DELTA_RS, "true")).strip().lower() != "false",
                   int(conf.get(FULL_COLLECT_ROWS, str(d.full_collect_rows))),
                   int(conf.get(DV_ABOVE_ROWS, str(d.dv_above_rows))),
                   int(conf.get(VECTORS_ABOVE_ROWS, str(d.vectors_above_rows))),
                   int(conf.get(HASH_INDEX_BYTES, str(d.hash_index_bytes))),
                   int(conf.get(OWN_MERGE_ROWS, str(d.own_merge_rows))),
                   int(conf.get(FULL_COLLECT_BYTES, str(d.full_collect_bytes))))


@dataclass(frozen=True)
class Choice:
    strategy: str
    engine: str
    reason: str

    def describe(self) -> str:
        return f"{self.strategy} ({self.engine}): {self.reason}" if self.engine else f"{self.strategy}: {self.reason}"


def collect_full(rows: int | None, size: int | None, limits: Limits) -> str | None:
    """Why a FULL refresh may collect its result and commit it without Spark's writer (delta-rs, or the own
    commit for a table delta-rs does not write), given what the table held (its
    rows and its files' bytes, None when unknown); None when Spark writes it."""
    if rows is not None and rows <= limits.full_collect_rows:
        return f"the table held {rows} rows"
    if size is not None and 0 < limits.full_collect_bytes and size <= limits.full_collect_bytes:
        return f"the table's files held {size} bytes (at most {FULL_COLLECT_BYTES}={limits.full_collect_bytes})"
    return None


def collect_first(change_bytes: int, limits: Limits) -> bool:
    """Whether the delta job should hand its rows to the driver (and the commit be chosen afterwards)."""
    return change_bytes <= limits.collect_below_bytes


def choose(rows: int, deletes: int, appendable: bool, delta_rs_unusable: str | None, limits: Limits,
           target_rows: int | None = None, own_unusable: str | None = "not offered") -> Choice:
    """The strategy for a collected delta of ``rows`` change rows, ``deletes`` of them ``__del`` rows.

    ``appendable``: the layout's inserted rows carry fresh ids (never match a stored row), so a delta
    without deletions is a plain append. ``delta_rs_unusable``: why delta-rs may not commit to this table
    (None: it may). ``target_rows``: rows the table holds (None: unknown); a delta that changes stored rows
    of a table above ``dv_above_rows`` is a MERGE with deletion vectors (engine ``spark-dv``). ``own_unusable``:
    why spark-trickle's own commit may not write this table (None: it may); a MERGE that delta-rs would commit
    into a table of at most ``own_merge_rows`` rows is written by it instead (engine ``own``,
    :mod:`connectors.small_merge`)."""
    if rows == 0:
        return Choice(NONE, "", "the delta has no rows")
    changes_stored = not (appendable and deletes == 0)
    if changes_stored and target_rows is not None and target_rows > limits.dv_above_rows:
        return Choice(MERGE, "spark-dv", f"{deletes} of {rows} change rows delete or update rows of a table of "
                      f"{target_rows} rows (above {DV_ABOVE_ROWS}={limits.dv_above_rows}): deletion vectors mark "
                      "them instead of rewriting the files they are in")
    if not limits.delta_rs:
        engine, why = "spark", f"delta-rs is off ({DELTA_RS}=false)"
    elif delta_rs_unusable is not None:
        engine, why = "spark", delta_rs_unusable
    elif rows > limits.delta_rs_rows:
        engine, why = "spark", f"{rows} change rows, above {DELTA_RS}RowsBelow={limits.delta_rs_rows}"
    else:
        engine, why = "delta-rs", f"{rows} change rows collected to the driver"
    if appendable and deletes == 0:
        return Choice(APPEND, engine, f"insert-only delta; {why}")
    if (engine == "delta-rs" and own_unusable is None and target_rows is not None
            and target_rows <= limits.own_merge_rows):
        return Choice(MERGE, "own", f"{deletes} of {rows} change rows delete; a table of {target_rows} rows (at "
                      f"most {OWN_MERGE_ROWS}={limits.own_merge_rows}): the files they touch rewritten by "
                      "spark-trickle's own commit")
    return Choice(MERGE, engine, f"{deletes} of {rows} change rows delete; {why}")


def marks(has_vectors: bool, losing: int, file_rows: Sequence[int] | None, unusable: str | None,
          limits: Limits) -> Choice | None:
    """Whether a plain-rows table's collected change is committed with deletion vectors (engine ``vectors``,
    :mod:`connectors.deletion_vectors`): always once the table has them on (delta-rs does not write such a
    table), else when rewriting the files the change deletes from would rewrite more than ``vectors_above_rows``
    rows (:func:`rewritten_rows`). ``losing``: tuples the change removes copies of; ``file_rows``: rows per live
    data file (None: unknown); ``unusable``: why the vectors' commit may not write this table. None: another
    path (:func:`choose`)."""
    if unusable is not None or not limits.delta_rs or limits.vectors_above_rows < 0:
        return None
    if has_vectors:
        return Choice(MERGE if losing else APPEND, "vectors", "the table has deletion vectors on"
                      + (f"; {losing} tuples lose copies, marked deleted" if losing else "; insert-only"))
    rewrite = rewritten_rows(file_rows, losing) if file_rows is not None else 0.0
    if losing and rewrite > limits.vectors_above_rows:
        return Choice(MERGE, "vectors", f"{losing} tuples lose copies in files holding ~{rewrite:,.0f} of the "
                      f"table's {sum(file_rows or ()):,} rows (above {VECTORS_ABOVE_ROWS}="
                      f"{limits.vectors_above_rows}): deletion vectors mark them instead of rewriting those files")
    return None


def rewritten_rows(file_rows: Sequence[int], deleted: int) -> float:
    """The rows a copy-on-write MERGE is expected to rewrite when ``deleted`` stored rows, spread at random,
    are deleted: every file holding one of them is rewritten whole, and a file of n of the table's N rows
    escapes all of them with probability (1 - n/N)^deleted. Why an expectation over files rather than the
    table's size: a few deletions in a table of many files rewrite little, while a thousand scattered ones in a
    table of a few large files rewrite all of it."""
    total = sum(file_rows)
    if total <= 0 or deleted <= 0:
        return 0.0
    return float(sum(n * (1.0 - (1.0 - n / total) ** deleted) for n in file_rows if n > 0))


def uncollected(change_bytes: int, limits: Limits) -> Choice:
    """The strategy for a delta too large to collect: Spark's MERGE from the cluster."""
    return Choice(SPARK_MERGE, "spark", f"the change feeds total {change_bytes} bytes, above "
                  f"{COLLECT_BELOW}={limits.collect_below_bytes}: the delta stays in the cluster")


# --- AUTO: DIFFERENTIAL or FULL, by estimated cost ---

#: AUTO's threshold before this table has a cost history: pg_trickle's default change ratio
DEFAULT_THRESHOLD = 0.15
#: weight of the newest observation in the running averages of :class:`CostModel`
ALPHA = 0.3
#: the slope learns from the median of this many last per-ratio costs (of two, the lower): one refresh slowed
#: by something else (a pause, a cold path) moves nothing, two of the last three do (session 52: one 1.4 s
#: refresh among 0.1 s ones made AUTO recompute a 1M-row join_agg at 50% in 0.35 s, its delta 0.11 s)
SLOPE_WINDOW = 3
#: below this change ratio a DIFFERENTIAL refresh is taken to cost its fixed floor only
FLOOR_RATIO = 0.02
#: until a DIFFERENTIAL refresh has been measured, AUTO tries one below this change ratio (bytes ratios of
#: tiny tables are mostly per-file overhead, and without a measured floor the threshold is only a guess)
EXPLORE_BELOW = 0.5
#: a first (cold) DIFFERENTIAL refresh slower than this many FULL refreshes is not tried again: the
#: table's delta is plainly dearer than its query
RETRY_BELOW_FULLS = 3.0
#: a warm DIFFERENTIAL floor at least this share of the only FULL refresh measured (the initial population, a
#: cold start, measured at up to 4x a warm one) gets one warm FULL measured, whatever the change ratio: on
#: TPC-H's joins at SF 1 the floor (2.4-2.9 s) lies above a warm FULL (1.5-1.7 s) and below a cold one. Below
#: it, a window above the floor's ratio gets that FULL measured only when its expected DIFFERENTIAL cost
#: reaches this share: a FULL that cannot win even at a quarter of its cold cost teaches nothing, and measuring
#: it cost AUTO 1.3-2.1x the faster mode in the benchmark's cells where DIFFERENTIAL was 8-20x faster
COLD_FULL_SHARE = 0.25
#: a table AUTO keeps recomputing has its DIFFERENTIAL refresh measured again once in this many refreshes
#: (what a delta costs changes with the table and the machine), where it may win (:data:`REMEASURE_WITHIN`); a
#: table it keeps refreshing by its delta has a FULL refresh measured again as often, where FULL may win
REMEASURE_EVERY = 20
#: ... only for a window whose delta is expected to cost at most this many FULL refreshes: beyond it even a
#: model wrong by half would not make the delta win, and the measurement is pure loss (session 42, 10M rows,
#: 45% changed: a remeasured scan delta took 45.9 s against FULL's 4.7 s, expected 27 s against 4.6 s)
REMEASURE_WITHIN = 2.0
#: a table AUTO keeps refreshing by its delta has a FULL refresh measured once more while the delta is expected
#: to cost at least this share of the only warm FULL measured so far: one sample decides a close call, and the
#: first FULL after a run of deltas is a slow one (it replaces the many small files the deltas committed). Session
#: 58's matrix, 10M rows, 10% change, aggregate: that FULL took 0.81 s, FULL refreshes of the FULL table 0.30-0.54
#: s, deltas 0.73-0.83 s, and AUTO kept the delta on 0.81 s, 1.70x the faster mode
RECHECK_SHARE = 0.67
#: Spark conf: seconds after which AUTO cancels a DIFFERENTIAL refresh and recomputes the table in the same
#: refresh; default :data:`RETRY_BELOW_FULLS` x this table's FULL refresh, at least :data:`BUDGET_MIN_S`
AUTO_BUDGET = "trickle.refresh.autoBudgetSeconds"
BUDGET_MIN_S = 30.0


@dataclass(frozen=True)
class CostModel:
    """What this stream table's refreshes have cost, learned per table like pg_trickle's adaptive threshold:
    a FULL refresh costs about ``full_s`` whatever changed; a DIFFERENTIAL one ``floor_s`` up to the change
    ratio ``floor_ratio`` its floor was measured at (bytes of the sources' change feeds over the bytes of the
    sources), plus ``slope_s`` per unit of change ratio above it. Running averages, so a table that grows or
    a machine that gets busier moves them along. Why the floor's ratio: a table whose first refreshes saw 18%
    of its sources change has its floor measured there, and a slope taken from a later refresh at the same
    ratio would be noise around zero (it once made AUTO take a 50% window for as cheap as the floor).

    The first refresh of each kind is a cold start (the initial population writes a new table through
    Spark; the first delta compiles its code), measured at up to several times a warm one, so the second
    observation of a kind replaces the first instead of being averaged with it; ``full_n`` and ``diff_n``
    count the observations. ``recent``: the per-ratio costs of the last :data:`SLOPE_WINDOW` refreshes above
    the floor, whose median is what each one adds to the slope."""

    full_s: float | None = None
    floor_s: float | None = None
    slope_s: float | None = None
    full_n: int = 0
    diff_n: int = 0
    floor_ratio: float = 0.0
    recent: tuple[float, ...] = ()

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None) -> CostModel:
        doc = doc or {}
        # a model saved before the counts existed: each estimate it holds is one (cold) observation
        return cls(doc.get("full_s"), doc.get("floor_s"), doc.get("slope_s"),
                   int(doc.get("full_n", doc.get("full_s") is not None)),
                   int(doc.get("diff_n", doc.get("floor_s") is not None)), float(doc.get("floor_ratio") or 0.0),
                   tuple(float(x) for x in doc.get("recent") or ()))

    def to_dict(self) -> dict[str, Any]:
        return {"full_s": self.full_s, "floor_s": self.floor_s, "slope_s": self.slope_s,
                "full_n": self.full_n, "diff_n": self.diff_n, "floor_ratio": self.floor_ratio,
                "recent": list(self.recent)}

    def slope(self) -> float | None:
        """Seconds per unit of change ratio; without an observed one, a DIFFERENTIAL refresh of half the table
        is assumed to cost a FULL one."""
        if self.slope_s is not None:
            return self.slope_s
        return self.full_s / 0.5 if self.full_s is not None else None

    def at_floor(self, ratio: float) -> bool:
        """Whether a window of ``ratio`` costs this table's floor: at or near the ratio it was measured at."""
        return ratio <= max(FLOOR_RATIO, self.floor_ratio + FLOOR_RATIO)

    def estimate(self, ratio: float) -> float | None:
        """Seconds a DIFFERENTIAL refresh over change ratio ``ratio`` is expected to cost (None: unknown)."""
        slope = self.slope()
        if self.floor_s is None or slope is None:
            return None
        return self.floor_s + slope * max(0.0, ratio - self.floor_ratio)

    def threshold(self) -> tuple[float, str]:
        """The change ratio above which FULL is cheaper, and how it was found."""
        if self.full_s is None or self.floor_s is None:
            return DEFAULT_THRESHOLD, "the default (no cost history yet)"
        slope = self.slope()
        assert slope is not None
        if self.floor_s >= self.full_s:
            breakeven = 0.0
        else:
            breakeven = self.floor_ratio + (self.full_s - self.floor_s) / slope if slope > 0 else 1.0
        how = (f"learned: FULL ~{self.full_s:.2f} s, DIFFERENTIAL ~{self.floor_s:.2f} s + {slope:.2f} s x ratio"
               + ("" if self.slope_s is not None else " (slope assumed)"))
        return min(breakeven, 1.0), how

    def learn(self, action: str, ratio: float | None, seconds: float, certain: bool = False) -> CostModel:
        """The model after a refresh of ``action`` over change ratio ``ratio`` took ``seconds``. ``certain``: a
        cost known not to be a passing slowdown (a delta cancelled over its budget), which the slope takes at
        once instead of waiting for a second one."""
        def avg(old: float | None, n: int, new: float) -> float:
            return new if old is None or n <= 1 else (1 - ALPHA) * old + ALPHA * new

        if action in (FULL, RefreshAction.REINITIALIZE):
            return replace(self, full_s=avg(self.full_s, self.full_n, seconds), full_n=self.full_n + 1)
        if action != DIFFERENTIAL or ratio is None:
            return self
        n = self.diff_n + 1
        if self.floor_s is None or self.diff_n <= 1 or self.at_floor(ratio):
            # the floor (the first two observations set it, whatever their ratio: the first is a cold start)
            return replace(self, floor_s=avg(self.floor_s, self.diff_n, seconds),
                           floor_ratio=avg(self.floor_ratio, self.diff_n, ratio), diff_n=n)
        per_ratio = max(0.0, seconds - self.floor_s) / (ratio - self.floor_ratio)
        recent = (per_ratio,) * SLOPE_WINDOW if certain else (*self.recent, per_ratio)[-SLOPE_WINDOW:]
        seen = sorted(recent)[(len(recent) - 1) // 2]
        slope = seen if self.slope_s is None else (1 - ALPHA) * self.slope_s + ALPHA * seen
        return replace(self, slope_s=slope, diff_n=n, recent=recent)


def auto(ratio: float | None, model: CostModel) -> tuple[str, str]:
    """AUTO's choice for a window whose change ratio is ``ratio`` (None: unknown), with the reason.

    Before deciding by the learned costs it measures what it does not know yet, once each: a DIFFERENTIAL
    refresh (two, when the first, cold one was not plainly dearer than FULL) and a warm FULL refresh (the
    initial population is a cold one), the latter only for a window above the floor's change ratio, where a
    FULL can pay off. Then each mode it keeps not choosing is measured again where it may win: a delta once in
    :data:`REMEASURE_EVERY` refreshes of a table it recomputes, a FULL once more while one warm FULL alone
    decides a close call (:data:`RECHECK_SHARE`), and once in :data:`REMEASURE_EVERY` refreshes of a table it
    keeps refreshing by its delta."""
    if ratio is None:
        return DIFFERENTIAL, "source changes applied as a delta (change ratio unknown)"
    if model.diff_n == 0 and ratio <= EXPLORE_BELOW:
        return DIFFERENTIAL, (f"source changes applied as a delta: {ratio:.1%} of the sources changed; no "
                                "DIFFERENTIAL refresh of this table measured yet, so one is tried first")
    full_s = model.full_s
    if (model.diff_n == 1 and ratio <= EXPLORE_BELOW and model.floor_s is not None
            and (full_s is None or model.floor_s < RETRY_BELOW_FULLS * full_s)):
        return DIFFERENTIAL, (f"source changes applied as a delta: {ratio:.1%} of the sources changed; this "
                                "table's only DIFFERENTIAL refresh so far was its first (a cold start), so a "
                                "second one is measured")
    if (model.full_n <= 1 and model.diff_n >= 1 and ratio > FLOOR_RATIO
            and (full_s is None or model.estimate(ratio) >= COLD_FULL_SHARE * full_s)):
        if _slope_assumed(ratio, model, COLD_FULL_SHARE):
            # the expected cost that called for this FULL rests on the assumed slope, which overstates a
            # delta by 2-5x at 10-20% change in the benchmark's shapes: one DIFFERENTIAL refresh at this ratio
            # learns the slope, and the FULL is measured after it only if the delta still may lose
            return DIFFERENTIAL, (f"source changes applied as a delta: {ratio:.1%} of the sources changed; a "
                                  "FULL refresh would be measured here on an assumed slope, so one DIFFERENTIAL "
                                  "refresh is measured at this ratio first to learn it")
        return FULL, (f"FULL: {ratio:.1%} of the sources changed, and this table's only FULL refresh so far was "
                        "its initial population (a cold start): one is measured to learn what FULL costs")
    if (model.full_n == 1 and model.diff_n >= 2 and full_s is not None and model.floor_s is not None
            and model.floor_s >= COLD_FULL_SHARE * full_s):
        return FULL, (f"FULL: a DIFFERENTIAL refresh of this table costs ~{model.floor_s:.2f} s, near its only "
                        f"FULL refresh so far ({full_s:.2f} s, the initial population, a cold start): one is "
                        "measured to learn what FULL costs")
    threshold, how = model.threshold()
    expected = model.estimate(ratio)
    may_win = expected is not None and full_s is not None and expected <= REMEASURE_WITHIN * full_s
    if (ratio > threshold and ratio <= EXPLORE_BELOW and may_win
            and (model.full_n + model.diff_n) % REMEASURE_EVERY == 0):
        return DIFFERENTIAL, (f"source changes applied as a delta: {ratio:.2%} of the sources changed, above "
                                f"this table's threshold {threshold:.1%} ({how}), but a DIFFERENTIAL refresh is "
                                f"measured again once in {REMEASURE_EVERY} refreshes")
    if ratio <= threshold and expected is not None and full_s is not None:
        if model.full_n == 2 and expected >= RECHECK_SHARE * full_s:
            return FULL, (f"FULL: {ratio:.2%} of the sources changed, below this table's threshold {threshold:.1%} "
                          f"({how}), but that threshold rests on one warm FULL refresh: a delta is expected at "
                          f"~{expected:.2f} s, so FULL is measured once more")
        if (model.full_n + model.diff_n) % REMEASURE_EVERY == 0 and full_s <= REMEASURE_WITHIN * expected:
            return FULL, (f"FULL: {ratio:.2%} of the sources changed, below this table's threshold {threshold:.1%} "
                          f"({how}), but a FULL refresh is measured again once in {REMEASURE_EVERY} refreshes")
    if ratio > threshold and _slope_assumed(ratio, model, 1.0):
        # the threshold rests on an assumed slope (a delta of half the table costing a FULL refresh), which an
        # aggregate's delta, growing with its changed groups, can miss by several times: learn it once
        return DIFFERENTIAL, (f"source changes applied as a delta: {ratio:.1%} of the sources changed, above "
                                f"this table's threshold {threshold:.1%} ({how}), but that threshold rests on an "
                                "assumed slope: one DIFFERENTIAL refresh is measured at this ratio to learn it")
    if ratio > threshold:
        return FULL, (f"FULL: {ratio:.1%} of the sources changed, above this table's threshold "
                        f"{threshold:.1%} ({how})")
    return DIFFERENTIAL, (f"source changes applied as a delta: {ratio:.2%} of the sources changed, below this "
                            f"table's threshold {threshold:.1%} ({how})")


def _slope_assumed(ratio: float, model: CostModel, below_full: float) -> bool:
    """Whether a window of ``ratio`` would be judged on the assumed slope although this table's floor is
    known and below ``below_full`` x its FULL refresh: the slope is what a DIFFERENTIAL refresh at this ratio
    measures, and the floor's bound says that refresh can still be the cheaper mode."""
    return (model.slope_s is None and model.diff_n >= 2 and not model.at_floor(ratio)
            and model.full_s is not None and model.floor_s is not None
            and model.floor_s < below_full * model.full_s)


def budget(model: CostModel, setting: str | None) -> float | None:
    """Seconds an AUTO table's DIFFERENTIAL refresh may run before it is cancelled for a FULL one (None: no
    limit, nothing known of FULL yet). Why: AUTO tries a delta before it knows what one costs, and a delta
    can be dearer than the query by orders of magnitude (TPC-H Q17's correlated aggregate: minutes against
    seconds); once cancelled, the model records the budget as its cost, so AUTO recomputes from then on."""
    if setting:
        return float(setting)
    return max(BUDGET_MIN_S, RETRY_BELOW_FULLS * model.full_s) if model.full_s is not None else None


def change_ratio(change_bytes: int, source_bytes: list[int | None]) -> float | None:
    """Bytes of the window's change feeds over the bytes of the sources at the post frontier; None when a
    source's size is unknown (no checksum file)."""
    if not source_bytes or any(b is None for b in source_bytes):
        return None
    total = sum(b for b in source_bytes if b is not None)
    return change_bytes / total if total > 0 else None
