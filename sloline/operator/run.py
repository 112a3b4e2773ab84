"""The composition root of `sloline operator`: settings in, a running kopf operator out.

The CLI parses flags and the settings file; this builds the API client, the metrics
registry (served on the operator's metrics port), the handler registry and kopf's
settings, and runs kopf until SIGINT / SIGTERM.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import start_http_server

from sloline.operator.handlers import build_registry, kopf_settings
from sloline.operator.kube import KubeApi
from sloline.operator.metrics import OperatorMetrics
from sloline.operator.reconcile import OperatorContext
from sloline.operator.settings import OperatorSettings
from sloline.serving.metrics import new_registry


def run_operator(
    settings: OperatorSettings,
    *,
    kubeconfig: str | None = None,
    namespaces: Sequence[str] = (),
    standalone: bool = False,
    metrics_port: int = 8080,
    liveness_endpoint: str | None = None,
) -> None:
    """Serve PredictionPipelines in `namespaces` (every namespace when empty)."""
    import kopf

    registry = new_registry()
    metrics = OperatorMetrics(registry)
    if metrics_port:
        start_http_server(metrics_port, registry=registry)
    context = OperatorContext(KubeApi.connect(kubeconfig), settings, metrics=metrics)
    kopf.run(
        registry=build_registry(context),
        settings=kopf_settings(),
        namespaces=list(namespaces),
        clusterwide=not namespaces,
        standalone=standalone,
        liveness_endpoint=liveness_endpoint,
    )
