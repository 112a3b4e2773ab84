"""The REST infer bodies of the Open Inference Protocol v2 <-> the data-plane types.

JSON is parsed with orjson, and binary tensors are sliced out of the received body chunks
through memoryviews: a tensor inside one chunk stays a view of it, one that spans chunks
is joined once; responses keep the JSON header and the tensors as separate parts for the
server to write. Tensor checks and JSON value conversion are `codec`'s, shared with gRPC.

Binary extension (same semantics as Triton and tritonclient): a request body may be a
JSON header of `Inference-Header-Content-Length` bytes followed by the raw bytes of every
input whose `parameters.binary_data_size` is set, in input order. An output is returned
raw when its requested `parameters.binary_data` is true, or when the request parameter
`binary_data_output` is true and the output does not say otherwise; the response then
carries the same header and layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from sloline.common.tensors import InferRequest, InferResponse, InvalidInput, ModelMetadata, Tensor
from sloline.serving.codec import (
    BASE64,
    CONTENT_TYPE,
    check_datatype,
    check_finite,
    check_shape,
    json_values,
    tensor_from_raw,
    tensor_from_values,
)

HEADER_LENGTH: Final = "Inference-Header-Content-Length"
BINARY_DATA_SIZE: Final = "binary_data_size"
BINARY_DATA: Final = "binary_data"
BINARY_DATA_OUTPUT: Final = "binary_data_output"


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


def _binary(request: InferRequest, name: str) -> bool:
    if request.outputs is None:
        return request.parameters.get(BINARY_DATA_OUTPUT) is True
    return name in request.binary_outputs


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
    model_name: str, body: Body, header_length: str | None = None, *, model_version: str = ""
) -> InferRequest:
    """Parse `POST /v2/models/{model_name}[/versions/{model_version}]/infer`;
    `header_length` is that header's value. The name and version are passed through, for
    the data plane to check.

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
    return InferRequest(
        model_name, inputs, request_id, parameters, outputs, binary_outputs, model_version
    )


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
    datatype = check_datatype(spec.get("datatype"), where)
    shape = check_shape(spec.get("shape"), where)
    params = _object(spec.get("parameters", {}), f"{where} 'parameters'")
    size = params.get(BINARY_DATA_SIZE)
    if size is None:
        if "data" not in spec:
            raise InvalidInput(f"{where} has neither 'data' nor parameters.{BINARY_DATA_SIZE}")
        encoded = params.get(CONTENT_TYPE) == BASE64
        return tensor_from_values(where, datatype, shape, spec["data"], base64_data=encoded)
    if "data" in spec:
        raise InvalidInput(f"{where} has both 'data' and parameters.{BINARY_DATA_SIZE}")
    return tensor_from_raw(where, datatype, shape, binary.take(where, size))


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


def _put_values(spec: dict[str, Any], tensor: Tensor) -> None:
    """A tensor's values as JSON `data` (BYTES as text, or base64 saying so)."""
    spec["data"], encoded = json_values(tensor)
    if encoded:
        spec["parameters"] = {CONTENT_TYPE: BASE64}


def _rest_body(doc: dict[str, Any], blobs: list[bytes | memoryview]) -> RestBody:
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return RestBody((header,))
    return RestBody((header, *blobs), len(header))


def encode_rest_response(request: InferRequest, response: InferResponse) -> RestBody:
    """The JSON (+ binary) body answering `request`: the response's outputs, in its order
    (the data plane picked the ones the request asked for), raw as the request said."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, tensor in response.outputs.items():
        out: dict[str, Any] = {"name": name, "datatype": tensor.datatype, "shape": tensor.shape}
        if _binary(request, name):
            out["parameters"] = {BINARY_DATA_SIZE: len(tensor.data)}
            blobs.append(tensor.data)
        else:
            _put_values(out, tensor)
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": response.model_name}
    if request.model_version:
        doc["model_version"] = request.model_version
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
            _put_values(spec, tensor)
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
        datatype = check_datatype(spec.get("datatype"), where)
        shape = check_shape(spec.get("shape"), where)
        params = spec.get("parameters", {})
        size = params.get(BINARY_DATA_SIZE)
        if size is None:
            outputs[name] = tensor_from_values(
                where,
                datatype,
                shape,
                spec.get("data"),
                base64_data=params.get(CONTENT_TYPE) == BASE64,
            )
        else:
            outputs[name] = tensor_from_raw(where, datatype, shape, binary.take(where, size))
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
