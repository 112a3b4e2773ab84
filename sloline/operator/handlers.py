"""The kopf handlers of `predictionpipelines.sloline.dev`, registered on an injected registry.

Thin by design: each handler reads the object, calls `reconcile` (or the readiness or
tuner code) and maps the outcome onto kopf's retry semantics. Everything they use comes
from an `OperatorContext` built once by the CLI or a test, so no handler reaches for
globals, and two operators (a test's restart) never share state.

- create / update / resume: `reconcile`; while profiling Jobs run it raises
  `kopf.TemporaryError(delay=profiling.pollS)`, so kopf calls it again (and resumes that
  after an operator restart); an invalid spec, a failed profile or an infeasible SLO end
  it with `kopf.PermanentError` until the object changes again, and so does any other
  exception (`InternalError`: logged once with its traceback, reported on the object).
- Deployment events (objects managed by the operator): the owner's Ready condition.
- Pod events (pods with a storage initializer): the owner's ModelsReady condition, from
  the initializers' states and termination messages (a checksum mismatch, a failed
  fetch), and Ready with it while the pipeline does not serve.
- the tuner daemon, one per pipeline, when `prometheusUrl` is set.

Events on the pipeline are sloline's own (`InvalidSpec`, `Profiling`, `ProfilingFailed`,
`Planned`, `Infeasible`, `ScaledUp`, `ScaledDown`, `ReconcileError`, `InternalError`);
kopf's own handler chatter stays in the operator's log (`posting.level`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import kopf

from sloline.operator import kube
from sloline.operator.kube import ApiError, KubeApi
from sloline.operator.naming import (
    LABEL_PIPELINE,
    MANAGER,
    STORAGE_INITIALIZER,
    managed_selector,
)
from sloline.operator.reconcile import Failed, OperatorContext, Waiting, reconcile, update_status
from sloline.operator.status import condition, with_models, with_readiness
from sloline.operator.tuner import DaemonContext, TunerDaemon
from sloline.tuner.sources import GetJson, urllib_get_json

PIPELINES: Final = ("sloline.dev", "v1alpha1", "predictionpipelines")
FINALIZER: Final = "sloline.dev/operator"
KOPF_PREFIX: Final = "operator.sloline.dev"
_LOG = logging.getLogger(__name__)


def kopf_settings(*, quick: bool = False) -> kopf.OperatorSettings:
    """kopf's settings for the sloline operator; `quick` shortens kopf's idle waits (for
    tests, where the emulator answers at once and every second counts)."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # kopf's bookkeeping under its own prefix: kopf leaves every annotation with its prefix
    # out of the object's essence, and `sloline.dev/model-dir` must count as a change.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    # Events are sloline's own (kopf.event ignores the level); kopf's "handler failed
    # temporarily" while Jobs run would post one every poll.
    settings.posting.level = logging.CRITICAL
    settings.posting.reporting_component = MANAGER
    if quick:
        settings.queueing.idle_timeout = 1.0
        settings.queueing.exit_timeout = 1.0
        settings.watching.server_timeout = 30
        settings.watching.reconnect_backoff = 0.1
        settings.posting.idle_timeout = 0.1
    return settings


def connection_info(api: KubeApi) -> kopf.ConnectionInfo:
    """kopf's credentials from the same client configuration the operator's API uses."""
    config = api.configuration
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


