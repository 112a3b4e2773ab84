"""A real Prometheus server (the Debian package) for tests: scrapes every second, stores
into the test's directory, listens on a loopback port, stops with the test (or, through
`setpriv --pdeathsig`, with the test process).

`make test` fetches the Debian package's binaries into `.tools/bin` when `prometheus` is
not on PATH (`scripts/fetch_prometheus.sh`, no root needed); without either, tests that
need it skip and say why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[2] / ".tools" / "bin"


def find_tool(name: str) -> str | None:
    """`prometheus` or `promtool` on PATH, else in `.tools/bin`."""
    return shutil.which(name) or shutil.which(name, path=str(TOOLS))


def tool(name: str) -> str:
    """`find_tool(name)`, or skip the test saying how to get it."""
    binary = find_tool(name)
    if binary is None:
        pytest.skip(
            f"{name} is not installed (scripts/fetch_prometheus.sh, or apt-get install prometheus)"
        )
    return binary


class Prometheus:
    """Scrapes `targets` (host:port, `/metrics`) and any further `scrape_configs`."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        port: int,
        *,
        scrape_configs: Sequence[dict[str, Any]] = (),
        retention: str = "1h",
    ) -> None:
        binary = tool("prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"
        jobs = list(scrape_configs)
        if targets:
            jobs.insert(0, {"job_name": "sloline", "static_configs": [{"targets": targets}]})
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": jobs,
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config, indent=1))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [  # noqa: S607 - setpriv from util-linux, on PATH
                    "setpriv", "--pdeathsig", "KILL", "--", binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--storage.tsdb.retention.time={retention}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
            )  # fmt: skip

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus did not become ready; see {self.log_path}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            result: list[dict[str, Any]] = json.load(r)["data"]["result"]
            return result

    def targets(self) -> list[dict[str, Any]]:
        """The active targets as Prometheus sees them (labels, health, lastError)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as r:
            active: list[dict[str, Any]] = json.load(r)["data"]["activeTargets"]
            return active

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Prometheus:
        self.wait_ready()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
