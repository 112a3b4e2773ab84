"""The OIP v2 codec: REST JSON (+ binary extension) and gRPC messages <-> data-plane types.

Round trips are property tests over every datatype and shape; the error cases check that
each malformed request is refused with a message naming what is wrong; the tritonclient
cases check byte-level compatibility with Triton's own client (no server involved)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sloline.common.tensors import DTYPES, InferRequest, InferResponse, InvalidInput, Tensor
from sloline.serving import grpc_codec, rest_codec
from sloline.serving.proto import grpc_service_pb2 as pb

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
JSON_SAFE = {"allow_nan": False, "allow_infinity": False}
FAST = settings(max_examples=60, deadline=None)


@st.composite
def tensors(draw: st.DrawFn, *, json_safe: bool = False, typed: bool = False) -> Tensor:
    """Any tensor; `json_safe` keeps floats finite (all JSON can carry, and all a request's
    inputs may hold), `typed` avoids FP16 (no typed field); BYTES elements are any bytes."""
    names = [n for n in DTYPES if not (typed and n == "FP16")]
    datatype = draw(st.sampled_from(names))
    dtype = DTYPES[datatype]
    if datatype == "BYTES":  # any bytes: JSON carries them as text or base64
        elements = st.binary(max_size=8)
    elif json_safe and dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, **JSON_SAFE)
    else:
        elements = None
    array = draw(hnp.arrays(dtype, draw(SHAPES), elements=elements))
    return Tensor.from_array(array)


@st.composite
def tensor_maps(draw: st.DrawFn, **kwargs: bool) -> dict[str, Tensor]:
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    return {name: draw(tensors(**kwargs)) for name in names}


def body_of(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, str | None]:
    header = orjson.dumps(doc)
    if not blobs:
        return header, None
    return header + b"".join(blobs), str(len(header))


def fp32_input(data: Any = None, **overrides: Any) -> dict[str, Any]:
    spec = {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    if data is not None:
        spec["data"] = data
    spec.update(overrides)
    return spec


# ------------------------------------------------------------------ REST round trips


@FAST
@given(data=st.data(), binary=st.booleans(), request_id=NAMES)
def test_rest_request_round_trip(data: st.DataObject, binary: bool, request_id: str) -> None:
    # Binary tensors keep every bit pattern (NaN, inf); JSON numbers cannot carry those.
    inputs = data.draw(tensor_maps(json_safe=True))
    request = InferRequest("m", inputs, request_id, {"priority": 1})
    encoded = rest_codec.encode_rest_request(request, binary=binary)
    assert (encoded.header_length is not None) == binary
    header = None if encoded.header_length is None else str(encoded.header_length)
    assert rest_codec.decode_rest_request("m", encoded.body, header) == request
    # As a server receives it: in chunks cut anywhere (inside the JSON, inside tensors).
    body = encoded.body
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert rest_codec.decode_rest_request("m", chunks, header) == request


@FAST
@given(
    outputs=tensor_maps(json_safe=True),
    data=st.data(),
    default_binary=st.booleans(),
)
def test_rest_response_round_trip(
    outputs: dict[str, Tensor], data: st.DataObject, default_binary: bool
) -> None:
    asked = data.draw(st.none() | st.lists(st.sampled_from(sorted(outputs)), unique=True,
                                           min_size=1))  # fmt: skip
    binary = frozenset(data.draw(st.sets(st.sampled_from(sorted(outputs)))))
    params = {rest_codec.BINARY_DATA_OUTPUT: default_binary}
    request = InferRequest("m", {}, "id7", params, None if asked is None else tuple(asked), binary)
    expected = outputs if asked is None else {n: outputs[n] for n in asked}  # the plane's pick
    encoded = rest_codec.encode_rest_response(request, InferResponse("m", expected, "id7"))
    header = None if encoded.header_length is None else str(encoded.header_length)
    decoded = rest_codec.decode_rest_response(encoded.parts, header)
    assert decoded.outputs == expected
    assert list(decoded.outputs) == list(expected)  # in the plane's order
    assert decoded.id == "id7"
    doc = orjson.loads(encoded.body[: encoded.header_length])
    raw = {o["name"] for o in doc["outputs"] if "binary_data_size" in o.get("parameters", {})}
    if asked is None:  # no outputs listed: binary_data_output alone decides
        assert raw == (set(expected) if default_binary else set())
    else:
        assert raw == set(expected) & binary


def test_nested_and_flat_data_are_the_same_tensor() -> None:
    flat, _ = body_of({"inputs": [fp32_input([1, 2, 3, 4, 5, 6], shape=[2, 3])]})
    nested, _ = body_of({"inputs": [fp32_input([[1, 2, 3], [4, 5, 6]], shape=[2, 3])]})
    expected = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    for body in (flat, nested):
        np.testing.assert_array_equal(rest_codec.decode_rest_request("m", body).inputs["x"].array(),
                                      expected)  # fmt: skip


def test_mixed_json_and_binary_inputs_in_one_request() -> None:
    a = np.arange(6, dtype=np.int16).reshape(3, 2)
    doc = {"inputs": [
        {"name": "a", "datatype": "INT16", "shape": [3, 2],
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "j", "datatype": "BOOL", "shape": [2], "data": [True, False]},
        {"name": "b", "datatype": "FP64", "shape": [0], "parameters": {"binary_data_size": 0}},
    ]}  # fmt: skip
    body, header = body_of(doc, a.tobytes())
    request = rest_codec.decode_rest_request("m", body, header)
    np.testing.assert_array_equal(request.inputs["a"].array(), a)
    assert request.inputs["j"].array().tolist() == [True, False]
    assert request.inputs["b"].array().shape == (0,)


def test_fp16_and_uint64_json_values_survive() -> None:
    tensor = Tensor.from_array(np.array([0.1, 65504, -0.0], dtype=np.float16))
    # numpy alone would read [2**63, 0] as float64 and lose the low bits
    big = Tensor.from_array(np.array([[2**64 - 1, 0], [2**63 + 1, 7]], dtype=np.uint64))
    request = InferRequest("m", {"h": tensor, "u": big})
    encoded = rest_codec.encode_rest_request(request, binary=False)
    assert rest_codec.decode_rest_request("m", encoded.body).inputs == request.inputs


def test_binary_outputs_follow_triton_rules() -> None:
    outputs = {"a": Tensor.from_array(np.ones(2, np.float32)),
               "b": Tensor.from_array(np.zeros(1, np.int64))}  # fmt: skip

    def raw_outputs(doc: dict[str, Any]) -> set[str]:
        req = rest_codec.decode_rest_request("m", *body_of({"inputs": [fp32_input()], **doc}))
        enc = rest_codec.encode_rest_response(req, InferResponse("m", outputs))
        header = orjson.loads(enc.body[: enc.header_length])
        return {o["name"] for o in header["outputs"] if "parameters" in o}

    assert raw_outputs({}) == set()
    assert raw_outputs({"parameters": {"binary_data_output": True}}) == {"a", "b"}
    assert raw_outputs({"outputs": [{"name": "a", "parameters": {"binary_data": True}},
                                    {"name": "b"}]}) == {"a"}  # fmt: skip
    assert raw_outputs({"parameters": {"binary_data_output": True},
                        "outputs": [{"name": "a", "parameters": {"binary_data": False}},
                                    {"name": "b"}]}) == {"b"}  # fmt: skip


def test_name_and_version_pass_through_both_codecs() -> None:
    body, header = body_of({"inputs": [fp32_input()]})
    assert rest_codec.decode_rest_request("m", body, header, model_version="3").model_version == "3"
    request = InferRequest("m", {"x": Tensor.from_array(np.ones(1, np.float32))}, model_version="3")
    decoded = grpc_codec.request_from_proto(grpc_codec.request_to_proto(request))
    assert (decoded.model_name, decoded.model_version) == ("m", "3")
    answer = grpc_codec.response_to_proto(decoded, InferResponse("m", {}))
    assert answer.model_version == "3"
    rest = rest_codec.encode_rest_response(decoded, InferResponse("m", {}))
    assert orjson.loads(rest.body)["model_version"] == "3"


# ------------------------------------------------------------------ REST errors

BAD_REST = [
    (b"{nope", None, "malformed JSON"),
    (b"[1]", None, "must be a JSON object"),
    (b'{"id": "a"}', None, "needs 'inputs'"),
    (b'{"inputs": []}', None, "needs 'inputs'"),
    (body_of({"inputs": [fp32_input(datatype="FP31")]})[0], None, "unsupported datatype 'FP31'"),
    (body_of({"inputs": [fp32_input(datatype="BF16")]})[0], None, "unsupported datatype 'BF16'"),
    (body_of({"inputs": [fp32_input(shape=[3])]})[0], None, "has 2 values but shape [3] needs 3"),
    (body_of({"inputs": [fp32_input(shape=[-1])]})[0], None, "negative dimension"),
    (body_of({"inputs": [fp32_input(shape="2")]})[0], None, "expected a list of integers"),
    (body_of({"inputs": [fp32_input([[1, 2], [3]], shape=[3])]})[0], None, "ragged"),
    (body_of({"inputs": [fp32_input(5)]})[0], None, "expected a JSON array"),
    (body_of({"inputs": [fp32_input([1, "a"])]})[0], None, 'non-numeric value "a"'),
    (body_of({"inputs": [fp32_input([1, None])]})[0], None, "non-numeric value null"),
    (body_of({"inputs": [fp32_input([True, False])]})[0], None, "needs numbers"),
    (body_of({"inputs": [fp32_input([1, 1e300])]})[0], None, "out of range for FP32"),
    (body_of({"inputs": [fp32_input([1, 2.5], datatype="INT32")]})[0], None, "needs integers"),
    (body_of({"inputs": [fp32_input([1, 300], datatype="UINT8")]})[0], None, "out of range"),
    (body_of({"inputs": [fp32_input([1, -1], datatype="UINT32")]})[0], None, "out of range"),
    (body_of({"inputs": [fp32_input([-1, 2**63], datatype="UINT64")]})[0], None, "out of range"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT64", "shape": [2], "data": [0, 2e19]}]}',
     None, "needs integers, got 2e+19"),
    (body_of({"inputs": [fp32_input([1, 0], datatype="BOOL")]})[0], None, "true/false"),
    (body_of({"inputs": [fp32_input(), fp32_input()]})[0], None, "more than once"),
    (body_of({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]})[0], None,
     "neither 'data' nor"),
    (*body_of({"inputs": [fp32_input(parameters={"binary_data_size": 8})]}, b"\0" * 8),
     "both 'data' and"),
    (body_of({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                          "parameters": {"binary_data_size": 8}}]})[0], None,
     "no Inference-Header-Content-Length"),
    (*body_of({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                           "parameters": {"binary_data_size": 8}}]}, b"\0" * 4),
     "needs 8 binary bytes at offset 0 but the binary section is only 4"),
    (*body_of({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                           "parameters": {"binary_data_size": 8}}]}, b"\0" * 12),
     "binary section is 12 bytes but the inputs' binary_data_size add up to 8"),
    (*body_of({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3],
                           "parameters": {"binary_data_size": 8}}]}, b"\0" * 8),
     "8 bytes of raw data but FP32 shape [3] needs 12"),
    (body_of({"inputs": [fp32_input()]})[0], "0", "between 1 and the body size"),
    (body_of({"inputs": [fp32_input()]})[0], "abc", "Inference-Header-Content-Length header"),
    (body_of({"inputs": [fp32_input()], "outputs": [{"name": "y", "parameters":
                                                      {"binary_data": "yes"}}]})[0], None,
     "binary_data must be true or false"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "header", "message"), BAD_REST, ids=[c[2] for c in BAD_REST])
def test_bad_rest_request_names_the_problem(body: bytes, header: str | None, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        rest_codec.decode_rest_request("m", body, header)
    assert message in str(info.value)
    assert info.value.status == 400


# ------------------------------------------------------------------ gRPC round trips


@FAST
@given(
    inputs=tensor_maps(json_safe=True),
    outputs=st.none() | st.lists(NAMES, min_size=1, unique=True),
)
def test_grpc_raw_request_round_trip(inputs: dict[str, Tensor], outputs: list[str] | None) -> None:
    request = InferRequest("m", inputs, "r1", {"flag": True, "n": -3, "s": "x", "f": 0.5},
                           None if outputs is None else tuple(outputs))  # fmt: skip
    wire = grpc_codec.request_to_proto(request).SerializeToString()
    assert grpc_codec.request_from_proto(pb.ModelInferRequest.FromString(wire)) == request


@FAST
@given(inputs=tensor_maps(typed=True, json_safe=True))
def test_grpc_typed_contents_round_trip(inputs: dict[str, Tensor]) -> None:
    request = InferRequest("m", inputs)
    message = grpc_codec.request_to_proto(request, raw=False)
    assert not message.raw_input_contents
    wire = message.SerializeToString()
    assert grpc_codec.request_from_proto(pb.ModelInferRequest.FromString(wire)) == request


@FAST
@given(
    datatype=st.sampled_from(["FP16", "FP32", "FP64"]),
    values=st.lists(st.floats(width=16), min_size=1, max_size=6),
    raw=st.booleans(),
)
def test_non_finite_inputs_are_refused_alike_by_every_decoder(
    datatype: str, values: list[float], raw: bool
) -> None:
    """REST binary, gRPC raw and gRPC typed contents: one check, one message."""
    array = np.array(values, DTYPES[datatype])
    request = InferRequest("m", {"x": Tensor.from_array(array)})
    finite = bool(np.isfinite(array).all())
    encoded = rest_codec.encode_rest_request(request, binary=True)

    def rest() -> InferRequest:
        return rest_codec.decode_rest_request("m", encoded.body, str(encoded.header_length))

    def grpc() -> InferRequest:
        return grpc_codec.request_from_proto(grpc_codec.request_to_proto(request, raw=raw))

    # FP16 has no typed contents field: it only travels raw.
    paths = [rest] if datatype == "FP16" and not raw else [rest, grpc]
    messages = set()
    for decode in paths:
        if finite:
            assert decode() == request
            continue
        with pytest.raises(InvalidInput, match="input 'x' has a non-finite value") as caught:
            decode()
        messages.add(str(caught.value))
    assert len(messages) == (0 if finite else 1), messages


@FAST
@given(outputs=tensor_maps())
def test_grpc_response_round_trip(outputs: dict[str, Tensor]) -> None:
    response = InferResponse("m", outputs, "id", {"big": 2**64 - 1})
    message = grpc_codec.response_to_proto(InferRequest("m", {}, "id"), response)
    wire = message.SerializeToString()
    assert grpc_codec.response_from_proto(pb.ModelInferResponse.FromString(wire)) == response


def grpc_request(*, raw: list[bytes] | None = None, **tensor: Any) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    spec = {"name": "x", "datatype": "INT8", "shape": [2], **tensor}
    contents = spec.pop("contents", None)
    added = message.inputs.add(**spec)
    if contents is not None:
        added.contents.CopyFrom(contents)
    message.raw_input_contents.extend(raw or [])
    return message


BAD_GRPC = [
    (pb.ModelInferRequest(model_name="m"), "needs 'inputs'"),
    (grpc_request(raw=[b"\0\0", b"\0"]), "2 raw_input_contents for 1 inputs"),
    (grpc_request(raw=[b"\0"]), "1 bytes of raw data but INT8 shape [2] needs 2"),
    (grpc_request(datatype="INT9", raw=[b"\0\0"]), "unsupported datatype 'INT9'"),
    (grpc_request(shape=[-2], raw=[b""]), "negative dimension"),
    (grpc_request(contents=pb.InferTensorContents(int_contents=[1, 200])), "out of range for INT8"),
    (grpc_request(contents=pb.InferTensorContents(fp32_contents=[1, 2])),
     "needs its values in contents.int_contents, got contents.fp32_contents"),
    (grpc_request(contents=pb.InferTensorContents(int_contents=[1])), "has 1 values but shape"),
    (grpc_request(datatype="FP16", contents=pb.InferTensorContents(fp32_contents=[1, 2])),
     "no typed contents; send it raw"),
    (grpc_request(contents=pb.InferTensorContents(int_contents=[1, 2]), raw=[b"\0\0"]),
     "both contents and raw_input_contents"),
]  # fmt: skip


@pytest.mark.parametrize(("message", "problem"), BAD_GRPC, ids=[c[1] for c in BAD_GRPC])
def test_bad_grpc_request_names_the_problem(message: pb.ModelInferRequest, problem: str) -> None:
    with pytest.raises(InvalidInput) as info:
        grpc_codec.request_from_proto(message)
    assert problem in str(info.value)


# ------------------------------------------------------------------ tritonclient compatibility


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http_bodies(binary: bool) -> None:
    """Triton's client encodes requests we decode and decodes responses we encode."""
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    flags = np.array([True, False, True])
    inputs = [httpclient.InferInput("x", [3, 4], "FP32"), httpclient.InferInput("f", [3], "BOOL")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    inputs[1].set_data_from_numpy(flags, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="42"
    )
    request = rest_codec.decode_rest_request(
        "m", body, None if json_size is None else str(json_size)
    )
    np.testing.assert_array_equal(request.inputs["x"].array(), x)
    np.testing.assert_array_equal(request.inputs["f"].array(), flags)
    assert request.outputs == ("y",)
    assert request.id == "42"

    y = request.inputs["x"].array() * 2
    encoded = rest_codec.encode_rest_response(
        request, InferResponse("m", {"y": Tensor.from_array(y)})
    )
    result = httpclient.InferResult.from_response_body(encoded.body, False, encoded.header_length)
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    assert result.get_response()["id"] == "42"


def test_bytes_tensors_json_raw_and_malformed() -> None:
    from sloline.common.tensors import Tensor, serialize_bytes
    from sloline.serving.codec import json_values, tensor_from_raw, tensor_from_values

    raw = serialize_bytes([b"ab", b"", "\u00e9"])
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"
    tensor = tensor_from_raw("input 'x'", "BYTES", (3,), raw)
    assert tensor.array().tolist() == [b"ab", b"", "\u00e9".encode()]
    assert json_values(tensor) == (["ab", "", "\u00e9"], False)
    assert tensor_from_values("input 'x'", "BYTES", (3,), ["ab", "", "\u00e9"]).data == raw
    binary = Tensor.from_array(np.array([b"\xff\x00"], dtype=object))
    assert json_values(binary) == (["/wA="], True)
    back = tensor_from_values("input 'x'", "BYTES", (1,), ["/wA="], base64_data=True)
    assert back.data == binary.data
    with pytest.raises(InvalidInput, match=r"malformed BYTES raw data.*only 1 remain"):
        tensor_from_raw("input 'x'", "BYTES", (1,), b"\x05\x00\x00\x00a")
    with pytest.raises(InvalidInput, match="2 bytes after its 1 elements"):
        tensor_from_raw("input 'x'", "BYTES", (1,), b"\x00\x00\x00\x00zz")
    with pytest.raises(InvalidInput, match="needs JSON strings, got 3"):
        tensor_from_values("input 'x'", "BYTES", (1,), [3])
    with pytest.raises(InvalidInput, match="not base64"):
        tensor_from_values("input 'x'", "BYTES", (1,), ["!!"], base64_data=True)


def test_bytes_rows_split_and_join() -> None:
    from sloline.common.tensors import Tensor

    tensor = Tensor.from_array(np.array([[b"a", b"bc"], [b"", b"def"]], dtype=object))
    rows = tensor.split_rows()
    assert [r.array().tolist() for r in rows] == [[b"a", b"bc"], [b"", b"def"]]
    assert Tensor.join_rows(rows) == Tensor(tensor.datatype, tensor.shape, tensor.data)
