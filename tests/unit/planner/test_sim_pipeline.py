"""The whole-pipeline simulation of a measured serving overhead: the router as one FIFO
server, hops and request paths, idle penalties, a co-located client and shared cores —
hand-checked traces and closed forms (M/M/1 and M/M/c under processor sharing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sloline.common.trace import gamma_arrivals
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload, estimate
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import IdlePenalty, PipelineProfile, StageProfile
from sloline.planner.topology import Topology


def _overhead(
    request_cpu: float = 0.0,
    batch_cpu: float = 0.0,
    item_cpu: float = 0.0,
    worker_cpu: float = 0.0,
    hop: float = 0.0,
    request: float = 0.0,
    cores: int | None = None,
    client_cpu: float = 0.0,
    worker_nice: int = 0,
    router_idle: IdlePenalty | None = None,
) -> ServingOverhead:
    return ServingOverhead(
        request_cpu,
        batch_cpu,
        item_cpu,
        worker_cpu,
        (hop,),
        (request,),
        client_cpu,
        cores,
        worker_nice,
        router_idle,
    )


def _one_stage(
    service_s: float, overhead: ServingOverhead, *, idle: IdlePenalty | None = None
) -> tuple[Topology, PipelineProfile]:
    stage = StageProfile.from_latencies("hw", {1: service_s, 2: service_s})
    stage = StageProfile("hw", stage.points, idle=idle)
    return Topology.chain(["a"]), PipelineProfile({"a": {"hw": stage}}, overhead=overhead)


def test_the_router_serves_its_jobs_one_at_a_time_in_arrival_order() -> None:
    """Hand-checked: router CPU 0.2 per request and 0.2 per batch (half on the way in,
    half on the way out), one replica serving 1.0 s, requests at 0 and 0.05.

    router: [0, .1] q0 in; [.1, .2] q1 in (queued behind it); [.2, .3] q0's dispatch;
    worker [.3, 1.3]; [1.3, 1.4] q0's result: the replica takes q1, whose dispatch
    [1.4, 1.5] queues before q0's answer [1.5, 1.6]; worker [1.5, 2.5]; q1's result
    [2.5, 2.6] and answer [2.6, 2.7]."""
    topology, profile = _one_stage(1.0, _overhead(request_cpu=0.2, batch_cpu=0.2))
    workload = Workload.build(topology, profile, [0.0, 0.05])
    result = estimate(topology, profile, [StageConfig("hw", 1, 1)], workload)
    np.testing.assert_allclose(result.latencies_s, [1.6, 2.65], atol=1e-12)
    assert result.router_busy_s == pytest.approx(0.8)
    assert result.router_cpu_s == pytest.approx(0.8)


def test_a_job_that_wakes_the_idle_router_pays_its_idle_penalty() -> None:
    """The first test's trace with a router idle penalty of 0.1 s after 1 s idle (linear
    from 0, held beyond): only jobs that find the router idle pay it, and not the jobs a
    finished job queues (they run in its wake).

    router: [0, .2] q0 in (idle since ever: +0.1); [.2, .3] q1 in (queued: no penalty);
    [.3, .4] q0's dispatch (queued); worker [.4, 1.4]; q0's result wakes the router idle
    since .4 (+0.1): [1.4, 1.6]; q1's dispatch [1.6, 1.7] and q0's answer [1.7, 1.8] run
    in its wake; worker [1.7, 2.7]; q1's result, idle since 1.8 (0.9 s: +0.09): [2.7,
    2.89]; its answer [2.89, 2.99]."""
    penalty = IdlePenalty((1.0,), (0.1,))
    overhead = _overhead(request_cpu=0.2, batch_cpu=0.2, router_idle=penalty)
    topology, profile = _one_stage(1.0, overhead)
    workload = Workload.build(topology, profile, [0.0, 0.05])
    result = estimate(topology, profile, [StageConfig("hw", 1, 1)], workload)
    np.testing.assert_allclose(result.latencies_s, [1.8, 2.94], atol=1e-12)
    assert result.router_cpu_s == pytest.approx(0.8 + 0.1 + 0.1 + 0.09)
    assert result.router_busy_s == pytest.approx(result.router_cpu_s)


def test_hops_and_request_paths_add_up_and_per_item_cpu_scales_with_the_batch() -> None:
    """Hop 0.1 split around the worker, request path 0.3 split around the router, router
    CPU per item 0.05 (x batch size). Three queries at 0: q0 alone (dispatch .025, hop
    .05, service 1, hop .05, result .025), q1 and q2 as one batch behind it."""
    overhead = _overhead(item_cpu=0.05, hop=0.1, request=0.3)
    topology, profile = _one_stage(1.0, overhead)
    workload = Workload.build(topology, profile, [0.0, 0.0, 0.0])
    result = estimate(topology, profile, [StageConfig("hw", 2, 1)], workload)
    # q0: reaches the router at .15, dispatched at once, result taken back at .15 + 1.15
    # = 1.3; the freed replica's dispatch of q1, q2 (2 x .025) goes before q0's answer
    # (as the router sends the batch before the answer's coroutine resumes): answered at
    # 1.35 + .15. q1, q2: 1.35 + hop .1 + service 1 + result .05 = 2.5, answered 2.65.
    np.testing.assert_allclose(result.latencies_s, [1.5, 2.65, 2.65], atol=1e-12)
    assert [s.batches for s in result.stages] == [2]


def test_a_batch_after_idle_time_pays_the_idle_penalty() -> None:
    """The penalty follows the worker's idle time: 0.5 s after a gap of at least 1 s,
    linear below; queries at 0 (never used: full penalty), 1.6 (idle 1.6 - 1.5 = 0.1
    since the first batch's service ended: 0.05) and 10 (full again)."""
    idle = IdlePenalty((1.0,), (0.5,))
    topology, profile = _one_stage(1.0, _overhead(), idle=idle)
    workload = Workload.build(topology, profile, [0.0, 1.6, 10.0])
    result = estimate(topology, profile, [StageConfig("hw", 1, 1)], workload)
    np.testing.assert_allclose(result.latencies_s, [1.5, 1.05, 1.5], atol=1e-12)


def test_a_co_located_client_is_a_fifo_server_too() -> None:
    """A client spending 0.4 s of CPU per request (0.2 sending, 0.2 receiving), two
    requests at 0 with a free router and a 1 s stage with two replicas: sends end at .2
    and .4, services at 1.2 and 1.4, receives .. 1.4 and 1.6."""
    topology, profile = _one_stage(1.0, _overhead())
    workload = Workload.build(topology, profile, [0.0, 0.0], client_cpu_s=0.4)
    result = estimate(topology, profile, [StageConfig("hw", 1, 2)], workload)
    np.testing.assert_allclose(result.latencies_s, [1.4, 1.6], atol=1e-12)


def test_shared_cores_slow_everyone_down_equally() -> None:
    """Three 1 s batches start together on three replicas sharing two cores: each runs
    at 2/3 speed, all finish at 1.5."""
    topology, profile = _one_stage(1.0, _overhead(cores=2))
    workload = Workload.build(topology, profile, [0.0, 0.0, 0.0])
    result = estimate(topology, profile, [StageConfig("hw", 1, 3)], workload)
    np.testing.assert_allclose(result.latencies_s, [1.5, 1.5, 1.5], atol=1e-12)


@pytest.mark.parametrize(
    ("worker_nice", "expected"), [(0, [1.8, 1.8, 1.8]), (4, [1.75, 1.85, 1.75])]
)
def test_workers_at_a_lower_priority_leave_the_router_its_core(
    worker_nice: int, expected: list[float]
) -> None:
    """Two cores, three replicas serving 1 s, router CPU 0.2 in and 0.2 out per request,
    queries at 0, .3 and .6. q0 and q1 come in and are dispatched at .2 and .5 with a core
    to spare; q2 comes in while two workers serve, and q0 goes out while two serve.

    - Equal weights: those two router jobs run at 2/3 speed, [.6, .9] and [1.5, 1.8]; A
      ends at 1.5, B at 1.9, C at 2.2: answers at 1.8, 2.1, 2.4 (latency 1.8 each).
    - Workers at nice 4 (weight 1.25^-4 = 0.41, so 2 / (1 + 2 x 0.41) >= 1): the router
      keeps a full core, [.6, .8] and [1.55, 1.75], and the two workers share the other;
      A ends at 1.55 (0.5 done at .8, then 2/3 speed), B at 1.95, C at 2.15: answers at
      1.75, 2.15, 2.35."""
    topology, profile = _one_stage(
        1.0, _overhead(request_cpu=0.4, cores=2, worker_nice=worker_nice)
    )
    workload = Workload.build(topology, profile, [0.0, 0.3, 0.6])
    result = estimate(topology, profile, [StageConfig("hw", 1, 3)], workload)
    np.testing.assert_allclose(result.latencies_s, expected, atol=1e-9)


def test_a_co_located_client_is_a_session_of_its_own() -> None:
    """One core, client CPU 0.2 + 0.2 and router CPU 0.2 + 0.2 per request, two replicas
    serving 1 s, three queries at 0. The client and the pipeline split the core; within
    the pipeline the router and the workers split their half.

    q0's send [0, .2]; q1's send and q0's arrival at the router share the core [.2, .6].
    From .6 the client (q2's send, to 1.0) takes half, the router (q1's arrival) and A
    (q0) a quarter each; then the router and A halves [1, 1.2], q2's arrival [1.2, 1.6]
    beside A, B takes q1 at 1.6, A and B halves to 2.8 (A done). q0's answer [2.8, 3.4]
    at a third (beside A on q2 and B), the client receives it [3.4, 3.8] at a half: 3.8.
    B ends at 4.0, q1's answer [4.0, 4.4], received [4.4, 4.8]: 4.8. A ends at 5.0, q2's
    answer [5.0, 5.2], received [5.2, 5.4]: 5.4."""
    topology, profile = _one_stage(1.0, _overhead(request_cpu=0.4, cores=1))
    workload = Workload.build(topology, profile, [0.0, 0.0, 0.0], client_cpu_s=0.4)
    result = estimate(topology, profile, [StageConfig("hw", 1, 2)], workload)
    np.testing.assert_allclose(result.latencies_s, [3.8, 4.8, 5.4], atol=1e-9)


def _erlang_c_wait(servers: int, load: float) -> float:
    """Erlang C: mean waiting time in units of the mean service time, offered load a."""
    rho = load / servers
    top = load**servers / math.factorial(servers) / (1.0 - rho)
    bottom = sum(load**k / math.factorial(k) for k in range(servers)) + top
    return top / bottom / (servers - load)


@pytest.mark.parametrize("cores", [1, 2])
def test_processor_sharing_matches_the_closed_form(cores: int) -> None:
    """Poisson arrivals, exponential service, a replica for everyone (no stage queue) on
    c shared cores: M/M/c under processor sharing, whose number in system is that of
    M/M/c, so its mean response time is E[S] (1 + Erlang C wait) (c = 1: E[S]/(1 - rho))."""
    service, rho = 0.01, 0.7
    topology, profile = _one_stage(service, _overhead(cores=cores))
    arrivals = gamma_arrivals(rho * cores / service, 4000.0, cv2=1.0, seed=cores)
    workload = Workload.build(topology, profile, arrivals)
    result = estimate(
        topology, profile, [StageConfig("hw", 1, 64)], workload, service="exponential", seed=3
    )
    expected = service * (1.0 + _erlang_c_wait(cores, rho * cores))
    assert float(result.latencies_s.mean()) == pytest.approx(expected, rel=0.03)


def test_router_utilisation_is_its_cpu_per_request() -> None:
    """At low load every batch holds one item: the router is busy λ · (per request + per
    visit) of the time."""
    overhead = _overhead(request_cpu=0.002, batch_cpu=0.001, item_cpu=0.0005)
    topology, profile = _one_stage(0.001, overhead)
    arrivals = gamma_arrivals(20.0, 600.0, cv2=1.0, seed=5)
    workload = Workload.build(topology, profile, arrivals)
    result = estimate(topology, profile, [StageConfig("hw", 1, 4)], workload)
    span = float(arrivals[-1] - arrivals[0])
    assert result.router_busy_s / span == pytest.approx(arrivals.size / span * 0.0035, rel=1e-3)


def test_the_same_inputs_give_the_same_result() -> None:
    overhead = ServingOverhead(
        0.001, 0.0005, 0.0001, 0.0002, (0.0001, 0.0003, 0.002), (0.0004, 0.001), 0.0003, 2
    )
    topology, profile = _one_stage(0.004, overhead, idle=IdlePenalty((0.002,), (0.0003,)))
    arrivals = gamma_arrivals(150.0, 30.0, cv2=4.0, seed=1)
    workload = Workload.build(topology, profile, arrivals, client_cpu_s=0.001)
    config = [StageConfig("hw", 2, 2)]
    first = estimate(topology, profile, config, workload, service="exponential", seed=7)
    again = estimate(topology, profile, config, workload, service="exponential", seed=7)
    other = estimate(topology, profile, config, workload, service="exponential", seed=8)
    np.testing.assert_array_equal(first.latencies_s, again.latencies_s)
    assert not np.array_equal(first.latencies_s, other.latencies_s)
