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

Across the worker channel: while tracing is on, the router sends each batch with the
W3C `traceparent` of every item's request (`Batch.traceparent` in worker.proto; nothing is
built when it is off), and a worker whose tracing is on records one span for the batch's
model execution (`worker <stage>`, :func:`batch_span`). A batch serves many requests and
a span has one parent: its parent is the first traced request in the batch (so it shows
in that request's tree, beside the `stage <name>` span that covers its queue wait and
round trip), and it links to every traced request in the batch, the first included
(OpenTelemetry's way for batch processing); a trace viewer follows the links from the
others. Workers configure tracing from the same environment (`sloline run
--otlp-endpoint` passes its endpoint to the workers it starts as
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
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
    from_env = endpoint_from_env()
    endpoint = endpoint or from_env
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
    if endpoint != from_env:  # the workers this process starts export to it too
        os.environ[ENDPOINT_ENVS[0]] = endpoint


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


def traceparent(context: Any) -> str:
    """The W3C `traceparent` of the span current in `context` ('' when it has none)."""
    from opentelemetry import trace

    sc = trace.get_current_span(context).get_span_context()
    if not sc.is_valid:
        return ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"


def batch_span(
    traceparents: Sequence[str], stage: str, worker: str, service_s: float, error: str = ""
) -> None:
    """Record a worker's model execution of one batch, which has just ended and took
    `service_s`: a child of the first traced request in `traceparents` (one per item, ''
    for an untraced one), linked to every traced one."""
    from opentelemetry import trace
    from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = TraceContextTextMapPropagator()
    requests = [
        trace.get_current_span(propagator.extract({"traceparent": tp})).get_span_context()
        for tp in traceparents
        if tp
    ]
    requests = [sc for sc in requests if sc.is_valid]
    if not requests:
        return
    end = time.time_ns()
    span = tracer.start_span(
        f"worker {stage}",
        context=trace.set_span_in_context(NonRecordingSpan(requests[0])),
        kind=SpanKind.CONSUMER,
        links=[Link(sc) for sc in requests],
        start_time=end - int(service_s * 1e9),
        attributes={
            "sloline.stage": stage,
            "sloline.worker": worker,
            "sloline.batch_size": len(traceparents),
            "sloline.service_s": service_s,
        },
    )
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end)
