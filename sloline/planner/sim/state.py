"""The routed pipeline simulation's state and what changes it: stage queues, replicas, the
routers and a co-located client (:mod:`sloline.planner.sim.pipeline` runs the event loop).

The state (:class:`State`) is a tuple of arrays, most of them structured, which the
compiled handlers change in place by field name:

- ``sim`` (one record, :data:`SIM`): the virtual clocks, the costs;
- ``rt`` (a record per router, :data:`ROUTER`): whether it is idle, woken, in a job's wake;
- ``stg`` (a record per stage, :data:`STAGE`), with ``idle`` per stage a ring of idle
  replicas (longest idle first);
- ``sq`` (a record per router and stage, :data:`STAGE_QUEUE`, row ``r * M + m``): router
  r's FIFO queue of queries at stage m, ``queue[r * M + m]``, with each entry's push
  sequence number in ``qseq`` (the oldest head is the smallest);
- ``rep`` (a record per replica, :data:`REPLICA`);
- ``rjobs[r]`` / ``rq[r]``, ``cjobs`` / ``cq``: each router's and the client's FIFO jobs;
- ``events`` / ``heap``: timed events (requests and answers travelling).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from sloline.planner.sim.queues import EVENT, HEAP, JOB, QUEUE, fifo_pop, fifo_push, heap_push
from sloline.planner.sim.rule import batch_service, idle_penalty, inlined, release

__all__ = ["PipelineInputs", "State"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Records = npt.NDArray[np.void]

# Router and client job kinds.
REQ_IN, DISPATCH, RESULT, REQ_OUT = 0, 1, 2, 3
SEND, RECV = 0, 1
# Timed events.
REACH_ROUTER, REACH_CLIENT = 0, 1
# Replica phases (OFF: not serving, a slot the closed loop may start or has retired).
IDLE, WAIT_DISPATCH, HOP_OUT, SERVING, HOP_BACK, WAIT_RESULT, OFF = 0, 1, 2, 3, 4, 5, 6

_I, _F = np.int64, np.float64
SIM = np.dtype(
    [
        # Virtual clocks (CPU seconds at full speed) of the routers (all busy ones run at
        # one speed), the client, the workers.
        ("vnow", _F), ("cnow", _F), ("wnow", _F),
        # The routers' CPU spent and busy time (summed over routers); pushes so far.
        ("cpu", _F), ("busy", _F), ("pushes", _I),
        # Router CPU per request, per batch, per item; worker CPU per batch; client CPU
        # per request (0: none).
        ("req_cpu", _F), ("batch_cpu", _F), ("item_cpu", _F), ("worker_cpu", _F),
        ("client_cpu", _F),
        # Where the loop stopped (its time, the next query to enter), for a run resumed in
        # segments; queries entered and not answered, and their integral over time.
        ("now", _F), ("next_q", _I), ("in_system", _I), ("sys_area", _F), ("sys_last", _F),
        # 1: an idle replica is taken lowest-numbered first (index packing), not longest
        # idle first.
        ("packing", _I),
    ]
)  # fmt: skip
# A router: idle since; a job just found it idle (woken); a finished job of its own is
# queueing the jobs it causes (they run in its wake).
ROUTER = np.dtype([("idle_since", _F), ("woken", _I), ("in_wake", _I)])
# A stage: batches and items so far; its ring of idle replicas (head, count, first slot,
# size); items at the stage (queued or in a batch) and replicas with a batch (dispatch to
# result taken back), with their integrals over time up to ``last``.
STAGE = np.dtype(
    [
        ("batches", _I), ("visited", _I), ("idle_head", _I),
        ("idle_count", _I), ("first", _I), ("slots", _I), ("ongoing", _I),
        ("ong_area", _F), ("n_busy", _I), ("busy_area", _F), ("last", _F),
    ]
)  # fmt: skip
STAGE_QUEUE = np.dtype([("q_head", _I), ("q_tail", _I)])
# A replica: its stage and configuration (the row of the inputs' per-configuration
# arrays); its batch's router, queue position, size and index at its stage; the end of
# its half hop; its worker's end (the workers' virtual time); its last model
# time's end; since when it is idle; whether it leaves after its batch, and when it left.
REPLICA = np.dtype(
    [
        ("stage", _I), ("cfg", _I), ("phase", _I), ("router", _I), ("lo", _I), ("size", _I),
        ("batch", _I), ("t_end", _F), ("vend", _F), ("last_end", _F),
        ("idle_since", _F), ("leaving", _I), ("t_off", _F),
    ]
)  # fmt: skip


class PipelineInputs(NamedTuple):
    """Everything the routed pipeline simulation reads, as flat arrays (stages in topology
    order).

    - ``child_ptr`` / ``child_idx``: the stages waiting on stage m are
      ``child_idx[child_ptr[m]:child_ptr[m + 1]]``; ``n_deps[m]``: how many stage m waits on;
    - ``replicas[m]``: stage m's replicas at the start, of configuration m;
    - per configuration c (a row; stage m's first is row m, the closed loop appends
      others): ``max_batch[c]``, ``replica_cores[c]``; ``tables[c, k, j]``: model time of
      a batch of k (column j), the b-th batch of the stage using column ``cols[c, b]``
      times ``scales[c, b]``; ``hops[c, b]``: the b-th batch's hop (round trip outside
      router CPU, model and the worker's own CPU), half on the way out and half back;
      ``idle[c]``: the idle penalty (``[2, K]``: gaps from 0, extra times from 0);
    - ``requests[q]``: query q's request path outside the router (and the client's CPU);
    - ``router_cpu_s``: per request, per batch, per item; ``router_idle``: the router's
      idle penalty (``[1, 2, K]``); ``worker_cpu_s`` per batch;
    - ``client_cpu_s``: CPU per request of a co-located client (0: none);
    - ``cores``: cores shared by all of them (0: not shared); ``worker_weight``: a worker
      thread's scheduling weight, a router's being 1;
    - ``router_of[q]``: the router query q reaches (``routers`` of them, each with the
      router costs above and its own queue per stage; empty: all reach router 0).
    """

    arrivals_s: FloatArray
    visits: BoolArray
    child_ptr: IntArray
    child_idx: IntArray
    n_deps: IntArray
    output: int
    max_batch: IntArray
    replicas: IntArray
    replica_cores: FloatArray
    tables: FloatArray
    cols: IntArray
    scales: FloatArray
    hops: FloatArray
    idle: FloatArray
    requests: FloatArray
    router_cpu_s: FloatArray
    router_idle: FloatArray
    worker_cpu_s: float
    client_cpu_s: float
    cores: float
    worker_weight: float = 1.0
    routers: int = 1
    router_of: IntArray = np.zeros(0, dtype=np.int64)


class State(NamedTuple):
    """The simulation's arrays (see the module doc); ``pending``, ``stack`` and ``ready``
    are :func:`~sloline.planner.sim.rule.release`'s."""

    sim: Records
    rt: Records
    stg: Records
    sq: Records
    queue: IntArray
    qseq: IntArray
    idle: IntArray
    rep: Records
    rjobs: Records
    rq: Records
    cjobs: Records
    cq: Records
    events: Records
    heap: Records
    pending: npt.NDArray[np.int32]
    stack: IntArray
    ready: IntArray

    @classmethod
    def start(cls, inputs: PipelineInputs, slots: int = 0) -> State:
        """Every replica idle (of its stage's first configuration), no job queued, no
        query arrived. ``slots``: room for that many replicas in all, the ones beyond
        ``inputs.replicas`` off, for a closed loop to start (0: none)."""
        n, n_stages = inputs.arrivals_s.shape[0], inputs.n_deps.shape[0]
        n_on, n_rt = int(inputs.replicas.sum()), int(inputs.routers)
        n_rep = max(n_on, slots)
        # the most requests one router gets: what its queues and jobs must hold
        most = int(np.bincount(inputs.router_of, minlength=n_rt).max()) if n else 0
        sim = np.zeros(1, dtype=SIM)
        rt = np.zeros(n_rt, dtype=ROUTER)
        rt["idle_since"] = -np.inf
        sim["req_cpu"], sim["batch_cpu"], sim["item_cpu"] = inputs.router_cpu_s
        sim["worker_cpu"], sim["client_cpu"] = inputs.worker_cpu_s, inputs.client_cpu_s
        sim["now"] = inputs.arrivals_s[0] if n else 0.0
        stg = np.zeros(n_stages, dtype=STAGE)
        # each stage's ring of idle replicas: room for its own, or (slots) for any
        ring = np.full(n_stages, n_rep) if slots else inputs.replicas
        stg["first"][1:] = np.cumsum(ring)[:-1]
        stg["slots"] = ring
        stg["idle_count"] = inputs.replicas
        rep = np.zeros(n_rep, dtype=REPLICA)
        rep["stage"][:n_on] = rep["cfg"][:n_on] = np.repeat(np.arange(n_stages), inputs.replicas)
        rep["phase"][n_on:] = OFF
        rep["last_end"] = -np.inf
        idle = np.zeros(int(ring.sum()), dtype=np.int64)
        for m in range(n_stages):
            ids = np.flatnonzero(rep["stage"][:n_on] == m)
            idle[stg["first"][m] : stg["first"][m] + ids.size] = ids
        return cls(
            sim,
            rt,
            stg,
            np.zeros(n_rt * n_stages, dtype=STAGE_QUEUE),
            np.empty((n_rt * n_stages, most), dtype=np.int64),
            # one router: its queue's head is the oldest, no sequence numbers needed
            np.empty((n_rt * n_stages, most if n_rt > 1 else 0), dtype=np.int64),
            idle,
            rep,
            # a request or a replica: one job at most on its router
            np.zeros((n_rt, most + n_rep + 1), dtype=JOB),
            np.zeros(n_rt, dtype=QUEUE),
            np.zeros(n + 1, dtype=JOB),
            np.zeros(1, dtype=QUEUE),
            np.zeros(n + 1, dtype=EVENT),
            np.zeros(1, dtype=HEAP),
            np.repeat(inputs.n_deps.astype(np.int32)[None, :], n, axis=0).ravel(),
            np.zeros(n_stages, dtype=np.int64),
            np.zeros(n_stages + 1, dtype=np.int64),
        )

    def grown(self, slots: int) -> State:
        """This state with room for ``slots`` replicas in all (the new ones off), every
        stage's ring of idle replicas and every router's jobs laid out again in order."""
        n_old = self.rep.shape[0]
        if slots <= n_old:
            return self
        rep = np.zeros(slots, dtype=REPLICA)
        rep["phase"], rep["last_end"] = OFF, -np.inf
        rep[:n_old] = self.rep
        stg = self.stg.copy()
        idle = np.zeros(stg.shape[0] * slots, dtype=np.int64)
        for m, stage in enumerate(self.stg):
            ring = (stage["idle_head"] + np.arange(stage["idle_count"])) % stage["slots"]
            idle[m * slots : m * slots + ring.size] = self.idle[stage["first"] + ring]
        stg["first"], stg["slots"], stg["idle_head"] = np.arange(stg.shape[0]) * slots, slots, 0
        width = self.rjobs.shape[1] + slots - n_old
        rjobs = np.zeros((self.rjobs.shape[0], width), dtype=JOB)
        rq = self.rq.copy()
        for r, queue in enumerate(self.rq):
            order = (queue["head"] + np.arange(queue["size"])) % self.rjobs.shape[1]
            rjobs[r, : order.size] = self.rjobs[r, order]
        rq["head"] = 0
        return self._replace(rep=rep, stg=stg, idle=idle, rjobs=rjobs, rq=rq)


