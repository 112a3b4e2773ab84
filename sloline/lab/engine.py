"""The closed-loop simulator's engine: the pipeline served with replica counts that change
over time, driven by a scaling policy (InferLine §5 tuner, §7 evaluation).

It runs the planner's own event simulation (:mod:`sloline.planner.sim.pipeline`, the
estimator's for a profile with a serving overhead) in segments, changing the replicas
between them, so a closed loop pays what serving and the estimator pay: the router as a
FIFO server (its CPU per request, batch and item, its idle penalty), hops and request
paths, cores shared by the router and the workers, workers' idle penalties, and the
plan's routers (:attr:`~sloline.lab.loop.Policy.routers`). A profile without a measured
overhead is simulated with a router that costs nothing and its constant hop, the
estimator's stage-by-stage model. With a static policy the per-query latencies equal the
estimator's (``tests/unit/lab/test_simulate.py``).

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
always stays queued, so no query is ever dropped. A new replica is a cold worker (its
stage's idle penalty) and joins the end of its stage's idle ring: idle replicas take
work longest idle first, the router's rule, or lowest slot first for a policy whose own
load balancer packs (:attr:`~sloline.lab.loop.Policy.index_packing`, AutoScale). A
target may also be a configuration (another hardware class or max batch,
:mod:`sloline.tuner.replan`): its replicas start as a scale-up's; the stage's current
replicas serve on, each with its own batch limit and service times, uncounted, until
every new one serves, then leave as a scale-down's (a rolling update with surge). Cost
is billed per replica at its own hardware's price.

Pure: no I/O, no clock, no global state; deterministic for the same inputs and seed.
"""

from __future__ import annotations

import dataclasses
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
from sloline.planner.overhead import ServingOverhead
from sloline.planner.profile import PipelineProfile
from sloline.planner.routed import routed_inputs, with_configurations
from sloline.planner.sim.draws import ServiceMode
from sloline.planner.sim.pipeline import Segments
from sloline.planner.sim.state import IDLE, OFF
from sloline.planner.topology import Topology

__all__ = ["EngineSettings", "run_closed_loop", "simulated_profile"]


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


def simulated_profile(profile: PipelineProfile) -> PipelineProfile:
    """``profile`` as the event simulation takes it: one without a measured serving
    overhead gets a router that costs nothing, its constant hop and no request path
    (the estimator's stage-by-stage model)."""
    if profile.overhead is not None:
        return profile
    free = ServingOverhead(0.0, 0.0, 0.0, 0.0, (profile.hop_s,), (0.0,))
    return dataclasses.replace(profile, overhead=free)


