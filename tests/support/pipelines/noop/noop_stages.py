"""Stages of the no-op pipeline: identity, and a stage that fails or crashes on demand."""

from __future__ import annotations

import os

import numpy as np


def identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(inputs)


def crash_on_negative(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Kills its own process when any request carries a negative first value: a worker
    crash mid-batch, for the retry-then-fail test."""
    if (inputs["x"][:, 0] < 0).any():
        os._exit(3)
    if (inputs["x"][:, 0] > 1e9).any():
        raise ValueError("value too large for this model")
    return dict(inputs)


def reciprocal(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """1 / x: an infinity for a zero, so a finite input can give a non-finite output."""
    with np.errstate(divide="ignore", over="ignore"):
        return {"y": (1.0 / inputs["x"]).astype(np.float32)}
