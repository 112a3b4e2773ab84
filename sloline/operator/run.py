"""The composition root of `sloline operator`: settings in, a running kopf operator out.

The CLI parses flags and the settings file; this builds the API client, the metrics
registry (served on the operator's metrics port), the admission webhook's HTTPS server
(with its certificate published in the webhook configuration), the handler registry and
kopf's settings, and runs kopf until SIGINT / SIGTERM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import start_http_server

from sloline.operator.admission import WebhookServer, publish_ca_bundle, self_signed
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
    webhook: WebhookOptions | None = None,
) -> None:
    """Serve PredictionPipelines in `namespaces` (every namespace when empty), and their
    admission reviews when `webhook` is given."""
    import kopf

    registry = new_registry()
    metrics = OperatorMetrics(registry)
    if metrics_port:
        start_http_server(metrics_port, registry=registry)
    api = KubeApi.connect(kubeconfig)
    context = OperatorContext(api, settings, metrics=metrics)
    server = None
    try:
        if webhook is not None:
            certificate = self_signed(webhook.names)
            server = WebhookServer(settings, certificate, port=webhook.port).start()
            if webhook.configuration:
                publish_ca_bundle(api, webhook.configuration, certificate.ca)
        kopf.run(
            registry=build_registry(context),
            settings=kopf_settings(),
            namespaces=list(namespaces),
            clusterwide=not namespaces,
            standalone=standalone,
            liveness_endpoint=liveness_endpoint,
        )
    finally:
        if server is not None:
            server.stop()


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """The admission webhook: its port, the DNS names (or IPs) its certificate is for,
    and the ValidatingWebhookConfiguration whose `caBundle` gets the certificate's CA
    ("" = publish it nowhere)."""

    port: int
    names: tuple[str, ...]
    configuration: str = ""
