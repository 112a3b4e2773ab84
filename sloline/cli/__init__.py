"""The `sloline` command line. Settings are parsed here, once, and passed down.

Exit codes: 0 success, 1 runtime failure, 2 invalid input (bad pipeline file, bad flag).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloline import __version__
from sloline.backends.local import WORKER_NICE
from sloline.serving.auth import AuthConfigError
from sloline.spec import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    Issue,
    LoadedPipeline,
    PipelineError,
    load_catalog,
    load_pipeline,
)

if TYPE_CHECKING:
    import numpy as np

    from sloline.common.tensors import Arrays
    from sloline.measure.session import PlanningSession
    from sloline.planner.calibration import Calibration
    from sloline.planner.estimator import Estimate
    from sloline.planner.plan import Plan
    from sloline.planner.profile import PipelineProfile
    from sloline.tuner.replan import ReplanSettings

EXIT_INVALID = 2
CALIBRATION_WARMUP_BATCHES = 20  # `run --calibration-out`: each stage's first batches warm up


def _assignments(values: Sequence[str], flag: str, kind: type = int) -> dict[str, object]:
    """Parse repeated `stage=value` flags."""
    out: dict[str, object] = {}
    for text in values:
        name, eq, value = text.partition("=")
        if not eq or not name:
            raise PipelineError([Issue(flag, f"expected STAGE=VALUE, got {text!r}")], "flags")
        try:
            out[name] = kind(value)
        except ValueError:
            raise PipelineError(
                [Issue(flag, f"{value!r} is not a valid {kind.__name__}")], "flags"
            ) from None
        if kind is int and int(value) < (0 if flag == "--replicas" else 1):
            raise PipelineError([Issue(flag, f"{text!r}: value too small")], "flags")
    return out


def cmd_validate(args: argparse.Namespace) -> int:
    loaded = load_pipeline(args.file)
    issues = loaded.check_files()
    if issues:
        raise PipelineError(issues, str(args.file))
    spec = loaded.pipeline.spec
    print(
        f"ok: pipeline {loaded.name!r}: {len(spec.stages)} stages "
        f"({' -> '.join(loaded.graph.order)}), output {spec.output!r}, "
        f"SLO p{spec.slo.percentile:g} {spec.slo.latency_ms:g} ms"
    )
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    import yaml

    from sloline.spec.crd import crd_manifest
    from sloline.spec.reference import reference_markdown

    if args.reference:
        print(reference_markdown(), end="")
    else:
        print(yaml.safe_dump(crd_manifest(), sort_keys=False), end="")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from sloline.model_server.worker import WorkerSettings
    from sloline.model_server.worker import main as worker_main
    from sloline.serving.auth import worker_token

    if not 0 <= args.nice <= 19:
        raise _flag_error("--nice", f"must be 0-19 (a lower priority), got {args.nice}")
    token = worker_token(args.token_file)
    if token is None:
        logging.getLogger(__name__).warning(
            "no worker token ($SLOLINE_WORKER_TOKEN or --token-file): only a router "
            "started with --insecure-workers will accept this worker"
        )
    return worker_main(
        WorkerSettings(
            pipeline_file=Path(args.pipeline),
            stage=args.stage,
            router=args.router,
            token=token,
            threads=args.threads,
            cuda_device=args.cuda_device,
            hardware=args.hardware,
            worker_id=args.worker_id,
            parent_pid=args.parent_pid,
            cpus=tuple(int(c) for c in args.cpus.split(",")) if args.cpus else (),
            nice=args.nice,
            health_host=args.health_host,
            health_port=args.health_port,
            stop_timeout_s=args.stop_timeout_s,
        )
    )


def cmd_run(args: argparse.Namespace) -> int:
    from sloline.embedded import EmbeddedPipeline, EmbeddedSettings, check_models, stage_configs
    from sloline.serving import process
    from sloline.serving.router import RouterSettings
    from sloline.serving.server import ServerSettings

    loaded = load_pipeline(args.file)
    catalog = _catalog(args)
    settings = EmbeddedSettings(
        server=ServerSettings(
            host=args.host, http_port=args.port, grpc_port=args.grpc_port, **_front_door(args)
        ),
        router=RouterSettings(queue_capacity=args.queue_capacity, admission=not args.no_admission),
        catalog=catalog,
        replicas=_assignments(args.replicas, "--replicas"),  # type: ignore[arg-type]
        max_batch=_assignments(args.max_batch, "--max-batch"),  # type: ignore[arg-type]
        hardware=_assignments(args.hardware, "--hardware", str),  # type: ignore[arg-type]
        log_dir=Path(args.log_dir) if args.log_dir else None,
        tuner=not args.no_tuner,
        worker_nice=args.worker_nice,
        replan=_replan_settings(args),
    )
    if not 0 <= args.worker_nice <= 19:
        raise _flag_error("--worker-nice", f"must be 0-19, got {args.worker_nice}")
    replace(settings.server, insecure_workers=True).check()  # TLS flags, before profiling
    stage_configs(loaded, settings)  # reject bad flags before spending time on profiling
    if args.calibration_out and args.no_plan:
        raise _flag_error("--calibration-out", "compares serving with the profile: drop --no-plan")
    if args.calibration_out and not Path(args.calibration_out).resolve().parent.is_dir():
        raise _flag_error("--calibration-out", f"{args.calibration_out}: no such directory")
    calibration = _load_calibration(args, loaded)  # rejected before profiling
    plan = profile = problem = None
    if not args.no_plan:
        check_models(loaded)
        profile = _profile(args, loaded)
        if profile.overhead is not None:  # plan for the workers' priority they will run at
            overhead = replace(profile.overhead, worker_nice=args.worker_nice)
            profile = replace(profile, overhead=overhead)
        session = _plan(args, loaded, profile, calibration)
        plan, problem = session.plan, session.problem
        print(plan.to_table())
    configs = stage_configs(loaded, settings, plan)
    pipeline = EmbeddedPipeline(loaded, settings, configs=configs, plan=plan, problem=problem)
    return process.run(_serve(pipeline, args, profile))


def _replan_settings(args: argparse.Namespace) -> ReplanSettings | None:
    """``--replan``'s settings; rejected where it cannot work: it re-plans the tuner's
    plan, and flags that fix a stage's hardware, batch or replicas would be overridden."""
    from sloline.tuner.replan import ReplanSettings

    if args.replan is None:
        return None
    if not args.replan > 0:
        raise _flag_error("--replan", f"the interval must be > 0 seconds, got {args.replan:g}")
    for flag, given in (
        ("--no-plan", args.no_plan),
        ("--no-tuner", args.no_tuner),
        ("--replicas", args.replicas),
        ("--max-batch", args.max_batch),
        ("--hardware", args.hardware),
    ):
        if given:
            raise _flag_error(
                "--replan",
                f"cannot be combined with {flag}: re-planning changes what the plan and "
                "the tuner chose (pin a stage in the pipeline spec instead)",
            )
    return ReplanSettings(interval_s=args.replan)


