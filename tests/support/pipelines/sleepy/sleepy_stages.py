"""Stages of the sleepy pipeline: 20 ms of wall time per request, no CPU."""

from __future__ import annotations

import time

import numpy as np

PER_REQUEST_S = 0.020


def identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(inputs)


def slow(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(PER_REQUEST_S * len(inputs["x"]))
    return dict(inputs)


def samples() -> dict[str, np.ndarray]:
    return {"x": np.arange(64, dtype=np.float32).reshape(16, 4)}
