"""A plan as data: per-stage configuration plus what the tuner needs (InferLine §4.3, §5).

The planner's output is stored in the pipeline resource's status, printed by
``sloline plan`` and read by the tuner, so it is plain data: frozen dataclasses that
round-trip losslessly through JSON/YAML-friendly dicts (camelCase keys, Kubernetes style).

Tuner quantities, defined so that Algorithms 3 and 4 come out right:

- ``throughput_rps`` is μ_m, the throughput of a *single replica* running full batches of
  ``max_batch``: max_batch / latency(max_batch) (§5, "single replica throughput μ_m");
- ``rho`` is the max-provisioning ratio rho_m = λ·s_m / (replicas·μ_m): the load the stage
  receives over the maximum throughput of the stage *in its current configuration*
  (all replicas). Algorithm 3's k_m = ceil(r_max·s_m / (μ_m·rho_m)) then equals
  ceil(replicas · r_max / λ): the planned replicas scaled by the rate increase;
- ``envelope`` is the planning trace's traffic envelope: max rate per window size, windows
  from the system service time T_s doubling up to 60 s (or the trace's span if shorter);
- ``routers`` is how many routers split the requests (the Kubernetes router Deployment's
  replicas), ``router_throughput_rps`` the requests per second one router's profiled CPU
  serves at the plan's estimated batch sizes (0: the router is not modelled), so that the
  routers' rho = λ / (routers · μ_router) scales them as Algorithm 3 scales a stage;
- ``devices`` is the device bound of each allowed class that has one
  (``PlanningProblem.hardware_devices``): the plan keeps it, and the tuner does too
  (:func:`sloline.tuner.sources.stage_tunings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sloline.common.envelope import Envelope
from sloline.planner.config import Config, StageConfig

__all__ = ["Plan", "StagePlan"]


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage's planned configuration and its tuner parameters."""

    name: str
    hardware: str
    max_batch: int
    replicas: int
    cost_per_hour: float  # replicas x hardware price
    throughput_rps: float  # μ_m: one replica, full batches of max_batch
    rho: float  # rho_m = λ·s_m / (replicas·μ_m)
    scale_factor: float  # s_m
    service_s: float  # profiled latency of a batch of max_batch
    mean_batch: float  # estimated on the planning trace
    utilisation: float  # estimated busy fraction of the replicas

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hardware": self.hardware,
            "maxBatch": self.max_batch,
            "replicas": self.replicas,
            "costPerHour": self.cost_per_hour,
            "throughputRps": self.throughput_rps,
            "rho": self.rho,
            "scaleFactor": self.scale_factor,
            "serviceSeconds": self.service_s,
            "meanBatch": self.mean_batch,
            "utilisation": self.utilisation,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StagePlan:
        return cls(
            name=str(data["name"]),
            hardware=str(data["hardware"]),
            max_batch=int(data["maxBatch"]),
            replicas=int(data["replicas"]),
            cost_per_hour=float(data["costPerHour"]),
            throughput_rps=float(data["throughputRps"]),
            rho=float(data["rho"]),
            scale_factor=float(data["scaleFactor"]),
            service_s=float(data["serviceSeconds"]),
            mean_batch=float(data["meanBatch"]),
            utilisation=float(data["utilisation"]),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's decision for a pipeline, with its estimated performance."""

    pipeline: str
    stages: tuple[StagePlan, ...]
    slo_s: float
    percentile: float  # the SLO percentile (99 for a P99 SLO)
    cost_per_hour: float
    p50_s: float  # estimated on the planning trace
    p99_s: float
    tail_s: float  # estimated latency at the SLO percentile (<= slo_s)
    attainment: float  # estimated fraction of queries within the SLO
    rate_rps: float  # λ, mean arrival rate of the planning trace
    envelope: Envelope  # of the planning trace
    headroom: float = 1.0
    """x*: the estimator says this configuration still meets the SLO on the planning
    trace played up to this many times faster (:func:`sloline.planner.describe.headroom`)."""
    routers: int = 1
    """How many routers split the requests (each keeps its own queue per stage)."""
    router_cost_per_hour: float = 0.0
    """All the routers' price (part of ``cost_per_hour``)."""
    router_throughput_rps: float = 0.0
    """μ_router: requests per second one router's CPU serves at the estimated batch sizes
    (0: no router CPU profiled)."""
    router_utilisation: float = 0.0
    """Estimated busy fraction of each router on the planning trace (0: not simulated)."""
    resamples: int = 0
    """How many resamples of the planning trace the plan was also checked on
    (``PlanningProblem.resamples``; 0: the planning trace alone)."""
    resampled_tail_s: float = 0.0
    """The highest latency at the SLO percentile over the planning trace and those
    resamples (<= slo_s; 0 without resamples)."""
    devices: Mapping[str, int] = field(default_factory=dict)
    """How many devices each allowed class with a device bound has: the stages together
    have no more replicas of the class (a class not in it is unbounded)."""

    def __post_init__(self) -> None:
        if self.routers < 1:
            raise ValueError(f"a plan needs at least one router, got {self.routers}")

    @property
    def router_rho(self) -> float:
        """rho of the routers, λ / (routers · μ_router), as a stage's rho_m (0: unknown)."""
        if self.router_throughput_rps <= 0.0:
            return 0.0
        return self.rate_rps / (self.routers * self.router_throughput_rps)

    @property
    def config(self) -> Config:
        """The per-stage configuration, in stage order."""
        return tuple(StageConfig(s.hardware, s.max_batch, s.replicas) for s in self.stages)

    def stage(self, name: str) -> StagePlan:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage {name!r} in the plan ({[s.name for s in self.stages]})")

    def devices_in_use(self) -> dict[str, int]:
        """Replicas of each class with a device bound, over all stages (bounded classes
        the plan uses only)."""
        used: dict[str, int] = {}
        for s in self.stages:
            if s.hardware in self.devices:
                used[s.hardware] = used.get(s.hardware, 0) + s.replicas
        return used

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "pipeline": self.pipeline,
            "stages": [s.to_dict() for s in self.stages],
            "sloSeconds": self.slo_s,
            "percentile": self.percentile,
            "costPerHour": self.cost_per_hour,
            "p50Seconds": self.p50_s,
            "p99Seconds": self.p99_s,
            "tailSeconds": self.tail_s,
            "attainment": self.attainment,
            "rateRps": self.rate_rps,
            "envelope": {
                "windowsSeconds": list(self.envelope.windows_s),
                "ratesRps": list(self.envelope.rates_rps),
            },
            "headroom": self.headroom,
            "routers": self.routers,
            "routerCostPerHour": self.router_cost_per_hour,
            "routerThroughputRps": self.router_throughput_rps,
            "routerUtilisation": self.router_utilisation,
            "resamples": self.resamples,
            "resampledTailSeconds": self.resampled_tail_s,
        }
        if self.devices:
            data["devices"] = dict(self.devices)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        envelope = data["envelope"]
        return cls(
            pipeline=str(data["pipeline"]),
            stages=tuple(StagePlan.from_dict(s) for s in data["stages"]),
            slo_s=float(data["sloSeconds"]),
            percentile=float(data["percentile"]),
            cost_per_hour=float(data["costPerHour"]),
            p50_s=float(data["p50Seconds"]),
            p99_s=float(data["p99Seconds"]),
            tail_s=float(data["tailSeconds"]),
            attainment=float(data["attainment"]),
            rate_rps=float(data["rateRps"]),
            envelope=Envelope(
                tuple(float(w) for w in envelope["windowsSeconds"]),
                tuple(float(r) for r in envelope["ratesRps"]),
            ),
            headroom=float(data.get("headroom", 1.0)),
            routers=int(data.get("routers", 1)),
            router_cost_per_hour=float(data.get("routerCostPerHour", 0.0)),
            router_throughput_rps=float(data.get("routerThroughputRps", 0.0)),
            router_utilisation=float(data.get("routerUtilisation", 0.0)),
            resamples=int(data.get("resamples", 0)),
            resampled_tail_s=float(data.get("resampledTailSeconds", 0.0)),
            devices={str(k): int(v) for k, v in data.get("devices", {}).items()},
        )

    def to_table(self) -> str:
        """A compact text rendering for the CLI."""
        p = f"P{self.percentile:g}"
        header = ("stage", "hardware", "batch", "replicas", "$/hour", "mu rps", "rho", "s_m")
        rows: list[tuple[str, ...]] = [(*header, "util")]
        rows.extend(
            (
                s.name,
                s.hardware,
                str(s.max_batch),
                str(s.replicas),
                f"{s.cost_per_hour:.3f}",
                f"{s.throughput_rps:.1f}",
                f"{s.rho:.2f}",
                f"{s.scale_factor:.2f}",
                f"{s.utilisation:.2f}",
            )
            for s in self.stages
        )
        rows.append(
            (
                "routers",
                "",
                "",
                str(self.routers),
                f"{self.router_cost_per_hour:.3f}",
                f"{self.router_throughput_rps:.1f}" if self.router_throughput_rps else "",
                f"{self.router_rho:.2f}" if self.router_throughput_rps else "",
                "",
                f"{self.router_utilisation:.2f}" if self.router_throughput_rps else "",
            )
        )
        replicas = str(sum(s.replicas for s in self.stages) + self.routers)
        rows.append(("total", "", "", replicas, f"{self.cost_per_hour:.3f}", "", "", "", ""))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            f"plan for {self.pipeline}: {p} SLO {self.slo_s * 1e3:.1f} ms at "
            f"{self.rate_rps:.1f} rps (planning trace)"
        ]
        for row in rows:
            cells = [
                cell.ljust(width) if i < 2 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        lines.append(
            f"estimated: P50 {self.p50_s * 1e3:.1f} ms, P99 {self.p99_s * 1e3:.1f} ms, "
            f"{self.attainment:.2%} of queries within the SLO; holds it up to "
            f"{self.headroom:.2f}x the planned rate"
        )
        for hw, used in self.devices_in_use().items():
            if used >= self.devices[hw]:
                lines.append(
                    f"device bound: {hw} has devices {self.devices[hw]}, all in use "
                    "(each replica takes one whole device; the catalog's `devices`)"
                )
        if self.resamples:
            lines.append(
                f"on {self.resamples} resamples of the planning trace too: {p} at most "
                f"{self.resampled_tail_s * 1e3:.1f} ms"
            )
        return "\n".join(lines)