def _calibrate(pipeline: object, profile: PipelineProfile, since: float, path: Path) -> None:
    """Measure a calibration from the router's records since ``since`` and write it."""
    from sloline.embedded import EmbeddedPipeline
    from sloline.measure.calibrate import measure_served

    assert isinstance(pipeline, EmbeddedPipeline)
    try:
        calibration = measure_served(
            pipeline, profile, since, warmup_batches=CALIBRATION_WARMUP_BATCHES
        )
        calibration.save(path)
    except (KeyError, ValueError, OSError) as exc:  # e.g. --hardware on an unprofiled class
        print(f"error: calibration not written to {path}: {exc}", file=sys.stderr, flush=True)
        return
    print(f"{calibration.summary()}\ncalibration written to {path}", flush=True)


async def _serve(
    pipeline: object, args: argparse.Namespace, profile: PipelineProfile | None = None
) -> int:
    from sloline.cli.status import render_status
    from sloline.embedded import EmbeddedPipeline
    from sloline.serving import process
    from sloline.serving.stats import Window

    assert isinstance(pipeline, EmbeddedPipeline)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with pipeline as p:
        process.freeze_startup_heap()  # after planning and start-up
        spec = p.loaded.pipeline.spec
        print(
            f"sloline {__version__}: serving pipeline {p.loaded.name!r} "
            f"(SLO p{spec.slo.percentile:g} {spec.slo.latency_ms:g} ms)"
        )
        for name, config in p.configs.items():
            print(
                f"  stage {name}: {config.replicas} x {config.hardware}, "
                f"max batch {config.max_batch}"
            )
        scheme = "https" if p.settings.server.tls else "http"
        print(
            f"  HTTP  {scheme}://{p.http_url}/v2/models/{p.loaded.name}/infer\n"
            f"  gRPC  {p.grpc_url}  (GRPCInferenceService, model {p.loaded.name!r})\n"
            f"  metrics {scheme}://{p.http_url}/metrics\n"
            f"  worker logs {p.backend.log_dir if p.backend else '-'}\n"
            "  Ctrl-C to stop",
            flush=True,
        )
        started = time.monotonic()
        serving_since = p.router.clock()
        interval = args.status_interval
        redraw = sys.stdout.isatty()
        drawn = 0
        while not stop.is_set():
            # Without a status line, sleep until stopped (or until --duration ends).
            timeout = interval if interval > 0 else None
            if args.duration:
                left = max(0.0, args.duration - (time.monotonic() - started))
                timeout = left if timeout is None else min(timeout, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            if args.duration and time.monotonic() - started >= args.duration:
                break
            if interval <= 0 or stop.is_set():
                continue
            now = time.monotonic()
            stats, router = p.router.stats, p.router
            status = p.backend.status() if p.backend else {}
            replicas = router.replicas()
            text = render_status(
                p.loaded.name,
                spec.slo.latency_ms,
                Window.of(stats.latency.since(now - interval * 5), interval * 5),
                stats.attainment(now, 60.0, router.slo_s),
                {
                    n: (
                        status[n],
                        replicas[n][1],
                        len(router.queues[n]),
                        Window.of(stats.stage_latency[n].since(now - interval * 5), interval * 5),
                        Window.of(stats.stage_batch[n].since(now - interval * 5), interval * 5),
                    )
                    for n in router.queues
                },
                [f"{n}: {s.last_error}" for n, s in status.items() if s.last_error]
                + [
                    f"tuner {now - t:4.0f}s ago: {d.stage} {d.from_replicas}->{d.to_replicas}: "
                    f"{d.reason}"
                    for t, d in list(p.tuner.history if p.tuner else [])[-3:]
                ]
                + [
                    f"re-plan {now - t:4.0f}s ago: ${a.cost_per_hour:.3f}/hour for "
                    f"{a.rate_rps:.1f} rps: "
                    + ", ".join(
                        f"{s.name} {s.replicas}x{s.hardware}/b{s.max_batch}" for s in a.stages
                    )
                    for t, a in (p.replanner.adopted if p.replanner else [])[-1:]
                ],
            )
            if redraw and drawn:
                sys.stdout.write(f"\x1b[{drawn}F\x1b[J")  # redraw the status block in place
            print(text, flush=True)
            drawn = text.count("\n") + 1
        if args.calibration_out and profile is not None:
            _calibrate(p, profile, serving_since, Path(args.calibration_out))
        print("stopping: draining in-flight requests, then workers", flush=True)
    return 0


def _front_door(args: argparse.Namespace) -> dict[str, Any]:
    """ServerSettings fields of the client doors' TLS, bearer-token and limit flags."""
    from sloline.serving.auth import read_token_file

    out: dict[str, Any] = {
        **_limits(args),
        "tls_cert": Path(args.tls_cert) if args.tls_cert else None,
        "tls_key": Path(args.tls_key) if args.tls_key else None,
        "tls_client_ca": Path(args.tls_client_ca) if args.tls_client_ca else None,
    }
    if args.auth_token_file:
        out["auth_tokens"] = read_token_file(args.auth_token_file, "--auth-token-file")
    return out


def _add_front_door_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTP and gRPC over TLS: certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--tls-client-ca", metavar="PEM", help="require client certificates signed by this CA"
    )
    p.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="require 'Authorization: Bearer <token>' (HTTP) / authorization metadata "
        "(gRPC) with one of the tokens in FILE, one per line (health probes stay open)",
    )


