"""Profile-then-plan for a pipeline file: what `sloline plan` and `sloline run` do.

This is the I/O shell around the pure planner: it reads the planning trace (inline,
generated from rate and CV², or a file of timestamps), profiles the stages (cached), and
calls `plan()`. The returned `PlanningSession` keeps the problem and evaluator so the
caller can draw the estimated latency distribution of the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sloline.common.trace import arrival_problem, trace_from_timestamps
from sloline.measure.profiler import ProfilerSettings, profile_pipeline
from sloline.planner.estimator import Estimate
from sloline.planner.evaluator import Evaluator
from sloline.planner.plan import Plan
from sloline.planner.planner import plan
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import PipelineProfile
from sloline.planner.workload import parse_arrival_times, trace_for_workload
from sloline.spec import HardwareCatalog, Issue, LoadedPipeline, PipelineError


@dataclass(frozen=True, slots=True)
class PlanningSession:
    profile: PipelineProfile
    problem: PlanningProblem
    evaluator: Evaluator
    plan: Plan

    def estimate(self) -> Estimate:
        """Per-query estimated latencies of the plan on the planning trace."""
        return self.evaluator.estimate(self.plan.config)  # both in topology order


def planning_trace(loaded: LoadedPipeline) -> np.ndarray:
    workload = loaded.pipeline.spec.workload
    if workload.trace_uri:
        path = loaded.resolve(workload.trace_uri, "spec.workload.traceUri")
        try:
            times = parse_arrival_times(path.read_text())
        except (OSError, ValueError) as exc:
            raise PipelineError(
                [Issue("spec.workload.traceUri", f"cannot read {path}: {exc}")], loaded.name
            ) from None
        problem = arrival_problem(times)
        if problem:
            raise PipelineError(
                [Issue("spec.workload.traceUri", f"{path}: {problem}")], loaded.name
            )
        return trace_from_timestamps(times)
    return trace_for_workload(workload)


def plan_pipeline(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    settings: ProfilerSettings | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    profile: PipelineProfile | None = None,
) -> PlanningSession:
    """Profile (cached) and plan; raises `InfeasibleError` with the reason when no
    configuration of the allowed hardware meets the SLO."""
    profile = profile or profile_pipeline(loaded, catalog, settings, progress)
    problem = PlanningProblem.from_graph(loaded.graph, profile, catalog, planning_trace(loaded))
    evaluator = Evaluator(problem)
    progress("planning ...")
    planned = plan(problem, evaluator)
    if planned.routers != problem.routers:  # the estimates of the plan are at its routers
        problem = replace(problem, routers=planned.routers)
        evaluator = Evaluator(problem)
    return PlanningSession(profile, problem, evaluator, planned)


def plot_latency_cdf(session: PlanningSession, path: Path) -> None:
    """Estimated end-to-end latency CDF of the plan vs the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan_ = session.plan
    latencies_ms = np.sort(session.estimate().latencies_s) * 1000.0
    fraction = np.arange(1, latencies_ms.size + 1) / latencies_ms.size
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(latencies_ms, fraction, label=f"plan (${plan_.cost_per_hour:.3f}/h)")
    slo_ms = plan_.slo_s * 1000.0
    ax.axvline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.axhline(
        plan_.percentile / 100.0, color="grey", linestyle=":", label=f"P{plan_.percentile:g}"
    )
    ax.set_xlabel("estimated end-to-end latency (ms)")
    ax.set_ylabel("fraction of queries")
    ax.set_title(f"{plan_.pipeline}: estimated latency on the planning trace")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
