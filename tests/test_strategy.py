"""The apply strategy and AUTO's cost model (pipeline/strategy.py): pure decisions, no Spark."""

from __future__ import annotations

import pytest

from pipeline import strategy
from pipeline.strategy import CostModel, Limits

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit


def test_choose_appends_insert_only_deltas_of_plain_rows_and_merges_the_rest() -> None:
    limits = Limits()
    assert strategy.choose(0, 0, True, None, limits).strategy == strategy.NONE
    c = strategy.choose(10, 0, True, None, limits)
    assert (c.strategy, c.engine) == (strategy.APPEND, "delta-rs")
    c = strategy.choose(10, 0, False, None, limits)  # keyed: an insert may be an update of a stored group
    assert (c.strategy, c.engine) == (strategy.MERGE, "delta-rs")
    c = strategy.choose(10, 3, True, None, limits)
    assert c.strategy == strategy.MERGE and "3 of 10" in c.reason


def test_choose_falls_back_to_spark_and_says_why() -> None:
    c = strategy.choose(10, 0, True, "table features delta-rs does not write: deletionVectors", Limits())
    assert (c.strategy, c.engine) == (strategy.APPEND, "spark") and "deletionVectors" in c.reason
    c = strategy.choose(5_000, 1, False, None, Limits(delta_rs_rows=1_000))
    assert c.engine == "spark" and "5000 change rows" in c.reason
    c = strategy.choose(5, 1, False, None, Limits(delta_rs=False))
    assert c.engine == "spark" and "off" in c.reason


def test_changes_to_stored_rows_of_a_big_table_use_deletion_vectors() -> None:
    limits = Limits(dv_above_rows=1_000)
    c = strategy.choose(10, 2, True, None, limits, target_rows=5_000)
    assert (c.strategy, c.engine) == (strategy.MERGE, "spark-dv") and "5000 rows" in c.reason
    assert strategy.choose(10, 0, False, None, limits, target_rows=5_000).engine == "spark-dv"  # keyed updates
    assert strategy.choose(10, 0, True, None, limits, target_rows=5_000).strategy == strategy.APPEND
    assert strategy.choose(10, 2, True, None, limits, target_rows=999).engine == "delta-rs"


def test_deletions_are_marked_when_the_files_they_hit_hold_many_rows() -> None:
    """Own deletion vectors (strategy.marks) when a copy-on-write MERGE would rewrite more rows than the limit:
    the rows of the files the deletions are expected to hit, not the table's size."""
    limits = Limits(vectors_above_rows=100_000)
    few_big_files = [250_000] * 4  # 1M rows in 4 files: 1,000 scattered deletions hit all of them
    assert strategy.rewritten_rows(few_big_files, 1_000) == pytest.approx(1_000_000)
    c = strategy.marks(False, 1_000, few_big_files, None, limits)
    assert c is not None and (c.strategy, c.engine) == (strategy.MERGE, "vectors") and "1,000,000" in c.reason
    many_small_files = [1_000] * 1_000  # the same rows in 1,000 files: 3 deletions rewrite ~3 files
    assert strategy.rewritten_rows(many_small_files, 3) == pytest.approx(3_000, rel=0.01)
    assert strategy.marks(False, 3, many_small_files, None, limits) is None
    assert strategy.marks(False, 0, few_big_files, None, limits) is None  # insert-only: an append
    assert strategy.marks(False, 1_000, None, None, limits) is None  # file sizes unknown
    assert strategy.marks(False, 1_000, few_big_files, "a V2 checkpoint", limits) is None
    assert strategy.marks(False, 1_000, few_big_files, None, Limits(vectors_above_rows=-1)) is None
    # once the table has vectors, every change goes that way (delta-rs does not write such a table)
    c = strategy.marks(True, 0, [10], None, limits)
    assert c is not None and (c.strategy, c.engine) == (strategy.APPEND, "vectors")


def test_collect_first_and_limits_from_conf() -> None:
    limits = Limits.from_conf({strategy.COLLECT_BELOW: "100", strategy.DELTA_RS: "false"})
    assert limits.collect_below_bytes == 100 and not limits.delta_rs
    assert strategy.collect_first(100, limits) and not strategy.collect_first(101, limits)
    assert "above" in strategy.uncollected(101, limits).reason


