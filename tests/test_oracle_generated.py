"""Property-based oracle test: random queries over a fixed schema, maintained DIFFERENTIAL, compared with
full recomputation after every random change cycle.

Why: the hand-written oracle tests check the combinations someone thought of; a generator composes the
supported constructs in ways nobody wrote down (a NOT IN under a FULL join feeding a HAVING, a DISTINCT over
NULL-padded rows ...). The generator is our own, small and seeded, so a run is reproducible without a new
dependency: the same ``TRICKLE_GEN_SEED`` gives the same queries, the same ``TRICKLE_ORACLE_SEED`` the same
changes.

What it composes, over ``gl`` (keyed), ``gr`` (keyed, small key range, so deleted keys come back) and ``gk``
(keyless, exact duplicates), every column nullable: FROM one table or an inner / LEFT / FULL join (equi, at
times with an extra non-equi condition); WHERE trees of AND / OR / NOT over comparisons, IS [NOT] NULL,
IN lists, BETWEEN, string predicates, and [NOT] EXISTS / [NOT] IN subqueries (correlated or not); then a
projection (arithmetic, CASE, coalesce, at times a peer-based window function or an aggregate scalar
subquery, at times over a LATERAL VIEW explode), DISTINCT, a GROUP BY (or global aggregate) with several of
COUNT(*) / COUNT / SUM / AVG / MIN / MAX / COUNT(DISTINCT) / bool_or / stddev_pop and at times HAVING and an
ORDER BY ... LIMIT over every output column, a subquery in FROM, or a UNION [ALL] / INTERSECT [ALL] /
EXCEPT [ALL] of two projections. Query ``i`` takes its top form from a fixed rotation
(projection, aggregate, DISTINCT, UNION ALL), so a run of four covers every form.

Environment:

* ``TRICKLE_GEN_SEED`` (int or ``random``, default :data:`DEFAULT_GEN_SEED`) and ``TRICKLE_ORACLE_SEED`` replay a failure (the
  failure message prints both and the queries);
* ``TRICKLE_GEN_QUERIES`` (default 4: about as long as one hand-written oracle test) and
  ``TRICKLE_ORACLE_CYCLES`` (default 20) bound the run;
* ``TRICKLE_GEN_ONLY=q2,q5`` keeps only those queries (to replay one).
"""

from __future__ import annotations

import os
import random
from typing import Any

from oracle import Col, TableSpec, oracle_seed, run_oracle

from dvm.builder import compile_tree

CYCLES = int(os.environ.get("TRICKLE_ORACLE_CYCLES", "20"))
N_QUERIES = int(os.environ.get("TRICKLE_GEN_QUERIES", "4"))
#: CI's queries: a seed (searched among 1..20000) whose four queries use every construct of CI_NEEDLES (a FULL
#: JOIN, NOT IN / NOT EXISTS, a nested aggregate with HAVING and COUNT(DISTINCT) under a TopK, DISTINCT, a
#: window, UNION ALL, ...); set operations, generators and scalar subqueries come with other seeds
#: (``TRICKLE_GEN_SEED=random``) and in the pure test's 60 seeds
DEFAULT_GEN_SEED = 4079

GL = TableSpec(
    "gl",
    (Col("g", "jkey", domain=(1, 4)), Col("a", "int", domain=(0, 9)), Col("b", "double", domain=(-20, 80)),
     Col("s", "string")),
    key="id",
    rows=20,
    max_changes=4,
)
GR = TableSpec(
    "gr",
    (Col("g", "jkey", domain=(1, 5)), Col("c", "int", domain=(0, 9)), Col("t", "string")),
    key="id",
    key_range=(1, 9),
    rows=7,
    max_changes=3,
)
GK = TableSpec(
    "gk",
    (Col("g", "jkey", domain=(1, 4)), Col("a", "int", domain=(0, 5)), Col("s", "string")),
    key=None,
    rows=14,
    dup_fraction=0.3,
    max_changes=3,
)
SOURCES = [GL, GR, GK]
#: column -> kind, per table: "n" numeric (int), "f" double, "s" string
KINDS = {
    "gl": {"id": "n", "g": "n", "a": "n", "b": "f", "s": "s"},
    "gr": {"id": "n", "g": "n", "c": "n", "t": "s"},
    "gk": {"g": "n", "a": "n", "s": "s"},
}
STRINGS = ("'alpha'", "'beta'", "'gamma'", "''")
#: a FROM clause's columns: [(alias, {column: kind})]
Scope = list[tuple[str, dict[str, str]]]
#: the top form of query i is FORMS[i % len(FORMS)]
FORMS = ("project", "aggregate", "distinct", "union_all")


