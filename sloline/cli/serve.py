"""`sloline run` (the embedded mode: router and workers on this machine) and `sloline
router` (the router alone; workers dial in)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sloline import __version__
from sloline.backends.local import WORKER_NICE
from sloline.cli.flags import (
    add_front_door_flags,
    add_limit_flags,
    add_planning_flags,
    address_entries,
    assignments,
    catalog,
    flag_error,
    front_door,
    port,
)
from sloline.cli.planning import load_calibration, measure_profile, plan_session
from sloline.spec import load_pipeline

if TYPE_CHECKING:
    from sloline.embedded import EmbeddedPipeline
    from sloline.planner.plan import Plan
    from sloline.planner.profile import PipelineProfile
    from sloline.tuner.replan import ReplanSettings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_run_parser(sub)
    _add_router_parser(sub)


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="serve a pipeline on this machine (embedded mode)")
    p.add_argument("file", help="the pipeline file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=port, default=8001, help="gRPC port (default 8001)")
    add_front_door_flags(p)
    p.add_argument(
        "--replicas",
        action="append",
        default=[],
        metavar="STAGE=N",
        help="serve STAGE with N replicas (repeat per stage)",
    )
    p.add_argument(
        "--max-batch",
        action="append",
        default=[],
        metavar="STAGE=B",
        help="STAGE's largest batch (repeat per stage)",
    )
    p.add_argument(
        "--hardware",
        action="append",
        default=[],
        metavar="STAGE=CLASS",
        help="serve STAGE on this hardware class (repeat per stage)",
    )
    p.add_argument("--queue-capacity", type=int, default=1024, help="items per stage queue")
    p.add_argument(
        "--no-admission",
        action="store_true",
        help="queue requests that cannot finish in time instead of refusing them (503)",
    )
    p.add_argument(
        "--routers",
        type=int,
        default=None,
        help="router processes sharing the HTTP and gRPC ports; every worker serves all "
        "(default: one per 4 cores, at least 1, or the plan's count if that is more)",
    )
    p.add_argument("--log-dir", help="worker logs (default: a new temp dir)")
    add_limit_flags(p)
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
        help="every SECONDS (default 30), plan again on the last minute of traffic as "
        "served; adopt the plan when the running configuration misses the SLO there, or "
        "when it changes a stage's hardware or batch for less (off by default)",
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
    add_planning_flags(p)
    p.set_defaults(func=cmd_run)


def _add_router_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "router", help="serve a pipeline's router only; workers dial in (Kubernetes mode)"
    )
    p.add_argument("--pipeline", required=True, help="the pipeline file")
    p.add_argument("--plan", help="plan from `sloline plan --out` (max batch per stage)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (a pod: its IP)")
    p.add_argument("--port", type=port, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=port, default=8001, help="clients' gRPC port (8001)")
    p.add_argument("--metrics-port", type=port, default=8002, help="/metrics port (8002)")
    p.add_argument("--worker-port", type=port, default=8003, help="workers' gRPC port (8003)")
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
    p.add_argument(
        "--peers",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="the pipeline's routers' metrics ports, host:port[,host:port...]; repeatable; "
        "each host is resolved to every address it has (this router's own is skipped): "
        "Triton's statistics then count every router's requests (default: this one's)",
    )
    add_front_door_flags(p)
    p.add_argument("--queue-capacity", type=int, default=1024, help="items per stage queue")
    p.add_argument(
        "--no-admission",
        action="store_true",
        help="queue requests that cannot finish in time instead of refusing them (503)",
    )
    p.add_argument(
        "--drain-s", type=float, default=5.0, help="on SIGTERM, wait this long for requests"
    )
    add_limit_flags(p)
    p.set_defaults(func=cmd_router)


def cmd_run(args: argparse.Namespace) -> int:
    from sloline.embedded import (
        EmbeddedPipeline,
        EmbeddedSettings,
        check_models,
        default_routers,
        stage_configs,
    )
    from sloline.serving import process
    from sloline.serving.router import RouterSettings
    from sloline.serving.server import ServerSettings

    loaded = load_pipeline(args.file)
    hardware = catalog(args)
    settings = EmbeddedSettings(
        server=ServerSettings(
            host=args.host, http_port=args.port, grpc_port=args.grpc_port, **front_door(args)
        ),
        router=RouterSettings(queue_capacity=args.queue_capacity, admission=not args.no_admission),
        catalog=hardware,
        replicas=assignments(args.replicas, "--replicas"),  # type: ignore[arg-type]
        max_batch=assignments(args.max_batch, "--max-batch"),  # type: ignore[arg-type]
        hardware=assignments(args.hardware, "--hardware", str),  # type: ignore[arg-type]
        log_dir=Path(args.log_dir) if args.log_dir else None,
        tuner=not args.no_tuner,
        worker_nice=args.worker_nice,
        replan=_replan_settings(args),
        routers=_routers(args, default_routers),
        router_flags=tuple(
            arg
            for flag, value in (
                ("--log-format", args.log_format),
                ("--otlp-endpoint", args.otlp_endpoint),
                ("--access-log-sample", args.access_log_sample),
            )
            if value is not None
            for arg in (flag, str(value))
        ),
    )

    if not 0 <= args.worker_nice <= 19:
        raise flag_error("--worker-nice", f"must be 0-19, got {args.worker_nice}")
    replace(settings.server, insecure_workers=True).check()  # TLS flags, before profiling
    stage_configs(loaded, settings)  # reject bad flags before spending time on profiling
    if args.calibration_out and args.no_plan:
        raise flag_error("--calibration-out", "compares serving with the profile: drop --no-plan")
    if args.calibration_out and not Path(args.calibration_out).resolve().parent.is_dir():
        raise flag_error("--calibration-out", f"{args.calibration_out}: no such directory")
    calibration = load_calibration(args, loaded)  # rejected before profiling
    plan = profile = problem = None
    if not args.no_plan:
        check_models(loaded)
        profile = measure_profile(args, loaded)
        if profile.overhead is not None:  # plan for the workers' priority they will run at
            overhead = replace(profile.overhead, worker_nice=args.worker_nice)
            profile = replace(profile, overhead=overhead)
        session = plan_session(args, loaded, profile, calibration)
        plan, problem = session.plan, session.problem
        print(plan.to_table())
        settings = replace(settings, routers=_planned_routers(args, settings.routers, plan))
    configs = stage_configs(loaded, settings, plan)
    pipeline = EmbeddedPipeline(loaded, settings, configs=configs, plan=plan, problem=problem)
    return process.run(_serve(pipeline, args, profile))


def _routers(args: argparse.Namespace, default: Callable[[], int]) -> int:
    """``--routers``, else the default from the cores (raised to the plan's count once
    there is a plan); one router with ``--replan``, which changes batch sizes in router 0
    only."""
    if args.routers is None:
        return 1 if args.replan is not None else default()
    if args.routers < 1:
        raise flag_error("--routers", f"must be at least 1, got {args.routers}")
    if args.routers > 1 and args.replan is not None:
        raise flag_error(
            "--routers",
            "cannot be combined with --replan: a re-plan changes batch sizes in router 0 "
            "only; use one router, or plan again and restart",
        )
    return int(args.routers)


def _planned_routers(args: argparse.Namespace, routers: int, plan: Plan) -> int:
    """The default router count raised to the plan's (``--routers`` and ``--replan`` keep
    theirs)."""
    if args.routers is not None or args.replan is not None:
        return routers
    return max(routers, plan.routers)


def _replan_settings(args: argparse.Namespace) -> ReplanSettings | None:
    """``--replan``'s settings; rejected where it cannot work: it re-plans the tuner's
    plan, and flags that fix a stage's hardware, batch or replicas would be overridden."""
    from sloline.tuner.replan import ReplanSettings

    if args.replan is None:
        return None
    if not args.replan > 0:
        raise flag_error("--replan", f"the interval must be > 0 seconds, got {args.replan:g}")
    for flag, given in (
        ("--no-plan", args.no_plan),
        ("--no-tuner", args.no_tuner),
        ("--replicas", args.replicas),
        ("--max-batch", args.max_batch),
        ("--hardware", args.hardware),
    ):
        if given:
            raise flag_error(
                "--replan",
                f"cannot be combined with {flag}: re-planning changes what the plan and "
                "the tuner chose (pin a stage in the pipeline spec instead)",
            )
    return ReplanSettings(interval_s=args.replan)


