"""Calibration: what serving measured that the profile misses, fed back to the planner.

The profiler times each stage alone, in a quiet worker, one batch at a time. Served at
load, a worker shares the host with the router, the other workers and the clients: a
batch then takes longer than its profile (wake-ups, gRPC, caches), and a hop takes far
longer than the idle probe's (several times as long: docs/benchmarks.md, "Micro-benchmarks
behind design choices"). A :class:`Calibration` records, from
the router's own per-batch records of a real run:

- per stage, the mean model time per batch beyond the profile's P50 at the sizes of the
  same batches (``extra_s``, clamped at 0: a calibration never makes a stage faster than
  its profile), and how it grows with the time the worker sat idle before the batch (the
  in-situ idle penalty: the batches grouped by that idle time, which each worker reports,
  see :func:`idle_groups`). On a CPU class the model time is the worker's CPU time per
  batch (over the class's thread count), not its wall time: what a batch waited for a
  core while others ran is what the estimator's processor sharing adds itself, and
  counting the wall time would add it twice;
- the in-situ hop: each batch's round trip on the router less the worker's wall time;
- the request path outside the router, when the load came from a client that timed its
  own requests (``sloline calibrate``): the client's latencies less the router's, matched
  quantile by quantile (:func:`request_path`);
- the router's CPU, when the arrivals are known (``sloline calibrate``): the CPU its
  process used over the run against what the estimator gives it on the same arrivals
  (:meth:`Calibration.with_router_cpu`). Their ratio scales the profile's router costs
  (per request, batch and item, and its idle penalty): the serving overhead's probe
  splits them with tiny pipelines, and from run to run its totals move by a third.

:meth:`Calibration.apply` adds each stage's extra time to every batch size of that stage on
*every* hardware class (the extra is the host's cost of serving the stage, not the model's,
so it is carried to the classes that were not served), with the in-situ idle penalty in
place of the profile's; where the batches' idle times are too alike to group (or were not
reported), the extra is their mean and the idle penalty is dropped, as that mean already
includes the wake-ups at that load. It replaces the idle probe's hop samples, and its
request-path samples when the calibration has them, with the in-situ ones, and scales the
router's costs when it has measured them. Served by real traffic, the router does not see
its clients, so the request path is then left as profiled.

``sloline calibrate FILE`` serves the plan under its own planning load and measures all
three; ``sloline run FILE --calibration-out calib.json`` measures the first two while
serving real traffic; ``sloline plan FILE --calibration calib.json`` (and ``sloline run``,
``sloline simulate``) plan with either.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from sloline.planner.overhead import IdlePenalty
from sloline.planner.profile import BatchLatency, PipelineProfile, StageProfile

if TYPE_CHECKING:
    from sloline.planner.config import StageConfig
    from sloline.planner.topology import Topology

__all__ = [
    "CALIBRATION_FORMAT",
    "MIN_BATCHES",
    "Calibration",
    "StageCalibration",
    "hops",
    "idle_groups",
    "request_path",
]

CALIBRATION_FORMAT = 1
MIN_BATCHES = 50
"""A stage (and the hop, and the request path: requests) needs this many measured batches to
be calibrated."""
QUANTILES = 1000
"""In-situ hop and request-path samples are stored as this many equally likely quantiles."""
IDLE_EDGES_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Bounds of the idle-time bins that :func:`idle_groups` starts from."""
MIN_GROUP_BATCHES = 30
"""An idle-time group holds at least this many batches (its mean is the penalty's point)."""

