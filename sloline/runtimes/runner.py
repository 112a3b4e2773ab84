"""`StageRunner`: one stage's model behind a per-request interface, as workers and the
profiler use it.

A worker pulls a batch of queued requests, each a dict of named arrays, and needs one
result dict per request back in the same order. The runner stacks the requests on axis 0
(requests whose shapes, datatypes or present inputs differ go to separate sub-batches, so
ragged inputs still work), calls the runtime, checks the outputs against the stage's
declaration (every output present, batch-sized leading dimension, per-request shape,
datatype, converting when that is safe) and splits them back. Python stages declared
`batching: list` get the requests as they are.

The runner does not check its requests' inputs. In a served pipeline they were checked
once, where they entered: a pipeline input by the router (`sloline.serving.checks`), an
upstream stage's output by that stage's runner, against the same declaration. What a
malformed hop could still do to the worker, the runner contains anyway: requests of
different shapes, datatypes or inputs never share a stacked batch, and anything the
model raises on them is a `ModelError` for that batch, not the end of the process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from sloline.runtimes.base import Item, ListRuntime, ModelError, Runtime
from sloline.runtimes.conform import bytes_array, cast_hint, dims_match, dtype_of, safe_cast
from sloline.runtimes.onnx import OnnxRuntime
from sloline.runtimes.python import load_python
from sloline.runtimes.torchscript import TorchScriptRuntime
from sloline.spec.loader import LoadedPipeline
from sloline.spec.models import StageSpec, TensorSpec
from sloline.spec.paths import PathEscape, resolve_inside
from sloline.spec.storage import cache_root, cached_path
from sloline.spec.validate import PipelineGraph

Result = dict[str, np.ndarray]


class StageRunner:
    """Runs batches of requests through one stage's model (see the module docstring)."""

    def __init__(
        self,
        stage: StageSpec,
        runtime: Runtime | ListRuntime,
        input_specs: Mapping[str, TensorSpec] | None = None,
    ) -> None:
        self.stage = stage
        self.runtime = runtime
        # Decided once: runtime_checkable isinstance checks are slow on the hot path.
        self._list_runtime = runtime if isinstance(runtime, ListRuntime) else None
        self._stacked_runtime = None if isinstance(runtime, ListRuntime) else runtime
        self.input_specs = dict(input_specs) if input_specs is not None else None

    @property
    def name(self) -> str:
        return self.stage.name

    def run(self, items: Sequence[Item]) -> list[Result]:
        """One result dict per request, in request order; raise `ModelError` on failure."""
        if not items:
            return []
        # Unchecked (see the module docstring); a fresh dict for the model to keep.
        prepared = [{name: np.asarray(value) for name, value in item.items()} for item in items]
        if self._list_runtime is not None:
            with self._model_errors():
                results = self._list_runtime.predict_list(prepared)
            if len(results) != len(prepared):
                raise ModelError(
                    f"stage {self.name!r}: the model returned {len(results)} results for "
                    f"{len(prepared)} requests; return exactly one per request, in order"
                )
            return [self._conform_one(result) for result in results]
        if len(prepared) == 1:  # the common case at low load: nothing to group
            return self._run_stacked(prepared)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, item in enumerate(prepared):
            signature = tuple(sorted((k, v.shape, v.dtype.str) for k, v in item.items()))
            groups.setdefault(signature, []).append(index)
        out: list[Result] = [{} for _ in prepared]
        for indices in groups.values():
            for index, result in zip(
                indices, self._run_stacked([prepared[i] for i in indices]), strict=True
            ):
                out[index] = result
        return out

    def warmup(self, samples: Sequence[Item] | None = None, *, batch_size: int = 1) -> None:
        """Run one batch so lazy initialisation (allocations, kernels) happens now.

        Without `samples`, the batch is `batch_size` requests of zeros of the declared
        input shapes (variable dimensions = 1); that needs `input_specs`. Stages whose
        model needs real values (e.g. a first stage that rejects all-zero input) are
        warmed with `samples` instead.
        """
        if samples is not None:
            self.run(samples)
            return
        specs = self.input_specs or {}
        names = [i.name for i in self.stage.inputs]
        if missing := [n for n in names if n not in specs]:
            raise ModelError(
                f"stage {self.name!r}: warmup without samples needs the shapes of inputs "
                f"{missing}; load the stage with load_pipeline_stage (or pass "
                "input_specs to load_stage), or pass sample items"
            )
        zeros = {
            name: np.full(
                [1 if d == -1 else d for d in specs[name].shape],
                b"" if specs[name].datatype == "BYTES" else 0,
                dtype=dtype_of(specs[name].datatype),
            )
            for name in names
        }
        self.run([zeros] * batch_size)

    def _run_stacked(self, group: list[dict[str, np.ndarray]]) -> list[Result]:
        size = len(group)
        # Always a fresh array, also for one request: models may modify their input.
        batch = {k: np.stack([item[k] for item in group]) for k in group[0]}
        assert self._stacked_runtime is not None
        with self._model_errors():
            outputs = self._stacked_runtime.predict(batch)
        if not isinstance(outputs, Mapping):
            raise ModelError(
                f"stage {self.name!r}: the runtime returned {type(outputs).__name__}, not a "
                "dict of arrays"
            )
        checked = {}
        for spec in self.stage.outputs:
            array = self._output(outputs, spec)
            if array.ndim < 1 or array.shape[0] != size:
                raise ModelError(
                    f"stage {self.name!r}: output {spec.name!r} has shape {list(array.shape)} "
                    f"for a batch of {size}; its first dimension must be the batch size"
                )
            if spec.shape == [1] and array.ndim == 1:
                array = array.reshape(size, 1)
            self._check_shape(spec, array.shape[1:])
            checked[spec.name] = array
        return [{name: array[i] for name, array in checked.items()} for i in range(size)]

    def _conform_one(self, result: Mapping[str, Any]) -> Result:
        conformed = {}
        for spec in self.stage.outputs:
            array = self._output(result, spec)
            if spec.shape == [1] and array.ndim == 0:
                array = array.reshape(1)
            self._check_shape(spec, array.shape)
            conformed[spec.name] = array
        return conformed

    def _output(self, outputs: Mapping[str, Any], spec: TensorSpec) -> np.ndarray:
        if spec.name not in outputs:
            raise ModelError(
                f"stage {self.name!r}: the model did not return declared output "
                f"{spec.name!r} (it returned {sorted(outputs)}); return it or fix "
                "outputs[].name"
            )
        array = np.asarray(outputs[spec.name])
        if spec.datatype == "BYTES":
            converted = bytes_array(array)
            if converted is None:
                raise ModelError(
                    f"stage {self.name!r}: output {spec.name!r} is declared BYTES but is "
                    f"{array.dtype} ({array.dtype.kind}); return an object array of bytes "
                    "(or str) elements"
                )
            return converted
        want = dtype_of(spec.datatype)
        if array.dtype == want:
            return array
        if not safe_cast(array.dtype, want):
            raise ModelError(
                f"stage {self.name!r}: output {spec.name!r} is {array.dtype} but declared "
                f"{spec.datatype}, and converting could change values; "
                f"{cast_hint(array.dtype, spec.datatype)}"
            )
        return array.astype(want)

    def _check_shape(self, spec: TensorSpec, shape: tuple[int, ...]) -> None:
        if len(shape) != len(spec.shape) or not dims_match(spec.shape, shape):
            raise ModelError(
                f"stage {self.name!r}: output {spec.name!r} has shape {list(shape)} per "
                f"request but is declared {spec.shape} (-1 = any size); fix the model or "
                "outputs[].shape"
            )

    @contextmanager
    def _model_errors(self) -> Iterator[None]:
        try:
            yield
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(
                f"stage {self.name!r}: the model raised {type(exc).__name__}: {exc}"
            ) from exc


