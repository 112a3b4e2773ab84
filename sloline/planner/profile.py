"""Batch-latency profiles: what the profiler measures and the estimator replays (InferLine §4.1).

A :class:`StageProfile` holds, for one stage on one hardware class, the latency of one batch
at measured batch sizes 1, 2, 4, ..., cap (median, tail, mean and optionally the raw
samples). The latency of any batch size up to the cap is the linear interpolation between
the measured sizes; beyond the cap nothing is known, so a plan never uses a larger batch.
Those latencies are timed back to back; a worker serves a batch after waiting for it, and
a batch that starts on a replica which sat idle takes longer (caches gone cold, the core
woken from idle): the :class:`IdlePenalty` records how much longer, by idle time.

A :class:`PipelineProfile` gathers the stage profiles per hardware class with what the
estimator needs about the pipeline as a whole: the scale factor s_m of every stage (the
fraction of queries that visit it, §4.1), the per-hop overhead of one router -> worker ->
router round trip, optionally the serving overhead measured on a real router
(:class:`~sloline.planner.overhead.ServingOverhead`: router CPU, hop and request-path
distributions, shared cores), and optionally the *visit matrix* recorded while profiling
(which stages each sample query actually ran), so that simulated queries follow real
conditional routing instead of independent coin flips.

Both serialise to plain JSON/YAML-friendly dicts with camelCase keys (they are stored in
the Kubernetes resource's status next to the plan); ``from_dict(to_dict(x))`` is lossless.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sloline.planner.overhead import IdlePenalty, ServingOverhead, positive_s

Stat = Literal["p50", "p99", "mean"]

__all__ = ["BatchLatency", "IdlePenalty", "PipelineProfile", "StageProfile", "Stat"]


@dataclass(frozen=True, slots=True)
class BatchLatency:
    """Latency statistics of one batch of ``batch_size`` requests, in seconds."""

    batch_size: int
    p50_s: float
    p99_s: float
    mean_s: float
    samples_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        what = f"latency of batch {self.batch_size}"
        p50 = positive_s(self.p50_s, f"{what} (p50)")
        p99 = positive_s(self.p99_s, f"{what} (p99)")
        positive_s(self.mean_s, f"{what} (mean)")
        if p99 < p50:
            raise ValueError(f"{what}: p99 ({p99!r} s) is below p50 ({p50!r} s)")
        for sample in self.samples_s:
            positive_s(sample, f"{what} (sample)")

    def stat_s(self, stat: Stat) -> float:
        """The named statistic in seconds."""
        if stat == "p50":
            return self.p50_s
        if stat == "p99":
            return self.p99_s
        return self.mean_s

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "batchSize": self.batch_size,
            "p50Seconds": self.p50_s,
            "p99Seconds": self.p99_s,
            "meanSeconds": self.mean_s,
        }
        if self.samples_s:
            out["samplesSeconds"] = list(self.samples_s)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchLatency:
        return cls(
            batch_size=int(data["batchSize"]),
            p50_s=float(data["p50Seconds"]),
            p99_s=float(data["p99Seconds"]),
            mean_s=float(data["meanSeconds"]),
            samples_s=tuple(float(s) for s in data.get("samplesSeconds", ())),
        )

    @classmethod
    def from_samples(cls, batch_size: int, samples_s: Sequence[float]) -> BatchLatency:
        """Summarise raw measurements (keeps them for the estimator's sampling mode)."""
        values = np.asarray(samples_s, dtype=np.float64)
        if values.size == 0:
            raise ValueError(f"no latency samples for batch {batch_size}")
        return cls(
            batch_size=batch_size,
            p50_s=float(np.percentile(values, 50.0)),
            p99_s=float(np.percentile(values, 99.0)),
            mean_s=float(values.mean()),
            samples_s=tuple(float(v) for v in values),
        )


@dataclass(frozen=True, slots=True)
class StageProfile:
    """Batch latencies of one stage on one hardware class (InferLine §4.1, Fig. 3).

    ``points`` are ordered by batch size and start at batch size 1; ``cap`` (the largest
    measured size) is the largest batch a plan may use on this hardware. ``idle`` (optional)
    is the extra time of a batch started after an idle period; ``cores`` is how many CPU
    cores a replica keeps busy while it serves (its thread budget), which matters when
    replicas share a machine's cores.
    """

    hardware: str
    points: tuple[BatchLatency, ...]
    idle: IdlePenalty | None = None
    cores: int = 1

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"profile on {self.hardware!r}: cores must be >= 1, got {self.cores}")
        if not self.points:
            raise ValueError(f"profile on {self.hardware!r} has no measured batch sizes")
        sizes = [p.batch_size for p in self.points]
        if sizes[0] != 1:
            raise ValueError(
                f"profile on {self.hardware!r} must start at batch size 1 (got {sizes}); "
                "the planner starts every stage at batch 1"
            )
        if any(b <= a for a, b in itertools.pairwise(sizes)):
            raise ValueError(f"profile on {self.hardware!r}: batch sizes must increase, {sizes}")

    @property
    def cap(self) -> int:
        """The largest measured batch size."""
        return self.points[-1].batch_size

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(p.batch_size for p in self.points)

    def _check_batch(self, batch: int) -> None:
        if not 1 <= batch <= self.cap:
            raise ValueError(
                f"batch size {batch} is outside the profile on {self.hardware!r} "
                f"(measured 1..{self.cap}); profile larger batches or lower max_batch"
            )

    def latency_s(self, batch: int, stat: Stat = "p50") -> float:
        """Service time of a batch of ``batch`` requests, linearly interpolated (seconds)."""
        self._check_batch(batch)
        sizes = [float(p.batch_size) for p in self.points]
        values = [p.stat_s(stat) for p in self.points]
        return float(np.interp(float(batch), sizes, values))

    def throughput_rps(self, batch: int, stat: Stat = "p50") -> float:
        """Throughput of one replica that always runs full batches: batch / latency."""
        return batch / self.latency_s(batch, stat)

    def latency_table_s(self, max_batch: int, stat: Stat = "p50") -> npt.NDArray[np.float64]:
        """``table[k]`` = service time of a batch of k, for k = 0..max_batch (``table[0]`` = 0)."""
        self._check_batch(max_batch)
        sizes = np.array([p.batch_size for p in self.points], dtype=np.float64)
        values = np.array([p.stat_s(stat) for p in self.points], dtype=np.float64)
        table = np.zeros(max_batch + 1, dtype=np.float64)
        table[1:] = np.interp(np.arange(1, max_batch + 1, dtype=np.float64), sizes, values)
        return table

    def quantile_table_s(self, max_batch: int) -> npt.NDArray[np.float64]:
        """Empirical service-time distribution per batch size, ``table[k, j]`` (seconds).

        Row k holds J equally likely values: at measured sizes the sorted samples (resampled
        to the largest sample count when counts differ, so no measured tail is dropped),
        between them the interpolation of the neighbours' rows, so the same column j is the
        same quantile at every batch size.
        """
        self._check_batch(max_batch)
        if any(not p.samples_s for p in self.points):
            missing = [p.batch_size for p in self.points if not p.samples_s]
            raise ValueError(
                f"profile on {self.hardware!r} has no raw samples for batch sizes {missing}; "
                "use a summary service mode (p50, mean, p99) or exponential"
            )
        count = max(len(p.samples_s) for p in self.points)
        levels = (np.arange(count, dtype=np.float64) + 0.5) / count
        rows = np.stack(
            [
                np.quantile(np.asarray(p.samples_s), levels, method="inverted_cdf")
                for p in self.points
            ]
        )
        sizes = np.array(self.batch_sizes, dtype=np.float64)
        table = np.zeros((max_batch + 1, count), dtype=np.float64)
        for k in range(1, max_batch + 1):
            hi = int(np.searchsorted(sizes, k, side="left"))
            if sizes[hi] == k:
                table[k] = rows[hi]
            else:
                weight = (k - sizes[hi - 1]) / (sizes[hi] - sizes[hi - 1])
                table[k] = rows[hi - 1] + (rows[hi] - rows[hi - 1]) * weight
        return table

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hardware": self.hardware,
            "batches": [p.to_dict() for p in self.points],
        }
        if self.idle is not None:
            out["idlePenalty"] = self.idle.to_dict()
        if self.cores != 1:
            out["cores"] = self.cores
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageProfile:
        idle = data.get("idlePenalty")
        return cls(
            hardware=str(data["hardware"]),
            points=tuple(BatchLatency.from_dict(p) for p in data["batches"]),
            idle=IdlePenalty.from_dict(idle) if idle is not None else None,
            cores=int(data.get("cores", 1)),
        )

    @classmethod
    def from_latencies(
        cls,
        hardware: str,
        latencies_s: Mapping[int, float],
        *,
        tail_ratio: float = 1.0,
    ) -> StageProfile:
        """A profile from one latency per batch size (p50 = mean, p99 = p50 * tail_ratio)."""
        if tail_ratio < 1.0:
            raise ValueError(f"tail_ratio must be >= 1, got {tail_ratio}")
        return cls(
            hardware=hardware,
            points=tuple(
                BatchLatency(b, latencies_s[b], latencies_s[b] * tail_ratio, latencies_s[b])
                for b in sorted(latencies_s)
            ),
        )