@inlined
def router_push(st: State, r: int, kind: int, ref: int, cost: float) -> None:
    """Queue a job on router r. A job that finds it idle, other than one a finished job
    of its own queued, wakes its event loop (:func:`charge_wake` adds its idle penalty)."""
    s, router = st.sim[0], st.rt[r]
    if st.rq[r].size == 0 and router.in_wake == 0:
        router.woken = 1
    s.cpu += cost
    fifo_push(st.rjobs[r], st.rq[r : r + 1], s.vnow, kind, ref, cost)


@inlined
def charge_wake(st: State, router_idle: FloatArray, now: float) -> None:
    """The job that woke a router pays for the time it sat idle."""
    s = st.sim[0]
    for r in range(st.rt.shape[0]):
        router = st.rt[r]
        if router.woken:
            router.woken = 0
            extra = idle_penalty(router_idle, 0, now - router.idle_since)
            q = st.rq[r]
            st.rjobs[r, q.head].cost += extra
            q.vend += extra
            s.cpu += extra


@inlined
def _sort_batch(queue: IntArray, m: int, lo: int, k: int) -> None:
    """Put a batch's items in query order (insertion sort: a few items, mostly in order)."""
    for i in range(lo + 1, lo + k):
        q = queue[m, i]
        j = i - 1
        while j >= lo and queue[m, j] > q:
            queue[m, j + 1] = queue[m, j]
            j -= 1
        queue[m, j + 1] = q


