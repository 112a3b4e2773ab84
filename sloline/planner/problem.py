"""What the planner is asked: pipeline, profiles, hardware prices, SLO, planning trace and
the user's per-stage overrides (InferLine §3 "Using InferLine", §4.3).

:class:`PlanningProblem` validates everything up front, so the search itself never meets a
missing profile or an impossible pin, and every error tells the user what to change.
:meth:`PlanningProblem.from_graph` builds one from a validated pipeline and a hardware
catalog, which is what ``sloline plan`` and the operator do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sloline.planner.config import Config
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.sim.draws import ServiceMode, summary_stat
from sloline.planner.topology import Topology

if TYPE_CHECKING:
    from sloline.spec.hardware import HardwareCatalog
    from sloline.spec.validate import PipelineGraph

__all__ = ["PlanningProblem", "StageOverride", "router_price"]

DEFAULT_MAX_REPLICAS = 256
DEFAULT_MAX_ROUTERS = 64
DEFAULT_RESAMPLES = 8  # a pipeline spec's plan: the planning trace and 8 resamples


@dataclass(frozen=True, slots=True)
class StageOverride:
    """User pins for one stage (``spec.stages[*]``: hardware, maxBatch, replicas and the
    replica bounds). ``None`` leaves the choice to the planner."""

    hardware: str | None = None
    max_batch: int | None = None
    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        for what, value in (
            ("max_batch", self.max_batch),
            ("replicas", self.replicas),
            ("min_replicas", self.min_replicas),
            ("max_replicas", self.max_replicas),
        ):
            if value is not None and value < 1:
                raise ValueError(f"override {what} must be >= 1, got {value}")


@dataclass(frozen=True, slots=True, eq=False)
class PlanningProblem:
    """Everything one planning run needs.

    ``hardware_costs`` maps each allowed hardware class to its price per replica-hour.
    ``hardware_devices``: how many devices each class with a bound has; each replica
    takes one whole device, so a configuration has no more replicas of the class, over
    all its stages together, than that (:meth:`fits_devices`). A class not in it is
    unbounded.
    ``slo_s`` / ``percentile``: the end-to-end latency objective (P99 by default).
    ``arrivals_s``: the sorted planning trace. ``service`` / ``seed``: estimator mode and
    seed. ``max_replicas``: per-stage replica bound where no override sets one.

    ``routers``: how many routers the estimator puts in front of the stages (the planner
    searches stage configurations at this count and picks the count itself: see
    :func:`sloline.planner.planner.plan`); ``router_cost_per_hour``: one router's price;
    ``max_routers``: the most routers the planner tries.

    ``resamples``: how many resamples of the planning trace
    (:func:`sloline.planner.workload.resample_arrivals`) a configuration must meet the SLO
    on as well, so that the plan holds on other samples of the same arrival process, not
    only on this one (0: the planning trace alone, InferLine's criterion).
    """

    topology: Topology
    profile: PipelineProfile
    hardware_costs: Mapping[str, float]
    slo_s: float
    arrivals_s: npt.NDArray[np.float64]
    percentile: float = 99.0
    overrides: Mapping[str, StageOverride] = field(default_factory=dict)
    service: ServiceMode = "p50"
    seed: int = 0
    max_replicas: int = DEFAULT_MAX_REPLICAS
    name: str = "pipeline"
    routers: int = 1
    router_cost_per_hour: float = 0.0
    max_routers: int = DEFAULT_MAX_ROUTERS
    resamples: int = 0
    hardware_devices: Mapping[str, int] = field(default_factory=dict)

    def __reduce__(self) -> tuple[type[PlanningProblem], tuple[object, ...]]:
        """Picklable (the re-planner plans in another process): plain dicts for the
        read-only views, which ``__post_init__`` makes again."""
        return (
            PlanningProblem,
            (
                self.topology,
                self.profile,
                dict(self.hardware_costs),
                self.slo_s,
                self.arrivals_s,
                self.percentile,
                dict(self.overrides),
                self.service,
                self.seed,
                self.max_replicas,
                self.name,
                self.routers,
                self.router_cost_per_hour,
                self.max_routers,
                self.resamples,
                dict(self.hardware_devices),
            ),
        )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.slo_s) and self.slo_s > 0.0):
            raise ValueError(f"the SLO must be a positive number of seconds, got {self.slo_s!r}")
        if not 0.0 < self.percentile <= 100.0:
            raise ValueError(f"the SLO percentile must be in (0, 100], got {self.percentile}")
        arrivals = self.arrivals_s
        if arrivals.ndim != 1 or arrivals.size < 2 or np.any(np.diff(arrivals) < 0.0):
            raise ValueError(
                "the planning trace must be a sorted 1-D array of at least two arrival times "
                "(see sloline.common.trace)"
            )
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be >= 1, got {self.max_replicas}")
        if self.resamples < 0:
            raise ValueError(f"resamples must be >= 0, got {self.resamples}")
        if not 1 <= self.routers <= self.max_routers:
            raise ValueError(
                f"routers must be in [1, max_routers={self.max_routers}], got {self.routers}"
            )
        cost = self.router_cost_per_hour
        if not (math.isfinite(cost) and cost >= 0.0):
            raise ValueError(f"a router's cost per hour must be >= 0, got {cost!r}")
        if not self.hardware_costs:
            raise ValueError("no hardware classes allowed; list at least one with its cost")
        for hw, cost in self.hardware_costs.items():
            if not (math.isfinite(cost) and cost >= 0.0):
                raise ValueError(f"hardware {hw!r}: cost per hour must be >= 0, got {cost!r}")
        object.__setattr__(self, "hardware_costs", MappingProxyType(dict(self.hardware_costs)))
        object.__setattr__(self, "hardware_devices", MappingProxyType(dict(self.hardware_devices)))
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        unknown = sorted(set(self.overrides) - set(self.topology.stages))
        if unknown:
            raise ValueError(f"overrides for unknown stages {unknown}")
        self._check_stages()

    def _check_stages(self) -> None:
        """The device bounds, each stage's options and pins, and some classes the stages
        may use that fit them all at their fewest replicas."""
        for hw, devices in self.hardware_devices.items():
            if hw not in self.hardware_costs:
                raise ValueError(f"devices for hardware {hw!r}, which is not allowed")
            if devices < 1:
                raise ValueError(f"hardware {hw!r}: devices must be >= 1, got {devices}")
        for name in self.topology.stages:
            self._check_stage(name)
        if self.place([self.usable_hardware(name) for name in self.topology.stages]) is None:
            bounded = ", ".join(f"{hw}: devices {n}" for hw, n in self.hardware_devices.items())
            raise ValueError(
                "the stages at their fewest replicas need more devices than the catalog "
                f"has ({bounded}; each replica takes one whole device, shared by all "
                "stages); raise the classes' devices, allow other hardware or lower the "
                "stages' replicas"
            )

    def _check_stage(self, name: str) -> None:
        usable = self.hardware_options(name)
        if not usable:
            raise ValueError(
                f"stage {name!r} has no profile on any allowed hardware "
                f"(allowed {sorted(self.hardware_costs)}, profiled "
                f"{sorted(self.profile.stages.get(name, {}))}); profile it or allow more"
            )
        pin = self.override(name)
        if pin.hardware is not None and pin.hardware not in usable:
            raise ValueError(
                f"stage {name!r} is pinned to {pin.hardware!r}, which is not allowed or not "
                f"profiled (usable: {list(usable)})"
            )
        lo, hi = self.replica_bounds(name)
        candidates = usable if pin.hardware is None else (pin.hardware,)
        if all(self.hardware_devices.get(hw, lo) < lo for hw in candidates):
            bounded = ", ".join(f"{hw}: devices {self.hardware_devices[hw]}" for hw in candidates)
            raise ValueError(
                f"stage {name!r} needs at least {lo} replicas, more than its hardware has "
                f"devices ({bounded}; each replica takes one whole device); raise the "
                "class's devices or lower the stage's replicas"
            )
        if lo > hi:
            raise ValueError(f"stage {name!r}: min replicas {lo} > max replicas {hi}")
        if pin.replicas is not None and not lo <= pin.replicas <= hi:
            raise ValueError(f"stage {name!r}: replicas {pin.replicas} outside [{lo}, {hi}]")
        if pin.max_batch is not None and not self.usable_hardware(name):
            caps = {hw: self.stage_profile(name, hw).cap for hw in usable}
            raise ValueError(
                f"stage {name!r}: maxBatch {pin.max_batch} exceeds the profiled batch cap "
                f"{caps}; profile larger batches or lower maxBatch"
            )

    @classmethod
    def from_graph(
        cls,
        graph: PipelineGraph,
        profile: PipelineProfile,
        catalog: HardwareCatalog,
        arrivals_s: npt.NDArray[np.float64],
        *,
        service: ServiceMode = "p50",
        seed: int = 0,
        max_replicas: int = DEFAULT_MAX_REPLICAS,
        resamples: int = DEFAULT_RESAMPLES,
    ) -> PlanningProblem:
        """The problem a pipeline spec poses: its SLO, allowed hardware (``spec.hardware``,
        empty = whole catalog) priced and bounded (``devices``) by the catalog, and the
        stages' pins. A router is priced as one core of the catalog's cheapest CPU class
        per core (:func:`router_price`). A plan must meet the SLO on ``resamples``
        resamples of the planning trace as well."""
        spec = graph.pipeline.spec
        allowed = spec.hardware or catalog.names()
        overrides = {
            s.name: StageOverride(
                s.hardware, s.max_batch, s.replicas, s.min_replicas or None, s.max_replicas
            )
            for s in spec.stages
        }
        return cls(
            topology=Topology.from_graph(graph),
            profile=profile,
            hardware_costs={hw: catalog.get(hw).cost_per_hour for hw in allowed},
            hardware_devices={
                hw: devices for hw in allowed if (devices := catalog.get(hw).devices) is not None
            },
            slo_s=spec.slo.latency_ms / 1000.0,
            percentile=spec.slo.percentile,
            arrivals_s=arrivals_s,
            overrides=overrides,
            service=service,
            seed=seed,
            max_replicas=max_replicas,
            name=graph.name,
            router_cost_per_hour=router_price(catalog),
            resamples=resamples,
        )

    def override(self, name: str) -> StageOverride:
        return self.overrides.get(name, StageOverride())

    def stage_profile(self, name: str, hardware: str) -> StageProfile:
        return self.profile.stage(name, hardware)

    def hardware_options(self, name: str) -> tuple[str, ...]:
        """Allowed classes ``name`` is profiled on (all of them the planner may use)."""
        profiled = self.profile.stages.get(name, {})
        return tuple(hw for hw in self.hardware_costs if hw in profiled)

    def usable_hardware(self, name: str) -> tuple[str, ...]:
        """Classes the planner may put ``name`` on: the pin, else every option whose batch
        cap admits a pinned max batch; either only where the class has devices for the
        stage's fewest replicas."""
        pin = self.override(name)
        lo = self.replica_bounds(name)[0]
        options = (pin.hardware,) if pin.hardware is not None else self.hardware_options(name)
        return tuple(
            hw
            for hw in options
            if self.hardware_devices.get(hw, lo) >= lo
            and (
                pin.max_batch is None
                or pin.hardware is not None
                or self.stage_profile(name, hw).cap >= pin.max_batch
            )
        )

    def device_room(self, config: Config, m: int, hardware: str) -> int | None:
        """The most replicas stage ``m`` may have on ``hardware`` beside the other stages of
        ``config``: the class's devices less the replicas the others hold on it (each
        replica takes one whole device); None for a class without a device bound."""
        devices = self.hardware_devices.get(hardware)
        if devices is None:
            return None
        held = sum(c.replicas for j, c in enumerate(config) if j != m and c.hardware == hardware)
        return devices - held

    def fits_devices(self, config: Config) -> bool:
        """Whether ``config`` has, over all its stages, no more replicas of each class than
        the class has devices (:meth:`device_room`): the one check every configuration the
        planner builds or accepts passes."""
        return all(
            (room := self.device_room(config, m, c.hardware)) is None or c.replicas <= room
            for m, c in enumerate(config)
        )

    def place(
        self, options: Sequence[Sequence[str]], order: Sequence[int] | None = None
    ) -> tuple[str, ...] | None:
        """A class per stage from its ``options`` (in the order given: the first that
        fits wins) such that every stage at its fewest replicas fits the devices, or None
        where no choice does. Stages choose in ``order`` (default: topology order), so
        the earlier ones get the classes they prefer; a later stage that finds no room
        makes the earlier ones try their next option."""
        stages = self.topology.stages
        lows = [self.replica_bounds(name)[0] for name in stages]
        sequence = list(range(len(stages))) if order is None else list(order)
        left = dict(self.hardware_devices)
        chosen = [""] * len(stages)
        dead: set[tuple[int, tuple[int, ...]]] = set()  # (step, devices left): no way on

        def choose(step: int) -> bool:
            if step == len(sequence):
                return True
            state = (step, tuple(left.values()))
            if state in dead:
                return False
            m = sequence[step]
            for hw in options[m]:
                room = left.get(hw)
                if room is not None:
                    if room < lows[m]:
                        continue
                    left[hw] = room - lows[m]
                chosen[m] = hw
                if choose(step + 1):
                    return True
                if room is not None:
                    left[hw] = room
            dead.add(state)
            return False

        return tuple(chosen) if choose(0) else None

    def replica_bounds(self, name: str) -> tuple[int, int]:
        """(min, max) replicas of a stage: the pin if any, else the overrides' bounds."""
        pin = self.override(name)
        if pin.replicas is not None:
            return pin.replicas, pin.replicas
        lo = max(1, pin.min_replicas or 1)
        hi = pin.max_replicas if pin.max_replicas is not None else self.max_replicas
        return lo, hi

    def batch_options(self, name: str, hardware: str) -> tuple[int, ...]:
        """Max batch sizes the planner may use: the pin, else 1, 2, 4, ... and the cap
        (the values IncreaseBatch reaches by doubling, §4.3), leaving out sizes whose batch
        alone takes longer than the SLO: such a batch can never be served in time."""
        pin = self.override(name).max_batch
        if pin is not None:
            return (pin,)
        profile = self.stage_profile(name, hardware)
        stat = summary_stat(self.service)
        sizes = [1]
        while sizes[-1] < profile.cap:
            sizes.append(min(2 * sizes[-1], profile.cap))
        return tuple(b for b in sizes if b == 1 or profile.latency_s(b, stat) <= self.slo_s)

    def single_latency_s(self, name: str, hardware: str) -> float:
        """Service time of a batch of one under the estimator's statistic."""
        return self.stage_profile(name, hardware).latency_s(1, summary_stat(self.service))

    def cost_per_hour(self, config: Config) -> float:
        """Σ replicas x hardware price, the objective of §4.3, plus the routers' price
        (rounded to 1e-9 $/h so that equal costs compare equal whatever the order of
        summation)."""
        stages = sum(c.replicas * self.hardware_costs[c.hardware] for c in config)
        return round(stages + self.routers * self.router_cost_per_hour, 9)


def router_price(catalog: HardwareCatalog) -> float:
    """One router's price per hour: a router is one single-threaded event loop, so one
    core of the catalog's CPU class that is cheapest per core (its price over its
    embedded threads); 0 where the catalog has no CPU class."""
    per_core = [
        hw.cost_per_hour / hw.embedded.threads for hw in catalog.classes if hw.accelerator == "cpu"
    ]
    return min(per_core, default=0.0)
