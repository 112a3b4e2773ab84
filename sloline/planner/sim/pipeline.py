"""The whole pipeline as one simulation: stages sharing the router and the machine's cores.

The stage-by-stage estimator (:mod:`sloline.planner.sim.stage`) is exact while stages only
meet through their items' ready times. Serving couples them in two more ways
(:mod:`sloline.planner.overhead`), and this module simulates both, event by event, over
the whole pipeline at once (InferLine §4.2's discrete-event simulation, extended):

- **each router is one FIFO server.** Every request costs its router CPU on arrival and
  on its answer, every batch when it is dispatched and when its result comes back (half
  of the per-batch and per-item cost each time). Jobs wait for the router in the order
  they arrive, as callbacks wait for one event loop. A job that finds the router idle
  (not one that a finished job of that router queued: that one runs in its wake) also
  pays the router's idle penalty for the time it sat idle. With several routers each
  request goes to the router ``router_of`` names and stays with it: its items queue at
  that router's own queue per stage, its batches cost that router's CPU.
- **replicas follow the router's rules** (:mod:`sloline.planner.sim.rule`): a FIFO queue
  per stage (per router and stage); an idle replica (the longest idle first) takes
  ``min(queue, max_batch)`` items the moment work is pushed or it frees, from the router
  whose queue head was pushed first (every replica serves every router, one batch at a
  time); it is busy from that dispatch until the router has taken back its result. In
  between: the dispatch job, half the hop, the worker's CPU (model time of the batch from
  the profile, plus the idle penalty for the time the worker sat idle, plus its per-batch
  CPU), the other half of the hop, the result job.
- **cores are shared by weighted processor sharing.** With ``cores`` set, each router (one
  core while it has work), every worker serving a batch (its profile's cores) and an
  optional co-located client (one core while it has work) share that many cores, as
  Linux's fair scheduler shares them with autogroups: the client is a session of its
  own, and it and the pipeline's session get equal parts, either taking what the other
  leaves; within the pipeline's part each thread gets cores in proportion to its weight,
  the router 1 and a worker ``worker_weight`` (its lower priority; 1: equal), none more
  than a full core. With equal weights and no client, each progresses at cores / demand
  of its full speed.
- **requests travel** the measured request-path time outside the router, half before and
  half after; a co-located single-threaded client (the benchmark's load generator) is a
  FIFO server too, spending half its CPU per request sending and half receiving.

Ties are broken in a fixed order (arrivals, then timed events, then the router, the
client, the replicas), so the simulation is deterministic. Events are handled one at a
time with O(replicas) work each, compiled with numba like the stage kernel
(:mod:`sloline.planner.sim.state` holds the state and its handlers): one hour of a 3-stage
pipeline at 100 rps takes a few hundred milliseconds (docs/planner.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numba
import numpy as np
import numpy.typing as npt

from sloline.planner.sim.queues import heap_pop
from sloline.planner.sim.rule import eager, inlined, kernel
from sloline.planner.sim.state import (
    HOP_BACK,
    HOP_OUT,
    IDLE,
    OFF,
    REACH_ROUTER,
    RECV,
    SEND,
    SERVING,
    PipelineInputs,
    State,
    charge_wake,
    client_done,
    client_push,
    dispatch,
    hop_over,
    in_system,
    make_idle,
    remove_idle,
    request_in,
    router_done,
    worker_done,
)

__all__ = ["PipelineInputs", "PipelineRun", "Segments", "simulate_pipeline"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# What happens next, in the order ties go.
_ARRIVAL, _TIMED, _ROUTER_DONE, _CLIENT_DONE, _HOP_OVER, _WORKER_DONE = range(6)


@dataclass(frozen=True, slots=True, eq=False)
class PipelineRun:
    """Per query: when its answer reaches the client. Per stage: items served, batches and
    replica busy time (dispatch to result taken back); the routers' busy time and the CPU
    they spent (summed over routers)."""

    answered_s: FloatArray
    visits: IntArray
    batches: IntArray
    busy_s: FloatArray
    router_busy_s: float
    router_cpu_s: float


@inlined
def _replica_events(
    inputs: PipelineInputs, st: State, n: int
) -> tuple[float, float, int, int, float, int, int]:
    """The cores the serving workers demand; the next half hop to end (time, replica, tie
    key) and the next worker to end (virtual time, replica, tie key). Replicas whose
    events tie go by stage, then by their batch's first query, so that items released at
    one instant reach the next stages in query order."""
    rep, queue, cores = st.rep, st.queue, inputs.replica_cores
    n_stages = st.stg.shape[0]
    demand = 0.0
    t_hop, r_hop, k_hop = np.inf, -1, 0
    v_cpu, r_cpu, k_cpu = np.inf, -1, 0
    for r in range(rep.shape[0]):
        replica = rep[r]
        p = replica.phase
        if p == SERVING:
            m = replica.stage
            demand += cores[replica.cfg]
            v = replica.vend
            if v <= v_cpu:
                k = m * n + queue[replica.router * n_stages + m, replica.lo]
                if v < v_cpu or k < k_cpu:
                    v_cpu, r_cpu, k_cpu = v, r, k
        elif p in (HOP_OUT, HOP_BACK):
            t = replica.t_end
            if t <= t_hop:
                m = replica.stage
                k = m * n + queue[replica.router * n_stages + m, replica.lo]
                if t < t_hop or k < k_hop:
                    t_hop, r_hop, k_hop = t, r, k
    return demand, t_hop, r_hop, k_hop, v_cpu, r_cpu, k_cpu


@inlined
def _rates(inputs: PipelineInputs, st: State, demand: float) -> tuple[float, float, float]:
    """Weighted processor sharing: how fast each busy router, the client and the workers
    progress. The client (another session) and the pipeline split the cores equally,
    each taking what the other leaves; the pipeline's part goes to the routers (weight 1
    each) and the worker threads (``worker_weight``), none above a full core."""
    router = 0.0
    for r in range(st.rq.shape[0]):
        if st.rq[r].size > 0:
            router += 1.0
    client = 1.0 if st.cq[0].size > 0 else 0.0
    cores = inputs.cores
    rate, crate, wrate = 1.0, 1.0, 1.0
    if cores > 0.0 and router + client + demand > cores:
        own = cores
        if client > 0.0:
            crate = min(1.0, max(0.5 * cores, cores - router - demand))
            own = cores - crate
        if router + demand > own:
            share = own / (router + inputs.worker_weight * demand)  # per unit of weight
            if share >= 1.0:  # the router at full speed, the workers share the rest
                wrate = (own - router) / demand
            else:
                rate, wrate = share, share * inputs.worker_weight
    return rate, crate, wrate


@inlined
def _next_event(
    st: State,
    now: float,
    next_arrival: float,
    rates: tuple[float, float, float],
    replica_events: tuple[float, float, int, int, float, int, int],
) -> tuple[float, int, int]:
    """When the next event happens, what it is and (for a router's or a replica's) which
    one; -1 when nothing is left. Each job keeps its end in its side's virtual time."""
    rate, crate, wrate = rates
    _, t_hop, r_hop, k_hop, v_cpu, r_cpu, k_cpu = replica_events
    s = st.sim[0]
    best, what, who = next_arrival, _ARRIVAL if next_arrival < np.inf else -1, -1
    heap = st.heap[0]
    if heap.size > 0 and st.events[0].t < best:
        best, what = st.events[0].t, _TIMED
    for r in range(st.rq.shape[0]):
        rq = st.rq[r]
        if rq.size > 0:
            t = now + max(0.0, rq.vend - s.vnow) / rate
            if t < best:
                best, what, who = t, _ROUTER_DONE, r
    cq = st.cq[0]
    if cq.size > 0:
        t = now + max(0.0, cq.vend - s.cnow) / crate
        if t < best:
            best, what = t, _CLIENT_DONE
    if r_cpu >= 0:
        t = now + max(0.0, v_cpu - s.wnow) / wrate
        if t < t_hop or (t == t_hop and k_cpu < k_hop):
            t_hop, r_hop = t, r_cpu
    if r_hop >= 0 and t_hop < best:
        best, who = t_hop, r_hop
        what = _WORKER_DONE if st.rep[r_hop].phase == SERVING else _HOP_OVER
    return best, what, who


