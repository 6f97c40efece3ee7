"""What the deployment tests share: the package built as a user builds it, and a Python that lacks it.

Why a Python without the package: the test venv has an *editable* install of this clone, so any process
started with it imports ``pipeline`` from the repository and would hide a package that never reached the
executors. :func:`deps_only_python` makes a venv that sees the dependencies (pyspark, pyarrow, ...) of the
test venv but not spark-trickle itself: whatever imports ``pipeline`` there got it from what was shipped
or installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def source_copy(dest: Path) -> Path:
    """The files git tracks, copied to ``dest``: building there leaves no ``build/`` or egg-info in the
    clone, and proves the package builds from what is committed (not from untracked local files)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, check=True, capture_output=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = PROJECT_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def build_wheel(work: Path) -> Path:
    """``pip wheel . --no-deps`` as the README says, from a copy of the sources; returns the wheel."""
    src = source_copy(work / "src")
    out = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", str(out)],
                   cwd=src, check=True, capture_output=True)
    (wheel,) = out.glob("spark_trickle-*.whl")
    return wheel


def deps_only_python(work: Path) -> Path:
    """A venv whose ``sys.path`` has the test venv's site-packages as a plain path, so its packages import
    but the editable install's import hook (a ``.pth`` inside that folder) is never run."""
    venv = work / "venv"
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "test_venv_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def spark_home(work: Path) -> Path:
    """A SPARK_HOME for the pip-installed Spark: its ``bin``, ``jars`` and ``python`` linked into a folder of
    our own, so the standalone workers of ``local-cluster`` write their ``work/`` folder there and not into
    the venv's pyspark package."""
    import pyspark

    pkg = Path(pyspark.__file__).parent
    home = work / "spark_home"
    home.mkdir(exist_ok=True)
    for name in ("bin", "jars", "python"):
        link = home / name
        if not link.exists():
            link.symlink_to(pkg / name)
    return home


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that must not find the repository: no PYTHONPATH, no
    TRICKLE_* settings of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("TRICKLE_", "PYSPARK_"))}
    env.update(extra)
    return env
