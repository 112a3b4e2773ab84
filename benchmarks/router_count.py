"""Routers per pipeline: the estimator's P99 of examples/digits-cascade with 1, 2 and 4
routers as the rate grows, and the router count the planner picks.

The profile is ``sloline plan``'s (``sloline.measure``'s cache, measured on first use:
both CPU classes, the visit matrix and the serving overhead, the router's CPU included;
build the models first with examples/digits-cascade/build.py). Each rate gets a 60 s gamma
trace (CV² 1, seed 0); every cell runs the same stage configuration, the plan for the
spec's 100 rps, so that only the routers change; then the planner plans each rate itself.

    python benchmarks/router_count.py [--rates 100 400 800 1200] [--routers 1 2 4]

Prints markdown and writes benchmarks/results/router_count.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from sloline.common.trace import gamma_arrivals
from sloline.measure.profiler import profile_pipeline
from sloline.measure.session import planning_trace
from sloline.planner.estimator import Workload, estimate
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.spec import load_pipeline
from sloline.spec.hardware import DEFAULT_CATALOG

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 400.0, 800.0, 1200.0])
    parser.add_argument("--routers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--duration-s", type=float, default=60.0)
    args = parser.parse_args()
    loaded = load_pipeline(ROOT / "examples" / "digits-cascade" / "pipeline.yaml")
    profile = profile_pipeline(loaded, DEFAULT_CATALOG)
    base = PlanningProblem.from_graph(
        loaded.graph, profile, DEFAULT_CATALOG, planning_trace(loaded)
    )
    config = plan(base).config
    slo_ms = base.slo_s * 1e3
    rows: list[dict[str, Any]] = []
    for rate in args.rates:
        arrivals = gamma_arrivals(rate, args.duration_s, cv2=1.0, seed=0)
        workload = Workload.build(base.topology, profile, arrivals)
        for routers in args.routers:
            result = estimate(base.topology, profile, config, workload, routers=routers)
            rows.append(
                {
                    "rate_rps": rate,
                    "routers": routers,
                    "p99_ms": result.percentile_s(99.0) * 1e3,
                    "router_utilisation": result.router_utilisation,
                    "mean_batch": {s.name: s.mean_batch for s in result.stages},
                }
            )
    planned = []
    for rate in args.rates:
        problem = dataclasses.replace(
            base, arrivals_s=gamma_arrivals(rate, args.duration_s, cv2=1.0, seed=0)
        )
        chosen = plan(problem)
        planned.append(
            {
                "rate_rps": rate,
                "routers": chosen.routers,
                "config": [dataclasses.asdict(c) for c in chosen.config],
                "cost_per_hour": chosen.cost_per_hour,
                "p99_ms": chosen.p99_s * 1e3,
                "router_utilisation": chosen.router_utilisation,
            }
        )
    stages = "/".join(base.topology.stages)
    print(f"digits-cascade, stages at {[(c.hardware, c.max_batch, c.replicas) for c in config]}")
    print(f"SLO P99 {slo_ms:g} ms\n")
    print(f"| rps | routers | P99 ms | router utilisation | mean batch ({stages}) |")
    print("|---:|---:|---:|---:|---|")
    for row in rows:
        batches = "/".join(f"{b:.2f}" for b in row["mean_batch"].values())
        print(
            f"| {row['rate_rps']:g} | {row['routers']} | {row['p99_ms']:.1f} | "
            f"{row['router_utilisation']:.2f} | {batches} |"
        )
    print("\n| rps | planned routers | $/hour | planned P99 ms | router utilisation |")
    print("|---:|---:|---:|---:|---:|")
    for row in planned:
        print(
            f"| {row['rate_rps']:g} | {row['routers']} | {row['cost_per_hour']:.3f} | "
            f"{row['p99_ms']:.1f} | {row['router_utilisation']:.2f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = {"config": [dataclasses.asdict(c) for c in config], "rows": rows, "planned": planned}
    (RESULTS / "router_count.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
