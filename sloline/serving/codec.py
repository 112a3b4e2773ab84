"""Wire formats of the Open Inference Protocol v2 <-> the data-plane types.

Both front doors are thin: `http.py` and `grpc_frontdoor.py` only move bytes and call the
functions here, so the REST JSON (with Triton's binary tensor extension) and the gRPC
`ModelInfer` messages mean exactly the same `InferRequest` / `InferResponse`.

Decoding is strict: every problem a client can cause raises `InvalidInput` with a
message naming the input and what is wrong. It is also the hot path, so JSON is parsed
with orjson, typed data goes straight into numpy, and binary tensors are sliced out of
the received body chunks through memoryviews: a tensor inside one chunk stays a view of
it, one that spans chunks is joined once; responses keep the JSON header and the tensors
as separate parts for the server to write.

Binary extension (same semantics as Triton and tritonclient): a request body may be a
JSON header of `Inference-Header-Content-Length` bytes followed by the raw bytes of every
input whose `parameters.binary_data_size` is set, in input order. An output is returned
raw when its requested `parameters.binary_data` is true, or when the request parameter
`binary_data_output` is true and the output does not say otherwise; the response then
carries the same header and layout.

Both wire formats live in this one module (past the usual ~500 lines) so that they share
one set of checks and error messages: a shape or size error reads the same from REST
and gRPC, and a fix to one is a fix to both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

from sloline.common.tensors import (
    DTYPES,
    InferRequest,
    InferResponse,
    InvalidInput,
    ModelMetadata,
    Tensor,
)
from sloline.serving.proto import grpc_service_pb2 as pb

HEADER_LENGTH: Final = "Inference-Header-Content-Length"
BINARY_DATA_SIZE: Final = "binary_data_size"
BINARY_DATA: Final = "binary_data"
BINARY_DATA_OUTPUT: Final = "binary_data_output"
SERVER_NAME: Final = "sloline"
# OIP extensions both front doors implement (reported by `GET /v2` and ServerMetadata).
SERVER_EXTENSIONS: Final = ("binary_tensor_data", "parameters")

_SUPPORTED: Final = ", ".join(DTYPES)
_INT_KINDS: Final = frozenset("iu")
_NUMBER_KINDS: Final = frozenset("iuf")
_FLOATS: Final = frozenset(("FP16", "FP32", "FP64"))
# orjson serialises these numpy dtypes natively; FP16 is widened to FP32 (exact) first.
_JSON_WIDEN: Final = {np.dtype(np.float16): np.dtype(np.float32)}

# gRPC typed contents: which repeated field carries a datatype, and its element dtype.
_CONTENTS: Final[dict[str, tuple[str, np.dtype[Any]]]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
}
_CONTENT_FIELDS: Final = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)


@dataclass(frozen=True, slots=True)
class RestBody:
    """An encoded REST body: the JSON header, then each binary tensor, not yet joined.

    `header_length` is set when binary tensors follow the JSON. A server writes `parts`
    one after another (no joined copy of the tensors); `body` joins them.
    """

    parts: tuple[bytes | memoryview, ...]  # tensors may be views of a worker's message
    header_length: int | None = None

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.parts)


# ---------------------------------------------------------------- shared validation


def _datatype(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in DTYPES:
        why = " (sloline serves numeric tensors only)" if value in ("BYTES", "BF16") else ""
        raise InvalidInput(
            f"{where} has unsupported datatype {value!r}{why}; use one of {_SUPPORTED}"
        )
    return value


def _shape(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        raise InvalidInput(f"{where} has shape {value!r}; expected a list of integers")
    if any(d < 0 for d in value):
        raise InvalidInput(f"{where} has negative dimension in shape {list(value)}")
    return tuple(value)


def _from_raw(
    where: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview
) -> Tensor:
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


def _from_values(where: str, datatype: str, shape: tuple[int, ...], data: object) -> Tensor:
    """Tensor from JSON `data` (flat or nested, row-major); checks type, range and count."""
    if not isinstance(data, list):
        raise InvalidInput(f"{where} has data {data!r}; expected a JSON array")
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


def _select(request: InferRequest, response: InferResponse) -> list[tuple[str, Tensor]]:
    """The outputs the client asked for, in its order (all of them when it asked for none)."""
    if request.outputs is None:
        return list(response.outputs.items())
    missing = [n for n in request.outputs if n not in response.outputs]
    if missing:
        raise InvalidInput(
            f"requested output(s) {missing} not produced; model "
            f"{response.model_name!r} returns {sorted(response.outputs)}"
        )
    return [(n, response.outputs[n]) for n in request.outputs]


def _binary(request: InferRequest, name: str) -> bool:
    if request.outputs is None:
        return request.parameters.get(BINARY_DATA_OUTPUT) is True
    return name in request.binary_outputs


# ---------------------------------------------------------------- REST


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a JSON object, got {orjson.dumps(value).decode()}")
    return value


def _header_length(header_length: str | None, body_size: int) -> int | None:
    if header_length is None:
        return None
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 < length <= body_size:
        raise InvalidInput(
            f"{HEADER_LENGTH} header is {header_length!r}; expected the JSON header size "
            f"in bytes, between 1 and the body size {body_size}"
        )
    return length


Body = bytes | bytearray | memoryview | Sequence[bytes]


class _BodyReader:
    """A body as received (one buffer or the transport's chunks), read front to back.

    Reads inside one chunk are memoryview slices (no copy); a read across chunks joins
    just those slices.
    """

    __slots__ = ("_chunks", "_index", "_position", "consumed", "size")

    def __init__(self, body: Body) -> None:
        chunks = [body] if isinstance(body, bytes | bytearray | memoryview) else body
        self._chunks = [memoryview(chunk).cast("B") for chunk in chunks if len(chunk)]
        self._index = self._position = self.consumed = 0
        self.size = sum(len(chunk) for chunk in self._chunks)

    def read(self, size: int) -> memoryview | bytes:
        """The next `size` bytes (the caller checked that they are there)."""
        self.consumed += size
        chunk = self._chunks[self._index] if self._index < len(self._chunks) else memoryview(b"")
        end = self._position + size
        if end <= len(chunk):
            self._position = end
            return chunk[end - size : end]
        pieces = []
        while size:
            chunk = self._chunks[self._index]
            piece = chunk[self._position : self._position + size]
            pieces.append(piece)
            size -= len(piece)
            self._position += len(piece)
            if self._position == len(chunk):
                self._index, self._position = self._index + 1, 0
        return b"".join(pieces)


def _parse_json(reader: _BodyReader, json_size: int | None, what: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(reader.read(reader.size if json_size is None else json_size))
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON in {what}: {exc}") from None
    return _object(doc, what)


def decode_rest_request(
    model_name: str, body: Body, header_length: str | None = None
) -> InferRequest:
    """Parse `POST /v2/models/{model_name}/infer`; `header_length` is that header's value.

    `body` may be the list of chunks the server received: binary tensors are copied out
    of them once, never joined into one more copy of the whole body first.
    """
    reader = _BodyReader(body)
    json_size = _header_length(header_length, reader.size)
    doc = _parse_json(reader, json_size, "request body")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request body needs 'inputs': a non-empty list of input tensors")
    parameters = _object(doc.get("parameters", {}), "'parameters'")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput(f"'id' must be a string, got {request_id!r}")

    inputs: dict[str, Tensor] = {}
    binary = _BinarySection(reader, json_size)
    for i, item in enumerate(raw_inputs):
        spec = _object(item, f"inputs[{i}]")
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"inputs[{i}] needs a non-empty string 'name'")
        if name in inputs:
            raise InvalidInput(f"input {name!r} is given more than once")
        where = f"input {name!r}"
        inputs[name] = tensor = _input_from_json(where, spec, binary)
        check_finite(where, tensor)
    binary.check_consumed()
    outputs, binary_outputs = _requested_outputs(doc.get("outputs"), parameters)
    return InferRequest(model_name, inputs, request_id, parameters, outputs, binary_outputs)


class _BinarySection:
    """The bytes after the JSON header, handed out to binary inputs in order."""

    __slots__ = ("_reader", "_start")

    def __init__(self, reader: _BodyReader, json_size: int | None) -> None:
        self._reader = reader
        self._start = -1 if json_size is None else json_size

    def take(self, where: str, size: object) -> bytes | memoryview:
        if self._start < 0:
            raise InvalidInput(
                f"{where} sets parameters.{BINARY_DATA_SIZE} but the request has no "
                f"{HEADER_LENGTH} header saying where the binary data starts"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"{where} has {BINARY_DATA_SIZE} {size!r}; expected bytes >= 0")
        offset = self._reader.consumed - self._start
        if self._reader.consumed + size > self._reader.size:
            raise InvalidInput(
                f"{where} needs {size} binary bytes at offset {offset} but the binary "
                f"section is only {self._reader.size - self._start} bytes"
            )
        data = self._reader.read(size)
        if isinstance(data, memoryview) and not isinstance(data.obj, bytes):
            return bytes(data)  # a view of a mutable buffer: the tensor gets its own copy
        return data  # inside one received chunk (immutable): a view, no copy

    def check_consumed(self) -> None:
        if self._start >= 0 and self._reader.consumed != self._reader.size:
            raise InvalidInput(
                f"binary section is {self._reader.size - self._start} bytes but the inputs' "
                f"{BINARY_DATA_SIZE} add up to {self._reader.consumed - self._start}"
            )


def _input_from_json(where: str, spec: dict[str, Any], binary: _BinarySection) -> Tensor:
    datatype = _datatype(spec.get("datatype"), where)
    shape = _shape(spec.get("shape"), where)
    size = _object(spec.get("parameters", {}), f"{where} 'parameters'").get(BINARY_DATA_SIZE)
    if size is None:
        if "data" not in spec:
            raise InvalidInput(f"{where} has neither 'data' nor parameters.{BINARY_DATA_SIZE}")
        return _from_values(where, datatype, shape, spec["data"])
    if "data" in spec:
        raise InvalidInput(f"{where} has both 'data' and parameters.{BINARY_DATA_SIZE}")
    return _from_raw(where, datatype, shape, binary.take(where, size))


def _requested_outputs(
    raw: object, parameters: Mapping[str, Any]
) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    default = parameters.get(BINARY_DATA_OUTPUT, False)
    if not isinstance(default, bool):
        raise InvalidInput(f"parameter {BINARY_DATA_OUTPUT} must be true or false")
    if raw is None or raw == []:
        return None, frozenset()
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    names: list[str] = []
    binary: set[str] = set()
    for i, item in enumerate(raw):
        spec = _object(item, f"outputs[{i}]")
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"outputs[{i}] needs a non-empty string 'name'")
        params = _object(spec.get("parameters", {}), f"output {name!r} 'parameters'")
        if params.get("classification"):
            raise InvalidInput(f"output {name!r}: the classification extension is not supported")
        flag = params.get(BINARY_DATA, default)
        if not isinstance(flag, bool):
            raise InvalidInput(f"output {name!r}: parameters.{BINARY_DATA} must be true or false")
        names.append(name)
        if flag:
            binary.add(name)
    return tuple(names), frozenset(binary)


def _json_data(tensor: Tensor) -> np.ndarray:
    array = tensor.array().reshape(-1)
    widened = _JSON_WIDEN.get(array.dtype)
    return array if widened is None else array.astype(widened)


def _rest_body(doc: dict[str, Any], blobs: list[bytes | memoryview]) -> RestBody:
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return RestBody((header,))
    return RestBody((header, *blobs), len(header))


def encode_rest_response(
    request: InferRequest, response: InferResponse, *, model_version: str = ""
) -> RestBody:
    """The JSON (+ binary) body answering `request`; outputs in the order it asked for."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, tensor in _select(request, response):
        out: dict[str, Any] = {"name": name, "datatype": tensor.datatype, "shape": tensor.shape}
        if _binary(request, name):
            out["parameters"] = {BINARY_DATA_SIZE: len(tensor.data)}
            blobs.append(tensor.data)
        else:
            out["data"] = _json_data(tensor)
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": response.model_name}
    if model_version:
        doc["model_version"] = model_version
    if response.id or request.id:
        doc["id"] = response.id or request.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    return _rest_body(doc, blobs)


def encode_rest_request(request: InferRequest, *, binary: bool = True) -> RestBody:
    """Client side: the body for `request`, inputs raw after the JSON when `binary`."""
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, tensor in request.inputs.items():
        spec: dict[str, Any] = {"name": name, "datatype": tensor.datatype, "shape": tensor.shape}
        if binary:
            spec["parameters"] = {BINARY_DATA_SIZE: len(tensor.data)}
            blobs.append(tensor.data)
        else:
            spec["data"] = _json_data(tensor)
        inputs.append(spec)
    doc: dict[str, Any] = {"inputs": inputs}
    if request.id:
        doc["id"] = request.id
    if request.parameters:
        doc["parameters"] = request.parameters
    if request.outputs is not None:
        doc["outputs"] = [
            {"name": n, "parameters": {BINARY_DATA: n in request.binary_outputs}}
            for n in request.outputs
        ]
    return _rest_body(doc, blobs)


def decode_rest_response(body: Body, header_length: str | None = None) -> InferResponse:
    """Client side: parse an infer response body (JSON and/or binary outputs)."""
    reader = _BodyReader(body)
    json_size = _header_length(header_length, reader.size)
    doc = _parse_json(reader, json_size, "response body")
    binary = _BinarySection(reader, json_size)
    outputs: dict[str, Tensor] = {}
    for spec in doc.get("outputs", []):
        name = spec["name"]
        where = f"output {name!r}"
        datatype = _datatype(spec.get("datatype"), where)
        shape = _shape(spec.get("shape"), where)
        size = spec.get("parameters", {}).get(BINARY_DATA_SIZE)
        if size is None:
            outputs[name] = _from_values(where, datatype, shape, spec.get("data"))
        else:
            outputs[name] = _from_raw(where, datatype, shape, binary.take(where, size))
    binary.check_consumed()
    return InferResponse(doc["model_name"], outputs, doc.get("id", ""), doc.get("parameters", {}))


def metadata_to_json(metadata: ModelMetadata) -> dict[str, Any]:
    """`GET /v2/models/{name}` body."""
    return {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in metadata.inputs
        ],
        "outputs": [
            {"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in metadata.outputs
        ],
    }


# ---------------------------------------------------------------- gRPC


def _bytes(data: bytes | memoryview) -> bytes:
    """protobuf bytes fields take `bytes` only; a view (a worker's output) is copied once."""
    return data if isinstance(data, bytes) else data.tobytes()


def _param_value(param: pb.InferParameter) -> Any:
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def _set_param(param: pb.InferParameter, value: object) -> None:
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if value > np.iinfo(np.int64).max:
            param.uint64_param = value
        else:
            param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    elif isinstance(value, str):
        param.string_param = value
    else:
        # OIP gRPC parameters are scalars; structured values travel as JSON text.
        param.string_param = orjson.dumps(value).decode()


def _from_contents(
    where: str, datatype: str, shape: tuple[int, ...], contents: pb.InferTensorContents
) -> Tensor:
    present = [f for f in _CONTENT_FIELDS if len(getattr(contents, f))]
    entry = _CONTENTS.get(datatype)
    if entry is None:
        raise InvalidInput(f"{where} is {datatype}, which has no typed contents; send it raw")
    field, wide = entry
    if present and present != [field]:
        raise InvalidInput(
            f"{where} is {datatype} and needs its values in contents.{field}, "
            f"got {', '.join('contents.' + f for f in present)}"
        )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(
            f"{where} has {len(values)} values but shape {list(shape)} needs {count}"
        )
    array = np.fromiter(values, dtype=wide, count=count)
    dtype = DTYPES[datatype]
    if dtype != wide and count:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidInput(f"{where} has integers out of range for {datatype}")
    return Tensor(datatype, shape, array.astype(dtype, copy=False).tobytes())


def request_from_proto(message: pb.ModelInferRequest) -> InferRequest:
    """Parse a gRPC `ModelInferRequest` (raw_input_contents or typed contents)."""
    if not message.inputs:
        raise InvalidInput("request needs 'inputs': at least one input tensor")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidInput(
            f"request has {len(raw)} raw_input_contents for {len(message.inputs)} inputs; "
            "send every input raw or none"
        )
    inputs: dict[str, Tensor] = {}
    for i, spec in enumerate(message.inputs):
        name = spec.name
        if not name:
            raise InvalidInput(f"inputs[{i}] needs a non-empty name")
        if name in inputs:
            raise InvalidInput(f"input {name!r} is given more than once")
        where = f"input {name!r}"
        datatype = _datatype(spec.datatype, where)
        shape = _shape(list(spec.shape), where)
        if raw:
            if spec.HasField("contents"):
                raise InvalidInput(f"{where} has both contents and raw_input_contents")
            inputs[name] = tensor = _from_raw(where, datatype, shape, raw[i])
        else:
            inputs[name] = tensor = _from_contents(where, datatype, shape, spec.contents)
        check_finite(where, tensor)
    parameters = {k: _param_value(v) for k, v in message.parameters.items()}
    outputs = tuple(o.name for o in message.outputs) if message.outputs else None
    return InferRequest(message.model_name, inputs, message.id, parameters, outputs)


def response_to_proto(
    request: InferRequest, response: InferResponse, *, model_version: str = ""
) -> pb.ModelInferResponse:
    """The gRPC answer to `request`; every output travels in raw_output_contents."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=model_version,
        id=response.id or request.id,
    )
    for key, value in response.parameters.items():
        _set_param(message.parameters[key], value)
    for name, tensor in _select(request, response):
        message.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_output_contents.append(_bytes(tensor.data))
    return message


def request_to_proto(request: InferRequest, *, raw: bool = True) -> pb.ModelInferRequest:
    """Client side: the gRPC message for `request` (typed contents when not `raw`)."""
    message = pb.ModelInferRequest(model_name=request.model_name, id=request.id)
    for key, value in request.parameters.items():
        _set_param(message.parameters[key], value)
    for name, tensor in request.inputs.items():
        spec = message.inputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        if raw:
            message.raw_input_contents.append(_bytes(tensor.data))
        else:
            if tensor.datatype not in _CONTENTS:
                raise InvalidInput(f"input {name!r} is {tensor.datatype}; it can only be sent raw")
            field, wide = _CONTENTS[tensor.datatype]
            getattr(spec.contents, field).extend(tensor.array().reshape(-1).astype(wide).tolist())
    for name in request.outputs or ():
        message.outputs.add(name=name)
    return message


def response_from_proto(message: pb.ModelInferResponse) -> InferResponse:
    """Client side: parse a gRPC `ModelInferResponse`."""
    raw = message.raw_output_contents
    outputs: dict[str, Tensor] = {}
    for i, spec in enumerate(message.outputs):
        where = f"output {spec.name!r}"
        datatype = _datatype(spec.datatype, where)
        shape = _shape(list(spec.shape), where)
        outputs[spec.name] = (
            _from_raw(where, datatype, shape, raw[i])
            if raw
            else _from_contents(where, datatype, shape, spec.contents)
        )
    parameters = {k: _param_value(v) for k, v in message.parameters.items()}
    return InferResponse(message.model_name, outputs, message.id, parameters)


def metadata_to_proto(metadata: ModelMetadata) -> pb.ModelMetadataResponse:
    """gRPC `ModelMetadata` answer."""
    message = pb.ModelMetadataResponse(
        name=metadata.name, versions=metadata.versions, platform=metadata.platform
    )
    for t in metadata.inputs:
        message.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    for t in metadata.outputs:
        message.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    return message
