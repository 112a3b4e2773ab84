"""Stages of the burny pipeline: a batch burns 30 ms of CPU plus 2 ms per request."""

from __future__ import annotations

import time

import numpy as np

PER_BATCH_S = 0.030
PER_REQUEST_S = 0.002


def burn(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Spin on the CPU (not sleep): a calibration of CPU classes counts CPU time."""
    until = time.process_time() + PER_BATCH_S + PER_REQUEST_S * len(inputs["x"])
    while time.process_time() < until:
        pass
    return dict(inputs)


def samples() -> dict[str, np.ndarray]:
    return {"x": np.arange(64, dtype=np.float32).reshape(16, 4)}
