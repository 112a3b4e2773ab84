"""The tuner's router count: the same load estimate as the stages, a decision beside
theirs, applied through a router actuator where the backend has one."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from sloline.common.envelope import Envelope, StreamingEnvelope, window_sizes
from sloline.planner.plan import Plan, StagePlan
from sloline.spec import parse_pipeline
from sloline.spec.models import StageSpec
from sloline.tuner.load_estimate import LoadEstimate
from sloline.tuner.policy import (
    ROUTERS,
    RouterState,
    StageState,
    TunerContext,
    TunerSettings,
    decide,
)
from sloline.tuner.sources import RouterTuning, StageTuning, StreamingSource, Tuner, router_tuning
from tests.unit.planner.specs import CASCADE

WINDOWS = window_sizes(0.25, 8.0)
SETTINGS = TunerSettings(window_base_s=0.25, window_max_s=8.0)


def _context(desired: int, *, routers: bool = True, last_change: float = 0.0) -> TunerContext:
    flat = Envelope(WINDOWS, (100.0,) * len(WINDOWS))
    return TunerContext(
        now_s=100.0,
        stages=(StageState("a", 4, 4, 1, 50, 1.0, 50.0, 0.5),),
        planning_envelope=flat,
        observed_envelope=flat,
        recent_lambdas_rps=(100.0,) * SETTINGS.lambda_count,
        last_change_s=last_change,
        planning_rate_rps=100.0,
        routers=RouterState(desired, desired, 1, 8, 400.0, 0.5) if routers else None,
    )


def _load(up: float, down: float | None) -> LoadEstimate:
    return LoadEstimate(up, "observed", down, "recent")


def test_routers_scale_up_with_the_stages_load() -> None:
    """μ_router 400 rps at rho 0.5: 700 rps needs ceil(700 / 200) = 4 routers."""
    outcome = decide(_context(1), SETTINGS, _load(700.0, 700.0))
    assert outcome.routers is not None
    assert (outcome.routers.stage, outcome.routers.to_replicas) == (ROUTERS, 4)
    assert "k=ceil(700/(400*0.5))=4" in outcome.routers.reason
    assert [d.stage for d in outcome.decisions] == ["a"]  # the stage scales beside them
    assert outcome.last_change_s == 100.0


def test_routers_scale_down_after_stabilisation_held_by_the_up_demand() -> None:
    assert decide(_context(4), SETTINGS, _load(150.0, 150.0)).routers.to_replicas == 1  # type: ignore[union-attr]
    held = decide(_context(4), SETTINGS, _load(500.0, 150.0)).routers
    assert held is not None and held.to_replicas == 3  # ceil(500 / 200)
    recent = decide(_context(4, last_change=90.0), SETTINGS, _load(150.0, 150.0))
    assert recent.routers is None  # within stabilization_s of the last change
    assert decide(_context(8), SETTINGS, _load(5000.0, 5000.0)).routers is None  # at max


def test_without_routers_to_tune_the_stage_decisions_are_unchanged() -> None:
    load = _load(700.0, 700.0)
    without = decide(_context(1, routers=False), SETTINGS, load)
    assert without.routers is None
    assert without.decisions == decide(_context(1), SETTINGS, load).decisions


def _plan(routers: int, router_mu: float, stage_rho: float = 0.5) -> Plan:
    stage = StagePlan("fast", "cpu-1", 4, 2, 0.1, 50.0, stage_rho, 1.0, 0.01, 1.5, 0.4)
    envelope = Envelope(WINDOWS, (100.0,) * len(WINDOWS))
    return Plan(
        "p", (stage,), 0.05, 99.0, 0.2, 0.01, 0.02, 0.02, 1.0, 50.0, envelope,
        routers=routers, router_cost_per_hour=0.05 * routers,
        router_throughput_rps=router_mu, router_utilisation=0.3,
    )  # fmt: skip


def _specs() -> list[StageSpec]:
    return parse_pipeline(copy.deepcopy(CASCADE)).pipeline.spec.stages


def test_router_tuning_comes_from_the_plan() -> None:
    assert router_tuning(_plan(1, 0.0), _specs(), max_routers=8) is None  # not modelled
    two = router_tuning(_plan(2, 100.0), _specs(), max_routers=8)
    assert two is not None and (two.min_routers, two.max_routers) == (1, 8)
    assert two.throughput_rps == 100.0
    assert two.max_provisioning_ratio == pytest.approx(50.0 / 200.0)
    # one router is their floor: its rho 0.125 says nothing, the stage's 0.5 stands in
    one = router_tuning(_plan(1, 400.0), _specs(), max_routers=8)
    assert one is not None and one.max_provisioning_ratio == 0.5
    assert router_tuning(_plan(3, 100.0), _specs(), max_routers=2).max_routers == 3  # type: ignore[union-attr]


class FakeActuator:
    def __init__(self) -> None:
        self.desired = {"a": 4}
        self.routers_set: list[int] = []
        self.count = 1

    async def scale(self, stage: str, replicas: int) -> None:
        self.desired[stage] = replicas

    async def replicas(self, stage: str) -> tuple[int, int]:
        return self.desired[stage], self.desired[stage]

    async def scale_routers(self, routers: int) -> None:
        self.routers_set.append(routers)
        self.count = routers

    async def routers(self) -> tuple[int, int]:
        return self.count, self.count


async def test_the_live_tuner_scales_routers_through_a_router_actuator() -> None:
    envelope = StreamingEnvelope(WINDOWS, start_s=0.0)
    envelope.observe_many(np.arange(0.0, 10.0, 1 / 600))  # 600 rps against 100 planned
    actuator = FakeActuator()
    planning = Envelope(WINDOWS, (100.0,) * len(WINDOWS))
    common = {
        "stages": [StageTuning("a", 1, 50, 1.0, 50.0, 0.5)],
        "planning_envelope": planning,
        "planning_rate_rps": 100.0,
        "source": StreamingSource(envelope),
        "actuator": actuator,
        "settings": SETTINGS,
        "clock": lambda: 10.0,
    }
    fixed = Tuner(**common)  # type: ignore[arg-type]
    assert (await fixed.step()).routers is None and actuator.routers_set == []
    tuner = Tuner(
        **common,  # type: ignore[arg-type]
        routers=RouterTuning(1, 8, 400.0, 0.5),
        router_actuator=actuator,
    )
    outcome = await tuner.step()
    assert outcome.routers is not None and actuator.routers_set == [outcome.routers.to_replicas]
    assert outcome.routers.to_replicas >= 3  # at least ceil(600 / 200)
    assert dataclasses.astuple(tuner.history[-1][1]) == dataclasses.astuple(outcome.routers)
