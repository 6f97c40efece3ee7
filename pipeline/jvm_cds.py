"""Class data sharing for the driver JVM: the classes a session loads (Spark's, Delta's, the JDK's), parsed and
verified once into an archive that every later JVM maps instead of loading them again.

Why: a local session's JVM spends most of its start loading and verifying classes. Measured on the 2-core
machine, idle, three alternated pairs (docs/BENCHMARKS.md, "Session 71"): a session and its first Delta work
(CREATE, INSERT, a count) 26.9-30.7 s and 43-45 JVM CPU-seconds without the archive, 18.2-22.6 s and 30-33
CPU-seconds with it. The test suite starts two such JVMs and dozens of short-lived ones (spark-submit,
``trickle`` commands, a second application).

On-disk layout: ``<folder>/<key>.jsa``, where the folder is ``jars/cds`` of a source checkout, else
``cds`` in the per-user cache (:func:`pipeline.jvm_jars.cache_dir`), and the key hashes what the archive
was made from (the JDK's release, pyspark's jars and ours, by path and size). A changed JDK or jar gets an
archive of its own; old ones are simply unused. The archive is made by the JVM itself at its exit
(``-XX:ArchiveClassesAtExit``) into a scratch name, then renamed into place, so a half-written archive never
carries the final name.

Made once by ``./dev setup`` (``python -m pipeline.jvm_cds``, 80-100 s there), used by :func:`pipeline.session.
spark_session` whenever it is there. A JVM that finds the archive does not fit (another JDK build, say)
loads its classes the usual way; the JVM's own CDS messages are turned off, so that costs nothing but the
speed. ``TRICKLE_CDS=off`` leaves it out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: keep the JVM quiet about the archive: a mismatch falls back to normal class loading by itself
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def enabled() -> bool:
    return os.environ.get("TRICKLE_CDS", "on").strip().lower() not in ("off", "0", "false", "no")


def archive_path() -> Path | None:
    """Where the archive of this JDK and these jars is (or would be); None when no JDK is found."""
    java = _java()
    if java is None:
        return None
    folder = PROJECT_ROOT / "jars" / "cds"
    if not (PROJECT_ROOT / "jars" / "pom.xml").is_file():
        from pipeline.jvm_jars import cache_dir

        folder = cache_dir() / "cds"
    return folder / f"{_key(java)}.jsa"


def java_options() -> str:
    """The driver JVM's options that map the archive, or "" when there is none (or it is turned off)."""
    if not enabled():
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    if not _plain(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def _plain(path: Path) -> bool:
    """Whether ``path`` can stand in a JVM option string, which the JVM and Spark split on blanks: a
    checkout under a folder with a blank or a quote in its name goes without the archive."""
    return not any(c.isspace() or c in "'\"" for c in str(path))


def _java() -> Path | None:
    """The JDK pyspark starts: ``JAVA_HOME``'s, else the ``java`` on PATH (its real path)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return (Path(home) / "bin" / "java").resolve()
    found = shutil.which("java")
    return Path(found).resolve() if found else None


def _key(java: Path) -> str:
    """A hash of the JDK (its ``release`` file, else the binary's size and time) and of every jar a local
    session reads, by path and size: the JVM checks the archive against its classpath, so a moved checkout
    or virtualenv needs an archive of its own, not a silently unused one."""
    from pipeline.session import local_jars

    h = hashlib.sha256()
    release = java.parent.parent / "release"
    if release.is_file():
        h.update(release.read_bytes())
    else:
        st = java.stat()
        h.update(f"{java}:{st.st_size}:{st.st_mtime_ns}".encode())
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar")) + [Path(j) for j in local_jars()]
    for jar in jars:
        h.update(f"\0{jar}:{jar.stat().st_size}".encode())
    return h.hexdigest()[:16]


def build() -> Path | None:
    """Make the archive unless it is there: a child process starts a session that dumps its classes at its
    JVM's exit, after a small workload of what refreshes load (Delta tables, a MERGE, a stream table and its
    refreshes). Returns the archive's path, None when it could not be made (the reason is printed; sessions
    then start without it)."""
    path = archive_path()
    if path is None or path.is_file():
        return path
    if not _plain(path):
        print(f"spark-trickle: no JVM class archive under {path.parent} (a blank or quote in the path)",
              file=sys.stderr)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".cds.", dir=path.parent))
    try:
        dump = scratch / "classes.jsa"
        run = subprocess.run([sys.executable, "-m", "pipeline.jvm_cds", "--dump", str(dump)],
                             cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
        if run.returncode != 0 or not dump.is_file() or dump.stat().st_size == 0:
            tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
            print(f"spark-trickle: the JVM class archive was not made (sessions start without it):\n{tail}",
                  file=sys.stderr)
            return None
        os.replace(dump, path)
        return path
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _dump(target: str) -> None:
    """The child of :func:`build`: the workload, then a clean JVM exit (the archive is written then)."""
    from pyspark import SparkContext

    from pipeline import StreamTables
    from pipeline.session import SMALL_MACHINE_DEFAULTS, spark_session

    work = Path(tempfile.mkdtemp(prefix="trickle-cds-"))
    try:
        options = f"{SMALL_MACHINE_DEFAULTS['spark.driver.extraJavaOptions']} -XX:ArchiveClassesAtExit={target} {_QUIET}"
        spark = spark_session(app_name="trickle-cds", warehouse=str(work / "warehouse"),
                              conf={"spark.driver.extraJavaOptions": options})
        spark.sql("CREATE TABLE src (id INT, k INT, v DOUBLE) USING delta "
                  "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        spark.sql("INSERT INTO src SELECT id, id % 7, id * 0.5 FROM range(1000)")
        spark.sql("CREATE TABLE dim (k INT, name STRING) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        spark.sql("INSERT INTO dim SELECT id, concat('k', id) FROM range(7)")
        st = StreamTables(spark, root=str(work / "trickle"))
        st.create_stream_table("agg", "SELECT d.name, COUNT(*) AS n, SUM(s.v) AS s FROM src s "
                               "JOIN dim d ON s.k = d.k GROUP BY d.name", refresh_mode="DIFFERENTIAL")
        st.create_stream_table("rows", "SELECT id, v FROM src WHERE v > 10", refresh_mode="FULL")
        spark.sql("MERGE INTO src t USING (SELECT id, id % 5 AS k FROM range(0, 1000, 10)) s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET k = s.k")
        spark.sql("DELETE FROM src WHERE id < 5")
        for name in ("agg", "rows"):
            st.refresh_stream_table(name)
        spark.sql("SELECT * FROM table_changes('src', 1)").collect()
        st.read("agg").collect()
        spark.stop()
    finally:
        gateway = SparkContext._gateway
        if gateway is not None and getattr(gateway, "proc", None) is not None:
            gateway.shutdown()
            gateway.proc.stdin.close()  # the JVM exits when its parent's pipe closes: the archive is written
            gateway.proc.wait(timeout=300)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--dump"] and len(args) == 2:
        _dump(args[1])
        return 0
    if not enabled():
        return 0
    path = archive_path()
    if path is None or path.is_file():
        return 0
    print("spark-trickle: making the driver JVM's class archive (once, about a minute) ...", file=sys.stderr)
    path = build()
    if path is not None:
        print(f"spark-trickle: JVM class archive: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
