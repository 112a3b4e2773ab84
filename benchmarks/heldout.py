"""Held-out evaluation: the planner and every scaling policy on random pipelines and
production-shaped traces they were not developed against.

For each pipeline seed, :func:`sloline.lab.heldout.pipelines.random_pipeline` draws a
pipeline (GPU-like and CPU stages, chains and DAGs, conditional stages, cloud prices);
for each trace shape of :mod:`sloline.lab.heldout.shapes` (diurnal, flash crowd, slow
growth, MMPP bursts, heavy-tailed inter-arrivals) a trace at the pipeline's base rate.
The planner plans the pipeline on the trace's planning sample, and the closed-loop
simulation (:func:`sloline.lab.simulate.simulate`, 5 s activation) serves the live trace
under every policy: the plan alone, the oracle (the planner on the whole live trace), the
InferLine tuners and the reactive baselines at their defaults.

Each pair also gets its reactive bound (:func:`sloline.lab.bound.reactive_bound`): the
attainment of a perfect reaction from the plan at the trace's first load change, whose
replicas serve after the same 5 s. A pair is *achievable* where the oracle and that bound
both meet 99 %; where the bound does not, the activation delay alone makes the target
impossible for a policy that holds the plan's capacity before the surge.

Reported per policy: mean and worst SLO attainment, the share of (pipeline, trace) pairs
meeting 99 %, the pairs meeting it among the achievable ones, the pairs meeting it on the
queries after the first minute (the re-planner's first look-back), and cost against the
oracle; per shape, the pairs meeting 99 % (the bound's row: the achievable ones); and for
each tuner, the pairs where the oracle met 99 % and the tuner did not, with both
attainments, P99 / SLO and the bound. A pair whose
planning sample has no feasible plan is listed as skipped, as is a policy without a
configuration on a pair (no feasible oracle, no coarse-grained configuration).

``--slowdown Q`` serves every pair on a host Q times slower than the one profiled: each
stage's model times x Q, the starting plan made on the profile as it was, the oracle (which
knows the future) planning on the served speed. The tuner scales on arrivals and sees none
of it; the re-planning tuner plans with the served speed (the simulation's calibration is
exact) and adopts the plan when the configuration running misses the SLO.

Seeds are fixed per run: ``--seeds`` (pipelines) and ``--trace-seed``; ``--fresh`` draws
new ones (:func:`sloline.lab.heldout.fresh_seed`), as each release should, and the
command that repeats the run is written with the results. ``--quick``: 3 pipelines,
90 s traces. Writes ``benchmarks/results/heldout.json`` (``heldout-quick.json``, or
``--out``): the summary and every pair's row per policy.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from sloline.lab.bound import reactive_bound
from sloline.lab.heldout import fresh_seed
from sloline.lab.heldout.pipelines import random_pipeline
from sloline.lab.heldout.shapes import SHAPES, shape_trace
from sloline.lab.problems import slower
from sloline.lab.simulate import POLICIES, simulate
from sloline.planner.planner import InfeasibleError
from sloline.planner.planner import plan as make_plan
from sloline.tuner.replan import ReplanSettings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TUNERS = ("inferline", "inferline-paper", "inferline-replan")
TARGET = 0.99
BOUND = "reactive-bound"
DEFAULT_SEEDS = (0, 1, 2, 3, 4, 5, 6, 7)
QUICK_SEEDS = (0, 1, 2)
SETTLED_S = ReplanSettings().lookback_s  # attainment also counted after the first look-back


def trace_seed(run_seed: int, pipeline_seed: int) -> int:
    """The seed of a pipeline's traces in a run: distinct per (run, pipeline)."""
    return int(np.random.SeedSequence([run_seed, pipeline_seed]).generate_state(1)[0])


def run_pair(
    pipeline_seed: int,
    shape: str,
    run_seed: int,
    duration_s: float,
    policies: tuple[str, ...],
    slowdown: float = 1.0,
) -> dict[str, Any]:
    """One (pipeline, trace) pair under every policy: the pair and one row per policy;
    served ``slowdown`` times slower than profiled."""
    pipeline = random_pipeline(pipeline_seed)
    problem = pipeline.problem
    trace = shape_trace(shape, pipeline.rate_rps, duration_s, trace_seed(run_seed, pipeline_seed))
    pair: dict[str, Any] = {
        "pipeline": problem.name,
        "layout": pipeline.layout,
        "stages": len(problem.topology),
        "conditional": pipeline.conditional is not None,
        "slo_ms": round(problem.slo_s * 1000.0, 2),
        "rate_rps": round(pipeline.rate_rps, 1),
        "shape": shape,
        "trace": trace.description,
        "queries": int(trace.arrivals_s.size),
        "policies": {},
        "skipped": [],
    }
    try:
        start = make_plan(dataclasses.replace(problem, arrivals_s=trace.planning_s))
    except InfeasibleError as exc:  # no plan for the planning sample
        pair["skipped"] = [["all", exc.reason]]
        return pair
    served = slower(problem, slowdown)
    report = simulate(served, [trace], plan=start, policies=policies)
    pair["bound"] = round(reactive_bound(served, trace, plan=start), 5)
    pair["skipped"] = [[policy, reason] for _, policy, reason in report.skipped]
    settled = trace.arrivals_s >= SETTLED_S
    for r in report.results:
        late = r.run.latencies_s[settled]
        pair["policies"][r.policy] = {
            "attainment": round(r.attainment, 5),
            "attainment_settled": round(float(np.mean(late <= problem.slo_s)), 5)
            if late.size
            else None,
            "cost_usd": round(r.cost_usd, 6),
            "p99_over_slo": round(r.tail_s / problem.slo_s, 3),
        }
    oracle = pair["policies"].get("oracle")
    for row in pair["policies"].values():
        row["cost_vs_oracle"] = (
            round(row["cost_usd"] / oracle["cost_usd"], 3) if oracle is not None else None
        )
    return pair


