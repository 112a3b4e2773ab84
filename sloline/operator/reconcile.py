"""One reconciliation of a PredictionPipeline: validate, profile, plan, deploy, report.

Each step reads what it needs, calls the pure functions (`planning`, `render`, `status`)
and writes through `apply` / `KubeApi`; every step is idempotent, so the kopf handlers
can run `reconcile` again at any time (a retry, an update, an operator restart) and it
picks up where the cluster is:

1. validate the spec (`sloline.spec`, plus what this cluster's catalog requires);
2. for each (stage, hardware class) whose cache key `<p>-profiles` lacks: a Job; a
   finished Job's termination message goes into the cache and the Job is deleted; while
   Jobs run, `Waiting` (the handler retries after `profiling.pollS`);
3. plan, unless `<p>-config` already holds the plan of the same inputs;
4. render and apply `<p>-worker-token` (its token made once, then read back), `<p>-config`,
   the routers, their Services, NetworkPolicy and PodDisruptionBudget, the workers (and
   the ServiceMonitor, the Ingress and Gateway API routes the pipeline wants), prune what
   it no longer needs;
5. status: conditions, phase, plan summary, endpoints.

`Waiting` and `Failed` tell the caller how it ended short of a deployment; this module
knows nothing of kopf.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from sloline.operator import kube
from sloline.operator.apply import ApplyReport, apply, prune
from sloline.operator.exposure import render_exposure
from sloline.operator.kube import ApiError, KubeApi
from sloline.operator.metrics import OperatorMetrics
from sloline.operator.naming import (
    ANNOTATION_PLAN_INPUTS,
    ANNOTATION_PROFILE_KEY,
    LABEL_COMPONENT,
    LABEL_PIPELINE,
    Target,
    config_map_name,
    job_name,
    managed_selector,
    profiles_name,
    router_name,
    worker_secret_name,
)
from sloline.operator.planning import (
    CacheEntry,
    ProfileTask,
    assemble,
    catalog_file,
    cut,
    dataflow_digest,
    object_issues,
    plan_from_profile,
    plan_inputs,
    profile_tasks,
    read_cache,
)
from sloline.operator.pods import render_profiling_job
from sloline.operator.render import pipeline_file, render, render_profiles_cache, secret_token
from sloline.operator.settings import OperatorSettings
from sloline.operator.status import (
    INTERNAL_ERROR,
    ConditionStatus,
    addressable,
    plan_summary,
    utc_now,
    with_conditions,
    with_models,
    with_readiness,
)
from sloline.planner.plan import Plan
from sloline.serving.auth import generate_token

_LOG = logging.getLogger(__name__)

EventFn = Callable[[str, str, str], None]
"""`event(type, reason, message)`: post a Kubernetes Event on the pipeline."""
Update = tuple[str, ConditionStatus, str, str]


class Waiting(Exception):
    """Not done yet (profiling Jobs run); reconcile again after `delay_s`."""

    def __init__(self, message: str, delay_s: float) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class Failed(Exception):
    """The pipeline cannot be served as specified; `reason` is the condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class OperatorContext:
    """What every handler needs, built once in the CLI (or a test) and injected."""

    api: KubeApi
    settings: OperatorSettings
    now: Callable[[], str] = utc_now
    metrics: OperatorMetrics = field(default_factory=lambda: OperatorMetrics(CollectorRegistry()))


@dataclass(slots=True)
class StatusChanges:
    """Status edits collected during one reconcile, written once at the end."""

    generation: int
    conditions: list[Update] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    deployed: bool = False  # then Ready comes from the Deployments as they are at the write
    storage: bool = False  # a stage's model comes from storage: ModelsReady from the pods

    def set(self, type_: str, value: ConditionStatus, reason: str, message: str) -> None:
        self.conditions.append((type_, value, reason, message))

    def apply_to(self, status: Mapping[str, Any], now: str) -> dict[str, Any]:
        merged = {**status, **self.fields}
        return with_conditions(merged, self.conditions, generation=self.generation, now=now)


