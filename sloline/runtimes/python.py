"""Python stages: a `module:attr` entrypoint written by the user beside the pipeline file.

`attr` is a function, or a class instantiated once with the stage's `model.config` as
keyword arguments; an instance's `predict` method is called if it has one, else the
instance itself. With `batching: stacked` it receives a dict of arrays stacked on axis 0
and returns a dict of arrays with the same leading dimension; with `batching: list` it
receives a list of per-request dicts (ragged shapes, optional inputs absent when their
producer was skipped) and returns a list of per-request dicts in the same order.

The pipeline file's directory is put first on `sys.path` so `module` is found beside the
pipeline, the way `python pipeline_dir/script.py` would find it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sloline.runtimes.base import Item, ModelError
from sloline.spec.models import StageSpec


def import_entrypoint(entrypoint: str, base_dir: Path, *, what: str = "entrypoint") -> Any:
    """Import `module:attr` with `base_dir` first on `sys.path` and return `attr`.

    A module of the same name imported earlier from another directory (another pipeline
    in the same process) is imported afresh from `base_dir`; objects already taken from
    the old one keep working. `what` names the caller in error messages.
    """
    module_name, _, attr = entrypoint.partition(":")
    if not module_name or not attr:
        raise ModelError(f"{what}: entrypoint {entrypoint!r} must look like 'module:attr'")
    directory = base_dir.resolve()
    if str(directory) in sys.path:
        sys.path.remove(str(directory))
    sys.path.insert(0, str(directory))
    top = module_name.partition(".")[0]
    _forget_if_foreign(top, directory)
    importlib.invalidate_caches()  # files written after start-up (tests, builds)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or module_name.startswith(f"{exc.name}."):
            raise ModelError(
                f"{what}: cannot import module {module_name!r} of entrypoint {entrypoint!r}: "
                f"there is no {top}.py (or package {top}/) in {directory}; put the module "
                "beside the pipeline file"
            ) from exc
        raise ModelError(
            f"{what}: importing {module_name!r} failed because it needs {exc.name!r}, which "
            f"is not installed; install it in the worker's environment"
        ) from exc
    except Exception as exc:
        raise ModelError(
            f"{what}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ModelError(
            f"{what}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
            f"attribute {attr!r}; fix the entrypoint or define {attr} there"
        ) from None


def _forget_if_foreign(top: str, directory: Path) -> None:
    cached = sys.modules.get(top)
    if cached is None:
        return
    if not ((directory / f"{top}.py").is_file() or (directory / top).is_dir()):
        return
    file = getattr(cached, "__file__", None)
    if file is not None and Path(file).resolve().is_relative_to(directory):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def load_callable(stage: StageSpec, base_dir: Path) -> Callable[[Any], Any]:
    """The function to call for each batch: the attr itself, or a configured instance's
    `predict` / `__call__`."""
    model = stage.model
    if model.entrypoint is None:
        raise ModelError(f"stage {stage.name!r}: python stages need model.entrypoint")
    what = f"stage {stage.name!r}"
    target = import_entrypoint(model.entrypoint, base_dir, what=what)
    if inspect.isclass(target):
        try:
            instance = target(**model.config)
        except Exception as exc:
            raise ModelError(
                f"{what}: {model.entrypoint}({', '.join(f'{k}=...' for k in model.config)}) "
                f"raised {type(exc).__name__}: {exc}; model.config entries are passed to "
                "the class as keyword arguments"
            ) from exc
        method = getattr(instance, "predict", None)
        if callable(method):
            return method  # type: ignore[no-any-return]
        if callable(instance):
            return instance
        raise ModelError(
            f"{what}: class {model.entrypoint} has neither a predict method nor __call__; "
            "define one of them taking the batch"
        )
    if not callable(target):
        raise ModelError(
            f"{what}: {model.entrypoint} is a {type(target).__name__}, not a function or class"
        )
    if model.config:
        raise ModelError(
            f"{what}: model.config is set but {model.entrypoint} is a function; config is "
            "passed to classes only: make it a class whose __init__ takes these keyword "
            "arguments, or remove model.config"
        )
    return target  # type: ignore[no-any-return]


class PythonRuntime:
    """A `batching: stacked` Python stage (implements `Runtime`)."""

    def __init__(self, stage: StageSpec, base_dir: Path) -> None:
        self.stage_name = stage.name
        self.entrypoint = stage.model.entrypoint
        self._fn = load_callable(stage, base_dir)

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = _call(self.stage_name, self._fn, dict(inputs))
        if not isinstance(result, Mapping):
            raise ModelError(
                f"stage {self.stage_name!r}: {self.entrypoint} returned "
                f"{type(result).__name__}; with batching: stacked it must return a dict of "
                "arrays keyed by output name"
            )
        return {str(k): np.asarray(v) for k, v in result.items()}


class PythonListRuntime:
    """A `batching: list` Python stage (implements `ListRuntime`)."""

    def __init__(self, stage: StageSpec, base_dir: Path) -> None:
        self.stage_name = stage.name
        self.entrypoint = stage.model.entrypoint
        self._fn = load_callable(stage, base_dir)

    def predict_list(self, items: Sequence[Item]) -> list[dict[str, np.ndarray]]:
        result = _call(self.stage_name, self._fn, [dict(item) for item in items])
        if not isinstance(result, Sequence) or isinstance(result, str | bytes):
            raise ModelError(
                f"stage {self.stage_name!r}: {self.entrypoint} returned "
                f"{type(result).__name__}; with batching: list it must return a list with "
                "one dict of arrays per request"
            )
        if len(result) != len(items):
            raise ModelError(
                f"stage {self.stage_name!r}: {self.entrypoint} returned {len(result)} results "
                f"for {len(items)} requests; return exactly one dict per request, in order"
            )
        out = []
        for i, one in enumerate(result):
            if not isinstance(one, Mapping):
                raise ModelError(
                    f"stage {self.stage_name!r}: result {i} of {self.entrypoint} is "
                    f"{type(one).__name__}, not a dict of arrays keyed by output name"
                )
            out.append({str(k): np.asarray(v) for k, v in one.items()})
        return out


def load_python(stage: StageSpec, base_dir: Path) -> PythonRuntime | PythonListRuntime:
    """The runtime for a Python stage, by its declared batching."""
    if stage.model.batching == "list":
        return PythonListRuntime(stage, base_dir)
    return PythonRuntime(stage, base_dir)


def _call(stage: str, fn: Callable[[Any], Any], batch: Any) -> Any:
    try:
        return fn(batch)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"stage {stage!r}: the model raised {type(exc).__name__}: {exc}") from exc
