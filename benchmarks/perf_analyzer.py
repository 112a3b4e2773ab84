"""Triton's perf_analyzer against `sloline run`, beside the serving benchmark's own client.

For each workload, one `sloline run` (the serving benchmark's fixed configuration: no
plan, no tuner, one replica per stage; `systems.SlolineSystem`) is driven closed-loop at
a few concurrency levels by three clients in turn, in an order rotated per level:
perf_analyzer over HTTP, perf_analyzer over gRPC, and `loadgen.py` (the serving
benchmark's aiohttp client, OIP v2 REST with the binary tensor extension). Each reports
throughput and latency percentiles over the same window length (perf_analyzer: the last
3 windows, whatever their spread, `--stability-percentage 999`: on a shared machine its
stability check fails often, and it then reports nothing); perf_analyzer also its
server-side split from sloline's Triton statistics (queue = stage queue waits,
compute infer = worker model time; docs/operations.md).

perf_analyzer stops at its first failed request and sends no `timeout_ms` over HTTP, so
the pipelines are served from copies with a 30 s SLO: sloline's default deadline (2 x the
SLO) and its admission then shed nothing on a loaded machine, as the serving benchmark's
`timeout_ms=30000` does for its own client.

perf_analyzer comes from scripts/fetch_perf_analyzer.sh (`make tools`), into
.tools/bin/perf_analyzer. It sends random data of the model's input shape (`--shape x:16`
for the no-op pipeline's variable-length input, as the serving benchmark's 64 B body).

Usage: ``python benchmarks/perf_analyzer.py [--workloads ...] [--concurrency 1 2 4 8]
[--window-ms 3000] [--out PATH]``; writes ``results/perf_analyzer.json`` and prints a
markdown table (docs/benchmarks.md, "Triton's perf_analyzer").
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine_info, save_results, table
from serving import DIGITS, HERE, NOOP, Workload, example_workload, log, make_workload
from systems import PERF_ANALYZER, ChildProcess, SlolineSystem, have_perf_analyzer

from sloline.spec import load_pipeline

CLIENTS = ("perf_analyzer http", "perf_analyzer grpc", "loadgen http")
SHAPES = {"noop-64B": ["--shape", "x:16"]}
RELAXED_SLO_MS = 30_000


def relaxed(workload: Workload, run_dir: Path) -> Workload:
    """`workload` served from a copy of its pipeline's folder with a 30 s SLO."""
    folder = run_dir / f"{workload.name}-pipeline"
    shutil.copytree(workload.pipeline_file.parent, folder)
    path = folder / workload.pipeline_file.name
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["slo"]["latencyMs"] = RELAXED_SLO_MS
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dataclasses.replace(workload, pipeline_file=path)


def perf_analyzer(system: SlolineSystem, workload: Workload, protocol: str, concurrency: int,
                  window_ms: int, out: Path) -> dict[str, Any]:  # fmt: skip
    url = f"127.0.0.1:{system.port if protocol == 'http' else system.grpc_port}"
    argv = [str(PERF_ANALYZER), "-m", workload.model, "-i", protocol, "-u", url,
            "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
            "--stability-percentage", "999", "--max-trials", "3", "-f", str(out),
            *SHAPES.get(workload.name, [])]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    record: dict[str, Any] = {"rc": done.returncode, "wall_s": time.perf_counter() - started}
    if done.returncode != 0 or not out.exists():
        record["error"] = (done.stdout + done.stderr)[-2000:]
        return record
    (row,) = list(csv.DictReader(out.open()))
    out.unlink()
    record.update(
        rps=float(row["Inferences/Second"]),
        p50_ms=int(row["p50 latency"]) / 1e3,
        p99_ms=int(row["p99 latency"]) / 1e3,
        server_queue_ms=int(row["Server Queue"]) / 1e3,
        server_compute_infer_ms=int(row["Server Compute Infer"]) / 1e3,
    )
    return record


def loadgen(client: ChildProcess, system: SlolineSystem, workload: Workload, concurrency: int,
            window_ms: int) -> dict[str, Any]:  # fmt: skip
    url, body, headers = system.endpoint(workload)
    result = client.request({"kind": "closed", "concurrency": concurrency, "warmup_s": 0.5,
                             "duration_s": window_ms / 1e3, "url": url, "body_file": str(body),
                             "headers": headers}, 120.0)  # fmt: skip
    if "failed" in result:
        return {"error": result["failed"]}
    errors = sum(result.get("errors", {}).values())
    out = {"rps": result["rps"], "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"]}
    return {**out, "errors": errors} if errors else out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["digits-cascade", "noop-64B"],
                        choices=("digits-cascade", "noop-64B"))  # fmt: skip
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--max-batch", type=int, default=8, help="per stage")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "perf_analyzer.json")
    args = parser.parse_args()
    if not have_perf_analyzer():
        return 2
    started = time.perf_counter()
    run_dir = Path(tempfile.mkdtemp(prefix="sloline-perf-analyzer-"))
    rng = np.random.default_rng(0)
    workloads = []
    for name in args.workloads:
        if name == "noop-64B":
            x = {"x": rng.random(16, dtype=np.float32)}
            workloads.append(relaxed(make_workload(name, "noop", NOOP, x, run_dir), run_dir))
        elif (example := example_workload(DIGITS, run_dir)) is not None:
            workloads.append(relaxed(example, run_dir))
    machine = machine_info("")
    client = ChildProcess([sys.executable, str(HERE / "loadgen.py")],
                          stderr_path=run_dir / "loadgen.log")  # fmt: skip
    records = []
    try:
        for workload in workloads:
            stages = load_pipeline(workload.pipeline_file).graph.order
            system = SlolineSystem(workload.pipeline_file, dict.fromkeys(stages, args.max_batch),
                                   run_dir)  # fmt: skip
            system.start()
            try:
                for k, n in enumerate(args.concurrency):
                    for tool in CLIENTS[k % 3 :] + CLIENTS[: k % 3]:
                        log(f"{workload.name} N={n} {tool}")
                        if tool == "loadgen http":
                            r = loadgen(client, system, workload, n, args.window_ms)
                        else:
                            protocol = tool.split()[1]
                            r = perf_analyzer(system, workload, protocol, n, args.window_ms,
                                              run_dir / "pa.csv")  # fmt: skip
                        records.append({"workload": workload.name, "concurrency": n,
                                        "client": tool, **r})  # fmt: skip
                        log(f"  -> {json.dumps(r)[:300]}")
            finally:
                system.stop()
    finally:
        client.close(grace_s=5.0)
    wall_s = save_results(args.out, args, machine, started, run_dir, records)
    print(render(records))
    print(f"\nraw results: {args.out} ({wall_s:.0f} s)")
    return 1 if any("error" in r for r in records) else 0


def render(records: list[dict[str, Any]]) -> str:
    header = ["workload", "N", "client", "rps", "p50 ms", "p99 ms", "server queue ms",
              "server compute infer ms"]  # fmt: skip
    rows = []
    for r in records:
        if "error" in r:
            rows.append([r["workload"], str(r["concurrency"]), r["client"], "failed: "
                         + str(r["error"]).splitlines()[-1][:120], "", "", "", ""])  # fmt: skip
            continue
        server = [f"{r[k]:.3f}" if k in r else "" for k in
                  ("server_queue_ms", "server_compute_infer_ms")]  # fmt: skip
        rows.append([r["workload"], str(r["concurrency"]), r["client"], f"{r['rps']:.0f}",
                     f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", *server])  # fmt: skip
    return table(header, rows)


if __name__ == "__main__":
    sys.exit(main())
