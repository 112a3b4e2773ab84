"""Markdown field reference of the PredictionPipeline spec, generated from the models
(`sloline crd --reference`), so the docs never drift from the code."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sloline.spec.hardware import HardwareCatalog
from sloline.spec.models import PredictionPipeline


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[1])}"
    if isinstance(annotation, type):
        return (
            annotation.__name__
            if issubclass(annotation, BaseModel)
            else {
                "str": "string",
                "int": "integer",
                "float": "number",
                "bool": "boolean",
            }.get(annotation.__name__, annotation.__name__)
        )
    return "any"


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for key in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
            value = getattr(meta, key, None)
            if value is not None:
                parts.append(f"{key.replace('_', ' ')} {value}")
    return ", ".join(parts)


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for info in model.model_fields.values():
            stack = [info.annotation]
            while stack:
                ann = stack.pop()
                if isinstance(ann, type) and issubclass(ann, BaseModel):
                    visit(ann)
                stack.extend(typing.get_args(ann))

    visit(root)
    return seen


def reference_markdown() -> str:
    lines = [
        "# PredictionPipeline reference (sloline.dev/v1alpha1)",
        "",
        "Generated from `sloline/spec/models.py` and `hardware.py` by "
        "`sloline crd --reference`; do not edit by hand.",
    ]
    for model in [*_models(PredictionPipeline), *_models(HardwareCatalog)]:
        lines += ["", f"## {model.__name__}", ""]
        if model.__doc__ and "Base:" not in model.__doc__:
            lines += [" ".join(model.__doc__.split()), ""]
        lines += ["| field | type | required | default | notes |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            alias = info.alias or name
            default = "" if info.default is PydanticUndefined else f"`{info.default!r}`"
            if info.default_factory is not None:
                default = "empty"
            notes = " ".join(
                filter(None, [(info.description or "").replace("\n", " "), _constraints(info)])
            )
            lines.append(
                f"| `{alias}` | {_type_name(info.annotation)} | "
                f"{'yes' if info.is_required() else ''} | {default} | {notes} |"
            )
    return "\n".join(lines) + "\n"
