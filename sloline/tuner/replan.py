"""Re-planning while serving: the planner run again on the last minute of arrivals, its plan
adopted when it changes a stage's hardware or batch and that change costs less than what runs.

The tuner (Algorithms 3 and 4) only changes replica counts, with the plan's batch sizes,
hardware and rho_m; InferLine re-runs its planner "periodically" (§3) for the rest. When
traffic stays away from the planning trace — another rate, another burstiness — the
cheapest configuration can use smaller batches or other hardware, which no replica count
reaches (docs/tuner.md, "Re-planning"). :func:`choose` is the pure rule, shared by the
closed-loop simulation (``inferline-replan``) and the live :class:`Replanner`:

- plan only on a **steady** look-back (:meth:`ReplanSettings.steady`): planning on a
  climb packs the plan for a load already left behind, and the tuner is the fast path;
- adopt only when some stage gets **another hardware class or max batch** (replica
  counts are the tuner's business) and the stages it reconfigures then cost at least
  ``min_saving`` of the pipeline's running cost per hour less than their replicas
  running now (a plan cheaper only in the other stages' counts saves nothing: they keep
  their replicas);
- a changed stage starts the new plan's replicas of its new configuration and hands
  over once they serve (the old ones finish their batches, then stop); a stage the plan
  leaves as it is keeps at least the replicas it runs, and the tuner, now on the new
  plan's rho_m, mu_m and envelope, scales it from there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from sloline.common.envelope import Envelope
from sloline.planner.config import StageConfig
from sloline.planner.plan import Plan
from sloline.planner.planner import InfeasibleError
from sloline.planner.planner import plan as make_plan
from sloline.planner.problem import PlanningProblem

__all__ = ["ReplanSettings", "Replanner", "choose", "plan_recent"]

_LOG = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ReplanSettings:
    """When to run the planner again, on what, and when to adopt its plan.

    Every ``interval_s`` it plans on the arrivals of the last ``lookback_s``, if their
    rate is steady (the look-back's two halves differ by at most ``max_drift`` of the
    first); it adopts that plan when some stage gets another hardware class or max batch
    and the stages it reconfigures save at least ``min_saving`` of the replicas running
    now, per hour."""

    interval_s: float = 30.0
    lookback_s: float = 60.0
    min_saving: float = 0.10
    max_drift: float = 0.10

    def __post_init__(self) -> None:
        if not (self.interval_s > 0.0 and self.lookback_s > 0.0):
            raise ValueError(
                f"interval_s and lookback_s must be > 0, got {self.interval_s}, {self.lookback_s}"
            )
        if not 0.0 <= self.min_saving < 1.0:
            raise ValueError(f"min_saving must be in [0, 1), got {self.min_saving}")
        if not self.max_drift >= 0.0:
            raise ValueError(f"max_drift must be >= 0, got {self.max_drift}")

    def steady(self, arrivals_s: FloatArray) -> bool:
        """Whether ``arrivals_s`` (times within the look-back, from 0) hold a steady rate."""
        first = int(np.searchsorted(arrivals_s, 0.5 * self.lookback_s))
        second = arrivals_s.size - first
        return first > 0 and abs(second - first) <= self.max_drift * first


def plan_recent(
    problem: PlanningProblem, arrivals_s: FloatArray, windows_s: Sequence[float]
) -> Plan | None:
    """The planner on ``arrivals_s`` (from 0) with ``problem``'s pipeline, prices and SLO;
    its envelope at ``windows_s``, the windows the tuner observes. None if infeasible."""
    try:
        candidate = make_plan(dataclasses.replace(problem, arrivals_s=arrivals_s))
    except InfeasibleError:
        return None
    return dataclasses.replace(candidate, envelope=Envelope.of_trace(arrivals_s, windows_s))


def choose(
    running: Plan,
    candidate: Plan | None,
    desired: Sequence[int],
    prices: Mapping[str, float],
    settings: ReplanSettings,
) -> tuple[tuple[int | StageConfig, ...] | None, str]:
    """The targets that adopt ``candidate`` (per stage, topology order: a new
    configuration where its hardware or batch changes, else a replica count), or None
    when it is not adopted; and why. ``desired``: the replicas running now per stage,
    on ``running``'s hardware.

    The saving that counts is the reconfigured stages': their replicas running now less
    the candidate's replicas of them, at each class's price. The other stages keep at
    least the replicas they run, so a candidate that is cheaper only in their counts
    saves nothing by being adopted (the tuner scales those)."""
    if candidate is None:
        return None, "no configuration meets the SLO on the look-back's arrivals"
    changed = [
        (new.hardware, new.max_batch) != (old.hardware, old.max_batch)
        for new, old in zip(candidate.stages, running.stages, strict=True)
    ]
    if not any(changed):
        return None, "only replica counts would change (the tuner's business)"
    now = sum(n * prices[s.hardware] for n, s in zip(desired, running.stages, strict=True))
    saving = sum(
        n * prices[old.hardware] - new.replicas * prices[new.hardware]
        for new, old, n, change in zip(
            candidate.stages, running.stages, desired, changed, strict=True
        )
        if change
    )
    if saving < settings.min_saving * now:
        return None, (
            f"the plan for {candidate.rate_rps:.1f} rps would save ${saving:.3f}/hour of the "
            f"${now:.3f}/hour running, by the stages it reconfigures"
        )
    targets = tuple(
        StageConfig(new.hardware, new.max_batch, new.replicas) if change else max(new.replicas, n)
        for new, n, change in zip(candidate.stages, desired, changed, strict=True)
    )
    return targets, (
        f"a plan for {candidate.rate_rps:.1f} rps saves ${saving:.3f}/hour of the "
        f"${now:.3f}/hour running: "
        + ", ".join(
            f"{new.name} {new.replicas} x {new.hardware} batch {new.max_batch}"
            for new, change in zip(candidate.stages, changed, strict=True)
            if change
        )
    )


class Serving(Protocol):
    """What the live re-planner drives (implemented by the embedded pipeline)."""

    def recent_arrivals(self, since_s: float) -> FloatArray: ...
    def desired(self) -> Mapping[str, int]: ...
    def reconfigure(self, stage: str, config: StageConfig) -> None: ...
    def scale(self, stage: str, replicas: int) -> None: ...
    def adopt(self, plan: Plan) -> None: ...
    def handed_over(self, stage: str) -> bool: ...


def _planner_process() -> None:
    """The planner's process yields the cores to serving, and leaves Ctrl-C to the router
    (which shuts the pool down on its way out)."""
    os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Replanner:
    """The live loop: every ``settings.interval_s``, plan on the recent arrivals in a
    separate process at low priority (the planner is CPU-bound; in the router's process
    it would hold the event loop), :func:`choose`, and apply through ``serving``; every
    ``poll_s`` it completes pending handovers."""

    def __init__(
        self,
        *,
        problem: PlanningProblem,
        plan: Plan,
        serving: Serving,
        settings: ReplanSettings,
        windows_s: Sequence[float],
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.5,
        logger: logging.Logger = _LOG,
    ) -> None:
        self.problem = problem
        self.plan = plan
        self._serving = serving
        self._settings = settings
        self._windows = tuple(windows_s)
        self._clock = clock
        self._poll_s = poll_s
        self._log = logger
        self._pending: set[str] = set()
        self.adopted: list[tuple[float, Plan]] = []  # (time, plan)
        self.handed_over: list[tuple[float, str]] = []  # (time, stage)

    async def step(self, pool: concurrent.futures.Executor | None) -> Plan | None:
        """One re-plan: returns the adopted plan, or None."""
        now = self._clock()
        arrivals = self._serving.recent_arrivals(now - self._settings.lookback_s)
        arrivals = arrivals - (now - self._settings.lookback_s)
        if not self._settings.steady(arrivals):
            self._log.info(
                "re-plan: skipped, %d arrivals in the last %.0f s are not a steady rate",
                arrivals.size,
                self._settings.lookback_s,
            )
            return None
        loop = asyncio.get_running_loop()
        candidate = await loop.run_in_executor(
            pool, plan_recent, self.problem, arrivals, self._windows
        )
        stages = [s.name for s in self.plan.stages]
        desired = self._serving.desired()
        targets, why = choose(
            self.plan,
            candidate,
            [desired[n] for n in stages],
            self.problem.hardware_costs,
            self._settings,
        )
        if candidate is None or targets is None:
            self._log.info("re-plan: kept the running plan: %s", why)
            return None
        for name, target in zip(stages, targets, strict=True):
            if isinstance(target, StageConfig):
                self._serving.reconfigure(name, target)
                self._pending.add(name)
            elif target != desired[name]:
                self._serving.scale(name, target)
        self._log.info("re-plan: adopted %s", why)
        self.plan = candidate
        self.adopted.append((now, candidate))
        self._serving.adopt(candidate)
        return candidate

    def hand_over(self) -> None:
        """Complete the handovers whose new workers all serve."""
        for name in list(self._pending):
            if self._serving.handed_over(name):
                self._pending.discard(name)
                self.handed_over.append((self._clock(), name))

    async def run(self, stop: asyncio.Event) -> None:
        """Re-plan every ``interval_s`` until ``stop``; a failed re-plan is logged, not fatal."""
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=context, initializer=_planner_process
        ) as pool:
            next_s = self._clock() + self._settings.interval_s
            while not stop.is_set():
                self.hand_over()
                if self._clock() >= next_s:
                    next_s += self._settings.interval_s
                    try:
                        await self.step(pool)
                    except Exception:
                        self._log.exception("re-plan failed; serving goes on with the plan")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._poll_s)
