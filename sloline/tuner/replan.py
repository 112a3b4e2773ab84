"""Re-planning while serving: the planner run again on the last minute of arrivals, as
served, its plan adopted when the configuration running misses the SLO on those arrivals, or
when it changes a stage's hardware or batch and that change costs less than what runs.

The tuner (Algorithms 3 and 4) only changes replica counts, with the plan's batch sizes,
hardware and rho_m; InferLine re-runs its planner "periodically" (§3) for the rest. When
traffic stays away from the planning trace — another rate, another burstiness — the
cheapest configuration can use smaller batches or other hardware, which no replica count
reaches (docs/tuner.md, "Re-planning"). :func:`choose` is the pure rule, shared by the
closed-loop simulation (``inferline-replan``) and the live :class:`Replanner`:

- save only on a **steady** look-back (:meth:`ReplanSettings.steady`): planning on a
  climb packs the plan for a load already left behind, and the tuner is the fast path;
  on any other look-back the planner runs only to rescue a configuration that misses;
- plan **as served**: live, the profile carries a calibration of the look-back's own
  batches (:mod:`sloline.planner.calibration`: each stage's extra model time per batch
  and in-situ idle penalty, the in-situ hops), so that a host slower than when it was
  profiled gets a plan sized for the speed it serves at (the tuner alone scales on
  arrivals and sees none of it);
- adopt when the configuration running (its hardware, batches and desired replicas)
  **misses the SLO** on the look-back's arrivals by the same estimate (a rescue: the
  stages the plan leaves as they are get at least its replica counts), or when some
  stage gets **another hardware class or max batch** (replica counts are the tuner's
  business) and the stages it reconfigures then cost at least ``min_saving`` of the
  pipeline's running cost per hour less than their replicas running now (a plan cheaper
  only in the other stages' counts saves nothing: they keep their replicas);
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
import functools
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
from sloline.planner.calibration import Calibration
from sloline.planner.config import Config, StageConfig
from sloline.planner.evaluator import Evaluator
from sloline.planner.plan import Plan
from sloline.planner.planner import InfeasibleError
from sloline.planner.planner import plan as make_plan
from sloline.planner.problem import PlanningProblem

__all__ = ["Replan", "ReplanSettings", "Replanner", "choose", "plan_recent", "running_config"]

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


@dataclass(frozen=True, slots=True)
class Replan:
    """The planner's answer on a look-back: its plan (None: no configuration meets the
    SLO, or not planned), the configuration running, estimated on the same arrivals: its
    latency at the SLO percentile (None: not estimated), and whether the look-back's rate
    was steady."""

    candidate: Plan | None
    running_tail_s: float | None = None
    steady: bool = True

    def misses(self, slo_s: float) -> bool:
        """Whether the configuration running was estimated over ``slo_s``."""
        return self.running_tail_s is not None and self.running_tail_s > slo_s


def plan_recent(
    problem: PlanningProblem,
    arrivals_s: FloatArray,
    windows_s: Sequence[float],
    running: Config | None = None,
    *,
    steady: bool = True,
) -> Replan:
    """The planner on ``arrivals_s`` (from 0) with ``problem``'s pipeline, profile, prices
    and SLO, its envelope at ``windows_s``, the windows the tuner observes; and
    ``running`` (a configuration of the same pipeline) estimated on those arrivals. On a
    look-back that is not ``steady`` the planner runs only where ``running`` misses the
    SLO there (a rescue)."""
    recent = dataclasses.replace(problem, arrivals_s=arrivals_s)
    tail = None
    if running is not None:
        tail = Evaluator(recent).estimate(running).percentile_s(recent.percentile)
    unplanned = Replan(None, tail, steady)
    if not (steady or unplanned.misses(recent.slo_s)):
        return unplanned
    try:
        candidate = make_plan(recent)
    except InfeasibleError:
        return unplanned
    envelope = Envelope.of_trace(arrivals_s, windows_s)
    return Replan(dataclasses.replace(candidate, envelope=envelope), tail, steady)


def choose(
    running: Plan,
    replan: Replan,
    desired: Sequence[int],
    prices: Mapping[str, float],
    settings: ReplanSettings,
    slo_s: float,
) -> tuple[tuple[int | StageConfig, ...] | None, str]:
    """The targets that adopt ``replan.candidate`` (per stage, topology order: a new
    configuration where its hardware or batch changes, else a replica count), or None
    when it is not adopted; and why. ``desired``: the replicas running now per stage,
    on ``running``'s hardware.

    Where the configuration running misses ``slo_s`` on the look-back
    (``replan.running_tail_s``), the candidate is adopted whatever it costs, and the
    stages it leaves as they are keep at least the replicas they run. Otherwise the saving
    that counts is the reconfigured stages': their replicas running now less the
    candidate's replicas of them, at each class's price. The other stages keep at least
    the replicas they run, so a candidate that is cheaper only in their counts saves
    nothing by being adopted (the tuner scales those)."""
    candidate, misses = replan.candidate, replan.misses(slo_s)
    if not (misses or replan.steady):
        return None, "not a steady rate, and the running configuration meets the SLO"
    if candidate is None:
        return None, "no configuration meets the SLO on the look-back's arrivals"
    changed = [
        (new.hardware, new.max_batch) != (old.hardware, old.max_batch)
        for new, old in zip(candidate.stages, running.stages, strict=True)
    ]
    targets = tuple(
        StageConfig(new.hardware, new.max_batch, new.replicas) if change else max(new.replicas, n)
        for new, n, change in zip(candidate.stages, desired, changed, strict=True)
    )
    reconfigured = ", ".join(
        f"{new.name} {new.replicas} x {new.hardware} batch {new.max_batch}"
        for new, change in zip(candidate.stages, changed, strict=True)
        if change
    )
    if misses:
        assert replan.running_tail_s is not None
        return _rescue(candidate, desired, targets, reconfigured, replan.running_tail_s, slo_s)
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
    return targets, (
        f"a plan for {candidate.rate_rps:.1f} rps saves ${saving:.3f}/hour of the "
        f"${now:.3f}/hour running: {reconfigured}"
    )


def _rescue(
    candidate: Plan,
    desired: Sequence[int],
    targets: tuple[int | StageConfig, ...],
    reconfigured: str,
    tail_s: float,
    slo_s: float,
) -> tuple[tuple[int | StageConfig, ...] | None, str]:
    """:func:`choose` where the running configuration misses the SLO by ``tail_s``."""
    if targets == tuple(desired):
        return None, "the running configuration misses the SLO, and so does the plan's"
    scaled = ", ".join(
        f"{new.name} {n} -> {t}"
        for new, n, t in zip(candidate.stages, desired, targets, strict=True)
        if isinstance(t, int) and t != n
    )
    return targets, (
        f"the running configuration misses the SLO on the look-back's arrivals "
        f"(estimated {tail_s * 1e3:.1f} ms > {slo_s * 1e3:.1f} ms); the plan for "
        f"{candidate.rate_rps:.1f} rps: " + "; ".join(p for p in (reconfigured, scaled) if p)
    )


def running_config(plan: Plan, desired: Sequence[int]) -> Config:
    """``plan``'s hardware and batches with the ``desired`` replicas (topology order)."""
    return tuple(
        StageConfig(s.hardware, s.max_batch, max(1, n))
        for s, n in zip(plan.stages, desired, strict=True)
    )


