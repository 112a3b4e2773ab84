"""Planner quality and speed (InferLine §4.3, §6).

1. Planner time on 10-stage pipelines with 3 hardware classes (target: under 10 s).
2. Greedy vs optimum on 50 seeded random pipelines (2-4 stages, 2-3 hardware classes with
   Clockwork GPU profiles; ``sloline.lab.synthetic``): the cost gap of our planner and
   of the paper-literal Algorithm 2, with CG-Mean / CG-Peak cost and estimated SLO
   attainment beside (target: within 1.10x of the optimum in >= 90% of cases, never
   infeasible when a feasible plan exists).
3. Cost monotonicity in the SLO: independent greedy runs vs ``plan_sweep``.

    python benchmarks/planner_quality.py [--quick]

Prints markdown tables and writes benchmarks/results/planner_quality.json (``--quick``:
a few cases, written to planner_quality.quick.raw.json, which git ignores).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from sloline.lab.cg import cg_baselines
from sloline.lab.optimum import optimal_config
from sloline.lab.synthetic import random_problem
from sloline.planner.evaluator import Evaluator
from sloline.planner.planner import (
    InfeasibleError,
    Variant,
    initialize,
    minimize_cost,
    plan,
    plan_sweep,
)

RESULTS = Path(__file__).parent / "results"
SLO_FACTORS = (0.8, 0.9, 1.0, 1.15, 1.3, 1.6, 2.0)


def ten_stage(seed: int, n_stages: int) -> dict[str, Any]:
    problem = random_problem(seed, n_stages=n_stages, n_hardware=3, duration_s=60.0, rate_rps=100.0)
    evaluator = Evaluator(problem)
    start = time.perf_counter()
    try:
        cost: float | None = plan(problem, evaluator).cost_per_hour
    except InfeasibleError:
        cost = None
    seconds, simulations = time.perf_counter() - start, evaluator.simulations
    baselines: dict[str, float] = {}
    if cost is not None:  # the CG baselines priced beside, outside the planning time
        baselines = {b.name: b.cost_per_hour for b in cg_baselines(problem, evaluator)}
    return {
        "seed": seed,
        "stages": n_stages,
        "queries": int(problem.arrivals_s.size),
        "seconds": seconds,
        "simulations": simulations,
        "cost_per_hour": cost,
        "baselines": baselines,
    }


def greedy(problem: Any, evaluator: Evaluator, variant: Variant) -> tuple[Any, float]:
    start = time.perf_counter()
    try:
        config = minimize_cost(problem, evaluator, initialize(problem, evaluator), variant)
    except InfeasibleError:
        config = None
    return config, time.perf_counter() - start


def gap_case(seed: int, quick: bool) -> dict[str, Any]:
    if quick:  # the small pipelines of the unit tests
        problem = random_problem(seed, n_stages=2 + seed % 2, duration_s=10.0, max_replicas=16)
    else:
        problem = random_problem(seed)
    evaluator = Evaluator(problem)
    ours, ours_s = greedy(problem, evaluator, "sloline")
    literal, _ = greedy(problem, evaluator, "inferline")
    start = time.perf_counter()
    optimum = optimal_config(problem, Evaluator(problem), budget=100_000)  # no incumbent
    optimum_s = time.perf_counter() - start
    row: dict[str, Any] = {
        "seed": seed,
        "stages": len(problem.topology),
        "hardware": len(problem.hardware_costs),
        "queries": int(problem.arrivals_s.size),
        "slo_ms": problem.slo_s * 1e3,
        "optimum": optimum.cost_per_hour if optimum.config else None,
        "optimum_proven": optimum.proven,
        "optimum_seconds": optimum_s,
        "sloline": problem.cost_per_hour(ours) if ours else None,
        "sloline_seconds": ours_s,
        "inferline": problem.cost_per_hour(literal) if literal else None,
    }
    if ours is not None:
        row["sloline_attainment"] = evaluator.evaluate(ours).attainment
    for baseline in cg_baselines(problem, evaluator):
        row[baseline.name] = baseline.cost_per_hour
        row[f"{baseline.name}_attainment"] = baseline.attainment
    return row


def monotonicity_case(seed: int) -> dict[str, Any]:
    base = random_problem(seed)
    independent = []
    for factor in SLO_FACTORS:
        problem = dataclasses.replace(base, slo_s=base.slo_s * factor)
        config, _ = greedy(problem, Evaluator(problem), "sloline")
        independent.append(problem.cost_per_hour(config) if config else math.inf)
    swept = [
        math.inf if isinstance(p, InfeasibleError) else p.cost_per_hour
        for p in plan_sweep(base, [base.slo_s * f for f in SLO_FACTORS])
    ]

    def rises(costs: list[float]) -> int:
        return sum(b > a + 1e-9 for a, b in itertools.pairwise(costs))

    return {"seed": seed, "independent_rises": rises(independent), "sweep_rises": rises(swept)}


def gap_summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    gaps = [r[key] / r["optimum"] for r in rows if r["optimum"] and r[key]]
    missed = sum(1 for r in rows if r["optimum"] and not r[key])
    buckets = [1.0 + 1e-9, 1.05, 1.10, 1.25]
    counts = [sum(g <= b for g in gaps) for b in buckets]
    return {
        "cases": len(gaps) + missed,
        "optimal": counts[0],
        "within_1.05": counts[1],
        "within_1.10": counts[2],
        "within_1.25": counts[3],
        "mean_gap": statistics.fmean(gaps) if gaps else None,
        "max_gap": max(gaps, default=None),
        "infeasible_but_feasible_exists": missed,
    }


def print_tables(result: dict[str, Any]) -> None:
    print("## Planner time, 10-stage pipelines, 3 hardware classes, 60 s at 100 rps\n")
    print("| seed | stages | queries | plan time | simulations | $/hour | CG-Mean | CG-Peak |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["planner_time"]:
        cost = f"{r['cost_per_hour']:.2f}" if r["cost_per_hour"] is not None else "infeasible"
        cg = [
            f"{r['baselines'][k]:.2f}" if k in r["baselines"] else "-"
            for k in ("cg-mean", "cg-peak")
        ]
        print(
            f"| {r['seed']} | {r['stages']} | {r['queries']:,} | {r['seconds']:.2f} s "
            f"| {r['simulations']:,} | {cost} | {cg[0]} | {cg[1]} |"
        )
    print("\n## Greedy vs optimum (branch and bound)\n")
    print("| planner | cases | optimal | <=1.05x | <=1.10x | <=1.25x | mean gap | max gap "
          "| infeasible though feasible |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in result["gap_summary"].items():
        n = s["cases"]
        print(
            f"| {name} | {n} | {s['optimal']} | {s['within_1.05']} | {s['within_1.10']} "
            f"({s['within_1.10'] / n:.0%}) | {s['within_1.25']} | {s['mean_gap']:.3f} "
            f"| {s['max_gap']:.2f} | {s['infeasible_but_feasible_exists']} |"
        )
    rows = result["gap_cases"]
    print("\n| seed | stages | hw | SLO ms | optimum $/h | sloline | paper Alg. 2 | CG-Mean "
          "(attain.) | CG-Peak (attain.) | B&B time |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def priced(r: dict[str, Any], key: str) -> str:
        value = r.get(key)
        if value is None:
            return "-"
        attainment = r.get(f"{key}_attainment")
        return f"{value:.2f}" + (f" ({attainment:.1%})" if attainment is not None else "")

    for r in rows:
        print(
            f"| {r['seed']} | {r['stages']} | {r['hardware']} | {r['slo_ms']:.1f} "
            f"| {priced(r, 'optimum')}{'' if r['optimum_proven'] else '*'} "
            f"| {priced(r, 'sloline')} | {priced(r, 'inferline')} | {priced(r, 'cg-mean')} "
            f"| {priced(r, 'cg-peak')} "
            f"| {r['optimum_seconds']:.1f} s |"
        )
    mono = result["monotonicity"]
    steps = len(mono) * (len(SLO_FACTORS) - 1)
    print(
        f"\n## Cost as the SLO loosens ({len(mono)} pipelines x SLO factors {SLO_FACTORS})\n\n"
        f"| planner | steps where the cost rose |\n|---|---:|\n"
        f"| independent greedy runs | {sum(m['independent_rises'] for m in mono)} / {steps} |\n"
        f"| plan_sweep (warm-started) | {sum(m['sweep_rises'] for m in mono)} / {steps} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small cases only")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.quick:
        big = [ten_stage(0, 5)]
        cases = [gap_case(seed, quick=True) for seed in range(4)]
        mono = [monotonicity_case(seed) for seed in range(2)]
    else:
        big = [ten_stage(seed, 10) for seed in range(5)]
        cases = [gap_case(seed, quick=False) for seed in range(50)]
        mono = [monotonicity_case(seed) for seed in range(50)]
    result: dict[str, Any] = {
        "meta": {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "seconds": time.perf_counter() - started,
        },
        "planner_time": big,
        "gap_summary": {
            "sloline (default)": gap_summary(cases, "sloline"),
            "paper-literal Alg. 2": gap_summary(cases, "inferline"),
        },
        "gap_cases": cases,
        "monotonicity": mono,
    }
    print_tables(result)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("planner_quality.quick.raw.json" if args.quick else "planner_quality.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} ({result['meta']['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