def summarise(pairs: list[dict[str, Any]], policies: tuple[str, ...]) -> dict[str, Any]:
    """Per policy: pairs run, attainment (mean, worst), share meeting 99 %, cost / oracle
    (median, max); per tuner, the pairs where the oracle met 99 % and it did not."""
    summary: dict[str, Any] = {}
    for policy in policies:
        rows = [p["policies"][policy] for p in pairs if policy in p["policies"]]
        if not rows:
            continue
        att = np.array([r["attainment"] for r in rows])
        cost = np.array([r["cost_vs_oracle"] for r in rows if r["cost_vs_oracle"] is not None])
        achievable = [
            p["policies"][policy]["attainment"] >= TARGET
            for p in pairs
            if policy in p["policies"] and _achievable(p)
        ]
        summary[policy] = {
            "pairs": len(rows),
            "achievable_pairs": len(achievable),
            "achievable_met": int(sum(achievable)),
            "attainment_mean": round(float(att.mean()), 5),
            "attainment_min": round(float(att.min()), 5),
            "share_meeting_99": round(float(np.mean(att >= TARGET)), 3),
            "settled_meeting_99": sum((r["attainment_settled"] or 0.0) >= TARGET for r in rows),
            "cost_vs_oracle_median": round(float(np.median(cost)), 3) if cost.size else None,
            "cost_vs_oracle_max": round(float(cost.max()), 3) if cost.size else None,
        }
    by_shape: dict[str, dict[str, str]] = {}
    for policy in summary:
        for shape in dict.fromkeys(p["shape"] for p in pairs):
            rows = [
                p["policies"][policy]
                for p in pairs
                if p["shape"] == shape and policy in p["policies"]
            ]
            met = sum(r["attainment"] >= TARGET for r in rows)
            by_shape.setdefault(policy, {})[shape] = f"{met}/{len(rows)}"
    bounds = [p for p in pairs if "bound" in p]
    for shape in dict.fromkeys(p["shape"] for p in bounds):
        rows_b = [p["bound"] for p in bounds if p["shape"] == shape]
        met = sum(b >= TARGET for b in rows_b)
        by_shape.setdefault(BOUND, {})[shape] = f"{met}/{len(rows_b)}"
    misses = []
    for pair in pairs:
        oracle = pair["policies"].get("oracle")
        if oracle is None or oracle["attainment"] < TARGET:
            continue
        for tuner in TUNERS:
            own = pair["policies"].get(tuner)
            if own is not None and own["attainment"] < TARGET:
                misses.append(
                    {
                        "pipeline": pair["pipeline"],
                        "shape": pair["shape"],
                        "policy": tuner,
                        "attainment": own["attainment"],
                        "oracle_attainment": oracle["attainment"],
                        "p99_over_slo": own["p99_over_slo"],
                        "oracle_p99_over_slo": oracle["p99_over_slo"],
                        "cost_vs_oracle": own["cost_vs_oracle"],
                        "bound": pair.get("bound"),
                    }
                )
    return {"policies": summary, "by_shape": by_shape, "tuner_misses": misses}


def _achievable(pair: dict[str, Any]) -> bool:
    """Whether 99 % is within reach on the pair: the oracle meets it and so does the
    reactive bound (a perfect reaction from the plan, 5 s activation)."""
    oracle = pair["policies"].get("oracle")
    return (
        oracle is not None and oracle["attainment"] >= TARGET and pair.get("bound", 1.0) >= TARGET
    )


def _pct(value: float) -> str:
    """A fraction as a percentage truncated (not rounded) to 0.01 %, so that a miss of
    the 99 % target never prints as 99.00 %."""
    return f"{math.floor(value * 10000.0) / 100.0:.2f}%"


