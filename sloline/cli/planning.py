"""`sloline validate`, `sloline profile` and `sloline plan`, and the profile-then-plan
steps that `run`, `calibrate` and command plugins share."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sloline.cli.flags import (
    add_output_flag,
    add_planning_flags,
    add_profile_flags,
    catalog,
    flag_error,
)
from sloline.spec import Issue, LoadedPipeline, PipelineError, load_pipeline

if TYPE_CHECKING:
    from sloline.measure.session import PlanningSession
    from sloline.planner.calibration import Calibration
    from sloline.planner.profile import PipelineProfile


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a pipeline file")
    p.add_argument("file", help="the pipeline file (PredictionPipeline YAML)")
    add_output_flag(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("profile", help="measure each stage on each hardware class (cached)")
    p.add_argument("file", help="the pipeline file")
    p.add_argument("--out", help="write the profile as JSON")
    add_profile_flags(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("plan", help="profile (cached) and plan hardware, batch and replicas")
    p.add_argument("file", help="the pipeline file")
    p.add_argument("--out", help="write the plan as YAML (or JSON if the name ends .json)")
    p.add_argument("--cdf", help="draw the estimated latency CDF vs the SLO to this PNG")
    add_output_flag(p)
    add_planning_flags(p)
    p.set_defaults(func=cmd_plan)


def cmd_validate(args: argparse.Namespace) -> int:
    import json

    from sloline.cli import EXIT_INVALID

    try:
        loaded = load_pipeline(args.file)
        issues = loaded.check_files()
        issues += model_issues(loaded, {issue.path for issue in issues})
        if issues:
            raise PipelineError(issues, str(args.file))
    except PipelineError as exc:
        if args.output != "json":
            raise
        found = [{"path": i.path, "reason": i.reason} for i in exc.issues]
        print(json.dumps({"ok": False, "issues": found}))
        return EXIT_INVALID
    spec = loaded.pipeline.spec
    edges = [(name, child) for name in loaded.graph.order for child in loaded.graph.children[name]]
    if args.output == "json":
        summary = {
            "ok": True,
            "pipeline": loaded.name,
            "stages": list(loaded.graph.order),
            "edges": [list(edge) for edge in edges],
            "output": spec.output,
            "slo": {"percentile": spec.slo.percentile, "latencyMs": spec.slo.latency_ms},
        }
        print(json.dumps(summary))
        return 0
    print(
        f"ok: pipeline {loaded.name!r}: {len(spec.stages)} stages, output {spec.output!r}, "
        f"SLO p{spec.slo.percentile:g} {spec.slo.latency_ms:g} ms\n{draw_dag(loaded)}"
    )
    return 0


def draw_dag(loaded: LoadedPipeline) -> str:
    """The DAG as one line per stage with children: `a -> b, c` (in topological order),
    plus stages with neither parents nor children on their own line."""
    graph = loaded.graph
    lines = []
    for name in graph.order:
        children = graph.children[name]
        if children:
            lines.append(f"  {name} -> {', '.join(children)}")
        elif not graph.stages[name].deps:
            lines.append(f"  {name}")
    return "\n".join(lines)


def model_issues(loaded: LoadedPipeline, known: set[str]) -> list[Issue]:
    """Load each stage's model (as a worker would, on the CPU) and report what does not
    match the spec: a missing file, an entrypoint that does not import, input or output
    names, datatypes and shapes; stages whose paths already have an issue are skipped."""
    from sloline.runtimes.base import ModelError
    from sloline.runtimes.runner import load_pipeline_stage

    issues = []
    for name in loaded.graph.order:
        node = loaded.graph.stages[name]
        path = f"spec.stages[{node.index}].model"
        if any(k.startswith(path) for k in known):
            continue
        try:
            load_pipeline_stage(loaded, name)
        except ModelError as exc:
            issues.append(Issue(path, str(exc)))
        except Exception as exc:
            issues.append(Issue(path, f"does not load: {type(exc).__name__}: {exc}"))
    return issues


def measure_profile(args: argparse.Namespace, loaded: LoadedPipeline) -> PipelineProfile:
    """The pipeline's profile (cached) as the profile flags ask."""
    from sloline.measure.profiler import ProfilerSettings, profile_pipeline

    hardware = catalog(args)
    settings = ProfilerSettings(
        hardware=tuple(args.profile_hardware.split(",")) if args.profile_hardware else (),
        max_batch_cap=args.cap,
        force=args.force,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
    )
    unknown = [name for name in settings.hardware if name not in hardware.names()]
    if unknown:
        raise flag_error("--profile-hardware", f"{unknown} not in the catalog ({hardware.names()})")
    if loaded.pipeline.spec.samples is None:
        print(
            "warning: the pipeline declares no spec.samples; profiling with zero inputs "
            "(scale factors of conditional stages will be wrong)",
            file=sys.stderr,
        )
    return profile_pipeline(
        loaded,
        hardware,
        settings,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )


def cmd_profile(args: argparse.Namespace) -> int:
    import json

    loaded = load_pipeline(args.file)
    profile = measure_profile(args, loaded)
    print(f"pipeline {loaded.name!r}: hop overhead {profile.hop_s * 1000:.3f} ms")
    print(f"{'stage':<16}{'hardware':<12}{'s_m':>6}  batch: p50 ms (p99 ms)")
    for stage, per_hw in profile.stages.items():
        for hw, prof in per_hw.items():
            cells = "  ".join(
                f"{p.batch_size}: {p.p50_s * 1000:.2f} ({p.p99_s * 1000:.2f})" for p in prof.points
            )
            print(f"{stage:<16}{hw:<12}{profile.scale_factors[stage]:>6.2f}  {cells}")
    if args.out:
        Path(args.out).write_text(json.dumps(profile.to_dict(), indent=1))
        print(f"profile written to {args.out}")
    return 0


def load_calibration(args: argparse.Namespace, loaded: LoadedPipeline) -> Calibration | None:
    """The ``--calibration`` file, checked before anything is profiled."""
    from sloline.planner.calibration import Calibration

    if not getattr(args, "calibration", None):
        return None
    try:
        calibration = Calibration.load(Path(args.calibration))
    except ValueError as exc:
        raise flag_error("--calibration", str(exc)) from None
    if calibration.pipeline != loaded.name:
        raise flag_error(
            "--calibration",
            f"{args.calibration} calibrates pipeline {calibration.pipeline!r}, not {loaded.name!r}",
        )
    return calibration


def plan_session(
    args: argparse.Namespace,
    loaded: LoadedPipeline,
    profile: PipelineProfile | None = None,
    calibration: Calibration | None = None,
) -> PlanningSession:
    """Profile (cached), apply ``--calibration`` if given (or ``calibration``, already
    loaded), and plan; `main` reports an InfeasibleError."""
    from sloline.measure.session import plan_pipeline

    calibration = calibration or load_calibration(args, loaded)
    profile = profile or measure_profile(args, loaded)
    if calibration is not None:
        try:
            profile = calibration.apply(profile)
        except ValueError as exc:
            raise flag_error("--calibration", str(exc)) from None
        print(calibration.summary(), file=sys.stderr, flush=True)
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    return plan_pipeline(loaded, catalog(args), progress=progress, profile=profile)


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    import yaml

    from sloline.measure.session import plot_latency_cdf

    session = plan_session(args, load_pipeline(args.file))
    if args.output == "json":
        print(json.dumps(session.plan.to_dict()))
    else:
        print(session.plan.to_table())
    if args.out:
        data = session.plan.to_dict()
        text = json.dumps(data, indent=1) if args.out.endswith(".json") else yaml.safe_dump(data)
        Path(args.out).write_text(text)
        print(f"plan written to {args.out}", file=sys.stderr if args.output == "json" else None)
    if args.cdf:
        plot_latency_cdf(session, Path(args.cdf))
        print(
            f"latency CDF drawn to {args.cdf}", file=sys.stderr if args.output == "json" else None
        )
    return 0
