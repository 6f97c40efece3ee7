"""Nexmark-shaped streaming benchmark: Debezium events through Kafka into IMMEDIATE stream tables, all live at once.

    ./dev bench nexmark                                   # 2,000 events/s for 30 s, every query
    ./dev bench nexmark --rate 500 --seconds 10 --queries q1,q3,q4

Why: the Kafka freshness benchmark (:mod:`benchmarks.kafka_freshness`) measures one join + aggregate over
two topics. A pipeline in production keeps many tables fresh from the same topics at once, on the same two
cores; Nexmark (the auction-site benchmark of streaming engines) is the common shape for that. Here every
selected query is one IMMEDIATE stream table, and all of them run in one Spark application while the events
arrive, so the result says which event rate the whole set sustains, not each query alone.

Data. A real Kafka broker (services/kafka.py) carries three topics, ``person``, ``auction`` and ``bid``, in
the Debezium envelope without the JsonConverter schema wrapper (``before``/``after``/``op``/``ts_ms``/
``source.lsn``, as :class:`benchmarks.kafka_freshness.Feed` writes it). A Nexmark-like generator
(:class:`Nexmark`) produces new people, auctions and bids in Nexmark's proportions 1:3:46; auctions are sold by
recent people (half of them by the 20 newest, so q8 finds new users), bids go to recent auctions (half of
them to the 10 newest: hot items) by recent people, prices ``round(10^(6u) * 100)`` as in Nexmark's
generator. About 3% of the events are changes: bid price raises and retracted bids (updates and deletes),
auction reserve and category changes, withdrawn auctions, and people moving to another state (a join-side
change for q3). ``date_time`` (and ``expires``) are epoch milliseconds in ``BIGINT`` columns: the decoder
would read an integer for a ``TIMESTAMP`` column as microseconds (Debezium's adaptive precision), the
arithmetic of time buckets is plain integer arithmetic, and sources with timestamp columns keep refreshes off
the DuckDB engine (README, "How a refresh works"). Nexmark's event sizes are not padded (``extra`` is
empty), and bids carry an ``id`` primary key (Debezium needs one; Nexmark's bids have none).

Pipeline, the pieces ``trickle run`` uses, in one Spark application: one ingestion query per topic
(:func:`connectors.kafka_mirror.start`, Debezium -> Delta mirror named like the topic, trigger 0.5 s); each
mirror batch marks the IMMEDIATE tables that read it (:func:`pipeline.fused.fed_by`), and each table's
refresh lane (:class:`pipeline.fused_lanes.RefreshLanes`) refreshes it, coalescing marks; the batch waits
for those refreshes up to ``runtime.fused_wait_seconds`` (the ``fused`` path of kafka_freshness).

The queries. ``{bucket}`` is a 10 s tumbling window of event time, written as a grouping column (a stream
table is one query over whole tables; Nexmark's q5 uses sliding windows, q7/q8 its streaming windows):
``(date_time - date_time % 10000)``, the window's first millisecond as Nexmark's ``starttime``. The first
form, ``date_time DIV 10000`` (``--buckets div``), is accepted too, but the driver's DuckDB engine does not
translate ``DIV`` (IntDiv), so every delta of q5, q7 and q8 went to Spark. In smoke runs with all queries
live (500 events/s, 10 s) their freshness p50 was 25-71 s with ``DIV`` (those two runs shared the machine
with another benchmark; Spark refreshes of 28-37 s at the median) and about 3 s with ``%`` (alone; DuckDB
refreshes of 1.1-1.4 s)::

    q1 currency conversion   SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid
    q2 selection             SELECT auction, price FROM bid WHERE auction % 123 = 0
    q3 local item suggestion SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p
                             ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
    q4 average closing price per category: the highest bid per auction within its lifetime, averaged per
       category (nested aggregate). Nexmark keeps only closed auctions (expires < now); "now" would make the
       query non-deterministic, so every auction counts with its highest bid so far.
       SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT MAX(b.price) AS final, a.category
       FROM auction a JOIN bid b ON a.id = b.auction WHERE b.date_time BETWEEN a.date_time AND a.expires
       GROUP BY a.id, a.category) q GROUP BY q.category
    q5 hot items: per bucket, the auctions with the most bids
       WITH counts AS (SELECT auction, {bucket} AS bucket, COUNT(*) AS num FROM bid GROUP BY auction, {bucket})
       SELECT c.auction, c.bucket, c.num FROM counts c JOIN (SELECT bucket, MAX(num) AS maxn FROM counts
       GROUP BY bucket) m ON c.bucket = m.bucket AND c.num >= m.maxn
    q7 highest bid per bucket
       SELECT b.auction, b.price, b.bidder, b.date_time FROM bid b JOIN (SELECT {bucket} AS bucket,
       MAX(price) AS maxprice FROM bid GROUP BY {bucket}) m ON {bucket of b.date_time} = m.bucket
       AND b.price = m.maxprice
    q8 new users: people who opened an auction in the bucket they registered in
       SELECT p.id, p.name, p.bucket FROM (SELECT id, name, {bucket} AS bucket FROM person
       GROUP BY id, name, {bucket}) p JOIN (SELECT seller, {bucket} AS bucket FROM auction
       GROUP BY seller, {bucket}) a ON p.id = a.seller AND p.bucket = a.bucket

Each is created with ``refresh_mode="IMMEDIATE"``; a query the engine refuses is reported with its error and
the next, simpler form of the same query is tried (:attr:`Query.forms`: q4 with the auction id in its inner
select; q5 as the per-auction bucket counts alone; q7 with ``max_by``; q8 with DISTINCT sellers). The report
names the form each query ran; in the smoke runs the engine accepted every first form.

Freshness of an event (a *create* of its topic; bid creates for q1, q2, q4, q5 and q7, person and auction
creates for q3 and q8) = the time the stream table first equalled its query at a frontier covering the
mirror version that applied the event - the time the producer sent it. That time is the commit time of the
first stream table commit whose frontier covers that version (read from the Delta logs, as
kafka_freshness does), or, when a refresh covering it had an empty delta and so committed nothing (a *soft
frontier*: q2 and q3 filter most events out), the time that refresh returned (the lanes' ``done``
callback). Which mirror version applied each event comes from the mirror's Change Data Feed. A query is
*sustained* when freshness does not grow over the run (last third's median <= 1.5 x first third's + 1 s)
and the table catches up within 60 s after the producer stops (its frontier covers the mirror versions of
the last events). At the end every table is refreshed once more and compared with its query recomputed
(multisets, floats within 1e-9 relative): ``equals_query``. Nothing here asserts a time.

The timed producer runs in a child process (``--produce``), as a real producer runs outside the pipeline
(see kafka_freshness). Results: a markdown table on stdout, and ``benchmarks/out/nexmark-<epoch>.json``
(git-ignored).
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kafka_freshness import paced  # noqa: E402
from benchmarks.streaming import percentile  # noqa: E402
from pipeline.conf import RuntimeSpec  # noqa: E402

TOPICS = ("person", "auction", "bid")

#: The mirrors' columns (Spark SQL types, as a conf file's ``columns:``); the primary key is ``id``.
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "person": (("id", "BIGINT"), ("name", "STRING"), ("email_address", "STRING"), ("credit_card", "STRING"),
               ("city", "STRING"), ("state", "STRING"), ("date_time", "BIGINT"), ("extra", "STRING")),
    "auction": (("id", "BIGINT"), ("item_name", "STRING"), ("description", "STRING"), ("initial_bid", "BIGINT"),
                ("reserve", "BIGINT"), ("date_time", "BIGINT"), ("expires", "BIGINT"), ("seller", "BIGINT"),
                ("category", "BIGINT"), ("extra", "STRING")),
    "bid": (("id", "BIGINT"), ("auction", "BIGINT"), ("bidder", "BIGINT"), ("price", "BIGINT"),
            ("channel", "STRING"), ("url", "STRING"), ("date_time", "BIGINT"), ("extra", "STRING")),
}

# Nexmark's generator vocabulary (its GeneratorConfig / PersonGenerator)
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
FIRST_ID = {"person": 1000, "auction": 1000, "bid": 1}  # Nexmark numbers people and auctions from 1000
KEEP = {"person": 1000, "auction": 500, "bid": 500}  # recent rows the generator refers to and changes

#: The 10 s event-time bucket of a row, over its ``date_time`` column ``{c}`` (see the module docstring):
#: ``start``, the bucket's first millisecond (Nexmark's window start), or ``div``, its number.
BUCKETS = {"start": "({c} - {c} % 10000)", "div": "{c} DIV 10000"}


def sql_of(form: str, buckets: str) -> str:
    """A form's SQL with its bucket placeholders (``{bucket}``, ``{b_bucket}``, ``{p_bucket}``: of
    ``date_time``, ``b.date_time``, ``p.date_time``) written as ``buckets`` says."""
    t = BUCKETS[buckets]
    return form.format(bucket=t.format(c="date_time"), b_bucket=t.format(c="b.date_time"),
                       p_bucket=t.format(c="p.date_time"))


@dataclass(frozen=True)
class Query:
    """A Nexmark query: its forms, most faithful first (the next is tried when the engine refuses one), and
    the topics whose creates time its freshness."""

    name: str
    title: str
    forms: tuple[tuple[str, str], ...]  # (label, SQL)
    measured: tuple[str, ...]


QUERIES: tuple[Query, ...] = (
    Query("q1", "currency conversion", (
        ("nexmark", "SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid"),), ("bid",)),
    Query("q2", "selection", (
        ("nexmark", "SELECT auction, price FROM bid WHERE auction % 123 = 0"),), ("bid",)),
    Query("q3", "local item suggestion", (
        ("nexmark", "SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p ON a.seller = p.id "
                    "WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')"),), ("person", "auction")),
    Query("q4", "average closing price per category", (
        ("nexmark", "SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT MAX(b.price) AS final, a.category "
                    "FROM auction a JOIN bid b ON a.id = b.auction WHERE b.date_time BETWEEN a.date_time AND "
                    "a.expires GROUP BY a.id, a.category) q GROUP BY q.category"),
        ("inner select with the auction id",
         "SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT a.id, a.category, MAX(b.price) AS final "
         "FROM auction a JOIN bid b ON a.id = b.auction WHERE b.date_time BETWEEN a.date_time AND a.expires "
         "GROUP BY a.id, a.category) q GROUP BY q.category"),
    ), ("bid",)),
    Query("q5", "hot items", (
        ("nexmark (tumbling buckets)",
         "WITH counts AS (SELECT auction, {bucket} AS bucket, COUNT(*) AS num FROM bid GROUP BY auction, {bucket}) "
         "SELECT c.auction, c.bucket, c.num FROM counts c JOIN (SELECT bucket, MAX(num) AS maxn FROM counts "
         "GROUP BY bucket) m ON c.bucket = m.bucket AND c.num >= m.maxn"),
        ("bid counts per auction and bucket",
         "SELECT auction, {bucket} AS bucket, COUNT(*) AS num FROM bid GROUP BY auction, {bucket}"),
    ), ("bid",)),
    Query("q7", "highest bid", (
        ("nexmark (tumbling buckets)",
         "SELECT b.auction, b.price, b.bidder, b.date_time FROM bid b JOIN (SELECT {bucket} AS bucket, "
         "MAX(price) AS maxprice FROM bid GROUP BY {bucket}) m ON {b_bucket} = m.bucket AND b.price = m.maxprice"),
        ("max_by per bucket",
         "SELECT {bucket} AS bucket, MAX(price) AS price, max_by(auction, price) AS auction, "
         "max_by(bidder, price) AS bidder FROM bid GROUP BY {bucket}"),
    ), ("bid",)),
    Query("q8", "monitor new users", (
        ("nexmark (tumbling buckets)",
         "SELECT p.id, p.name, p.bucket FROM (SELECT id, name, {bucket} AS bucket FROM person "
         "GROUP BY id, name, {bucket}) p JOIN (SELECT seller, {bucket} AS bucket FROM auction "
         "GROUP BY seller, {bucket}) a ON p.id = a.seller AND p.bucket = a.bucket"),
        ("DISTINCT sellers",
         "SELECT p.id, p.name, {p_bucket} AS bucket FROM person p JOIN (SELECT DISTINCT seller, "
         "{bucket} AS bucket FROM auction) a ON p.id = a.seller AND {p_bucket} = a.bucket"),
    ), ("person", "auction")),
)
BY_NAME = {q.name: q for q in QUERIES}


class Nexmark:
    """A Nexmark-like event generator writing Debezium envelopes (no schema wrapper) with one LSN sequence,
    as one PostgreSQL database would. Its state (:meth:`state`) moves to the producer child and back."""

    def __init__(self, producer: Any, seed: int) -> None:
        self.p = producer
        self.rng = random.Random(seed)
        self.lsn = 1_000
        self.next_id = dict(FIRST_ID)
        self.recent: dict[str, list[dict[str, Any]]] = {t: [] for t in TOPICS}  # newest last
        self.sent_at: dict[str, dict[int, float]] = {t: {} for t in TOPICS}  # creates: id -> handed to producer

    def state(self) -> dict[str, Any]:
        """What the producer child needs to continue this generator (ids, LSN, the rows it may change)."""
        return {"lsn": self.lsn, "next_id": self.next_id,
                "recent": {t: rows[-KEEP[t]:] for t, rows in self.recent.items()}}

    def load(self, state: dict[str, Any]) -> None:
        self.lsn, self.next_id = int(state["lsn"]), {t: int(v) for t, v in state["next_id"].items()}
        self.recent = {t: list(rows) for t, rows in state["recent"].items()}

    def _send(self, topic: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        self.lsn += 8
        now_ms = int(time.time() * 1000)
        row = after if after is not None else before
        assert row is not None
        env = {"before": before, "after": after, "op": op, "ts_ms": now_ms,
               "source": {"lsn": self.lsn, "ts_ms": now_ms, "connector": "postgresql", "db": "nexmark",
                          "schema": "public", "table": topic}}
        self.p.send(topic, key=json.dumps({"id": row["id"]}).encode(), value=json.dumps(env).encode())

    def _create(self, topic: str, row: dict[str, Any], now: float) -> None:
        self.sent_at[topic][row["id"]] = now
        self._send(topic, "c", None, row)
        rows = self.recent[topic]
        rows.append(row)
        if len(rows) > 2 * KEEP[topic]:
            del rows[:-KEEP[topic]]

    def _new_id(self, topic: str) -> int:
        i = self.next_id[topic]
        self.next_id[topic] = i + 1
        return i

    def person(self) -> None:
        r, now = self.rng, time.time()
        pid = self._new_id("person")
        first, last = r.choice(FIRST_NAMES), r.choice(LAST_NAMES)
        self._create("person", {
            "id": pid, "name": f"{first} {last}", "email_address": f"{first.lower()}{pid}@{last.lower()}.com",
            "credit_card": " ".join(f"{r.randrange(10_000):04d}" for _ in range(4)), "city": r.choice(US_CITIES),
            "state": r.choice(US_STATES), "date_time": int(now * 1000), "extra": ""}, now)

    def auction(self) -> None:
        r, now = self.rng, time.time()
        people = self.recent["person"]
        seller = r.choice(people[-20:] if r.random() < 0.5 else people[-KEEP["person"]:])["id"]
        aid = self._new_id("auction")
        initial = r.randrange(1, 1_000)
        self._create("auction", {
            "id": aid, "item_name": f"item-{aid}", "description": f"{r.choice(LAST_NAMES).lower()} {aid}",
            "initial_bid": initial, "reserve": initial + r.randrange(1, 1_000), "date_time": int(now * 1000),
            "expires": int(now * 1000) + r.randrange(5_000, 30_000), "seller": seller,
            "category": 10 + r.randrange(5), "extra": ""}, now)

    def bid(self) -> None:
        r, now = self.rng, time.time()
        auctions = self.recent["auction"]
        auction = r.choice(auctions[-10:] if r.random() < 0.5 else auctions[-KEEP["auction"]:])["id"]
        bid_id = self._new_id("bid")
        self._create("bid", {
            "id": bid_id, "auction": auction, "bidder": r.choice(self.recent["person"][-KEEP["person"]:])["id"],
            "price": round(10 ** (r.random() * 6) * 100), "channel": r.choice(CHANNELS),
            "url": f"https://www.nexmark.com/item.htm?query=1&channel_id={r.randrange(1000)}",
            "date_time": int(now * 1000), "extra": ""}, now)

    def _pick(self, topic: str) -> tuple[int, dict[str, Any]]:
        rows = self.recent[topic]
        i = self.rng.randrange(max(0, len(rows) - KEEP[topic]), len(rows))
        return i, rows[i]

    def change(self) -> None:
        """An update or delete of a recent row: a bid raised (40%) or retracted (25%), an auction's reserve
        changed, a third of them with its category (15%), an auction withdrawn (5%), a person moving (15%)."""
        r, p = self.rng, self.rng.random()
        topic = "bid" if p < 0.65 else "auction" if p < 0.85 else "person"
        i, old = self._pick(topic)
        if (topic == "bid" and p >= 0.40) or (topic == "auction" and p >= 0.80):
            del self.recent[topic][i]
            self._send(topic, "d", old, None)
            return
        if topic == "bid":
            new = {**old, "price": old["price"] + r.randrange(1, 100)}
        elif topic == "auction":
            new = {**old, "reserve": old["reserve"] + r.randrange(1, 100)}
            if r.random() < 1 / 3:
                new["category"] = 10 + r.randrange(5)
        else:
            new = {**old, "state": r.choice(US_STATES), "city": r.choice(US_CITIES)}
        self.recent[topic][i] = new
        self._send(topic, "u", old, new)

    def seed(self, people: int, auctions: int) -> None:
        for _ in range(people):
            self.person()
        for _ in range(auctions):
            self.auction()

    def tick(self, n: int) -> None:
        """``n`` events: ~3% changes, the rest new people, auctions and bids at Nexmark's 1:3:46."""
        for _ in range(n):
            if self.rng.random() < 0.03 and len(self.recent["bid"]) > 20 and len(self.recent["auction"]) > 20:
                self.change()
                continue
            k = self.rng.randrange(50)
            if k < 1:
                self.person()
            elif k < 4:
                self.auction()
            else:
                self.bid()