def policy_table(summary: dict[str, Any]) -> str:
    lines = [
        "| policy | pairs | attainment mean (worst) | pairs >= 99% | >= 99% where achievable "
        f"| >= 99% after {SETTLED_S:g} s | cost / oracle median (max) |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for policy, s in summary["policies"].items():
        cost = (
            "-"
            if s["cost_vs_oracle_median"] is None
            else f"{s['cost_vs_oracle_median']:.2f} ({s['cost_vs_oracle_max']:.2f})"
        )
        lines.append(
            f"| {policy} | {s['pairs']} "
            f"| {_pct(s['attainment_mean'])} ({_pct(s['attainment_min'])}) "
            f"| {s['share_meeting_99']:.0%} "
            f"| {s['achievable_met']}/{s['achievable_pairs']} "
            f"| {s['settled_meeting_99']}/{s['pairs']} | {cost} |"
        )
    return "\n".join(lines)


def shape_table(summary: dict[str, Any]) -> str:
    shapes = list(next(iter(summary["by_shape"].values()), {}))
    lines = [
        "| policy | " + " | ".join(shapes) + " |",
        "|---|" + "---:|" * len(shapes),
    ]
    lines.extend(
        f"| {policy} | " + " | ".join(cells[s] for s in shapes) + " |"
        for policy, cells in summary["by_shape"].items()
    )
    return "\n".join(lines)


def miss_table(summary: dict[str, Any]) -> str:
    if not summary["tuner_misses"]:
        return "(none)"
    lines = [
        "| pipeline | trace | tuner | attainment (oracle) | P99 / SLO (oracle) | cost / oracle "
        "| reactive bound |",
        "|---|---|---|---|---|---:|---|",
    ]
    lines.extend(
        f"| {m['pipeline']} | {m['shape']} | {m['policy']} "
        f"| {_pct(m['attainment'])} ({_pct(m['oracle_attainment'])}) "
        f"| {m['p99_over_slo']:.2f} ({m['oracle_p99_over_slo']:.2f}) "
        f"| {m['cost_vs_oracle']:.2f} | {_bound(m['bound'])} |"
        for m in summary["tuner_misses"]
    )
    return "\n".join(lines)


def _bound(bound: float | None) -> str:
    if bound is None:
        return "-"
    return f"{_pct(bound)} ({'delay-bound' if bound < TARGET else 'achievable'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 pipelines, 90 s traces")
    parser.add_argument("--seeds", type=int, nargs="+", help="pipeline seeds")
    parser.add_argument("--trace-seed", type=int, default=0, help="seed of the traces")
    parser.add_argument("--fresh", action="store_true", help="draw fresh seeds (a release)")
    parser.add_argument("--pipelines", type=int, help="with --fresh: how many pipelines")
    parser.add_argument("--duration", type=float, help="live trace length, seconds")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument(
        "--slowdown", type=float, default=1.0, help="serve on a host this many times slower"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--out", help="results file: a name under benchmarks/results/, or an absolute path"
    )
    args = parser.parse_args(argv)
    if "oracle" not in args.policies:
        parser.error("--policies must include oracle (costs are reported against it)")
    if not (math.isfinite(args.slowdown) and args.slowdown > 0.0):
        parser.error(f"--slowdown must be a finite number > 0, got {args.slowdown:g}")
    defaults = QUICK_SEEDS if args.quick else DEFAULT_SEEDS
    if args.fresh:
        seeds = [fresh_seed() for _ in range(args.pipelines or len(defaults))]
        run_seed = fresh_seed()
    else:
        seeds = list(args.seeds or defaults)
        run_seed = args.trace_seed
    duration = args.duration or (90.0 if args.quick else 300.0)
    policies = tuple(args.policies)
    command = (
        f"python benchmarks/heldout.py --seeds {' '.join(map(str, seeds))} "
        f"--trace-seed {run_seed} --duration {duration:g} --shapes {' '.join(args.shapes)}"
        + (f" --slowdown {args.slowdown:g}" if args.slowdown != 1.0 else "")
    )
    print(command)
    started = time.perf_counter()
    jobs = [
        (s, shape, run_seed, duration, policies, args.slowdown)
        for s in seeds
        for shape in args.shapes
    ]
    with concurrent.futures.ProcessPoolExecutor(max(1, args.workers)) as pool:
        pairs = list(pool.map(run_pair, *zip(*jobs, strict=True)))
    elapsed = time.perf_counter() - started
    summary = summarise(pairs, policies)
    print(f"\n## {len(pairs)} (pipeline, trace) pairs, {duration:g} s traces\n")
    print(policy_table(summary))
    print("\n## Pairs meeting 99 % per trace shape\n")
    print(shape_table(summary))
    print("\n## Pairs where the oracle met 99 % and a tuner did not\n")
    print(miss_table(summary))
    skipped = [[p["pipeline"], p["shape"], *s] for p in pairs for s in p["skipped"]]
    if skipped:
        print("\nskipped:", "; ".join(" ".join(map(str, s)) for s in skipped))
    print(f"\nruntime: {elapsed:.0f} s on {os.cpu_count()} CPUs")
    out = RESULTS / (args.out or ("heldout-quick.json" if args.quick else "heldout.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": {
            "command": command,
            "pipeline_seeds": seeds,
            "trace_seed": run_seed,
            "duration_s": duration,
            "shapes": args.shapes,
            "slowdown": args.slowdown,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
            "runtime_s": round(elapsed, 1),
        },
        **summary,
        "skipped": skipped,
        "pairs": pairs,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
