"""Checks shared by the adapters and the stage runner: shapes and datatypes against the spec.

A stage declares each tensor per request, without the batch dimension, with -1 for a
variable dimension (`TensorSpec`). Models report shapes with the batch dimension and with
symbolic or unknown dimensions (ONNX `None` / `"batch"`). These helpers compare the two
and decide which datatype conversions are safe enough to do silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sloline.common.tensors import DTYPES

# A dimension as a model reports it: a size, or a name / None for a dynamic one.
Dim = int | str | None


def dims_match(declared: Sequence[int], actual: Sequence[Dim]) -> bool:
    """True when a per-request shape fits the declared one (-1 and dynamic dims match any).

    A per-request scalar also fits a declared `[1]`: classifiers commonly return labels
    shaped `(batch,)` where a spec declares one label per request.
    """
    if list(declared) == [1] and len(actual) == 0:
        return True
    if len(declared) != len(actual):
        return False
    return all(
        want == -1 or not isinstance(got, int) or got < 0 or want == got
        for want, got in zip(declared, actual, strict=True)
    )


def format_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def dtype_of(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of an Open Inference Protocol datatype name (`FP32` -> float32)."""
    return DTYPES[datatype]


def safe_cast(source: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether `source` values may be converted to `target` without asking the user.

    Lossless conversions are safe (int32 -> int64, uint8 -> float32, float32 -> float64),
    and so is narrowing one float type to another (float64 -> float32): models and numpy
    code produce float64 freely where a float32 tensor is declared, and the precision lost
    is what the declaration asks for. Anything that can change values (float -> int,
    int64 -> int32, signed -> unsigned) is not.
    """
    if source.kind == "O" or target.kind == "O":  # BYTES: see `bytes_array`
        return source == target
    if source == target or np.can_cast(source, target, casting="safe"):
        return True
    return source.kind == "f" and target.kind == "f"


def bytes_array(array: np.ndarray) -> np.ndarray | None:
    """A BYTES value as an object array of `bytes` (str elements UTF-8 encoded), or None
    when `array` holds something else. numpy `S` arrays drop trailing NUL bytes: return
    object arrays for binary data."""
    if array.dtype.kind in "SU":
        array = array.astype(object)
    elif array.dtype.kind != "O":
        return None
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for index, element in enumerate(array.reshape(-1)):
        if isinstance(element, str):
            flat[index] = element.encode()
        elif isinstance(element, bytes):
            flat[index] = element
        else:
            return None
    return out


def cast_hint(source: np.dtype[Any], datatype: str) -> str:
    """How to fix a datatype mismatch, for error messages."""
    target = dtype_of(datatype)
    return (
        f"return {target.name} values (e.g. `array.astype(np.{target.name})`) or declare "
        f"datatype {datatype_name(source)}"
    )


def datatype_name(dtype: np.dtype[Any] | None) -> str:
    """The Open Inference Protocol name of a numpy dtype, or a phrase saying there is none."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    return f"none: {dtype} has no Open Inference Protocol datatype"
