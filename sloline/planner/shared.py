"""The whole pipeline as one simulation: stages sharing the router and the machine's cores.

The stage-by-stage estimator (:mod:`sloline.planner.queueing`) is exact while stages only
meet through their items' ready times. Serving couples them in two more ways
(:mod:`sloline.planner.overhead`), and this module simulates both, event by event, over
the whole pipeline at once (InferLine §4.2's discrete-event simulation, extended):

- **the router is one FIFO server.** Every request costs it CPU on arrival and on its
  answer, every batch when it is dispatched and when its result comes back (half of the
  per-batch and per-item cost each time). Jobs wait for the router in the order they
  arrive, as callbacks wait for one event loop. A job that finds the router idle (not one
  that a finished job queued: that one runs in its wake) also pays the router's idle
  penalty for the time it sat idle.
- **replicas follow the router's rules**: a FIFO queue per stage; an idle replica (the
  longest idle first) takes ``min(queue, max_batch)`` items the moment work is pushed or
  it frees; it is busy from that dispatch until the router has taken back its result. In
  between: the dispatch job, half the hop, the worker's CPU (model time of the batch from
  the profile, plus the idle penalty for the time the worker sat idle, plus its per-batch
  CPU), the other half of the hop, the result job.
- **cores are shared by weighted processor sharing.** With ``cores`` set, the router (one
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
time with O(replicas) work each, compiled with numba like the stage kernel: one hour of a
3-stage pipeline at 100 rps takes a few hundred milliseconds (docs/planner.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from sloline.planner.queueing import idle_penalty

__all__ = ["SharedInputs", "SharedRun", "simulate_shared"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# Router and client job kinds.
_REQ_IN, _DISPATCH, _RESULT, _REQ_OUT = 0, 1, 2, 3
_SEND, _RECV = 0, 1
# Timed-event kinds (the heap).
_REACH_ROUTER, _REACH_CLIENT = 0, 1
# Replica phases.
_IDLE, _WAIT_DISPATCH, _HOP_OUT, _SERVING, _HOP_BACK, _WAIT_RESULT = 0, 1, 2, 3, 4, 5
# Columns of the per-stage integer state ``stg``.
_QHEAD, _QTAIL, _NBATCH, _IDLE_HEAD, _IDLE_COUNT, _FIRST, _REPLICAS, _MAX_BATCH = range(8)
# Columns of the per-replica integer state ``rep`` and float state ``repf``.
_PHASE, _LO, _K, _BATCH, _STAGE = range(5)
_T_DISP, _T_END, _VEND, _LAST_END = range(4)
# Slots of the scalar integer state ``ist`` and float state ``fst``.
_RJ_HEAD, _RJ_LEN, _CJ_HEAD, _CJ_LEN, _HEAP_LEN, _SEQ, _IN_ROUTER, _WOKEN = range(8)
_VNOW, _RVEND, _CVEND, _BATCH_CPU, _ITEM_CPU, _REQ_CPU, _WNOW, _CNOW, _RIDLE, _RCPU = range(10)


@dataclass(frozen=True, slots=True, eq=False)
class SharedInputs:
    """Everything the shared simulation reads, as flat arrays (stages in topology order).

    - ``child_ptr`` / ``child_idx``: the stages waiting on stage m are
      ``child_idx[child_ptr[m]:child_ptr[m + 1]]``; ``n_deps[m]``: how many stage m waits on;
    - ``tables[m, k, j]``: model time of a batch of k (column j); the b-th batch of stage m
      uses column ``cols[m, b]`` times ``scales[m, b]``;
    - ``hops[m, b]``: the b-th batch's hop (round trip outside router CPU, model and the
      worker's own CPU), half on the way out and half back;
    - ``idle_gap[m]`` / ``idle_extra[m]``: the idle penalty curve (from gap 0, extra 0);
    - ``requests[q]``: query q's request path outside the router (and the client's CPU);
    - ``router_cpu_s``: per request, per batch, per item; ``router_idle``: the router's
      idle penalty (``[2, K]``, as ``idle_gap`` / ``idle_extra``); ``worker_cpu_s`` per
      batch;
    - ``client_cpu_s``: CPU per request of a co-located client (0: none);
    - ``cores``: cores shared by all of them (0: not shared); ``worker_weight``: a worker
      thread's scheduling weight, the router's being 1.
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
    idle_gap: FloatArray
    idle_extra: FloatArray
    requests: FloatArray
    router_cpu_s: FloatArray
    router_idle: FloatArray
    worker_cpu_s: float
    client_cpu_s: float
    cores: float
    worker_weight: float = 1.0


