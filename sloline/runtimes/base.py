"""The one batch API every model adapter implements, and the error users see when a model fails.

A stage's model maps a batch of requests to a batch of results (the model contract,
docs/spec-reference.md). Adapters for compiled formats (ONNX, TorchScript) and Python
stages declared `batching: stacked` implement `Runtime`: named arrays stacked on axis 0
in, named arrays with the same leading dimension out. Python stages declared `batching:
list` implement `ListRuntime`: one dict per request in, one dict per request out.
`StageRunner` (`runner.py`) does the stacking, splitting and checking around either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

# One request's (or one result's) tensors by name, without the batch dimension.
Item = Mapping[str, np.ndarray]


class ModelError(RuntimeError):
    """A model could not be loaded or failed on a batch.

    The message says which stage, what was wrong and how to fix it; the router and the
    CLI show it to users as is.
    """


@runtime_checkable
class Runtime(Protocol):
    """A loaded model that maps stacked inputs to stacked outputs (batch on axis 0)."""

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: every input has the batch size as its first dimension, and so
        must every output. Raise `ModelError` for failures a user must see."""
        ...


@runtime_checkable
class ListRuntime(Protocol):
    """A loaded model that takes one dict per request (ragged shapes, optional inputs)."""

    def predict_list(self, items: Sequence[Item]) -> list[dict[str, np.ndarray]]:
        """Run one batch: one result dict per item, in the same order."""
        ...
