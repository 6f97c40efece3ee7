"""Where the JVM jars spark-trickle adds to pyspark's come from (Delta, Kafka, S3A: ``jars/pom.xml``), in a
source checkout and in an installed wheel alike.

First found wins:

1. ``TRICKLE_JARS_DIR``: a folder the user filled (a cluster's shared copy, an image's).
2. A source checkout: ``jars/lib``, which ``./dev setup`` fills with Maven.
3. An installed package: a per-user cache, ``$TRICKLE_CACHE_DIR`` or ``$XDG_CACHE_HOME/spark-trickle`` or
   ``~/.cache/spark-trickle``, under ``jars/<key>``. The wheel carries ``pom.xml`` and our Java sources
   (``setup.py`` copies them into ``pipeline/jvm``), and the first Spark session of an installed trickle
   runs the same Maven command as ``./dev setup`` on them.

Why Maven, as ``./dev setup`` does, and not a downloader of our own: the pom is the one list of artifacts
and versions, Maven honours the user's ``~/.m2/settings.xml`` (mirrors, proxies, credentials) and reuses
``~/.m2``, so nothing already there is downloaded again.

Why the cache folder is named by a hash of the pom and the Java sources: an upgraded package that pins other
versions gets a folder of its own instead of mixing jars of two Delta releases on one classpath.

Idempotent and safe when several processes start at once: a complete folder holds a stamp file and is used
as it is (no Maven call: offline from then on); fetching takes a lock file, fetches into a scratch folder
and renames it into place, so an interrupted fetch never looks complete and is simply done again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from dvm import TrickleError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: the stamp a complete cache folder holds (its content: the key)
STAMP = ".trickle-jars-complete"
#: our S3 log store (jars/src), compiled when a JDK is present: only needed on S3 with several writers
LOGSTORE_JAR = "trickle-logstore.jar"


class JarsError(TrickleError):
    """The jars could not be found or fetched; the message says how to get them."""


def jars_dir(fetch: bool = True) -> Path:
    """The folder of the extra jars (see the module docstring for which). An installed package fetches them
    on first use unless ``fetch`` is false (then the cache folder is returned, complete or not)."""
    given = os.environ.get("TRICKLE_JARS_DIR")
    if given:
        return Path(given)
    if (PROJECT_ROOT / "jars" / "pom.xml").is_file():  # a source checkout: ./dev setup fills jars/lib
        return PROJECT_ROOT / "jars" / "lib"
    shipped = _shipped()
    if shipped is None:  # neither a checkout nor a wheel built by setup.py: nothing to fetch from
        return PROJECT_ROOT / "jars" / "lib"
    pom, sources = shipped
    folder = cache_dir() / "jars" / _key(pom, sources)
    if fetch and not (folder / STAMP).is_file():
        _fetch(folder, pom, sources)
    return folder


def cache_dir() -> Path:
    """The per-user cache of spark-trickle (``$TRICKLE_CACHE_DIR``, else the XDG cache folder)."""
    given = os.environ.get("TRICKLE_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "spark-trickle"


def _shipped() -> tuple[bytes, dict[str, bytes]] | None:
    """The pom and the Java sources (relative path -> bytes) the installed wheel carries, None if absent."""
    root = resources.files("pipeline") / "jvm"
    pom = root / "pom.xml"
    if not pom.is_file():
        return None
    sources: dict[str, bytes] = {}

    def walk(node: Traversable, rel: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{rel}{child.name}/")
            elif child.name.endswith(".java"):
                sources[f"{rel}{child.name}"] = child.read_bytes()

    src = root / "src"
    if src.is_dir():
        walk(src, "")
    return pom.read_bytes(), sources


def _key(pom: bytes, sources: dict[str, bytes]) -> str:
    h = hashlib.sha256(pom)
    for rel in sorted(sources):
        h.update(rel.encode() + b"\0" + sources[rel])
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) for the block: one fetch per cache folder at a time."""
    import fcntl

    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _say(text: str) -> None:
    print(f"spark-trickle: {text}", file=sys.stderr, flush=True)


def _fetch(folder: Path, pom: bytes, sources: dict[str, bytes]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.parent / f"{folder.name}.lock"):
        if (folder / STAMP).is_file():  # another process fetched them while this one waited
            return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise JarsError(
                "spark-trickle needs the Delta and Kafka jars listed in its pom.xml and fetches them once with "
                f"Apache Maven into {folder}, but 'mvn' is not on PATH. Install Maven (Debian/Ubuntu: apt-get "
                "install maven; or https://maven.apache.org/download.cgi) and run again, or set TRICKLE_JARS_DIR "
                "to a folder that holds those jars")
        _say(f"fetching the JVM jars with Maven into {folder} (once; later runs are offline) ...")
        scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            (scratch / "pom.xml").write_bytes(pom)
            lib = scratch / "lib"
            done = subprocess.run([mvn, "-B", "-q", "-f", str(scratch / "pom.xml"), "dependency:copy-dependencies",
                                   f"-DoutputDirectory={lib}"], capture_output=True, text=True)
            if done.returncode != 0 or not any(lib.glob("*.jar")):
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
                raise JarsError(f"Maven could not fetch spark-trickle's jars into {folder} (exit "
                                f"{done.returncode}); it needs network access (or a ~/.m2 that holds them) once, "
                                f"or set TRICKLE_JARS_DIR to a folder that holds them. Maven said:\n{tail}")
            if sources:
                _build_logstore(lib, sources)
            (lib / STAMP).write_text(folder.name + "\n")
            if folder.exists():  # no stamp, so not one of ours (ours appear whole, by rename): replace it
                shutil.rmtree(folder)
            os.replace(lib, folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _build_logstore(lib: Path, sources: dict[str, bytes]) -> None:
    """Compile our Java sources (the S3 log store) into ``lib/trickle-logstore.jar`` against pyspark's and the
    fetched jars, as ``./dev setup`` does; skipped with a note when no JDK is on PATH (only S3 needs it)."""
    javac = shutil.which("javac")
    if javac is None:
        _say("javac not found: io.sparktrickle.S3ConditionalLogStore not built (only needed on S3 with several "
             "writing processes; see the README's 'Object storage')")
        return
    import pyspark

    classpath = [*sorted(str(p) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")),
                 *sorted(str(p) for p in lib.glob("delta-storage-*.jar"))]
    with tempfile.TemporaryDirectory() as work:
        src, out = Path(work, "src"), Path(work, "classes")
        files = []
        for rel, text in sources.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(text)
            files.append(str(src / rel))
        out.mkdir()
        done = subprocess.run([javac, "-nowarn", "--release", "17", "-cp", os.pathsep.join(classpath), "-d",
                               str(out), *files], capture_output=True, text=True)
        if done.returncode != 0:
            raise JarsError(f"javac could not compile spark-trickle's S3 log store:\n{done.stderr[-3000:]}")
        with zipfile.ZipFile(lib / LOGSTORE_JAR, "w", zipfile.ZIP_DEFLATED) as jar:
            for cls in sorted(out.rglob("*.class")):
                jar.write(cls, cls.relative_to(out).as_posix())


def main() -> int:
    """``python -m pipeline.jvm_jars``: fetch the jars if needed and print their folder, for the ``--jars`` of
    ``spark-submit`` or ``spark-sql`` (see the README's "Deploying on a cluster")."""
    try:
        print(jars_dir())
    except JarsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
