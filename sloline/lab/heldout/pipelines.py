"""Random pipelines for the held-out evaluation: planning problems the planner is not
tuned on.

**Hardware**, priced like a cloud's on-demand instances (per replica-hour, each price
jittered ±15 % per pipeline, as between regions and vendors): ``gpu-large`` (a
datacenter GPU) about $3.40/h; ``gpu-small`` (an inference GPU, 2-5x slower) about
$0.70/h; ``cpu-1`` (one core) about $0.048/h; ``cpu-4`` (four cores, 3.3x faster per
item, parallelism is imperfect) about $0.19/h.

**Stages** are of two kinds. A *model* stage is GPU-like: on a GPU a batch of ``b``
takes a fixed cost plus a small per-item cost (batch-friendly, caps 16 or 32); the
smaller GPU pays more of both; on CPUs, where some models are not profiled at all, it is
per-item dominated and 15-50x slower than on the large GPU at batch 1. A *CPU* stage
(decode, tokenize, resize, rank) is per-item dominated everywhere (a fixed cost of
2-15 % of an item's) and runs on a GPU instance's host cores no faster than on ``cpu-4``.

**Layouts**, 3-6 stages: a chain; a fan-out/fan-in (one source, parallel branches, one
join); a layered DAG (random layer widths, each stage reads a random non-empty subset of
the layer before, the last layer one output stage). Often (60 %) one inner stage is
*conditional*: it is visited by a fraction 0.1-0.6 of the queries (its scale factor),
and the stages that read it treat it as optional, as a cascade's low-confidence branch.

**SLO**: 1.5-4x the pipeline's best no-queue latency (the longest path of its stages'
fastest batch-1 latencies plus hops). **Rate**: a base rate of 40-300 rps; the problem's
planning arrivals are a 30 s Poisson sample at that rate, which an evaluation replaces
with each trace's own planning sample.

Deterministic per seed. The constants here are this module's own, not the planner's
tests' or benchmarks'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from sloline.lab.synthetic import best_latency_s
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import PipelineProfile, StageProfile
from sloline.planner.topology import Topology

__all__ = ["CATALOG", "HeldoutPipeline", "Layout", "random_pipeline"]

Layout = Literal["chain", "fan", "layered"]
# name: (price per replica-hour, per-item speed-up over cpu-1 for CPU work)
CATALOG: dict[str, tuple[float, float]] = {
    "gpu-large": (3.40, 3.3),
    "gpu-small": (0.70, 3.3),
    "cpu-1": (0.048, 1.0),
    "cpu-4": (0.19, 3.3),
}
HOP_S = 0.0008
PLANNING_S = 30.0
MAX_REPLICAS = 64


@dataclass(frozen=True, slots=True, eq=False)
class HeldoutPipeline:
    """A random pipeline: its planning problem, base rate (for the trace shapes), layout,
    the kind of each stage and the conditional stage's visit probability, if any."""

    seed: int
    problem: PlanningProblem
    rate_rps: float
    layout: Layout
    kinds: dict[str, str]
    conditional: str | None


def _sizes(cap: int) -> list[int]:
    return [1 << k for k in range(cap.bit_length()) if 1 << k <= cap]


def _affine(hardware: str, fixed_s: float, per_item_s: float, cap: int) -> StageProfile:
    return StageProfile.from_latencies(hardware, {b: fixed_s + b * per_item_s for b in _sizes(cap)})


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _model_stage(rng: np.random.Generator) -> dict[str, StageProfile]:
    fixed = _log_uniform(rng, 0.002, 0.015)
    per_item = fixed * float(rng.uniform(0.05, 0.25))
    cap = int(rng.choice([16, 32]))
    out = {
        "gpu-large": _affine("gpu-large", fixed, per_item, cap),
        "gpu-small": _affine(
            "gpu-small",
            fixed * float(rng.uniform(1.5, 2.5)),
            per_item * float(rng.uniform(2.0, 5.0)),
            cap,
        ),
    }
    if rng.random() < 0.7:  # small enough to also run on CPUs
        single = (fixed + per_item) * float(rng.uniform(15.0, 50.0))
        for hw in ("cpu-1", "cpu-4"):
            out[hw] = _affine(hw, 0.0002, single / CATALOG[hw][1], 8)
    return out