@dataclass(frozen=True, slots=True, eq=False)
class PipelineProfile:
    """Everything the estimator knows about a pipeline besides its configuration.

    - ``stages[stage][hardware]``: the batch-latency profile of a stage on a hardware class
      (a stage may lack profiles on classes it cannot run on);
    - ``scale_factors[stage]``: s_m, the fraction of queries that visit the stage (§4.1);
      missing entries are filled from the visit matrix's column means, else 1.0;
    - ``hop_s``: overhead of one router -> worker -> router round trip per batch, seconds
      (InferLine's per-hop constant);
    - ``overhead`` (optional): the serving overhead measured on a real router. When given,
      the estimator simulates the router, hops, request path and shared cores from it
      (``hop_s`` is then only its summary, for screens and the tuner's T_s);
    - ``visits`` (optional): bool array [n_samples, len(visit_stages)], which stages each
      profiled sample query visited (conditional edges and skip cascades included).
    """

    stages: Mapping[str, Mapping[str, StageProfile]]
    scale_factors: Mapping[str, float] = field(default_factory=dict)
    hop_s: float = 0.0
    visits: npt.NDArray[np.bool_] | None = None
    visit_stages: tuple[str, ...] = ()
    overhead: ServingOverhead | None = None

    def __post_init__(self) -> None:
        stages: dict[str, Mapping[str, StageProfile]] = {}
        for name, per_hw in self.stages.items():
            for hw, prof in per_hw.items():
                if prof.hardware != hw:
                    raise ValueError(
                        f"stage {name!r}: profile filed under {hw!r} is for {prof.hardware!r}"
                    )
            stages[name] = MappingProxyType(dict(per_hw))
        object.__setattr__(self, "stages", MappingProxyType(stages))
        if not (math.isfinite(self.hop_s) and self.hop_s >= 0.0):
            raise ValueError(f"hop overhead must be >= 0 seconds, got {self.hop_s!r}")
        means = self._visit_means()
        factors: dict[str, float] = {}
        for name in stages:
            given = self.scale_factors.get(name)
            measured = means.get(name)
            if given is not None and measured is not None and abs(given - measured) > 1e-9:
                raise ValueError(
                    f"stage {name!r}: scale factor {given} disagrees with the visit matrix "
                    f"({measured}); drop one of them"
                )
            value = float(given if given is not None else measured if measured is not None else 1.0)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"stage {name!r}: scale factor must be in [0, 1], got {value}")
            factors[name] = value
        unknown = sorted(set(self.scale_factors) - set(stages))
        if unknown:
            raise ValueError(f"scale factors for unknown stages {unknown}")
        object.__setattr__(self, "scale_factors", MappingProxyType(factors))

    def __reduce__(self) -> tuple[type[PipelineProfile], tuple[object, ...]]:
        """Picklable (the re-planner plans in another process): plain dicts for the
        read-only views, which ``__post_init__`` makes again."""
        stages = {name: dict(per_hw) for name, per_hw in self.stages.items()}
        factors = dict(self.scale_factors)
        return (
            PipelineProfile,
            (stages, factors, self.hop_s, self.visits, self.visit_stages, self.overhead),
        )

    def _visit_means(self) -> dict[str, float]:
        if self.visits is None:
            if self.visit_stages:
                raise ValueError("visit_stages given without a visit matrix")
            return {}
        visits = np.array(self.visits, dtype=np.bool_)
        if visits.ndim != 2 or visits.shape[1] != len(self.visit_stages) or visits.shape[0] < 1:
            raise ValueError(
                f"visit matrix must be [n_samples >= 1, {len(self.visit_stages)}] "
                f"(one column per visit stage), got shape {visits.shape}"
            )
        missing = sorted(set(self.stages) - set(self.visit_stages))
        if missing or len(set(self.visit_stages)) != len(self.visit_stages):
            raise ValueError(
                f"visit matrix columns {list(self.visit_stages)} must name every profiled "
                f"stage exactly once (missing {missing})"
            )
        visits.setflags(write=False)
        object.__setattr__(self, "visits", visits)
        return {n: float(visits[:, j].mean()) for j, n in enumerate(self.visit_stages)}

    @property
    def request_s(self) -> float:
        """A request's own time besides its stage visits with nothing queued: the router's
        CPU per request and the median request path (0 without a measured overhead)."""
        if self.overhead is None:
            return 0.0
        return self.overhead.router_request_cpu_s + self.overhead.request_median_s

    def stage(self, name: str, hardware: str) -> StageProfile:
        """The profile of ``name`` on ``hardware``, or a KeyError saying what is profiled."""
        try:
            per_hw = self.stages[name]
        except KeyError:
            raise KeyError(
                f"no profile for stage {name!r}; profiled: {sorted(self.stages)}"
            ) from None
        try:
            return per_hw[hardware]
        except KeyError:
            raise KeyError(
                f"stage {name!r} is not profiled on {hardware!r} (profiled on {sorted(per_hw)})"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hopSeconds": self.hop_s,
            "scaleFactors": dict(self.scale_factors),
            "stages": {
                name: [prof.to_dict() for prof in per_hw.values()]
                for name, per_hw in self.stages.items()
            },
        }
        if self.overhead is not None:
            out["overhead"] = self.overhead.to_dict()
        if self.visits is not None:
            out["visits"] = {
                "stages": list(self.visit_stages),
                "rows": ["".join("1" if v else "0" for v in row) for row in self.visits.tolist()],
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PipelineProfile:
        visits = None
        visit_stages: tuple[str, ...] = ()
        if "visits" in data:
            visit_stages = tuple(str(s) for s in data["visits"]["stages"])
            rows = data["visits"]["rows"]
            if any(len(r) != len(visit_stages) or set(r) - {"0", "1"} for r in rows):
                raise ValueError("visit rows must be strings of 0/1, one character per stage")
            visits = np.array([[c == "1" for c in r] for r in rows], dtype=np.bool_)
        return cls(
            stages={
                str(name): {p["hardware"]: StageProfile.from_dict(p) for p in profiles}
                for name, profiles in data["stages"].items()
            },
            scale_factors={str(k): float(v) for k, v in data.get("scaleFactors", {}).items()},
            hop_s=float(data.get("hopSeconds", 0.0)),
            visits=visits,
            visit_stages=visit_stages,
            overhead=ServingOverhead.from_dict(data["overhead"]) if "overhead" in data else None,
        )
