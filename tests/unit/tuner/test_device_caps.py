"""The tuner never scales a stage beyond the devices of its class: a stage alone on a
bounded class may take all of them; stages sharing one split what the plan leaves free."""

from __future__ import annotations

import copy

from sloline.common.envelope import Envelope
from sloline.planner.plan import Plan, StagePlan
from sloline.spec import parse_pipeline
from sloline.tuner.sources import device_caps, stage_tunings
from tests.unit.planner.specs import CASCADE


def stage(name: str, hardware: str, replicas: int) -> StagePlan:
    return StagePlan(
        name=name,
        hardware=hardware,
        max_batch=4,
        replicas=replicas,
        cost_per_hour=replicas * 1.0,
        throughput_rps=100.0,
        rho=0.5,
        scale_factor=1.0,
        service_s=0.01,
        mean_batch=2.0,
        utilisation=0.5,
    )


def cascade_plan(hardware: dict[str, tuple[str, int]], devices: dict[str, int]) -> Plan:
    return Plan(
        pipeline="cascade",
        stages=tuple(stage(name, hw, n) for name, (hw, n) in hardware.items()),
        slo_s=0.05,
        percentile=99.0,
        cost_per_hour=1.0,
        p50_s=0.01,
        p99_s=0.02,
        tail_s=0.02,
        attainment=1.0,
        rate_rps=50.0,
        envelope=Envelope((0.02, 0.04), (60.0, 55.0)),
        devices=devices,
    )


def test_a_stage_alone_on_a_bounded_class_scales_up_to_its_devices() -> None:
    plan = cascade_plan({"fast": ("cpu", 1), "slow": ("gpu", 1), "combine": ("cpu", 2)}, {"gpu": 3})
    spec = parse_pipeline(CASCADE).pipeline.spec.stages
    tunings = {t.name: t for t in stage_tunings(plan, spec, max_replicas=16)}
    assert tunings["slow"].max_replicas == 3
    assert tunings["fast"].max_replicas == tunings["combine"].max_replicas == 16
    unbounded = cascade_plan({"fast": ("cpu", 1), "slow": ("gpu", 1), "combine": ("cpu", 2)}, {})
    assert {t.max_replicas for t in stage_tunings(unbounded, spec, max_replicas=16)} == {16}


def test_stages_sharing_a_class_split_its_free_devices() -> None:
    """Five devices, three held by the plan: two free, one more for each stage, so that
    however each stage is scaled they hold at most five together."""
    plan = cascade_plan({"fast": ("gpu", 1), "slow": ("cpu", 4), "combine": ("gpu", 2)}, {"gpu": 5})
    assert device_caps(plan) == {"fast": 2, "combine": 3}
    odd = cascade_plan({"fast": ("gpu", 1), "slow": ("cpu", 4), "combine": ("gpu", 1)}, {"gpu": 5})
    assert device_caps(odd) == {"fast": 3, "combine": 2}  # the earlier stage: the remainder
    full = cascade_plan({"fast": ("gpu", 1), "slow": ("cpu", 4), "combine": ("gpu", 1)}, {"gpu": 2})
    assert device_caps(full) == {"fast": 1, "combine": 1}


def test_the_specs_own_max_replicas_still_wins_where_lower() -> None:
    data = copy.deepcopy(CASCADE)
    data["spec"]["stages"][2]["maxReplicas"] = 2  # slow
    spec = parse_pipeline(data).pipeline.spec.stages
    plan = cascade_plan({"fast": ("cpu", 1), "slow": ("gpu", 1), "combine": ("cpu", 1)}, {"gpu": 8})
    tunings = {t.name: t for t in stage_tunings(plan, spec, max_replicas=16)}
    assert tunings["slow"].max_replicas == 2
