"""Pipeline documents shared by the planner tests."""

from __future__ import annotations

from typing import Any

# A cascade: fast always runs; slow only when fast is unsure; combine reads slow optionally.
CASCADE: dict[str, Any] = {
    "apiVersion": "sloline.dev/v1alpha1",
    "kind": "PredictionPipeline",
    "metadata": {"name": "cascade"},
    "spec": {
        "slo": {"latencyMs": 50},
        "workload": {"rateRps": 10},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "stages": [
            {"name": "combine", "model": {"runtime": "python", "entrypoint": "m:g"},
             "inputs": [{"name": "y", "from": "fast.y"},
                        {"name": "z", "from": "slow.z", "optional": True}],
             "outputs": [{"name": "out", "datatype": "FP32", "shape": [4]}]},
            {"name": "fast", "model": {"runtime": "python", "entrypoint": "m:f"},
             "inputs": [{"name": "x", "from": "x"}],
             "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]},
                         {"name": "score", "datatype": "FP32", "shape": [1]}]},
            {"name": "slow", "model": {"runtime": "onnx", "uri": "b.onnx"},
             "inputs": [{"name": "x", "from": "x"}],
             "outputs": [{"name": "z", "datatype": "FP32", "shape": [4]}],
             "when": "fast.score < 0.5"},
        ],
        "output": "combine",
    },
}  # fmt: skip
