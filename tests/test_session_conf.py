"""A refresh reads the ``trickle.*`` settings in one round trip to the JVM (pipeline/session_conf.py): what it
reads must be what ``spark.conf.get`` answers, value by value, including values that look like the joined
map's own punctuation. And the static settings the project's session is built with hold in it."""

from __future__ import annotations

from typing import Any


def test_one_round_trip_reads_what_spark_conf_answers(spark: Any) -> None:
    from pipeline.session_conf import ConfReads, SessionSettings, jvm_session

    odd = "a -> b, (c) \n d"
    spark.conf.set("trickle.test.odd", odd)
    spark.conf.set("trickle.test.n", "7")
    spark.conf.set("trickle.test.later", "before")
    try:
        reads = ConfReads(spark.conf, SessionSettings(jvm_session(spark)))
        assert reads.get("trickle.test.odd") == odd == spark.conf.get("trickle.test.odd")
        assert reads.get("trickle.test.n", "1") == "7"
        assert reads.get("trickle.test.unset", "dflt") == "dflt"
        assert reads.get("trickle.test.unset") is None
        assert reads.get("spark.sql.session.timeZone") == spark.conf.get("spark.sql.session.timeZone")
        # one snapshot per refresh: a change made meanwhile is seen by the next refresh's reads
        spark.conf.set("trickle.test.n", "8")
        assert reads.get("trickle.test.n", "1") == "7"
        # one round trip for every trickle.* key: one not asked for until now was read with the first
        spark.conf.set("trickle.test.later", "after")
        assert reads.get("trickle.test.later") == "before"
        assert ConfReads(spark.conf, SessionSettings(jvm_session(spark))).get("trickle.test.n", "1") == "8"
        # Spark Connect (no JVM session): every key asked for on its own
        assert ConfReads(spark.conf, None).get("trickle.test.n") == "8"
    finally:
        for k in ("odd", "n", "later"):
            spark.conf.unset(f"trickle.test.{k}")


def test_kept_settings_follow_every_change_of_the_session(spark: Any, tmp_path: Any) -> None:
    """One SessionSettings serves every refresh of a session: each change (set, unset, SQL SET) is seen by
    the next read, and an unchanged session is answered without reading the settings again."""
    from pipeline.session_conf import SessionSettings, jvm_session

    kept = SessionSettings(jvm_session(spark))
    assert kept._rendering() is not None, "the session's settings map is out of reach: every read costs 3 trips"  # noqa: SLF001
    spark.range(3).write.format("delta").mode("append").save(str(tmp_path / "t"))
    try:
        spark.conf.set("trickle.test.kept", "1")
        first = kept.own()
        assert first.get("trickle.test.kept") == "1"
        assert kept.own() is first  # unchanged: the kept read
        # a Delta commit in the session rewrites spark.databricks.delta.lastCommitVersionInSession: no trickle.*
        # setting changed, so the kept read stands
        spark.range(3).write.format("delta").mode("append").save(str(tmp_path / "t"))
        assert spark.conf.get("spark.databricks.delta.lastCommitVersionInSession") is not None
        assert kept.own() is first
        spark.conf.set("trickle.test.kept", "2")
        assert kept.own().get("trickle.test.kept") == "2"
        spark.sql("SET trickle.test.kept = 3")
        assert kept.own().get("trickle.test.kept") == "3"
        spark.conf.unset("trickle.test.kept")
        assert "trickle.test.kept" not in kept.own()
        spark.conf.set("trickle.test.other", "x")
        assert kept.own().get("trickle.test.other") == "x"
    finally:
        spark.conf.unset("trickle.test.kept")
        spark.conf.unset("trickle.test.other")


def test_settings_read_every_time_when_the_map_is_out_of_reach(spark: Any) -> None:
    """Another Spark build without the settings map: every read asks the JVM, and still sees each change."""
    from pipeline.session_conf import SessionSettings, jvm_session

    kept = SessionSettings(jvm_session(spark))
    kept._map = False  # noqa: SLF001 - what a failed lookup of the map leaves
    try:
        spark.conf.set("trickle.test.kept", "1")
        assert kept.own().get("trickle.test.kept") == "1"
        spark.conf.set("trickle.test.kept", "2")
        assert kept.own().get("trickle.test.kept") == "2"
    finally:
        spark.conf.unset("trickle.test.kept")


def test_the_volatile_entry_compares_equal_whatever_its_value() -> None:
    """The rendering's volatile entry (Delta's last commit version of the session) loses its value wherever it
    stands; every other entry, and the entry's presence, still count."""
    from pipeline.session_conf import _stable

    key = "spark.databricks.delta.lastCommitVersionInSession"
    for before, after in ((f"{{{key}=3, a=1}}", f"{{{key}=12, a=1}}"), (f"{{a=1, {key}=-1}}", f"{{a=1, {key}=7}}"),
                          (f"{{a=1, {key}=40, b=2}}", f"{{a=1, {key}=41, b=2}}")):
        assert _stable(before) == _stable(after)
    assert _stable(f"{{a=1, {key}=4}}") != _stable(f"{{a=2, {key}=4}}")
    assert _stable("{a=1}") == "{a=1}" and _stable(f"{{{key}=4}}") != _stable("{}")


def test_compiled_stages_outlast_the_churn_of_many_stream_tables(spark: Any) -> None:
    """Spark's cache of compiled stages defaults to 100 classes; refreshes inline literals (a salt, a pinned
    version) into generated code, so a process keeping many tables fresh churned it and recompiled every query,
    Delta's file-skipping stages included (docs/BENCHMARKS.md, session 65). A static setting: the session the
    project builds must carry it from its start."""
    from pipeline.session import SMALL_MACHINE_DEFAULTS

    key = "spark.sql.codegen.cache.maxEntries"
    assert int(SMALL_MACHINE_DEFAULTS[key]) >= 1000
    assert spark.conf.get(key) == SMALL_MACHINE_DEFAULTS[key]
