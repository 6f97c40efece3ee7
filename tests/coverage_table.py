"""The SQL coverage table, docs/COVERAGE.md, generated from the ``COVERAGE`` rows of the oracle test modules.

Why generated: a table written by hand drifts from the engine. Every ``tests/test_oracle_*.py`` may declare
``COVERAGE: list[Row]`` (:mod:`coverage_rows`); this script checks each row without Spark and renders the
table. ``tests/test_coverage_table.py`` fails when a row fails its check or when the committed table differs
from the generated one, so neither the table nor the rows can drift from the engine.

Checks, per status (rows are written against :data:`coverage_rows.SCHEMA`):

* DIFFERENTIAL / recompute-scoped: the example compiles (:func:`dvm.builder.compile_tree`), and the status
  is the one the plan gives: *recompute-scoped* when some operator's delta rule recomputes the groups,
  partitions or rows a change touches (:meth:`dvm.plan.Plan.recomputes`, what ``explain`` marks RECOMPUTE),
  else DIFFERENTIAL. ``test`` names a ``test_*`` function of the declaring module (or ``file.py::function``
  of another oracle module) that is not marked slow or skipped and calls ``run_oracle`` in DIFFERENTIAL
  mode with at least :data:`MIN_CYCLES` cycles, read statically from the source (a literal, a module
  constant, or the default of ``int(os.environ.get(NAME, "20"))``; run_oracle's own default otherwise).
* FULL-only (not maintained differentially, yet): compiling raises UnsupportedError or QueryError (AUTO
  refreshes FULL and records the reason), and the FULL refresh's source pinning
  (:func:`dvm.parser.pin_sources`) accepts the example; ``test_coverage_table.py`` also has Spark analyse
  each FULL-only example over empty tables, so AUTO's FULL refresh can run it.
* rejected (not maintainable by design: non-deterministic, arbitrary, not one query): compiling raises
  UnsupportedError or QueryError, so DIFFERENTIAL / IMMEDIATE / strict mode refuse it naming the construct.

FULL-only and rejected rows name no test. A construct declared in several modules must have one status
everywhere. Usage::

    .venv/bin/python tests/coverage_table.py           # check the rows and the committed table
    .venv/bin/python tests/coverage_table.py --write   # regenerate docs/COVERAGE.md
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
for _p in (str(ROOT), str(TESTS)):  # this checkout's dvm, not an installed one
    if _p not in sys.path:
        sys.path.insert(0, _p)

from coverage_rows import SCHEMA, Row  # noqa: E402

from dvm.builder import compile_tree  # noqa: E402
from dvm.errors import QueryError, UnsupportedError  # noqa: E402
from dvm.parser import pin_sources  # noqa: E402
from dvm.plan import Plan  # noqa: E402

DOC = ROOT / "docs" / "COVERAGE.md"
WRITE_COMMAND = ".venv/bin/python tests/coverage_table.py --write"
MIN_CYCLES = 20
STATUSES = ("DIFFERENTIAL", "recompute-scoped", "FULL-only", "rejected")
ORACLE_MODES = ("DIFFERENTIAL", "IMMEDIATE")


@dataclass
class Checked:
    """One row after its check: what the engine says about it, and what is wrong with it."""

    module: str  # declaring module, e.g. test_oracle_joins
    row: Row
    how: str = ""  # recompute reasons (recompute-scoped) or the engine's error (FULL-only / rejected)
    test: str = ""  # file.py::function
    cycles: int | None = None  # run_oracle cycles of that test
    problems: list[str] = field(default_factory=list)


@dataclass
class Section:
    module: str
    title: str
    order: int
    rows: list[Checked]


# --------------------------------------------------------------------------------------------------
# Static reading of an oracle test
# --------------------------------------------------------------------------------------------------


def _module_assignments(tree: ast.Module) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def static_value(node: ast.expr | None, names: dict[str, ast.expr], depth: int = 0) -> object:
    """The value of a simple expression without running it: literals, module constants, ``int(x)``,
    ``os.environ.get(NAME, default)`` / ``os.getenv(NAME, default)`` (the default: the value CI runs with).
    ``None`` when it cannot be read."""
    if node is None or depth > 10:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return static_value(names[node.id], names, depth + 1)
    if isinstance(node, ast.Call):
        f = node.func
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if fname == "int" and len(node.args) == 1:
            v = static_value(node.args[0], names, depth + 1)
            try:
                return int(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return None
        if fname in ("get", "getenv") and len(node.args) == 2:
            return static_value(node.args[1], names, depth + 1)
    return None


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _oracle_defaults() -> dict[str, object]:
    import oracle

    params = inspect.signature(oracle.run_oracle).parameters
    return {"cycles": params["cycles"].default, "mode": params["mode"].default}


def oracle_test_problems(path: Path, func: str) -> tuple[list[str], int | None]:
    """Why ``func`` of the module at ``path`` does not prove a DIFFERENTIAL row (empty: it does), and the
    number of cycles it runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _module_assignments(tree)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    where = f"{path.name}::{func}"
    if func not in funcs:
        return [f"{where} does not exist"], None
    fn = funcs[func]
    if not func.startswith("test"):
        return [f"{where} is not a test function (pytest collects test_*)"], None
    for d in fn.decorator_list:
        text = ast.unparse(d)
        if any(m in text for m in ("mark.slow", "mark.skip", "mark.xfail")):
            return [f"{where} is marked {text}: CI does not run it as a passing test"], None

    def calls(f: ast.FunctionDef, seen: set[str]) -> list[ast.Call]:
        """run_oracle calls in ``f``, or in module functions it calls (helpers that wrap run_oracle)."""
        found: list[ast.Call] = []
        for n in ast.walk(f):
            if isinstance(n, ast.Call):
                name = _call_name(n)
                if name == "run_oracle":
                    found.append(n)
                elif name in funcs and name not in seen:
                    found += calls(funcs[name], seen | {name})
        return found

    oracle_calls = calls(fn, {func})
    if not oracle_calls:
        return [f"{where} does not call run_oracle"], None
    defaults = _oracle_defaults()
    local = {**names, **_module_assignments(ast.Module(body=fn.body, type_ignores=[]))}
    problems, least = [], None
    for c in oracle_calls:
        kw = {k.arg: k.value for k in c.keywords if k.arg}
        cyc_node = kw.get("cycles", c.args[4] if len(c.args) > 4 else None)
        mode_node = kw.get("mode", c.args[5] if len(c.args) > 5 else None)
        cycles = defaults["cycles"] if cyc_node is None else static_value(cyc_node, local)
        mode = defaults["mode"] if mode_node is None else static_value(mode_node, local)
        if not isinstance(cycles, int):
            problems.append(f"{where}: cannot read run_oracle's cycles statically ({ast.unparse(cyc_node)})")
            continue
        if cycles < MIN_CYCLES:
            problems.append(f"{where} runs run_oracle with {cycles} cycles, fewer than {MIN_CYCLES}")
        if mode not in ORACLE_MODES:
            problems.append(f"{where} runs run_oracle in mode {mode!r}: FULL refreshes would pass; use "
                            f"{' or '.join(ORACLE_MODES)}")
        least = cycles if least is None else min(least, cycles)
    return problems, least