@inlined
def _advance(st: State, now: float, best: float, rates: tuple[float, float, float]) -> float:
    """Move the clocks from ``now`` to ``best``; returns the new time."""
    s = st.sim[0]
    for r in range(st.rt.shape[0]):
        st.rt[r].in_wake = 0
    if best > now:
        s.vnow = s.vnow + (best - now) * rates[0]
        s.cnow = s.cnow + (best - now) * rates[1]
        s.wnow = s.wnow + (best - now) * rates[2]
        for r in range(st.rq.shape[0]):
            if st.rq[r].size > 0:
                s.busy += best - now
        return best
    return now


@inlined
def _arrive(inputs: PipelineInputs, st: State, q: int) -> None:
    """Query q leaves the client, or (no client) reaches its router."""
    s = st.sim[0]
    in_system(s, s.now, 1)
    if s.client_cpu > 0.0:
        client_push(st, SEND, q)
    else:
        request_in(inputs, st, q)


@inlined
def _timed(inputs: PipelineInputs, st: State) -> None:
    """A request reaches its router, or an answer the client."""
    kind, q = heap_pop(st.events, st.heap)
    if kind == REACH_ROUTER:
        request_in(inputs, st, q)
    else:
        client_push(st, RECV, q)


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """An array as the compiled loop takes it: C-contiguous, read-only."""
    view = np.ascontiguousarray(array).view()
    view.setflags(write=False)
    return view