def _calibrate(
    pipeline: EmbeddedPipeline, profile: PipelineProfile, since: float, path: Path
) -> None:
    """Measure a calibration from the router's records since ``since`` and write it."""
    from sloline.embedded import WARMUP_BATCHES

    try:
        calibration = pipeline.calibration(profile, since, warmup_batches=WARMUP_BATCHES)
        calibration.save(path)
    except (KeyError, ValueError, OSError) as exc:  # e.g. --hardware on an unprofiled class
        print(f"error: calibration not written to {path}: {exc}", file=sys.stderr, flush=True)
        return
    print(f"{calibration.summary()}\ncalibration written to {path}", flush=True)


async def _serve(
    pipeline: EmbeddedPipeline, args: argparse.Namespace, profile: PipelineProfile | None = None
) -> int:
    from sloline.cli.status import status_loop
    from sloline.serving import process

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
            f"  metrics {'http' if p.extra_routers else scheme}://{p.metrics_url}/metrics"
            f"{_other_routers(p)}\n"
            f"  worker logs {p.backend.log_dir if p.backend else '-'}\n"
            "  Ctrl-C to stop",
            flush=True,
        )
        serving_since = p.router.clock()
        await status_loop(p, stop, interval=args.status_interval, duration=args.duration)
        if args.calibration_out and profile is not None:
            _calibrate(p, profile, serving_since, Path(args.calibration_out))
        print("stopping: draining in-flight requests, then workers", flush=True)
    return 0


def _other_routers(p: EmbeddedPipeline) -> str:
    """The banner's note on routers 1..N-1 and their /metrics."""
    if not p.extra_routers:
        return ""
    urls = ", ".join(f"http://{r.metrics_url}/metrics" for r in p.extra_routers)
    return f" (router 0 of {len(p.extra_routers) + 1}; the others: {urls})"


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
        raise flag_error(
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
        stats_peers=address_entries(args.peers, "--peers") if args.peers else (),
        **front_door(args),
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
                f"stopping: no new connections; draining {app.router.inflight} in flight "
                "and the open connections",
                flush=True,
            )
        return 0

    return process.run(serve())
