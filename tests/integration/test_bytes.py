"""BYTES tensors end to end: digits-cascade's pipeline-png.yaml (encoded images in, the
digit's name out) served for real and driven over REST JSON (base64 input, text output),
REST with the binary extension and gRPC raw contents (tritonclient), and gRPC typed
`bytes_contents` (Triton's generated stub)."""

from __future__ import annotations

import base64
import importlib.util
import json
import urllib.request
from types import ModuleType

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2_grpc as service_grpc
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from tests.support.serve import EXAMPLES, BackgroundPipeline, build_example

Answer = tuple[list[int], list[bytes]]  # labels, names


def _digits() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "digits_stages_bytes_test", EXAMPLES / "digits-cascade" / "digits_stages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rest_binary(url: str, images: list[bytes]) -> Answer:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("image", [len(images), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[im] for im in images], dtype=np.object_))
    outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("label", "name")]
    result = client.infer("digits-png", [inp], outputs=outs)
    client.close()
    names = result.as_numpy("name")
    assert names.dtype == np.object_ and names.shape == (len(images), 1)
    return result.as_numpy("label")[:, 0].tolist(), names[:, 0].tolist()


def _rest_json(url: str, images: list[bytes]) -> Answer:
    body = {
        "inputs": [
            {
                "name": "image",
                "datatype": "BYTES",
                "shape": [len(images), 1],
                "parameters": {"content_type": "base64"},
                "data": [base64.b64encode(im).decode() for im in images],
            }
        ]
    }
    request = urllib.request.Request(
        f"http://{url}/v2/models/digits-png/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        doc = json.loads(response.read())
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert outputs["name"]["datatype"] == "BYTES" and "parameters" not in outputs["name"]
    return outputs["label"]["data"], [word.encode() for word in outputs["name"]["data"]]


def _grpc_raw(url: str, images: list[bytes]) -> Answer:
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("image", [len(images), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[im] for im in images], dtype=np.object_))
    result = client.infer("digits-png", [inp])
    client.close()
    return result.as_numpy("label")[:, 0].tolist(), result.as_numpy("name")[:, 0].tolist()


def _grpc_typed(url: str, images: list[bytes]) -> Answer:
    message = service_pb2.ModelInferRequest(model_name="digits-png")
    tensor = message.inputs.add(name="image", datatype="BYTES", shape=[len(images), 1])
    tensor.contents.bytes_contents.extend(images)
    with grpc.insecure_channel(url) as channel:
        response = service_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    result = grpcclient.InferResult(response)
    return result.as_numpy("label")[:, 0].tolist(), result.as_numpy("name")[:, 0].tolist()


def test_encoded_images_round_trip_rest_json_binary_and_grpc() -> None:
    build_example("digits-cascade")
    digits = _digits()
    x_test, y_test = digits.labelled_test_split()
    count = 12
    images = [digits.encode_png(row) for row in x_test[:count]]
    with BackgroundPipeline(EXAMPLES / "digits-cascade" / "pipeline-png.yaml") as served:
        meta = httpclient.InferenceServerClient(served.http_url).get_model_metadata("digits-png")
        assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}]
        labels, names = _rest_binary(served.http_url, images)
        assert names == [digits.DIGIT_NAMES[n].encode() for n in labels]
        assert sum(int(a == b) for a, b in zip(labels, y_test[:count], strict=True)) >= count - 1
        for call in (_rest_json, _grpc_raw, _grpc_typed):
            assert call(served.http_url if call is _rest_json else served.grpc_url, images) == (
                labels,
                names,
            )
            one = call(served.http_url if call is _rest_json else served.grpc_url, images[:1])
            assert one == (labels[:1], names[:1])
