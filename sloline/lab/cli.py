"""`sloline simulate`, the lab's command, plugged into the `sloline` command line
through the entry point ``simulate`` of the group ``sloline.commands`` (pyproject.toml)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sloline.cli.flags import add_output_flag, add_planning_flags, flag_error
from sloline.cli.planning import plan_session
from sloline.spec import load_pipeline

if TYPE_CHECKING:
    from sloline.lab.report import SimulationReport
    from sloline.lab.traces import Trace


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="closed-loop simulation of the tuner vs baselines")
    p.add_argument("file", help="the pipeline file")
    p.add_argument(
        "--trace",
        action="append",
        metavar="ramp|burst|spike|autoscale|all|FILE",
        help="trace family (planned for the pipeline's workload) or a trace file: one "
        "arrival time in seconds per line, as spec.workload.traceUri; its first 25%% of "
        "time is the planning sample the plan is made for, the rest is served live "
        "(repeatable; default all)",
    )
    p.add_argument("--policies", default="", help="comma-separated (default: all)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink trace durations (0.1)")
    p.add_argument("--out-dir", help="draw one PNG per trace here")
    add_output_flag(p)
    add_planning_flags(p)
    p.set_defaults(func=cmd_simulate)


def read_trace_file(name: str) -> Trace:
    """A recorded trace from a trace file (``--trace FILE``), split into its planning
    sample and live part (:meth:`Trace.from_timestamps`); its arrival times follow the
    planning trace's rules (:func:`sloline.common.trace.arrival_problem`)."""
    from sloline.common.trace import arrival_problem
    from sloline.lab.traces import Trace
    from sloline.planner.workload import parse_arrival_times

    try:
        times = parse_arrival_times(Path(name).read_text())
    except (OSError, ValueError) as exc:
        raise flag_error(
            "--trace", f"{name!r} is neither a trace family nor a readable trace file ({exc})"
        ) from None
    problem = arrival_problem(times)
    if problem:
        raise flag_error("--trace", f"{name}: {problem}")
    try:
        trace = Trace.from_timestamps(Path(name).stem, times)
    except ValueError as exc:
        raise flag_error("--trace", f"{name}: {exc}") from None
    problem = arrival_problem(trace.planning_s)
    if problem:
        raise flag_error("--trace", f"{name}: its planning sample: {problem}")
    return trace


def cmd_simulate(args: argparse.Namespace) -> int:
    from sloline.lab.report import SimulationReport
    from sloline.lab.simulate import POLICIES, simulate
    from sloline.lab.traces import standard_traces
    from sloline.planner.planner import plan

    session = plan_session(args, load_pipeline(args.file))
    families = {t.name: t for t in standard_traces(session.plan.rate_rps, scale=args.scale)}
    names = args.trace or ["all"]
    wanted = [t for t in families.values() if "all" in names or t.name in names]
    files = [read_trace_file(name) for name in names if name != "all" and name not in families]
    policies = args.policies.split(",") if args.policies else list(POLICIES)
    reports: list[SimulationReport] = []
    if wanted:
        reports.append(simulate(session.problem, wanted, plan=session.plan, policies=policies))
    for trace in files:  # planned for its own planning sample, not the pipeline's workload
        start = plan(dataclasses.replace(session.problem, arrivals_s=trace.planning_s))
        log = sys.stderr if args.output == "json" else sys.stdout
        print(f"trace {trace.name}: {trace.description}", file=log)
        print(start.to_table(), file=log)
        reports.append(simulate(session.problem, [trace], plan=start, policies=policies))
    report = functools.reduce(SimulationReport.joined, reports)
    if args.output == "json":
        print(json.dumps(report_json(report)))
    else:
        print(report.to_markdown())
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        report.plot(out)
        print(f"plots written to {out}/", file=sys.stderr if args.output == "json" else None)
    return 0


def report_json(report: SimulationReport) -> dict[str, object]:
    """The report's rows for scripts (`-o json`); an unrecovered load change is null."""
    return {
        "pipeline": report.pipeline,
        "sloMs": report.slo_s * 1e3,
        "percentile": report.percentile,
        "results": [
            {
                "trace": r.trace,
                "policy": r.policy,
                "queries": r.queries,
                "attainment": r.attainment,
                "costUsd": r.cost_usd,
                "tailMs": r.tail_s * 1e3,
                "recoveryS": [None if math.isinf(x) else x for x in r.recovery_s],
                "scaleEvents": r.scale_events,
            }
            for r in report.results
        ],
        "skipped": [{"trace": t, "policy": p, "why": why} for t, p, why in report.skipped],
    }