class Serving(Protocol):
    """What the live re-planner drives (implemented by the embedded pipeline)."""

    def recent_arrivals(self, since_s: float) -> FloatArray: ...
    def measured(self, since_s: float) -> Calibration | None: ...
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
        self.measured: Calibration | None = None  # the last re-plan's, if serving measured one
        self.handed_over: list[tuple[float, str]] = []  # (time, stage)

    async def step(self, pool: concurrent.futures.Executor | None) -> Plan | None:
        """One re-plan: returns the adopted plan, or None."""
        now = self._clock()
        arrivals = self._serving.recent_arrivals(now - self._settings.lookback_s)
        arrivals = arrivals - (now - self._settings.lookback_s)
        stages = [s.name for s in self.plan.stages]
        desired = self._serving.desired()
        counts = [desired[n] for n in stages]
        problem = self.problem
        measured = self.measured = self._serving.measured(now - self._settings.lookback_s)
        if measured is not None:
            problem = dataclasses.replace(problem, profile=measured.apply(problem.profile))
        loop = asyncio.get_running_loop()
        replan = await loop.run_in_executor(
            pool,
            functools.partial(
                plan_recent,
                problem,
                arrivals,
                self._windows,
                running_config(self.plan, counts),
                steady=self._settings.steady(arrivals),
            ),
        )
        candidate = replan.candidate
        targets, why = choose(
            self.plan, replan, counts, problem.hardware_costs, self._settings, problem.slo_s
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
