"""The driver JVM's class archive (pipeline/jvm_cds.py): found by its key, mapped by the sessions, left out on
request, and never made twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import jvm_cds


def test_options_name_the_archive_only_when_it_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    path = jvm_cds.archive_path()
    assert path is not None and path.suffix == ".jsa"
    assert jvm_cds.archive_path() == path  # the key is stable for one JDK and one jar set
    if path.is_file():
        assert f"-XX:SharedArchiveFile={path}" in jvm_cds.java_options()
        assert jvm_cds.build() == path  # there already: nothing made again
    else:
        assert jvm_cds.java_options() == ""
    monkeypatch.setenv("TRICKLE_CDS", "off")
    assert jvm_cds.java_options() == ""


def test_a_path_with_a_blank_goes_without_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JVM option strings split on blanks: such a path would break the JVM's start, so it is left out."""
    archive = tmp_path / "my checkout" / "x.jsa"
    archive.parent.mkdir()
    archive.write_bytes(b"not made")
    monkeypatch.setattr(jvm_cds, "archive_path", lambda: archive)
    assert jvm_cds.java_options() == ""
    missing = tmp_path / "my checkout" / "y.jsa"
    monkeypatch.setattr(jvm_cds, "archive_path", lambda: missing)
    assert jvm_cds.build() is None and not missing.exists()  # nor made: no child JVM started


def test_the_test_session_maps_the_archive_set_up_made(spark: Any) -> None:
    """``./dev test`` makes the archive at set-up; the session's JVM was started with it and shares classes.
    Whether the JVM took this archive or silently fell back to the JDK's own shows only in the start time
    (docs/BENCHMARKS.md, "Session 71"), not here."""
    path = jvm_cds.archive_path()
    arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    if not jvm_cds.enabled():  # TRICKLE_CDS=off: the session starts without it
        assert not any(a.startswith("-XX:SharedArchiveFile=") for a in arguments)
        return
    if path is None or not path.is_file():
        pytest.fail(f"no JVM class archive at {path}: ./dev setup makes it (python -m pipeline.jvm_cds)")
    assert f"-XX:SharedArchiveFile={path}" in arguments
    assert "sharing" in spark._jvm.java.lang.System.getProperty("java.vm.info")