class Done(NamedTuple):
    """One refresh a lane finished: when, the frontier it reached, and what it did."""

    t: float
    frontier: dict[str, int]
    action: str
    duration_s: float
    apply: str
    reason: str


@dataclass
class Live:
    """One stream table of the run: its form, and what its refresh lane reported."""

    query: Query
    table: str
    label: str
    sql: str
    sources: tuple[str, ...]
    done: list[Done] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def create(st: Any, q: Query, buckets: str, refused: list[dict[str, str]]) -> Live | None:
    """Create ``q`` as an IMMEDIATE stream table in its most faithful form the engine accepts; each refusal
    is kept (with the engine's message) for the report."""
    table = f"nexmark_{q.name}"
    for label, form in q.forms:
        sql = sql_of(form, buckets)
        try:
            st.create_stream_table(table, sql, refresh_mode="IMMEDIATE")
        except Exception as e:  # noqa: BLE001 - a refused form is a result to report, then the next is tried
            msg = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:600]}"
            refused.append({"query": q.name, "form": label, "sql": sql, "error": msg})
            print(f"{q.name} ({label}) refused: {msg}", flush=True)
            continue
        d = st.catalog.get(table)
        print(f"{q.name} ({label}) created: {table} over {', '.join(sorted(d.sources))}", flush=True)
        return Live(q, table, label, sql, tuple(sorted(d.sources)))
    return None