def update_status(
    ctx: OperatorContext,
    namespace: str,
    name: str,
    change: Callable[[Mapping[str, Any]], dict[str, Any]],
    *,
    attempts: int = 8,
) -> dict[str, Any] | None:
    """Read-modify-write of `.status` guarded by the resourceVersion (a JSON-patch `test`),
    retried on conflict, so concurrent writers (reconcile, readiness, the tuner daemon)
    never lose each other's fields. No write when nothing changes; None if the pipeline
    is gone."""
    for attempt in range(attempts):
        live = ctx.api.get(kube.PIPELINES, namespace, name)
        if live is None:
            return None
        old = live.get("status") or {}
        new = change(old)
        if new == old:
            return live
        ops = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": live["metadata"]["resourceVersion"],
            },
            {"op": "add", "path": "/status", "value": new},
        ]
        try:
            return ctx.api.patch(kube.PIPELINES, namespace, name, ops, subresource="status")
        except ApiError as exc:
            if not exc.conflict or attempt == attempts - 1:
                raise
    return None


def reconcile(ctx: OperatorContext, body: Mapping[str, Any], event: EventFn) -> ApplyReport:
    """Bring the cluster to the pipeline `body` (see the module docstring)."""
    meta = body["metadata"]
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    changes = StatusChanges(generation=int(meta.get("generation") or 0))

    def change(old: Mapping[str, Any]) -> dict[str, Any]:
        new = changes.apply_to(old, ctx.now())
        if changes.storage:  # ModelsReady from the pods' storage initializers
            pods = ctx.api.list(kube.PODS, namespace, managed_selector(name))
            new = with_models(new, pods, now=ctx.now())
        if changes.deployed:  # Ready from the Deployments as they are at this write
            listed = ctx.api.list(kube.DEPLOYMENTS, namespace, managed_selector(name))
            new = with_readiness(new, listed, now=ctx.now())
        return new

    try:
        target = _validate(ctx, body, changes, event)
        changes.storage = any(s.spec.model.storage_uri for s in target.graph.stages.values())
        tasks = profile_tasks(target, ctx.settings)
        dataflow = dataflow_digest(target, ctx.settings)
        cache = _profile(ctx, target, tasks, dataflow, changes, event)
        flush = lambda: update_status(ctx, namespace, name, change)  # noqa: E731
        plan, inputs = _plan(ctx, target, tasks, cache, dataflow, changes, event, flush)
        report = _deploy(ctx, target, plan, inputs, changes, event)
    except (Waiting, Failed):
        update_status(ctx, namespace, name, change)
        raise
    except ApiError:
        # Report what is known, but never let a second API failure hide the first.
        with contextlib.suppress(ApiError):
            update_status(ctx, namespace, name, change)
        raise
    except Exception as exc:
        # A bug or a spec the checks above did not foresee: logged once with its
        # traceback, reported on the object, and not retried until the object changes.
        _LOG.error("%s/%s: reconcile failed", namespace, name, exc_info=True)
        message = f"reconcile failed: {type(exc).__name__}: {cut(str(exc))}"
        changes.set("Ready", "False", INTERNAL_ERROR, message)
        event("Warning", INTERNAL_ERROR, message)
        with contextlib.suppress(Exception):
            update_status(ctx, namespace, name, change)
        raise Failed(INTERNAL_ERROR, message) from None
    update_status(ctx, namespace, name, change)
    return report


def _validate(
    ctx: OperatorContext, body: Mapping[str, Any], changes: StatusChanges, event: EventFn
) -> Target:
    target, issues = object_issues(body, ctx.settings)
    if issues or target is None:
        message = "; ".join(str(issue) for issue in issues)
        changes.set("Valid", "False", "InvalidSpec", message)
        event("Warning", "InvalidSpec", message)
        raise Failed("InvalidSpec", message)
    changes.set("Valid", "True", "Valid", "the spec is valid")
    return target


