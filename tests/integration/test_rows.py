"""Requests with a leading batch dimension above 1: served as that many rows and answered
together, over REST and gRPC with tritonclient; over the router's max_rows, a clear 400."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sloline.serving.router import RouterSettings
from tests.support.serve import BackgroundPipeline, build_example


def _http(client: httpclient.InferenceServerClient, pixels: np.ndarray) -> dict[str, np.ndarray]:
    inp = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels, binary_data=False)
    result = client.infer("digits-cascade", [inp])
    return {n: result.as_numpy(n) for n in ("probabilities", "label")}


def _grpc(client: grpcclient.InferenceServerClient, pixels: np.ndarray) -> dict[str, np.ndarray]:
    inp = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels)
    result = client.infer("digits-cascade", [inp])
    return {n: result.as_numpy(n) for n in ("probabilities", "label")}


def test_rows_answer_as_single_requests_and_the_cap_is_named() -> None:
    path = build_example("digits-cascade")
    rng = np.random.default_rng(3)
    pixels = rng.uniform(0, 16, size=(3, 64)).astype(np.float32)
    router = RouterSettings(deadline_factor=50.0, admission_factor=50.0, max_rows=3)
    with BackgroundPipeline(path, router=router) as served:
        http = httpclient.InferenceServerClient(served.http_url)
        grpc = grpcclient.InferenceServerClient(served.grpc_url)
        for call, client in ((_http, http), (_grpc, grpc)):
            singles = [call(client, pixels[i : i + 1]) for i in range(3)]  # type: ignore[operator]
            for rows in (2, 3):
                together = call(client, pixels[:rows])  # type: ignore[operator]
                for name in ("probabilities", "label"):
                    assert together[name].shape[0] == rows
                    expected = np.concatenate([s[name] for s in singles[:rows]])
                    np.testing.assert_array_equal(together[name], expected)
            with pytest.raises(InferenceServerException, match=r"has 4 rows .*takes 1 to 3 rows"):
                call(client, np.ones((4, 64), np.float32))  # type: ignore[operator]
        http.close()
        grpc.close()
