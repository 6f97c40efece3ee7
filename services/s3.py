"""A real S3-compatible server as a local process (moto's server), for the object-store tests.

Why a server and not a mock: the code under test talks S3 through Hadoop's S3A connector (a JVM, the
AWS SDK, HTTP), exactly as it would against AWS; only a server on a socket is reachable from there.
moto's server speaks the S3 REST protocol, including conditional writes (``If-None-Match: *``), which
put-if-absent relies on (see :mod:`connectors.storage`). It installs from PyPI (``moto[server]``, in the
``test`` extra); no Docker, no binary download.

Usage::

    with S3Server() as s3:                     # a child process on a free loopback port
        s3.create_bucket("wh")
        s3.hadoop_conf()                        # {"fs.s3a.endpoint": ..., ...}: Spark's settings without
                                                # the "spark.hadoop." prefix
        s3.spark_conf()                         # the same with it, for a conf file or spark_session(conf=)

The server keeps everything in memory: stopping it forgets every bucket.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from types import TracebackType
from typing import Any

__all__ = ["S3Server"]

HOST = "127.0.0.1"  # loopback only
#: moto accepts any credentials; these are not secrets, only non-empty values the SDK insists on
ACCESS_KEY = "trickle-test"
SECRET_KEY = "trickle-test-secret"
REGION = "us-east-1"
LOG_STORE_KEY, LOG_STORE = "spark.delta.logStore.s3a.impl", "io.sparktrickle.S3ConditionalLogStore"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server (``moto_server``) as a child process on a free loopback port. A process and not a
    thread of the caller: the server then never waits for the caller's GIL (a test's Spark driver in Python
    holds it between its JVM calls), and a ``trickle run`` child reaches it the same way."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float = 60) -> S3Server:
        code = "import logging, sys; from moto.server import main; logging.getLogger('werkzeug').setLevel(logging.ERROR); main(sys.argv[1:])"
        self._proc = subprocess.Popen([sys.executable, "-c", code, "-H", HOST, "-p", str(self.port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=1):
                return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto's S3 server did not start on {self.endpoint} (is moto[server] installed?)")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def client(self) -> Any:
        """A boto3 S3 client of this server (for set-up and for checking what landed)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def hadoop_conf(self) -> dict[str, str]:
        """S3A settings reaching this server: path-style requests (no bucket DNS names), plain HTTP, static
        keys, and conditional creates on (put-if-absent, see :mod:`connectors.storage`)."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": ACCESS_KEY,
            "fs.s3a.secret.key": SECRET_KEY,
            "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "fs.s3a.create.conditional.enabled": "true",
            "fs.s3a.attempts.maximum": "3",
            "fs.s3a.retry.limit": "3",
        }

    def spark_conf(self) -> dict[str, str]:
        """:meth:`hadoop_conf` as Spark settings, and Delta's log store for several writing processes on S3
        (``jars/src/io/sparktrickle/S3ConditionalLogStore.java``, built by ``./dev setup``)."""
        return {**{f"spark.hadoop.{k}": v for k, v in self.hadoop_conf().items()}, LOG_STORE_KEY: LOG_STORE}
