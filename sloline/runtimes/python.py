"""Python stages: a `module:attr` entrypoint written by the user beside the pipeline file.

`attr` is a function, or a class instantiated once with the stage's `model.config` as
keyword arguments; an instance's `predict` method is called if it has one, else the
instance itself. With `batching: stacked` it receives a dict of arrays stacked on axis 0
and returns a dict of arrays with the same leading dimension; with `batching: list` it
receives a list of per-request dicts (ragged shapes, optional inputs absent when their
producer was skipped) and returns a list of per-request dicts in the same order.

`module` is a file in the model directory (the pipeline file's directory, or
`$SLOLINE_MODEL_DIR`), loaded by its location: never a module from anywhere else
(`sloline.spec.paths`). The model directory also goes first on `sys.path`, so the module
imports its neighbours the way `python model_dir/script.py` would.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from sloline.runtimes.base import Item, ModelError
from sloline.spec.models import StageSpec
from sloline.spec.paths import ModulePart, PathEscape, locate_module


def import_entrypoint(entrypoint: str, base_dir: Path, *, what: str = "entrypoint") -> Any:
    """Import `module:attr` from its file in `base_dir` and return `attr`.

    The module is loaded by file location (`sloline.spec.paths.locate_module`: inside
    `base_dir` after symlinks, never a standard-library, installed or sloline module), so
    no name can fall back to a module outside the model directory. `base_dir` also goes
    first on `sys.path`, so the module imports its neighbours as a script would. A module
    of the same name loaded earlier from another model directory (another pipeline in the
    same process) is loaded afresh; objects already taken from the old one keep working.
    `what` names the caller in error messages.
    """
    module_name, _, attr = entrypoint.partition(":")
    if not module_name or not attr:
        raise ModelError(f"{what}: entrypoint {entrypoint!r} must look like 'module:attr'")
    directory = base_dir.resolve()
    try:
        parts = locate_module(directory, module_name)
    except PathEscape as exc:
        raise ModelError(f"{what}: entrypoint {entrypoint!r}: {exc}") from None
    if str(directory) in sys.path:
        sys.path.remove(str(directory))
    sys.path.insert(0, str(directory))
    _MODEL_DIRS.add(directory)
    importlib.invalidate_caches()  # files written after start-up (tests, builds)
    try:
        module = _load(parts, directory)
    except ModelError as exc:
        raise ModelError(f"{what}: entrypoint {entrypoint!r}: {exc}") from None
    except ModuleNotFoundError as exc:
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


# Every model directory modules were loaded from in this process: a cached module from
# one of them may be replaced by a module of the same name from another.
_MODEL_DIRS: set[Path] = set()


def _load(parts: list[ModulePart], directory: Path) -> ModuleType:
    """Execute each level of a located module (reusing those already loaded from
    `directory`) and return the last."""
    module: ModuleType | None = None
    for part in parts:
        cached = sys.modules.get(part.name)
        if cached is not None and _inside(cached, directory):
            module = cached
            continue
        if cached is not None:
            if not any(_inside(cached, d) for d in _MODEL_DIRS):
                raise ModelError(
                    f"the module name {part.name!r} is taken in this process by "
                    f"{getattr(cached, '__file__', None) or cached!r}; rename your module"
                )
            for name in [n for n in sys.modules if n == part.name or n.startswith(part.name + ".")]:
                del sys.modules[name]
        module = _execute(part)
        if "." in part.name:
            parent, _, child = part.name.rpartition(".")
            setattr(sys.modules[parent], child, module)
    if module is None:  # pragma: no cover - locate_module returns at least one part
        raise ModelError("empty module name")
    return module


def _execute(part: ModulePart) -> ModuleType:
    """Load one located module from its file (or make an empty namespace package)."""
    locations = [str(part.package)] if part.package is not None else None
    if part.file is not None:
        spec = importlib.util.spec_from_file_location(
            part.name, part.file, submodule_search_locations=locations
        )
    else:
        spec = importlib.machinery.ModuleSpec(part.name, None, is_package=True)
        spec.submodule_search_locations = locations
    if spec is None:  # pragma: no cover - a .py file always has a spec
        raise ModelError(f"cannot load {part.file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[part.name] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(part.name, None)
        raise
    return module


def _inside(module: ModuleType, directory: Path) -> bool:
    """Whether `module` was loaded from a file (or is a package) inside `directory`."""
    file = getattr(module, "__file__", None)
    places = [file] if file else list(getattr(module, "__path__", None) or [])
    return bool(places) and all(Path(p).resolve().is_relative_to(directory) for p in places)


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
