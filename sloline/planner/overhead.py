"""What serving adds around the models: the router's CPU, the hops, the request path, and
the cores the router and the workers share.

InferLine (§4.1-4.2) folds the serving system into one measured per-hop constant. On one
machine that hides the three things that shape sloline's tail latency besides the models
(docs/planner.md, "Estimator vs reality"):

- **the router is one server**: one single-threaded event loop decodes every request,
  dispatches every batch, takes back every result and encodes every response, so its CPU
  time is a FIFO queue every stage visit of every request passes through, twice;
- **hops and the request path are distributions**, not their medians: loopback gRPC,
  process wake-ups and a worker's own decode/encode vary by a factor of several;
- **co-located processes share cores**: in the embedded mode the router and every worker
  run on the same few cores, so three ensemble members serving at once on two cores each
  take longer than profiled alone.

:class:`ServingOverhead` holds what the profiler measures of these on a real router with
real workers (``sloline.measure.probe``); the estimator simulates them
(``sloline.planner.routed``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["IdlePenalty", "ServingOverhead"]


def _cpu(value: float, what: str) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def positive_s(value: float, what: str) -> float:
    """``value`` as a float, or ValueError naming ``what`` unless it is > 0 and finite."""
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{what} must be a positive finite number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class IdlePenalty:
    """Extra time of work that starts on a process idle for a while: a batch on a stage's
    replica (its service time; :class:`~sloline.planner.profile.StageProfile`), or a job
    of the router's (its CPU; :attr:`ServingOverhead.router_idle`).

    ``extra_s[i]`` is measured after an idle gap of ``gaps_s[i]`` (increasing): for a
    stage, the median time of a batch run after sleeping that long, minus the median back
    to back. It is added to any batch size (it does not scale with the batch: it is the
    cost of waking up and refilling caches). Between measured gaps it is interpolated
    linearly, from 0 at a gap of 0, and held at the last value beyond the longest gap.
    """

    gaps_s: tuple[float, ...]
    extra_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.gaps_s or len(self.gaps_s) != len(self.extra_s):
            raise ValueError(
                f"idle penalty needs one extra time per gap, got {len(self.gaps_s)} gaps "
                f"and {len(self.extra_s)} times"
            )
        for gap in self.gaps_s:
            positive_s(gap, "idle gap")
        if any(b <= a for a, b in itertools.pairwise(self.gaps_s)):
            raise ValueError(f"idle gaps must increase, got {self.gaps_s}")
        if any(not (math.isfinite(e) and e >= 0.0) for e in self.extra_s):
            raise ValueError(f"idle penalties must be finite and >= 0 s, got {self.extra_s}")

    @classmethod
    def from_medians(cls, gaps_s: Sequence[float], extra_s: Sequence[float]) -> IdlePenalty:
        """From measured (gap, median extra time) pairs: negative noise is clipped to 0 and
        the curve made non-decreasing (a longer idle time never makes a batch faster). The
        gaps are measured sleeps, which a busy machine can stretch past the next one's: each
        is kept just above the one before it."""
        gaps: list[float] = []
        for gap in gaps_s:
            gaps.append(float(gap) if not gaps else max(float(gap), math.nextafter(gaps[-1], 1)))
        extra = np.maximum.accumulate(np.maximum(np.asarray(extra_s, dtype=np.float64), 0.0))
        return cls(tuple(gaps), tuple(float(e) for e in extra))

    def table(self) -> npt.NDArray[np.float64]:
        """``[2, K + 1]``: gaps (from 0) and extra times (from 0), as the estimator reads it."""
        return np.array([(0.0, *self.gaps_s), (0.0, *self.extra_s)], dtype=np.float64)

    def extra_at(self, gap_s: float) -> float:
        """Extra time after ``gap_s`` seconds idle."""
        table = self.table()
        return float(np.interp(gap_s, table[0], table[1]))

    def to_dict(self) -> dict[str, Any]:
        return {"gapsSeconds": list(self.gaps_s), "extraSeconds": list(self.extra_s)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IdlePenalty:
        return cls(
            tuple(float(g) for g in data["gapsSeconds"]),
            tuple(float(e) for e in data["extraSeconds"]),
        )


def _samples(values: Sequence[float], what: str) -> tuple[float, ...]:
    if not values:
        raise ValueError(f"{what}: at least one sample is needed")
    for value in values:
        _cpu(value, what)
    return tuple(float(v) for v in values)


@dataclass(frozen=True, slots=True)
class ServingOverhead:
    """Serving costs measured on a real router and worker, in seconds.

    - ``router_request_cpu_s``: router CPU per request — the front door's decode and
      encode, starting and finishing the request's DAG;
    - ``router_batch_cpu_s`` / ``router_item_cpu_s``: router CPU per dispatched batch and
      per item in it — building and sending the batch, reading its result, handing the
      outputs downstream;
    - ``worker_batch_cpu_s``: a worker's CPU per batch outside the model (reading the
      batch, writing the results);
    - ``hop_s``: samples of one router -> worker -> router round trip that is neither
      router CPU nor model time (loopback, wake-ups, the worker's own CPU above);
    - ``request_s``: samples of a request's time outside the router's CPU (the client's
      gRPC stack and loopback, both ways), measured with a client on the same machine;
    - ``client_cpu_s``: that measuring client's CPU per request (part of ``request_s``);
    - ``cores``: the cores the router and every worker share (the embedded mode's machine),
      or None where each has its own (Kubernetes pods with CPU requests);
    - ``worker_nice``: how far below the router's the workers' CPU priority is (the local
      backend's ``nice``), which sets their share of those cores: ``worker_weight``;
    - ``router_idle``: the router's extra CPU when work finds its event loop idle, by how
      long it sat idle (caches gone cold, the loop and its gRPC threads woken); the costs
      above are then those of a busy router. None: not measured, and the costs above are
      those of a router woken by every request, as the idle probe measures them.
    """

    router_request_cpu_s: float
    router_batch_cpu_s: float
    router_item_cpu_s: float
    worker_batch_cpu_s: float
    hop_s: tuple[float, ...]
    request_s: tuple[float, ...]
    client_cpu_s: float = 0.0
    cores: int | None = None
    worker_nice: int = 0
    router_idle: IdlePenalty | None = None

    def __post_init__(self) -> None:
        _cpu(self.router_request_cpu_s, "router CPU per request")
        _cpu(self.router_batch_cpu_s, "router CPU per batch")
        _cpu(self.router_item_cpu_s, "router CPU per item")
        _cpu(self.worker_batch_cpu_s, "worker CPU per batch")
        _cpu(self.client_cpu_s, "client CPU per request")
        object.__setattr__(self, "hop_s", _samples(self.hop_s, "hop time"))
        object.__setattr__(self, "request_s", _samples(self.request_s, "request time"))
        if self.cores is not None and self.cores < 1:
            raise ValueError(f"shared cores must be >= 1 (or None), got {self.cores}")
        if not 0 <= self.worker_nice <= 19:
            raise ValueError(f"worker nice must be 0-19, got {self.worker_nice}")

    @property
    def worker_weight(self) -> float:
        """A worker thread's scheduling weight, the router's being 1: Linux's fair
        scheduler weighs each nice step 1.25x (``sched_prio_to_weight``: nice 10 is 110
        against nice 0's 1024)."""
        return float(1.25**-self.worker_nice)

    def router_scaled(self, scale: float) -> ServingOverhead:
        """This overhead with the router's CPU (per request, batch, item and its idle
        penalty) times ``scale``."""
        idle = self.router_idle
        if idle is not None:
            idle = IdlePenalty(idle.gaps_s, tuple(e * scale for e in idle.extra_s))
        return replace(
            self,
            router_request_cpu_s=self.router_request_cpu_s * scale,
            router_batch_cpu_s=self.router_batch_cpu_s * scale,
            router_item_cpu_s=self.router_item_cpu_s * scale,
            router_idle=idle,
        )

    def router_idle_table(self) -> npt.NDArray[np.float64]:
        """The router's idle penalty as the estimator reads it (``[2, K]``; none: 0)."""
        if self.router_idle is None:
            return np.zeros((2, 1), dtype=np.float64)
        return self.router_idle.table()

    def router_visit_cpu_s(self, batch: float = 1) -> float:
        """Router CPU of one stage visit in a batch of ``batch``, per item."""
        return self.router_batch_cpu_s / batch + self.router_item_cpu_s

    @property
    def hop_median_s(self) -> float:
        """Median of the hop samples."""
        return float(np.median(self.hop_s))

    @property
    def request_median_s(self) -> float:
        """Median of the request-path samples."""
        return float(np.median(self.request_s))

    def visit_s(self) -> float:
        """One stage visit's time besides the model with nothing queued: router CPU of a
        batch of one plus the median hop (what InferLine's per-hop constant measures)."""
        return self.router_visit_cpu_s(1) + self.hop_median_s

    def hop_table_s(self) -> npt.NDArray[np.float64]:
        """The hop samples as equally likely sorted values (the estimator's draws)."""
        return np.sort(np.asarray(self.hop_s, dtype=np.float64))

    def request_table_s(self) -> npt.NDArray[np.float64]:
        """The request-path samples as equally likely sorted values."""
        return np.sort(np.asarray(self.request_s, dtype=np.float64))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "routerRequestCpuSeconds": self.router_request_cpu_s,
            "routerBatchCpuSeconds": self.router_batch_cpu_s,
            "routerItemCpuSeconds": self.router_item_cpu_s,
            "workerBatchCpuSeconds": self.worker_batch_cpu_s,
            "hopSeconds": list(self.hop_s),
            "requestSeconds": list(self.request_s),
            "clientCpuSeconds": self.client_cpu_s,
        }
        if self.cores is not None:
            out["cores"] = self.cores
        if self.worker_nice:
            out["workerNice"] = self.worker_nice
        if self.router_idle is not None:
            out["routerIdlePenalty"] = self.router_idle.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingOverhead:
        cores = data.get("cores")
        router_idle = data.get("routerIdlePenalty")
        return cls(
            router_request_cpu_s=float(data["routerRequestCpuSeconds"]),
            router_batch_cpu_s=float(data["routerBatchCpuSeconds"]),
            router_item_cpu_s=float(data["routerItemCpuSeconds"]),
            worker_batch_cpu_s=float(data["workerBatchCpuSeconds"]),
            hop_s=tuple(float(v) for v in data["hopSeconds"]),
            request_s=tuple(float(v) for v in data["requestSeconds"]),
            client_cpu_s=float(data.get("clientCpuSeconds", 0.0)),
            cores=int(cores) if cores is not None else None,
            worker_nice=int(data.get("workerNice", 0)),
            router_idle=IdlePenalty.from_dict(router_idle) if router_idle is not None else None,
        )
