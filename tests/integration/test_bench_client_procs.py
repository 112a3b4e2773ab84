"""The serving benchmark's load generator shared by several processes (`--client-procs`):
each process's share of a command, and one merged answer from real `loadgen.py`
processes driving a real HTTP server."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")  # a benchmark dependency (benchmarks/requirements.txt)
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from loadgen import merge_results, split_command  # noqa: E402
from serving import LoadGenerators  # noqa: E402

ANSWER = b"0123456789"


def test_closed_loop_concurrency_is_shared_over_the_processes() -> None:
    command = {"kind": "closed", "concurrency": 7, "duration_s": 1.0}
    parts = split_command(command, 3)
    assert [p["concurrency"] for p in parts] == [3, 2, 2]
    assert all(p["keep_latencies"] and p["duration_s"] == 1.0 for p in parts)
    assert [p["concurrency"] for p in split_command({**command, "concurrency": 2}, 4)] == [1, 1]


def test_open_loop_arrivals_are_shared_at_proportional_rates_with_own_seeds() -> None:
    command = {"kind": "open", "rate_rps": 100.0, "count": 1001, "seed": 7}
    parts = split_command(command, 2)
    assert [p["count"] for p in parts] == [501, 500]
    assert sum(p["rate_rps"] for p in parts) == pytest.approx(100.0)
    assert parts[0]["rate_rps"] / parts[0]["count"] == pytest.approx(100.0 / 1001)
    assert parts[0]["seed"] != parts[1]["seed"]


def test_sequential_and_single_process_commands_are_not_split() -> None:
    sequential = {"kind": "sequential", "count": 10}
    assert split_command(sequential, 4) == [sequential]
    closed = {"kind": "closed", "concurrency": 8}
    assert split_command(closed, 1) == [closed]


def test_merged_percentiles_come_from_every_process_latencies() -> None:
    fast = {"latencies_s": [0.001] * 98, "rps": 98.0, "concurrency": 2, "window_s": 1.0,
            "client_cpu_s": 0.1, "ok_total": 100, "errors": {"HTTP 503": 1},
            "response_sizes": {"10": 98}}  # fmt: skip
    slow = {"latencies_s": [0.1, 0.1], "rps": 2.0, "concurrency": 1, "window_s": 1.0,
            "client_cpu_s": 0.2, "ok_total": 3, "errors": {"HTTP 503": 2},
            "response_sizes": {"10": 2}}  # fmt: skip
    merged = merge_results([fast, slow])
    assert merged["n"] == 100 and merged["rps"] == 100.0 and merged["concurrency"] == 3
    assert merged["p50_ms"] == pytest.approx(1.0) and merged["max_ms"] == pytest.approx(100.0)
    assert merged["p99_ms"] > 1.0  # the slow process's tail is in the merged tail
    assert merged["client_cpu_s"] == pytest.approx(0.3) and merged["ok_total"] == 103
    assert merged["errors"] == {"HTTP 503": 3} and merged["response_sizes"] == {"10": 100}
    assert merged["client_procs"] == 2 and "latencies_s" not in merged
    assert merge_results([fast, {"failed": "boom"}]) == {"failed": "boom"}


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_two_generator_processes_drive_one_server_and_merge(server: str,
                                                            tmp_path: Path) -> None:  # fmt: skip
    body = tmp_path / "body"
    body.write_bytes(b"x" * 64)
    target = {"url": server, "body_file": str(body), "headers": {},
              "expect_bytes": len(ANSWER)}  # fmt: skip
    clients = LoadGenerators(2, tmp_path)
    try:
        closed = clients.request({**target, "kind": "closed", "concurrency": 3,
                                  "duration_s": 0.5, "warmup_s": 0.1}, 60.0)  # fmt: skip
        opened = clients.request({**target, "kind": "open", "rate_rps": 80.0, "count": 41,
                                  "seed": 1}, 60.0)  # fmt: skip
        sequential = clients.request({**target, "kind": "sequential", "count": 5,
                                      "warmup": 1}, 60.0)  # fmt: skip
    finally:
        clients.close(grace_s=5.0)
    assert closed["client_procs"] == 2 and closed["concurrency"] == 3
    assert closed["n"] > 0 and closed["rps"] == pytest.approx(closed["n"] / 0.5)
    assert closed["errors"] == {} and closed["ok_total"] >= closed["n"]
    assert opened["client_procs"] == 2 and opened["n"] == 41 and opened["errors"] == {}
    assert opened["rate_rps"] == pytest.approx(80.0) and opened["ok_total"] == 41
    assert sequential["n"] == 5 and "client_procs" not in sequential
