"""Plans that survive their own traffic: each plan re-estimated on fresh traces of the
arrival process it was planned for.

Per ``cloud`` pipeline (``sloline.lab.problems``; seeds from ``--first-seed``, held out
from the search's development seeds), one plan per ``--resamples`` value (0: the planning
trace alone, InferLine's criterion; K: the trace and K block-bootstrap resamples of it,
``PlanningProblem.resamples``), then each plan re-estimated on ``--fresh`` traces of the
same gamma process with new seeds. Reports per K the share of (plan, fresh trace) pairs
that meet the SLO (target: >= 95%), the worst attainment and P99 / SLO, plans that meet it
on none of their traces, the cost against the single-trace plan, the plans' headroom and
planning time.

    python benchmarks/plan_robustness.py [--seeds 40] [--first-seed 1000] [--resamples 0 4 8]

Prints markdown and writes benchmarks/results/plan_robustness.json (other first seeds:
plan_robustness.seeds-S.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from sloline.lab.problems import cloud_problem
from sloline.planner.evaluator import Evaluator
from sloline.planner.planner import InfeasibleError, plan

RESULTS = Path(__file__).parent / "results"
FRESH_SEED = 1_000_003  # fresh trace j of pipeline s: seed FRESH_SEED * (j + 1) + s


def case(seed: int, resamples: list[int], fresh: int, duration_s: float) -> dict[str, Any]:
    base = cloud_problem(seed, duration_s=duration_s)
    traces = [
        cloud_problem(seed, duration_s=duration_s, trace_seed=FRESH_SEED * (j + 1) + seed)
        for j in range(fresh)
    ]
    row: dict[str, Any] = {"seed": seed, "slo_ms": base.slo_s * 1e3, "plans": {}}
    for k in resamples:
        problem = dataclasses.replace(base, resamples=k)
        started = time.perf_counter()
        try:
            planned = plan(problem)
        except InfeasibleError:
            row["plans"][str(k)] = None
            continue
        seconds = time.perf_counter() - started
        checks = []
        for other in traces:
            verdict = Evaluator(other).evaluate(planned.config)
            checks.append(
                {"attainment": verdict.attainment, "tail_over_slo": verdict.tail_s / base.slo_s}
            )
        row["plans"][str(k)] = {
            "cost": planned.cost_per_hour,
            "headroom": planned.headroom,
            "seconds": seconds,
            "fresh": checks,
        }
    return row


def summary(rows: list[dict[str, Any]], k: int, baseline: int) -> dict[str, Any]:
    both = [r for r in rows if r["plans"].get(str(k)) and r["plans"].get(str(baseline))]
    pairs = [c for r in both for c in r["plans"][str(k)]["fresh"]]
    met = [c["tail_over_slo"] <= 1.0 for c in pairs]
    never = sum(all(c["tail_over_slo"] > 1.0 for c in r["plans"][str(k)]["fresh"]) for r in both)
    ratios = [r["plans"][str(k)]["cost"] / r["plans"][str(baseline)]["cost"] for r in both]
    total = sum(r["plans"][str(k)]["cost"] for r in both)
    total_base = sum(r["plans"][str(baseline)]["cost"] for r in both)
    return {
        "resamples": k,
        "plans": len(both),
        "pairs": len(pairs),
        "pairs_met": sum(met),
        "plans_never_met": never,
        "worst_attainment": min(c["attainment"] for c in pairs),
        "worst_tail_over_slo": max(c["tail_over_slo"] for c in pairs),
        "cost_ratio_median": statistics.median(ratios),
        "cost_ratio_max": max(ratios),
        "cost_ratio_total": total / total_base,
        "headroom_median": statistics.median(r["plans"][str(k)]["headroom"] for r in both),
        "seconds_median": statistics.median(r["plans"][str(k)]["seconds"] for r in both),
        "seconds_max": max(r["plans"][str(k)]["seconds"] for r in both),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40, help="pipelines")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--resamples", type=int, nargs="+", default=[0, 4, 8])
    parser.add_argument("--fresh", type=int, default=5, help="fresh traces per plan")
    parser.add_argument("--duration", type=float, default=20.0, help="trace length (s)")
    args = parser.parse_args()
    started = time.perf_counter()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows = [case(seed, args.resamples, args.fresh, args.duration) for seed in seeds]
    baseline = args.resamples[0]
    result = {
        "meta": {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "seeds": [seeds.start, seeds.stop - 1],
            "fresh": args.fresh,
            "duration_s": args.duration,
            "command": "python benchmarks/plan_robustness.py --seeds "
            f"{args.seeds} --first-seed {args.first_seed} --resamples "
            + " ".join(map(str, args.resamples)),
            "seconds": time.perf_counter() - started,
        },
        "summary": [summary(rows, k, baseline) for k in args.resamples],
        "cases": rows,
    }
    print(
        f"| resamples | pairs meeting the SLO | plans meeting it on none | worst attainment "
        f"| worst P99 / SLO | cost / {baseline} resamples: median (max), total "
        "| headroom median | plan time median / max |"
    )
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    for s in result["summary"]:
        print(
            f"| {s['resamples']} | {s['pairs_met']} / {s['pairs']} "
            f"({100 * s['pairs_met'] / s['pairs']:.1f}%) | {s['plans_never_met']} "
            f"| {100 * s['worst_attainment']:.2f}% | {s['worst_tail_over_slo']:.2f} "
            f"| {s['cost_ratio_median']:.2f} ({s['cost_ratio_max']:.2f}), "
            f"{s['cost_ratio_total']:.2f} | {s['headroom_median']:.2f}x "
            f"| {s['seconds_median']:.2f} / {s['seconds_max']:.2f} s |"
        )
    RESULTS.mkdir(exist_ok=True)
    suffix = "" if args.first_seed == 1000 else f".seeds-{args.first_seed}"
    out = RESULTS / f"plan_robustness{suffix}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} ({result['meta']['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
