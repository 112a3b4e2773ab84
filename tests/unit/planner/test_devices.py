"""Device bounds (`PlanningProblem.hardware_devices`, the catalog's `devices`): a plan never
has more replicas of a class, over all its stages, than the class has devices; where the
bound makes the SLO unreachable the error says so."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from sloline.common.trace import gamma_arrivals
from sloline.lab.synthetic import random_problem
from sloline.planner.config import Config, StageConfig
from sloline.planner.evaluator import Evaluator
from sloline.planner.plan import Plan
from sloline.planner.planner import InfeasibleError, actions, initialize, plan
from sloline.planner.problem import PlanningProblem, StageOverride
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.topology import Topology
from sloline.spec import HardwareCatalog, parse_pipeline
from tests.unit.planner.specs import CASCADE

# 8x faster on the GPU, and batches cost it little: the GPU is the cheaper way to serve.
DNN = {
    "cpu": StageProfile.from_latencies("cpu", {1: 0.040, 2: 0.080, 4: 0.160}),
    "gpu": StageProfile.from_latencies("gpu", {1: 0.005, 2: 0.006, 4: 0.008}),
}


def gpu_chain(
    rate_rps: float, slo_s: float, stages: tuple[str, ...] = ("a", "b"), **changes: object
) -> PlanningProblem:
    """Stages in a chain, each the DNN above, at `rate_rps` for 20 s."""
    problem = PlanningProblem(
        topology=Topology.chain(list(stages)),
        profile=PipelineProfile(dict.fromkeys(stages, DNN), hop_s=0.0005),
        hardware_costs={"cpu": 0.05, "gpu": 0.5},
        slo_s=slo_s,
        arrivals_s=gamma_arrivals(rate_rps, 20.0, seed=1),
        max_replicas=32,
        name="gpu-chain",
    )
    return dataclasses.replace(problem, **changes)  # type: ignore[arg-type]


def gpu_replicas(config: Config) -> int:
    return sum(c.replicas for c in config if c.hardware == "gpu")


def test_two_stages_competing_for_one_device_get_it_one_at_a_time() -> None:
    """Unbounded, both stages take a GPU replica; with `devices: 1` one stage keeps the
    GPU and the other serves on CPU replicas, and the plan still meets the SLO."""
    unbounded = plan(gpu_chain(300.0, 0.1))
    assert gpu_replicas(unbounded.config) == 2
    bounded = plan(gpu_chain(300.0, 0.1, hardware_devices={"gpu": 1}))
    assert gpu_replicas(bounded.config) == 1
    assert sorted(s.hardware for s in bounded.stages) == ["cpu", "gpu"]
    assert bounded.tail_s <= bounded.slo_s
    assert bounded.cost_per_hour > unbounded.cost_per_hour
    assert bounded.devices == {"gpu": 1}
    assert "device bound: gpu has devices 1, all in use" in bounded.to_table()
    assert "device bound" not in unbounded.to_table()
    # two devices: both stages on the GPU again, and the table says the bound binds
    two = plan(gpu_chain(300.0, 0.1, hardware_devices={"gpu": 2}))
    assert two.config == unbounded.config
    assert "gpu has devices 2, all in use" in two.to_table()


def test_a_stage_that_needs_more_devices_than_there_are_is_infeasible_naming_them() -> None:
    """One stage at 700 rps takes two GPU replicas; with one device and no other class
    the SLO is out of reach, and the error names the class's devices."""
    gpu_only = {"dnn": {"gpu": DNN["gpu"]}}
    unbounded = gpu_chain(700.0, 0.05, ("dnn",), profile=PipelineProfile(gpu_only, hop_s=0.0005))
    assert gpu_replicas(plan(unbounded).config) == 2
    with pytest.raises(InfeasibleError) as info:
        plan(dataclasses.replace(unbounded, hardware_devices={"gpu": 1}))
    assert info.value.reason == "ReplicaLimit"
    assert "gpu: devices 1, for all stages together" in str(info.value)
    assert "raise the classes' devices" in str(info.value)


def test_no_search_path_accepts_a_configuration_beyond_the_devices() -> None:
    """The unbounded plan, given as a warm start, is not accepted: the evaluator counts a
    configuration over the devices infeasible, whatever its estimate, and no action on
    the bounded plan leads over them."""
    unbounded = plan(gpu_chain(300.0, 0.1))
    problem = gpu_chain(300.0, 0.1, hardware_devices={"gpu": 1})
    evaluator = Evaluator(problem)
    assert not problem.fits_devices(unbounded.config)
    assert not evaluator.evaluate(unbounded.config).feasible
    assert Evaluator(gpu_chain(300.0, 0.1)).evaluate(unbounded.config).feasible
    planned = plan(problem, evaluator, warm_start=unbounded.config)
    assert gpu_replicas(planned.config) == 1
    assert all(problem.fits_devices(a.config) for a in actions(problem, evaluator, planned.config))
    assert plan(problem, search="greedy").config == planned.config


