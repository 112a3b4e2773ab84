"""The closed-loop simulator's engine: the router's dispatch with replica counts that change
over time, driven by a scaling policy (InferLine §5 tuner, §7 evaluation).

The planner's estimator (:mod:`sloline.planner.estimator`) simulates one *static*
configuration stage by stage. A tuner couples the stages through time — its decisions
depend on queue lengths and arrivals so far, and change the replicas every stage serves
with — so this is one global event simulation of the same dispatch semantics
(docs/architecture.md, "One request"):

- one FIFO queue per stage; an idle replica takes ``min(queue, max_batch)`` items; a batch
  occupies its replica for the profiled service time of (hardware, batch) plus the hop;
- a stage becomes ready for a query when all its dependencies completed or were skipped;
  conditional routing replays the :class:`~sloline.planner.estimator.Workload`'s visits;
- ties at one instant follow the router and the estimator exactly: items ready at the
  same instant are pushed in query order and each push goes at once, alone, to a replica
  that was already idle; replicas that finish (or become ready) at that instant then take
  batches of everything queued. With a static policy the per-query latencies equal the
  estimator's bit for bit (``tests/unit/tuner/test_simulate.py``).

What changes over time. Every ``tick_s`` the policy sees an
:class:`~sloline.lab.loop.Observation` (queue lengths, busy and ready replica-seconds
and mean ongoing requests over the last tick, how long each replica has been idle,
requests in the system, and — for the InferLine tuner — the streaming traffic envelope
of the arrivals so far) and returns a target replica count per stage. A scale-up starts
replicas that serve only after ``activation_delay_s`` (5 s in InferLine §5) but are paid
for from the decision on; the desired count (ready + starting) is what the policy sees
and sets, so a replica that is starting is never requested twice. A scale-down takes
effect at once: it cancels starting replicas first (youngest first), then removes idle
ones (youngest first), then marks busy ones to leave after their batch — queued work
always stays queued, so no query is ever dropped. Idle replicas take work lowest id
first (index packing, as AutoScale's load balancer does), which leaves the youngest
replicas idle to be removed. A target may also be a configuration (another hardware class
or max batch, :mod:`sloline.tuner.replan`): its replicas start as a scale-up's; the stage's
current replicas serve on, each with its own batch limit and service times, uncounted,
until every new one serves, then leave as a scale-down's (a rolling update with surge).
Cost is billed per replica at its own hardware's price.

Pure: no I/O, no clock, no global state; deterministic for the same inputs and seed
(heap ties break by sequence number).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sloline.common.envelope import StreamingEnvelope
from sloline.lab.fleet import Config, Replica, Stage
from sloline.lab.loop import Observation, Policy, Run, ScaleEvent, StageView, Targets
from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload
from sloline.planner.profile import PipelineProfile
from sloline.planner.sim.draws import ServiceMode, service_draws
from sloline.planner.sim.rule import dependants, release
from sloline.planner.topology import Topology

__all__ = ["EngineSettings", "run_closed_loop"]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Simulation constants; defaults are InferLine's (§5: 1 s tuner period, 5 s activation)."""

    tick_s: float = 1.0
    activation_delay_s: float = 5.0
    service: ServiceMode = "p50"
    seed: int = 0
    envelope_lookback_s: float = 60.0
    lambda_window_s: float = 5.0
    lambda_lookback_s: float = 30.0
    prices_per_hour: Mapping[str, float] = field(default_factory=dict)  # per hardware class

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tick_s) and self.tick_s > 0.0):
            raise ValueError(f"tick_s must be > 0 seconds, got {self.tick_s!r}")
        if not (math.isfinite(self.activation_delay_s) and self.activation_delay_s >= 0.0):
            raise ValueError(
                f"activation_delay_s must be >= 0 seconds, got {self.activation_delay_s!r}"
            )


class _Graph:
    """The pipeline's stages as :func:`~sloline.planner.sim.rule.release` takes them, with
    how many dependencies each query still waits on at each stage."""

    __slots__ = (
        "child_idx",
        "child_ptr",
        "n_deps",
        "output",
        "pending",
        "ready",
        "stack",
        "visits",
    )

    def __init__(self, topology: Topology, workload: Workload) -> None:
        self.child_ptr, self.child_idx = dependants(topology)
        self.n_deps = np.array([len(deps) for deps in topology.deps], dtype=np.int64)
        self.output = topology.output
        self.visits = np.ascontiguousarray(workload.visits).reshape(-1)
        self.pending = np.tile(self.n_deps.astype(np.int32), workload.size)
        self.stack = np.zeros(len(topology), dtype=np.int64)
        self.ready = np.zeros(len(topology) + 1, dtype=np.int64)

    def release(self, q: int, m: int) -> list[int]:
        """Stage m is done for query q (m = -1: q arrived): the stages q is now queued
        at, in order, and -1 when q is answered."""
        count = release(
            q, m, self.pending, self.visits, self.child_ptr, self.child_idx, self.n_deps,
            self.output, self.stack, self.ready,
        )  # fmt: skip
        return list(self.ready[:count].tolist())


