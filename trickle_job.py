"""The ``spark-submit`` entry point: run a conf file's pipeline (the same job as ``trickle run``).

    spark-submit --jars "$(ls jars/lib/*.jar | grep -v -e /bundle- -e /hadoop-aws- | paste -sd, -)" trickle_job.py conf/pipeline.yaml [--json]
    spark-submit ... trickle_job.py demo --warehouse /data/demo   # any other ``trickle`` command

A first argument that names a ``trickle`` command runs that command; anything else is a conf file for
``run``. On a cluster the package reaches the driver and the executors' Python workers as a zip given to
``--py-files`` (see the README's "Deploying on a cluster"); copied away from the repository, this file then
imports everything from that zip.

Why a file at the root: spark-submit runs a *file* as ``__main__`` with that file's folder on
``sys.path``, so this is where the ``pipeline``, ``dvm`` and ``connectors`` packages import from without
an install. Settings given to spark-submit (``--master``, ``--conf``, ``--jars``) win over the
small-machine defaults; the conf file's ``spark:`` mapping wins over both. Exit status as ``trickle run``:
0 after SIGTERM/SIGINT once the current micro-batches are committed, 2 on a configuration error or when
a Kafka source's brokers do not answer at start. When the JVM itself gets SIGTERM (spark-submit's driver),
it exits with 143 after the pipeline stopped (see ``pipeline.cli._JvmStopHook``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline.cli import main  # noqa: E402


def _argv(args: list[str]) -> list[str]:
    """``run CONF`` unless the first argument already names a command of the CLI."""
    from pipeline.cli import build_parser

    commands = next(a.choices for a in build_parser()._actions if a.dest == "command")
    return args if args and args[0] in commands else ["run", *args]


if __name__ == "__main__":
    sys.exit(main(_argv(sys.argv[1:])))
