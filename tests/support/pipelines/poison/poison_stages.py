"""Stages of the poison pipeline: `double` kills its own worker process (os._exit(1),
as a segfaulting native library would) when a batch holds the magic value, else
doubles (a batch takes 50 ms); `inc` adds one. A request x is answered 2x + 1."""

from __future__ import annotations

import os
import time

import numpy as np

MAGIC = 666.0
PER_BATCH_S = 0.05  # so that a burst's requests queue up and share batches


def double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(PER_BATCH_S)
    if (inputs["x"] == MAGIC).any():
        os._exit(1)
    return {"x": inputs["x"] * 2}


def inc(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x": inputs["x"] + 1}
