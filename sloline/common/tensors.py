"""Transport-agnostic data-plane types: tensors, requests, responses and errors.

REST and gRPC adapters translate their wire formats into these types and call one
`DataPlane` (KServe's layering). A `Tensor` keeps the raw bytes it arrived with, so a
request forwarded from the front door to a worker and back is never converted to Python
lists; numpy views are made only where a value is read (conditions, JSON responses).
Tensors a worker returned are views of the received message (`wire.py`), not copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

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
}
DATATYPE_OF: dict[np.dtype[Any], str] = {v: k for k, v in DTYPES.items()}

# Named numpy arrays: one request's inputs, or one stage's outputs for one request.
Arrays = dict[str, np.ndarray]


def datatype_of(array: np.ndarray) -> str:
    try:
        return DATATYPE_OF[array.dtype]
    except KeyError:
        raise TypeError(f"dtype {array.dtype} has no Open Inference Protocol datatype") from None


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
        array = np.ascontiguousarray(array)
        return Tensor(datatype_of(array), tuple(array.shape), array.tobytes())

    def array(self) -> np.ndarray:
        """A read-only numpy view of the bytes (no copy)."""
        return np.frombuffer(self.data, dtype=DTYPES[self.datatype]).reshape(self.shape)

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
