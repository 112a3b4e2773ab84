"""The `sloline` command line. Settings are parsed here, once, and passed down.

Each command lives in a module of this package beside its parser (`parser.py` puts them
together, with the command plugins); :func:`main` runs one and turns its failures into
exit codes, in this one place.

Exit codes: 0 success; 1 runtime failure (no plan meets the SLO, a port in use, or an
unexpected exception: a bug); 2 invalid input (a bad pipeline file, flag or model, a file
that cannot be read or written). Each is reported as one ``error:`` message on stderr,
its traceback only with ``--verbose``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from sloline.cli.parser import build_parser

EXIT_FAILURE = 1
EXIT_INVALID = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from sloline.serving import logs, process

    try:
        logs.configure(
            level=logging.DEBUG if args.verbose else logging.INFO,
            # The serving commands' flags (cli/flags.py); the environment's for the rest.
            log_format=getattr(args, "log_format", None),
            access_sample=getattr(args, "access_log_sample", None),
        )
    except ValueError as exc:  # a bad --access-log-sample or SLOLINE_* setting
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    from sloline.serving.logthrottle import throttle_logs

    process.use_grpc_iomgr()  # before anything imports grpc; workers and profiling too
    throttle_logs()
    if args.command in ("run", "router", "worker", "embedded-router"):
        from sloline.serving import tracing

        try:  # workers take the endpoint from the environment (tracing.py)
            tracing.configure(getattr(args, "otlp_endpoint", None))
        except ValueError as exc:  # tracing asked for without the otel extra
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_INVALID
    if args.command in ("run", "calibrate", "router", "worker"):
        from sloline.serving.memory import tune_malloc

        tune_malloc()
    try:
        return int(args.func(args))
    except Exception as exc:
        code, message = _failure(exc) or (
            EXIT_FAILURE,
            f"unexpected {type(exc).__name__}: {exc} (a bug in sloline; rerun with "
            "--verbose for its traceback and report it)",
        )
        logging.getLogger(__name__).debug("the failure's traceback", exc_info=exc)  # -v
        print(f"error: {message}", file=sys.stderr)
        return code


def _failure(exc: Exception) -> tuple[int, str] | None:
    """The exit code and message of a failure the user can act on; None for the rest."""
    from sloline.planner.planner import InfeasibleError
    from sloline.runtimes.base import ModelError

    if isinstance(exc, InfeasibleError):
        return EXIT_FAILURE, (
            f"no plan meets the SLO: {exc}\n(`sloline run --no-plan` serves the "
            "spec's overrides and flags without planning)"
        )
    # PipelineError (a bad pipeline file or flag), AuthConfigError, a value a setting
    # rejects, a model that does not load.
    if isinstance(exc, ValueError | ModelError):
        return EXIT_INVALID, str(exc)
    if isinstance(exc, OSError):
        # A file the user named that cannot be read or written, or else (a port in use)
        # a failure of the machine.
        return (EXIT_FAILURE if exc.filename is None else EXIT_INVALID), str(exc)
    return None