def _marker(lanes: Any, fed: dict[str, list[str]], mirror: str) -> Callable[[], None]:
    """The ``after_batch`` of one mirror's ingestion query: mark the tables its batches feed."""

    def mark() -> None:
        lanes.wait(lanes.mark(fed.get(mirror, ()), f"a batch of {mirror}"), RuntimeSpec().fused_wait_seconds)

    return mark


def run(spark: Any, st: Any, broker: Any, wh: str, rate: int, seconds: float, selected: list[Query],
        buckets: str = "start") -> dict[str, Any]:
    """One run: warm-up events, the mirrors, the stream tables, the timed producer, the drain, then the
    measurements. Everything lives in one Spark application, as the queries share it in production."""
    from kafka import KafkaProducer

    from connectors import kafka_mirror
    from connectors.debezium import SourceSchema
    from connectors.delta_log import DeltaLog
    from pipeline import fused
    from pipeline.fused_lanes import RefreshLanes

    for t in TOPICS:
        broker.create_topic(t, partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1, linger_ms=20)
    gen = Nexmark(producer, seed=rate)
    gen.seed(people=200, auctions=50)
    gen.tick(3_000)
    producer.flush()
    producer.close()

    lives: dict[str, Live] = {}
    lock = threading.Lock()

    def done(name: str, result: Any, why: str) -> None:
        with lock:
            lives[name].done.append(Done(time.time(), dict(result.frontier or {}), str(result.action),
                                         float(result.duration_ms or 0) / 1000, str(result.apply or ""),
                                         str(result.reason or "")))

    def failed(name: str, e: BaseException, why: str, failures: int, retry_in: float) -> None:
        msg = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        with lock:
            lives[name].failures.append(msg)
        print(f"refresh of {name} failed ({failures} in a row, retry in {retry_in:.1f} s): {msg}", flush=True)

    lanes = RefreshLanes(st.refresh_stream_table, done, failed, lambda n: min(10.0, 0.5 * 2 ** (n - 1)))
    fed: dict[str, list[str]] = {}
    srcs = [kafka_mirror.KafkaSource(t, t, broker.bootstrap, SourceSchema(COLUMNS[t], ("id",))) for t in TOPICS]
    ingest = [kafka_mirror.start(spark, s, f"{wh}/ckpt_{s.name}", trigger_seconds=0.5,
                                 after_batch=_marker(lanes, fed, s.name)) for s in srcs]
    for q in ingest:
        q.processAllAvailable()
    refused: list[dict[str, str]] = []
    t_create = time.time()
    for q in selected:
        live = create(st, q, buckets, refused)
        if live is not None:
            lives[live.table] = live
    create_s = time.time() - t_create
    if not lives:
        raise RuntimeError(f"the engine refused every selected query: {refused}")
    defs = st.catalog.all()
    fed.update({t: fused.fed_by(defs, t) for t in TOPICS})
    for name in lives:
        lanes.open(name)
    mirror_logs = {t: DeltaLog(spark, _location(spark, t)) for t in TOPICS}
    first_id = dict(gen.next_id)
    time.sleep(3)  # let the lanes' first refreshes settle

    produced = _produce_in_child({"servers": broker.bootstrap, "seed": rate + 1, "rate": rate, "seconds": seconds,
                                  "state": gen.state()})
    drain_start = time.time()
    sent, produce_s = produced["sent"], produced["produce_s"]
    sent_at = {t: {int(k): float(v) for k, v in produced["sent_at"][t].items()} for t in TOPICS}

    # every event is in Kafka (the producer flushed): once each ingestion query has processed what its topic
    # holds, the mirrors' latest versions are what every table must cover to be caught up
    for q in ingest:
        q.processAllAvailable()
    target = {t: int(log.latest_version() or 0) for t, log in mirror_logs.items()}

    def covered(live: Live) -> bool:
        if any(t not in target for t in live.sources):
            return False
        with lock:
            best = {t: max((d.frontier.get(t, -1) for d in live.done), default=-1) for t in live.sources}
        return all(best[t] >= target[t] for t in live.sources)

    while not all(covered(lv) for lv in lives.values()) and time.time() - drain_start < 60:
        time.sleep(0.2)
    for q in ingest:
        if q.exception() is not None:
            raise RuntimeError(f"ingestion query {q.name} failed: {q.exception()}")
    lanes.stop()
    for q in ingest:
        q.stop()

    # which mirror version applied each create, and when each mirror version committed
    applied = {t: {int(r["id"]): int(r["v"]) for r in spark.sql(
        f"SELECT id, min(_commit_version) AS v FROM table_changes('{t}', 1) "
        f"WHERE _change_type = 'insert' AND id >= {first_id[t]} GROUP BY id").collect()} for t in TOPICS}
    mirror_t = {t: {v: log.commit_info(v).get("timestamp", 0) / 1000.0 for v in log.versions()}
                for t, log in mirror_logs.items()}
    results = []
    for live in lives.values():
        results.append(_measure(spark, st, live, sent_at, applied, mirror_t, target, drain_start))
    return {"rate": rate, "seconds": seconds, "buckets": buckets, "events_sent": sent, "produce_s": round(produce_s, 2),
            "throughput_events_per_s": sent / produce_s, "creates_sent": {t: len(sent_at[t]) for t in TOPICS},
            "create_s": round(create_s, 1), "queries": results, "refused": refused}