def cmd_router(args: argparse.Namespace) -> int:
    from sloline.serving import process
    from sloline.serving.auth import worker_token
    from sloline.serving.router import RouterSettings
    from sloline.serving.server import ServerSettings
    from sloline.standalone import describe, load_plan, standalone_router

    loaded = load_pipeline(args.pipeline)
    plan = load_plan(args.plan) if args.plan else None
    token = worker_token(args.worker_token_file, flag="--worker-token-file")
    if token is None and not args.insecure_workers:
        raise _flag_error(
            "--worker-token-file",
            "no worker token: set $SLOLINE_WORKER_TOKEN or give --worker-token-file (the "
            "workers need the same token), or accept any worker with --insecure-workers",
        )
    server = ServerSettings(
        host=args.host,
        http_port=args.port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        worker_host=args.worker_host or args.host,
        worker_port=args.worker_port,
        worker_token=token,
        insecure_workers=token is None,
        **_front_door(args),
    )
    server.check()
    app = standalone_router(
        loaded,
        plan,
        server=server,
        router=RouterSettings(queue_capacity=args.queue_capacity, admission=not args.no_admission),
        drain_s=args.drain_s,
    )

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with app:
            process.freeze_startup_heap()
            print(f"sloline {__version__}: {describe(app, plan)}", flush=True)
            await stop.wait()
            print(
                f"stopping: refusing new requests, draining {app.router.inflight} in flight",
                flush=True,
            )
        return 0

    return process.run(serve())


