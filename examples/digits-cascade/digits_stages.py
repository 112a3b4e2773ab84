"""Python stages of the digits-cascade example, plus its data split and sample requests.

The pipeline reads raw 8x8 digit images as scikit-learn's `load_digits` gives them (64
pixel intensities from 0 to 16), scales them once in `preprocess`, runs a fast linear
model, and sends only the requests it is unsure about to an accurate one. `combine` keeps
the accurate model's answer where it ran and the fast model's otherwise.

scikit-learn is imported only by the data helpers, so the serving stages start quickly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

SEED = 0
TEST_FRACTION = 0.3
MAX_PIXEL = 16.0


def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed, stratified train/test split: (x_train, x_test, y_train, y_test).

    x holds raw float32 pixels (0..16), y int64 labels.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data.astype(np.float32),
        digits.target.astype(np.int64),
        test_size=TEST_FRACTION,
        random_state=SEED,
        stratify=digits.target,
    )
    return x_train, x_test, y_train, y_test


def labelled_test_split() -> tuple[np.ndarray, np.ndarray]:
    """The test images (raw pixels, shape (n, 64)) and their labels."""
    _, x_test, _, y_test = split()
    return x_test, y_test


def samples() -> dict[str, np.ndarray]:
    """Sample requests for profiling: the test split's images, one request per row."""
    x_test, _ = labelled_test_split()
    return {"pixels": x_test}


def scale(pixels: np.ndarray) -> np.ndarray:
    """Raw 0..16 intensities -> float32 features in [0, 1] (what both models are trained on)."""
    return (np.clip(pixels, 0.0, MAX_PIXEL) / MAX_PIXEL).astype(np.float32)


def preprocess(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stacked batch: pixels (batch, 64) -> features (batch, 64)."""
    return {"features": scale(inputs["pixels"])}


def combine(items: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """List batch: the accurate model's probabilities where it ran, else the fast model's."""
    results = []
    for item in items:
        probabilities = item["accurate"] if "accurate" in item else item["fast"]
        label = np.array([int(np.argmax(probabilities))], dtype=np.int64)
        results.append({"probabilities": probabilities, "label": label})
    return results