@inlined
def _take_idle(stg: Records, idle: IntArray, m: int, packing: int) -> int:
    """Stage m's longest idle replica, or with ``packing`` its lowest-numbered idle one,
    now no longer idle."""
    st = stg[m]
    if packing:
        r = idle[st.first + st.idle_head]
        for i in range(1, st.idle_count):
            r = min(r, idle[st.first + (st.idle_head + i) % st.slots])
        remove_idle(stg, idle, m, r)
        return int(r)
    r = idle[st.first + st.idle_head]
    st.idle_head = (st.idle_head + 1) % st.slots
    st.idle_count -= 1
    return int(r)


@inlined
def make_idle(stg: Records, idle: IntArray, m: int, r: int) -> None:
    """Replica r of stage m is idle (last in its ring)."""
    st = stg[m]
    idle[st.first + (st.idle_head + st.idle_count) % st.slots] = r
    st.idle_count += 1


@inlined
def remove_idle(stg: Records, idle: IntArray, m: int, r: int) -> None:
    """Replica r of stage m, idle, leaves its ring (the ones after it move up)."""
    st = stg[m]
    i = 0
    while idle[st.first + (st.idle_head + i) % st.slots] != r:
        i += 1
    for j in range(i, st.idle_count - 1):
        idle[st.first + (st.idle_head + j) % st.slots] = idle[
            st.first + (st.idle_head + j + 1) % st.slots
        ]
    st.idle_count -= 1