# --------------------------------------------------------------------------------------------------
# Row checks
# --------------------------------------------------------------------------------------------------


def _oneline(text: str) -> str:
    return " ".join(text.split())


def check_row(module: str, row: Row, path: Path) -> Checked:
    out = Checked(module, row)
    p = out.problems
    if row.status not in STATUSES:
        p.append(f"status {row.status!r} is none of {', '.join(STATUSES)}")
        return out
    if not row.construct.strip() or not row.example.strip():
        p.append("construct and example must not be empty")
        return out
    error: Exception | None = None
    plan: Plan | None = None
    try:
        root, names, notes = compile_tree(row.example, SCHEMA)
        plan = Plan(root, names, notes)
    except (UnsupportedError, QueryError) as e:
        error = e
    if row.status in ("DIFFERENTIAL", "recompute-scoped"):
        if plan is None:
            p.append(f"marked {row.status} but compiling the example fails: {type(error).__name__}: {error}")
        else:
            scoped = plan.recomputes()
            derived = "recompute-scoped" if scoped else "DIFFERENTIAL"
            if derived != row.status:
                why = "; ".join(f"{type(n).__name__}: {r}" for n, r in scoped) or "every operator applies a delta rule"
                p.append(f"marked {row.status} but the plan is {derived} ({why})")
            out.how = "; ".join(dict.fromkeys(f"{type(n).__name__}: {r}" for n, r in scoped))
        if not row.test:
            p.append(f"a {row.status} row must name its oracle test")
        else:
            file, _, func = row.test.rpartition("::")
            target = TESTS / file if file else path
            if not target.name.startswith("test_oracle_") or not target.is_file():
                p.append(f"test {row.test!r}: no oracle test module {target.name}")
            else:
                problems, cycles = oracle_test_problems(target, func)
                p.extend(problems)
                out.test, out.cycles = f"{target.name}::{func}", cycles
        return out
    if plan is not None:
        p.append(f"marked {row.status} but the example compiles (its plan is "
                 f"{'recompute-scoped' if plan.recomputes() else 'DIFFERENTIAL'}): update the row")
        return out
    out.how = _oneline(str(error))
    if row.status == "FULL-only":
        try:
            pin_sources(row.example, {k: k for k in SCHEMA})
        except (UnsupportedError, QueryError) as e:
            p.append(f"marked FULL-only but the FULL refresh cannot pin its sources: {e}")
    if row.test:
        p.append(f"a {row.status} row names no oracle test (got {row.test!r})")
    return out