def _prepared(inputs: PipelineInputs) -> PipelineInputs:
    """The inputs with the types of the loop's one signature: read-only arrays, ``visits``
    flat (:func:`~sloline.planner.sim.rule.release`'s ``visits[q * M + c]``), plain
    numbers."""
    fields: dict[str, Any] = {
        k: _frozen(v) for k, v in inputs._asdict().items() if isinstance(v, np.ndarray)
    }
    fields["visits"] = fields["visits"].reshape(-1)
    fields["output"] = int(inputs.output)
    for k in ("worker_cpu_s", "client_cpu_s", "cores", "worker_weight"):
        fields[k] = float(getattr(inputs, k))
    fields["routers"] = int(inputs.routers)
    if fields["routers"] < 1:
        raise ValueError(f"routers must be >= 1, got {inputs.routers}")
    if inputs.router_of.size == 0:
        fields["router_of"] = _frozen(np.zeros(inputs.arrivals_s.shape[0], dtype=np.int64))
    elif inputs.router_of.shape != inputs.arrivals_s.shape or not (
        inputs.router_of.min() >= 0 and inputs.router_of.max() < fields["routers"]
    ):
        raise ValueError(f"router_of must name one of the {fields['routers']} routers per query")
    else:
        fields["router_of"] = _frozen(inputs.router_of.astype(np.int64))
    return inputs._replace(**fields)


def _signature() -> Any:
    """The loop's one signature (the types :func:`simulate_pipeline` passes), so that it
    compiles, or loads from numba's cache, when this module is imported."""
    ints, floats = np.zeros(1, dtype=np.int64), np.zeros(1)
    inputs = _prepared(
        PipelineInputs(
            floats, np.ones((1, 1), dtype=np.bool_), np.zeros(2, dtype=np.int64), ints, ints,
            0, ints + 1, ints + 1, floats, np.zeros((1, 2, 1)), np.zeros((1, 1), np.int64),
            np.ones((1, 1)), np.zeros((1, 1)), np.zeros((1, 2, 1)), floats, np.zeros(3),
            np.zeros((1, 2, 1)), 0.0, 0.0, 0.0, 1.0, 1, ints,
        )
    )  # fmt: skip
    typeof = cast(Callable[[object], Any], numba.typeof)
    args = (inputs, _frozen(floats), _frozen(ints), State.start(inputs), floats, 0.0)
    return numba.void(*(typeof(a) for a in args))


@eager(_signature())
def _run(
    inputs: PipelineInputs,
    enter_t: FloatArray,
    enter_q: IntArray,
    st: State,
    answered: FloatArray,
    until: float,
) -> None:
    """The event loop: queries enter at ``enter_t`` (sorted), in the order ``enter_q``;
    it handles every event up to ``until`` and stops there (``st.sim`` keeps where), so
    that a closed loop can act on the state and resume it."""
    n = enter_t.shape[0]
    s = st.sim[0]
    while True:
        now = s.now
        replica_events = _replica_events(inputs, st, n)
        rates = _rates(inputs, st, replica_events[0])
        next_arrival = enter_t[s.next_q] if s.next_q < n else np.inf
        best, what, who = _next_event(st, now, next_arrival, rates, replica_events)
        if what < 0 or best > until:
            if until < np.inf:
                s.now = _advance(st, now, until, rates)
            break
        s.now = now = _advance(st, now, best, rates)
        if what == _ARRIVAL:
            _arrive(inputs, st, enter_q[s.next_q])
            s.next_q += 1
        elif what == _TIMED:
            _timed(inputs, st)
        elif what == _CLIENT_DONE:
            client_done(inputs, st, now, answered)
        elif what == _HOP_OVER:
            hop_over(inputs, st, who, now)
        elif what == _WORKER_DONE:
            worker_done(inputs, st, who, now)
        else:
            router_done(inputs, st, who, now, answered)
        charge_wake(st, inputs.router_idle, now)


