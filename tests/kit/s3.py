"""A real S3 endpoint for the tests: moto's server mode on 127.0.0.1, one per test session.

moto keeps objects in memory and speaks the S3 REST API over HTTP, including conditional
writes (``If-None-Match: *``), multipart uploads and ``DeleteObjects``; clients reach it through
the standard ``AWS_*`` variables, exactly as they would reach AWS.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kit.polling import wait_until

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    pid: int

    def env(self) -> dict[str, str]:
        """The AWS variables that point a client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": "snapflow-test",
            "AWS_SECRET_ACCESS_KEY": "snapflow-test-secret",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's server on a free port of 127.0.0.1; stop it (by PID) on exit."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _answers(url),
            f"moto's S3 server on {url}",
            timeout_s=START_TIMEOUT_S,
            interval_s=0.05,
            procs=[proc],
        )
        yield S3Server(url, proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def create_bucket(server: S3Server, name: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=server.env()["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=server.env()["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
