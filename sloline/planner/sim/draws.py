"""What each batch costs in a simulation: service times drawn from a stage's profile, and
draws of the measured overhead distributions (hops, request paths)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from sloline.planner.profile import StageProfile, Stat
from sloline.planner.sim.rule import batch_service, idle_penalty

__all__ = ["ServiceDraws", "ServiceMode", "overhead_draws", "service_draws", "summary_stat"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# How a batch's service time is drawn from its profile: a fixed statistic (p50 is the
# default, as InferLine's profiles are medians), a draw from the raw samples, or an
# exponential with the profiled mean (for checks against M/M/c closed forms).
ServiceMode = Literal["p50", "mean", "p99", "samples", "exponential"]
_SUMMARY: dict[str, Stat] = {"p50": "p50", "mean": "mean", "p99": "p99"}

_NO_INTS = np.empty(0, dtype=np.int64)
_NO_FLOATS = np.empty(0, dtype=np.float64)
_NO_IDLE = np.zeros((2, 1), dtype=np.float64)


def summary_stat(mode: ServiceMode) -> Stat:
    """The fixed statistic that stands for ``mode`` in service-time screens."""
    return _SUMMARY.get(mode, "mean" if mode == "exponential" else "p50")


@dataclass(frozen=True, slots=True, eq=False)
class ServiceDraws:
    """How long each batch occupies a replica: ``table_s[k, j]`` is a service time of a
    batch of k; the b-th batch dispatched uses column ``cols[b]`` (0 when ``cols`` is
    empty) times ``scales[b]`` (1 when empty), plus ``hop_s``, plus the idle penalty
    ``idle_s`` (``[2, K]``: gaps from 0, extra times from 0, see
    :meth:`~sloline.planner.profile.IdlePenalty.table`) for the time its worker was idle."""

    table_s: FloatArray  # [max_batch + 1, J], C-contiguous
    cols: IntArray  # [>= number of batches] or empty
    scales: FloatArray  # [>= number of batches] or empty
    hop_s: float
    idle_s: FloatArray = field(default_factory=lambda: _NO_IDLE)

    def time_s(self, batch_index: int, size: int, idle_gap_s: float = 0.0) -> float:
        """Occupancy of the ``batch_index``-th batch, of ``size`` items, its worker idle for
        ``idle_gap_s`` before it (the compiled kernels' own functions)."""
        service = batch_service(
            self.table_s[None], self.cols[None], self.scales[None], 0, batch_index, size
        )
        return float(service + self.hop_s + idle_penalty(self.idle_s[None], 0, idle_gap_s))


def service_draws(
    profile: StageProfile,
    max_batch: int,
    mode: ServiceMode,
    hop_s: float,
    n_batches: int,
    *,
    seed: int = 0,
    stage: int = 0,
) -> ServiceDraws:
    """Service times of one stage's batches under ``mode``. Random modes pre-draw one value
    per possible batch from a stream keyed by (seed, stage), so the b-th batch of a stage
    always gets the b-th draw whatever the other stages do."""
    idle = profile.idle.table() if profile.idle is not None else _NO_IDLE
    if mode in _SUMMARY:
        table = profile.latency_table_s(max_batch, _SUMMARY[mode])[:, None]
        return ServiceDraws(np.ascontiguousarray(table), _NO_INTS, _NO_FLOATS, hop_s, idle)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stage + 1,)))
    if mode == "samples":
        table = profile.quantile_table_s(max_batch)
        cols = rng.integers(0, table.shape[1], size=n_batches, dtype=np.int64)
        return ServiceDraws(table, cols, _NO_FLOATS, hop_s, idle)
    table = np.ascontiguousarray(profile.latency_table_s(max_batch, "mean")[:, None])
    return ServiceDraws(table, _NO_INTS, rng.standard_exponential(n_batches), hop_s, idle)


def overhead_draws(
    sorted_s: FloatArray, mode: ServiceMode, count: int, seed: int, key: tuple[int, ...]
) -> FloatArray:
    """``count`` values of a measured overhead distribution (sorted samples) under
    ``mode``: its statistic for the summary modes (the median for ``exponential``, whose
    exponential draws are for service times only), else draws from a stream keyed by
    (seed, key)."""
    if mode == "samples":
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
        return sorted_s[rng.integers(0, sorted_s.size, size=count)]
    if mode == "mean":
        value = float(sorted_s.mean())
    elif mode == "p99":
        value = float(np.percentile(sorted_s, 99.0, method="inverted_cdf"))
    else:
        value = float(np.median(sorted_s))
    return np.full(count, value)
