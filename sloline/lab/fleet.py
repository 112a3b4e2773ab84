"""One stage's replicas over time, as the closed-loop engine (:mod:`sloline.lab.engine`)
counts and bills them; what each replica does lives in the event simulation, in the
replica slot it holds.

The desired count (ready + starting) is what the policy sees and sets. Replicas of an
earlier configuration (``old``) serve on, uncounted, until every replica of the stage's
configuration serves; a replica leaving after its batch (``retiring``) is no longer
counted as ready. Every replica is billed from its start to its removal.
"""

from __future__ import annotations

from sloline.planner.config import StageConfig

__all__ = ["Config", "Replica", "Stage"]


class Config:
    """One configuration a stage's replicas serve with (a stage has several only while a
    reconfiguration hands over): its row in the simulation's configuration arrays, and
    its price per hour."""

    __slots__ = ("config", "price", "row")

    def __init__(self, config: StageConfig, row: int, price: float) -> None:
        self.config = config
        self.row = row
        self.price = price


class Replica:
    __slots__ = ("alive", "cfg", "retiring", "rid", "serving", "slot")

    def __init__(self, rid: int, cfg: Config, slot: int, serving: bool) -> None:
        self.rid = rid
        self.cfg = cfg
        self.slot = slot  # in the event simulation
        self.serving = serving  # activated (not starting)
        self.alive = True
        self.retiring = False  # leaves after its batch


class Stage:
    """Counts of one stage; ``acc`` integrates them over time.

    ``cfg`` is the configuration new replicas get; ``replicas`` are in start order."""

    __slots__ = (
        "billed", "billed_area", "cfg", "cost_area", "cost_rate", "last", "n_ready",
        "n_starting", "next_rid", "old", "ready_area", "replicas", "snap",
    )  # fmt: skip

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.old = 0  # replicas of earlier configurations still serving
        self.replicas: dict[int, Replica] = {}
        self.next_rid = 0
        self.n_ready = self.n_starting = self.billed = 0
        self.last = 0.0
        self.ready_area = self.billed_area = 0.0
        self.cost_rate = self.cost_area = 0.0  # $ per hour of the billed replicas, integral
        self.snap = (0.0, 0.0, 0.0)  # items, busy and ready integrals at the last tick

    @property
    def desired(self) -> int:
        """Replicas counted: ready and starting."""
        return self.n_ready + self.n_starting

    def acc(self, t: float) -> None:
        dt = t - self.last
        if dt > 0.0:
            self.ready_area += self.n_ready * dt
            self.billed_area += self.billed * dt
            self.cost_area += self.cost_rate * dt
            self.last = t

    def add(self, slot: int, *, serving: bool) -> Replica:
        """A new replica of ``cfg`` in ``slot``: serving, or starting."""
        replica = Replica(self.next_rid, self.cfg, slot, serving)
        self.next_rid += 1
        self.replicas[replica.rid] = replica
        self.billed += 1
        self.cost_rate += self.cfg.price
        if serving:
            self.n_ready += 1
        else:
            self.n_starting += 1
        return replica

    def serves(self, replica: Replica) -> None:
        """A starting replica serves now."""
        replica.serving = True
        self.n_starting -= 1
        self.n_ready += 1

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

    def retire(self, replica: Replica) -> None:
        """``replica`` (busy) leaves after its batch: no longer counted."""
        if replica.cfg is self.cfg and not replica.retiring:
            self.n_ready -= 1
        replica.retiring = True

    def stay(self, replica: Replica) -> None:
        """A leaving replica of ``cfg`` stays, counted again."""
        replica.retiring = False
        self.n_ready += 1

    def reconfigure(self, cfg: Config) -> list[Replica]:
        """New replicas get ``cfg`` from now on; the current configuration's serving
        replicas serve on, uncounted. Returns its starting ones, for the caller to
        cancel (:meth:`remove`)."""
        starting = []
        for replica in self.replicas.values():
            if replica.cfg is self.cfg:
                if not replica.serving:
                    starting.append(replica)
                    continue
                self.old += 1
                if not replica.retiring:
                    self.n_ready -= 1
        for replica in starting:
            self.remove(replica)
        self.cfg = cfg
        return starting