def _flag_error(flag: str, reason: str) -> PipelineError:
    return PipelineError([Issue(flag, reason)], "flags")


# Front-door limits (docs/operations.md "Front-door limits"): flag -> ServerSettings field.
_LIMIT_FLAGS: dict[str, tuple[type, str]] = {
    "max_json_body_bytes": (int, "largest all-JSON request body (4 MiB); binary: 64 MiB"),
    "max_buffered_body_bytes": (int, "request bodies held at once; more: 503 (512 MiB)"),
    "header_timeout_s": (float, "close a connection without complete headers after this (10)"),
    "body_timeout_s": (float, "answer 408 to a body not complete this long after headers (60)"),
    "keepalive_timeout_s": (float, "close an idle keep-alive HTTP connection after this (5)"),
    "max_connections": (int, "open HTTP connections; more are answered 503 (2048)"),
    "grpc_max_connections": (int, "open gRPC connections (2048)"),
    "grpc_max_concurrent_rpcs": (int, "gRPC calls at once; more: RESOURCE_EXHAUSTED (8192)"),
    "grpc_max_concurrent_streams": (int, "gRPC calls at once per connection (4096)"),
    "grpc_idle_s": (float, "close a gRPC connection without calls after this (300)"),
    "grpc_max_age_s": (float, "close gRPC connections this old, gracefully (off)"),
}


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    for name, (kind, help) in _LIMIT_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, help=help)


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """The front-door limits given on the command line (the rest keep their defaults)."""
    return {name: getattr(args, name) for name in _LIMIT_FLAGS if getattr(args, name) is not None}


def _catalog(args: argparse.Namespace) -> HardwareCatalog:
    return load_catalog(args.catalog) if getattr(args, "catalog", None) else DEFAULT_CATALOG


def _profile(args: argparse.Namespace, loaded: LoadedPipeline) -> PipelineProfile:
    from sloline.measure.profiler import ProfilerSettings, profile_pipeline

    settings = ProfilerSettings(
        hardware=tuple(args.profile_hardware.split(",")) if args.profile_hardware else (),
        max_batch_cap=args.cap,
        force=args.force,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
    )
    if loaded.pipeline.spec.samples is None:
        print(
            "warning: the pipeline declares no spec.samples; profiling with zero inputs "
            "(scale factors of conditional stages will be wrong)",
            file=sys.stderr,
        )
    return profile_pipeline(
        loaded,
        _catalog(args),
        settings,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )


def cmd_profile(args: argparse.Namespace) -> int:
    import json

    loaded = load_pipeline(args.file)
    profile = _profile(args, loaded)
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


def _load_calibration(args: argparse.Namespace, loaded: LoadedPipeline) -> Calibration | None:
    """The ``--calibration`` file, checked before anything is profiled."""
    from sloline.planner.calibration import Calibration

    if not getattr(args, "calibration", None):
        return None
    try:
        calibration = Calibration.load(Path(args.calibration))
    except ValueError as exc:
        raise _flag_error("--calibration", str(exc)) from None
    if calibration.pipeline != loaded.name:
        raise _flag_error(
            "--calibration",
            f"{args.calibration} calibrates pipeline {calibration.pipeline!r}, not {loaded.name!r}",
        )
    return calibration


