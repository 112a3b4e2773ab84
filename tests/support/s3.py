"""A real S3-compatible server for tests: moto's server mode (`moto_server`, a separate
HTTP server process implementing the S3 API, from the `dev` extras) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.net import free_port

# What clients (boto3, the storage initializer through its Secret) need besides the endpoint.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Run moto's S3 server until the block ends; yields its endpoint URL. Skips the test
    where boto3 or moto's server is not installed."""
    pytest.importorskip("boto3", reason="s3:// needs boto3 (pip install 'sloline[s3]')")
    binary = Path(sys.executable).parent / "moto_server"
    if shutil.which("moto_server", path=str(binary.parent)) is None:
        pytest.skip("no S3-compatible server: install moto[server] (make tools)")
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("the S3 server did not start")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
