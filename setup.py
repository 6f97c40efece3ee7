"""Packaging hook; everything else is declared in pyproject.toml.

The wheel carries the JVM jar list (``jars/pom.xml``) and our Java sources (``jars/src``) as
``pipeline/jvm/``, so an installed trickle fetches the same jars with Maven on first use
(:mod:`pipeline.jvm_jars`). They stay where ``./dev setup`` and the README expect them in the repository
(one copy), and are copied into the build only: an editable install reads ``jars/`` in place.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        jars = ROOT / "jars"
        out = Path(self.build_lib) / "pipeline" / "jvm"
        for src in [jars / "pom.xml", *sorted((jars / "src").rglob("*.java"))]:
            dest = out / src.relative_to(jars)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPy})
