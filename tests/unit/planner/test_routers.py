"""Several routers in front of the stages: each keeps its own queue per stage and its own
CPU; a replica that frees takes a batch from the router whose queue head is oldest. The
event core's traces by hand, the batch sizes, the router saturation that a second router
removes, and the planner's choice and price of the router count."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.common.trace import gamma_arrivals
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload, estimate
from sloline.planner.overhead import ServingOverhead
from sloline.planner.plan import Plan
from sloline.planner.planner import InfeasibleError, plan, router_counts, router_floor
from sloline.planner.problem import PlanningProblem, router_price
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.routed import routed_inputs, router_of
from sloline.planner.sim.pipeline import simulate_pipeline
from sloline.planner.topology import Topology
from sloline.spec import parse_pipeline
from sloline.spec.hardware import DEFAULT_CATALOG, HardwareCatalog, HardwareClass
from tests.unit.planner.specs import CASCADE

FREE = ServingOverhead(0.0, 0.0, 0.0, 0.0, (0.0,), (0.0,))


def _one_stage(
    service_s: dict[int, float], overhead: ServingOverhead = FREE
) -> tuple[Topology, PipelineProfile]:
    stage = StageProfile.from_latencies("hw", service_s)
    return Topology.chain(["a"]), PipelineProfile({"a": {"hw": stage}}, overhead=overhead)


def test_a_batch_holds_one_routers_items_and_the_oldest_head_goes_first() -> None:
    """Queries at 0, .1, .2 and .3, q0 and q2 to router 0, q1 and q3 to router 1, one
    replica serving any batch in 1 s, batches of up to 4. One router: q0 alone [0, 1],
    then q1-q3 as one batch [1, 2]. Two routers: q0 alone; at 1 router 1's head q1 came
    before router 0's q2, so q1 and q3 go [1, 2], then q2 alone [2, 3]."""
    topology, profile = _one_stage({1: 1.0, 4: 1.0})
    workload = Workload.build(topology, profile, [0.0, 0.1, 0.2, 0.3])
    config = [StageConfig("hw", 4, 1)]
    one = estimate(topology, profile, config, workload)
    np.testing.assert_allclose(one.latencies_s, [1.0, 1.9, 1.8, 1.7], atol=1e-12)
    inputs = routed_inputs(topology, profile, config, workload, "p50", 0, routers=2)
    run = simulate_pipeline(inputs._replace(router_of=np.array([0, 1, 0, 1])))
    np.testing.assert_allclose(run.answered_s, [1.0, 2.0, 3.0, 2.0], atol=1e-12)
    assert list(run.batches) == [3]


def test_each_router_pays_the_cpu_of_its_own_requests_and_batches() -> None:
    """Router CPU 0.2 per request (half in, half out), two queries at 0 and two replicas
    serving 1 s. One router takes both in [0, .2] and dispatches both at .2 (q0's
    dispatch queued behind q1's arrival); their answers go out [1.2, 1.3] and [1.3,
    1.4]. Two routers work side by side: in [0, .1], served [.1, 1.1], out [1.1, 1.2]."""
    topology, profile = _one_stage({1: 1.0}, dataclasses.replace(FREE, router_request_cpu_s=0.2))
    workload = Workload.build(topology, profile, [0.0, 0.0])
    config = [StageConfig("hw", 1, 2)]
    np.testing.assert_allclose(
        estimate(topology, profile, config, workload).latencies_s, [1.3, 1.4], atol=1e-12
    )
    inputs = routed_inputs(topology, profile, config, workload, "p50", 0, routers=2)
    run = simulate_pipeline(inputs._replace(router_of=np.array([0, 1])))
    np.testing.assert_allclose(run.answered_s, [1.2, 1.2], atol=1e-12)
    assert run.router_cpu_s == pytest.approx(0.4)
    assert run.router_busy_s == pytest.approx(0.4)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 1000),
    routers=st.integers(2, 4),
    replicas=st.integers(1, 3),
    max_batch=st.sampled_from([1, 2, 8]),
)
def test_routers_that_get_no_requests_change_nothing(
    seed: int, routers: int, replicas: int, max_batch: int
) -> None:
    """Every request to router 0 of several is one router: the same answers bit for bit."""
    overhead = ServingOverhead(2e-4, 1e-4, 5e-5, 1e-4, (3e-4, 6e-4), (2e-4,), cores=2)
    topology, profile = _one_stage({1: 0.004, 8: 0.01}, overhead)
    arrivals = gamma_arrivals(300.0, 2.0, cv2=4.0, seed=seed)
    workload = Workload.build(topology, profile, arrivals)
    config = [StageConfig("hw", max_batch, replicas)]
    one = simulate_pipeline(routed_inputs(topology, profile, config, workload, "p50", seed))
    many = routed_inputs(topology, profile, config, workload, "p50", seed, routers=routers)
    idle = simulate_pipeline(many._replace(router_of=np.zeros(arrivals.size, dtype=np.int64)))
    np.testing.assert_array_equal(idle.answered_s, one.answered_s)
    assert list(idle.batches) == list(one.batches)


