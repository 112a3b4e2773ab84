"""What a pipeline spec may point at: files inside its model directory, nothing else.

A spec names files in two ways: paths (a stage's `model.uri`, `samples.uri`,
`workload.traceUri`) and Python entrypoints (`module:attr` in a stage's `model.entrypoint`
or `samples.entrypoint`). Both must stay inside the *model directory* after symlinks are
resolved, so a spec can load only what whoever filled the model directory put there:

- a path is relative to the model directory, has no `..` component and no absolute form
  (an absolute path inside the model directory can always be written relative, and the
  model directory is mounted at different places by `sloline run` and on Kubernetes);
- an entrypoint's module is a `.py` file (or a package directory) in the model directory:
  `a.b.c` is `a/b/c.py` or `a/b/c/__init__.py`; never a standard-library, installed or
  sloline module, even where the model directory has a file of that name (loading it under
  that name would replace the real module in the process).

A stage's `model.storageUri` is fetched into the model cache instead
(`sloline.spec.storage`), where no part of the URI becomes a path.

`path_issues` is the check without the files (`build_graph`: the CLI, the router, the
operator); `resolve_inside` and `locate_module` check against the files (`sloline
validate`, `sloline run`, profiling, and each worker again before it loads anything).
"""

from __future__ import annotations

import functools
import importlib.machinery
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING

from sloline.spec.storage import storage_uri_problem

if TYPE_CHECKING:
    from sloline.spec.models import PredictionPipeline

RESERVED_MODULES = frozenset(sys.stdlib_module_names) | {"sloline", "__main__"}


class PathEscape(ValueError):
    """A path or entrypoint of the spec points outside the model directory."""


@dataclass(frozen=True, slots=True)
class ModulePart:
    """One level of a dotted module name, as found in the model directory: `file` is the
    `.py` file to execute (None: a directory without `__init__.py`), `package` the
    directory its submodules are found in (None: a plain module)."""

    name: str
    file: Path | None
    package: Path | None


def uri_problem(uri: str) -> str | None:
    """Why `uri` may not be used as a path in the model directory, or None."""
    if not uri.strip():
        return "is empty; give a file path relative to the model directory"
    if "\x00" in uri:
        return "contains a NUL character"
    posix, windows = PurePosixPath(uri), PureWindowsPath(uri)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or uri.startswith("\\"):
        return (
            f"{uri!r} is an absolute path; give a path relative to the model directory "
            "(absolute paths are not allowed, even inside it)"
        )
    if ".." in posix.parts or ".." in windows.parts:
        return f"{uri!r} contains '..'; paths must stay inside the model directory"
    return None


def entrypoint_problem(entrypoint: str) -> str | None:
    """Why `module:attr` cannot name a module of the model directory, or None (the
    files are not looked at; `locate_module` does that)."""
    module, _, attr = entrypoint.partition(":")
    parts = module.split(".")
    if not attr or not all(p.isidentifier() for p in parts) or not attr.isidentifier():
        return f"{entrypoint!r} must look like 'module:attr'"
    top = parts[0]
    if top in RESERVED_MODULES:
        what = "sloline's own package" if top == "sloline" else "a standard-library module"
        return (
            f"module {top!r} is {what}; entrypoints load only modules from files in the "
            "model directory: rename your module"
        )
    if installed(top):
        return (
            f"module {top!r} is an installed package; entrypoints load only modules from "
            "files in the model directory: rename your module"
        )
    return None


def path_issues(pipeline: PredictionPipeline) -> list[tuple[str, str]]:
    """(field path, reason) for every path and entrypoint of the spec that cannot stay
    inside the model directory, judged from the text alone."""
    found: list[tuple[str, str]] = []
    for path, kind, value in spec_files(pipeline):
        problem = uri_problem(value) if kind == "uri" else entrypoint_problem(value)
        if problem:
            found.append((path, problem))
    spec = pipeline.spec
    stores: list[tuple[str, str | None]] = [
        (f"spec.stages[{i}].model.storageUri", s.model.storage_uri)
        for i, s in enumerate(spec.stages)
    ]
    stores.append(("spec.storageUri", spec.storage_uri))
    for field, uri in stores:
        problem = storage_uri_problem(uri) if uri is not None else None
        if problem:
            found.append((field, problem))
    return found


