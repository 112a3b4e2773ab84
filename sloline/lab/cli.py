"""`sloline simulate`, the lab's command, plugged into the `sloline` command line
through the entry point ``simulate`` of the group ``sloline.commands`` (pyproject.toml)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sloline.cli.flags import add_planning_flags, flag_error
from sloline.cli.planning import plan_session
from sloline.spec import load_pipeline


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="closed-loop simulation of the tuner vs baselines")
    p.add_argument("file", help="the pipeline file")
    p.add_argument(
        "--trace",
        action="append",
        metavar="ramp|burst|spike|autoscale|all|FILE",
        help="trace family or a file of arrival times (repeatable; default all)",
    )
    p.add_argument("--policies", default="", help="comma-separated (default: all)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink trace durations (0.1)")
    p.add_argument("--out-dir", help="draw one PNG per trace here")
    add_planning_flags(p)
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from sloline.lab.simulate import POLICIES, simulate
    from sloline.lab.traces import Trace, standard_traces

    session = plan_session(args, load_pipeline(args.file))
    families = {t.name: t for t in standard_traces(session.plan.rate_rps, scale=args.scale)}
    traces: list[Trace] = []
    for name in args.trace or ["all"]:
        if name == "all":
            traces.extend(families.values())
        elif name in families:
            traces.append(families[name])
        else:
            try:
                traces.append(Trace.from_timestamps(Path(name).stem, np.loadtxt(name, ndmin=1)))
            except (OSError, ValueError) as exc:
                raise flag_error(
                    "--trace",
                    f"{name!r} is neither {sorted(families)} nor a readable "
                    f"file of arrival times ({exc})",
                ) from None
    policies = args.policies.split(",") if args.policies else list(POLICIES)
    report = simulate(session.problem, traces, plan=session.plan, policies=policies)
    print(report.to_markdown())
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        report.plot(out)
        print(f"plots written to {out}/")
    return 0