# --------------------------------------------------------------------------------------------------
# Collection and rendering
# --------------------------------------------------------------------------------------------------


def oracle_modules() -> list[tuple[str, Path]]:
    return [(p.stem, p) for p in sorted(TESTS.glob("test_oracle_*.py"))]


def _title(module: str, mod: ModuleType) -> str:
    title = getattr(mod, "COVERAGE_TITLE", None)
    return title or module.removeprefix("test_oracle_").replace("_", " ").capitalize()


def collect() -> tuple[list[Section], list[str]]:
    """Every module's rows, checked; and the problems found (each naming its module and construct)."""
    sections: list[Section] = []
    problems: list[str] = []
    seen: dict[str, tuple[str, str]] = {}  # construct -> (module, status)
    for module, path in oracle_modules():
        mod = importlib.import_module(module)
        rows = getattr(mod, "COVERAGE", None)
        if rows is None:
            continue
        checked = []
        for row in rows:
            if not isinstance(row, Row):
                problems.append(f"{module}: COVERAGE holds {row!r}, not a coverage_rows.Row")
                continue
            c = check_row(module, row, path)
            key = row.construct.strip().lower()
            if key in seen and seen[key][1] != row.status:
                c.problems.append(f"{seen[key][0]} declares the same construct {seen[key][1]}")
            seen.setdefault(key, (module, row.status))
            problems += [f"{module}: {row.construct!r}: {m}" for m in c.problems]
            checked.append(c)
        sections.append(Section(module, _title(module, mod), getattr(mod, "COVERAGE_ORDER", 50), checked))
    return sorted(sections, key=lambda s: (s.order, s.module)), problems + capability_problems()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(sql: str) -> str:
    return "`" + _cell(sql).replace("`", "'") + "`" if "`" not in sql else "``" + _cell(sql) + "``"