@inlined
def stage_acc(stage: Any, now: float) -> None:
    """Integrate a stage's items and busy replicas up to ``now``."""
    dt = now - stage.last
    if dt > 0.0:
        stage.ong_area += stage.ongoing * dt
        stage.busy_area += stage.n_busy * dt
        stage.last = now


@inlined
def in_system(s: Any, now: float, delta: int) -> None:
    """Queries in the system change by ``delta`` at ``now`` (integrated up to it)."""
    if now > s.sys_last:
        s.sys_area += s.in_system * (now - s.sys_last)
        s.sys_last = now
    s.in_system += delta


@inlined
def _oldest(st: State, m: int) -> int:
    """The router whose queue at stage m has the oldest head (-1: all empty)."""
    n_stages = st.stg.shape[0]
    if st.rt.shape[0] == 1:
        sq = st.sq[m]
        return 0 if sq.q_tail > sq.q_head else -1
    best, oldest = -1, 0
    for r in range(st.rt.shape[0]):
        row = r * n_stages + m
        sq = st.sq[row]
        if sq.q_tail > sq.q_head:
            seq = st.qseq[row, sq.q_head]
            if best < 0 or seq < oldest:
                best, oldest = r, seq
    return best


@inlined
def dispatch(inputs: PipelineInputs, st: State, m: int, now: float) -> None:
    """While stage m has an idle replica and queued items: the longest-idle replica takes
    ``min(queue, its max_batch)`` items of the router whose queue head is oldest, and that
    router gets the dispatch job. The batch's items are kept in query order, the order
    they go on to the next stages in when the batch is done (the estimator's rule for
    items ready at the same instant)."""
    sim, stg, rep = st.sim, st.stg, st.rep
    stage = stg[m]
    while stage.idle_count > 0:
        router = _oldest(st, m)
        if router < 0:
            break
        row = router * stg.shape[0] + m
        sq = st.sq[row]
        lo = sq.q_head
        r = _take_idle(stg, st.idle, m, sim[0].packing)
        replica = rep[r]
        k = min(sq.q_tail - lo, inputs.max_batch[replica.cfg])
        _sort_batch(st.queue, row, lo, k)
        replica.router, replica.lo, replica.size, replica.batch = router, lo, k, stage.batches
        replica.phase = WAIT_DISPATCH
        stage_acc(stage, now)
        stage.n_busy += 1
        stage.batches += 1
        sq.q_head += k
        cost = 0.5 * (sim[0].batch_cpu + sim[0].item_cpu * k)
        router_push(st, router, DISPATCH, r, cost)


@inlined
def done_at(inputs: PipelineInputs, st: State, q: int, m: int, now: float) -> None:
    """Stage m is done for query q (m = -1: q reached the router): q is queued at the
    stages that are now ready for it (each dispatching at once if it has an idle
    replica), and its answer on the router once the output stage is done."""
    count = release(
        q,
        m,
        st.pending,
        inputs.visits,
        inputs.child_ptr,
        inputs.child_idx,
        inputs.n_deps,
        inputs.output,
        st.stack,
        st.ready,
    )
    stg, s = st.stg, st.sim[0]
    router = inputs.router_of[q]
    for i in range(count):
        c = st.ready[i]
        if c < 0:
            router_push(st, router, REQ_OUT, q, 0.5 * s.req_cpu)
            continue
        row = router * stg.shape[0] + c
        sq = st.sq[row]
        st.queue[row, sq.q_tail] = q
        if st.qseq.shape[1]:
            st.qseq[row, sq.q_tail] = s.pushes
            s.pushes += 1
        sq.q_tail += 1
        stg[c].visited += 1
        stage_acc(stg[c], now)
        stg[c].ongoing += 1
        dispatch(inputs, st, c, now)


