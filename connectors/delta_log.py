"""Metadata reads straight from a Delta table's transaction log, with no Spark job.

A refresh that finds nothing new must cost milliseconds, so "what is the latest version of this source" and
"which frontier does this stream table's last commit record" are answered by listing and reading the
``_delta_log`` JSON files through Hadoop's FileSystem (any storage Spark can reach), never by a query.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

_COMMIT = re.compile(r"^(\d{20})\.json$")
TRICKLE_KEY = "trickle"


def _local(path: str) -> str | None:
    if path.startswith("file:"):
        return path[len("file:"):].replace("///", "/", 1) if path.startswith("file:///") else path[5:]
    return path if "://" not in path else None


class DeltaLog:
    """Reads one table's log. Local paths use the OS directly; others go through Hadoop's FileSystem."""

    def __init__(self, spark: Any, path: str) -> None:
        self.spark = spark
        self.path = path
        self.log_dir = path.rstrip("/") + "/_delta_log"

    def _list(self) -> list[str]:
        local = _local(self.log_dir)
        if local is not None:
            try:
                return os.listdir(local)
            except FileNotFoundError:
                return []
        jvm = self.spark._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(self.log_dir)
        fs = hpath.getFileSystem(self.spark._jsc.hadoopConfiguration())
        if not fs.exists(hpath):
            return []
        return [s.getPath().getName() for s in fs.listStatus(hpath)]

    def _read(self, name: str) -> str | None:
        local = _local(self.log_dir)
        if local is not None:
            try:
                with open(os.path.join(local, name), encoding="utf-8") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        jvm = self.spark._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(self.log_dir + "/" + name)
        fs = hpath.getFileSystem(self.spark._jsc.hadoopConfiguration())
        if not fs.exists(hpath):
            return None
        stream = fs.open(hpath)
        try:
            return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for n in self._list() if (m := _COMMIT.match(n)))

    def latest_version(self) -> int | None:
        """The newest committed version, or None when the path holds no Delta table."""
        vs = self.versions()
        if vs:
            return vs[-1]
        # a log that was checkpointed and cleaned up may keep only checkpoint files
        cp = self._read("_last_checkpoint")
        return int(json.loads(cp)["version"]) if cp else None

    def table_size(self, version: int) -> int | None:
        """Bytes of data files at ``version``, from the commit's checksum file; None when it has none."""
        text = self._read(f"{version:020d}.crc")
        if not text:
            return None
        try:
            return int(json.loads(text)["tableSizeBytes"])
        except (ValueError, KeyError, TypeError):
            return None

    def actions(self, version: int) -> list[dict[str, Any]]:
        text = self._read(f"{version:020d}.json")
        return [json.loads(line) for line in (text or "").splitlines() if line.strip()]

    def commit_info(self, version: int) -> dict[str, Any]:
        for a in self.actions(version):
            if "commitInfo" in a:
                return a["commitInfo"]
        return {}

    def trickle_metadata(self, version: int) -> dict[str, Any] | None:
        """The refresh record spark-trickle wrote into this commit's ``userMetadata``, if any."""
        meta = self.commit_info(version).get("userMetadata")
        if not meta:
            return None
        try:
            doc = json.loads(meta)
        except ValueError:
            return None
        return doc.get(TRICKLE_KEY) if isinstance(doc, dict) else None

    def trickle_metadata_at(self, version: int) -> dict[str, Any] | None:
        """The refresh record the table's contents reflect at ``version``: that commit's, or the newest
        one before it (a commit without a record, e.g. a user's OPTIMIZE, changes no contents)."""
        for v in reversed([v for v in self.versions() if v <= version]):
            meta = self.trickle_metadata(v)
            if meta is not None:
                return meta
        return None

    def truncated_between(self, after: int, upto: int) -> int | None:
        """The first version in (``after``, ``upto``] that emptied the table: a mirror batch that applied a
        CDC truncate (recorded by :mod:`connectors.kafka_mirror`), ``TRUNCATE TABLE``, or a ``DELETE``
        without a condition. Reads only commit infos (small local JSON files, no Spark job)."""
        for v in range(after + 1, upto + 1):
            info = self.commit_info(v)
            op = str(info.get("operation", "")).upper()
            if op == "TRUNCATE" or (op == "DELETE" and (info.get("operationParameters") or {}).get("predicate")
                                    in ("[]", '["true"]', "", None)):
                return v
            meta = info.get("userMetadata")
            if meta and "truncate" in meta:
                try:
                    doc = json.loads(meta)
                except ValueError:
                    continue
                if isinstance(doc, dict) and (doc.get("trickle_mirror") or {}).get("truncate"):
                    return v
        return None

    def inserts_only_between(self, after: int, upto: int) -> bool:
        """Whether every commit in (``after``, ``upto``] only added rows: no ``remove`` of data (a DELETE,
        UPDATE or MERGE that matched rows rewrites or marks files, which removes them), no change-data file
        (written for updates and deletes) and no metadata change. Reads only the commit files (no Spark job).
        A False is safe (the caller picks its general rule), so anything unclear answers False."""
        for v in range(after + 1, upto + 1):
            actions = self.actions(v)
            if not actions:
                return False
            for a in actions:
                if ("remove" in a and (a["remove"] or {}).get("dataChange", True)) or "cdc" in a or "metaData" in a:
                    return False
        return True

    def last_trickle_commit(self) -> tuple[int, dict[str, Any]] | None:
        """The newest commit carrying a refresh record: the frontier the table's contents reflect."""
        for v in reversed(self.versions()):
            meta = self.trickle_metadata(v)
            if meta is not None:
                return v, meta
        return None
