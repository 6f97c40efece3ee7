"""One package, one command: ``pip install .`` gives a ``trickle`` that runs what the README shows.

The package is installed non-editable (a wheel built by pip from a copy of the committed sources) into a
fresh venv that sees the dependencies of the test venv but not its editable install, and ``trickle`` is
run from that venv, in a folder outside the repository, with no PYTHONPATH. The Delta and Kafka jars are
the ones set-up fetched, given by ``TRICKLE_JARS_DIR`` as the README tells an installed package's user.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster_env import clean_env, deps_only_python, source_copy


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


def _trickle(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    from pipeline.session import jars_dir

    return subprocess.run([str(bin_dir / "trickle"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=clean_env(TRICKLE_JARS_DIR=str(jars_dir())))


def test_installed_trickle_help_lists_every_command(installed: Path, tmp_path: Path) -> None:
    from pipeline.cli import build_parser

    out = _trickle(installed, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    commands = next(a.choices for a in build_parser()._actions if a.dest == "command")
    missing = [c for c in commands if c not in out.stdout]
    assert not missing, f"trickle --help of the installed wheel lacks {missing}:\n{out.stdout}"


def test_installed_trickle_runs_the_demo_outside_the_repo(installed: Path, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    out = _trickle(installed, "demo", "--warehouse", str(tmp_path / "wh"), cwd=tmp_path)
    assert out.returncode == 0, f"trickle demo failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    verdicts = [ln for ln in out.stdout.splitlines() if ln.endswith((": yes", ": NO - please report"))]
    assert verdicts == ["department_tree: yes", "department_stats: yes", "department_report: yes"], out.stdout
    report = DeltaTable(str(tmp_path / "wh" / "_trickle" / "tables" / "department_report")).to_pyarrow_table()
    assert sorted(report.column("division").to_pylist()) == ["Operations", "R&D", "Sales"]