class _Simulation:
    """The event loop. Heap entries are (time, sequence, stage, replica, batch); a batch
    of None is an activation."""

    def __init__(
        self,
        topology: Topology,
        profile: PipelineProfile,
        workload: Workload,
        policy: Policy,
        settings: EngineSettings,
    ) -> None:
        if len(policy.config) != len(topology):
            raise ValueError(
                f"policy {policy.name!r} configures {len(policy.config)} stages, the "
                f"pipeline has {len(topology)}"
            )
        self.topology = topology
        self.policy = policy
        self.settings = settings
        self.n_stages = len(topology)
        self.arrivals_s = workload.arrivals_s
        self.arrivals = workload.arrivals_s.tolist()
        self.graph = _Graph(topology, workload)
        self.latency = [math.nan] * workload.size
        self.profile = profile
        self.visits_m = [int(np.count_nonzero(workload.visits[:, m])) for m in range(len(topology))]
        self.stages: list[Stage] = []
        for m, cfg in enumerate(policy.config):
            stage = Stage(self._config(m, cfg))
            for _ in range(cfg.replicas):
                stage.new_replica(serving=True, now=0.0)
            self.stages.append(stage)
        self.heap: list[tuple[float, int, int, Replica, list[int] | None]] = []
        self.seq = 0
        self.pushes: list[list[int]] = [[] for _ in range(self.n_stages)]
        self.touched: list[int] = []  # stages with pushes at this instant
        self.freed: list[tuple[int, Replica]] = []
        self.in_system = 0
        self.sys_area = 0.0
        self.sys_last = 0.0
        self.events: list[ScaleEvent] = []
        self.next_q = 0  # next arrival to process
        self.fed_q = 0  # next arrival to show the policy
        self.sys_snap = 0.0

    # -- replicas -------------------------------------------------------------------------

    def _config(self, m: int, cfg: StageConfig) -> Config:
        settings = self.settings
        draws = service_draws(
            self.profile.stage(self.topology.stages[m], cfg.hardware),
            cfg.max_batch,
            settings.service,
            self.profile.hop_s,
            self.visits_m[m],
            seed=settings.seed,
            stage=m,
        )
        fixed = None
        if not draws.cols.size and not draws.scales.size:
            fixed = [draws.time_s(0, k) for k in range(draws.table_s.shape[0])]
        return Config(cfg, draws, fixed, settings.prices_per_hour.get(cfg.hardware, 0.0))

    def _reconfigure(self, m: int, cfg: StageConfig, now: float) -> None:
        """Serve stage m with ``cfg`` from now on: ``cfg.replicas`` new replicas start; the
        current ones serve on, uncounted, until all of them serve (:meth:`Stage.handover`)."""
        stage = self.stages[m]
        stage.acc(now)
        current = stage.desired
        stage.reconfigure(self._config(m, cfg))
        self.events.append(ScaleEvent(now, self.topology.stages[m], current, cfg.replicas, cfg))
        for _ in range(cfg.replicas):
            self._start(m, stage, now)

    def _start(self, m: int, stage: Stage, now: float) -> None:
        replica = stage.new_replica(serving=False, now=now)
        ready_at = now + self.settings.activation_delay_s
        heapq.heappush(self.heap, (ready_at, self.seq, m, replica, None))
        self.seq += 1

    def _scale(self, m: int, target: int, now: float) -> None:
        stage = self.stages[m]
        stage.acc(now)
        current = stage.desired
        if target == current:
            return
        self.events.append(ScaleEvent(now, self.topology.stages[m], current, target))
        for _ in range(stage.scale(target)):
            self._start(m, stage, now)

    # -- queries --------------------------------------------------------------------------

    def _finish(self, q: int, m: int, t: float) -> None:
        """Stage m completed query q at t (m = -1: q arrived): q goes to the stages ready
        for it (the dispatch rule's :func:`~sloline.planner.sim.rule.release`), and is
        answered once the output stage is done."""
        for c in self.graph.release(q, m):
            if c < 0:
                self.latency[q] = t - self.arrivals[q]
                self._system(t, -1)
                continue
            items = self.pushes[c]
            if not items:
                self.touched.append(c)
            items.append(q)

    def _arrive(self, q: int, t: float) -> None:
        self._system(t, 1)
        self._finish(q, -1, t)

    def _system(self, t: float, delta: int) -> None:
        self.sys_area += self.in_system * (t - self.sys_last)
        self.sys_last = t
        self.in_system += delta

    def _dispatch(self, m: int, stage: Stage, replica: Replica, batch: list[int], t: float) -> None:
        k, cfg = len(batch), replica.cfg
        if cfg.occupancy is not None:
            duration = cfg.occupancy[k]
        else:
            duration = cfg.draws.time_s(stage.batches, k)
        stage.batches += 1
        stage.busy += 1
        stage.in_service += k
        replica.busy = True
        heapq.heappush(self.heap, (t + duration, self.seq, m, replica, batch))
        self.seq += 1

    def _instant(self, t: float) -> None:
        """Everything that happens at time t, in the router's order: arrivals and batch
        completions release items; the pushes go, in query order, alone to replicas idle
        before t or into the queue; then replicas freed at t take batches."""
        arrivals, n = self.arrivals, len(self.arrivals)
        while self.next_q < n and arrivals[self.next_q] == t:
            self._arrive(self.next_q, t)
            self.next_q += 1
        heap = self.heap
        while heap and heap[0][0] == t:
            _, _, m, replica, batch = heapq.heappop(heap)
            self._complete(m, replica, batch, t)
        for m in self.touched:
            items = self.pushes[m]
            self._push(m, items, t)
            items.clear()
        self.touched.clear()
        freed = self.freed
        if len(freed) > 1:
            freed.sort(key=lambda f: (f[0], f[1].rid))
        for m, replica in freed:
            if not replica.alive:  # handed over at this instant
                continue
            stage = self.stages[m]
            queue = stage.queue
            if queue:
                k = min(len(queue), replica.cfg.max_batch)
                self._dispatch(m, stage, replica, [queue.popleft() for _ in range(k)], t)
            else:
                heapq.heappush(stage.idle, replica.rid)
        freed.clear()

    def _complete(self, m: int, replica: Replica, batch: list[int] | None, t: float) -> None:
        stage = self.stages[m]
        stage.acc(t)
        if batch is None:  # an activation
            if replica.alive:
                replica.serving = True
                replica.idle_since = t
                stage.n_starting -= 1
                stage.n_ready += 1
                self.freed.append((m, replica))
                stage.handover()
            return
        stage.busy -= 1
        stage.in_service -= len(batch)
        replica.busy = False
        replica.idle_since = t
        if replica.retiring:
            stage.remove(replica)
        else:
            self.freed.append((m, replica))
        for q in batch:
            self._finish(q, m, t)

    def _push(self, m: int, items: list[int], t: float) -> None:
        stage = self.stages[m]
        stage.acc(t)
        idle = stage.idle
        if len(items) > 1:
            items.sort()
        elif not idle:
            stage.queue.append(items[0])
            return
        start = 0
        while idle and start < len(items):  # an idle replica takes a lone item
            replica = stage.replicas[heapq.heappop(idle)]
            self._dispatch(m, stage, replica, [items[start]], t)
            start += 1
        stage.queue.extend(items[start:])

    # -- policy ---------------------------------------------------------------------------

    def _observe(self, t: float, envelope: StreamingEnvelope | None) -> Observation:
        tick = self.settings.tick_s
        views = []
        for name, stage in zip(self.topology.stages, self.stages, strict=True):
            stage.acc(t)
            ong, busy, ready = stage.snap
            stage.snap = (stage.ong_area, stage.busy_area, stage.ready_area)
            idle_for = tuple(
                0.0 if r.busy else t - r.idle_since
                for r in stage.replicas.values()
                if r.serving and not r.retiring and r.cfg is stage.cfg
            )
            views.append(
                StageView(
                    name=name,
                    desired=stage.desired,
                    ready=stage.n_ready,
                    starting=stage.n_starting,
                    queued=len(stage.queue),
                    in_service=stage.in_service,
                    mean_ongoing=(stage.ong_area - ong) / tick,
                    busy_replica_s=stage.busy_area - busy,
                    ready_replica_s=stage.ready_area - ready,
                    idle_for_s=idle_for,
                )
            )
        self._system(t, 0)
        mean_in_system = (self.sys_area - self.sys_snap) / tick
        self.sys_snap = self.sys_area
        env = lambdas = None
        if envelope is not None:
            envelope.observe_many(self.arrivals_s[self.fed_q : self.next_q])
            env, lambdas = envelope.envelope(t), envelope.lambdas(t)
        recent = None
        if self.policy.arrivals_lookback_s > 0.0:
            seen = self.arrivals_s[: self.next_q]
            recent = seen[np.searchsorted(seen, t - self.policy.arrivals_lookback_s) :]
        arrived = self.next_q - self.fed_q
        self.fed_q = self.next_q
        return Observation(
            now_s=t,
            tick_s=tick,
            stages=tuple(views),
            arrivals=arrived,
            in_system=self.in_system,
            mean_in_system=mean_in_system,
            envelope=env,
            lambdas_rps=lambdas or (),
            recent_arrivals_s=recent,
        )

    def run(self, duration_s: float) -> Run:
        settings, policy = self.settings, self.policy
        tick = settings.tick_s
        n_ticks = max(1, math.ceil(duration_s / tick - 1e-9))
        envelope = None
        if policy.envelope_windows_s:
            envelope = StreamingEnvelope(
                policy.envelope_windows_s,
                start_s=0.0,
                lookback_s=settings.envelope_lookback_s,
                lambda_window_s=settings.lambda_window_s,
                lambda_lookback_s=settings.lambda_lookback_s,
            )
        state = policy.state
        replica_s: tuple[float, ...] = ()
        cost_usd = 0.0
        cost_rate: list[float] = []
        desired: list[list[int]] = []
        ready: list[list[int]] = []
        billed: list[list[int]] = []
        k = 1
        n = len(self.arrivals)
        while True:
            t_next = min(
                self.arrivals[self.next_q] if self.next_q < n else math.inf,
                self.heap[0][0] if self.heap else math.inf,
            )
            t_tick = k * tick
            if k <= n_ticks and t_tick < t_next:
                observation = self._observe(t_tick, envelope)
                if policy.step is not None:
                    targets, state = policy.step(observation, state)
                    self._apply(targets, t_tick)
                desired.append([s.desired for s in self.stages])
                ready.append([s.n_ready for s in self.stages])
                billed.append([s.billed for s in self.stages])
                cost_rate.append(sum(s.cost_rate for s in self.stages))
                if k == n_ticks:
                    replica_s = tuple(s.billed_area for s in self.stages)
                    cost_usd = sum(s.cost_area for s in self.stages) / 3600.0
                k += 1
                continue
            if t_next == math.inf:
                break
            self._instant(t_next)
        ticks = np.arange(1, n_ticks + 1, dtype=np.float64) * tick
        return Run(
            latencies_s=np.array(self.latency, dtype=np.float64),
            ticks_s=ticks,
            desired=np.array(desired, dtype=np.int64),
            ready=np.array(ready, dtype=np.int64),
            billed=np.array(billed, dtype=np.int64),
            replica_s=replica_s,
            cost_usd=cost_usd,
            cost_per_hour=np.array(cost_rate, dtype=np.float64),
            horizon_s=float(ticks[-1]),
            events=tuple(self.events),
        )

    def _apply(self, targets: Targets, now: float) -> None:
        counts = [t.replicas if isinstance(t, StageConfig) else t for t in targets]
        if len(targets) != self.n_stages or any(r < 1 for r in counts):
            raise ValueError(
                f"policy {self.policy.name!r} returned targets {targets}: need one count "
                f">= 1 or one configuration per stage ({self.n_stages} stages)"
            )
        for m, target in enumerate(targets):
            current = self.stages[m].cfg.config
            if isinstance(target, StageConfig) and (target.hardware, target.max_batch) != (
                current.hardware,
                current.max_batch,
            ):
                self._reconfigure(m, target, now)
            else:
                self._scale(
                    m, int(target.replicas if isinstance(target, StageConfig) else target), now
                )


def run_closed_loop(
    topology: Topology,
    profile: PipelineProfile,
    workload: Workload,
    policy: Policy,
    duration_s: float,
    settings: EngineSettings | None = None,
) -> Run:
    """Simulate ``workload`` through the pipeline under ``policy`` for ticks up to
    ``duration_s`` (the trace's length), then drain: every query is answered.

    The policy is called at t = tick, 2·tick, ... ≤ ceil(duration / tick)·tick, after
    every event at that instant; its targets apply at once (scale-down) or after the
    activation delay (scale-up). Billed replica-seconds are integrated up to the last tick.
    """
    return _Simulation(topology, profile, workload, policy, settings or EngineSettings()).run(
        duration_s
    )
