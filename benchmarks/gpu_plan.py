"""A GPU plan served: the planner's estimated P99 against the measured one, and the
routers it takes to feed one GPU.

The pipeline is image-ensemble's `preprocess` (Python, CPU) followed by its `large` CNN
(TorchScript) at a rate that one router cannot carry: one GPU replica of `large` runs a
batch of 32 in about a millisecond, far more than a router's few thousand requests per
second. The catalog offers a 1-core CPU class and the machine's GPU (`cudaDevice: 0`).

Steps: `sloline plan` (profiles every stage on both classes, measures the serving
overhead, plans hardware, batch, replicas and routers; its estimated P99 is for Poisson
arrivals at the spec's rate over a `--duration-s` planning trace, 5 s by default: the
planner simulates every arrival of that trace per estimate, so its time grows with
rate x duration), then `sloline run --no-plan` of that plan (its hardware, batch and
replicas per stage as flags) with the planned router count and no tuner, driven open
loop with Poisson arrivals at the spec's rate by perf_analyzer (C++;
`scripts/fetch_perf_analyzer.sh`) over OIP v2 REST. The same plan is then served with
one router fewer than planned, down to one, at the same rate, as a control:
perf_analyzer stops at the first failed request, so a configuration that sheds load
(503) or misses deadlines is reported as such.

Needs a CUDA build of torch and a GPU; writes ``results/gpu_plan.json``.

Usage: ``python benchmarks/gpu_plan.py [--rate 3000] [--slo-ms 50] [--window-ms 4000]
[--catalog FILE]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from sloline.backends.local import WORKER_NICE

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine_info, save_results
from systems import SlolineSystem, have_perf_analyzer, run_perf_analyzer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
IMAGE = ROOT / "examples" / "image-ensemble"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pipeline_dir(run_dir: Path, rate: float, slo_ms: float, duration_s: float) -> Path:
    """preprocess -> large from image-ensemble, with a 1-core CPU class and GPU 0."""
    folder = run_dir / "gpu-feed"
    (folder / "models").mkdir(parents=True)
    if not (IMAGE / "models" / "large.pt").exists():
        subprocess.run([sys.executable, "build.py"], cwd=IMAGE, check=True, timeout=900)
    shutil.copy(IMAGE / "models" / "large.pt", folder / "models")
    shutil.copy(IMAGE / "ensemble_stages.py", folder)
    spec = yaml.safe_load((IMAGE / "pipeline.yaml").read_text())
    stages = {s["name"]: s for s in spec["spec"]["stages"]}
    spec["metadata"]["name"] = "gpu-feed"
    spec["spec"].update(
        slo={"latencyMs": slo_ms, "percentile": 99},
        workload={"rateRps": rate, "cv2": 1.0, "durationS": duration_s},
        stages=[stages["preprocess"], stages["large"]],
        output="large",
    )
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    catalog = {"classes": [
        {"name": "cpu-1", "costPerHour": 0.05, "embedded": {"threads": 1}},
        {"name": "gpu-0", "accelerator": "gpu", "costPerHour": 2.50, "devices": 1,
         "embedded": {"threads": 1, "cudaDevice": 0}},
    ]}  # fmt: skip
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog, sort_keys=False))
    return folder


def sloline(*args: str) -> list[str]:
    return [sys.executable, "-m", "sloline", *args]


def serve(folder: Path, plan: dict[str, Any], routers: int, rate: float, window_ms: int,
          run_dir: Path) -> dict[str, Any]:  # fmt: skip
    """`sloline run --no-plan` of `plan` (its hardware, batch and replicas per stage; the
    workers at `sloline run`'s default priority, which `sloline plan` plans for) with
    `routers` routers, measured open loop at `rate` once every router has its workers."""
    stages = plan["stages"]
    hardware = [f"--hardware={s['name']}={s['hardware']}" for s in stages]
    system = SlolineSystem(folder / "pipeline.yaml",
                           {s["name"]: s["maxBatch"] for s in stages}, run_dir,
                           f"run-r{routers}", routers=routers,
                           replicas={s["name"]: s["replicas"] for s in stages},
                           args=["--catalog", str(folder / "catalog.yaml"), *hardware,
                                 "--worker-nice", str(WORKER_NICE)])  # fmt: skip
    record: dict[str, Any] = {"routers": routers, "rate_rps": rate}
    system.start(timeout_s=600)
    try:
        flags = ["-m", "gpu-feed", "-i", "http", "-u", f"127.0.0.1:{system.port}",
                 "--request-rate-range", str(rate), "--request-distribution", "poisson",
                 "--max-threads", "256"]  # fmt: skip
        # One window first, its result dropped: the first batches (allocations, a new
        # batch size's first kernels) are not the steady state being measured.
        record["warmup"] = run_perf_analyzer(flags, 1000, run_dir / "pa.csv")
        record.update(run_perf_analyzer(flags, window_ms, run_dir / "pa.csv"))
    finally:
        system.stop()
    log(f"routers={routers}: {json.dumps(record)[:300]}")
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=3000.0, help="requests per second")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--window-ms", type=int, default=4000)
    parser.add_argument("--duration-s", type=float, default=5.0,
                        help="the planning trace's length (spec.workload.durationS): the "
                        "planner simulates rate x duration arrivals per estimate")  # fmt: skip
    parser.add_argument("--catalog", type=Path, help="a hardware catalog to plan with "
                        "instead of cpu-1 and gpu-0 (CUDA device 0)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu_plan.json")
    args = parser.parse_args()
    if not have_perf_analyzer():
        return 2
    started = time.perf_counter()
    machine = machine_info("")
    run_dir = Path(tempfile.mkdtemp(prefix="sloline-gpu-plan-"))
    folder = pipeline_dir(run_dir, args.rate, args.slo_ms, args.duration_s)
    if args.catalog:
        shutil.copy(args.catalog, folder / "catalog.yaml")
    cache = run_dir / "profiles"
    log("sloline plan (profiles every stage on cpu-1 and gpu-0) ...")
    planned = subprocess.run(sloline("plan", str(folder / "pipeline.yaml"), "--catalog",
                                     str(folder / "catalog.yaml"), "--cache-dir", str(cache),
                                     "-o", "json"),
                             stdout=subprocess.PIPE, text=True, timeout=1200,
                             check=False)  # fmt: skip
    if planned.returncode != 0:
        return 1
    plan = json.loads(planned.stdout)
    plan_s = time.perf_counter() - started
    log(
        f"plan ({plan_s:.0f} s): routers {plan['routers']}, P99 {1e3 * plan['p99Seconds']:.1f} ms, "
        f"{[(s['name'], s['hardware'], s['maxBatch'], s['replicas']) for s in plan['stages']]}"
    )
    served = [serve(folder, plan, n, args.rate, args.window_ms, run_dir)
              for n in range(plan["routers"], 0, -1)]  # fmt: skip
    wall_s = save_results(args.out, args, machine, started, run_dir, served,
                          {"plan": plan, "plan_s": plan_s})  # fmt: skip
    print(
        f"plan: {plan['routers']} routers, estimated P99 {1e3 * plan['p99Seconds']:.1f} ms "
        f"(SLO {args.slo_ms:.0f} ms) at {args.rate:.0f} rps, ${plan['costPerHour']:.2f}/h"
    )
    for s in plan["stages"]:
        print(f"  {s['name']}: {s['hardware']} batch {s['maxBatch']} x{s['replicas']}")
    for r in served:
        got = (f"P99 {r['p99_ms']:.1f} ms at {r['rps']:.0f} rps" if "p99_ms" in r
               else f"failed: {r['error'].strip().splitlines()[-1][:200]}")  # fmt: skip
        print(f"served with {r['routers']} router(s): {got}")
    print(f"\nraw results: {args.out} ({wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