def _location(spark: Any, table: str) -> str:
    """A mirror's directory, for reading its Delta log without Spark jobs."""
    loc = str(spark.sql(f"DESCRIBE DETAIL {table}").first()["location"])
    return loc[len("file:"):] if loc.startswith("file:") else loc


def _measure(spark: Any, st: Any, live: Live, sent_at: dict[str, dict[int, float]],
             applied: dict[str, dict[int, int]], mirror_t: dict[str, dict[int, float]], target: dict[str, int],
             drain_start: float) -> dict[str, Any]:
    """One query's freshness, refresh counts, catch-up and result check (see the module docstring)."""
    from connectors.delta_log import DeltaLog

    log = DeltaLog(spark, st.catalog.get(live.table).path)
    points: list[tuple[float, dict[str, int]]] = [(d.t, d.frontier) for d in live.done]
    commits = 0
    for v in log.versions():
        meta = log.trickle_metadata(v)
        if meta and meta.get("frontier"):
            points.append((log.commit_info(v).get("timestamp", 0) / 1000.0, {k: int(x) for k, x in
                                                                             meta["frontier"].items()}))
            commits += 1
    points.sort(key=lambda p: p[0])
    times = [t for t, _ in points]
    # per topic: the highest frontier reached by each point in time, non-decreasing, for a binary search
    reach: dict[str, list[int]] = {}
    for topic in live.query.measured:
        hi, acc = -1, []
        for _, f in points:
            hi = max(hi, f.get(topic, -1))
            acc.append(hi)
        reach[topic] = acc

    events = sorted((s, topic, i) for topic in live.query.measured for i, s in sent_at[topic].items())
    lags, to_mirror, to_st = [], [], []
    unmeasured = 0
    for s, topic, i in events:
        mv = applied[topic].get(i)
        if mv is None:
            continue  # deleted again before it reached the mirror (netted in one micro-batch)
        k = bisect.bisect_left(reach[topic], mv)
        if k == len(points):
            unmeasured += 1
            continue
        lags.append(times[k] - s)
        to_mirror.append(mirror_t[topic][mv] - s)
        to_st.append(times[k] - mirror_t[topic][mv])

    # caught up: the first lane refresh (or commit) whose frontier covers every source's target
    caught_at = None
    if all(t in target for t in live.sources):
        caught_at = next((t for t, f in points if all(f.get(src, -1) >= target[src] for src in live.sources)),
                         None)
    drain_s = None if caught_at is None else max(0.0, caught_at - drain_start)
    caught_up = drain_s is not None and drain_s <= 60

    final = st.refresh_stream_table(live.table)  # ingestion has stopped: bring it to the mirrors' last versions
    same, n_rows = _equals_query(spark, st, live)
    third = max(1, len(lags) // 3)
    early = statistics.median(lags[:third]) if lags else float("nan")
    late = statistics.median(lags[-third:]) if lags else float("nan")
    work = [d for d in live.done if d.action != "NO_DATA"]
    slowest = max(work, key=lambda d: d.duration_s, default=None)
    applies = Counter(_apply_kind(d.apply) for d in work)
    return {
        "query": live.query.name, "title": live.query.title, "table": live.table, "form": live.label,
        "sql": live.sql, "measured_topics": list(live.query.measured), "events_measured": len(lags),
        "events_unmeasured": unmeasured,
        "p50_s": statistics.median(lags) if lags else None, "p99_s": percentile(lags, 99) if lags else None,
        "max_s": max(lags) if lags else None,
        "kafka_to_mirror_p50_s": statistics.median(to_mirror) if to_mirror else None,
        "mirror_to_st_p50_s": statistics.median(to_st) if to_st else None,
        "first_third_p50_s": early if lags else None, "last_third_p50_s": late if lags else None,
        "drain_s": drain_s, "caught_up": caught_up,
        "sustained": bool(lags) and caught_up and late <= 1.5 * early + 1.0,
        "refreshes": len(work), "lane_refreshes": len(live.done), "st_commits": commits,
        "refresh_p50_s": statistics.median(d.duration_s for d in work) if work else None,
        "refresh_max_s": slowest.duration_s if slowest else None,
        "slowest_refresh": {"action": slowest.action, "apply": slowest.apply, "reason": slowest.reason}
        if slowest else None,
        "applies": dict(applies),
        "refresh_failures": len(live.failures), "failure_messages": sorted(set(live.failures))[:5],
        "final_refresh": final.action, "rows": n_rows, "equals_query": same,
    }


def _apply_kind(apply: str) -> str:
    """``MERGE (delta-rs) / duckdb``: how a refresh committed and which engine computed its delta, without
    the reasons (those stay in ``slowest_refresh``)."""
    commit = apply.split(":")[0].strip() or "-"
    engine = apply.split("delta computed by ", 1)[1].split(":")[0].strip() if "delta computed by " in apply else "-"
    return f"{commit} / {engine}"


def _norm(v: Any) -> tuple[Any, ...]:
    """A sort key for a value: NULLs first, floats at 9 significant digits (so near-equal doubles meet)."""
    if v is None:
        return (0,)
    if isinstance(v, float):
        return (1, float(f"{v:.9g}"))
    return (1, v)


def _close(a: Any, b: Any) -> bool:
    """Equal values: doubles within 1e-9 relative (a differential AVG adds its terms in another order than a
    recomputation does), decimals and the rest exactly."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)), abs(float(b)))
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b
    return bool(a == b)


def _equals_query(spark: Any, st: Any, live: Live) -> tuple[bool, int]:
    """The stream table against its query recomputed now, as multisets (floats within a tolerance)."""
    want = sorted((tuple(r) for r in spark.sql(live.sql).collect()), key=lambda r: tuple(map(_norm, r)))
    got = sorted((tuple(r) for r in st.read(live.table).collect()), key=lambda r: tuple(map(_norm, r)))
    same = len(want) == len(got) and all(
        len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
        for a, b in zip(want, got, strict=True))
    if not same:
        print(f"{live.query.name}: stream table ({len(got)} rows) differs from its query ({len(want)} rows)",
              flush=True)
    return same, len(got)


def produce(job: dict[str, Any]) -> dict[str, Any]:
    """The timed phase's events, ``rate`` per second for ``seconds``, continuing the driver's generator (its
    ids, LSN and recent rows); returns when each create was sent."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=job["servers"], acks=1, linger_ms=20)
    gen = Nexmark(producer, seed=job["seed"])
    gen.load(job["state"])
    t0 = time.time()
    sent = paced(gen.tick, job["rate"], job["seconds"])
    producer.flush()
    produce_s = time.time() - t0
    producer.close()
    return {"sent": sent, "produce_s": produce_s, "last_id": {t: gen.next_id[t] - 1 for t in TOPICS},
            "sent_at": gen.sent_at}


def _produce_in_child(job: dict[str, Any]) -> dict[str, Any]:
    """Run :func:`produce` in a child process; the job goes through stdin (the generator's state is larger
    than one command-line argument may be)."""
    done = subprocess.run([sys.executable, __file__, "--produce"], input=json.dumps(job), capture_output=True,
                          text=True, check=False, timeout=job["seconds"] + 300)
    if done.returncode != 0:
        raise RuntimeError(f"the producer process failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _fmt(v: Any, spec: str = ".2f") -> str:
    """A figure for the table; ``-`` where a query had nothing to measure."""
    return "-" if v is None else format(v, spec)


def report(out: dict[str, Any]) -> None:
    """The run as a markdown table (for docs/BENCHMARKS.md), then how each query's refreshes were computed
    (which engine, why the slowest took long) and the forms the engine refused."""
    print(f"\n{out['rate']:,} events/s target for {out['seconds']:g} s: {out['events_sent']:,} sent in "
          f"{out['produce_s']:.1f} s ({out['throughput_events_per_s']:,.0f}/s); creates "
          + ", ".join(f"{t} {n:,}" for t, n in out["creates_sent"].items())
          + f"; {len(out['queries'])} stream tables created (initial FULL) in {out['create_s']:.0f} s\n")
    print("| query | form | sustained | p50 s | p99 s | first third p50 | last third p50 | Kafka->mirror p50 | "
          "mirror->ST p50 | refreshes | refresh p50 s | ST commits | drain s | failures | equals query |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in out["queries"]:
        print(f"| {r['query']} {r['title']} | {r['form']} | {r['sustained']} | {_fmt(r['p50_s'])} | "
              f"{_fmt(r['p99_s'])} | {_fmt(r['first_third_p50_s'])} | {_fmt(r['last_third_p50_s'])} | "
              f"{_fmt(r['kafka_to_mirror_p50_s'])} | {_fmt(r['mirror_to_st_p50_s'])} | {r['refreshes']} | "
              f"{_fmt(r['refresh_p50_s'])} | "
              f"{r['st_commits']} | {_fmt(r['drain_s'], '.1f')} | {r['refresh_failures']} | "
              f"{r['equals_query']} |", flush=True)
    for r in out["queries"]:
        if r["slowest_refresh"]:
            w = r["slowest_refresh"]
            print(f"\n{r['query']}: refreshes {r['applies']}; slowest {r['refresh_max_s']:.1f} s: {w['action']}, "
                  f"{w['apply'][:300]}", flush=True)
    for r in out["refused"]:
        print(f"\nrefused: {r['query']} ({r['form']}): {r['error']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Start a broker and a Spark session in a scratch directory (removed afterwards), run once, report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=2000, help="change events per second, all topics together")
    p.add_argument("--seconds", type=float, default=30.0, help="producer run time")
    p.add_argument("--queries", default=",".join(q.name for q in QUERIES),
                   help=f"which of {', '.join(q.name for q in QUERIES)} to run (all at once)")
    p.add_argument("--buckets", choices=sorted(BUCKETS), default="start",
                   help="how q5, q7 and q8 write the 10 s bucket: date_time - date_time %% 10000 (start, default) or "
                        "date_time DIV 10000 (div; its deltas are computed by Spark, not DuckDB)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings")
    p.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)  # the producer child; job on stdin
    args = p.parse_args(argv)
    if args.produce:
        print(json.dumps(produce(json.loads(sys.stdin.read()))), flush=True)
        return 0
    names = [n.strip().lower() for n in args.queries.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        p.error(f"unknown queries {unknown}; choose among {', '.join(BY_NAME)}")
    from pipeline import StreamTables, spark_session
    from services.kafka import KafkaBroker

    wh = tempfile.mkdtemp(prefix="trickle-bench-nexmark-")
    broker = KafkaBroker(Path(wh) / "kafka").start()
    spark = spark_session(app_name="trickle-bench-nexmark", warehouse=wh,
                          conf=dict(kv.split("=", 1) for kv in args.conf))
    out: dict[str, Any] = {}
    try:
        st = StreamTables(spark, root=f"{wh}/_trickle")
        out = run(spark, st, broker, wh, args.rate, args.seconds, [BY_NAME[n] for n in names], args.buckets)
        report(out)
    finally:
        if out:
            d = Path(__file__).resolve().parent / "out"
            d.mkdir(exist_ok=True)
            path = d / f"nexmark-{int(time.time())}.json"
            path.write_text(json.dumps(out, indent=1, default=str))
            print(f"\nwritten: {path}", flush=True)
        for q in spark.streams.active:
            q.stop()
        spark.stop()
        broker.stop()
        shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
