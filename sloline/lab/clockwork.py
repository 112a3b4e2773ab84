"""GPU-like batch-latency profiles from Clockwork's published measurements.

Clockwork (OSDI'20) reports GPU execution latency per batch size for common vision models;
the table ships as ``sloline/planner/data/clockwork_gpu_batch_latency.csv`` (columns
``model, ..., b1_ms, b2_ms, b4_ms, b8_ms, b16_ms``; lines starting with ``#`` are notes).
These profiles let the planner, its tests and benchmarks reason about an expensive-but-fast
accelerator without one. Clockwork's point is that GPU inference latency is nearly
deterministic, so p50 = mean and p99 = p50 x ``tail_ratio`` (1 by default). Weights
transfer (``transfer_ms``) is a one-off model load, not per-batch work, and is left out.

Reading this file is the planner's only I/O.
"""

from __future__ import annotations

import csv
import io
from importlib import resources
from pathlib import Path

from sloline.planner.profile import StageProfile

__all__ = ["DEFAULT_CSV", "load_clockwork_profiles"]

DEFAULT_CSV = "clockwork_gpu_batch_latency.csv"


def load_clockwork_profiles(
    path: str | Path | None = None, *, hardware: str = "gpu", tail_ratio: float = 1.0
) -> dict[str, StageProfile]:
    """Model name -> :class:`StageProfile` on ``hardware`` for every row of the CSV
    (the packaged copy unless ``path`` is given)."""
    if path is None:
        text = resources.files("sloline.planner").joinpath("data", DEFAULT_CSV).read_text()
    else:
        text = Path(path).read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    profiles: dict[str, StageProfile] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        batches = {
            int(key[1:-3]): float(value) / 1000.0
            for key, value in row.items()
            if key.startswith("b") and key.endswith("_ms")
        }
        if not batches:
            raise ValueError(f"{path or DEFAULT_CSV}: no b<N>_ms latency columns")
        profiles[row["model"]] = StageProfile.from_latencies(
            hardware, batches, tail_ratio=tail_ratio
        )
    return profiles
