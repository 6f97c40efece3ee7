"""End-to-end freshness and throughput through Kafka: Debezium event produced -> visible in a stream table.

    ./dev bench kafka                           # rates 1000,5000 events/s, 30 s each, each path
    ./dev bench kafka --rates 1000 --seconds 20 --paths fused

A real Kafka broker (services/kafka.py, KRaft) carries Debezium change events for two tables, ``customers``
(a small dimension, updated now and then: join-key changes) and ``orders`` (inserts at the target rate,
plus updates and deletes of recent orders). The job's pieces run in one Spark application as ``trickle
run`` runs them: one ingestion query per topic (Debezium -> Delta mirror, :mod:`connectors.kafka_mirror`)
and one IMMEDIATE stream table, a join + aggregate, kept fresh by one of three paths, side by side in one run:

* ``fused`` (what ``trickle run`` does): each ingestion micro-batch commits its events to the mirror (small
  batches decoded on the driver and committed by delta-rs), marks the stream table for its refresh lane and
  waits for that refresh up to ``runtime.fused_wait_seconds`` (:mod:`pipeline.fused`,
  :mod:`pipeline.fused_lanes`);
* ``inline``: the first fused path, kept for comparison: the refresh runs inside the same ``foreachBatch``,
  after the mirror commit, however long it takes;
* ``beside``: the lanes without waiting: the batch marks the table and returns, the refresh runs beside the
  next batch (measured slower on 2 cores: kept to show why the batch waits);
* ``polled``: the same mirror commits, and the stream table's own streaming query over the mirrors' change
  feeds refreshes it (the IMMEDIATE query of a table over Delta sources);
* ``before``: ``polled`` with every mirror batch committed by Spark's MERGE (``trickle.ingest.driverBelowRows=0``),
  the pipeline as it ran before the fused path.

The table::

    SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total
    FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.region

Freshness of an order insert = commit time of the first stream table commit whose frontier covers the
mirror version that applied it - the time the producer sent it. Read afterwards from the mirror's Change
Data Feed (which version applied each order id) and the Delta logs (commit times, frontiers); split into
"Kafka -> mirror" and "mirror -> stream table". A rate is *sustained* when freshness does not grow over the
run (last third's median <= 1.5 x first third's + 1 s) and the stream table catches up within 60 s after
the producer stops. Nothing here asserts a time; the result must equal the query (checked, reported).

The timed producer runs in a child process (``--produce``), as a real producer runs outside the pipeline:
at 5k events/s, encoding and sending the events inside the driver took a share of its two cores and of its
GIL that the pipeline does not pay in production.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.streaming import percentile  # noqa: E402
from pipeline.conf import RuntimeSpec  # noqa: E402
from pipeline.fused_lanes import RefreshLanes  # noqa: E402

QUERY = ("SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total FROM {orders} o "
         "JOIN {customers} c ON o.customer_id = c.id GROUP BY c.region")
CUSTOMERS = 200


class Feed:
    """Debezium envelopes (JsonConverter without the schema wrapper) for the two tables, with LSNs."""

    def __init__(self, producer: Any, orders_topic: str, customers_topic: str, seed: int = 1) -> None:
        self.p, self.orders_topic, self.customers_topic = producer, orders_topic, customers_topic
        self.rng = random.Random(seed)
        self.lsn = 1_000
        self.next_id = 1
        self.open: list[int] = []
        self.sent_at: dict[int, float] = {}  # order id -> when its create was handed to the producer

    def _send(self, topic: str, key: int, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None
              ) -> None:
        self.lsn += 8
        now_ms = int(time.time() * 1000)
        env = {"before": before, "after": after, "op": op, "ts_ms": now_ms,
               "source": {"lsn": self.lsn, "ts_ms": now_ms, "connector": "postgresql", "table": topic}}
        self.p.send(topic, key=json.dumps({"id": key}).encode(), value=json.dumps(env).encode())

    def customer(self, cid: int) -> None:
        row = {"id": cid, "name": f"c{cid}", "region": f"r{self.rng.randrange(8)}"}
        self._send(self.customers_topic, cid, "c", None, row)

    def order_row(self, oid: int) -> dict[str, Any]:
        return {"id": oid, "customer_id": self.rng.randrange(1, CUSTOMERS + 1),
                "amount": round(self.rng.uniform(1, 500), 2)}

    def tick(self, n: int) -> None:
        """``n`` events: ~80% order inserts, ~10% updates, ~5% deletes of recent orders, ~5% customer
        region changes (a join-key change on the dimension side)."""
        for _ in range(n):
            p = self.rng.random()
            if p < 0.80 or len(self.open) < 10:
                oid = self.next_id
                self.next_id += 1
                self.sent_at[oid] = time.time()
                self._send(self.orders_topic, oid, "c", None, self.order_row(oid))
                self.open.append(oid)
            elif p < 0.90:
                oid = self.rng.choice(self.open[-500:])
                self._send(self.orders_topic, oid, "u", None, self.order_row(oid))
            elif p < 0.95:
                oid = self.open.pop(self.rng.randrange(max(0, len(self.open) - 500), len(self.open)))
                self._send(self.orders_topic, oid, "d", {"id": oid}, None)
            else:
                self.customer(self.rng.randrange(1, CUSTOMERS + 1))


PATHS = ("fused", "inline", "beside", "polled", "before")
_RUNS = itertools.count(1)


def run_rate(spark: Any, st: Any, broker: Any, wh: str, rate: int, seconds: float, path: str) -> dict[str, Any]:
    if path != "before":
        return _run_rate(spark, st, broker, wh, rate, seconds, path)
    from connectors.kafka_mirror import DRIVER_BELOW_ROWS

    spark.conf.set(DRIVER_BELOW_ROWS, "0")
    try:
        return _run_rate(spark, st, broker, wh, rate, seconds, path)
    finally:
        spark.conf.unset(DRIVER_BELOW_ROWS)


def _run_rate(spark: Any, st: Any, broker: Any, wh: str, rate: int, seconds: float, path: str) -> dict[str, Any]:
    from kafka import KafkaProducer

    from connectors import kafka_mirror
    from connectors.debezium import SourceSchema
    from connectors.delta_log import DeltaLog

    run = next(_RUNS)  # a path may be given twice (interleaved repeats): each run gets its own topics and tables
    orders, customers, name = (f"k_{what}_{path}_{rate}_{run}" for what in ("orders", "customers", "by_region"))
    for t in (orders, customers):
        broker.create_topic(f"shop.public.{t}", partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1, linger_ms=20)
    feed = Feed(producer, f"shop.public.{orders}", f"shop.public.{customers}", seed=rate)
    for cid in range(1, CUSTOMERS + 1):
        feed.customer(cid)
    feed.tick(2_000)
    producer.flush()
    srcs = [kafka_mirror.KafkaSource(orders, f"shop.public.{orders}", broker.bootstrap,
                                     SourceSchema((("id", "BIGINT"), ("customer_id", "INT"), ("amount", "DOUBLE")),
                                                  ("id",))),
            kafka_mirror.KafkaSource(customers, f"shop.public.{customers}", broker.bootstrap,
                                     SourceSchema((("id", "INT"), ("name", "STRING"), ("region", "STRING")),
                                                  ("id",)))]
    fed: list[str] = []  # the inline path's stream table, once created
    lanes = RefreshLanes(st.refresh_stream_table, lambda *_: None,
                         lambda n, e, *_: print(f"refresh of {n} failed: {e}", flush=True), lambda n: 0.5)

    def after_batch() -> None:
        if path == "beside":
            lanes.mark([name], "a batch")
        if path == "fused":
            lanes.wait(lanes.mark([name], "a batch"), RuntimeSpec().fused_wait_seconds)
        for t in fed:
            st.refresh_stream_table(t)

    queries = [kafka_mirror.start(spark, s, f"{wh}/ckpt_{s.name}", trigger_seconds=0.5,
                                  after_batch=after_batch if path in ("fused", "inline", "beside") else None) for s in srcs]
    for q in queries:
        q.processAllAvailable()
    st.create_stream_table(name, QUERY.format(orders=orders, customers=customers), refresh_mode="IMMEDIATE")
    imm = None
    if path in ("fused", "beside"):
        lanes.open(name)
    elif path == "inline":
        fed.append(name)
    else:
        imm = st.start(name)
    d = st.catalog.get(name)
    mirror_path = d.sources[orders].path
    mirror_log, st_log = DeltaLog(spark, mirror_path), DeltaLog(spark, d.path)
    first_id = feed.next_id
    time.sleep(3)  # let the first IMMEDIATE micro-batch settle
    produced = _produce_in_child({"servers": broker.bootstrap, "orders": feed.orders_topic,
                                  "customers": feed.customers_topic, "seed": rate + 1, "rate": rate,
                                  "seconds": seconds, "next_id": feed.next_id, "lsn": feed.lsn, "open": feed.open})
    sent, produce_s, last_id = produced["sent"], produced["produce_s"], produced["last_id"]
    feed.sent_at.update({int(k): v for k, v in produced["sent_at"].items()})

    last_open = int(produced["last_open"])

    def mirror_has_all() -> int | None:
        """The mirror's latest version once it holds the last order sent that was not deleted again. Read
        from the Delta log and one file by delta-rs: a Spark job here (this harness once read the mirror's
        whole change feed every 0.5 s) competed with the pipeline it measures and made up the tail of the
        last second's events (4 s of Kafka -> mirror)."""
        import pyarrow as pa

        from connectors import delta_rs

        v = mirror_log.latest_version()
        if v is None:
            return None
        rows = delta_rs.rows_with(mirror_path, v, ["id"], "id", pa.array([last_open], pa.int64()))
        return v if rows is not None and rows.num_rows else None

    drain_start = time.time()
    target = None
    while time.time() - drain_start < 60:
        target = mirror_has_all()
        if target is not None:
            break
        time.sleep(0.5)

    def covered() -> int:
        meta = st_log.last_trickle_commit()
        return int((meta[1].get("frontier") or {}).get(orders, -1)) if meta else -1

    while target is not None and covered() < target and time.time() - drain_start < 60:
        time.sleep(0.2)
    drain = time.time() - drain_start
    caught_up = target is not None and covered() >= target
    for q in (imm, *queries):
        if q is not None and q.exception() is not None:
            raise RuntimeError(f"streaming query {q.name} failed: {q.exception()}")
    if not caught_up:
        print(f"not caught up: mirror target {target}, covered {covered()}, IMMEDIATE progress "
              f"{imm.lastProgress if imm is not None else '(fused)'}", flush=True)
    for q in queries:
        q.processAllAvailable()
    time.sleep(2)
    fed.clear()
    lanes.stop()
    st.stop(name)
    for q in queries:
        q.stop()
    producer.close()

    # which mirror version applied each order insert, and when each version committed
    applied = {int(r["id"]): int(r["v"]) for r in spark.sql(
        f"SELECT id, min(_commit_version) AS v FROM table_changes('{orders}', 1) "
        f"WHERE _change_type = 'insert' AND id >= {first_id} GROUP BY id").collect()}
    mirror_t = {v: mirror_log.commit_info(v).get("timestamp", 0) / 1000.0 for v in mirror_log.versions()}
    st_commits: list[tuple[int, float]] = []
    for v in st_log.versions():
        meta = st_log.trickle_metadata(v)
        if meta and meta.get("frontier") and orders in meta["frontier"]:
            st_commits.append((int(meta["frontier"][orders]), st_log.commit_info(v).get("timestamp", 0) / 1000.0))
    lags, to_mirror, to_st, sent_times = [], [], [], []
    for oid in range(first_id, last_id + 1):
        if oid not in applied or oid not in feed.sent_at:
            continue  # deleted again before it reached the mirror (netted in one micro-batch)
        mv = applied[oid]
        seen = [t for f, t in st_commits if f >= mv]
        if not seen:
            continue
        lags.append(min(seen) - feed.sent_at[oid])
        to_mirror.append(mirror_t[mv] - feed.sent_at[oid])
        to_st.append(min(seen) - mirror_t[mv])
        sent_times.append(feed.sent_at[oid])
    if not lags:
        raise RuntimeError(f"no stream table commit covered an order sent at {rate}/s (covered {covered()})")
    third = max(1, len(lags) // 3)
    early, late = statistics.median(lags[:third]), statistics.median(lags[-third:])
    want = sorted(tuple(r) for r in spark.sql(QUERY.format(orders=orders, customers=customers)).collect())
    got = sorted(tuple(r) for r in st.read(name).collect())
    same = len(want) == len(got) and all(
        a[0] == b[0] and a[1] == b[1] and abs((a[2] or 0) - (b[2] or 0)) < 1e-6 * max(1, abs(a[2] or 0))
        for a, b in zip(want, got, strict=True))
    refreshes = sum(1 for f, _ in st_commits if f > 0)
    hist = [h for h in st.history(name, limit=2000) if h.get("action") not in (None, "NO_DATA")]
    took = sorted(float(h.get("duration_ms") or 0) / 1000 for h in hist)
    slowest = sorted(hist, key=lambda h: -float(h.get("duration_ms") or 0))[:3]
    return {
        "path": path, "rate": rate, "seconds": seconds, "events_sent": sent, "produce_s": round(produce_s, 1),
        "orders_measured": len(lags), "p50_s": statistics.median(lags), "p99_s": percentile(lags, 99),
        "max_s": max(lags), "kafka_to_mirror_p50_s": statistics.median(to_mirror),
        "mirror_to_st_p50_s": statistics.median(to_st), "first_third_p50_s": early, "last_third_p50_s": late,
        "drain_s": drain, "st_refreshes": refreshes, "throughput_events_per_s": sent / produce_s,
        "sustained": caught_up and late <= 1.5 * early + 1.0, "result_equals_query": same,
        # where a refresh's time goes: its own duration, and the slowest few as the history recorded them
        "refresh_p50_s": statistics.median(took) if took else None, "refresh_max_s": max(took, default=None),
        "slowest_refreshes": [{k: h.get(k) for k in ("action", "reason", "duration_ms", "apply", "delta_engine",
                                                      "rows_inserted", "rows_deleted", "started_at")}
                              for h in slowest],
        # the tail: the slowest 1% of events, when they were sent (s after the first) and where they waited
        "tail": [{"sent_s": round(sent_times[i] - sent_times[0], 2), "lag_s": round(lags[i], 2),
                  "kafka_to_mirror_s": round(to_mirror[i], 2), "mirror_to_st_s": round(to_st[i], 2)}
                 for i in sorted(range(len(lags)), key=lags.__getitem__)[-max(1, len(lags) // 100):]],
    }


def paced(tick: Any, rate: int, seconds: float) -> int:
    """Call ``tick(n)`` 20 times a second with ``rate / 20`` events each, for ``seconds``, catching up when a
    send falls behind; returns the events sent."""
    batch = max(1, rate // 20)
    t0 = due = time.time()
    sent = 0
    while time.time() < t0 + seconds:
        tick(batch)
        sent += batch
        due += batch / rate
        time.sleep(max(0.0, due - time.time()))
    return sent


def produce(job: dict[str, Any]) -> dict[str, Any]:
    """The timed phase's events, at ``rate`` per second for ``seconds``, continuing the driver's feed (its
    next order id, LSN and open orders); returns when each order was sent."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=job["servers"], acks=1, linger_ms=20)
    feed = Feed(producer, job["orders"], job["customers"], seed=job["seed"])
    feed.next_id, feed.lsn, feed.open = job["next_id"], job["lsn"], list(job["open"])
    t0 = time.time()
    sent = paced(feed.tick, job["rate"], job["seconds"])
    producer.flush()
    produce_s = time.time() - t0
    producer.close()
    return {"sent": sent, "produce_s": produce_s, "last_id": feed.next_id - 1, "sent_at": feed.sent_at,
            "last_open": max(feed.open, default=0)}


def _produce_in_child(job: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--produce", json.dumps(job)], capture_output=True, text=True,
                          check=False, timeout=job["seconds"] + 300)
    if done.returncode != 0:
        raise RuntimeError(f"the producer process failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _row(f: dict[str, Any]) -> None:
    print(f"| {f['path']} | {f['rate']:,} | {f['events_sent']:,} | {f['p50_s']:.2f} | {f['p99_s']:.2f} | "
          f"{f['max_s']:.2f} | {f['kafka_to_mirror_p50_s']:.2f} | {f['mirror_to_st_p50_s']:.2f} | "
          f"{f['first_third_p50_s']:.2f} | {f['last_third_p50_s']:.2f} | {f['st_refreshes']} | "
          f"{f['drain_s']:.1f} | {f['sustained']} | {f['result_equals_query']} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1000,5000", help="change events per second to try")
    p.add_argument("--paths", default=",".join(PATHS), help=f"which of {', '.join(PATHS)} to run, in this order")
    p.add_argument("--seconds", type=float, default=30.0, help="producer run time per rate")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings")
    p.add_argument("--produce", metavar="JSON", help=argparse.SUPPRESS)  # the child process of one rate
    args = p.parse_args(argv)
    if args.produce:
        print(json.dumps(produce(json.loads(args.produce))), flush=True)
        return 0
    from pipeline import StreamTables, spark_session
    from services.kafka import KafkaBroker

    wh = tempfile.mkdtemp(prefix="trickle-bench-kafka-")
    broker = KafkaBroker(Path(wh) / "kafka").start()
    spark = spark_session(app_name="trickle-bench-kafka", warehouse=wh,
                          conf=dict(kv.split("=", 1) for kv in args.conf))
    out: list[dict[str, Any]] = []
    try:
        st = StreamTables(spark, root=f"{wh}/_trickle")
        print("| path | events/s | sent | p50 s | p99 s | max s | Kafka->mirror p50 | mirror->ST p50 | first third p50 | "
              "last third p50 | ST refreshes | drain s | sustained | equals query |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for rate in (int(r) for r in args.rates.split(",")):
            for path in args.paths.split(","):
                f = run_rate(spark, st, broker, wh, rate, args.seconds, path)
                out.append(f)
                _row(f)
    finally:
        d = Path(__file__).resolve().parent / "out"
        d.mkdir(exist_ok=True)
        (d / f"kafka-freshness-{int(time.time())}.json").write_text(json.dumps(out, indent=1))
        for q in spark.streams.active:
            q.stop()
        spark.stop()
        broker.stop()
        shutil.rmtree(wh, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
