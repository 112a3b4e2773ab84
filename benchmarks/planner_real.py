"""Planning the example pipelines with their real, profiled serving overhead.

1. **Planning** (in process): ``plan()`` on examples/digits-cascade and
   examples/image-ensemble with the profiles stored by the estimator-accuracy benchmark
   (``benchmarks/results/estimator_accuracy.json``: both CPU classes, the visit matrix
   and the measured serving overhead), so the estimator runs the whole-pipeline
   simulation; and, for contrast, the same profiles without the overhead (stage by
   stage). Median of ``--repeats`` fresh plans, estimator runs per plan, and the plan.
2. **Start-up** (``--startup``): ``sloline plan PIPELINE`` as a subprocess, twice, with a
   copy of the stage-profile cache (``--cache-dir``, stage profiles only): the first run
   measures the serving overhead, as every run did before it was cached; the second reads
   it back. Wall time per phase (from the progress lines) and whether both printed the
   same plan. And the planner's start in a fresh container, whose numba cache
   (``NUMBA_CACHE_DIR``) starts empty: importing the planner, as the operator does
   (profiles without a serving overhead: stage by stage), then the first whole-pipeline
   estimate, each in a new process with an empty cache.

    python benchmarks/planner_real.py [--quick] [--startup] [--cache-dir DIR]

Prints markdown and writes benchmarks/results/planner_real.json (``--quick``: one repeat,
no start-up runs, written to planner_real.quick.raw.json, which git ignores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from sloline.measure.session import planning_trace
from sloline.planner.evaluator import Evaluator
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import PipelineProfile
from sloline.spec import load_pipeline
from sloline.spec.hardware import DEFAULT_CATALOG

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
STORED = RESULTS / "estimator_accuracy.json"
EXAMPLES = ("digits-cascade", "image-ensemble")


def _pipeline(name: str) -> Path:
    return ROOT / "examples" / name / "pipeline.yaml"


def planning(name: str, stored: dict[str, Any], repeats: int, overhead: bool) -> dict[str, Any]:
    loaded = load_pipeline(_pipeline(name))
    profile = PipelineProfile.from_dict(stored["examples"][name]["profile"])
    if not overhead:
        profile = dataclasses.replace(profile, overhead=None)
    problem = PlanningProblem.from_graph(
        loaded.graph, profile, DEFAULT_CATALOG, planning_trace(loaded)
    )
    seconds: list[float] = []
    for _ in range(repeats):
        evaluator = Evaluator(problem)
        start = time.perf_counter()
        planned = plan(problem, evaluator)
        seconds.append(time.perf_counter() - start)
    return {
        "example": name,
        "overhead": overhead,
        "queries": int(problem.arrivals_s.size),
        "hardware": sorted(problem.hardware_costs),
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "simulations": evaluator.simulations,
        "plan": planned.to_dict(),
        "cost_per_hour": planned.cost_per_hour,
    }


def _timed_run(command: list[str]) -> dict[str, Any]:
    """Run ``command``; stderr lines with the seconds since the start when each arrived."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines: list[tuple[float, str]] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        lines.extend((time.perf_counter() - start, line.rstrip("\n")) for line in proc.stderr)

    reader = threading.Thread(target=read_stderr)
    reader.start()
    stdout = proc.stdout.read()
    code = proc.wait()
    reader.join()
    wall = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(line for _, line in lines[-20:])
        raise RuntimeError(f"{' '.join(command)} exited with {code}:\n{tail}")

    def at(prefix: str) -> float | None:
        return next((t for t, line in lines if line.startswith(prefix)), None)

    overhead_at = at("measuring the serving overhead") or at("serving overhead")
    planning_at = at("planning ...")
    assert overhead_at is not None
    assert planning_at is not None
    return {
        "wall_s": wall,
        "until_overhead_s": overhead_at,
        "overhead_s": planning_at - overhead_at,
        "planning_s": wall - planning_at,
        "overhead_measured": at("measuring the serving overhead") is not None,
        "stages_profiled": any("measuring ..." in line for _, line in lines),
        "stdout": stdout,
    }


