"""OpenTelemetry traces of inference requests, exported with OTLP (optional, off by default).

On when :func:`configure` is given an OTLP endpoint (`--otlp-endpoint URL` on `sloline
run` / `sloline router`, or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); the service is named by `OTEL_SERVICE_NAME`
(default `sloline`). It needs the `otel` extra (`pip install 'sloline[otel]'`), imported
only then: without it, and with tracing off, nothing here imports OpenTelemetry.

A request gets a server span at the front door (`POST /v2/models/{name}/infer` or
`ModelInfer`), a child of the client's W3C `traceparent` (HTTP header or gRPC metadata)
when it sends one, and one child span per stage it visits (`stage <name>`), from when it
was queued at the stage to when its batch came back, with the queue wait, batch size,
worker and the worker's service time as attributes. With tracing off the request path
checks one module attribute, :data:`tracer`, which is None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# The OpenTelemetry tracer while tracing is on; None (the default) when it is off.
tracer: Any = None
ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def endpoint_from_env() -> str | None:
    """The OTLP endpoint the standard environment variables name, if any."""
    for name in ENDPOINT_ENVS:
        if value := os.environ.get(name):
            return value
    return None


def configure(endpoint: str | None) -> None:
    """Export spans with OTLP/gRPC to `endpoint` (None: the environment's, else off).

    Raises ValueError when tracing is asked for and the `otel` extra is not installed.
    """
    global tracer  # noqa: PLW0603 (the process's one tracer)
    endpoint = endpoint or endpoint_from_env()
    if not endpoint:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ValueError(
            f"tracing to {endpoint} needs OpenTelemetry: pip install 'sloline[otel]' ({exc})"
        ) from None
    import sloline

    service = os.environ.get("OTEL_SERVICE_NAME") or "sloline"
    resource = Resource.create({"service.name": service, "service.version": sloline.__version__})
    provider = TracerProvider(resource=resource)
    insecure = endpoint.startswith("http://")
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure))
    )
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("sloline.serving")


@contextmanager
def server_span(name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Iterator[Any]:
    """The front door's span for one request (tracing on), current while it is served;
    a child of the client's `traceparent` in `carrier` when it sent one."""
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span(
        name, context=extract(carrier), kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


def current_context() -> Any:
    """The current trace context (tracing on), for spans recorded later from elsewhere."""
    from opentelemetry import context

    return context.get_current()


def stage_span(
    parent: Any, stage: str, queued_at: float, dispatched_at: float, now: float, **attrs: Any
) -> None:
    """Record one stage visit, child of `parent`: queued at `queued_at`, its batch sent at
    `dispatched_at` and back at `now` (all on `time.monotonic`'s clock)."""
    to_ns = time.time_ns() - int(time.monotonic() * 1e9)  # monotonic to epoch nanoseconds
    span = tracer.start_span(
        f"stage {stage}",
        context=parent,
        start_time=to_ns + int(queued_at * 1e9),
        attributes={
            "sloline.stage": stage,
            "sloline.queue_wait_s": max(0.0, dispatched_at - queued_at),
            **attrs,
        },
    )
    span.end(end_time=to_ns + int(now * 1e9))