class QueryGen:
    """Random SQL over :data:`SOURCES` (``{gl}``-style placeholders), from one ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.aliases = 0

    # --- helpers ---

    def pick(self, *options: Any) -> Any:
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def alias(self) -> str:
        self.aliases += 1
        return f"t{self.aliases}"

    @staticmethod
    def cols(scope: Scope, kinds: str) -> list[str]:
        return [f"{a}.{c}" for a, cols in scope for c, k in cols.items() if k in kinds]

    # --- FROM ---

    def from_clause(self) -> tuple[str, Scope]:
        """A FROM clause and its scope."""
        left = self.pick("gl", "gl", "gk")
        la = self.alias()
        if self.chance(0.35):
            return f"{{{left}}} {la}", [(la, KINDS[left])]
        right = self.pick("gr", "gr", "gk") if left == "gl" else "gr"
        ra = self.alias()
        kind = self.pick("JOIN", "LEFT JOIN", "FULL JOIN")
        on = f"{la}.g = {ra}.g"
        if self.chance(0.3):
            rn = self.pick(*self.cols([(ra, KINDS[right])], "n"))
            ln = self.pick(*self.cols([(la, KINDS[left])], "n"))
            on += f" AND {ln} {self.pick('<', '<=', '>', '<>')} {rn} + {self.rng.randint(0, 3)}"
        return f"{{{left}}} {la} {kind} {{{right}}} {ra} ON {on}", [(la, KINDS[left]), (ra, KINDS[right])]

    # --- expressions ---

    def num(self, scope: Scope) -> str:
        c = self.pick(*self.cols(scope, "nf"))
        r = self.rng.random()
        if r < 0.35:
            return c
        if r < 0.5:
            return f"{c} + {self.pick(*self.cols(scope, 'n'))}"
        if r < 0.6:
            return f"{c} * {self.rng.randint(2, 3)} - {self.rng.randint(0, 5)}"
        if r < 0.75:
            return f"coalesce({c}, {self.rng.randint(-1, 3)})"
        if r < 0.9:
            return f"CASE WHEN {self.pred(scope, 1)} THEN {c} ELSE {self.rng.randint(-2, 2)} END"
        return f"abs({c} - {self.rng.randint(1, 6)})"

    def string(self, scope: Scope) -> str:
        c = self.pick(*self.cols(scope, "s"))
        return self.pick(c, c, f"coalesce({c}, 'none')", f"upper({c})", f"concat({c}, '-')")

    def atom(self, scope: Scope) -> str:
        n = self.pick(*self.cols(scope, "nf"))
        s = self.pick(*self.cols(scope, "s"))
        r = self.rng.random()
        if r < 0.3:
            return f"{n} {self.pick('<', '<=', '>', '>=', '=', '<>')} {self.rng.randint(0, 8)}"
        if r < 0.45:
            return f"{self.pick(n, s)} IS {self.pick('', 'NOT ')}NULL"
        if r < 0.55:
            return f"{n} {self.pick('', 'NOT ')}IN ({', '.join(str(self.rng.randint(0, 8)) for _ in range(3))})"
        if r < 0.65:
            lo = self.rng.randint(0, 5)
            return f"{n} BETWEEN {lo} AND {lo + self.rng.randint(1, 4)}"
        if r < 0.8:
            return f"{s} {self.pick('=', '<>')} {self.pick(*STRINGS)}"
        if r < 0.9:
            return f"length({s}) > {self.rng.randint(1, 4)}"
        a, b = self.rng.sample(self.cols(scope, "n"), 2) if len(self.cols(scope, "n")) > 1 else (n, n)
        return f"{a} {self.pick('<', '>', '=')} {b}"

    def pred(self, scope: Scope, depth: int = 2) -> str:
        if depth <= 0 or self.chance(0.4):
            return self.atom(scope)
        op = self.pick("AND", "OR", "NOT")
        if op == "NOT":
            return f"NOT ({self.pred(scope, depth - 1)})"
        return f"({self.pred(scope, depth - 1)} {op} {self.pred(scope, depth - 1)})"

    def subquery_pred(self, scope: Scope) -> str:
        """[NOT] EXISTS / [NOT] IN over a source, correlated on an outer column or not."""
        inner = self.pick("gl", "gr", "gk")
        za = self.alias()
        inner_scope = [(za, KINDS[inner])]
        outer_n = self.cols(scope, "n")
        where = [f"{za}.g = {self.pick(*outer_n)}"] if self.chance(0.6) else []
        if self.chance(0.4):
            where.append(self.atom(inner_scope))
        w = f" WHERE {' AND '.join(where)}" if where else ""
        if self.chance(0.5):
            return f"{self.pick('', 'NOT ')}EXISTS (SELECT 1 FROM {{{inner}}} {za}{w})"
        y = self.pick(*self.cols(inner_scope, "n"))
        return f"{self.pick(*outer_n)} {self.pick('', 'NOT ')}IN (SELECT {y} FROM {{{inner}}} {za}{w})"

    def where(self, scope: Scope, subquery: float) -> str:
        parts = []
        if self.chance(0.75):
            parts.append(self.pred(scope))
        if self.chance(subquery):
            sub = self.subquery_pred(scope)
            # under OR at times: a mark join instead of a semi-/anti-join
            parts.append(f"({sub} OR {self.atom(scope)})" if self.chance(0.3) else sub)
        return f" WHERE {' AND '.join(parts)}" if parts else ""

    # --- query forms ---

    def window(self, scope: Scope) -> str:
        """A window whose value does not depend on how Spark orders tied rows (peer-based or whole
        partition), so the query run from scratch has one right answer."""
        part = self.pick(*self.cols(scope, "ns"))
        order = self.pick(*self.cols(scope, "nf"))
        return self.pick(
            f"RANK() OVER (PARTITION BY {part} ORDER BY {order})",
            f"DENSE_RANK() OVER (PARTITION BY {part} ORDER BY {order} DESC)",
            f"COUNT(*) OVER (PARTITION BY {part})",
            f"SUM({order}) OVER (PARTITION BY {part} ORDER BY {order})",
            f"MAX({order}) OVER (PARTITION BY {part})",
        )

    def scalar_subquery(self, scope: Scope) -> str:
        """An aggregate scalar subquery, correlated on an equality or not."""
        inner = self.pick("gr", "gk")
        za = self.alias()
        agg = self.pick("COUNT(*)", f"SUM({za}.g)", f"MAX({za}.g)")
        where = f" WHERE {za}.g = {self.pick(*self.cols(scope, 'n'))}" if self.chance(0.7) else ""
        return f"(SELECT {agg} FROM {{{inner}}} {za}{where})"

    def project(self, subquery: float = 0.25) -> str:
        frm, scope = self.from_clause()
        items = [self.num(scope) for _ in range(self.rng.randint(1, 3))] + [self.string(scope)]
        if self.chance(0.35):
            items.append(self.window(scope))
        elif self.chance(0.3):
            items.append(self.scalar_subquery(scope))
        sel = ", ".join(f"{e} AS c{i}" for i, e in enumerate(items))
        lateral = ""
        if self.chance(0.25):  # a generator over the row's own columns: one to three rows per input row
            a, b = self.pick(*self.cols(scope, "n")), self.pick(*self.cols(scope, "n"))
            lateral = f" LATERAL VIEW {self.pick('', 'OUTER ')}explode(array({a}, {b})) ex AS e"
            sel += ", ex.e AS ce"
        return f"SELECT {sel} FROM {frm}{lateral}{self.where(scope, subquery)}"

    def distinct(self) -> str:
        frm, scope = self.from_clause()
        keys = [self.pick(*self.cols(scope, "n")), f"{self.pick(*self.cols(scope, 'n'))} % 3",
                self.pick(*self.cols(scope, "s"))]
        self.rng.shuffle(keys)
        keys = keys[: self.rng.randint(1, 3)]
        return f"SELECT DISTINCT {', '.join(f'{k} AS c{i}' for i, k in enumerate(keys))} FROM {frm}{self.where(scope, 0.25)}"

    def aggregates(self, scope: Scope) -> list[str]:
        n = lambda: self.pick(*self.cols(scope, "nf"))  # noqa: E731
        choices = [
            lambda: "COUNT(*)", lambda: f"COUNT({self.pick(*self.cols(scope, 'nfs'))})", lambda: f"SUM({n()})",
            lambda: f"AVG({n()})", lambda: f"MIN({self.pick(*self.cols(scope, 'nfs'))})",
            lambda: f"MAX({self.pick(*self.cols(scope, 'nfs'))})",
            lambda: f"SUM(CASE WHEN {self.atom(scope)} THEN 1 ELSE 0 END)",
            lambda: f"COUNT(DISTINCT {self.pick(*self.cols(scope, 'ns'))})", lambda: f"bool_or({self.atom(scope)})",
            lambda: f"stddev_pop({self.pick(*self.cols(scope, 'n'))})",
        ]
        return [self.pick(*choices)() for _ in range(self.rng.randint(2, 5))]

    def aggregate(self, frm: str | None = None, scope: Scope | None = None) -> str:
        if frm is None or scope is None:
            frm, scope = self.from_clause()
        where = self.where(scope, 0.2)
        keys = [] if self.chance(0.15) else self.rng.sample(
            [self.pick(*self.cols(scope, "n")), self.pick(*self.cols(scope, "s")),
             f"{self.pick(*self.cols(scope, 'n'))} % 2"], self.rng.randint(1, 2))
        items = keys + self.aggregates(scope)
        sel = ", ".join(f"{e} AS c{i}" for i, e in enumerate(items))
        group = f" GROUP BY {', '.join(keys)}" if keys else ""
        having = f" HAVING COUNT(*) > {self.rng.randint(1, 2)}" if keys and self.chance(0.25) else ""
        top = ""
        if keys and self.chance(0.3):  # TopK: ordered by every output column, so ties are whole equal rows
            order = ", ".join(f"c{i} {self.pick('ASC', 'DESC')} NULLS {self.pick('FIRST', 'LAST')}"
                              for i in range(len(items)))
            top = f" ORDER BY {order} LIMIT {self.rng.randint(1, 4)}"
        return f"SELECT {sel} FROM {frm}{where}{group}{having}{top}"

    def union_all(self) -> str:
        """Two projections cast to one shape (BIGINT, DOUBLE, STRING)."""
        parts = []
        for _ in range(2):
            frm, scope = self.from_clause()
            parts.append(f"SELECT CAST({self.num(scope)} AS BIGINT) AS c0, CAST({self.num(scope)} AS DOUBLE) AS c1, "
                         f"{self.string(scope)} AS c2 FROM {frm}{self.where(scope, 0.2)}")
        op = self.pick("UNION ALL", "UNION ALL", "UNION", "INTERSECT", "INTERSECT ALL", "EXCEPT", "EXCEPT ALL")
        return f" {op} ".join(parts)

    def nested(self) -> str:
        """An aggregate over a filtered subquery in FROM."""
        inner_frm, inner_scope = self.from_clause()
        q = self.alias()
        cols = [(f"k{i}", c) for i, c in enumerate(self.cols(inner_scope, "ns"))]
        sub = (f"(SELECT {', '.join(f'{c} AS {n}' for n, c in cols)} FROM {inner_frm}"
               f"{self.where(inner_scope, 0.3)}) {q}")
        strings = set(self.cols(inner_scope, "s"))
        return self.aggregate(sub, [(q, {n: "s" if c in strings else "n" for n, c in cols})])

    def query(self, form: str) -> str:
        if form == "project":
            return self.project(0.6)
        if form == "aggregate" and self.chance(0.4):
            return self.nested()
        return getattr(self, form)()


def gen_seed() -> int:
    env = os.environ.get("TRICKLE_GEN_SEED")
    if not env:
        return DEFAULT_GEN_SEED
    return random.randrange(1, 10**9) if env == "random" else int(env)


def generate(seed: int, n: int) -> dict[str, str]:
    """``n`` queries named q0..q{n-1}, the same for the same seed."""
    gen = QueryGen(random.Random(seed))
    return {f"q{i}": gen.query(FORMS[i % len(FORMS)]) for i in range(n)}


#: what the generator must produce over the seeds of the pure test
NEEDLES = ("JOIN", "LEFT JOIN", "FULL JOIN", "NOT EXISTS", " EXISTS", " NOT IN (SELECT", " IN (SELECT",
           "GROUP BY", "HAVING", "DISTINCT", "UNION ALL", "COUNT(DISTINCT", "IS NULL", "IS NOT NULL", " OR ",
           "NOT (", "CASE WHEN", "BETWEEN", "bool_or", "stddev_pop", "AVG(", "MIN(", "MAX(", "FROM (SELECT",
           " OVER (", " INTERSECT ", " EXCEPT ", " UNION ", "LIMIT", "LATERAL VIEW", "(SELECT COUNT(*)")
#: and what CI's own queries (DEFAULT_GEN_SEED) must contain
CI_NEEDLES = ("LEFT JOIN", "FULL JOIN", "NOT EXISTS", " NOT IN (SELECT", " IN (SELECT", "GROUP BY", "HAVING",
              "DISTINCT", "UNION ALL", "COUNT(DISTINCT", "IS NULL", " OR ", "NOT (", "CASE WHEN", "FROM (SELECT",
              " OVER (", "LIMIT")


def _schemas() -> dict[str, list[tuple[str, str]]]:
    return {s.name: ([(s.key, "int")] if s.key else []) + [(c.name, c.sql_type().lower()) for c in s.cols]
            for s in SOURCES}


def _plain(q: str) -> str:
    return q.format(**{s.name: s.name for s in SOURCES})


def test_generator_is_deterministic_and_every_query_compiles() -> None:
    """Without Spark, over many seeds: a seed gives the same queries every time, every generated query
    compiles to an operator tree (the generator only composes supported constructs, so a failure here is
    an engine bug or a generator bug), and together they use every construct the module docstring lists."""
    schemas = _schemas()
    seen: set[str] = set()
    for seed in range(60):
        queries = generate(seed, len(FORMS))
        assert queries == generate(seed, len(FORMS)), f"seed {seed} is not deterministic"
        for name, q in queries.items():
            try:
                compile_tree(_plain(q), schemas)
            except Exception as e:  # noqa: BLE001 - report the query with the error
                raise AssertionError(f"TRICKLE_GEN_SEED={seed} {name} does not compile: {e}\n  {q}") from None
            seen |= {n for n in NEEDLES if n in q}
    assert seen == set(NEEDLES), f"never generated: {sorted(set(NEEDLES) - seen)}"
    ci = " ".join(generate(DEFAULT_GEN_SEED, len(FORMS)).values())
    assert all(n in ci for n in CI_NEEDLES), f"CI's queries miss {[n for n in CI_NEEDLES if n not in ci]}"


def test_generated_queries_differential(spark: Any, st: Any) -> None:
    """``TRICKLE_GEN_QUERIES`` random queries, each maintained DIFFERENTIAL over >= 20 random change
    cycles and compared with its query run from scratch after every refresh."""
    seed = gen_seed()
    queries = generate(seed, N_QUERIES)
    only = [q.strip() for q in os.environ.get("TRICKLE_GEN_ONLY", "").split(",") if q.strip()]
    if only:
        queries = {n: q for n, q in queries.items() if n in only}
    changes = oracle_seed(seed)
    listing = "\n".join(f"  {n}: {q}" for n, q in queries.items())
    print(f"[generated TRICKLE_GEN_SEED={seed} TRICKLE_ORACLE_SEED={changes}]\n{listing}")
    try:
        run_oracle(spark, st, SOURCES, queries, cycles=CYCLES, seed=changes)
    except AssertionError as e:
        raise AssertionError(
            f"{e}\n\nreplay: TRICKLE_GEN_SEED={seed} TRICKLE_ORACLE_SEED={changes} "
            f"TRICKLE_GEN_ONLY=<names> ./dev test tests/test_oracle_generated.py -k differential\n"
            f"queries:\n{listing}"
        ) from None
