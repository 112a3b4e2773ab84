"""Model adapters behind one batch API: onnxruntime, TorchScript and Python callables.

`load_stage` (or `load_pipeline_stage`) turns a stage of the spec into a `StageRunner`
whose `run(items)` takes one dict of arrays per request and returns one per request.
torch is imported only when a TorchScript stage is loaded.
"""

from sloline.runtimes.base import Item, ListRuntime, ModelError, Runtime
from sloline.runtimes.onnx import OnnxRuntime
from sloline.runtimes.python import PythonListRuntime, PythonRuntime, import_entrypoint
from sloline.runtimes.runner import (
    StageRunner,
    load_pipeline_stage,
    load_stage,
    stage_input_specs,
)
from sloline.runtimes.torchscript import TorchScriptRuntime

__all__ = [
    "Item",
    "ListRuntime",
    "ModelError",
    "OnnxRuntime",
    "PythonListRuntime",
    "PythonRuntime",
    "Runtime",
    "StageRunner",
    "TorchScriptRuntime",
    "import_entrypoint",
    "load_pipeline_stage",
    "load_stage",
    "stage_input_specs",
]
