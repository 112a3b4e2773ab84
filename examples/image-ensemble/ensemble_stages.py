"""Python stages of the image-ensemble example, plus its sample requests.

`preprocess` turns a batch of 8-bit RGB images (height x width x 3, as decoded images come)
into the normalised channels-first float tensor the three CNNs take. `pick` is the
ensemble's combiner: per request, the member with the highest top-class probability wins,
and its probabilities, label and index (0 small, 1 medium, 2 large) are returned.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

IMAGE_SIZE = 64
MEMBERS = ("small", "medium", "large")  # `winner` indexes this tuple
# Per-channel RGB mean and standard deviation of ImageNet, the usual normalisation.
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)


def samples(count: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic synthetic images, one request per row: uint8 (count, 64, 64, 3).

    Each is a 4x4 grid of random colour blocks plus pixel noise, so images differ in
    colour and layout (pure noise would look the same to every CNN after pooling).
    """
    rng = np.random.default_rng(seed)
    block = IMAGE_SIZE // 4
    coarse = rng.integers(0, 256, size=(count, 4, 4, 3))
    blocks = np.repeat(np.repeat(coarse, block, axis=1), block, axis=2)
    noise = rng.integers(-24, 25, size=blocks.shape)
    return {"image": np.clip(blocks + noise, 0, 255).astype(np.uint8)}


def preprocess(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stacked batch: uint8 (batch, H, W, 3) -> float32 (batch, 3, H, W), normalised."""
    images = inputs["image"].astype(np.float32) / 255.0
    channels_first = images.transpose(0, 3, 1, 2)
    return {"image": np.ascontiguousarray((channels_first - MEAN) / STD)}


def pick(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stacked batch: the most confident member's probabilities, label and index."""
    stacked = np.stack([inputs[name] for name in MEMBERS], axis=1)  # (batch, members, classes)
    winner = stacked.max(axis=2).argmax(axis=1)
    probabilities = stacked[np.arange(len(stacked)), winner]
    return {
        "probabilities": probabilities,
        "label": probabilities.argmax(axis=1).astype(np.int64),
        "winner": winner.astype(np.int64),
    }