def _poster(body: kopf.Body) -> Callable[[str, str, str], None]:
    def event(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    return event


def _fetches_a_model(body: kopf.Body, **_: Any) -> bool:
    init = (body.get("spec") or {}).get("initContainers") or []
    return any(c.get("name") == STORAGE_INITIALIZER for c in init)


def _report_models(ctx: OperatorContext, body: kopf.Body) -> None:
    """ModelsReady (and Ready) of the pod's pipeline from its pods' storage initializers."""
    pipeline = (body.metadata.labels or {}).get(LABEL_PIPELINE)
    namespace = body.metadata.namespace
    if not pipeline or not namespace:
        return

    def change(old: Mapping[str, Any]) -> dict[str, Any]:
        pods = ctx.api.list(kube.PODS, namespace, managed_selector(pipeline))
        new = with_models(old, pods, now=ctx.now())
        deployments = ctx.api.list(kube.DEPLOYMENTS, namespace, managed_selector(pipeline))
        if deployments and condition(old, "Ready") is not None:  # deployed
            new = with_readiness(new, deployments, now=ctx.now())
        return new

    update_status(ctx, namespace, pipeline, change)


def build_registry(
    ctx: OperatorContext, *, get_json: GetJson = urllib_get_json
) -> kopf.OperatorRegistry:
    """All handlers of the operator, bound to `ctx` (its metrics included), on a fresh
    registry."""
    registry = kopf.OperatorRegistry()
    metrics = ctx.metrics

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(ctx.api)

    @kopf.on.resume(*PIPELINES, id="reconcile", registry=registry)
    @kopf.on.create(*PIPELINES, id="reconcile", registry=registry)
    @kopf.on.update(*PIPELINES, id="reconcile", registry=registry)
    def reconcile_pipeline(body: kopf.Body, **_: Any) -> None:
        event = _poster(body)
        namespace = body.metadata.namespace or "default"
        metrics.seen(namespace)
        started = time.perf_counter()
        try:
            reconcile(ctx, body, event)
        except Waiting as exc:
            metrics.reconciled(namespace, "waiting", started)
            raise kopf.TemporaryError(str(exc), delay=exc.delay_s) from None
        except Failed as exc:
            metrics.reconciled(namespace, "failed", started, exc.reason)
            raise kopf.PermanentError(str(exc)) from None
        except ApiError as exc:
            metrics.reconciled(namespace, "error", started, "ApiError")
            event("Warning", "ReconcileError", f"{exc}; retrying")
            raise
        metrics.reconciled(namespace, "ok", started)

    @kopf.on.event(
        "apps",
        "v1",
        "deployments",
        id="readiness",
        labels={"app.kubernetes.io/managed-by": MANAGER},
        registry=registry,
    )
    def deployment_changed(body: kopf.Body, **_: Any) -> None:
        pipeline = (body.metadata.labels or {}).get(LABEL_PIPELINE)
        namespace = body.metadata.namespace
        if not pipeline or not namespace:
            return

        def change(old: Mapping[str, Any]) -> dict[str, Any]:
            if condition(old, "Ready") is None:  # not deployed yet: reconcile reports it
                return dict(old)
            listed = ctx.api.list(kube.DEPLOYMENTS, namespace, managed_selector(pipeline))
            return with_readiness(old, listed, now=ctx.now())

        update_status(ctx, namespace, pipeline, change)

    @kopf.on.event(
        "",
        "v1",
        "pods",
        id="models",
        labels={"app.kubernetes.io/managed-by": MANAGER},
        when=_fetches_a_model,
        registry=registry,
    )
    def pod_changed(body: kopf.Body, **_: Any) -> None:
        _report_models(ctx, body)

    if ctx.settings.prometheus_url:

        @kopf.daemon(*PIPELINES, id="tuner", registry=registry, cancellation_timeout=10.0)
        async def tune(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
            namespace, name = body.metadata.namespace or "default", body.metadata.name or ""

            async def set_attainment(text: str) -> None:
                def change(old: Mapping[str, Any]) -> dict[str, Any]:
                    return {**old, "attainment": text}

                await asyncio.to_thread(update_status, ctx, namespace, name, change)

            daemon = TunerDaemon(
                DaemonContext(
                    api=ctx.api,
                    settings=ctx.settings,
                    metrics=metrics,
                    namespace=namespace,
                    pipeline=name,
                    event=_poster(body),
                    set_attainment=set_attainment,
                    get_json=get_json,
                )
            )
            await daemon.run(stopped)

    return registry