def test_auto_explores_differential_first_then_decides_by_learned_cost() -> None:
    model = CostModel().learn("FULL", None, 2.0)  # the initial population: a cold start
    action, reason = strategy.auto(0.3, model)
    assert action == "DIFFERENTIAL" and "tried first" in reason
    model = model.learn("DIFFERENTIAL", 0.001, 1.2)  # the first delta: cold too
    action, reason = strategy.auto(0.001, model)
    assert action == "DIFFERENTIAL" and "second one is measured" in reason
    model = model.learn("DIFFERENTIAL", 0.001, 0.4)
    assert model.floor_s == pytest.approx(0.4) and model.diff_n == 2  # the cold one replaced, not averaged
    assert strategy.auto(0.001, model)[0] == "DIFFERENTIAL"  # a FULL cannot pay off at the floor's ratio
    # above the floor's ratio the expected delta rests on the assumed slope: it is learned before any FULL
    action, reason = strategy.auto(0.1, model)
    assert action == "DIFFERENTIAL" and "learn it" in reason
    learned = model.learn("DIFFERENTIAL", 0.1, 0.9)  # the delta grew with the change: FULL may win
    action, reason = strategy.auto(0.1, learned)
    assert action == "FULL" and "initial population (a cold start)" in reason
    assert strategy.auto(0.1, model.learn("DIFFERENTIAL", 0.1, 0.45))[0] == "DIFFERENTIAL"  # it barely grew
    model = model.learn("FULL", None, 1.0)
    assert model.full_s == pytest.approx(1.0) and model.full_n == 2
    # slope unknown: a DIFFERENTIAL refresh of half the table is assumed to cost a FULL one
    threshold, how = model.threshold()
    assert threshold == pytest.approx(0.001 + (1.0 - 0.4) / 2.0) and "assumed" in how
    # above it, while the slope is assumed, one DIFFERENTIAL refresh is measured to learn the slope
    action, reason = strategy.auto(0.5, model)
    assert action == "DIFFERENTIAL" and "assumed slope" in reason and "threshold 30.1%" in reason
    assert strategy.auto(0.1, model)[0] == "DIFFERENTIAL"
    flat = model.learn("DIFFERENTIAL", 0.5, 0.5)  # an aggregate: half the source changed, the delta barely grew
    assert flat.slope_s == pytest.approx(0.1 / 0.499) and strategy.auto(0.5, flat)[0] == "DIFFERENTIAL"
    steep = model.learn("DIFFERENTIAL", 0.5, 2.4)  # plain rows: the delta grew with the change
    action, reason = strategy.auto(0.5, steep)
    assert action == "FULL" and "50.0% of the sources changed, above this table's threshold 15.1%" in reason
    # a DIFFERENTIAL refresh at 10% that took as long as a FULL one lowers the threshold to about 10%
    model = model.learn("DIFFERENTIAL", 0.1, 1.0)
    threshold, how = model.threshold()
    assert threshold == pytest.approx(0.1) and "learned" in how and "assumed" not in how
    assert strategy.auto(0.2, model)[0] == "FULL"
    assert strategy.auto(None, model)[0] == "DIFFERENTIAL"


def test_auto_does_not_retry_a_delta_plainly_dearer_than_the_query() -> None:
    model = CostModel().learn("FULL", None, 1.0).learn("DIFFERENTIAL", 0.01, 5.0)
    action, reason = strategy.auto(0.01, model)
    assert action == "FULL" and "threshold 0.0%" in reason


