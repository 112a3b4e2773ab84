"""What one large JSON request body costs the router: peak RSS growth and the time its
answer takes (the event loop is busy decoding meanwhile), at the JSON body cap.

Starts `sloline run` on the no-op pipeline (tests/support/pipelines/noop, 3 identity
stages, FP32 [-1]) with `--max-json-body-bytes`, resets the router's peak RSS
(`/proc/PID/clear_refs`), sends `--parallel` bodies of the given size at once, and reports
the router's peak RSS growth (VmHWM) and the slowest answer. Bodies are the worst case
per byte that is still FP32 data: `1.5,` repeated (4 bytes a value, one float object each).

Usage: `python benchmarks/json_body_memory.py --mib 4 [--limit-mib 4] [--parallel 1]`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOOP = ROOT / "tests" / "support" / "pipelines" / "noop" / "pipeline.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status_kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    assert match, field
    return int(match.group(1))


def body_of(size: int) -> bytes:
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d],"data":['
    count = (size - len(head) - 20) // 4
    head = head % count
    return head + b"1.5," * (count - 1) + b"1.5]}]}"


def post(port: int, body: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v2/models/noop/infer", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, required=True, help="body size, MiB")
    parser.add_argument("--limit-mib", type=float, help="--max-json-body-bytes (default: --mib)")
    parser.add_argument("--parallel", type=int, default=1)
    args = parser.parse_args()
    size = int(args.mib * 1024 * 1024)
    limit = int((args.limit_mib or args.mib) * 1024 * 1024) + 1024
    port, grpc_port = free_port(), free_port()
    log_dir = tempfile.mkdtemp(prefix="json-body-")
    command = [sys.executable, "-m", "sloline", "run", str(NOOP), "--no-plan", "--no-tuner",
               "--port", str(port), "--grpc-port", str(grpc_port), "--status-interval", "0",
               "--log-dir", log_dir, "--max-json-body-bytes", str(limit),
               "--max-connections", "64"]  # fmt: skip
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        small = body_of(200)
        while True:
            try:
                if post(port, small)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or router.poll() is not None:
                raise SystemExit("the router did not start")
            time.sleep(0.2)
        body = body_of(size)
        for _ in range(2):  # warm up the allocator's arenas with a small one
            post(port, small)
        rss = status_kib(router.pid, "VmRSS")
        with open(f"/proc/{router.pid}/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda _: post(port, body), range(args.parallel)))
        peak = status_kib(router.pid, "VmHWM")
        statuses = sorted({status for status, _ in results})
        slowest = max(seconds for _, seconds in results)
        print(
            f"body {len(body) / 2**20:.1f} MiB x {args.parallel}: status {statuses}, router RSS "
            f"{rss / 1024:.0f} MiB -> peak {peak / 1024:.0f} MiB (+{(peak - rss) / 1024:.0f} "
            f"MiB), slowest answer {slowest:.2f} s"
        )
    finally:
        router.terminate()
        router.wait(30)
        os.system(f"rm -rf {log_dir}")  # noqa: S605 - our own temp dir


if __name__ == "__main__":
    main()
