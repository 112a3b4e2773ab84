"""Flags more than one command takes, and the parsing of their values."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloline.spec import DEFAULT_CATALOG, HardwareCatalog, Issue, PipelineError, load_catalog


def flag_error(flag: str, reason: str) -> PipelineError:
    """A bad flag value, reported like a pipeline file's problems (exit 2)."""
    return PipelineError([Issue(flag, reason)], "flags")


def port(text: str) -> int:
    """argparse type of a TCP port number."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(text)  # argparse: "invalid port value: '...'"
    return value


def assignments(values: Sequence[str], flag: str, kind: type = int) -> dict[str, object]:
    """Parse repeated `stage=value` flags."""
    out: dict[str, object] = {}
    for text in values:
        name, eq, value = text.partition("=")
        if not eq or not name:
            raise flag_error(flag, f"expected STAGE=VALUE, got {text!r}")
        try:
            out[name] = kind(value)
        except ValueError:
            raise flag_error(flag, f"{value!r} is not a valid {kind.__name__}") from None
        if kind is int and int(value) < (0 if flag == "--replicas" else 1):
            raise flag_error(flag, f"{text!r}: value too small")
    return out


def address_entries(flags: list[str], flag: str) -> tuple[str, ...]:
    """The `host:port` entries of every `flag` given (each comma-separated)."""
    entries = tuple(e.strip() for value in flags for e in value.split(",") if e.strip())
    if not entries:
        raise flag_error(flag, "expected host:port[,host:port...]")
    for entry in entries:
        host, _, port_text = entry.rpartition(":")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise flag_error(flag, f"expected host:port, got {entry!r}")
    return entries


def catalog(args: argparse.Namespace) -> HardwareCatalog:
    """``--catalog``'s hardware classes, else the built-in ones."""
    return load_catalog(args.catalog) if getattr(args, "catalog", None) else DEFAULT_CATALOG


# Front-door limits (docs/operations.md "Front-door limits"): flag -> ServerSettings field.
LIMIT_FLAGS: dict[str, tuple[type, str]] = {
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


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    for name, (kind, help) in LIMIT_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, help=help)


def limits(args: argparse.Namespace) -> dict[str, Any]:
    """The front-door limits given on the command line (the rest keep their defaults)."""
    return {name: getattr(args, name) for name in LIMIT_FLAGS if getattr(args, name) is not None}


def add_front_door_flags(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as text or one JSON object each, with the request id of the request "
        "they are about (default: $SLOLINE_LOG_FORMAT or text)",
    )
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="trace requests with OpenTelemetry, exporting spans with OTLP/gRPC to URL "
        "(default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset: off; needs sloline[otel])",
    )
    p.add_argument(
        "--access-log-sample",
        type=float,
        metavar="F",
        help="log this fraction of inference requests, one line each "
        "(default: $SLOLINE_ACCESS_LOG_SAMPLE or 0, off)",
    )


def front_door(args: argparse.Namespace) -> dict[str, Any]:
    """ServerSettings fields of the client doors' TLS, bearer-token and limit flags."""
    from sloline.serving.auth import read_token_file

    out: dict[str, Any] = {
        **limits(args),
        "tls_cert": Path(args.tls_cert) if args.tls_cert else None,
        "tls_key": Path(args.tls_key) if args.tls_key else None,
        "tls_client_ca": Path(args.tls_client_ca) if args.tls_client_ca else None,
    }
    if args.auth_token_file:
        out["auth_tokens"] = read_token_file(args.auth_token_file, "--auth-token-file")
    return out


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", help="hardware catalog YAML (default: built-in CPU classes)")
    p.add_argument(
        "--profile-hardware",
        default="",
        help="classes to profile, comma-separated (default: the allowed ones)",
    )
    p.add_argument("--cap", type=int, default=32, help="largest batch size profiled")
    p.add_argument("--force", action="store_true", help="re-profile even when cached")
    p.add_argument("--cache-dir", help="profile cache (default ~/.cache/sloline/profiles)")


def add_planning_flags(p: argparse.ArgumentParser) -> None:
    add_profile_flags(p)
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="plan with a calibration (`sloline calibrate` or `sloline run --calibration-out`)",
    )


def add_output_flag(p: argparse.ArgumentParser) -> None:
    """`-o/--output text|json`: json prints one JSON document on stdout, for scripts."""
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text for people (default), json for scripts",
    )
