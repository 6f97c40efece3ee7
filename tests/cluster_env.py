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


def submit_jars() -> list[str]:
    """spark-submit's arguments for the jars set-up fetched, split as ``pipeline.session`` splits them: the
    Delta and Kafka jars shipped with ``--jars``, the AWS SDK bundle and hadoop-aws
    (``CLASSPATH_ONLY_JARS``) read in place from the driver's and executors' class path.

    Why: every ``--jars`` entry is fetched by each executor (the driver's own in local mode) into a scratch
    folder of its own. For the 640 MB bundle that was about 10 s and 640 MB of disk per executor and per
    run, in tests that never touch S3; driver and executors run on this machine, so the path is enough.
    """
    from pipeline.session import CLASSPATH_ONLY_JARS, local_jars

    jars = local_jars()
    assert jars, "set-up did not fetch the Delta and Kafka jars (jars/lib)"
    shipped = [j for j in jars if not Path(j).name.startswith(CLASSPATH_ONLY_JARS)]
    in_place = os.pathsep.join(j for j in jars if Path(j).name.startswith(CLASSPATH_ONLY_JARS))
    args = ["--jars", ",".join(shipped)]
    if in_place:
        args += ["--driver-class-path", in_place, "--conf", f"spark.executor.extraClassPath={in_place}"]
    return args


#: The JIT setting of the JVMs these tests start in child processes (spark-submit and its launcher, the
#: executors a local-cluster worker forks, spark-sql, a ``trickle`` command): C1 only, as the Kafka and
#: Connect services already run. They live for seconds to a few minutes, mostly starting up, and C2's
#: compiler threads compete for the machine's two cores with the work itself: a session start, a stream
#: table and five refreshes took 46-49 s instead of 78-95 s (wall, loaded machine, alternated). The test
#: session's own JVM keeps C2: a long refresh loop is faster with it (docs/BENCHMARKS.md, JIT).
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"


def short_lived_jvm(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`SHORT_LIVED_JVM` in ``JAVA_TOOL_OPTIONS``, which every JVM reads at start, the
    ones Spark forks itself included (they inherit the environment); options already there stay."""
    from pipeline import jvm_cds

    # and the class archive the test session's own JVM maps (pipeline/jvm_cds.py): a JVM whose classpath it
    # does not fit (spark-submit's launcher, an executor) loads its classes as before
    options = " ".join(filter(None, (env.get("JAVA_TOOL_OPTIONS"), SHORT_LIVED_JVM, jvm_cds.java_options())))
    return {**env, "JAVA_TOOL_OPTIONS": options}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that must not find the repository: no PYTHONPATH, no
    TRICKLE_* settings of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("TRICKLE_", "PYSPARK_"))}
    env.update(extra)
    return env
