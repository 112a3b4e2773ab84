"""A real Prometheus server (the Debian package) for tests: scrapes given targets every
second, stores into a temp dir, listens on a free loopback port, stops with the test."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
        self.url = f"http://127.0.0.1:{port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {"job_name": "sloline", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.process.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["data"]["result"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