def test_requests_spread_uniformly_over_the_routers_and_reproducibly() -> None:
    spread = router_of(4, 40_000, seed=3)
    np.testing.assert_array_equal(spread, router_of(4, 40_000, seed=3))
    assert np.bincount(spread, minlength=4) / spread.size == pytest.approx([0.25] * 4, abs=0.01)
    assert not router_of(1, 10, seed=3).any()


def test_batches_shrink_with_more_routers() -> None:
    """One replica whose batch of k takes 4 + 0.5 (k - 1) ms at 300 rps: a replica that
    frees takes only the oldest router's items, so batches shrink and the items of the
    other routers wait for the next batch: the tail grows (docs/planner.md)."""
    latencies = {1: 0.004, 2: 0.0045, 4: 0.0055, 8: 0.0075, 16: 0.0115, 32: 0.0195}
    topology, profile = _one_stage(latencies)
    workload = Workload.build(topology, profile, gamma_arrivals(300.0, 30.0, cv2=1.0, seed=1))
    config = [StageConfig("hw", 32, 1)]
    runs = [estimate(topology, profile, config, workload, routers=r) for r in (1, 2, 4)]
    batches = [run.stages[0].mean_batch for run in runs]
    assert batches[0] > batches[1] > batches[2] > 1.0
    tails = [run.percentile_s(99.0) for run in runs]
    assert tails[0] < tails[1] < tails[2]


def test_without_a_serving_overhead_several_routers_cost_nothing_but_the_hop() -> None:
    stage = StageProfile.from_latencies("hw", {1: 0.004, 8: 0.01})
    bare = PipelineProfile({"a": {"hw": stage}}, hop_s=0.0005)
    free = dataclasses.replace(
        bare, overhead=ServingOverhead(0.0, 0.0, 0.0, 0.0, (0.0005,), (0.0,))
    )
    topology = Topology.chain(["a"])
    workload = Workload.build(topology, bare, gamma_arrivals(400.0, 5.0, cv2=4.0, seed=4))
    config = [StageConfig("hw", 8, 2)]
    two = estimate(topology, bare, config, workload, routers=2)
    np.testing.assert_array_equal(
        two.latencies_s, estimate(topology, free, config, workload, routers=2).latencies_s
    )
    assert two.routers == 2 and two.router_utilisation == 0.0


def _saturating(rate_rps: float = 1000.0) -> tuple[Topology, PipelineProfile, Workload]:
    """Router CPU 1.2 ms per request: one router can take ~830 rps."""
    overhead = dataclasses.replace(FREE, router_request_cpu_s=0.0012)
    topology, profile = _one_stage({1: 0.002, 8: 0.004}, overhead)
    arrivals = gamma_arrivals(rate_rps, 20.0, cv2=1.0, seed=2)
    return topology, profile, Workload.build(topology, profile, arrivals)


def test_a_second_router_removes_the_saturation_of_one() -> None:
    topology, profile, workload = _saturating()
    config = [StageConfig("hw", 8, 4)]
    one = estimate(topology, profile, config, workload)
    two = estimate(topology, profile, config, workload, routers=2)
    assert one.router_utilisation > 0.99 and one.percentile_s(99.0) > 1.0  # seconds behind
    assert two.routers == 2
    assert two.router_utilisation == pytest.approx(0.6, abs=0.03)
    assert two.percentile_s(99.0) < 0.02
    assert two.router_cpu_s == pytest.approx(one.router_cpu_s)  # the same work, split


def _problem(rate_rps: float, **changes: object) -> PlanningProblem:
    topology, profile, _ = _saturating(rate_rps)
    fields: dict[str, object] = {
        "topology": topology,
        "profile": profile,
        "hardware_costs": {"hw": 1.0},
        "slo_s": 0.05,
        "arrivals_s": gamma_arrivals(rate_rps, 20.0, cv2=1.0, seed=2),
        "max_replicas": 8,
        "router_cost_per_hour": 0.05,
    }
    return PlanningProblem(**(fields | changes))  # type: ignore[arg-type]


