"""TorchScript models through `torch.jit.load`, on the CPU or one CUDA device.

torch is an optional dependency (`pip install 'sloline[torch]'`) and is imported only
when a TorchScript stage is loaded. Its thread settings are process-wide: loading a stage
sets `torch.set_num_threads(threads)` and one inter-op thread for the whole process. That
is what a worker wants, because a worker process serves exactly one stage; a process that
loads several TorchScript stages (tests, `sloline bench`) gets the last stage's setting.

Inputs are passed to `forward` positionally, in the order the stage declares them.
`forward` may return one tensor (the stage's only output), a tuple or list of tensors
(the declared outputs, in declared order) or a dict of tensors keyed by output name.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sloline.runtimes.base import ModelError
from sloline.spec.models import StageSpec


def import_torch(stage: str) -> Any:
    """The `torch` module, or a `ModelError` telling how to install it."""
    try:
        import torch
    except ImportError as exc:
        raise ModelError(
            f"stage {stage!r} uses runtime torchscript but PyTorch is not installed; "
            "install it with: pip install 'sloline[torch]'"
        ) from exc
    return torch


def set_torch_threads(torch: Any, threads: int) -> None:
    """Process-wide: `threads` intra-op threads and one inter-op thread."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            # torch allows this only before its inter-op pool starts; a process that
            # already ran torch work keeps its pool, which sequential models do not use.
            warnings.warn(
                "torch's inter-op thread pool had already started; leaving it at "
                f"{torch.get_num_interop_threads()} threads",
                RuntimeWarning,
                stacklevel=3,
            )


class TorchScriptRuntime:
    """A `torch.jit.ScriptModule` serving one stage (implements `Runtime`)."""

    def __init__(
        self,
        path: Path,
        stage: StageSpec,
        *,
        threads: int = 1,
        cuda_device: int | None = None,
    ) -> None:
        torch = import_torch(stage.name)
        self._torch = torch
        self.stage_name = stage.name
        self._input_names = [i.name for i in stage.inputs]
        self._output_names = [o.name for o in stage.outputs]
        if not path.is_file():
            raise ModelError(
                f"stage {stage.name!r}: TorchScript file {path} does not exist; fix "
                "model.uri (relative paths are resolved against the pipeline file) or "
                "build the model first"
            )
        self.device = _device(torch, stage.name, cuda_device)
        set_torch_threads(torch, threads)
        try:
            with warnings.catch_warnings():
                # torch marks TorchScript deprecated; sloline serves the format on purpose.
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(str(path), map_location=self.device)
        except Exception as exc:
            raise ModelError(
                f"stage {stage.name!r}: torch.jit.load cannot load {path}: {exc}; save the "
                "model with torch.jit.script(...).save() or torch.jit.trace(...).save()"
            ) from exc
        module.eval()
        self.module = module

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        try:
            args = [self._tensor(inputs[name]) for name in self._input_names]
        except KeyError as exc:
            raise ModelError(f"stage {self.stage_name!r}: input {exc} is missing") from None
        try:
            with torch.inference_mode():
                result = self.module(*args)
        except Exception as exc:
            shapes = ", ".join(
                f"{n}: {a.dtype}{list(a.shape)}"
                for n, a in zip(self._input_names, args, strict=True)
            )
            raise ModelError(
                f"stage {self.stage_name!r}: the TorchScript model failed on a batch "
                f"({shapes}): {exc}"
            ) from exc
        return {name: self._array(name, value) for name, value in self._named(result).items()}

    def _tensor(self, array: np.ndarray) -> Any:
        # torch.from_numpy shares memory and warns on read-only arrays (request tensors
        # are read-only views of the bytes that arrived); copy those.
        if not array.flags.writeable:
            array = array.copy()
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _named(self, result: Any) -> dict[str, Any]:
        torch = self._torch
        names = self._output_names
        if isinstance(result, torch.Tensor):
            if len(names) != 1:
                raise ModelError(
                    f"stage {self.stage_name!r}: the model returned one tensor but the "
                    f"stage declares {len(names)} outputs {names}; return a tuple in that "
                    "order or a dict keyed by output name"
                )
            return {names[0]: result}
        if isinstance(result, tuple | list):
            if len(result) != len(names):
                raise ModelError(
                    f"stage {self.stage_name!r}: the model returned {len(result)} values but "
                    f"the stage declares {len(names)} outputs {names}; return one per "
                    "declared output, in declared order"
                )
            return dict(zip(names, result, strict=True))
        if isinstance(result, dict):
            return {str(k): v for k, v in result.items()}
        raise ModelError(
            f"stage {self.stage_name!r}: the model returned {type(result).__name__}; return "
            "a tensor, a tuple of tensors or a dict of tensors"
        )

    def _array(self, name: str, value: Any) -> np.ndarray:
        if not isinstance(value, self._torch.Tensor):
            raise ModelError(
                f"stage {self.stage_name!r}: output {name!r} is a {type(value).__name__}, "
                "not a tensor"
            )
        try:
            return np.asarray(value.detach().cpu().numpy())
        except TypeError as exc:
            raise ModelError(
                f"stage {self.stage_name!r}: output {name!r} has dtype {value.dtype}, which "
                f"numpy cannot hold ({exc}); convert it in the model, e.g. `.float()`"
            ) from exc


def _device(torch: Any, stage: str, cuda_device: int | None) -> str:
    if cuda_device is None:
        return "cpu"
    if torch.cuda.is_available() and cuda_device < torch.cuda.device_count():
        return f"cuda:{cuda_device}"
    warnings.warn(
        f"stage {stage!r}: CUDA device {cuda_device} was requested but torch sees "
        f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA devices "
        "(a CPU-only torch build, or no GPU); running on the CPU",
        RuntimeWarning,
        stacklevel=3,
    )
    return "cpu"