@dataclass(frozen=True, slots=True, eq=False)
class SharedRun:
    """Per query: when its answer reaches the client. Per stage: items served, batches and
    replica busy time (dispatch to result taken back); the router's busy time and the CPU
    it spent."""

    answered_s: FloatArray
    visits: IntArray
    batches: IntArray
    busy_s: FloatArray
    router_busy_s: float
    router_cpu_s: float


def _arr(dtype: numba.types.Type, ndim: int) -> numba.types.Array:
    return numba.types.Array(dtype, ndim, "C", readonly=True)


@numba.njit(cache=True, nogil=True, inline="always")
def _heap_push(
    heap_t: FloatArray, heap_s: IntArray, heap_k: IntArray, heap_q: IntArray,
    ist: IntArray, t: float, kind: int, q: int,
) -> None:  # fmt: skip
    """Push (t, seq) -> (kind, query) onto the binary min-heap of timed events."""
    seq = ist[_SEQ]
    ist[_SEQ] += 1
    pos = ist[_HEAP_LEN]
    ist[_HEAP_LEN] += 1
    while pos > 0:
        parent = (pos - 1) // 2
        if heap_t[parent] < t or (heap_t[parent] == t and heap_s[parent] < seq):
            break
        heap_t[pos], heap_s[pos] = heap_t[parent], heap_s[parent]
        heap_k[pos], heap_q[pos] = heap_k[parent], heap_q[parent]
        pos = parent
    heap_t[pos], heap_s[pos], heap_k[pos], heap_q[pos] = t, seq, kind, q


@numba.njit(cache=True, nogil=True, inline="always")
def _heap_pop(
    heap_t: FloatArray, heap_s: IntArray, heap_k: IntArray, heap_q: IntArray, ist: IntArray
) -> None:
    """Remove the heap's root."""
    n = ist[_HEAP_LEN] - 1
    ist[_HEAP_LEN] = n
    t, seq, kind, q = heap_t[n], heap_s[n], heap_k[n], heap_q[n]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and (
            heap_t[child + 1] < heap_t[child]
            or (heap_t[child + 1] == heap_t[child] and heap_s[child + 1] < heap_s[child])
        ):
            child += 1
        if heap_t[child] > t or (heap_t[child] == t and heap_s[child] > seq):
            break
        heap_t[pos], heap_s[pos] = heap_t[child], heap_s[child]
        heap_k[pos], heap_q[pos] = heap_k[child], heap_q[child]
        pos = child
    heap_t[pos], heap_s[pos], heap_k[pos], heap_q[pos] = t, seq, kind, q