@inlined
def hop_over(inputs: PipelineInputs, st: State, r: int, now: float) -> None:
    """Half of replica r's hop is over: on the way out its worker starts (model time, idle
    penalty, its own CPU); on the way back the router gets the result job."""
    replica = st.rep[r]
    c = replica.cfg
    s = st.sim[0]
    if replica.phase == HOP_OUT:
        extra = idle_penalty(inputs.idle, c, now - replica.last_end)
        service = batch_service(
            inputs.tables, inputs.cols, inputs.scales, c, replica.batch, replica.size
        )
        replica.vend = s.wnow + service + extra + s.worker_cpu
        replica.phase = SERVING
    else:
        replica.phase = WAIT_RESULT
        cost = 0.5 * (s.batch_cpu + s.item_cpu * replica.size)
        router_push(st, replica.router, RESULT, r, cost)


@inlined
def worker_done(inputs: PipelineInputs, st: State, r: int, now: float) -> None:
    """Replica r's worker finished its batch: the result goes back (half a hop)."""
    replica = st.rep[r]
    replica.last_end = now
    replica.phase = HOP_BACK
    replica.t_end = now + 0.5 * inputs.hops[replica.cfg, replica.batch]


@inlined
def _result_taken(inputs: PipelineInputs, st: State, r: int, now: float) -> None:
    """The router took replica r's result: the replica is free (and takes queued work)
    or, leaving, off; its batch's items are done at its stage."""
    replica = st.rep[r]
    m = replica.stage
    stage = st.stg[m]
    stage_acc(stage, now)
    stage.n_busy -= 1
    stage.ongoing -= replica.size
    replica.idle_since = now
    if replica.leaving:
        replica.phase, replica.leaving, replica.t_off = OFF, 0, now
    else:
        replica.phase = IDLE
        make_idle(st.stg, st.idle, m, r)
    row, first, count = replica.router * st.stg.shape[0] + m, replica.lo, replica.size
    dispatch(inputs, st, m, now)
    for i in range(first, first + count):
        done_at(inputs, st, st.queue[row, i], m, now)


@inlined
def router_done(
    inputs: PipelineInputs, st: State, router: int, now: float, answered: FloatArray
) -> None:
    """The router finished its head job; what that job queues on the router runs in its
    wake."""
    s = st.sim[0]
    kind, ref = fifo_pop(st.rjobs[router], st.rq[router : router + 1], s.vnow)
    st.rt[router].in_wake = 1
    if kind == DISPATCH:
        replica = st.rep[ref]
        replica.phase = HOP_OUT
        replica.t_end = now + 0.5 * inputs.hops[replica.cfg, replica.batch]
    elif kind == REQ_OUT:
        in_system(s, now, -1)
        at = now + 0.5 * inputs.requests[ref]
        if s.client_cpu > 0.0:
            heap_push(st.events, st.heap, at, REACH_CLIENT, ref)
        else:
            answered[ref] = at
    elif kind == REQ_IN:
        done_at(inputs, st, ref, -1, now)
    else:
        _result_taken(inputs, st, ref, now)
    if st.rq[router].size == 0:
        st.rt[router].idle_since = now


@inlined
def request_in(inputs: PipelineInputs, st: State, q: int) -> None:
    """Query q reaches its router."""
    router_push(st, inputs.router_of[q], REQ_IN, q, 0.5 * st.sim[0].req_cpu)


@inlined
def client_push(st: State, kind: int, q: int) -> None:
    """Queue a send or a receive on the co-located client."""
    s = st.sim[0]
    fifo_push(st.cjobs, st.cq, s.cnow, kind, q, 0.5 * s.client_cpu)


@inlined
def client_done(inputs: PipelineInputs, st: State, now: float, answered: FloatArray) -> None:
    """The client finished sending a request (it travels to the router) or receiving an
    answer."""
    kind, q = fifo_pop(st.cjobs, st.cq, st.sim[0].cnow)
    if kind == SEND:
        heap_push(st.events, st.heap, now + 0.5 * inputs.requests[q], REACH_ROUTER, q)
    else:
        answered[q] = now
