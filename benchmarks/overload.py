"""Overload benchmark: goodput under 1x, 2x and 5x capacity, admission on and off.

The pipeline (`benchmarks/pipelines/overload`) has a cheap first stage and a stage that
sleeps a fixed 20 ms per batch of up to 4, one replica each: its capacity is set by its
worker (at most 200 rps), well under what the router can parse on 2 cores, so the
overload is the pipeline's. `sloline run --no-plan --no-tuner` serves it (no tuner: the
capacity must stay put), once with deadline-aware admission (the default) and once with
`--no-admission`.

Capacity is measured first, on the server without admission (closed loop, 32
connections, 200s per second; with admission a closed loop spins on fast 503s); then
each server gets the open loop at 1x, 2x and 5x that capacity: Poisson arrivals spread over
`--connections` client connections (one connection per simulated client, opened and
warmed before the run; a client whose previous request is unanswered queues the next
one behind it, as HTTP/1.1 does), latency measured from each request's scheduled send
time (no coordinated omission). Two client processes share the connections.

Reported per run: goodput (200s within the SLO per second of the run), counts of 200,
503 (shed), 504 (deadline) and other answers, p50/p99 of 200s (admitted and answered),
p99 of every answer (client side), p99 of the 503s (how fast shedding is), the router's
shed counts by reason and the event loop lag from `/metrics`, and the CPU of the server
tree and of the clients.

`--routers N` serves with N routers (`sloline run --routers N`): they share the client
port and the two workers, each admitting on its own; the shed counts and loop lag are
summed over every router's `/metrics`.

Usage: ``python benchmarks/overload.py [--duration 15] [--connections 1000]
[--multipliers 1 2 5] [--routers 1] [--out benchmarks/results/overload.json]``;
``--quick`` runs 4 s per point with 200 connections (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from systems import CpuMeter, free_port, stop_tree, wait_http

HERE = Path(__file__).resolve().parent
PIPELINE = HERE / "pipelines" / "overload" / "pipeline.yaml"
SLO_S = 0.100
BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}]}
).encode()
CLIENT_PROCESSES = 2


# ---------------------------------------------------------------- client (own process)


async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    """One client process: `connections` sessions of one connection each."""
    import aiohttp

    url, rate, duration_s = spec["url"], spec["rate_rps"], spec["duration_s"]
    n = spec["connections"]
    timeout = aiohttp.ClientTimeout(total=30.0)
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, force_close=False), timeout=timeout
        )
        for _ in range(n)
    ]
    headers = {"Content-Type": "application/json"}
    live = url.split("/v2/")[0] + "/v2/health/live"
    # Open every connection before the run, paced so opening them is no burst.
    for i in range(0, n, 50):
        await asyncio.gather(*(s.get(live) for s in sessions[i : i + 50]))
        await asyncio.sleep(0.02)
    gaps = np.random.default_rng(spec["seed"]).exponential(1.0 / rate, int(rate * duration_s * 1.2))
    schedule = np.cumsum(gaps)
    schedule = schedule[schedule < duration_s]
    records: list[tuple[int, float, float]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def fire(session: aiohttp.ClientSession, at: float) -> None:
        try:
            async with session.post(url, data=BODY, headers=headers) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        records.append((status, time.perf_counter() - at, at - start))

    # No collector pauses in the client during the run: they would delay sends and
    # count as server latency.
    gc.collect()
    gc.freeze()
    gc.disable()
    cpu0 = time.process_time()
    start = time.perf_counter()
    for i, offset in enumerate(schedule):
        at = start + float(offset)
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(fire(sessions[i % n], at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=40)
    cpu = time.process_time() - cpu0
    for s in sessions:
        await s.close()
    return {"records": records, "client_cpu_s": cpu, "sent": len(schedule)}


async def _closed(url: str, concurrency: int, duration_s: float) -> float:
    """200s per second with `concurrency` clients sending back to back."""
    import aiohttp

    ok = 0
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        end = time.perf_counter() + duration_s

        async def loop() -> None:
            nonlocal ok
            while time.perf_counter() < end:
                async with s.post(url, data=BODY, headers=headers) as resp:
                    await resp.read()
                    ok += resp.status == 200

        warm = time.perf_counter() + 1.0
        while time.perf_counter() < warm:  # warm up: the router's model, the workers
            async with s.post(url, data=BODY, headers=headers) as resp:
                await resp.read()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return ok / duration_s


def client_main() -> None:
    import uvloop

    spec = json.loads(sys.stdin.read())
    if spec["kind"] == "closed":
        coro = _closed(spec["url"], spec["concurrency"], spec["duration_s"])
        result: Any = {"rps": uvloop.run(coro)}
    else:
        result = uvloop.run(_client(spec))
    # A file, not stdout: the event loop may have left stdout non-blocking.
    Path(spec["out"]).write_text(json.dumps(result))


# ---------------------------------------------------------------- orchestrator


def run_clients(spec: dict[str, Any], processes: int) -> list[dict[str, Any]]:
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(processes):
            part = {
                **spec,
                "seed": spec.get("seed", 0) * 100 + i,
                "rate_rps": spec["rate_rps"] / processes,
                "connections": spec["connections"] // processes,
                "out": str(Path(tmp) / f"client-{i}.json"),
            }
            p = subprocess.Popen([sys.executable, __file__, "--client"], stdin=subprocess.PIPE)
            assert p.stdin is not None
            p.stdin.write(json.dumps(part).encode())
            p.stdin.close()
            procs.append((p, Path(part["out"])))
        out = []
        for p, path in procs:
            if p.wait(spec.get("duration_s", 10) + 120) != 0:
                raise RuntimeError(f"client pid {p.pid} failed (code {p.returncode})")
            out.append(json.loads(path.read_text()))
    return out


def scrape(metrics_urls: list[str]) -> dict[str, float]:
    """The shed counts and loop-lag series, summed over the routers' `/metrics`."""
    out: dict[str, float] = {}
    for url in metrics_urls:
        for key, value in _scrape(url).items():
            out[key] = out.get(key, 0.0) + value
    return out