def test_auto_measures_a_warm_full_when_the_floor_nears_the_cold_one() -> None:
    """TPC-H's joins: at 0.1% change the floor (2.5 s) is above a warm FULL (1.5 s) but below the initial
    population (4 s, cold). One warm FULL is measured, then FULL wins; a DIFFERENTIAL refresh is measured
    again once in REMEASURE_EVERY refreshes."""
    model = CostModel().learn("FULL", None, 4.0).learn("DIFFERENTIAL", 0.001, 3.5).learn("DIFFERENTIAL", 0.001, 2.5)
    action, reason = strategy.auto(0.001, model)
    assert action == "FULL" and "one is measured" in reason
    model = model.learn("FULL", None, 1.5)
    assert strategy.auto(0.001, model)[0] == "FULL"
    while (model.full_n + model.diff_n) % strategy.REMEASURE_EVERY:
        assert strategy.auto(0.001, model)[0] == "FULL"
        model = model.learn("FULL", None, 1.5)
    action, reason = strategy.auto(0.001, model)
    assert action == "DIFFERENTIAL" and "measured again" in reason
    model = model.learn("DIFFERENTIAL", 0.001, 2.5)
    assert strategy.auto(0.001, model)[0] == "FULL"
    # a cheap floor against the cold FULL: nothing to learn from a FULL at the floor's ratio
    cheap = CostModel().learn("FULL", None, 4.0).learn("DIFFERENTIAL", 0.001, 1.2).learn("DIFFERENTIAL", 0.001, 0.5)
    assert strategy.auto(0.001, cheap)[0] == "DIFFERENTIAL"
    # nor above it when even a quarter of the cold FULL is above the expected delta (10M rows, 1-3% change)
    cheap = CostModel().learn("FULL", None, 10.0).learn("DIFFERENTIAL", 0.01, 1.0).learn("DIFFERENTIAL", 0.01, 0.3)
    assert strategy.auto(0.03, cheap)[0] == "DIFFERENTIAL"  # expected 0.3 + 20 x 0.03 = 0.9 s < 2.5 s
    action, reason = strategy.auto(0.2, cheap)  # expected 4.3 s on the assumed slope: learned first
    assert action == "DIFFERENTIAL" and "assumed slope" in reason
    cheap = cheap.learn("DIFFERENTIAL", 0.2, 4.3)  # it held: FULL may well win, so it is measured
    action, reason = strategy.auto(0.2, cheap)
    assert action == "FULL" and "initial population (a cold start)" in reason


def test_a_floor_measured_at_a_high_ratio_is_not_mistaken_for_a_flat_delta() -> None:
    """A table whose first windows each changed 18% of its sources has its floor measured at 18%: another
    DIFFERENTIAL refresh at 18% refines that floor (a slope taken from it would be noise around zero); a 59%
    window is then judged on an assumed slope, so one DIFFERENTIAL refresh there learns the real one; a
    learned slope of zero is a slope, not an unknown."""
    model = CostModel().learn("FULL", None, 3.0).learn("DIFFERENTIAL", 0.18, 1.5).learn("DIFFERENTIAL", 0.18, 0.9)
    assert model.floor_ratio == pytest.approx(0.18)
    assert strategy.auto(0.18, model)[0] == "FULL"  # the floor (0.9 s) reaches a quarter of the cold FULL
    model = model.learn("FULL", None, 2.0).learn("DIFFERENTIAL", 0.181, 0.95)
    assert model.slope_s is None and model.floor_s == pytest.approx(0.7 * 0.9 + 0.3 * 0.95)
    assert model.estimate(0.1) == model.floor_s  # below the floor's ratio a delta costs the floor
    action, reason = strategy.auto(0.59, model)
    assert action == "DIFFERENTIAL" and "assumed slope" in reason
    steep = model.learn("DIFFERENTIAL", 0.59, 4.1)  # plain rows: the delta grew with the change
    assert steep.slope_s == pytest.approx((4.1 - steep.floor_s) / (0.59 - steep.floor_ratio))
    assert strategy.auto(0.59, steep)[0] == "FULL" and strategy.auto(0.18, steep)[0] == "DIFFERENTIAL"
    flat = model.learn("DIFFERENTIAL", 0.59, 0.5)  # an aggregate: cheaper than the floor, slope 0
    assert flat.slope_s == 0.0 and flat.slope() == 0.0 and strategy.auto(0.59, flat)[0] == "DIFFERENTIAL"
    assert "assumed" not in flat.threshold()[1]
    assert CostModel.from_dict(flat.to_dict()) == flat


def test_cost_model_round_trips_and_averages() -> None:
    model = CostModel().learn("FULL", None, 2.0).learn("FULL", None, 1.0)
    assert model.full_s == pytest.approx(1.0)  # the second observation replaces the cold first one
    model = model.learn("FULL", None, 3.0)
    assert model.full_s == pytest.approx(0.7 * 1.0 + 0.3 * 3.0) and model.full_n == 3
    assert CostModel.from_dict(model.to_dict()) == model
    assert CostModel.from_dict(None) == CostModel()
    assert model.learn("NO_DATA", 0.0, 0.001) == model
    # a model saved before the counts existed: each estimate is one observation
    old = CostModel.from_dict({"full_s": 2.0, "floor_s": 0.5, "slope_s": None})
    assert (old.full_n, old.diff_n) == (1, 1)


