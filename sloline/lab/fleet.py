"""One stage's replicas over time, for the closed-loop engine (:mod:`sloline.lab.engine`):
replicas start, serve and leave as the policy's targets change.

A scale-up starts replicas (the engine activates them after its delay); the desired count
(ready + starting) is what the policy sees and sets. A scale-down takes effect at once: it
cancels starting replicas first (youngest first), then removes idle ones (youngest first),
then marks busy ones to leave after their batch. A reconfiguration starts the new
configuration's replicas while the current ones serve on, uncounted, until every new one
serves (:meth:`Stage.handover`).
"""

from __future__ import annotations

import heapq
from collections import deque

from sloline.planner.config import StageConfig
from sloline.planner.sim.draws import ServiceDraws

__all__ = ["Config", "Replica", "Stage"]


class Config:
    """One configuration a stage's replicas serve with (a stage has several only while a
    reconfiguration hands over): batch limit, service draws, price per hour."""

    __slots__ = ("config", "draws", "max_batch", "occupancy", "price")

    def __init__(
        self, config: StageConfig, draws: ServiceDraws, occupancy: list[float] | None, price: float
    ) -> None:
        self.config = config
        self.max_batch = config.max_batch
        self.draws = draws
        self.occupancy = occupancy  # per batch size, when service times are fixed
        self.price = price


class Replica:
    __slots__ = ("alive", "busy", "cfg", "idle_since", "retiring", "rid", "serving")

    def __init__(self, rid: int, cfg: Config, serving: bool, now: float) -> None:
        self.rid = rid
        self.cfg = cfg
        self.serving = serving  # activated (not starting)
        self.alive = True
        self.busy = False
        self.retiring = False
        self.idle_since = now


class Stage:
    """Runtime state of one stage; ``acc`` integrates the counts over time.

    ``cfg`` is the configuration new replicas get. After a reconfiguration the replicas of
    earlier ones (``old``) keep serving, uncounted, until every replica of the new one
    serves; then they leave as a scale-down's do."""

    __slots__ = (
        "batches", "billed", "billed_area", "busy", "busy_area", "cfg", "cost_area",
        "cost_rate", "idle", "in_service", "last", "n_ready", "n_starting", "next_rid",
        "old", "ong_area", "queue", "ready_area", "replicas", "snap",
    )  # fmt: skip

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.old = 0  # replicas of earlier configurations still serving
        self.queue: deque[int] = deque()
        self.idle: list[int] = []  # heap of idle serving replica ids
        self.replicas: dict[int, Replica] = {}
        self.next_rid = 0
        self.batches = self.in_service = self.busy = 0
        self.n_ready = self.n_starting = self.billed = 0
        self.last = 0.0
        self.ong_area = self.busy_area = self.ready_area = self.billed_area = 0.0
        self.cost_rate = self.cost_area = 0.0  # $ per hour of the billed replicas, integral
        self.snap = (0.0, 0.0, 0.0)  # areas at the last tick

    @property
    def desired(self) -> int:
        """Replicas counted: ready and starting."""
        return self.n_ready + self.n_starting

    def acc(self, t: float) -> None:
        dt = t - self.last
        if dt > 0.0:
            self.ong_area += (len(self.queue) + self.in_service) * dt
            self.busy_area += self.busy * dt
            self.ready_area += self.n_ready * dt
            self.billed_area += self.billed * dt
            self.cost_area += self.cost_rate * dt
            self.last = t

    def new_replica(self, *, serving: bool, now: float) -> Replica:
        replica = Replica(self.next_rid, self.cfg, serving, now)
        self.next_rid += 1
        self.replicas[replica.rid] = replica
        self.billed += 1
        self.cost_rate += replica.cfg.price
        if serving:
            self.n_ready += 1
            heapq.heappush(self.idle, replica.rid)
        else:
            self.n_starting += 1
        return replica

    def remove(self, replica: Replica) -> None:
        replica.alive = False
        del self.replicas[replica.rid]
        self.billed -= 1
        self.cost_rate -= replica.cfg.price
        if replica.cfg is not self.cfg:  # an earlier configuration's, never counted
            self.old -= 1
        elif not replica.serving:
            self.n_starting -= 1
        elif not replica.retiring:  # a leaving replica was no longer counted as ready
            self.n_ready -= 1

    def reconfigure(self, cfg: Config) -> None:
        """New replicas get ``cfg`` from now on: the current configuration's starting
        replicas are cancelled, its serving ones serve on, uncounted, until
        :meth:`handover`."""
        for replica in list(self.replicas.values()):
            if replica.cfg is self.cfg:
                if not replica.serving:  # never served: cancelled outright
                    self.remove(replica)
                    continue
                self.old += 1
                if not replica.retiring:
                    self.n_ready -= 1
        self.cfg = cfg

    def handover(self) -> None:
        """Once every replica of the stage's configuration serves, the earlier
        configurations' replicas leave: idle ones at once, busy ones after their batch."""
        if not self.old or self.n_starting:
            return
        for replica in list(self.replicas.values()):
            if replica.cfg is self.cfg:
                continue
            if replica.busy:
                replica.retiring = True
            else:  # idle, or freed at this instant and not yet idle
                if replica.rid in self.idle:
                    self.idle.remove(replica.rid)
                self.remove(replica)
        heapq.heapify(self.idle)

    def scale(self, target: int) -> int:
        """Count ``target`` replicas; returns how many new ones must start. Up: the
        leaving ones stay first (they run already). Down: starting ones are cancelled,
        then idle ones leave, then busy ones after their batch (youngest first)."""
        current = self.desired
        if target > current:
            add = target - current
            leaving = [r for r in self.replicas.values() if r.retiring and r.cfg is self.cfg]
            for replica in leaving[:add]:
                replica.retiring = False
                self.n_ready += 1
                add -= 1
            return add
        drop = current - target
        live = [r for r in reversed(self.replicas.values()) if not r.retiring and r.cfg is self.cfg]
        for replica in [r for r in live if not r.serving][:drop]:
            self.remove(replica)
            drop -= 1
        idle = [r for r in live if r.serving and not r.busy][:drop]
        for replica in idle:
            self.idle.remove(replica.rid)
            self.remove(replica)
        heapq.heapify(self.idle)
        drop -= len(idle)
        for replica in [r for r in live if r.busy][:drop]:
            replica.retiring = True  # finishes its batch, then leaves
            self.n_ready -= 1
        self.handover()  # cancelled starters may complete one
        return 0
