"""A refresh reads the ``trickle.*`` settings in one round trip to the JVM (pipeline/session_conf.py): what it
reads must be what ``spark.conf.get`` answers, value by value, including values that look like the joined
map's own punctuation."""

from __future__ import annotations

from typing import Any


def test_one_round_trip_reads_what_spark_conf_answers(spark: Any) -> None:
    from pipeline.session_conf import ConfReads, jvm_session

    odd = "a -> b, (c) \n d"
    spark.conf.set("trickle.test.odd", odd)
    spark.conf.set("trickle.test.n", "7")
    spark.conf.set("trickle.test.later", "before")
    try:
        reads = ConfReads(spark.conf, jvm_session(spark))
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
        assert ConfReads(spark.conf, jvm_session(spark)).get("trickle.test.n", "1") == "8"
        # Spark Connect (no JVM session): every key asked for on its own
        assert ConfReads(spark.conf, None).get("trickle.test.n") == "8"
    finally:
        for k in ("odd", "n", "later"):
            spark.conf.unset(f"trickle.test.{k}")
