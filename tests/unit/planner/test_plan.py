"""Plans as data: lossless dict/JSON/YAML round trips, the CLI table, and problems built
from a pipeline spec and a hardware catalog."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from sloline.common.trace import gamma_arrivals
from sloline.lab.synthetic import random_problem
from sloline.planner.plan import Plan
from sloline.planner.planner import plan
from sloline.planner.problem import DEFAULT_RESAMPLES, PlanningProblem, StageOverride
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.spec import DEFAULT_CATALOG, parse_pipeline
from tests.unit.planner.specs import CASCADE


@pytest.fixture(scope="module")
def planned() -> Plan:
    return plan(random_problem(6, duration_s=10.0))


def test_plan_round_trips_through_dict_json_and_yaml(planned: Plan) -> None:
    data = planned.to_dict()
    assert Plan.from_dict(data) == planned
    assert Plan.from_dict(json.loads(json.dumps(data))) == planned
    assert Plan.from_dict(yaml.safe_load(yaml.safe_dump(data))) == planned
    assert data["stages"][0].keys() >= {"hardware", "maxBatch", "replicas", "throughputRps", "rho"}


def test_plan_table_shows_stages_and_totals(planned: Plan) -> None:
    table = planned.to_table()
    lines = table.splitlines()
    assert lines[0].startswith(f"plan for {planned.pipeline}: P99 SLO {planned.slo_s * 1e3:.1f} ms")
    assert lines[1].split() == ["stage", "hardware", "batch", "replicas", "$/hour", "mu", "rps",
                                "rho", "s_m", "util"]  # fmt: skip
    for stage, line in zip(planned.stages, lines[2:], strict=False):
        assert line.split()[:4] == [
            stage.name,
            stage.hardware,
            str(stage.max_batch),
            str(stage.replicas),
        ]
    routers = lines[2 + len(planned.stages)].split()
    assert routers == ["routers", str(planned.routers), f"{planned.router_cost_per_hour:.3f}"]
    total = lines[3 + len(planned.stages)].split()
    assert total == [
        "total",
        str(sum(s.replicas for s in planned.stages) + planned.routers),
        f"{planned.cost_per_hour:.3f}",
    ]


def test_problem_from_a_pipeline_spec_and_catalog() -> None:
    data = copy.deepcopy(CASCADE)
    data["spec"]["slo"] = {"latencyMs": 120, "percentile": 95}
    data["spec"]["hardware"] = ["cpu-1"]
    data["spec"]["stages"][2]["replicas"] = 2  # slow
    data["spec"]["stages"][1]["minReplicas"] = 0  # fast: 0 means no lower bound beyond 1
    graph = parse_pipeline(data)
    stage = StageProfile.from_latencies("cpu-1", {1: 0.01, 2: 0.015})
    profile = PipelineProfile(
        {n: {"cpu-1": stage} for n in ("fast", "slow", "combine")}, {"slow": 0.3}
    )
    problem = PlanningProblem.from_graph(
        graph, profile, DEFAULT_CATALOG, gamma_arrivals(20.0, 10.0)
    )
    assert problem.slo_s == pytest.approx(0.12)
    assert problem.percentile == 95
    assert dict(problem.hardware_costs) == {"cpu-1": 0.05}
    assert problem.override("slow") == StageOverride(replicas=2)
    assert problem.replica_bounds("fast") == (1, problem.max_replicas)
    assert problem.name == "cascade"
    assert problem.resamples == DEFAULT_RESAMPLES  # a spec's plan holds on resamples too
    planned = plan(problem)
    assert planned.stage("slow").replicas == 2
    assert planned.stage("slow").scale_factor == 0.3
    assert planned.tail_s <= planned.resampled_tail_s <= 0.12
    assert planned.resamples == DEFAULT_RESAMPLES


def test_problem_validation_names_the_fix() -> None:
    base = random_problem(1, duration_s=5.0)
    with pytest.raises(ValueError, match="no profile on any allowed hardware"):
        PlanningProblem(base.topology, base.profile, {"tpu": 1.0}, 0.1, base.arrivals_s)
    with pytest.raises(ValueError, match="overrides for unknown stages"):
        PlanningProblem(
            base.topology, base.profile, base.hardware_costs, 0.1, base.arrivals_s,
            overrides={"nope": StageOverride()},
        )  # fmt: skip
    with pytest.raises(ValueError, match="min replicas 5 > max replicas 2"):
        PlanningProblem(
            base.topology, base.profile, base.hardware_costs, 0.1, base.arrivals_s,
            overrides={"s0": StageOverride(min_replicas=5, max_replicas=2)},
        )  # fmt: skip
    with pytest.raises(ValueError, match="positive number of seconds"):
        PlanningProblem(base.topology, base.profile, base.hardware_costs, -1.0, np.zeros(1))