def test_change_ratio() -> None:
    assert strategy.change_ratio(10, [50, 50]) == pytest.approx(0.1)
    assert strategy.change_ratio(10, [50, None]) is None
    assert strategy.change_ratio(10, []) is None



def test_auto_remeasures_a_delta_only_where_it_may_win() -> None:
    """The matrix's scan at 10M rows: FULL ~4.6 s, a delta's floor 0.9 s and 59 s per unit of change ratio.
    Once in REMEASURE_EVERY refreshes a DIFFERENTIAL refresh is measured again just above the threshold
    (expected at most REMEASURE_WITHIN FULL refreshes), never at 45% (expected 27 s, measured 45.9 s)."""
    model = (CostModel().learn("FULL", None, 9.0).learn("DIFFERENTIAL", 0.002, 1.2).learn("DIFFERENTIAL", 0.002, 0.9)
             .learn("DIFFERENTIAL", 0.166, 0.9 + 59.4 * 0.164).learn("FULL", None, 4.6))
    threshold = model.threshold()[0]
    assert 0.06 < threshold < 0.08
    while (model.full_n + model.diff_n) % strategy.REMEASURE_EVERY:
        assert strategy.auto(0.446, model)[0] == "FULL"
        model = model.learn("FULL", None, 4.6)
    action, reason = strategy.auto(0.446, model)
    assert action == "FULL" and "above this table's threshold" in reason
    action, reason = strategy.auto(threshold + 0.05, model)  # expected ~7.6 s: within 2 FULL refreshes
    assert action == "DIFFERENTIAL" and "measured again" in reason


def test_one_slow_delta_does_not_turn_auto_to_full() -> None:
    """The matrix's join_agg at 1M rows (session 52): a floor of 0.04 s, deltas of 0.06-0.08 s at 18% change,
    FULL ~1.43 s learned from the initial population. One refresh of the first 50% window took ~1.4 s (the
    slope it implies would have moved 0.12 -> 0.72 s), after which AUTO measured a warm FULL (0.35 s) and
    recomputed every 50% window although its delta took 0.11 s. One slow refresh among fast ones moves
    nothing now; two of the last three do, so a delta that really got dearer is still learned."""
    model = (CostModel().learn("FULL", None, 1.43).learn("DIFFERENTIAL", 0.0096, 0.05)
             .learn("DIFFERENTIAL", 0.0096, 0.04))
    for seconds in (0.063, 0.077, 0.085, 0.061):
        model = model.learn("DIFFERENTIAL", 0.178, seconds)
    before = model.slope_s
    assert before is not None and 0.1 < before < 0.3
    slowed = model.learn("DIFFERENTIAL", 0.676, 1.43)
    assert slowed.slope_s == pytest.approx(0.7 * before + 0.3 * sorted(slowed.recent)[1])
    assert slowed.slope_s < 1.5 * before
    assert strategy.auto(0.60, slowed)[0] == "DIFFERENTIAL"
    dearer = slowed.learn("DIFFERENTIAL", 0.60, 1.3)  # the second slow one of three: the delta got dearer
    assert dearer.slope_s is not None and dearer.slope_s > 3 * before
    assert strategy.auto(0.60, dearer)[0] == "FULL"
    assert CostModel.from_dict(dearer.to_dict()) == dearer
    # a delta cancelled over its budget is no passing slowdown: the slope takes it at once
    cancelled = model.learn("DIFFERENTIAL", 0.676, 30.0, certain=True)
    assert cancelled.slope_s == pytest.approx(0.7 * before + 0.3 * (30.0 - model.floor_s) / (0.676 - model.floor_ratio))
    assert strategy.auto(0.60, cancelled)[0] == "FULL"