def startup(name: str, cache_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sloline-planner-real-") as tmp:
        for path in cache_dir.glob(f"{name}-*.json"):
            if "-serving-overhead-" not in path.name:
                shutil.copy(path, tmp)
        command = [sys.executable, "-m", "sloline", "plan", str(_pipeline(name))]
        command += ["--cache-dir", tmp]
        measured = _timed_run(command)
        cached = _timed_run(command)
    return {
        "example": name,
        "measured": {k: v for k, v in measured.items() if k != "stdout"},
        "cached": {k: v for k, v in cached.items() if k != "stdout"},
        "same_plan": measured["stdout"] == cached["stdout"],
        "plan": cached["stdout"],
    }


_COLD_START = """
import json, sys, time
start = time.perf_counter()
import sloline.planner.evaluator, sloline.planner.planner
imported = time.perf_counter()
loaded = "sloline.planner.routed" in sys.modules
import sloline.planner.routed
print(json.dumps({"import_planner_s": imported - start, "shared_at_import": loaded,
                  "first_shared_estimate_s": time.perf_counter() - imported}))
"""


def cold_start() -> dict[str, Any]:
    """Seconds to import the planner, and then to load the whole-pipeline kernel, with
    an empty numba cache (a fresh container's)."""
    with tempfile.TemporaryDirectory(prefix="sloline-numba-") as tmp:
        env = {**os.environ, "NUMBA_CACHE_DIR": tmp}
        out = subprocess.run(
            [sys.executable, "-c", _COLD_START],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def _config(plan_dict: dict[str, Any]) -> str:
    return ", ".join(
        f"{s['name']} {s['hardware']} b{s['maxBatch']} x{s['replicas']}"
        for s in plan_dict["stages"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, no start-up runs")
    parser.add_argument("--repeats", type=int, default=5, help="plans per example and mode")
    parser.add_argument(
        "--startup", action="store_true", help="also time `sloline plan` start to finish"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=ROOT / ".sloline-cache" / "profiles",
        help="stage profiles for --startup (copied; those missing are measured, minutes)",
    )
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    stored = json.loads(STORED.read_text())
    began = time.perf_counter()
    report: dict[str, Any] = {
        "settings": {"repeats": repeats, "quick": args.quick, "profiles": STORED.name},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "loadavg_start": os.getloadavg(),
        },
        "planning": [
            planning(name, stored, repeats, overhead)
            for name in EXAMPLES
            for overhead in (True, False)
        ],
        "startup": [],
    }
    print("| example | estimator | queries | plan time (median) | estimator runs | plan |")
    print("|---|---|---:|---:|---:|---|")
    for row in report["planning"]:
        mode = "whole pipeline + overhead" if row["overhead"] else "stage by stage"
        print(
            f"| {row['example']} | {mode} | {row['queries']} | {row['median_s']:.2f} s | "
            f"{row['simulations']} | ${row['cost_per_hour']:.3f}/h: {_config(row['plan'])} |"
        )
    if args.startup and not args.quick:
        report["startup"] = [startup(name, args.cache_dir) for name in EXAMPLES]
        print()
        print("| example | `sloline plan` | wall | start-up + profiles | overhead | planning |")
        print("|---|---|---:|---:|---:|---:|")
        for row in report["startup"]:
            for what in ("measured", "cached"):
                run = row[what]
                print(
                    f"| {row['example']} | overhead {what} | {run['wall_s']:.1f} s | "
                    f"{run['until_overhead_s']:.1f} s | {run['overhead_s']:.1f} s | "
                    f"{run['planning_s']:.1f} s |"
                )
            print(f"| {row['example']} | same plan printed | {row['same_plan']} | | | |")
        report["cold_start"] = cold = cold_start()
        print()
        print(
            f"Empty numba cache: importing the planner {cold['import_planner_s']:.1f} s "
            f"(whole-pipeline kernel loaded then: {cold['shared_at_import']}), then the "
            f"whole-pipeline kernel {cold['first_shared_estimate_s']:.1f} s."
        )
    report["machine"]["loadavg_end"] = os.getloadavg()
    report["runtime_s"] = time.perf_counter() - began
    out = RESULTS / ("planner_real.quick.raw.json" if args.quick else "planner_real.json")
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwritten to {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