def _entries(inputs: PipelineInputs) -> tuple[FloatArray, IntArray]:
    """When queries enter the loop (sorted) and in which order: as they are sent when a
    co-located client queues them, else as they reach their router, half their request
    path after they are sent (known in advance)."""
    arrivals = inputs.arrivals_s
    n = arrivals.shape[0]
    if inputs.client_cpu_s > 0.0:
        return _frozen(arrivals), _frozen(np.arange(n, dtype=np.int64))
    reach = arrivals + 0.5 * inputs.requests
    enter_q = np.argsort(reach, kind="stable").astype(np.int64)
    return _frozen(reach[enter_q]), _frozen(enter_q)


def _result(state: State, answered: FloatArray) -> PipelineRun:
    stg, sim = state.stg, state.sim[0]
    return PipelineRun(
        answered,
        stg["visited"].copy(),
        stg["batches"].copy(),
        stg["busy_area"].copy(),
        float(sim["busy"]),
        float(sim["cpu"]),
    )


def simulate_pipeline(inputs: PipelineInputs) -> PipelineRun:
    """Run the routed pipeline simulation (see the module doc)."""
    inputs = _prepared(inputs)
    answered = np.full(inputs.arrivals_s.shape[0], np.nan)
    state = State.start(inputs)
    _run(inputs, *_entries(inputs), state, answered, np.inf)
    return _result(state, answered)


@kernel
def _activate(inputs: PipelineInputs, st: State, r: int, m: int, cfg: int, now: float) -> None:
    """Replica slot r starts serving stage m with configuration ``cfg``: idle (last in its
    ring), a cold worker; it takes queued work at once."""
    replica = st.rep[r]
    replica.stage, replica.cfg, replica.phase = m, cfg, IDLE
    replica.leaving, replica.last_end, replica.idle_since = 0, -np.inf, now
    make_idle(st.stg, st.idle, m, r)
    dispatch(inputs, st, m, now)
    charge_wake(st, inputs.router_idle, now)


@kernel
def _retire(st: State, r: int, now: float) -> bool:
    """Replica r leaves: at once when idle (True), else after its batch."""
    replica = st.rep[r]
    if replica.phase == IDLE:
        remove_idle(st.stg, st.idle, replica.stage, r)
        replica.phase, replica.t_off = OFF, now
        return True
    if replica.phase != OFF:
        replica.leaving = 1
    return False


class Segments:
    """The routed simulation run in segments, for a closed loop that changes the replicas
    between them (:mod:`sloline.lab.engine`): :meth:`run_until` handles every event up to
    a time; :meth:`activate` and :meth:`retire` start and stop replica slots at that time;
    :meth:`reconfigure` swaps in inputs with more configuration rows. ``packing``: idle
    replicas are taken lowest slot first (index packing) instead of longest idle first."""

    def __init__(self, inputs: PipelineInputs, slots: int, *, packing: bool = False) -> None:
        self.inputs = _prepared(inputs)
        self.enter_t, self.enter_q = _entries(self.inputs)
        self.state = State.start(self.inputs, slots)
        self.state.sim["packing"] = int(packing)
        self.answered = np.full(self.inputs.arrivals_s.shape[0], np.nan)

    @property
    def now(self) -> float:
        return float(self.state.sim["now"][0])

    def run_until(self, t: float) -> None:
        _run(self.inputs, self.enter_t, self.enter_q, self.state, self.answered, t)

    def reconfigure(self, inputs: PipelineInputs) -> None:
        """Go on with ``inputs``, whose configuration rows extend the current ones."""
        self.inputs = _prepared(inputs)

    def activate(self, r: int, stage: int, cfg: int) -> None:
        _activate(self.inputs, self.state, r, stage, cfg, self.now)

    def retire(self, r: int) -> bool:
        """Replica r leaves now if idle (True), else after its batch (its ``t_off``)."""
        return bool(_retire(self.state, r, self.now))

    def stay(self, r: int) -> None:
        """Replica r, leaving after its batch, stays."""
        self.state.rep["leaving"][r] = 0

    def grow(self, slots: int) -> None:
        """Room for ``slots`` replicas in all."""
        self.state = self.state.grown(slots)