def test_auto_measures_full_again_when_one_warm_full_decides_a_close_call() -> None:
    """The matrix's aggregate at 10M rows and 10% change (session 58): the one warm FULL AUTO measured took
    0.81 s (the first FULL after a run of deltas replaces their many small files), FULL refreshes of the FULL
    table 0.30-0.54 s, deltas ~0.8 s. On that one sample AUTO kept the delta, 1.70x the faster mode. A close
    call gets FULL measured once more; a clear one does not; a table AUTO keeps refreshing by its delta has
    FULL measured again once in REMEASURE_EVERY refreshes, where it may win."""
    model = (CostModel().learn("FULL", None, 1.72).learn("DIFFERENTIAL", 0.002, 0.08)
             .learn("DIFFERENTIAL", 0.002, 0.05).learn("DIFFERENTIAL", 0.16, 0.85))
    action, reason = strategy.auto(0.16, model)
    assert action == "FULL" and "initial population (a cold start)" in reason
    model = model.learn("FULL", None, 0.81)
    assert model.full_n == 2 and model.threshold()[0] == pytest.approx(0.152, abs=0.001)
    action, reason = strategy.auto(0.15, model)  # a delta expected at ~0.80 s against one FULL of 0.81 s
    assert action == "FULL" and "rests on one warm FULL refresh" in reason and "once more" in reason
    assert strategy.auto(0.05, model)[0] == "DIFFERENTIAL"  # expected ~0.29 s: FULL cannot win
    rechecked = model.learn("FULL", None, 0.45)
    assert rechecked.full_s == pytest.approx(0.7 * 0.81 + 0.3 * 0.45)
    action, reason = strategy.auto(0.15, rechecked)
    assert action == "FULL" and "above this table's threshold" in reason
    # FULL again once in REMEASURE_EVERY refreshes while a delta is expected at more than half of FULL
    model = rechecked
    while (model.full_n + model.diff_n) % strategy.REMEASURE_EVERY:
        assert strategy.auto(0.08, model)[0] == "DIFFERENTIAL"  # expected ~0.44 s against FULL's 0.70 s
        model = model.learn("DIFFERENTIAL", 0.08, 0.44)
    action, reason = strategy.auto(0.08, model)
    assert action == "FULL" and "measured again once in" in reason
    assert strategy.auto(0.01, model)[0] == "DIFFERENTIAL"  # expected at the floor: FULL cannot win
    assert strategy.auto(0.08, model.learn("FULL", None, 0.70))[0] == "DIFFERENTIAL"


def test_a_full_result_is_collected_when_the_table_held_few_rows_or_few_bytes() -> None:
    limits = Limits(full_collect_rows=100, full_collect_bytes=1_000)
    assert "held 100 rows" in (strategy.collect_full(100, 10**9, limits) or "")  # few rows, whatever the bytes
    assert "1000 bytes" in (strategy.collect_full(5_000, 1_000, limits) or "")  # many narrow rows
    assert strategy.collect_full(5_000, 1_001, limits) is None
    assert strategy.collect_full(None, None, limits) is None  # unknown: Spark writes it
    assert strategy.collect_full(5_000, 10, Limits(full_collect_rows=100, full_collect_bytes=0)) is None  # off
    assert Limits.from_conf({strategy.FULL_COLLECT_BYTES: "7"}).full_collect_bytes == 7
    assert Limits().full_collect_bytes == 32 << 20


def test_a_collected_full_result_past_the_drivers_limit_is_left_to_spark() -> None:
    """What Spark raises when a collected result outgrows ``spark.driver.maxResultSize`` sends the FULL back to
    Spark's writer (the table it replaces was small, its new result is not); any other error is the query's."""
    from pipeline.refresh import collected_full

    class Result:  # a DataFrame's toArrow as the driver ends it
        def __init__(self, error: Exception | None) -> None:
            self.error = error

        def toArrow(self) -> str:  # noqa: N802 - PySpark's name
            if self.error is not None:
                raise self.error
            return "rows"

    assert collected_full(Result(None)) == "rows"
    too_big = RuntimeError("Job aborted: Total size of serialized results of 3 tasks (1100.0 MiB) is bigger than "
                           "spark.driver.maxResultSize (1024.0 MiB)")
    assert collected_full(Result(too_big)) is None
    with pytest.raises(ValueError, match="DIVIDE_BY_ZERO"):
        collected_full(Result(ValueError("[DIVIDE_BY_ZERO] Division by zero")))
