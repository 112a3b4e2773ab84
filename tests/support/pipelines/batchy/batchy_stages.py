"""Stages of the batchy pipeline: a batch sleeps 10 ms plus 2 ms per request, no CPU."""

from __future__ import annotations

import time

import numpy as np

PER_BATCH_S = 0.010
PER_REQUEST_S = 0.002


def batched(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(PER_BATCH_S + PER_REQUEST_S * len(inputs["x"]))
    return dict(inputs)


def samples() -> dict[str, np.ndarray]:
    return {"x": np.arange(64, dtype=np.float32).reshape(16, 4)}
