"""Tensors from the Open Inference Protocol v2 wire formats: the checks both front doors
share, and JSON values <-> tensors.

Both front doors are thin: `http.py` and `grpc_frontdoor.py` only move bytes and call
the codecs, `rest_codec.py` (the REST JSON body with Triton's binary tensor extension)
and `grpc_codec.py` (the gRPC `ModelInferRequest` messages), so both mean exactly the
same `InferRequest` / `InferResponse`. The codecs only decode and encode: the model name
and version, the inputs and the requested outputs are checked against the pipeline once,
by the router (`checks.py`), which also picks the outputs of the answer; a codec writes
the outputs of the `InferResponse` it is given, in its order.

Decoding is strict: every problem a client can cause in the encoding raises
`InvalidInput` with a message naming the input and what is wrong. The checks here
(datatype, shape, raw size, finite floats) are the ones both codecs use, so a shape or
size error reads the same from REST and gRPC, and a fix to one is a fix to both. It is
also the hot path, so typed data goes straight into numpy.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator
from typing import Final

import numpy as np
import orjson

from sloline.common.tensors import BYTES, DTYPES, InvalidInput, Tensor, check_bytes, serialize_bytes

SERVER_NAME: Final = "sloline"
# OIP extensions both front doors implement (reported by `GET /v2` and ServerMetadata).
SERVER_EXTENSIONS: Final = (
    "binary_tensor_data",
    "parameters",
    "model_configuration",
    "statistics",
    "model_repository",
)

_SUPPORTED: Final = ", ".join(DTYPES)
_INT_KINDS: Final = frozenset("iu")
_NUMBER_KINDS: Final = frozenset("iuf")
_FLOATS: Final = frozenset(("FP16", "FP32", "FP64"))
# orjson serialises these numpy dtypes natively; FP16 is widened to FP32 (exact) first.
_JSON_WIDEN: Final = {np.dtype(np.float16): np.dtype(np.float32)}


def check_datatype(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in DTYPES:
        why = " (sloline does not serve BF16)" if value == "BF16" else ""
        raise InvalidInput(
            f"{where} has unsupported datatype {value!r}{why}; use one of {_SUPPORTED}"
        )
    return value


def check_shape(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        raise InvalidInput(f"{where} has shape {value!r}; expected a list of integers")
    if any(d < 0 for d in value):
        raise InvalidInput(f"{where} has negative dimension in shape {list(value)}")
    return tuple(value)


def tensor_from_raw(
    where: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview
) -> Tensor:
    if datatype == BYTES:
        try:
            check_bytes(data, math.prod(shape))
        except ValueError as exc:
            raise InvalidInput(
                f"{where} has malformed BYTES raw data for shape {list(shape)}: {exc}"
            ) from None
        return Tensor(datatype, shape, data)
    expected = math.prod(shape) * DTYPES[datatype].itemsize
    if len(data) != expected:
        raise InvalidInput(
            f"{where} has {len(data)} bytes of raw data but {datatype} shape "
            f"{list(shape)} needs {expected}"
        )
    return Tensor(datatype, shape, data)


def check_finite(where: str, tensor: Tensor) -> None:
    """Refuse NaN and infinities in a float tensor (400 naming it). JSON cannot carry them,
    so both doors refuse them alike; a model that needs "missing" values takes a mask."""
    if tensor.datatype in _FLOATS and tensor.data:
        array = np.frombuffer(tensor.data, dtype=DTYPES[tensor.datatype])
        finite = np.isfinite(array)
        if not finite.all():
            index = int(np.argmin(finite))
            raise InvalidInput(
                f"{where} has a non-finite value ({float(array[index])} at flat index {index}); "
                f"{tensor.datatype} inputs must be finite (no NaN or infinity)"
            )


def _walk(data: object) -> Iterator[object]:
    if isinstance(data, list):
        for item in data:
            yield from _walk(item)
    else:
        yield data


_NOTHING: Final = object()


def _first(data: object, bad: type | tuple[type, ...], *, allow: type | None = None) -> object:
    return next(
        (v for v in _walk(data) if isinstance(v, bad) and not (allow and isinstance(v, allow))),
        None,
    )


def _all_ints(data: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in _walk(data))


def _conversion_error(where: str, datatype: str, data: object, kind: str) -> InvalidInput:
    """Find the value numpy could not take, to name it in the message (error path only)."""
    out_of_range = InvalidInput(f"{where} has integers out of range for {datatype}")
    if kind in "OUS":
        odd = next((v for v in _walk(data) if not isinstance(v, int | float)), _NOTHING)
        if odd is _NOTHING:
            return out_of_range
        return InvalidInput(
            f"{where} ({datatype}) has non-numeric value {orjson.dumps(odd).decode()}"
        )
    if datatype == "BOOL":
        odd = _first(data, (int, float), allow=bool)
        return InvalidInput(f"{where} is BOOL and needs true/false values, got {odd!r}")
    if kind == "b":
        return InvalidInput(f"{where} is {datatype} and needs numbers, got true/false")
    odd = _first(data, float)
    if odd is not None:
        return InvalidInput(f"{where} is {datatype} and needs integers, got {odd!r}")
    return out_of_range


# The tensor parameter saying JSON BYTES values are base64 (MLServer's convention); without
# it they are UTF-8 text.
CONTENT_TYPE: Final = "content_type"
BASE64: Final = "base64"


def _bytes_from_values(
    where: str, shape: tuple[int, ...], data: list[object], encoded: bool
) -> Tensor:
    values = list(_walk(data))
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(
            f"{where} has {len(values)} values but shape {list(shape)} needs {count}"
        )
    odd = next((v for v in values if not isinstance(v, str)), _NOTHING)
    if odd is not _NOTHING:
        raise InvalidInput(
            f"{where} is BYTES and needs JSON strings, got {orjson.dumps(odd).decode()}"
        )
    if not encoded:
        return Tensor(BYTES, shape, serialize_bytes(values))
    try:
        elements = [base64.b64decode(v, validate=True) for v in values]  # type: ignore[arg-type]
    except (binascii.Error, ValueError):
        raise InvalidInput(
            f"{where} has {CONTENT_TYPE} {BASE64} but a value is not base64"
        ) from None
    return Tensor(BYTES, shape, serialize_bytes(elements))


def tensor_from_values(
    where: str, datatype: str, shape: tuple[int, ...], data: object, *, base64_data: bool = False
) -> Tensor:
    """Tensor from JSON `data` (flat or nested, row-major); checks type, range and count.
    BYTES values are strings: UTF-8 text, or base64 when `base64_data`."""
    if not isinstance(data, list):
        raise InvalidInput(f"{where} has data {data!r}; expected a JSON array")
    if datatype == BYTES:
        return _bytes_from_values(where, shape, data, base64_data)
    count = math.prod(shape)
    dtype = DTYPES[datatype]
    try:
        values = np.array(data)
    except (ValueError, TypeError):
        raise InvalidInput(
            f"{where} has ragged nested data; nested lists must be rectangular "
            "(or send the data flat)"
        ) from None
    if values.size != count:
        raise InvalidInput(
            f"{where} has {values.size} values but shape {list(shape)} needs {count}"
        )
    if count == 0:
        return Tensor(datatype, shape, b"")
    kind = values.dtype.kind
    if dtype.kind in _INT_KINDS and kind in "fO" and _all_ints(data):
        # numpy infers float64 (lossy) or object when ints beyond INT64 are mixed with
        # others (UINT64 data); convert exactly, numpy refusing what does not fit.
        try:
            values = np.array(data, dtype=dtype)
        except OverflowError:
            raise InvalidInput(f"{where} has integers out of range for {datatype}") from None
        kind = dtype.kind
    ok = (
        kind == "b"
        if datatype == "BOOL"
        else kind in (_INT_KINDS if dtype.kind in _INT_KINDS else _NUMBER_KINDS)
    )
    if not ok:
        raise _conversion_error(where, datatype, data, kind)
    if dtype.kind in _INT_KINDS:
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise _conversion_error(where, datatype, data, kind)
    with np.errstate(over="ignore"):
        array = values.astype(dtype, copy=False)
    if dtype.kind == "f" and np.isinf(array).any():
        # JSON has no infinities, so an infinity here is a value too large for the type.
        raise InvalidInput(f"{where} has values out of range for {datatype}")
    return Tensor(datatype, shape, array.tobytes())


def json_values(tensor: Tensor) -> tuple[np.ndarray | list[str], bool]:
    """The flat array JSON carries for `tensor` (FP16 widened to FP32, exactly), and
    whether it is base64: BYTES elements are UTF-8 text when all of them decode, else all
    base64."""
    array = tensor.array().reshape(-1)
    if tensor.datatype == BYTES:
        try:
            return [element.decode() for element in array], False
        except UnicodeDecodeError:
            return [base64.b64encode(element).decode() for element in array], True
    widened = _JSON_WIDEN.get(array.dtype)
    return (array if widened is None else array.astype(widened)), False