class _Simulation:
    """The closed loop around the event simulation (:class:`Segments`): activations
    waiting in a heap of (time, sequence, stage, replica), the policy called every tick."""

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
        self.profile = simulated_profile(profile)
        self.policy = policy
        self.settings = settings
        self.n_stages = len(topology)
        self.arrivals_s = workload.arrivals_s
        self.rows: dict[tuple[int, str, int], int] = {}
        self.row_list: list[tuple[int, StageConfig]] = []
        configs = [self._config(m, cfg) for m, cfg in enumerate(policy.config)]
        inputs = routed_inputs(
            topology,
            self.profile,
            policy.config,
            workload,
            settings.service,
            settings.seed,
            policy.routers,
        )
        n_on = sum(c.replicas for c in policy.config)
        self.sim = Segments(inputs, slots=2 * n_on, packing=policy.index_packing)
        self.free = list(range(n_on, 2 * n_on))  # a heap of free slots
        self.stages = [Stage(cfg) for cfg in configs]
        for slot, m in enumerate(self.sim.state.rep["stage"][:n_on].tolist()):
            self.stages[m].add(slot, serving=True)
        self.pending: list[tuple[float, int, int, Replica]] = []
        self.seq = 0
        self.events: list[ScaleEvent] = []
        self.fed_q = 0  # next arrival to show the policy
        self.sys_snap = 0.0

    # -- replicas -------------------------------------------------------------------------

    def _config(self, m: int, cfg: StageConfig) -> Config:
        """Stage m's configuration ``cfg``, its row in the simulation's arrays (added when
        new: the caller hands the simulation the new rows)."""
        key = (m, cfg.hardware, cfg.max_batch)
        if key not in self.rows:
            self.rows[key] = len(self.row_list)
            self.row_list.append((m, cfg))
        price = self.settings.prices_per_hour.get(cfg.hardware, 0.0)
        return Config(cfg, self.rows[key], price)

    def _slot(self) -> int:
        if not self.free:
            n = self.sim.state.rep.shape[0]
            self.sim.grow(2 * n)
            self.free = list(range(n, 2 * n))
        return heapq.heappop(self.free)

    def _remove(self, stage: Stage, replica: Replica) -> None:
        stage.remove(replica)
        heapq.heappush(self.free, replica.slot)

    def _leave(self, stage: Stage, replica: Replica) -> None:
        """``replica`` (serving) leaves: at once when idle, else after its batch."""
        if self.sim.retire(replica.slot):
            self._remove(stage, replica)
        else:
            stage.retire(replica)

    def _start(self, m: int, stage: Stage, now: float) -> None:
        replica = stage.add(self._slot(), serving=False)
        heapq.heappush(self.pending, (now + self.settings.activation_delay_s, self.seq, m, replica))
        self.seq += 1

    def _activate(self, m: int, replica: Replica, now: float) -> None:
        if not replica.alive:  # cancelled while starting
            return
        stage = self.stages[m]
        stage.acc(now)
        stage.serves(replica)
        self.sim.activate(replica.slot, m, replica.cfg.row)
        self._handover(stage)

    def _handover(self, stage: Stage) -> None:
        """Once every replica of the stage's configuration serves, the earlier
        configurations' replicas leave: idle ones at once, busy ones after their batch."""
        if not stage.old or stage.n_starting:
            return
        for replica in list(stage.replicas.values()):
            if replica.cfg is not stage.cfg and not replica.retiring:
                self._leave(stage, replica)

    def _settle(self) -> None:
        """Remove the replicas that left after their batch, each at its time."""
        t_off = self.sim.state.rep["t_off"]
        phase = self.sim.state.rep["phase"]
        for stage in self.stages:
            gone = [r for r in stage.replicas.values() if r.retiring and phase[r.slot] == OFF]
            for replica in sorted(gone, key=lambda r: float(t_off[r.slot])):
                stage.acc(float(t_off[replica.slot]))
                self._remove(stage, replica)

    def _run_to(self, t: float) -> None:
        """Every event up to t, activations included, in time order."""
        pending = self.pending
        while pending and pending[0][0] <= t:
            at = pending[0][0]
            self.sim.run_until(at)
            self._settle()
            while pending and pending[0][0] == at:
                _, _, m, replica = heapq.heappop(pending)
                self._activate(m, replica, at)
        self.sim.run_until(t)
        self._settle()

    def _reconfigure(self, m: int, cfg: StageConfig, now: float) -> None:
        """Serve stage m with ``cfg`` from now on: ``cfg.replicas`` new replicas start; the
        current ones serve on, uncounted, until all of them serve (:meth:`_handover`)."""
        stage = self.stages[m]
        stage.acc(now)
        current = stage.desired
        rows = len(self.row_list)
        config = self._config(m, cfg)
        if len(self.row_list) > rows:
            self.sim.reconfigure(
                with_configurations(
                    self.sim.inputs,
                    self.topology,
                    self.profile,
                    self.row_list,
                    self.settings.service,
                    self.settings.seed,
                )
            )
        for replica in stage.reconfigure(config):
            heapq.heappush(self.free, replica.slot)
        self.events.append(ScaleEvent(now, self.topology.stages[m], current, cfg.replicas, cfg))
        for _ in range(cfg.replicas):
            self._start(m, stage, now)

    def _scale(self, m: int, target: int, now: float) -> None:
        """Count ``target`` replicas. Up: the leaving ones stay first (they run already),
        then new ones start. Down: starting ones are cancelled, then idle ones leave, then
        busy ones after their batch (youngest first)."""
        stage = self.stages[m]
        stage.acc(now)
        current = stage.desired
        if target == current:
            return
        self.events.append(ScaleEvent(now, self.topology.stages[m], current, target))
        mine = [r for r in stage.replicas.values() if r.cfg is stage.cfg]
        if target > current:
            add = target - current
            for replica in [r for r in mine if r.retiring][:add]:
                self.sim.stay(replica.slot)
                stage.stay(replica)
                add -= 1
            for _ in range(add):
                self._start(m, stage, now)
            return
        drop = current - target
        live = [r for r in reversed(mine) if not r.retiring]
        for replica in [r for r in live if not r.serving][:drop]:
            self._remove(stage, replica)
            drop -= 1
        phase = self.sim.state.rep["phase"]
        idle = [r for r in live if r.serving and phase[r.slot] == IDLE]
        busy = [r for r in live if r.serving and phase[r.slot] != IDLE]
        for replica in (idle + busy)[:drop]:
            self._leave(stage, replica)
        self._handover(stage)  # cancelled starters may complete one

    # -- policy ---------------------------------------------------------------------------

    def _observe(self, t: float, envelope: StreamingEnvelope | None) -> Observation:
        tick = self.settings.tick_s
        state = self.sim.state
        stg, rep, sim = state.stg, state.rep, state.sim[0]
        since = t - stg["last"]
        items = stg["ong_area"] + stg["ongoing"] * since
        busy = stg["busy_area"] + stg["n_busy"] * since
        sq = state.sq.reshape(-1, self.n_stages)
        queued = (sq["q_tail"] - sq["q_head"]).sum(axis=0)
        views = []
        for m, (name, stage) in enumerate(zip(self.topology.stages, self.stages, strict=True)):
            stage.acc(t)
            ong, was_busy, ready = stage.snap
            stage.snap = (float(items[m]), float(busy[m]), stage.ready_area)
            idle_for = tuple(
                t - float(rep["idle_since"][r.slot]) if rep["phase"][r.slot] == IDLE else 0.0
                for r in stage.replicas.values()
                if r.serving and not r.retiring and r.cfg is stage.cfg
            )
            views.append(
                StageView(
                    name=name,
                    desired=stage.desired,
                    ready=stage.n_ready,
                    starting=stage.n_starting,
                    queued=int(queued[m]),
                    in_service=int(stg["ongoing"][m] - queued[m]),
                    mean_ongoing=(float(items[m]) - ong) / tick,
                    busy_replica_s=float(busy[m]) - was_busy,
                    ready_replica_s=stage.ready_area - ready,
                    idle_for_s=idle_for,
                )
            )
        sys_area = float(sim["sys_area"] + sim["in_system"] * max(0.0, t - sim["sys_last"]))
        mean_in_system = (sys_area - self.sys_snap) / tick
        self.sys_snap = sys_area
        seen_q = int(np.searchsorted(self.arrivals_s, t, side="right"))
        env = lambdas = None
        if envelope is not None:
            envelope.observe_many(self.arrivals_s[self.fed_q : seen_q])
            env, lambdas = envelope.envelope(t), envelope.lambdas(t)
        recent = None
        if self.policy.arrivals_lookback_s > 0.0:
            seen = self.arrivals_s[:seen_q]
            recent = seen[np.searchsorted(seen, t - self.policy.arrivals_lookback_s) :]
        arrived = seen_q - self.fed_q
        self.fed_q = seen_q
        return Observation(
            now_s=t,
            tick_s=tick,
            stages=tuple(views),
            arrivals=arrived,
            in_system=int(sim["in_system"]),
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
        desired: list[list[int]] = []
        ready: list[list[int]] = []
        billed: list[list[int]] = []
        cost_rate: list[float] = []
        for k in range(1, n_ticks + 1):
            t_tick = k * tick
            self._run_to(t_tick)
            observation = self._observe(t_tick, envelope)
            if policy.step is not None:
                targets, state = policy.step(observation, state)
                self._apply(targets, t_tick)
            desired.append([s.desired for s in self.stages])
            ready.append([s.n_ready for s in self.stages])
            billed.append([s.billed for s in self.stages])
            cost_rate.append(sum(s.cost_rate for s in self.stages))
        replica_s = tuple(s.billed_area for s in self.stages)
        cost_usd = sum(s.cost_area for s in self.stages) / 3600.0
        self._run_to(math.inf)  # drain: every query is answered
        ticks = np.arange(1, n_ticks + 1, dtype=np.float64) * tick
        return Run(
            latencies_s=self.sim.answered - self.arrivals_s,
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