def _scrape(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'sloline_admission_rejected_total\{.*reason="(\w+)"\} (\S+)', line)
        if m:
            out[f"rejected_{m.group(1)}"] = float(m.group(2))
        m = re.match(r"sloline_event_loop_lag_seconds_(sum|count)\{.*\} (\S+)", line)
        if m:
            out[f"lag_{m.group(1)}"] = float(m.group(2))
        m = re.match(r'sloline_event_loop_lag_seconds_bucket\{.*le="([^"]+)".*\} (\S+)', line)
        if m:
            out[f"lag_le_{m.group(1)}"] = float(m.group(2))
    return out


def lag_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float | None:
    """The `q` quantile's bucket bound of the loop lag between two scrapes."""
    bounds = sorted(
        (float(k[7:]), after[k] - before.get(k, 0.0))
        for k in after
        if k.startswith("lag_le_") and k != "lag_le_+Inf"
    )
    total = after.get("lag_count", 0.0) - before.get("lag_count", 0.0)
    if total <= 0:
        return None
    for bound, cumulative in bounds:
        if cumulative >= q * total:
            return bound
    return float("inf")


def summarize(parts: list[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    records = [r for p in parts for r in p["records"]]
    status = np.array([r[0] for r in records])
    latency = np.array([r[1] for r in records]) * 1e3
    sent_at = np.array([r[2] for r in records])
    ok = status == 200
    steady = sent_at >= 2.0  # after the first 2 s: the queue and the model have settled

    def pct(values: np.ndarray, q: float) -> float | None:
        return float(np.percentile(values, q)) if len(values) else None

    codes: dict[str, int] = {}
    for s in status.tolist():
        codes[str(s)] = codes.get(str(s), 0) + 1
    good = int(np.count_nonzero(ok & (latency <= SLO_S * 1e3)))
    return {
        "sent": sum(p["sent"] for p in parts),
        "offered_rps": sum(p["sent"] for p in parts) / duration_s,
        "codes": codes,
        "goodput_rps": good / duration_s,
        "ok_p50_ms": pct(latency[ok], 50),
        "ok_p99_ms": pct(latency[ok], 99),
        "ok_p99_ms_after_2s": pct(latency[ok & steady], 99),
        "all_p99_ms": pct(latency, 99),
        "shed_p99_ms": pct(latency[status == 503], 99),
        "client_cpu_s": sum(p["client_cpu_s"] for p in parts),
    }


def serve(
    admission: bool, run_dir: Path, routers: int
) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    """`sloline run` of the pipeline; its process, HTTP port and every router's /metrics."""
    port, grpc_port = free_port(), free_port()
    argv = [
        sys.executable,
        "-m",
        "sloline",
        "run",
        str(PIPELINE),
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        "--no-plan",
        "--no-tuner",
        "--status-interval",
        "0",
        "--duration",
        "3600",
        "--replicas",
        "prep=1",
        "--replicas",
        "work=1",
        "--log-dir",
        str(run_dir / f"workers-{admission}"),
    ]
    if not admission:
        argv.append("--no-admission")
    argv += ["--routers", str(routers)]
    log_path = run_dir / f"sloline-{admission}.log"
    log = open(log_path, "ab")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    wait_http(f"http://127.0.0.1:{port}/v2/health/ready", None, 120, "sloline")
    metrics = [f"http://127.0.0.1:{port}/metrics"]
    if routers > 1:  # the banner names each router's /metrics port
        deadline = time.monotonic() + 60
        while len(metrics) < 2 and time.monotonic() < deadline:
            banner = [ln for ln in log_path.read_text().splitlines() if "/metrics" in ln]
            metrics = re.findall(r"http://[\d.:]+/metrics", banner[-1]) if banner else []
            time.sleep(0.2)
        for url in metrics:
            wait_http(url, None, 60, "a router's /metrics")
    return proc, port, metrics


def main() -> int:
    if "--client" in sys.argv:
        client_main()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--multipliers", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    ap.add_argument("--admission", nargs="+", choices=["on", "off"], default=["off", "on"])
    ap.add_argument("--capacity", type=float, help="skip measuring it: rps")
    ap.add_argument("--routers", type=int, default=1, help="sloline run --routers")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.duration, args.connections = 4.0, 200
    run_dir = Path(tempfile.mkdtemp(prefix="sloline-overload-"))
    print(f"run dir {run_dir}", file=sys.stderr)
    results: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/overload.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "slo_ms": SLO_S * 1e3,
        "duration_s": args.duration,
        "connections": args.connections,
        "routers": args.routers,
        "servers": {},
    }
    if args.capacity:
        results["capacity_rps"] = args.capacity
    for admission in [mode == "on" for mode in args.admission]:
        name = "admission on" if admission else "admission off"
        proc, port, metrics = serve(admission, run_dir, args.routers)
        url = f"http://127.0.0.1:{port}/v2/models/overload/infer"
        try:
            capacity = (
                results.get("capacity_rps")
                or run_clients(
                    {
                        "kind": "closed",
                        "url": url,
                        "concurrency": 32,
                        "duration_s": 6.0,
                        "rate_rps": 0,
                        "connections": 32,
                    },
                    1,
                )[0]["rps"]
            )
            results["capacity_rps"] = capacity
            print(f"[{name}] capacity (closed loop, 32 conns): {capacity:.0f} rps", file=sys.stderr)
            runs = []
            for mult in args.multipliers:
                time.sleep(2.0)
                load_before = os.getloadavg()[0]
                before = scrape(metrics)
                meter = CpuMeter(proc.pid)
                meter.start()
                parts = run_clients(
                    {
                        "kind": "open",
                        "url": url,
                        "rate_rps": mult * capacity,
                        "duration_s": args.duration,
                        "connections": args.connections,
                        "seed": int(mult * 10),
                    },
                    CLIENT_PROCESSES,
                )
                cpu = meter.stop()
                after = scrape(metrics)
                row = {
                    "multiplier": mult,
                    "loadavg_1m_before": load_before,
                    "rate_rps": mult * capacity,
                    **summarize(parts, args.duration),
                    "server_cpu_s": cpu["server_cpu_s"],
                    "server_cpu_s_by_process": cpu["server_cpu_s_by_process"],
                    "machine_busy_cores": cpu["machine_busy_cores"],
                    "rejected": {
                        k[9:]: after[k] - before.get(k, 0.0)
                        for k in after
                        if k.startswith("rejected_")
                    },
                    "loop_lag_p99_le_s": lag_quantile(before, after, 0.99),
                    "loop_lag_mean_s": (after["lag_sum"] - before.get("lag_sum", 0.0))
                    / max(1.0, after["lag_count"] - before.get("lag_count", 0.0)),
                }
                runs.append(row)
                print(
                    f"[{name}] {mult:g}x: offered {row['offered_rps']:.0f} rps, goodput "
                    f"{row['goodput_rps']:.0f} rps, codes {row['codes']}, 200 p99 "
                    f"{row['ok_p99_ms']} ms, all p99 {row['all_p99_ms']} ms",
                    file=sys.stderr,
                )
            results["servers"][name] = {"capacity_rps": capacity, "runs": runs}
        finally:
            stop_tree(proc, 20.0)
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def render(results: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    lines = [
        "| admission | load | offered rps | goodput rps (% of capacity) | 200 | 503 | 504 "
        "| other | 200 p50 / p99 ms | all p99 ms | 503 p99 ms | loop lag p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, server in results["servers"].items():
        cap = server["capacity_rps"]
        for r in server["runs"]:
            c = r["codes"]
            other = sum(v for k, v in c.items() if k not in ("200", "503", "504"))
            lag = r["loop_lag_p99_le_s"]
            lines.append(
                f"| {name.split()[1]} | {r['multiplier']:g}x | {r['offered_rps']:.0f} "
                f"| {r['goodput_rps']:.0f} ({100 * r['goodput_rps'] / cap:.0f}%) "
                f"| {c.get('200', 0)} | {c.get('503', 0)} | {c.get('504', 0)} | {other} "
                f"| {ms(r['ok_p50_ms'])} / {ms(r['ok_p99_ms'])} | {ms(r['all_p99_ms'])} "
                f"| {ms(r['shed_p99_ms'])} | {'-' if lag is None else f'<= {lag * 1e3:g}'} |"
            )
    caps = ", ".join(f"{n}: {s['capacity_rps']:.0f} rps" for n, s in results["servers"].items())
    return "\n".join([f"capacity (closed loop): {caps}", *lines])


if __name__ == "__main__":
    sys.exit(main())