def test_the_planner_takes_the_fewest_routers_that_meet_the_slo_and_prices_them() -> None:
    low, high = plan(_problem(300.0)), plan(_problem(1000.0))
    assert low.routers == 1 and high.routers == 2
    for planned in (low, high):
        stages = sum(s.cost_per_hour for s in planned.stages)
        assert planned.router_cost_per_hour == pytest.approx(0.05 * planned.routers)
        assert planned.cost_per_hour == pytest.approx(stages + planned.router_cost_per_hour)
        assert planned.router_throughput_rps == pytest.approx(1 / 0.0012)
        assert planned.router_rho == pytest.approx(planned.rate_rps * 0.0012 / planned.routers)
        assert 0.0 < planned.router_utilisation < 1.0
        assert Plan.from_dict(planned.to_dict()) == planned
    assert high.to_dict()["routers"] == 2
    assert "routers" in high.to_table().splitlines()[3]


def test_the_estimator_decides_past_the_cpu_floor() -> None:
    """At 800 rps one router's CPU is 96% busy: the floor allows one, but its queue
    misses a 10 ms SLO, so the planner goes on to two."""
    problem = _problem(800.0, slo_s=0.01)
    assert router_floor(problem) == 1
    assert plan(problem).routers == 2


def test_another_router_is_taken_while_it_makes_the_plan_cheaper() -> None:
    """At 700 rps and an 8 ms SLO two routers are the fewest that meet it, with three
    $1 replicas; a third router ($0.05) leaves the stage's queue enough of the budget
    for two."""
    problem = _problem(700.0, slo_s=0.008)
    two = plan(dataclasses.replace(problem, routers=2, max_routers=2))
    chosen = plan(problem)
    assert (two.routers, two.stages[0].replicas) == (2, 3)
    assert (chosen.routers, chosen.stages[0].replicas) == (3, 2)
    assert chosen.cost_per_hour == pytest.approx(2.15)
    assert chosen.cost_per_hour < two.cost_per_hour


def test_the_router_fields_of_a_problem_survive_pickling() -> None:
    """The re-planner plans in another process."""
    problem = dataclasses.replace(_problem(300.0), routers=2, max_routers=5)
    again = pickle.loads(pickle.dumps(problem))  # noqa: S301 - our own bytes
    assert (again.routers, again.router_cost_per_hour, again.max_routers) == (2, 0.05, 5)
    with pytest.raises(ValueError, match="routers must be in"):
        dataclasses.replace(problem, routers=6)


def test_without_a_router_model_the_router_count_is_kept() -> None:
    _, profile, _ = _saturating()
    problem = _problem(1000.0, profile=dataclasses.replace(profile, overhead=None), routers=3)
    assert list(router_counts(problem)) == [3]
    assert plan(problem).routers == 3


def test_routers_sharing_the_workers_cores_stop_at_the_cores() -> None:
    _, profile, _ = _saturating()
    assert profile.overhead is not None
    shared = dataclasses.replace(profile.overhead, cores=2)
    problem = _problem(2000.0, profile=dataclasses.replace(profile, overhead=shared))
    assert list(router_counts(problem)) == [3]  # the floor beyond the cores: tried alone
    with pytest.raises(InfeasibleError, match=r"routers|cores"):
        plan(problem)


def test_a_router_costs_one_core_of_the_cheapest_cpu_class() -> None:
    assert router_price(DEFAULT_CATALOG) == pytest.approx(0.05)
    gpu_only = HardwareCatalog(
        classes=[HardwareClass(name="gpu", accelerator="gpu", cost_per_hour=2.0)]
    )
    assert router_price(gpu_only) == 0.0
    graph = parse_pipeline(copy.deepcopy(CASCADE))
    stage = StageProfile.from_latencies("cpu-1", {1: 0.001})
    profile = PipelineProfile({n: {"cpu-1": stage} for n in ("fast", "slow", "combine")})
    problem = PlanningProblem.from_graph(
        graph, profile, DEFAULT_CATALOG, gamma_arrivals(20.0, 10.0)
    )
    assert problem.router_cost_per_hour == pytest.approx(0.05)
    planned = plan(problem)
    assert planned.routers == 1 and planned.router_cost_per_hour == pytest.approx(0.05)
    stages = sum(s.cost_per_hour for s in planned.stages)
    assert planned.cost_per_hour == pytest.approx(stages + 0.05)
