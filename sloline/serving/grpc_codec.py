"""The gRPC `inference.GRPCInferenceService` messages <-> the data-plane types.

Requests carry their tensors raw (`raw_input_contents`) or typed (`contents`); answers
always raw. Tensor checks are `codec`'s, shared with REST, so errors read the same.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import orjson

from sloline.common.tensors import (
    BYTES,
    DTYPES,
    InferRequest,
    InferResponse,
    InvalidInput,
    ModelMetadata,
    Tensor,
    serialize_bytes,
)
from sloline.serving.codec import check_datatype, check_finite, check_shape, tensor_from_raw
from sloline.serving.proto import grpc_service_pb2 as pb

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
    if datatype == BYTES:
        if present and present != ["bytes_contents"]:
            raise InvalidInput(
                f"{where} is BYTES and needs its values in contents.bytes_contents, "
                f"got {', '.join('contents.' + f for f in present)}"
            )
        elements = contents.bytes_contents
        count = math.prod(shape)
        if len(elements) != count:
            raise InvalidInput(
                f"{where} has {len(elements)} values but shape {list(shape)} needs {count}"
            )
        return Tensor(BYTES, shape, serialize_bytes(list(elements)))
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
    """Parse a gRPC `ModelInferRequest` (raw_input_contents or typed contents); the model
    name and version are passed through, for the data plane to check."""
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
        datatype = check_datatype(spec.datatype, where)
        shape = check_shape(list(spec.shape), where)
        if raw:
            if spec.HasField("contents"):
                raise InvalidInput(f"{where} has both contents and raw_input_contents")
            inputs[name] = tensor = tensor_from_raw(where, datatype, shape, raw[i])
        else:
            inputs[name] = tensor = _from_contents(where, datatype, shape, spec.contents)
        check_finite(where, tensor)
    parameters = {k: _param_value(v) for k, v in message.parameters.items()}
    outputs = tuple(o.name for o in message.outputs) if message.outputs else None
    return InferRequest(
        message.model_name,
        inputs,
        message.id,
        parameters,
        outputs,
        model_version=message.model_version,
    )


def response_to_proto(request: InferRequest, response: InferResponse) -> pb.ModelInferResponse:
    """The gRPC answer to `request`: the response's outputs, in its order (the data plane
    picked the ones the request asked for), every one in raw_output_contents."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=request.model_version,
        id=response.id or request.id,
    )
    for key, value in response.parameters.items():
        _set_param(message.parameters[key], value)
    for name, tensor in response.outputs.items():
        message.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_output_contents.append(_bytes(tensor.data))
    return message


def request_to_proto(request: InferRequest, *, raw: bool = True) -> pb.ModelInferRequest:
    """Client side: the gRPC message for `request` (typed contents when not `raw`)."""
    message = pb.ModelInferRequest(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    for key, value in request.parameters.items():
        _set_param(message.parameters[key], value)
    for name, tensor in request.inputs.items():
        spec = message.inputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        if raw:
            message.raw_input_contents.append(_bytes(tensor.data))
        elif tensor.datatype == BYTES:
            spec.contents.bytes_contents.extend(tensor.array().reshape(-1).tolist())
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
        datatype = check_datatype(spec.datatype, where)
        shape = check_shape(list(spec.shape), where)
        outputs[spec.name] = (
            tensor_from_raw(where, datatype, shape, raw[i])
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