@numba.njit(cache=True, nogil=True, inline="always")
def _router_add(
    rj_kind: IntArray, rj_ref: IntArray, rj_cost: FloatArray,
    ist: IntArray, fst: FloatArray, kind: int, ref: int, cost: float,
) -> None:  # fmt: skip
    """Queue a job on the router (FIFO); an idle router starts it at once. A job that
    finds the router idle, other than one its own finished job queued, wakes its event
    loop (``ist[_WOKEN]``: the event loop adds the router's idle penalty to it)."""
    cap = rj_kind.shape[0]
    pos = (ist[_RJ_HEAD] + ist[_RJ_LEN]) % cap
    if ist[_RJ_LEN] == 0 and ist[_IN_ROUTER] == 0:
        ist[_WOKEN] = 1
    fst[_RCPU] += cost
    rj_kind[pos], rj_ref[pos], rj_cost[pos] = kind, ref, cost
    if ist[_RJ_LEN] == 0:
        fst[_RVEND] = fst[_VNOW] + cost
    ist[_RJ_LEN] += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _client_add(
    cj_kind: IntArray, cj_ref: IntArray, ist: IntArray, fst: FloatArray,
    kind: int, ref: int, cost: float,
) -> None:  # fmt: skip
    """Queue a job on the co-located client (FIFO)."""
    cap = cj_kind.shape[0]
    pos = (ist[_CJ_HEAD] + ist[_CJ_LEN]) % cap
    cj_kind[pos], cj_ref[pos] = kind, ref
    if ist[_CJ_LEN] == 0:
        fst[_CVEND] = fst[_CNOW] + cost
    ist[_CJ_LEN] += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _dispatch(
    m: int, now: float, stg: IntArray, rep: IntArray, repf: FloatArray, idle_buf: IntArray,
    qbuf: IntArray, rj_kind: IntArray, rj_ref: IntArray, rj_cost: FloatArray, ist: IntArray,
    fst: FloatArray,
) -> None:  # fmt: skip
    """While stage m has an idle replica and queued items: the longest-idle replica takes
    ``min(queue, max_batch)`` of them and the router gets the dispatch job. The batch's
    items are kept in query order, the order they go on to the next stages in when the
    batch is done (the estimator's rule for items ready at the same instant)."""
    while stg[m, _IDLE_COUNT] > 0 and stg[m, _QTAIL] > stg[m, _QHEAD]:
        k = min(stg[m, _QTAIL] - stg[m, _QHEAD], stg[m, _MAX_BATCH])
        lo = stg[m, _QHEAD]
        for i in range(lo + 1, lo + k):  # insertion sort: a few items, mostly in order
            q = qbuf[m, i]
            j = i - 1
            while j >= lo and qbuf[m, j] > q:
                qbuf[m, j + 1] = qbuf[m, j]
                j -= 1
            qbuf[m, j + 1] = q
        r = idle_buf[stg[m, _FIRST] + stg[m, _IDLE_HEAD]]
        stg[m, _IDLE_HEAD] = (stg[m, _IDLE_HEAD] + 1) % stg[m, _REPLICAS]
        stg[m, _IDLE_COUNT] -= 1
        rep[r, _LO], rep[r, _K], rep[r, _BATCH] = stg[m, _QHEAD], k, stg[m, _NBATCH]
        rep[r, _PHASE] = _WAIT_DISPATCH
        stg[m, _NBATCH] += 1
        stg[m, _QHEAD] += k
        repf[r, _T_DISP] = now
        cost = 0.5 * (fst[_BATCH_CPU] + fst[_ITEM_CPU] * k)
        _router_add(rj_kind, rj_ref, rj_cost, ist, fst, _DISPATCH, r, cost)


@numba.njit(cache=True, nogil=True, inline="always")
def _ready(
    q: int, c: int, now: float, visits: BoolArray, qbuf: IntArray, visited: IntArray,
    stack: IntArray, sp: int, stg: IntArray, rep: IntArray, repf: FloatArray,
    idle_buf: IntArray, rj_kind: IntArray, rj_ref: IntArray, rj_cost: FloatArray,
    ist: IntArray, fst: FloatArray,
) -> int:  # fmt: skip
    """Stage c's dependencies are all done for query q: push q to c's queue (dispatching at
    once if a replica is idle), or, if q does not visit c, put c on the stack of stages to
    mark done (skipped). Returns the new stack size."""
    if visits[q, c]:
        qbuf[c, stg[c, _QTAIL]] = q
        stg[c, _QTAIL] += 1
        visited[c] += 1
        _dispatch(c, now, stg, rep, repf, idle_buf, qbuf, rj_kind, rj_ref, rj_cost, ist, fst)
        return sp
    stack[sp] = c
    return sp + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _finish(
    q: int, m0: int, now: float, visits: BoolArray, child_ptr: IntArray, child_idx: IntArray,
    n_deps: IntArray, output: int, pending: npt.NDArray[np.int32], stack: IntArray,
    qbuf: IntArray, visited: IntArray, stg: IntArray, rep: IntArray, repf: FloatArray,
    idle_buf: IntArray, rj_kind: IntArray, rj_ref: IntArray, rj_cost: FloatArray,
    ist: IntArray, fst: FloatArray,
) -> None:  # fmt: skip
    """Stage ``m0`` is done for query q, or (``m0 = -1``) the request just started and the
    stages without dependencies are ready. Stages whose dependencies are then all done
    become ready in stage order (skipped ones are done at once, cascading); the output
    stage being done queues the answer on the router."""
    sp = 0
    if m0 >= 0:
        stack[0] = m0
        sp = 1
    else:
        for c in range(stg.shape[0]):
            if n_deps[c] == 0:
                sp = _ready(
                    q, c, now, visits, qbuf, visited, stack, sp, stg, rep, repf, idle_buf,
                    rj_kind, rj_ref, rj_cost, ist, fst,
                )  # fmt: skip
    while sp > 0:
        sp -= 1
        m = stack[sp]
        if m == output:
            _router_add(rj_kind, rj_ref, rj_cost, ist, fst, _REQ_OUT, q, 0.5 * fst[_REQ_CPU])
        for e in range(child_ptr[m], child_ptr[m + 1]):
            c = child_idx[e]
            pending[q, c] -= 1
            if pending[q, c] == 0:
                sp = _ready(
                    q, c, now, visits, qbuf, visited, stack, sp, stg, rep, repf, idle_buf,
                    rj_kind, rj_ref, rj_cost, ist, fst,
                )  # fmt: skip