def spec_files(pipeline: PredictionPipeline) -> list[tuple[str, str, str]]:
    """(field path, "uri" | "entrypoint", value) of every file the spec names."""
    spec = pipeline.spec
    out: list[tuple[str, str, str]] = []
    for i, stage in enumerate(spec.stages):
        if stage.model.uri is not None:
            out.append((f"spec.stages[{i}].model.uri", "uri", stage.model.uri))
        if stage.model.entrypoint is not None:
            out.append((f"spec.stages[{i}].model.entrypoint", "entrypoint", stage.model.entrypoint))
    if spec.samples is not None:
        if spec.samples.uri is not None:
            out.append(("spec.samples.uri", "uri", spec.samples.uri))
        if spec.samples.entrypoint is not None:
            out.append(("spec.samples.entrypoint", "entrypoint", spec.samples.entrypoint))
    if spec.workload.trace_uri is not None:
        out.append(("spec.workload.traceUri", "uri", spec.workload.trace_uri))
    return out


def resolve_inside(base_dir: Path, uri: str) -> Path:
    """`uri` as a path in `base_dir`, symlinks resolved; raises `PathEscape` when it is
    not a relative path or leads outside `base_dir`. The file need not exist."""
    problem = uri_problem(uri)
    if problem:
        raise PathEscape(problem)
    root = base_dir.resolve()
    path = (root / uri).resolve()
    if not path.is_relative_to(root):
        raise PathEscape(
            f"{uri!r} leads to {path}, outside the model directory {root} (through a symlink)"
        )
    return path


def locate_module(base_dir: Path, module: str) -> list[ModulePart]:
    """The files of `module` (dotted) in `base_dir`, one per level, symlinks resolved and
    each inside `base_dir`; raises `PathEscape` with the reason otherwise.

    Each level is a directory with `__init__.py` (a package), else `<name>.py` (the last
    level only), else a directory without `__init__.py` (a namespace package)."""
    problem = entrypoint_problem(f"{module}:_")
    if problem:
        raise PathEscape(problem)
    root = base_dir.resolve()
    parts = module.split(".")
    found: list[ModulePart] = []
    where = root
    for i, part in enumerate(parts):
        name = ".".join(parts[: i + 1])
        last = i == len(parts) - 1
        directory, file = where / part, where / f"{part}.py"
        if (directory / "__init__.py").is_file():
            found.append(ModulePart(name, _inside(root, directory / "__init__.py"), directory))
        elif last and file.is_file():
            found.append(ModulePart(name, _inside(root, file), None))
        elif directory.is_dir():
            found.append(ModulePart(name, None, _inside(root, directory)))
        else:
            shown = "/".join(parts[: i + 1])
            looked = f"{shown}.py or {shown}/" if last else f"package {shown}/"
            raise PathEscape(
                f"there is no {looked} in the model directory {root}; put the module beside "
                "the pipeline file (entrypoints load only modules from the model directory)"
            )
        where = directory
    return found


def _inside(root: Path, path: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise PathEscape(
            f"{path.relative_to(root)} leads to {resolved}, outside the model directory "
            f"{root} (through a symlink)"
        )
    return resolved


@functools.cache
def _library_paths() -> tuple[str, ...]:
    """Where the standard library and installed packages live (never a model directory)."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        paths.add(site.getusersitepackages())
    return tuple(sorted(p for p in paths if Path(p).is_dir()))


@functools.cache
def installed(top: str) -> bool:
    """Whether an installed package or module has the top-level name `top` (looked up in
    the library directories without importing anything)."""
    try:
        return importlib.machinery.PathFinder.find_spec(top, list(_library_paths())) is not None
    except (ImportError, ValueError):
        return False
