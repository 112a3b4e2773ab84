"""BYTES tensors end to end: digits-cascade's pipeline-png.yaml (encoded images in, the
digit's name out) served for real and driven with tritonclient over REST JSON, REST with
the binary extension, and gRPC (raw and typed contents)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.serve import EXAMPLES, BackgroundPipeline, build_example


def _digits() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "digits_stages_bytes_test", EXAMPLES / "digits-cascade" / "digits_stages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_encoded_images_round_trip_rest_json_binary_and_grpc() -> None:
    build_example("digits-cascade")
    digits = _digits()
    x_test, y_test = digits.labelled_test_split()
    count = 12
    images = [digits.encode_png(row) for row in x_test[:count]]
    with BackgroundPipeline(EXAMPLES / "digits-cascade" / "pipeline-png.yaml") as served:
        http = httpclient.InferenceServerClient(served.http_url)
        grpc = grpcclient.InferenceServerClient(served.grpc_url)
        meta = http.get_model_metadata("digits-png")
        assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}]
        answers: dict[str, list[tuple[int, bytes]]] = {}
        for how in ("json", "binary", "grpc", "grpc-typed"):
            got = []
            for image in images:
                data = np.array([[image]], dtype=np.object_)
                if how.startswith("grpc"):
                    inp = grpcclient.InferInput("image", [1, 1], "BYTES")
                    inp.set_data_from_numpy(data)
                    if how == "grpc-typed":  # contents.bytes_contents instead of raw
                        inp._raw_content = None
                        inp._input.contents.bytes_contents.append(image)
                    result = grpc.infer("digits-png", [inp])
                else:
                    binary = how == "binary"
                    inp = httpclient.InferInput("image", [1, 1], "BYTES")
                    # JSON carries text: send the PNG as base64 (MLServer's convention).
                    if binary:
                        inp.set_data_from_numpy(data, binary_data=True)
                    else:
                        import base64

                        inp._data = [base64.b64encode(image).decode()]
                        inp._parameters["content_type"] = "base64"
                    outs = [
                        httpclient.InferRequestedOutput("label", binary_data=binary),
                        httpclient.InferRequestedOutput("name", binary_data=binary),
                    ]
                    result = http.infer("digits-png", [inp], outputs=outs)
                name = result.as_numpy("name")
                assert name.shape == (1, 1) and name.dtype == np.object_
                word = name[0, 0]
                got.append(
                    (
                        int(result.as_numpy("label")[0, 0]),
                        bytes(word, "utf-8") if isinstance(word, str) else word,
                    )
                )
            answers[how] = got
        labels = [label for label, _ in answers["binary"]]
        assert all(answers[how] == answers["binary"] for how in answers)
        assert [w for _, w in answers["binary"]] == [digits.DIGIT_NAMES[n].encode() for n in labels]
        assert sum(int(a == b) for a, b in zip(labels, y_test[:count], strict=True)) >= count - 1
        http.close()
        grpc.close()