def load_stage(
    stage: StageSpec,
    base_dir: Path,
    *,
    threads: int = 1,
    cuda_device: int | None = None,
    input_specs: Mapping[str, TensorSpec] | None = None,
) -> StageRunner:
    """Load `stage`'s model and wrap it in a `StageRunner`.

    `base_dir` is the model directory: model files and Python modules are found in it,
    and nowhere else (`sloline.spec.paths`). `threads` is the replica's CPU thread
    budget: onnxruntime's intra-op threads, or torch's process-wide thread count; Python
    stages run in the calling thread and are not limited. `cuda_device` selects a GPU for
    ONNX and TorchScript stages, falling back to the CPU with a `RuntimeWarning` when it
    is not available.
    `input_specs` (see `stage_input_specs`) enables `warmup()` without samples, and ONNX
    stages check their model's inputs against it when they load.
    """
    model = stage.model
    runtime: Runtime | ListRuntime
    if model.runtime == "python":
        runtime = load_python(stage, base_dir)
    else:
        if model.storage_uri is not None:
            path = cached_path(cache_root(), model.storage_uri, model.sha256)
            if not path.is_file():
                raise ModelError(
                    f"stage {stage.name!r}: {model.storage_uri} is not fetched into {path.parent} "
                    "(sloline run fetches it; on Kubernetes the storage initializer does)"
                )
        elif model.uri is None:
            raise ModelError(f"stage {stage.name!r}: {model.runtime} stages need model.uri")
        else:
            try:
                path = resolve_inside(base_dir, model.uri)
            except PathEscape as exc:
                raise ModelError(f"stage {stage.name!r}: model.uri {exc}") from None
        if model.runtime == "onnx":
            runtime = OnnxRuntime(
                path, stage, threads=threads, cuda_device=cuda_device, input_specs=input_specs
            )
        else:
            runtime = TorchScriptRuntime(path, stage, threads=threads, cuda_device=cuda_device)
    return StageRunner(stage, runtime, input_specs)


def stage_input_specs(graph: PipelineGraph, stage: str) -> dict[str, TensorSpec]:
    """Each model input of `stage` with the shape and datatype of the tensor feeding it
    (a pipeline input or an upstream stage's output), keyed by the model input name."""
    node = graph.stages[stage]
    pipeline_inputs = {t.name: t for t in graph.inputs}
    specs = {}
    for name, ref, _optional in node.input_refs:
        if ref.stage:
            source = next(t for t in graph.stages[ref.stage].spec.outputs if t.name == ref.tensor)
        else:
            source = pipeline_inputs[ref.tensor]
        specs[name] = source.model_copy(update={"name": name})
    return specs


def load_pipeline_stage(
    pipeline: LoadedPipeline, stage: str, *, threads: int = 1, cuda_device: int | None = None
) -> StageRunner:
    """Load one stage of a loaded pipeline, with its input shapes known (what a worker does)."""
    if stage not in pipeline.graph.stages:
        raise ModelError(
            f"pipeline {pipeline.name!r} has no stage {stage!r}; its stages are "
            f"{list(pipeline.graph.order)}"
        )
    return load_stage(
        pipeline.graph.stages[stage].spec,
        pipeline.base_dir,
        threads=threads,
        cuda_device=cuda_device,
        input_specs=stage_input_specs(pipeline.graph, stage),
    )