def test_a_contested_device_goes_first_to_the_stage_that_loses_most_without_it() -> None:
    """Preprocessing a hair faster on the GPU comes first in the chain, but the DNN loses
    35 ms a batch on the CPU: Algorithm 1 starts the DNN on the one device."""
    pre = {
        "cpu": StageProfile.from_latencies("cpu", {1: 0.0020, 2: 0.0040}),
        "gpu": StageProfile.from_latencies("gpu", {1: 0.0019, 2: 0.0038}),
    }
    problem = gpu_chain(
        300.0,
        0.1,
        ("pre", "dnn"),
        profile=PipelineProfile({"pre": pre, "dnn": DNN}, hop_s=0.0005),
        hardware_devices={"gpu": 1},
    )
    start = initialize(problem, Evaluator(problem))
    assert [c.hardware for c in start] == ["cpu", "gpu"]
    assert [s.hardware for s in plan(problem).stages] == ["cpu", "gpu"]


def test_device_room_counts_the_other_stages_replicas() -> None:
    problem = gpu_chain(100.0, 0.1, ("a", "b", "c"), hardware_devices={"gpu": 3})
    config = (StageConfig("gpu", 1, 2), StageConfig("cpu", 1, 4), StageConfig("gpu", 1, 1))
    assert problem.device_room(config, 0, "gpu") == 2  # c holds one of the three
    assert problem.device_room(config, 1, "gpu") == 0  # a and c hold all three
    assert problem.device_room(config, 2, "gpu") == 1
    assert problem.device_room(config, 1, "cpu") is None  # unbounded
    assert problem.fits_devices(config)
    assert not problem.fits_devices((*config[:2], StageConfig("gpu", 1, 2)))


@pytest.mark.parametrize(
    ("seed", "devices", "feasible"), [(4, 1, True), (3, 1, False), (1, 2, False), (7, 2, False)]
)
def test_random_problems_plan_within_the_gpu_devices(
    seed: int, devices: int, feasible: bool
) -> None:
    """Random pipelines whose unbounded plan takes more GPU replicas than `devices`: the
    plan respects the bound and meets the SLO, or the error names the bound."""
    base = random_problem(seed, duration_s=6.0, max_replicas=16)
    assert gpu_replicas(plan(base).config) > devices
    problem = dataclasses.replace(base, hardware_devices={"gpu": devices})
    if not feasible:
        with pytest.raises(InfeasibleError, match=f"gpu: devices {devices}, for all stages"):
            plan(problem)
        return
    planned = plan(problem)
    assert gpu_replicas(planned.config) <= devices
    assert planned.tail_s <= planned.slo_s


def test_problem_validation_names_the_devices() -> None:
    with pytest.raises(ValueError, match=r"stage 'a' needs at least 2 replicas.*gpu: devices 1"):
        gpu_chain(
            100.0, 0.1,
            overrides={"a": StageOverride(hardware="gpu", replicas=2)},
            hardware_devices={"gpu": 1},
        )  # fmt: skip
    gpu_only = PipelineProfile({n: {"gpu": DNN["gpu"]} for n in "ab"}, hop_s=0.0005)
    with pytest.raises(ValueError, match=r"need more devices than .*gpu: devices 1"):
        gpu_chain(100.0, 0.1, profile=gpu_only, hardware_devices={"gpu": 1})
    with pytest.raises(ValueError, match="devices for hardware 'tpu'"):
        gpu_chain(100.0, 0.1, hardware_devices={"tpu": 1})
    with pytest.raises(ValueError, match="devices must be >= 1"):
        gpu_chain(100.0, 0.1, hardware_devices={"gpu": 0})
    # a stage pinned to the device takes it: the other stage is placed elsewhere
    pinned = gpu_chain(
        100.0, 0.1, overrides={"b": StageOverride(hardware="gpu")}, hardware_devices={"gpu": 1}
    )
    assert [s.hardware for s in plan(pinned).stages] == ["cpu", "gpu"]


def test_the_problem_of_a_spec_takes_the_catalogs_devices() -> None:
    data = copy.deepcopy(CASCADE)
    graph = parse_pipeline(data)
    stage = StageProfile.from_latencies("gpu", {1: 0.002, 2: 0.003})
    profile = PipelineProfile({n: {"gpu": stage} for n in ("fast", "slow", "combine")})
    catalog = HardwareCatalog.model_validate(
        {
            "classes": [
                {"name": "cpu-1", "costPerHour": 0.05},
                {"name": "gpu", "accelerator": "gpu", "costPerHour": 1.0, "devices": 3},
            ]
        }
    )
    problem = PlanningProblem.from_graph(graph, profile, catalog, gamma_arrivals(20.0, 10.0))
    assert dict(problem.hardware_devices) == {"gpu": 3}
    assert dict(problem.hardware_costs) == {"cpu-1": 0.05, "gpu": 1.0}  # cpu-1 unbounded
    two = HardwareCatalog.model_validate(
        {"classes": [{"name": "gpu", "costPerHour": 1.0, "devices": 2}]}
    )
    with pytest.raises(ValueError, match=r"need more devices than .*gpu: devices 2"):
        PlanningProblem.from_graph(graph, profile, two, gamma_arrivals(20.0, 10.0))


def test_a_plan_keeps_its_device_bounds_through_json() -> None:
    planned = plan(gpu_chain(300.0, 0.1, hardware_devices={"gpu": 1}))
    data = planned.to_dict()
    assert data["devices"] == {"gpu": 1}
    assert Plan.from_dict(json.loads(json.dumps(data))) == planned
    assert planned.devices_in_use() == {"gpu": 1}
    assert "devices" not in plan(gpu_chain(300.0, 0.1)).to_dict()