_SIGNATURE = numba.void(
    _arr(numba.float64, 1),  # entries: when each query enters (sorted)
    _arr(numba.int64, 1),  # which query enters
    _arr(numba.boolean, 2),  # visits [n, M]
    _arr(numba.int64, 1),  # child_ptr
    _arr(numba.int64, 1),  # child_idx
    _arr(numba.int64, 1),  # n_deps
    numba.int64,  # output
    _arr(numba.int64, 1),  # max_batch
    _arr(numba.int64, 1),  # replicas
    _arr(numba.float64, 1),  # replica cores
    _arr(numba.float64, 3),  # tables [M, B + 1, J]
    _arr(numba.int64, 2),  # cols [M, NB]
    _arr(numba.float64, 2),  # scales [M, NB]
    _arr(numba.float64, 2),  # hops [M, NB]
    _arr(numba.float64, 2),  # idle gaps [M, K]
    _arr(numba.float64, 2),  # idle extras [M, K]
    _arr(numba.float64, 1),  # request path per query
    _arr(numba.float64, 1),  # router CPU: per request, per batch, per item
    _arr(numba.float64, 2),  # the router's idle penalty [2, K]
    numba.float64,  # worker CPU per batch
    numba.float64,  # client CPU per request
    numba.float64,  # shared cores (0: not shared)
    numba.float64,  # a worker thread's scheduling weight (the router's: 1)
    numba.float64[::1],  # out: answered
    numba.int64[:, ::1],  # out: per stage visits, batches
    numba.float64[::1],  # out: per stage busy
    numba.float64[::1],  # out: the router's busy time, CPU
)


