"""One package, one command: ``pip install .`` gives a ``trickle`` that runs what the README shows.

The package is installed non-editable (a wheel built by pip from a copy of the committed sources) into a
fresh venv that sees the dependencies of the test venv but not its editable install, and ``trickle`` is
run from that venv, in a folder outside the repository, with no PYTHONPATH and no ``TRICKLE_JARS_DIR``.
The installed trickle fetches its Delta and Kafka jars itself on first use, with Maven, into a per-user
cache (:mod:`pipeline.jvm_jars`; here a temporary one, while ``~/.m2`` is the developer's, so nothing set-up
already downloaded is downloaded again), says clearly when Maven is missing, and needs no Maven afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_env import clean_env, deps_only_python, short_lived_jvm, source_copy


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin folder after ``pip install .`` (no deps: they come from the test venv)."""
    work = tmp_path_factory.mktemp("wheel")
    python = deps_only_python(work)
    src = source_copy(work / "src")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", "."],
                   cwd=src, check=True, capture_output=True)
    where = subprocess.run([str(python), "-c", "import pipeline; print(pipeline.__file__)"], cwd=work,
                           env=clean_env(), check=True, capture_output=True, text=True).stdout.strip()
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where).is_relative_to(site), f"pipeline imported from {where}, not from the installed wheel"
    return python.parent


@pytest.fixture(scope="module")
def jars_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The installed trickle's per-user cache (``TRICKLE_CACHE_DIR``), removed afterwards: it holds a copy of
    every jar (the AWS SDK bundle alone is 640 MB)."""
    cache = tmp_path_factory.mktemp("trickle_cache")
    yield cache
    shutil.rmtree(cache, ignore_errors=True)


def _run(cmd: list[str], cwd: Path, cache: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = short_lived_jvm(clean_env(TRICKLE_CACHE_DIR=str(cache)))  # no TRICKLE_JARS_DIR: the installed package finds its own
    if path is not None:
        env["PATH"] = path
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)


def _trickle(bin_dir: Path, *args: str, cwd: Path, cache: Path, path: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    return _run([str(bin_dir / "trickle"), *args], cwd, cache, path)


def _no_maven(tmp_path: Path) -> str:
    """A PATH on which no ``mvn`` (nor anything else) is found."""
    empty = tmp_path / "empty_bin"
    empty.mkdir(exist_ok=True)
    return str(empty)


def test_installed_trickle_help_lists_every_command(installed: Path, tmp_path: Path) -> None:
    from pipeline.cli import build_parser

    out = _trickle(installed, "--help", cwd=tmp_path, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr
    commands = next(a.choices for a in build_parser()._actions if a.dest == "command")
    missing = [c for c in commands if c not in out.stdout]
    assert not missing, f"trickle --help of the installed wheel lacks {missing}:\n{out.stdout}"
    assert not (tmp_path / "cache").exists(), "--help needs no jars, and must fetch none"


def test_installed_trickle_without_maven_says_how_to_get_the_jars(installed: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    out = _trickle(installed, "demo", "--warehouse", str(tmp_path / "wh"), cwd=tmp_path, cache=cache,
                   path=_no_maven(tmp_path))
    assert out.returncode == 2, f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("error: spark-trickle needs the Delta and Kafka jars"), out.stderr[-2000:]
    for needle in ("'mvn' is not on PATH", "Install Maven", "TRICKLE_JARS_DIR", str(cache / "jars")):
        assert needle in error, error
    assert not list(cache.rglob("*.jar")), "a failed fetch must leave nothing that looks fetched"


def test_installed_trickle_fetches_its_jars_once_then_runs_offline(installed: Path, jars_cache: Path,
                                                                    tmp_path: Path) -> None:
    """The first command that starts Spark fetches the jars (the same artifacts as ``./dev setup``, and our S3
    log store built from the shipped sources), and the demo runs on them outside the repository; afterwards
    the jars are found with no Maven on PATH, and nothing is fetched again."""
    from deltalake import DeltaTable

    from pipeline.session import local_jars

    out = _trickle(installed, "demo", "--warehouse", str(tmp_path / "wh"), cwd=tmp_path, cache=jars_cache)
    assert out.returncode == 0, f"trickle demo failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.stderr.count("fetching the JVM jars with Maven") == 1, out.stderr[-3000:]
    verdicts = [ln for ln in out.stdout.splitlines() if ln.endswith((": yes", ": NO - please report"))]
    assert verdicts == ["department_tree: yes", "department_stats: yes", "department_report: yes"], out.stdout
    report = DeltaTable(str(tmp_path / "wh" / "_trickle" / "tables" / "department_report")).to_pyarrow_table()
    assert sorted(report.column("division").to_pylist()) == ["Operations", "R&D", "Sales"]

    folders = [p for p in (jars_cache / "jars").iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    folder = folders[0]
    fetched = sorted(p.name for p in folder.glob("*.jar"))
    assert fetched == sorted(Path(j).name for j in local_jars()), "not the jars ./dev setup fetched"

    listed = _run([str(installed / "python"), "-c", "from pipeline.session import local_jars; "
                   "print('\\n'.join(local_jars()))"], tmp_path, jars_cache, path=_no_maven(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert "fetching" not in listed.stderr, listed.stderr
    assert listed.stdout.split() == [str(folder / name) for name in fetched]
    printed = _run([str(installed / "python"), "-m", "pipeline.jvm_jars"], tmp_path, jars_cache,
                   path=_no_maven(tmp_path))  # what the README gives spark-submit's --jars
    assert (printed.returncode, printed.stdout.strip()) == (0, str(folder)), printed.stderr