def _plan(
    args: argparse.Namespace,
    loaded: LoadedPipeline,
    profile: PipelineProfile | None = None,
    calibration: Calibration | None = None,
) -> PlanningSession:
    """Profile (cached), apply ``--calibration`` if given (or ``calibration``, already
    loaded), and plan; `main` reports an InfeasibleError."""
    from sloline.measure.session import plan_pipeline

    calibration = calibration or _load_calibration(args, loaded)
    profile = profile or _profile(args, loaded)
    if calibration is not None:
        try:
            profile = calibration.apply(profile)
        except ValueError as exc:
            raise _flag_error("--calibration", str(exc)) from None
        print(calibration.summary(), file=sys.stderr, flush=True)
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    return plan_pipeline(loaded, _catalog(args), progress=progress, profile=profile)


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    import yaml

    from sloline.measure.session import plot_latency_cdf

    session = _plan(args, load_pipeline(args.file))
    print(session.plan.to_table())
    if args.out:
        data = session.plan.to_dict()
        text = json.dumps(data, indent=1) if args.out.endswith(".json") else yaml.safe_dump(data)
        Path(args.out).write_text(text)
        print(f"plan written to {args.out}")
    if args.cdf:
        plot_latency_cdf(session, Path(args.cdf))
        print(f"latency CDF drawn to {args.cdf}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from sloline.embedded import check_models
    from sloline.measure.profiler import ProfilerSettings, load_samples
    from sloline.measure.session import plan_pipeline, planning_trace
    from sloline.planner.planner import InfeasibleError

    loaded = load_pipeline(args.file)
    if not args.duration > 0.0:
        raise _flag_error("--duration", f"must be > 0 seconds, got {args.duration:g}")
    if args.rounds < 1:
        raise _flag_error("--rounds", f"must be at least 1, got {args.rounds}")
    out = Path(args.out or f"{loaded.name}.calibration.json")
    if not out.resolve().parent.is_dir():
        raise _flag_error("--out", f"{out}: no such directory")
    trace = planning_trace(loaded)
    arrivals = trace[trace < args.duration]
    if arrivals.size == 0:
        raise _flag_error("--duration", f"the planning trace has no arrival in {args.duration:g} s")
    check_models(loaded)
    session = _plan(args, loaded)
    catalog = _catalog(args)
    payloads = load_samples(loaded, ProfilerSettings().samples)
    plan = session.plan
    print(plan.to_table())
    for round_ in range(1, args.rounds + 1):
        counted = f" (round {round_} of {args.rounds})" if args.rounds > 1 else ""
        print(
            f"serving this plan for {args.duration:g} s under its planning load "
            f"({arrivals.size} requests, {arrivals.size / args.duration:.1f} rps){counted} ...",
            flush=True,
        )
        calibrated = _calibration_round(
            loaded, catalog, session.profile, plan, trace, arrivals, payloads, out
        )
        print(
            f"planning again with this calibration "
            f"(`sloline plan {args.file} --calibration {out}`):"
        )
        try:
            replanned = plan_pipeline(loaded, catalog, profile=calibrated).plan
        except InfeasibleError as exc:  # the calibration is still what was measured
            print(f"no plan meets the SLO with this calibration: {exc}")
            return 0
        print(replanned.to_table())
        if replanned.config == plan.config:
            if args.rounds > 1:
                print("settled: the plan made with this calibration is the one it was measured on")
            return 0
        plan = replanned
    if args.rounds > 1:
        print(
            f"not settled after {args.rounds} rounds: the last plan was made with a calibration "
            "of another configuration and has not been served (more --rounds serve it)"
        )
    return 0


def _calibration_round(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    profile: PipelineProfile,
    plan: Plan,
    trace: np.ndarray,
    arrivals: np.ndarray,
    payloads: list[Arrays],
    out: Path,
) -> PipelineProfile:
    """Serve ``plan`` on ``arrivals`` with the sample ``payloads`` (`sloline calibrate`),
    write the calibration to ``out``, print what was measured beside the estimates with
    and without it, and return ``profile`` calibrated."""
    import math

    import numpy as np

    from sloline.measure.calibrate import measure_in_situ
    from sloline.planner.topology import Topology
    from sloline.serving import process

    q = loaded.pipeline.spec.slo.percentile
    run = process.run(measure_in_situ(loaded, plan, profile, arrivals, payloads, catalog))
    # The router's CPU against the estimator's on the same arrivals, everything else
    # calibrated: the scale of the profile's router costs.
    calibration = run.calibration.with_router_cpu_on(
        run.router_cpu_s, Topology.from_graph(loaded.graph), profile, plan.config, arrivals
    )
    calibration.save(out)
    print(f"{calibration.summary()}\ncalibration written to {out}")
    calibrated = calibration.apply(profile)
    measured = np.percentile(run.latencies_s, q) * 1e3 if run.latencies_s.size else math.nan
    errors = sum(run.errors.values())
    print(
        f"measured: P{q:g} {measured:.1f} ms, attainment {run.attainment:.2%} of {run.sent} "
        f"requests" + (f", {errors} errors: {run.errors}" if errors else "")
    )
    tails = [
        _estimate_on(loaded, catalog, p, plan, times).percentile_s(q) * 1e3
        for p, times in (
            (profile, arrivals),
            (calibrated, arrivals),
            (profile, trace),
            (calibrated, trace),
        )
    ]
    print(
        f"estimated P{q:g} of this plan: on the same arrivals {tails[0]:.1f} ms from the "
        f"profile, {tails[1]:.1f} ms calibrated; on the whole planning trace "
        f"{tails[2]:.1f} and {tails[3]:.1f} ms"
    )
    return calibrated


def _estimate_on(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    profile: PipelineProfile,
    plan: Plan,
    arrivals_s: np.ndarray,
) -> Estimate:
    """The estimator's latencies of ``plan`` on ``arrivals_s`` with ``profile``."""
    from sloline.planner.evaluator import Evaluator
    from sloline.planner.problem import PlanningProblem

    problem = PlanningProblem.from_graph(loaded.graph, profile, catalog, arrivals_s)
    return Evaluator(problem).estimate(plan.config)  # both in topology order


def cmd_simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from sloline.lab.simulate import POLICIES, simulate
    from sloline.lab.traces import Trace, standard_traces

    session = _plan(args, load_pipeline(args.file))
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
                raise PipelineError(
                    [
                        Issue(
                            "--trace",
                            f"{name!r} is neither {sorted(families)} nor a readable "
                            f"file of arrival times ({exc})",
                        )
                    ],
                    "flags",
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


def cmd_profile_stage(args: argparse.Namespace) -> int:
    import json
    import os

    from sloline.measure.profiler import measure_stage

    if args.cpus:
        os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])
    measured = measure_stage(
        Path(args.pipeline),
        args.stage,
        Path(args.inputs),
        threads=args.threads,
        cap=args.cap,
        repeats=args.repeats,
        budget_s=args.budget_s,
        cuda_device=args.cuda_device,
    )
    Path(args.out).write_text(json.dumps(measured.to_dict()))
    return 0


