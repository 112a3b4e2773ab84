"""Every metric family sloline exports in the embedded mode, with its exposition name
(``_total`` for counters) and type: for tests that check docs and dashboards against the
code rather than against a hand-kept list."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sloline.embedded import EmbeddedPipeline
from sloline.operator.metrics import OperatorMetrics
from sloline.serving.metrics import TunerMetrics
from sloline.spec import load_pipeline
from tests.support.serve import SLEEPY


def exported_metrics() -> dict[str, str]:
    """``{name: type}`` of the router's, the targets', the tuner's and the operator's
    metric families."""
    pipeline = EmbeddedPipeline(load_pipeline(SLEEPY))  # starts nothing; registers metrics
    TunerMetrics(pipeline.registry)
    operator = CollectorRegistry()
    OperatorMetrics(operator)
    return {
        (f"{m.name}_total" if m.type == "counter" else m.name): m.type
        for registry in (pipeline.registry, operator)
        for m in registry.collect()
        if m.name.startswith("sloline_")  # not the default process_* and python_* ones
    }
