"""Transport-agnostic data-plane types: tensors, requests, responses and errors.

REST and gRPC adapters translate their wire formats into these types and call one
`DataPlane` (KServe's layering). A `Tensor` keeps the raw bytes it arrived with, so a
request forwarded from the front door to a worker and back is never converted to Python
lists; numpy views are made only where a value is read (conditions, JSON responses).
Tensors a worker returned are views of the received message (`wire.py`), not copies.

BYTES tensors (text, encoded images) are variable-length: their raw form is Triton's,
each element as a 4-byte little-endian length followed by its bytes, in row-major order
(what the REST binary extension and gRPC's raw contents carry). As numpy they are object
arrays whose elements are `bytes`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
DATATYPE_OF: dict[np.dtype[Any], str] = {v: k for k, v in DTYPES.items()}
BYTES: Final = "BYTES"
_LENGTH: Final = struct.Struct("<I")

# Named numpy arrays: one request's inputs, or one stage's outputs for one request.
Arrays = dict[str, np.ndarray]


def datatype_of(array: np.ndarray) -> str:
    try:
        return DATATYPE_OF[array.dtype]
    except KeyError:
        if array.dtype.kind in "SU":  # numpy bytes and str arrays travel as BYTES
            return BYTES
        raise TypeError(f"dtype {array.dtype} has no Open Inference Protocol datatype") from None


def serialize_bytes(elements: np.ndarray | Sequence[object]) -> bytes:
    """The raw form of BYTES elements (row-major): each a 4-byte little-endian length and
    its bytes. Elements are `bytes` (or anything `bytes()` takes but an int) or `str`
    (UTF-8); anything else raises `TypeError`."""
    flat = elements.reshape(-1) if isinstance(elements, np.ndarray) else elements
    parts: list[bytes] = []
    for element in flat:
        if isinstance(element, str):
            data = element.encode()
        elif isinstance(element, bytes | bytearray | memoryview):
            data = bytes(element)
        else:
            raise TypeError(f"a BYTES element must be bytes or str, got {type(element).__name__}")
        parts += (_LENGTH.pack(len(data)), data)
    return b"".join(parts)


def _spans(data: bytes | memoryview, count: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each of `count` BYTES elements in `data`; `ValueError` saying what
    is wrong unless they fill it exactly."""
    size = len(data)
    position = 0
    for index in range(count):
        if position + 4 > size:
            raise ValueError(
                f"BYTES data ends at byte {size} where element {index} of {count} should "
                "start with its 4-byte length"
            )
        (length,) = _LENGTH.unpack_from(data, position)
        start = position + 4
        position = start + length
        if position > size:
            raise ValueError(
                f"BYTES element {index} says it has {length} bytes but only {size - start} remain"
            )
        yield start, position
    if position != size:
        raise ValueError(f"BYTES data has {size - position} bytes after its {count} elements")


def check_bytes(data: bytes | memoryview, count: int) -> None:
    """`ValueError` unless `data` is exactly `count` length-prefixed BYTES elements."""
    for _ in _spans(data, count):
        pass


def deserialize_bytes(data: bytes | memoryview, shape: Sequence[int]) -> np.ndarray:
    """BYTES raw data -> an object array of `bytes` of `shape` (`ValueError` if malformed)."""
    count = math.prod(shape)
    array = np.empty(count, dtype=object)
    view = memoryview(data)
    for index, (start, end) in enumerate(_spans(view, count)):
        array[index] = bytes(view[start:end])
    return array.reshape(shape)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor as raw little-endian bytes in C order, plus its datatype and shape.

    `data` is `bytes`, or a read-only byte view of a larger received message.
    """

    datatype: str
    shape: tuple[int, ...]
    data: bytes | memoryview

    @staticmethod
    def from_array(array: np.ndarray) -> Tensor:
        datatype = datatype_of(array)
        if datatype == BYTES:
            return Tensor(datatype, tuple(array.shape), serialize_bytes(array))
        array = np.ascontiguousarray(array)
        return Tensor(datatype, tuple(array.shape), array.tobytes())

    def array(self) -> np.ndarray:
        """A read-only numpy view of the bytes (no copy); BYTES: an object array of
        `bytes` elements (decoded, a copy)."""
        if self.datatype == BYTES:
            return deserialize_bytes(self.data, self.shape)
        return np.frombuffer(self.data, dtype=DTYPES[self.datatype]).reshape(self.shape)

    def split_rows(self) -> list[Tensor]:
        """The tensor's rows (along its first dimension), as views of its data."""
        rows, shape = self.shape[0], self.shape[1:]
        view = memoryview(self.data)
        if self.datatype == BYTES:
            per_row = math.prod(shape)
            if per_row:
                ends = [end for _, end in _spans(view, rows * per_row)][per_row - 1 :: per_row]
            else:
                ends = [0] * rows
            starts = [0, *ends[:-1]]
        else:
            size = len(view) // rows if rows else 0
            starts = list(range(0, rows * size, size))
            ends = [start + size for start in starts]
        return [Tensor(self.datatype, shape, view[a:b]) for a, b in zip(starts, ends, strict=True)]

    @staticmethod
    def join_rows(rows: Sequence[Tensor]) -> Tensor:
        """One tensor stacking `rows` (same datatype and shape) along a new first
        dimension; `ValueError` when their shapes or datatypes differ."""
        first = rows[0]
        for row in rows[1:]:
            if row.shape != first.shape or row.datatype != first.datatype:
                raise ValueError(
                    f"rows have different shapes or datatypes ({first.datatype} "
                    f"{list(first.shape)} and {row.datatype} {list(row.shape)})"
                )
        return Tensor(first.datatype, (len(rows), *first.shape), b"".join(r.data for r in rows))

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True, slots=True)
class InferRequest:
    model_name: str
    inputs: dict[str, Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    # Names of outputs the client asked for (None = all) and which to return as binary.
    outputs: tuple[str, ...] | None = None
    binary_outputs: frozenset[str] = frozenset()
    model_version: str = ""  # as the client named it ("" = any); the data plane checks it


@dataclass(frozen=True, slots=True)
class InferResponse:
    model_name: str
    outputs: dict[str, Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


class InferenceError(Exception):
    """An error with the HTTP status a client should see (gRPC maps it to a code)."""

    status = 500

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidInput(InferenceError):
    status = 400


class ModelNotFound(InferenceError):
    status = 404


class PayloadTooLarge(InferenceError):
    status = 413


class Overloaded(InferenceError):
    """Load shedding: the stage queue is full; retry after `retry_after_s`."""

    status = 503


class DeadlineExceeded(InferenceError):
    """The request could not finish within its deadline (derived from the SLO)."""

    status = 504


class StageFailed(InferenceError):
    """A model raised, or the request kept killing its worker (isolated, then failed)."""

    status = 500


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    platform: str
    versions: tuple[str, ...]
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


class DataPlane(Protocol):
    """What the REST and gRPC front doors need from the router.

    The doors pass model names and versions ("" = any) through; the plane checks them
    and raises `ModelNotFound` for a model or version it does not serve.
    """

    def live(self) -> bool: ...

    def ready(self) -> bool: ...

    def check_model(self, name: str, version: str = "") -> None:
        """Raise `ModelNotFound` unless the plane serves `name` (at `version`). The doors
        call it before reading a request body: an unknown model is 404 whatever it sent."""
        ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    async def infer(self, request: InferRequest) -> InferResponse:
        """Check the request (its model and version as `check_model` does), run it, and
        answer with the outputs it asked for, in its order (all when it named none).
        Raise an `InferenceError` subclass for every failure a client should see."""
        ...
