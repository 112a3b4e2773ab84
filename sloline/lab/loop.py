"""The closed loop's data: what a scaling policy observes and returns, and what a
simulation run records (InferLine §5, §7).

A policy is a pure ``step(observation, state) -> (targets, state)``
(:data:`Step`): a frozen :class:`Observation` of the pipeline at one tick and the
policy's own frozen state in, one target replica count per stage out — the shape of
:func:`sloline.tuner.policy.decide` and of Ray Serve's autoscaling policies. The engine
(:mod:`sloline.lab.engine`) produces the observations and applies the targets; the
baselines (:mod:`sloline.lab.autoscalers`) and the InferLine tuner's adapter
(:mod:`sloline.lab.simulate`) are such steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sloline.common.envelope import Envelope
from sloline.planner.config import StageConfig

__all__ = ["Observation", "Policy", "Run", "ScaleEvent", "StageView", "Step", "Targets"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class StageView:
    """One stage as an autoscaler sees it at a tick."""

    name: str
    desired: int  # ready + starting: what the policy last asked for
    ready: int  # serving replicas (not leaving)
    starting: int  # asked for, not serving yet
    queued: int  # items waiting in the stage queue now
    in_service: int  # items in batches being served now
    mean_ongoing: float  # time-average of queued + in service over the last tick
    busy_replica_s: float  # replica-seconds spent serving batches in the last tick
    ready_replica_s: float  # replica-seconds of serving replicas in the last tick
    idle_for_s: tuple[float, ...]  # per ready replica, oldest first: idle time (0 = busy)


@dataclass(frozen=True, slots=True)
class Observation:
    """What a scaling policy may observe at ``now_s`` (everything up to that instant)."""

    now_s: float
    tick_s: float
    stages: tuple[StageView, ...]
    arrivals: int  # queries that arrived in the last tick
    in_system: int  # queries arrived and not answered
    mean_in_system: float  # time-average over the last tick
    envelope: Envelope | None = None  # observed traffic envelope (policies that ask for it)
    lambdas_rps: tuple[float, ...] = ()  # completed λ windows (Algorithm 4's input)
    recent_arrivals_s: FloatArray | None = None  # policies that ask: the look-back's arrivals


Targets = tuple[int | StageConfig, ...]
"""Per stage, a replica count for its configuration, or a configuration: another hardware
class or max batch makes the engine start ``replicas`` of it and hand over once they serve
(:meth:`sloline.lab.engine._Simulation._reconfigure`)."""
Step = Callable[[Observation, Any], tuple[Targets, Any]]
"""``step(observation, state) -> (targets per stage, new state)``: a pure policy."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A scaling policy to simulate: the initial configuration (one
    :class:`~sloline.planner.config.StageConfig` per stage, topology order), the pure
    ``step`` called every tick with its ``state`` (None: a static configuration), the
    envelope windows it observes (empty: the envelope is not computed), how far back
    it sees the arrival times themselves (0: not at all), how many routers the requests
    spread over (its plan's), and whether idle replicas take work lowest-numbered first
    (``index_packing``, AutoScale's load balancer) rather than longest idle first (the
    router's rule)."""

    name: str
    config: tuple[StageConfig, ...]
    step: Step | None = None
    state: Any = None
    envelope_windows_s: tuple[float, ...] = ()
    arrivals_lookback_s: float = 0.0
    routers: int = 1
    index_packing: bool = False


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """At ``time_s`` the policy set ``stage`` from ``from_replicas`` to ``to_replicas``
    (of a new ``config`` when it reconfigured the stage)."""

    time_s: float
    stage: str
    from_replicas: int
    to_replicas: int
    config: StageConfig | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """One simulation: per-query latency (arrival order), per-tick replica counts
    ``[tick, stage]`` (desired, ready and billed = starting + ready + leaving), billed
    replica-seconds per stage over ``[0, horizon_s]``, the cost over it (at
    :attr:`EngineSettings.prices_per_hour <sloline.lab.engine.EngineSettings>`) and the
    billed cost rate per tick, and the scaling events."""

    latencies_s: FloatArray
    ticks_s: FloatArray
    desired: IntArray
    ready: IntArray
    billed: IntArray
    replica_s: tuple[float, ...]
    horizon_s: float
    cost_usd: float
    cost_per_hour: FloatArray
    events: tuple[ScaleEvent, ...]