Samples = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class StageCalibration:
    """One stage as served: its configuration and what its batches took beyond the profile."""

    hardware: str
    max_batch: int
    batches: int
    mean_batch: float
    service_mean_s: float  # the workers' model time per batch, in situ (CPU time on a CPU class)
    profile_mean_s: float  # the profile's P50 at the same batch sizes
    wall_mean_s: float = math.nan  # the workers' wall time per batch, in situ (for the record)
    # The batches grouped by how long their worker sat idle before them (:func:`idle_groups`):
    # per group its mean idle time, the mean model time beyond the profile, the batches.
    idle_gaps_s: tuple[float, ...] = ()
    idle_extra_s: tuple[float, ...] = ()
    idle_batches: tuple[int, ...] = ()

    @property
    def extra_s(self) -> float:
        """What a batch took beyond its profile, never below 0 (0 without batches): the
        shortest idle group's when there are two groups or more, else the mean."""
        if not self.batches:
            return 0.0
        if len(self.idle_gaps_s) >= 2:
            return max(0.0, self.idle_extra_s[0])
        return max(0.0, self.service_mean_s - self.profile_mean_s)

    @property
    def idle(self) -> IdlePenalty | None:
        """The in-situ idle penalty: each longer group's extra beyond :attr:`extra_s` at its
        mean idle time (from 0 at the shortest group's), made non-decreasing; None with
        fewer than two groups."""
        if len(self.idle_gaps_s) < 2:
            return None
        base = self.extra_s
        return IdlePenalty.from_medians(self.idle_gaps_s, [e - base for e in self.idle_extra_s])

    @property
    def applied(self) -> bool:
        return self.batches >= MIN_BATCHES

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "maxBatch": self.max_batch,
            "batches": self.batches,
            "meanBatch": self.mean_batch,
            "serviceMeanSeconds": self.service_mean_s,
            "profileMeanSeconds": self.profile_mean_s,
            "wallMeanSeconds": self.wall_mean_s,
            "idleGapsSeconds": list(self.idle_gaps_s),
            "idleExtraSeconds": list(self.idle_extra_s),
            "idleBatches": list(self.idle_batches),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageCalibration:
        return cls(
            hardware=str(data["hardware"]),
            max_batch=int(data["maxBatch"]),
            batches=int(data["batches"]),
            mean_batch=float(data["meanBatch"]),
            service_mean_s=float(data["serviceMeanSeconds"]),
            profile_mean_s=float(data["profileMeanSeconds"]),
            wall_mean_s=float(data.get("wallMeanSeconds", data["serviceMeanSeconds"])),
            idle_gaps_s=tuple(float(v) for v in data.get("idleGapsSeconds", ())),
            idle_extra_s=tuple(float(v) for v in data.get("idleExtraSeconds", ())),
            idle_batches=tuple(int(v) for v in data.get("idleBatches", ())),
        )


