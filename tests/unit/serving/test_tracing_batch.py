"""A worker's span for one batch: parented by its first traced request, linked to all of
them; the router sends trace contexts in the batch message only while it traces."""

from __future__ import annotations

import numpy as np
import pytest

from sloline.common.tensors import Tensor
from sloline.serving import tracing, wire

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

A = f"00-{1:032x}-{0xA:016x}-01"
B = f"00-{2:032x}-{0xB:016x}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("test"))
    return exporter


def test_batch_span_is_a_child_of_the_first_request_linked_to_all(spans) -> None:
    tracing.batch_span(["", A, B, ""], "fast", "fast-1", 0.002, "ValueError: boom")
    (span,) = spans.get_finished_spans()
    assert span.name == "worker fast" and span.kind == SpanKind.CONSUMER
    assert (span.context.trace_id, span.parent.span_id) == (1, 0xA)
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (1, 0xA),
        (2, 0xB),
    ]
    assert span.attributes["sloline.batch_size"] == 4
    assert span.attributes["sloline.worker"] == "fast-1"
    assert span.end_time - span.start_time == 2_000_000
    assert span.status.status_code == StatusCode.ERROR


def test_untraced_batch_records_nothing(spans) -> None:
    tracing.batch_span(["", "not a traceparent"], "fast", "fast-1", 0.001)
    assert spans.get_finished_spans() == ()


def test_traceparent_of_the_current_span(spans) -> None:
    with tracing.tracer.start_as_current_span("request") as span:
        context = tracing.current_context()
    sc = span.get_span_context()
    flags = f"{sc.trace_flags:02x}"  # sampled, maybe with the random-trace-id flag
    assert tracing.traceparent(context) == f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{flags}"
    assert int(flags, 16) & 1
    assert tracing.traceparent(None) == ""  # no current span


def test_batch_message_carries_trace_contexts_only_when_given() -> None:
    item = {"x": Tensor.from_array(np.zeros(2, dtype=np.float32))}
    plain, _ = wire.decode_router_message(wire.batch_message(7, [item, item]))
    assert list(plain.batch.traceparent) == []
    traced, _ = wire.decode_router_message(wire.batch_message(7, [item, item], [A, ""]))
    assert list(traced.batch.traceparent) == [A, ""]