@numba.njit(_SIGNATURE, cache=True, nogil=True)
def _simulate(  # noqa: C901, PLR0912, PLR0915 - one event loop, kept in one piece for speed
    enter_t: FloatArray,
    enter_q: IntArray,
    visits: BoolArray,
    child_ptr: IntArray,
    child_idx: IntArray,
    n_deps: IntArray,
    output: int,
    max_batch: IntArray,
    replicas: IntArray,
    replica_cores: FloatArray,
    tables: FloatArray,
    cols: IntArray,
    scales: FloatArray,
    hops: FloatArray,
    idle_gap: FloatArray,
    idle_extra: FloatArray,
    requests: FloatArray,
    router_cpu: FloatArray,
    router_idle: FloatArray,
    worker_cpu: float,
    client_cpu: float,
    cores: float,
    worker_weight: float,
    answered: FloatArray,
    counts: IntArray,
    busy: FloatArray,
    router_out: FloatArray,
) -> None:
    n = enter_t.shape[0]
    n_stages = max_batch.shape[0]
    n_rep = int(replicas.sum())
    stg = np.zeros((n_stages, 8), dtype=np.int64)
    rep = np.zeros((n_rep, 5), dtype=np.int64)
    repf = np.zeros((n_rep, 4), dtype=np.float64)
    r = 0
    for m in range(n_stages):
        stg[m, _FIRST] = r
        stg[m, _REPLICAS] = replicas[m]
        stg[m, _IDLE_COUNT] = replicas[m]
        stg[m, _MAX_BATCH] = max_batch[m]
        for _ in range(replicas[m]):
            rep[r, _STAGE] = m
            repf[r, _LAST_END] = -np.inf
            r += 1
    idle_buf = np.arange(n_rep, dtype=np.int64)  # per stage, a ring of idle replicas
    pending = np.empty((n, n_stages), dtype=np.int32)
    for q in range(n):
        for m in range(n_stages):
            pending[q, m] = n_deps[m]
    qbuf = np.empty((n_stages, n), dtype=np.int64)
    visited = np.zeros(n_stages, dtype=np.int64)
    stack = np.zeros(n_stages, dtype=np.int64)
    rcap = n + n_rep + 1  # a request or a replica has at most one job queued at a time
    rj_kind = np.zeros(rcap, dtype=np.int64)
    rj_ref = np.zeros(rcap, dtype=np.int64)
    rj_cost = np.zeros(rcap, dtype=np.float64)
    cj_kind = np.zeros(n + 1, dtype=np.int64)
    cj_ref = np.zeros(n + 1, dtype=np.int64)
    heap_t = np.zeros(n + 1, dtype=np.float64)
    heap_s = np.zeros(n + 1, dtype=np.int64)
    heap_k = np.zeros(n + 1, dtype=np.int64)
    heap_q = np.zeros(n + 1, dtype=np.int64)
    ist = np.zeros(8, dtype=np.int64)
    fst = np.zeros(10, dtype=np.float64)
    fst[_BATCH_CPU], fst[_ITEM_CPU], fst[_REQ_CPU] = router_cpu[1], router_cpu[2], router_cpu[0]
    fst[_RIDLE] = -np.inf
    half_client = 0.5 * client_cpu
    router_busy = 0.0
    next_arr = 0
    now = enter_t[0] if n else 0.0
    while True:
        # Weighted processor sharing: the router, the client and the workers each progress
        # at a rate of their own, so each job keeps its end in its side's virtual time (CPU
        # seconds at full speed: ``fst[_VNOW]``, ``fst[_CNOW]``, ``fst[_WNOW]``).
        router = 1.0 if ist[_RJ_LEN] > 0 else 0.0
        client = 1.0 if ist[_CJ_LEN] > 0 else 0.0
        demand = 0.0
        # Replicas whose events tie go by stage, then by their batch's first query, so
        # that items released at one instant reach the next stages in query order.
        t_hop, r_hop, k_hop = np.inf, -1, 0
        v_cpu, r_cpu, k_cpu = np.inf, -1, 0
        for r in range(n_rep):
            p = rep[r, _PHASE]
            if p == _SERVING:
                demand += replica_cores[rep[r, _STAGE]]
                v = repf[r, _VEND]
                if v <= v_cpu:
                    m = rep[r, _STAGE]
                    k = m * n + qbuf[m, rep[r, _LO]]
                    if v < v_cpu or k < k_cpu:
                        v_cpu, r_cpu, k_cpu = v, r, k
            elif p in (_HOP_OUT, _HOP_BACK):
                t = repf[r, _T_END]
                if t <= t_hop:
                    m = rep[r, _STAGE]
                    k = m * n + qbuf[m, rep[r, _LO]]
                    if t < t_hop or k < k_hop:
                        t_hop, r_hop, k_hop = t, r, k
        rate, crate, wrate = 1.0, 1.0, 1.0
        if cores > 0.0 and router + client + demand > cores:
            # The client (another session) and the pipeline split the cores equally, each
            # taking what the other leaves; the pipeline's part goes to the router (weight
            # 1) and the worker threads (``worker_weight``), none above a full core.
            own = cores
            if client > 0.0:
                crate = min(1.0, max(0.5 * cores, cores - router - demand))
                own = cores - crate
            if router + demand > own:
                share = own / (router + worker_weight * demand)  # per unit of weight
                if share >= 1.0:  # the router at full speed, the workers share the rest
                    wrate = (own - router) / demand
                else:
                    rate, wrate = share, share * worker_weight
        vnow, cnow, wnow = fst[_VNOW], fst[_CNOW], fst[_WNOW]
        # The next event; ties go arrivals, timed events, router, client, replicas.
        best = np.inf
        what = -1
        who = -1
        if next_arr < n:
            best, what = enter_t[next_arr], 0
        if ist[_HEAP_LEN] > 0 and heap_t[0] < best:
            best, what = heap_t[0], 1
        if ist[_RJ_LEN] > 0:
            t = now + max(0.0, fst[_RVEND] - vnow) / rate
            if t < best:
                best, what = t, 2
        if ist[_CJ_LEN] > 0:
            t = now + max(0.0, fst[_CVEND] - cnow) / crate
            if t < best:
                best, what = t, 3
        if r_cpu >= 0:
            t = now + max(0.0, v_cpu - wnow) / wrate
            if t < t_hop or (t == t_hop and k_cpu < k_hop):
                t_hop, r_hop, k_hop = t, r_cpu, k_cpu
        if r_hop >= 0 and t_hop < best:
            best, who = t_hop, r_hop
            what = 5 if rep[r_hop, _PHASE] == _SERVING else 4
        if what < 0:
            break
        ist[_IN_ROUTER] = 0
        if best > now:
            fst[_VNOW] = vnow + (best - now) * rate
            fst[_CNOW] = cnow + (best - now) * crate
            fst[_WNOW] = wnow + (best - now) * wrate
            if ist[_RJ_LEN] > 0:
                router_busy += best - now
            now = best

        if what == 0:  # a query leaves the client, or (no client) reaches the router
            q = enter_q[next_arr]
            next_arr += 1
            if client_cpu > 0.0:
                _client_add(cj_kind, cj_ref, ist, fst, _SEND, q, half_client)
            else:
                _router_add(rj_kind, rj_ref, rj_cost, ist, fst, _REQ_IN, q, 0.5 * fst[_REQ_CPU])
        elif what == 1:  # a request reaches the router, or an answer the client
            kind, q = heap_k[0], heap_q[0]
            _heap_pop(heap_t, heap_s, heap_k, heap_q, ist)
            if kind == _REACH_ROUTER:
                _router_add(rj_kind, rj_ref, rj_cost, ist, fst, _REQ_IN, q, 0.5 * fst[_REQ_CPU])
            else:
                _client_add(cj_kind, cj_ref, ist, fst, _RECV, q, half_client)
        elif what == 3:  # the client finished sending or receiving
            head = ist[_CJ_HEAD]
            kind, q = cj_kind[head], cj_ref[head]
            ist[_CJ_HEAD] = (head + 1) % cj_kind.shape[0]
            ist[_CJ_LEN] -= 1
            fst[_CVEND] = fst[_CNOW] + half_client
            if kind == _SEND:
                at = now + 0.5 * requests[q]
                _heap_push(heap_t, heap_s, heap_k, heap_q, ist, at, _REACH_ROUTER, q)
            else:
                answered[q] = now
        elif what == 4:  # half a hop is over
            r = who
            m = rep[r, _STAGE]
            if rep[r, _PHASE] == _HOP_OUT:
                # The worker has the batch: model time, idle penalty, its own CPU.
                gap = now - repf[r, _LAST_END]
                k_pts = idle_gap.shape[1]
                extra = idle_extra[m, k_pts - 1]
                for j in range(1, k_pts):
                    if gap < idle_gap[m, j]:
                        w = (gap - idle_gap[m, j - 1]) / (idle_gap[m, j] - idle_gap[m, j - 1])
                        extra = idle_extra[m, j - 1] + (idle_extra[m, j] - idle_extra[m, j - 1]) * w
                        break
                b = rep[r, _BATCH]
                service = tables[m, rep[r, _K], cols[m, b]] * scales[m, b]
                repf[r, _VEND] = fst[_WNOW] + service + extra + worker_cpu
                rep[r, _PHASE] = _SERVING
            else:
                rep[r, _PHASE] = _WAIT_RESULT
                cost = 0.5 * (fst[_BATCH_CPU] + fst[_ITEM_CPU] * rep[r, _K])
                _router_add(rj_kind, rj_ref, rj_cost, ist, fst, _RESULT, r, cost)
        elif what == 5:  # a worker finished its batch
            r = who
            repf[r, _LAST_END] = now
            rep[r, _PHASE] = _HOP_BACK
            repf[r, _T_END] = now + 0.5 * hops[rep[r, _STAGE], rep[r, _BATCH]]
        else:  # the router finished a job
            head = ist[_RJ_HEAD]
            kind, ref = rj_kind[head], rj_ref[head]
            ist[_RJ_HEAD] = (head + 1) % rcap
            ist[_RJ_LEN] -= 1
            if ist[_RJ_LEN] > 0:
                fst[_RVEND] = fst[_VNOW] + rj_cost[ist[_RJ_HEAD]]
            ist[_IN_ROUTER] = 1  # what this job queues on the router runs in its wake
            if kind == _DISPATCH:
                rep[ref, _PHASE] = _HOP_OUT
                repf[ref, _T_END] = now + 0.5 * hops[rep[ref, _STAGE], rep[ref, _BATCH]]
            elif kind == _REQ_OUT:
                at = now + 0.5 * requests[ref]
                if client_cpu > 0.0:
                    _heap_push(heap_t, heap_s, heap_k, heap_q, ist, at, _REACH_CLIENT, ref)
                else:
                    answered[ref] = at
            elif kind == _REQ_IN:
                _finish(
                    ref, -1, now, visits, child_ptr, child_idx, n_deps, output, pending, stack,
                    qbuf, visited, stg, rep, repf, idle_buf, rj_kind, rj_ref, rj_cost, ist, fst,
                )  # fmt: skip
            else:  # _RESULT: the replica is free (and takes queued work), its items done
                r = ref
                m = rep[r, _STAGE]
                busy[m] += now - repf[r, _T_DISP]
                rep[r, _PHASE] = _IDLE
                slot = (stg[m, _IDLE_HEAD] + stg[m, _IDLE_COUNT]) % stg[m, _REPLICAS]
                idle_buf[stg[m, _FIRST] + slot] = r
                stg[m, _IDLE_COUNT] += 1
                first, count = rep[r, _LO], rep[r, _K]
                _dispatch(
                    m, now, stg, rep, repf, idle_buf, qbuf, rj_kind, rj_ref, rj_cost, ist, fst
                )
                for i in range(first, first + count):
                    _finish(
                        qbuf[m, i], m, now, visits, child_ptr, child_idx, n_deps, output,
                        pending, stack, qbuf, visited, stg, rep, repf, idle_buf, rj_kind,
                        rj_ref, rj_cost, ist, fst,
                    )  # fmt: skip
            if ist[_RJ_LEN] == 0:
                fst[_RIDLE] = now
        if ist[_WOKEN]:  # the job that woke the router pays for the time it sat idle
            ist[_WOKEN] = 0
            extra = idle_penalty(router_idle, now - fst[_RIDLE])
            rj_cost[ist[_RJ_HEAD]] += extra
            fst[_RVEND] += extra
            fst[_RCPU] += extra
    for m in range(n_stages):
        counts[m, 0] = visited[m]
        counts[m, 1] = stg[m, _NBATCH]
    router_out[0], router_out[1] = router_busy, fst[_RCPU]


