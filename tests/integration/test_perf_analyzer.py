"""Triton's real perf_analyzer against `sloline run` of the digits-cascade example, over
HTTP and gRPC: it completes, measures throughput, and reads sloline's server-side
statistics (the server metadata's extensions, the model config's batch size, the stats).

perf_analyzer is a C++ binary from tritonclient's wheel; `make tools` fetches it with
scripts/fetch_perf_analyzer.sh into .tools/ (no root). Without it this test skips.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.test_examples_served import wait_ready
from tests.support.net import free_port
from tests.support.serve import EXAMPLES, ROOT, build_example

PERF_ANALYZER = ROOT / ".tools" / "bin" / "perf_analyzer"

pytestmark = pytest.mark.skipif(
    not os.access(PERF_ANALYZER, os.X_OK),
    reason="perf_analyzer not fetched: run scripts/fetch_perf_analyzer.sh (make tools)",
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    # perf_analyzer stops at its first failed request: serve a copy with a 30 s SLO, so a
    # loaded test machine cannot turn slow answers into 504s (nor admission into 503s).
    build_example("digits-cascade")
    folder = tmp_path_factory.mktemp("perf") / "digits-cascade"
    shutil.copytree(EXAMPLES / "digits-cascade", folder)
    doc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    doc["spec"]["slo"]["latencyMs"] = 30_000
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    http_port, grpc_port = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sloline", "run", str(folder / "pipeline.yaml"),
         "--port", str(http_port), "--grpc-port", str(grpc_port), "--no-plan",
         "--status-interval", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_ready(f"127.0.0.1:{http_port}", process, timeout_s=120)
        yield http_port, grpc_port
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, output


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_sloline(served, protocol: str, tmp_path: Path) -> None:
    http_port, grpc_port = served
    port = http_port if protocol == "http" else grpc_port
    out = tmp_path / "results.csv"
    result = subprocess.run(
        [str(PERF_ANALYZER), "-m", "digits-cascade", "-i", protocol, "-u", f"127.0.0.1:{port}",
         "-b", "2",  # rows per request: within the config's max_batch_size
         "--concurrency-range", "2", "--measurement-interval", "500", "--max-trials", "4",
         "--stability-percentage", "999", "-f", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "error" not in report.lower(), report
    (row,) = list(csv.DictReader(out.open()))
    assert float(row["Inferences/Second"]) > 0, report
    # Server-side statistics: perf_analyzer asked for them and split the server's time.
    assert "Server:" in report and "Successful request count" in report, report
    assert int(row["Server Compute Infer"]) > 0, report