def _cpu_stage(rng: np.random.Generator) -> dict[str, StageProfile]:
    per_item = _log_uniform(rng, 0.0005, 0.006)
    fixed = per_item * float(rng.uniform(0.02, 0.15))
    return {
        hw: _affine(hw, fixed / speed, per_item / speed, 8) for hw, (_, speed) in CATALOG.items()
    }


def _layers(rng: np.random.Generator, n: int, layout: Layout) -> list[int]:
    """Layer widths summing to ``n``, first and last 1."""
    if layout == "chain":
        return [1] * n
    if layout == "fan":
        return [1, n - 2, 1]
    widths = [1]
    left = n - 2
    while left > 0:
        w = int(rng.integers(1, min(3, left) + 1))
        widths.append(w)
        left -= w
    return [*widths, 1]


def _deps(rng: np.random.Generator, widths: list[int]) -> tuple[list[list[int]], list[int]]:
    """Each stage reads a random non-empty subset of the previous layer, and every stage
    of a layer is read by the next (so every stage reaches the output)."""
    layer_of: list[int] = [k for k, w in enumerate(widths) for _ in range(w)]
    starts = np.cumsum([0, *widths])
    deps: list[list[int]] = [[] for _ in layer_of]
    for k in range(1, len(widths)):
        prev = list(range(int(starts[k - 1]), int(starts[k])))
        here = list(range(int(starts[k]), int(starts[k + 1])))
        for m in here:
            size = int(rng.integers(1, len(prev) + 1))
            deps[m] = sorted(int(p) for p in rng.choice(prev, size=size, replace=False))
        for p in prev:  # nobody left unread
            if not any(p in deps[m] for m in here):
                deps[here[int(rng.integers(len(here)))]].append(p)
    return [sorted(d) for d in deps], layer_of


def random_pipeline(seed: int) -> HeldoutPipeline:
    """The held-out pipeline of ``seed`` (module docstring); same seed, same pipeline."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x4E1D]))
    n = int(rng.integers(3, 7))
    layout: Layout = ("chain", "fan", "layered")[int(rng.integers(3))]
    widths = _layers(rng, n, layout)
    deps, layer_of = _deps(rng, widths)
    last = len(widths) - 1
    kinds = []
    for m in range(n):
        edge = layer_of[m] in (0, last)
        kinds.append("model" if rng.random() < (0.3 if edge else 0.75) else "cpu")
    if "model" not in kinds:
        kinds[int(rng.integers(n))] = "model"
    names = [f"{kind}{m}" for m, kind in enumerate(kinds)]
    profiles = {
        name: _model_stage(rng) if kind == "model" else _cpu_stage(rng)
        for name, kind in zip(names, kinds, strict=True)
    }
    inner = [m for m in range(n) if 0 < layer_of[m] < last]
    conditional: str | None = None
    scale: dict[str, float] = {}
    if inner and rng.random() < 0.6:
        c = inner[int(rng.integers(len(inner)))]
        conditional = names[c]
        scale[conditional] = round(float(rng.uniform(0.1, 0.6)), 3)
    dep_names = {names[m]: [names[d] for d in deps[m]] for m in range(n)}
    optional = {name: [conditional] for name, ds in dep_names.items() if conditional in ds}
    topology = Topology.from_deps(dep_names, names[-1], optional)
    profile = PipelineProfile(profiles, scale, hop_s=HOP_S)
    floor = best_latency_s(topology, profiles, HOP_S)
    prices = {
        hw: round(price * float(rng.uniform(0.85, 1.15)), 4) for hw, (price, _) in CATALOG.items()
    }
    rate = _log_uniform(rng, 40.0, 300.0)
    gaps = rng.exponential(1.0 / rate, size=int(rate * PLANNING_S * 1.5) + 16)
    arrivals = np.cumsum(gaps)
    problem = PlanningProblem(
        topology=topology,
        profile=profile,
        hardware_costs=prices,
        slo_s=floor * float(rng.uniform(1.5, 4.0)),
        arrivals_s=arrivals[arrivals < PLANNING_S],
        max_replicas=MAX_REPLICAS,
        name=f"heldout-{seed}",
    )
    return HeldoutPipeline(
        seed=seed,
        problem=problem,
        rate_rps=rate,
        layout=layout,
        kinds=dict(zip(names, kinds, strict=True)),
        conditional=conditional,
    )