@dataclass(frozen=True, slots=True)
class Calibration:
    """What one served run measured (module docstring); JSON via :meth:`save` / :meth:`load`."""

    pipeline: str
    duration_s: float
    requests: int
    stages: Mapping[str, StageCalibration]
    hop_s: tuple[float, ...]  # in-situ hop quantiles; () with too few batches
    request_s: tuple[float, ...] = ()  # in-situ request-path quantiles; () when not measured
    router_cpu_s: float | None = None  # the router's process CPU over the run
    router_scale: float = 1.0  # router_cpu_s / the estimator's on the same arrivals

    def with_router_cpu(self, used_s: float, estimated_s: float) -> Calibration:
        """This calibration with the router's CPU over the run, ``used_s``, and its scale
        against ``estimated_s``, what the estimator gave the router on the same arrivals
        with this calibration applied (scale 1): clamped to [1/4, 4], and 1 when the
        estimate has no router CPU (a profile without a serving overhead)."""
        scale = min(4.0, max(0.25, used_s / estimated_s)) if estimated_s > 0.0 else 1.0
        return replace(self, router_cpu_s=float(used_s), router_scale=scale)

    def with_router_cpu_on(
        self,
        used_s: float,
        topology: Topology,
        profile: PipelineProfile,
        config: Sequence[StageConfig],
        arrivals_s: npt.NDArray[np.float64],
    ) -> Calibration:
        """:meth:`with_router_cpu` against the estimator's router CPU on ``arrivals_s``,
        the arrivals the router served while it used ``used_s``: ``config`` (topology
        order) simulated with ``profile`` and this calibration applied (scale 1)."""
        from sloline.planner.estimator import Workload, estimate  # numba: only when used

        applied = self.apply(profile)
        workload = Workload.build(topology, applied, arrivals_s)
        estimated = estimate(topology, applied, config, workload)
        return self.with_router_cpu(used_s, estimated.router_cpu_s)

    @classmethod
    def measure(
        cls,
        profile: PipelineProfile,
        served: Mapping[str, tuple[str, int]],
        batches: Mapping[str, Samples],
        service_s: Mapping[str, Samples],
        roundtrip_s: Mapping[str, Samples],
        *,
        pipeline: str,
        duration_s: float,
        requests: int,
        warmup_batches: int = 0,
        request_s: npt.ArrayLike = (),
        cpu_s: Mapping[str, Samples] | None = None,
        idle_s: Mapping[str, Samples] | None = None,
    ) -> Calibration:
        """From the router's per-batch records of a run: ``served[stage]`` = (hardware, max
        batch); per stage, one entry per answered batch, oldest first: its size, the
        worker's model time and its round trip (the router's ``stage_batch``,
        ``stage_service`` and ``stage_roundtrip``, recorded together when the result
        arrives, so the same index is the same batch); the first ``warmup_batches`` of each
        stage (connections, first calls) are left out. ``request_s``: samples of the
        request path outside the router (:func:`request_path`), when a client measured
        them. ``cpu_s``: per stage on a CPU class, the worker's CPU time of each of the
        same batches (the router's ``stage_cpu``); a batch's model time is then
        min(wall, CPU / the profile's cores), and its wall time where a worker reported
        no CPU time (0). Stages not in ``cpu_s`` (accelerators) use the wall time.
        ``idle_s``: per stage, how long each batch's worker sat idle before it (the router's
        ``stage_idle``; NaN where the worker did not say), grouped by :func:`idle_groups`."""
        stages: dict[str, StageCalibration] = {}
        measured: list[Samples] = []
        cpus, idles = cpu_s or {}, idle_s or {}
        for name, (hardware, max_batch) in served.items():
            sizes, service, roundtrip, cpu, idle = (
                np.asarray(records.get(name, ()), dtype=np.float64)[warmup_batches:]
                for records in (batches, service_s, roundtrip_s, cpus, idles)
            )
            stage = profile.stage(name, hardware)
            table = stage.latency_table_s(max_batch)
            count = min(sizes.size, service.size)
            sizes, wall = sizes[:count], service[:count]
            model = wall
            if name in cpus and cpu.size >= count:
                cpu = cpu[:count]
                model = np.where(cpu > 0.0, np.minimum(wall, cpu / stage.cores), wall)
            groups: tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]] = ((), (), ())
            if count:
                profiled = table[np.clip(sizes.astype(int), 1, max_batch)]
                expected = float(profiled.mean())
                in_situ, in_situ_wall = float(model.mean()), float(wall.mean())
                if idle.size >= count:
                    groups = idle_groups(idle[:count], model - profiled)
            else:
                expected = in_situ = in_situ_wall = math.nan
            stages[name] = StageCalibration(
                hardware=hardware,
                max_batch=max_batch,
                batches=count,
                mean_batch=float(sizes.mean()) if sizes.size else math.nan,
                service_mean_s=in_situ,
                profile_mean_s=expected,
                wall_mean_s=in_situ_wall,
                idle_gaps_s=groups[0],
                idle_extra_s=groups[1],
                idle_batches=groups[2],
            )
            measured.append(hops(service, roundtrip))
        hop = np.concatenate(measured) if measured else np.empty(0)
        request = np.asarray(request_s, dtype=np.float64)
        return cls(pipeline, duration_s, requests, stages, _quantiles(hop), _quantiles(request))

    def apply(self, profile: PipelineProfile) -> PipelineProfile:
        """``profile`` with this calibration's extra time and in-situ hops (module docstring).

        Raises ValueError when the calibration names a stage the profile does not have (it
        was measured on another pipeline)."""
        unknown = sorted(set(self.stages) - set(profile.stages))
        if unknown:
            raise ValueError(
                f"calibration of pipeline {self.pipeline!r} names stages {unknown} that the "
                f"profile does not have ({sorted(profile.stages)})"
            )
        stages = {name: dict(per_hw) for name, per_hw in profile.stages.items()}
        for name, measured in self.stages.items():
            if not measured.applied:
                continue
            for hardware, stage in profile.stages[name].items():
                stages[name][hardware] = _slower(stage, measured.extra_s, measured.idle)
        calibrated = replace(profile, stages=stages)
        overhead = profile.overhead
        if overhead is not None and self.request_s:
            overhead = replace(overhead, request_s=self.request_s)
        if self.hop_s:
            overhead = overhead and replace(overhead, hop_s=self.hop_s)
            calibrated = replace(calibrated, hop_s=float(np.median(self.hop_s)))
        if overhead is not None and self.router_scale != 1.0:
            overhead = overhead.router_scaled(self.router_scale)
        return replace(calibrated, overhead=overhead)

    def summary(self) -> str:
        """A few lines for the CLI: per stage the extra time, and the hop."""
        lines = [
            f"calibration of {self.pipeline!r}: {self.requests} requests over "
            f"{self.duration_s:.0f} s served"
        ]
        for name, s in self.stages.items():
            if not s.applied:
                lines.append(
                    f"  {name}: {s.batches} batches on {s.hardware}, fewer than {MIN_BATCHES}: "
                    "not applied"
                )
                continue
            wall = (
                f" ({s.wall_mean_s * 1e3:.2f} ms wall)"
                if math.isfinite(s.wall_mean_s) and s.wall_mean_s != s.service_mean_s
                else ""
            )
            idle = s.idle
            after_idle = (
                f" (+{(s.extra_s + idle.extra_s[-1]) * 1e3:.2f} ms after "
                f"{idle.gaps_s[-1] * 1e3:.0f} ms idle)"
                if idle is not None
                else ""
            )
            lines.append(
                f"  {name}: {s.batches} batches on {s.hardware} (mean {s.mean_batch:.1f} items), "
                f"{s.service_mean_s * 1e3:.2f} ms per batch{wall} vs profiled "
                f"{s.profile_mean_s * 1e3:.2f} ms: +{s.extra_s * 1e3:.2f} ms per batch"
                f"{after_idle}"
            )
        if self.hop_s:
            hop = np.asarray(self.hop_s)
            lines.append(
                f"  hop in situ: P50 {np.median(hop) * 1e3:.2f} ms, "
                f"P99 {np.quantile(hop, 0.99) * 1e3:.2f} ms"
            )
        else:
            lines.append(f"  hop: fewer than {MIN_BATCHES} batches, the profiled hop is kept")
        if self.request_s:
            path = np.asarray(self.request_s)
            lines.append(
                f"  request path outside the router in situ: P50 {np.median(path) * 1e3:.2f} ms, "
                f"P99 {np.quantile(path, 0.99) * 1e3:.2f} ms"
            )
        if self.router_cpu_s is not None:
            per_request = self.router_cpu_s / max(1, self.requests) * 1e3
            lines.append(
                f"  router CPU in situ: {per_request:.2f} ms per request, x{self.router_scale:.2f} "
                "the profile's on the same arrivals"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "pipeline": self.pipeline,
            "durationSeconds": self.duration_s,
            "requests": self.requests,
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "hopSeconds": list(self.hop_s),
            "requestSeconds": list(self.request_s),
            "routerCpuSeconds": self.router_cpu_s,
            "routerScale": self.router_scale,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        if data.get("format") != CALIBRATION_FORMAT:
            raise ValueError(
                f"calibration format {data.get('format')!r} is not {CALIBRATION_FORMAT}; "
                "measure it again with this version (`sloline run --calibration-out`)"
            )
        router_cpu = data.get("routerCpuSeconds")
        return cls(
            pipeline=str(data["pipeline"]),
            duration_s=float(data["durationSeconds"]),
            requests=int(data["requests"]),
            stages={str(k): StageCalibration.from_dict(v) for k, v in data["stages"].items()},
            hop_s=tuple(float(v) for v in data["hopSeconds"]),
            request_s=tuple(float(v) for v in data.get("requestSeconds", ())),
            router_cpu_s=float(router_cpu) if router_cpu is not None else None,
            router_scale=float(data.get("routerScale", 1.0)),
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read a calibration file; ValueError naming the file when it is not one."""
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{path}: not a sloline calibration: {detail}") from None


def hops(service_s: npt.ArrayLike, roundtrip_s: npt.ArrayLike) -> Samples:
    """One stage's in-situ hops: each batch's round trip on the router less the worker's
    wall time (the router's ``stage_roundtrip`` and ``stage_service``, recorded together
    when a result arrives, paired from the newest), clamped at 0."""
    service = np.asarray(service_s, dtype=np.float64)
    roundtrip = np.asarray(roundtrip_s, dtype=np.float64)
    paired = min(service.size, roundtrip.size)
    if not paired:
        return np.empty(0)
    return np.maximum(roundtrip[roundtrip.size - paired :] - service[service.size - paired :], 0.0)


def idle_groups(
    idle_s: Samples, extra_s: Samples
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]]:
    """Batches grouped by how long their worker sat idle before them: per group its mean
    idle time, its mean ``extra_s`` (model time beyond the profile) and its batch count,
    shortest idle first. The groups are the bins of :data:`IDLE_EDGES_S`, each merged with
    the next until it holds :data:`MIN_GROUP_BATCHES`; a short last group joins the one
    before. Batches with no idle time (NaN: a worker's first) are left out."""
    idle, extra = np.asarray(idle_s, dtype=np.float64), np.asarray(extra_s, dtype=np.float64)
    known = np.isfinite(idle) & np.isfinite(extra)
    idle, extra = idle[known], extra[known]
    order = np.argsort(idle, kind="stable")
    idle, extra = idle[order], extra[order]
    # Where each bin ends in the sorted batches; a group closes at the first bin end that
    # gives it MIN_GROUP_BATCHES.
    ends = [*np.searchsorted(idle, IDLE_EDGES_S, side="right").tolist(), idle.size]
    bounds = [0]
    for end in ends:
        if end - bounds[-1] >= MIN_GROUP_BATCHES:
            bounds.append(end)
    if len(bounds) > 1 and idle.size > bounds[-1]:
        bounds[-1] = idle.size  # the short remainder joins the last group
    pairs = list(itertools.pairwise(bounds))
    return (
        tuple(max(float(idle[a:b].mean()), 1e-6) for a, b in pairs),
        tuple(float(extra[a:b].mean()) for a, b in pairs),
        tuple(b - a for a, b in pairs),
    )


def request_path(client_s: Samples, router_s: Samples) -> Samples:
    """Samples of the request path outside the router: a client's latencies (from each
    send) less the router's latencies of the same requests, matched quantile by quantile
    (neither side knows the other's request ids), clamped at 0."""
    client, router = np.sort(np.asarray(client_s)), np.sort(np.asarray(router_s))
    count = min(client.size, router.size)
    if not count:
        return np.empty(0)
    levels = (np.arange(count) + 0.5) / count
    return np.maximum(np.quantile(client, levels) - np.quantile(router, levels), 0.0)


def _quantiles(samples: Samples) -> tuple[float, ...]:
    """QUANTILES equally likely quantiles of ``samples``; () with fewer than MIN_BATCHES."""
    if samples.size < MIN_BATCHES:
        return ()
    levels = (np.arange(QUANTILES) + 0.5) / QUANTILES
    return tuple(np.quantile(samples, levels, method="inverted_cdf").tolist())


def _slower(stage: StageProfile, extra_s: float, idle: IdlePenalty | None) -> StageProfile:
    """``stage`` with ``extra_s`` added to every batch latency and ``idle`` as its idle
    penalty (None: none)."""
    points = tuple(
        BatchLatency(
            p.batch_size,
            p.p50_s + extra_s,
            p.p99_s + extra_s,
            p.mean_s + extra_s,
            tuple(v + extra_s for v in p.samples_s),
        )
        for p in stage.points
    )
    return StageProfile(stage.hardware, points, idle, stage.cores)