DEFAULT_TERMINATION_LOG = "/dev/termination-log"


def cmd_profile_job(args: argparse.Namespace) -> int:
    import os

    from sloline.planner.profile_message import MAX_MESSAGE_BYTES

    out = Path(os.environ.get("SLOLINE_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG)
    try:
        with out.open("a"):  # fail before spending minutes on measurements
            pass
    except OSError as exc:
        print(
            f"error: cannot write the profile to {out} ({exc.strerror}); set "
            "SLOLINE_TERMINATION_LOG to a writable file (Kubernetes provides "
            f"{DEFAULT_TERMINATION_LOG})",
            file=sys.stderr,
        )
        return 1
    try:
        text = _profile_job_message(args)
    except Exception as exc:
        # The reason reaches the operator through the pod's termination message.
        out.write_text(f"error: {exc}"[:MAX_MESSAGE_BYTES])
        raise
    out.write_text(text)
    print(text, flush=True)
    return 0


def _profile_job_message(args: argparse.Namespace) -> str:
    from sloline.measure.profiler import ProfilerSettings, profile_job
    from sloline.planner.profile_message import encode_message

    if args.hop_requests and args.hop_requests < 50:
        raise PipelineError([Issue("--hop-requests", "use 0 (skip) or at least 50")], "flags")
    loaded = load_pipeline(args.pipeline)
    try:
        hw = _catalog(args).get(args.hardware)
    except KeyError as exc:
        raise PipelineError([Issue("--hardware", str(exc.args[0]))], "flags") from None
    if args.stage not in loaded.graph.stages:
        raise PipelineError(
            [Issue("--stage", f"no stage {args.stage!r}; stages: {list(loaded.graph.order)}")],
            "flags",
        )
    if loaded.pipeline.spec.samples is None:
        print("warning: no spec.samples; profiling with zero inputs", file=sys.stderr)
    message = profile_job(
        loaded,
        args.stage,
        hw,
        ProfilerSettings(max_batch_cap=args.cap, repeats=args.repeats, budget_s=args.budget_s),
        hop_requests=args.hop_requests,
        cuda_device=args.cuda_device,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    return encode_message(message)


def cmd_operator(args: argparse.Namespace) -> int:
    import os

    from sloline.operator.run import run_operator
    from sloline.operator.settings import load_settings

    run_operator(
        load_settings(args.config),  # else $SLOLINE_OPERATOR_CONFIG, else the defaults
        kubeconfig=os.environ.get("KUBECONFIG") or None,
        namespaces=[] if args.all_namespaces else args.namespace,
        standalone=args.standalone,
        metrics_port=args.metrics_port,
        liveness_endpoint=args.liveness,
    )
    return 0


def _add_operator_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf; the `k8s` extra)")
    p.add_argument("--config", help="settings file (default: $SLOLINE_OPERATOR_CONFIG)")
    p.add_argument(
        "-n", "--namespace", action="append", default=[], help="serve this namespace (repeat)"
    )
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="serve every namespace (default)"
    )
    p.add_argument("--metrics-port", type=int, default=8080, help="/metrics port; 0 = off")
    p.add_argument("--liveness", help="kopf's health endpoint, e.g. http://0.0.0.0:8081/healthz")
    p.add_argument("--standalone", action="store_true", help="no peering with other operators")
    # Also accepted after the command; SUPPRESS keeps `sloline -v operator` working.
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_operator)