def simulate_shared(inputs: SharedInputs) -> SharedRun:
    """Run the shared simulation (see the module doc)."""
    arrivals = inputs.arrivals_s
    n = arrivals.shape[0]
    n_stages = inputs.max_batch.shape[0]
    answered = np.full(n, np.nan)
    counts = np.zeros((n_stages, 2), dtype=np.int64)
    busy = np.zeros(n_stages, dtype=np.float64)
    router = np.zeros(2, dtype=np.float64)
    if inputs.client_cpu_s > 0.0:
        enter_q = np.arange(n, dtype=np.int64)
        enter_t = np.ascontiguousarray(arrivals)
    else:
        # Without a client to queue at, a request reaches the router half its request
        # path after it is sent: known in advance, so they enter in that order.
        reach = arrivals + 0.5 * inputs.requests
        enter_q = np.argsort(reach, kind="stable").astype(np.int64)
        enter_t = np.ascontiguousarray(reach[enter_q])
    _simulate(
        enter_t,
        enter_q,
        inputs.visits,
        inputs.child_ptr,
        inputs.child_idx,
        inputs.n_deps,
        inputs.output,
        inputs.max_batch,
        inputs.replicas,
        inputs.replica_cores,
        inputs.tables,
        inputs.cols,
        inputs.scales,
        inputs.hops,
        inputs.idle_gap,
        inputs.idle_extra,
        inputs.requests,
        inputs.router_cpu_s,
        inputs.router_idle,
        float(inputs.worker_cpu_s),
        float(inputs.client_cpu_s),
        float(inputs.cores),
        float(inputs.worker_weight),
        answered,
        counts,
        busy,
        router,
    )
    return SharedRun(
        answered,
        counts[:, 0].copy(),
        counts[:, 1].copy(),
        busy,
        float(router[0]),
        float(router[1]),
    )