LEGEND = """\
| status | meaning |
|---|---|
| DIFFERENTIAL | a refresh derives the change of the result from the changes of the sources: every operator applies its delta rule. MIN / MAX-like aggregates and the variance family rescan one group only when a deletion leaves its value ambiguous |
| recompute-scoped | still a DIFFERENTIAL refresh, but an operator recomputes what a change touches (the groups, partitions or rows named in the last column) from snapshots; `explain` marks it `RECOMPUTE` |
| FULL-only | not maintained differentially (yet): in AUTO mode every refresh is FULL, with the reason below recorded in the history; DIFFERENTIAL, IMMEDIATE and strict mode refuse it at create |
| rejected | cannot be maintained by design (non-deterministic, arbitrary, not one query): DIFFERENTIAL, IMMEDIATE and strict mode refuse it with an error naming the construct; AUTO refreshes FULL whatever Spark can run |
"""


#: What spark-trickle offers beyond maintaining a query, each with the test that proves it (checked to exist
#: by :func:`capability_problems`): (capability, how, test as ``file::function``).
CAPABILITIES: tuple[tuple[str, str, str], ...] = (
    ("Read-your-writes: `st.write(table, data)` returns once every IMMEDIATE stream table reading `table` "
     "reflects the write; `st.wait_for(name, source, version)` for writers that commit otherwise "
     "(`trickle wait-for`)",
     "the writer waits for the frontier each refresh commit records (`base_frontier`), or refreshes the table "
     "itself when no streaming query of its process maintains it; not one transaction: see "
     "docs/read-your-writes.md",
     "test_read_your_writes.py::test_reader_never_sees_a_stream_table_behind_a_returned_write"),
    ("Consistent reads: `st.read(name, consistent=True)`",
     "the stream table at a Delta version whose frontier covers every base table commit made before the call",
     "test_read_your_writes.py::test_reader_never_sees_a_stream_table_behind_a_returned_write"),
    ("Waiting gives up with a clear error (`ConsistencyTimeout`); SUSPENDED tables are not waited for",
     "the error names the versions wanted and reflected, the status and the last error",
     "test_read_your_writes.py::test_waiting_without_a_maintainer_times_out_with_a_clear_error"),
    ("pg_ivm compatibility: `create_immv`, `refresh_immv(name, with_data)`, `get_immv_def`, the `pg_ivm_immv` "
     "view (API and CLI)",
     "pg_ivm's README examples translated to Spark SQL, compared with their queries: "
     "docs/migrating-from-pg_ivm.md",
     "test_pg_ivm.py::test_pg_ivm_readme_examples"),
)


def capability_problems() -> list[str]:
    """A capability row whose test does not exist (renamed or removed) is a problem, as an oracle row's is."""
    problems = []
    for capability, _, test in CAPABILITIES:
        file, _, func = test.partition("::")
        path = TESTS / file
        names = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(n, ast.FunctionDef)} if path.exists() else set()
        if func not in names:
            problems.append(f"capability {capability[:40]!r}: no test {test}")
    return problems


def _how(c: Checked) -> str:
    """The last column: for recompute-scoped rows what the plan recomputes (and the row's note); for
    FULL-only / rejected rows the row's reason, else the engine's message; for DIFFERENTIAL the note."""
    if c.row.status == "recompute-scoped":
        return " ".join(x for x in (c.how, c.row.reason) if x)
    return c.row.reason or c.how


