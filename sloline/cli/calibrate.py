"""`sloline calibrate`: its flags; the workflow is `sloline.measure.calibrate.calibrate_plan`."""

from __future__ import annotations

import argparse
from pathlib import Path

from sloline.cli.flags import add_profile_flags, catalog, flag_error
from sloline.cli.planning import plan_session
from sloline.spec import load_pipeline


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="serve the plan under its planning load; measure what the profile misses",
    )
    p.add_argument("file", help="the pipeline file")
    p.add_argument("--out", "-o", help="calibration file (default: PIPELINE.calibration.json here)")
    p.add_argument(
        "--duration", type=float, default=20.0, help="seconds of the planning trace to serve (20)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="serve the plan made with each calibration again, until it stops changing or "
        "this many plans were served (1)",
    )
    add_profile_flags(p)
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from sloline.embedded import check_models
    from sloline.measure.calibrate import calibrate_plan
    from sloline.measure.session import planning_trace

    loaded = load_pipeline(args.file)
    if not args.duration > 0.0:
        raise flag_error("--duration", f"must be > 0 seconds, got {args.duration:g}")
    if args.rounds < 1:
        raise flag_error("--rounds", f"must be at least 1, got {args.rounds}")
    out = Path(args.out or f"{loaded.name}.calibration.json")
    if not out.resolve().parent.is_dir():
        raise flag_error("--out", f"{out}: no such directory")
    trace = planning_trace(loaded)
    if not (trace < args.duration).any():
        raise flag_error("--duration", f"the planning trace has no arrival in {args.duration:g} s")
    check_models(loaded)
    calibrate_plan(
        loaded,
        catalog(args),
        plan_session(args, loaded),
        trace,
        duration_s=args.duration,
        rounds=args.rounds,
        out=out,
        pipeline_file=args.file,
        report=lambda line: print(line, flush=True),
    )
    return 0