def _add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", help="hardware catalog YAML (default: built-in CPU classes)")
    p.add_argument(
        "--profile-hardware",
        default="",
        help="classes to profile, comma-separated (default: the allowed ones)",
    )
    p.add_argument("--cap", type=int, default=32, help="largest batch size profiled")
    p.add_argument("--force", action="store_true", help="re-profile even when cached")
    p.add_argument("--cache-dir", help="profile cache (default ~/.cache/sloline/profiles)")


def _add_planning_flags(p: argparse.ArgumentParser) -> None:
    _add_profile_flags(p)
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="plan with a calibration (`sloline calibrate` or `sloline run --calibration-out`)",
    )


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915 - one statement per flag
    parser = argparse.ArgumentParser(
        prog="sloline",
        description="Serve multi-model prediction pipelines under a tail-latency SLO.",
    )
    parser.add_argument("--version", action="version", version=f"sloline {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a pipeline file")
    p.add_argument("file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", help="serve a pipeline on this machine (embedded mode)")
    p.add_argument("file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001)")
    _add_front_door_flags(p)
    p.add_argument("--replicas", action="append", default=[], metavar="STAGE=N")
    p.add_argument("--max-batch", action="append", default=[], metavar="STAGE=B")
    p.add_argument("--hardware", action="append", default=[], metavar="STAGE=CLASS")
    p.add_argument("--queue-capacity", type=int, default=1024, help="items per stage queue")
    p.add_argument(
        "--no-admission",
        action="store_true",
        help="queue requests that cannot finish in time instead of refusing them (503)",
    )
    p.add_argument("--log-dir", help="worker logs (default: a new temp dir)")
    _add_limit_flags(p)
    p.add_argument(
        "--status-interval", type=float, default=2.0, help="seconds between status lines; 0 = quiet"
    )
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    p.add_argument(
        "--no-plan",
        action="store_true",
        help="skip profiling/planning: flags, spec overrides or 1 replica, batch 1",
    )
    p.add_argument("--no-tuner", action="store_true", help="keep the planned replica counts")
    p.add_argument(
        "--replan",
        type=float,
        nargs="?",
        const=30.0,
        default=None,
        metavar="SECONDS",
        help="every SECONDS (default 30), plan again on the last minute of traffic and "
        "adopt a cheaper plan that changes a stage's hardware or batch (off by default)",
    )
    p.add_argument(
        "--worker-nice",
        type=int,
        default=WORKER_NICE,
        help=f"workers' CPU priority below the router's, 0-19 (default {WORKER_NICE})",
    )
    p.add_argument(
        "--calibration-out",
        metavar="FILE",
        help="on stop, write what serving measured beyond the profile (for --calibration)",
    )
    _add_planning_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "worker", help="serve one stage's model to a router (started by `run`, or one per pod)"
    )
    p.add_argument("--pipeline", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--router", required=True, help="the router's worker address host:port")
    p.add_argument(
        "--token-file",
        help="file holding the pipeline's worker token (default: $SLOLINE_WORKER_TOKEN)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cuda-device", type=int, default=None)
    p.add_argument("--hardware", default="")
    p.add_argument("--worker-id", default="")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process dies")
    p.add_argument("--cpus", default="", help="CPU affinity, e.g. 0,1")
    p.add_argument("--nice", type=int, default=0, help="lower the CPU priority by this much (0-19)")
    p.add_argument("--health-host", default="127.0.0.1", help="address of /live and /ready")
    p.add_argument(
        "--health-port", type=int, default=None, help="serve /live and /ready (default: off)"
    )
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=25.0,
        help="after SIGTERM, exit even if the router has not closed the stream",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser(
        "router", help="serve a pipeline's router only; workers dial in (Kubernetes mode)"
    )
    p.add_argument("--pipeline", required=True, help="the pipeline file")
    p.add_argument("--plan", help="plan from `sloline plan --out` (max batch per stage)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (a pod: its IP)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="clients' gRPC port (8001)")
    p.add_argument("--metrics-port", type=int, default=8002, help="/metrics port (8002)")
    p.add_argument("--worker-port", type=int, default=8003, help="workers' gRPC port (8003)")
    p.add_argument("--worker-host", help="address of the worker port (default: --host)")
    p.add_argument(
        "--worker-token-file",
        help="file holding the token workers must present (default: $SLOLINE_WORKER_TOKEN)",
    )
    p.add_argument(
        "--insecure-workers",
        action="store_true",
        help="without a worker token, accept any worker that dials the worker port "
        "(it receives clients' tensors and answers for the pipeline)",
    )
    _add_front_door_flags(p)
    p.add_argument("--queue-capacity", type=int, default=1024, help="items per stage queue")
    p.add_argument(
        "--no-admission",
        action="store_true",
        help="queue requests that cannot finish in time instead of refusing them (503)",
    )
    p.add_argument(
        "--drain-s", type=float, default=5.0, help="on SIGTERM, wait this long for requests"
    )
    _add_limit_flags(p)
    p.set_defaults(func=cmd_router)

    p = sub.add_parser("profile", help="measure each stage on each hardware class (cached)")
    p.add_argument("file")
    p.add_argument("--out", help="write the profile as JSON")
    _add_profile_flags(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("plan", help="profile (cached) and plan hardware, batch and replicas")
    p.add_argument("file")
    p.add_argument("--out", help="write the plan as YAML (or JSON if the name ends .json)")
    p.add_argument("--cdf", help="draw the estimated latency CDF vs the SLO to this PNG")
    _add_planning_flags(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "calibrate",
        help="serve the plan under its planning load; measure what the profile misses",
    )
    p.add_argument("file")
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
    _add_profile_flags(p)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("simulate", help="closed-loop simulation of the tuner vs baselines")
    p.add_argument("file")
    p.add_argument(
        "--trace",
        action="append",
        metavar="ramp|burst|spike|autoscale|all|FILE",
        help="trace family or a file of arrival times (repeatable; default all)",
    )
    p.add_argument("--policies", default="", help="comma-separated (default: all)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink trace durations (0.1)")
    p.add_argument("--out-dir", help="draw one PNG per trace here")
    _add_planning_flags(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("profile-stage", help="time one stage in this process (internal)")
    for flag in ("--pipeline", "--stage", "--inputs", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpus", default="")
    p.add_argument("--cap", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=2.0)
    p.add_argument("--cuda-device", type=int, default=None)
    p.set_defaults(func=cmd_profile_stage)

    p = sub.add_parser(
        "profile-job",
        help="profile one stage on this machine's hardware class; the result goes to "
        "$SLOLINE_TERMINATION_LOG (Kubernetes profiling Job)",
    )
    p.add_argument("--pipeline", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--hardware", required=True, help="the class this pod runs on")
    p.add_argument("--catalog", help="hardware catalog YAML (default: built-in CPU classes)")
    p.add_argument("--cap", type=int, default=32, help="largest batch size profiled")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=2.0, help="seconds per batch size")
    p.add_argument(
        "--hop-requests",
        type=int,
        default=300,
        help="requests for the per-hop overhead measurement; 0 skips it",
    )
    p.add_argument("--cuda-device", type=int, default=None, help="GPU for ONNX/TorchScript")
    p.set_defaults(func=cmd_profile_job)

    _add_operator_parser(sub)

    p = sub.add_parser("crd", help="print the PredictionPipeline CRD generated from the spec")
    p.add_argument("--reference", action="store_true", help="print the markdown field reference")
    p.set_defaults(func=cmd_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from sloline.serving import process
    from sloline.serving.logthrottle import throttle_logs

    process.use_grpc_iomgr()  # before anything imports grpc; workers and profiling too
    throttle_logs()
    if args.command in ("run", "calibrate", "router", "worker"):
        from sloline.serving.memory import tune_malloc

        tune_malloc()
    try:
        return int(args.func(args))
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except AuthConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except ValueError as exc:
        from sloline.planner.planner import InfeasibleError

        if not isinstance(exc, InfeasibleError):
            raise
        print(
            f"error: no plan meets the SLO: {exc}\n(`sloline run --no-plan` serves the "
            "spec's overrides and flags without planning)",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
