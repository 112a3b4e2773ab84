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


# ---------------------------------------------------------------- pipeline-png.yaml
# The same models behind a BYTES input: each request is one encoded 8x8 grayscale image
# (PNG or JPEG, decoded with Pillow), and the answer carries the digit's name as BYTES.

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def encode_png(pixels: np.ndarray) -> bytes:
    """Raw 0..16 intensities (64 values) -> an 8x8 8-bit grayscale PNG."""
    import io

    from PIL import Image

    levels = np.round(np.clip(pixels, 0.0, MAX_PIXEL) * (255.0 / MAX_PIXEL)).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(levels.reshape(8, 8), mode="L").save(out, format="PNG")
    return out.getvalue()


def png_samples() -> dict[str, np.ndarray]:
    """Sample requests for profiling pipeline-png.yaml: the test images, encoded."""
    x_test, _ = labelled_test_split()
    images = np.empty((len(x_test), 1), dtype=object)
    for i, row in enumerate(x_test):
        images[i, 0] = encode_png(row)
    return {"image": images}


def decode(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stacked batch: image (batch, 1) object array of encoded images -> pixels (batch, 64),
    0..16 intensities as load_digits has them. An empty element is a blank image (workers
    warm up with empty BYTES)."""
    import io

    from PIL import Image

    images = inputs["image"]
    pixels = np.zeros((len(images), 64), dtype=np.float32)
    for i, encoded in enumerate(images[:, 0]):
        if not encoded:
            continue
        with Image.open(io.BytesIO(encoded)) as image:
            gray = image.convert("L").resize((8, 8))
            pixels[i] = np.asarray(gray, dtype=np.float32).reshape(64) * (MAX_PIXEL / 255.0)
    return {"pixels": pixels}


def name(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stacked batch: probabilities (batch, 10) -> label (batch, 1) and its name as BYTES."""
    labels = np.argmax(inputs["probabilities"], axis=1)
    words = np.empty((len(labels), 1), dtype=object)
    words[:, 0] = [DIGIT_NAMES[label].encode() for label in labels]
    return {"label": labels.astype(np.int64).reshape(-1, 1), "name": words}