# --- profiling ---------------------------------------------------------------------------


def _job_state(job: Mapping[str, Any]) -> str:
    """`succeeded`, `failed` or `running`."""
    status = job.get("status") or {}
    for item in status.get("conditions") or []:
        if item.get("status") == "True" and item.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if item.get("status") == "True" and item.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    return "succeeded" if int(status.get("succeeded") or 0) > 0 else "running"


def _termination(pod: Mapping[str, Any]) -> tuple[int, str] | None:
    """(exit code, message) of the pod's terminated container, if it terminated, or of
    its failed init container (the storage initializer's reason: the pod never ran)."""
    status = pod.get("status") or {}
    for container in status.get("initContainerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None and int(terminated.get("exitCode", 0)) != 0:
            return int(terminated["exitCode"]), str(terminated.get("message") or "")
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            return int(terminated.get("exitCode", 1)), str(terminated.get("message") or "")
    return None


def _job_messages(ctx: OperatorContext, target: Target, task: ProfileTask) -> list[tuple[int, str]]:
    """Termination results of the task's profiling pods (those carrying its key)."""
    selector = (
        f"{LABEL_PIPELINE}={target.name},{LABEL_COMPONENT}=profiler,"
        f"sloline.dev/stage={task.stage},sloline.dev/hardware={task.hardware}"
    )
    found = []
    for pod in ctx.api.list(kube.PODS, target.namespace, selector):
        if (pod["metadata"].get("annotations") or {}).get(ANNOTATION_PROFILE_KEY) != task.key:
            continue
        result = _termination(pod)
        if result is not None:
            found.append(result)
    return found


def _job_failure(job: Mapping[str, Any]) -> str:
    """Why a failed Job failed, from its condition (e.g. its deadline passed)."""
    for item in (job.get("status") or {}).get("conditions") or []:
        if item.get("status") == "True" and item.get("type") in ("Failed", "FailureTarget"):
            reason, message = item.get("reason") or "", item.get("message") or ""
            if reason or message:
                return f"the Job failed: {reason}{': ' if reason and message else ''}{message}"
    return "the Job failed (no termination message)"


def _harvest(
    results: list[tuple[int, str]],
    task: ProfileTask,
    job: Mapping[str, Any],
    state: str,
    dataflow: str,
) -> tuple[CacheEntry | None, str | None]:
    """(entry, failure) of a finished Job (`state` from `_job_state`) from its pods'
    termination `results`: the cache entry of its profile message, or why it failed."""
    if state == "succeeded":
        for code, text in results:
            if code == 0 and text:
                try:
                    entry = CacheEntry.of(text, dataflow)
                except ValueError as exc:
                    return None, str(exc)
                message = entry.decoded
                if (message.stage, message.hardware) != (task.stage, task.hardware):
                    return None, (
                        f"the Job reported stage {message.stage!r} on {message.hardware!r}, "
                        f"expected {task.stage!r} on {task.hardware!r}"
                    )
                return entry, None
        seen = "; ".join(f"exit code {code}, {len(text)}-byte message" for code, text in results)
        return None, (
            f"the Job succeeded but no pod left a profile in its termination message ({seen})"
        )
    reasons = [text for code, text in results if code != 0 and text]
    return None, reasons[-1] if reasons else _job_failure(job)


@dataclass(slots=True)
class _Round:
    """Where each missing profile stands after looking at the Jobs."""

    running: list[ProfileTask] = field(default_factory=list)
    to_create: list[ProfileTask] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _collect(
    ctx: OperatorContext,
    target: Target,
    missing: list[ProfileTask],
    cache: dict[str, CacheEntry],
    dataflow: str,
) -> _Round:
    """Harvest finished Jobs of the `missing` tasks into `cache`; sort the rest."""
    selector = f"{managed_selector(target.name)},{LABEL_COMPONENT}=profiler"
    jobs = {j["metadata"]["name"]: j for j in ctx.api.list(kube.JOBS, target.namespace, selector)}
    found = _Round()
    for task in missing:
        job = jobs.get(job_name(target.name, task.stage, task.hardware))
        key = ((job or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_PROFILE_KEY)
        if job is None or key != task.key:
            found.to_create.append(task)
            continue
        state = _job_state(job)
        if state == "running":
            found.running.append(task)
            continue
        results = _job_messages(ctx, target, task)
        if state == "succeeded" and not results:
            # Its pods are gone (deleted or garbage-collected) with their messages: the
            # Job is pruned below and measured again.
            found.to_create.append(task)
            continue
        entry, failure = _harvest(results, task, job, state, dataflow)
        ctx.metrics.jobs_finished.labels(
            target.namespace, "failed" if entry is None else "succeeded"
        ).inc()
        if entry is not None:
            cache[task.key] = entry
        else:
            found.failures.append(f"{task.stage} on {task.hardware}: {failure}")
    return found


def _profile(
    ctx: OperatorContext,
    target: Target,
    tasks: tuple[ProfileTask, ...],
    dataflow: str,
    changes: StatusChanges,
    event: EventFn,
) -> dict[str, CacheEntry]:
    """The cache entries of every task, running Jobs for the missing ones."""
    api, settings, ns = ctx.api, ctx.settings, target.namespace
    live_cache = api.get(kube.CONFIG_MAPS, ns, profiles_name(target.name))
    wanted = {t.key for t in tasks}
    cache = {
        k: v for k, v in read_cache((live_cache or {}).get("data") or {}).items() if k in wanted
    }
    missing = [t for t in tasks if t.key not in cache]
    found = _collect(ctx, target, missing, cache, dataflow)
    entries = {k: v.to_text() for k, v in cache.items()}
    files = (live_cache or {}).get("data") or {}
    if found.to_create or "pipeline.yaml" not in files:  # new Jobs read the current spec
        files = {
            "pipeline.yaml": pipeline_file(target.graph),
            "catalog.yaml": catalog_file(settings),
        }
    apply(api, [render_profiles_cache(target, files, entries)])
    keep = {f"Job/{job_name(target.name, t.stage, t.hardware)}" for t in found.running}
    selector = f"{managed_selector(target.name)},{LABEL_COMPONENT}=profiler"
    prune(api, [kube.JOBS], ns, selector, target.uid, keep)
    if found.failures:
        message = "profiling failed: " + "; ".join(found.failures)
        changes.set("Profiled", "False", "ProfilingFailed", message)
        event("Warning", "ProfilingFailed", message)
        raise Failed("ProfilingFailed", message)
    for task in found.to_create:
        try:
            api.create(render_profiling_job(target, settings, task.stage, task.hardware, task.key))
        except ApiError as exc:
            if exc.status != 409:  # the old Job of that name is still going away
                raise
        else:
            ctx.metrics.jobs_started.labels(ns).inc()
    if found.to_create:
        names = ", ".join(f"{t.stage} on {t.hardware}" for t in found.to_create)
        event("Normal", "Profiling", f"started {len(found.to_create)} profiling Job(s): {names}")
    waiting = len(found.running) + len(found.to_create)
    if waiting:
        message = f"{len(tasks) - waiting}/{len(tasks)} profiles measured; {waiting} Job(s) running"
        changes.set("Profiled", "False", "Profiling", message)
        changes.set("Planned", "False", "WaitingForProfiles", "planning waits for the profiles")
        raise Waiting(message, settings.profiling.poll_s)
    changes.set("Profiled", "True", "Profiled", f"{len(tasks)} stage profiles cached")
    return cache


# --- planning and deployment ---------------------------------------------------------------


def _plan(
    ctx: OperatorContext,
    target: Target,
    tasks: tuple[ProfileTask, ...],
    cache: Mapping[str, CacheEntry],
    dataflow: str,
    changes: StatusChanges,
    event: EventFn,
    flush: Callable[[], object],
) -> tuple[Plan, str]:
    """The plan for these inputs: the deployed one if its inputs are the same, else new
    (`flush` shows `phase: Planning` meanwhile: planning a large pipeline takes a while)."""
    settings = ctx.settings
    inputs = plan_inputs(target, settings, tasks)
    live = ctx.api.get(kube.CONFIG_MAPS, target.namespace, config_map_name(target.name))
    annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    if live is not None and annotations.get(ANNOTATION_PLAN_INPUTS) == inputs:
        try:
            return Plan.from_dict(json.loads(live["data"]["plan.json"])), inputs
        except (KeyError, TypeError, ValueError):
            _LOG.warning(
                "%s/%s: unreadable plan.json, planning again", target.namespace, target.name
            )
    changes.set("Planned", "Unknown", "Planning", "planning with the cached profiles")
    flush()
    started = time.perf_counter()
    try:
        plan = plan_from_profile(target, assemble(tasks, cache, dataflow, settings), settings)
    except ValueError as exc:
        from sloline.planner.planner import InfeasibleError

        reason = "Infeasible" if isinstance(exc, InfeasibleError) else "PlanFailed"
        changes.set("Planned", "False", reason, str(exc))
        event("Warning", reason, str(exc))
        raise Failed(reason, str(exc)) from None
    finally:
        ctx.metrics.plan_seconds.labels(target.namespace).observe(time.perf_counter() - started)
    summary = (
        f"${plan.cost_per_hour:.3f}/h, estimated P{plan.percentile:g} "
        f"{plan.tail_s * 1000:.1f} ms (SLO {plan.slo_s * 1000:g} ms): "
        + ", ".join(f"{s.name} {s.replicas}x{s.hardware} batch {s.max_batch}" for s in plan.stages)
    )
    event("Normal", "Planned", summary)
    return plan, inputs


def _deploy(
    ctx: OperatorContext,
    target: Target,
    plan: Plan,
    inputs: str,
    changes: StatusChanges,
    event: EventFn,
) -> ApplyReport:
    api, settings, ns = ctx.api, ctx.settings, target.namespace
    monitors = api.serves("monitoring.coreos.com/v1", "servicemonitors")
    wanted = settings.service_monitor == "always" or (
        settings.service_monitor == "auto" and monitors
    )
    # The worker token is made once and kept: the live Secret's, unless it has none.
    live_secret = api.get(kube.SECRETS, ns, worker_secret_name(target.name))
    token = secret_token(live_secret) or generate_token()
    objects = render(
        target, plan, settings, worker_token=token, plan_inputs=inputs, service_monitor=wanted
    )
    # Ingress and routes where the cluster serves their API (Gateway API is a CRD).
    served = [r for r in kube.EXPOSURE if api.serves(r.api_version, r.plural)]
    exposed = render_exposure(target, settings)
    unserved = sorted({o["kind"] for o in exposed} - {r.kind for r in served})
    if unserved:
        message = f"the cluster does not serve {', '.join(unserved)}: not created"
        event("Warning", "ExposureUnavailable", message)
    objects += [o for o in exposed if o["kind"] not in unserved]
    report = apply(api, objects)
    keep = {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
    keep.add(f"ConfigMap/{profiles_name(target.name)}")
    resources = [kube.DEPLOYMENTS, kube.SERVICES, kube.CONFIG_MAPS, kube.JOBS, *served]
    resources += [kube.SERVICE_MONITORS] if monitors else []
    pruned = prune(api, resources, ns, managed_selector(target.name), target.uid, keep)
    report.deleted += pruned.deleted
    if report.changed:
        _LOG.info(
            "%s/%s: created %s, patched %s, deleted %s",
            ns,
            target.name,
            report.created,
            report.patched,
            report.deleted,
        )
    changes.set("Planned", "True", "Planned", f"plan for generation {changes.generation} deployed")
    changes.deployed = True
    changes.fields["plan"] = plan_summary(plan)
    changes.fields.update(
        addressable(router_name(target.name), ns, tls=target.tls_secret is not None)
    )
    return report