def render(sections: list[Section]) -> str:
    counts = {s: sum(1 for sec in sections for c in sec.rows if c.row.status == s) for s in STATUSES}
    out = [
        "# SQL coverage",
        "",
        "<!-- Generated by tests/coverage_table.py from the COVERAGE rows of tests/test_oracle_*.py; do not edit.",
        f"     Regenerate with: {WRITE_COMMAND} -->",
        "",
        "What the engine maintains, construct by construct. Each row is checked against the engine by "
        "`tests/test_coverage_table.py` (the example is compiled; DIFFERENTIAL and recompute-scoped rows name an "
        f"oracle test that compares the stream table with its query after >= {MIN_CYCLES} random change "
        "cycles, each refresh DIFFERENTIAL), so the table cannot drift from the code. `explain` shows the "
        "same for any query. Examples use tables `a`, `b` (keyed on `id`) and `c` (keyless).",
        "",
        LEGEND,
        "Rows: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".",
        "",
    ]
    for sec in sections:
        out += [f"## {sec.title}", "", "| construct | status | example | how / why | oracle test |",
                "|---|---|---|---|---|"]
        for c in sec.rows:
            how = _how(c)
            test = f"`{c.test}`" + (f" ({c.cycles} cycles)" if c.cycles else "") if c.test else ""
            out.append(f"| {_cell(c.row.construct)} | {c.row.status} | {_code(c.row.example)} | {_cell(how)} | {test} |")
        out.append("")
    out += ["## Beyond SQL constructs: consistency and compatibility", "", "| capability | how | test |",
            "|---|---|---|"]
    out += [f"| {_cell(cap)} | {_cell(how)} | `{test}` |" for cap, how, test in CAPABILITIES]
    out += ["## Across stream tables: cycles and strata", "",
            "Not constructs of one query but of the graph of stream tables (see the README, *Cycles of stream "
            "tables*). Each row names the test that checks it; `tests/test_coverage_table.py` fails when that test is gone.", "",
            "| capability | status | how | test |", "|---|---|---|---|"]
    out += [f"| {cap} | {status} | {how} | `{test}` |" for cap, status, how, test in GRAPH_ROWS]
    out.append("")
    return "\n".join(out)


#: capabilities of the graph of stream tables (pipeline.strata, pipeline.cycles): (capability, status, how, test)
GRAPH_ROWS = (
    ("Cycles of stream tables through monotone edges (`allow_circular`)", "least fixpoint",
     "semi-naive rounds, the component reset and recomputed on every refresh that reads a change (so deletions "
     "reach the least fixpoint); `max_fixpoint_iterations` (default 100) puts every member in ERROR",
     "test_cycles.py::test_transitive_closure_over_two_tables_matches_recursive_cte_under_inserts_and_deletes"),
    ("A cycle through NOT EXISTS / NOT IN, EXCEPT's right side, an aggregate's or a window's input", "rejected",
     "at create / alter, naming the edge and the operator (`dvm.monotone`); allowed when it points to a lower "
     "stratum", "test_cycles.py::test_a_cycle_through_a_non_monotone_edge_is_refused_naming_edge_and_operator"),
    ("Strata (minimum stratification) and skipping", "DIFFERENTIAL",
     "strata recomputed on every change to the graph; a refresh whose moved upstream stream tables committed "
     "no net row records "
     "NO_DATA without a Spark job", "test_strata.py::test_a_layer_whose_refresh_applies_no_row_stops_the_wave_below_it"),
)


def _graph_problems() -> list[str]:
    """A GRAPH_ROWS test that no longer exists."""
    out = []
    for *_, test in GRAPH_ROWS:
        file, _, function = test.partition("::")
        path = TESTS / file
        if not path.exists() or f"def {function}(" not in path.read_text(encoding="utf-8"):
            out.append(f"GRAPH_ROWS names {test}, which does not exist")
    return out


def generate() -> tuple[str, list[str]]:
    sections, problems = collect()
    return render(sections), problems + _graph_problems()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {DOC.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    text, problems = generate()
    for m in problems:
        print(f"problem: {m}", file=sys.stderr)
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.relative_to(ROOT)}")
    elif DOC.exists() and DOC.read_text(encoding="utf-8") == text:
        print(f"{DOC.relative_to(ROOT)} is up to date")
    else:
        print(f"{DOC.relative_to(ROOT)} is out of date: run {WRITE_COMMAND}", file=sys.stderr)
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
