"""Commands that sloline itself runs, hidden from `sloline --help`: `worker` (started by
`sloline run`, or one per pod), `embedded-router` (`sloline run`'s routers beyond the
first), `profile-stage` (the profiler's measuring process) and `profile-job` (a
Kubernetes profiling Job), `fetch-models` (a pod's storage initializer)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

from sloline.cli.flags import address_entries, catalog, flag_error, port
from sloline.spec import load_pipeline

DEFAULT_TERMINATION_LOG = "/dev/termination-log"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_worker_parser(sub)
    _add_embedded_router_parser(sub)
    _add_profile_stage_parser(sub)
    _add_profile_job_parser(sub)
    _add_fetch_models_parser(sub)


def _add_fetch_models_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fetch-models",
        help=argparse.SUPPRESS,
        description="Fetch stages' models from storage into a model cache (the Kubernetes "
        "storage initializer), in order, stopping at the first failure, which is written "
        f"to $SLOLINE_TERMINATION_LOG (default {DEFAULT_TERMINATION_LOG}) as one line: "
        "'ChecksumMismatch: stage S: ...' or 'FetchFailed: stage S: ...'.",
    )
    p.add_argument(
        "--model", action="append", required=True, metavar="STAGE=URI",
        help="a stage's storageUri (repeatable)",
    )  # fmt: skip
    p.add_argument("--sha256", action="append", default=[], metavar="STAGE=HEX",
                   help="that stage's expected SHA-256")  # fmt: skip
    p.add_argument("--source", action="append", default=[], metavar="STAGE=URI",
                   help="read that stage's model from this file:// URI instead")  # fmt: skip
    p.add_argument("--into", required=True, type=Path, help="the model cache directory")
    p.set_defaults(func=cmd_fetch_models)


def _by_stage(flag: str, values: list[str]) -> dict[str, str]:
    """`STAGE=VALUE` flags as a dict; a malformed one is a flag error."""
    found = {}
    for value in values:
        stage, sep, rest = value.partition("=")
        if not sep or not stage or not rest:
            raise flag_error(flag, f"{value!r}: expected STAGE=VALUE")
        found[stage] = rest
    return found


def cmd_fetch_models(args: argparse.Namespace) -> int:
    import os

    from sloline.spec.storage import StorageError, fetch, termination_message

    models = _by_stage("--model", args.model)
    sums, sources = _by_stage("--sha256", args.sha256), _by_stage("--source", args.source)
    for flag, given in (("--sha256", sums), ("--source", sources)):
        if unknown := sorted(set(given) - set(models)):
            raise flag_error(flag, f"names stages without --model: {', '.join(unknown)}")
    for stage, uri in models.items():
        try:
            path = fetch(uri, sums.get(stage), args.into, sources.get(stage))
        except StorageError as exc:
            print(f"sloline fetch-models: stage {stage}: {exc}", file=sys.stderr)
            out = Path(os.environ.get("SLOLINE_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG)
            with contextlib.suppress(OSError):  # the pod's reason, which the operator reports
                out.write_text(termination_message(exc, stage))
            return 1
        print(f"stage {stage}: fetched {uri} into {path}")
    return 0


def _add_worker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help=argparse.SUPPRESS,
        description="Serve one stage's model to a router (started by `run`, or one per pod).",
    )
    p.add_argument("--pipeline", required=True, help="the pipeline file")
    p.add_argument("--stage", required=True, help="the stage to serve")
    p.add_argument(
        "--router",
        required=True,
        action="append",
        help="the routers' worker addresses, host:port[,host:port...]; repeatable; each "
        "host is resolved to every address it has, again every --resolve-s",
    )
    p.add_argument(
        "--resolve-s",
        type=float,
        default=2.0,
        help="how often the router names are resolved again (default 2)",
    )
    p.add_argument(
        "--token-file",
        help="file holding the pipeline's worker token (default: $SLOLINE_WORKER_TOKEN)",
    )
    p.add_argument("--threads", type=int, default=1, help="the runtime's threads (default 1)")
    p.add_argument("--cuda-device", type=int, default=None, help="GPU for ONNX/TorchScript")
    p.add_argument(
        "--warmup-max-batch",
        type=int,
        default=32,
        help="on a CUDA device, run a batch of every size up to this before serving "
        "(kernels are chosen per shape on first use; default 32, the profiler's cap)",
    )
    p.add_argument("--hardware", default="", help="the hardware class it serves on")
    p.add_argument("--worker-id", default="", help="its name in the router's records")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process dies")
    p.add_argument("--cpus", default="", help="CPU affinity, e.g. 0,1")
    p.add_argument("--nice", type=int, default=0, help="lower the CPU priority by this much (0-19)")
    p.add_argument("--health-host", default="127.0.0.1", help="address of /live and /ready")
    p.add_argument(
        "--health-port", type=port, default=None, help="serve /live and /ready (default: off)"
    )
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=25.0,
        help="after SIGTERM, exit even if the router has not closed the stream",
    )
    p.set_defaults(func=cmd_worker)


def _add_embedded_router_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "embedded-router",
        help=argparse.SUPPRESS,
        description="One of `sloline run --routers N`'s routers beyond the first.",
    )
    p.add_argument("--config", required=True, type=Path, help="its settings (JSON)")
    p.add_argument("--arrivals-fd", type=int, default=None, help="send arrival times here")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process dies")
    p.add_argument("--log-format", choices=("text", "json"), help="as `sloline run`'s")
    p.add_argument("--otlp-endpoint", metavar="URL", help="as `sloline run`'s")
    p.add_argument("--access-log-sample", type=float, metavar="F", help="as `sloline run`'s")
    p.set_defaults(func=cmd_embedded_router)


def cmd_embedded_router(args: argparse.Namespace) -> int:
    from sloline.embedded import serve_extra_router

    return serve_extra_router(args.config, args.arrivals_fd, args.parent_pid)


def _add_profile_stage_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile-stage",
        help=argparse.SUPPRESS,
        description="Time one stage in this process (the profiler runs it).",
    )
    p.add_argument("--pipeline", required=True, help="the pipeline file")
    p.add_argument("--stage", required=True, help="the stage to time")
    p.add_argument("--inputs", required=True, help="the stage's sample inputs (.npz)")
    p.add_argument("--out", required=True, help="write the measurement here as JSON")
    p.add_argument("--threads", type=int, default=1, help="the runtime's threads (default 1)")
    p.add_argument("--cpus", default="", help="CPU affinity, e.g. 0,1")
    p.add_argument("--cap", type=int, default=32, help="largest batch size timed")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per batch size")
    p.add_argument("--budget-s", type=float, default=2.0, help="seconds per batch size")
    p.add_argument("--cuda-device", type=int, default=None, help="GPU for ONNX/TorchScript")
    p.set_defaults(func=cmd_profile_stage)


def _add_profile_job_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile-job",
        help=argparse.SUPPRESS,
        description="Profile one stage on this machine's hardware class; the result goes to "
        "$SLOLINE_TERMINATION_LOG (Kubernetes profiling Job).",
    )
    p.add_argument("--pipeline", required=True, help="the pipeline file")
    p.add_argument("--stage", required=True, help="the stage to profile")
    p.add_argument("--hardware", required=True, help="the class this pod runs on")
    p.add_argument("--catalog", help="hardware catalog YAML (default: built-in CPU classes)")
    p.add_argument("--cap", type=int, default=32, help="largest batch size profiled")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per batch size")
    p.add_argument("--budget-s", type=float, default=2.0, help="seconds per batch size")
    p.add_argument(
        "--hop-requests",
        type=int,
        default=300,
        help="requests for the per-hop overhead measurement; 0 skips it",
    )
    p.add_argument("--cuda-device", type=int, default=None, help="GPU for ONNX/TorchScript")
    p.set_defaults(func=cmd_profile_job)


def cmd_worker(args: argparse.Namespace) -> int:
    from sloline.model_server.worker import WorkerSettings
    from sloline.model_server.worker import main as worker_main
    from sloline.serving.auth import worker_token

    if not 0 <= args.nice <= 19:
        raise flag_error("--nice", f"must be 0-19 (a lower priority), got {args.nice}")
    routers = address_entries(args.router, "--router")
    if not args.resolve_s > 0:
        raise flag_error("--resolve-s", f"must be positive, got {args.resolve_s}")
    if args.warmup_max_batch < 1:
        raise flag_error("--warmup-max-batch", f"must be at least 1, got {args.warmup_max_batch}")
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
            routers=routers,
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
            resolve_s=args.resolve_s,
            warmup_max_batch=args.warmup_max_batch,
        )
    )


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
        raise flag_error("--hop-requests", "use 0 (skip) or at least 50")
    loaded = load_pipeline(args.pipeline)
    try:
        hw = catalog(args).get(args.hardware)
    except KeyError as exc:
        raise flag_error("--hardware", str(exc.args[0])) from None
    if args.stage not in loaded.graph.stages:
        raise flag_error("--stage", f"no stage {args.stage!r}; stages: {list(loaded.graph.order)}")
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
