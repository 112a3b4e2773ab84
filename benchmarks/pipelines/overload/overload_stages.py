"""Stages of the overload benchmark's pipeline: identity, and 20 ms of sleep per batch."""

from __future__ import annotations

import time

import numpy as np

PER_BATCH_S = 0.020


def identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(inputs)


def fixed_sleep(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(PER_BATCH_S)
    return dict(inputs)
