"""Conditional-edge expressions (`when:`), parsed once and evaluated safely.

The grammar is a small CEL-like subset: comparisons (`< <= > >= == !=`), boolean
`&& || !` (or `and or not`), arithmetic `+ - * /`, numeric and boolean literals,
references to upstream outputs as `stage.tensor` (or a pipeline input by bare name), and
the reductions `max min sum mean abs any all` over a tensor. Python's `ast` module parses
the text; a whitelist walk compiles it into closures. Nothing is ever passed to `eval`.

Hostile text is bounded before it can cost much: at most `MAX_CHARS` characters and
`MAX_DEPTH` levels of syntax tree (checked without recursion); whatever the parser raises
on it (RecursionError, MemoryError, SyntaxError, ValueError) is a `ConditionError`.
Evaluation runs under `numpy.errstate(all="raise")`: a division by zero, overflow or
invalid operation, like any other error while evaluating (a missing value, an index or
shape error, a Python `ZeroDivisionError`), is a `ConditionError` naming the condition,
never a silent inf/nan and never an exception of another type.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# Per-request values a condition can see: {"stage": {"tensor": array}} plus pipeline
# inputs under the key "" ({"": {"pixels": array}}).
Values = Mapping[str, Mapping[str, np.ndarray]]
Evaluator = Callable[[Values], Any]

_FUNCTIONS: dict[str, Callable[[np.ndarray], Any]] = {
    "max": np.max,
    "min": np.min,
    "sum": np.sum,
    "mean": np.mean,
    "abs": np.abs,
    "any": np.any,
    "all": np.all,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_ARITH: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_CEL_TOKENS = [
    (re.compile(r"&&"), " and "),
    (re.compile(r"\|\|"), " or "),
    (re.compile(r"!(?!=)"), " not "),
]


MAX_CHARS = 1024  # the same bound as the spec's `when` field (and the CRD's maxLength)
MAX_DEPTH = 32  # levels of syntax tree: `-(-(1))` is 4 (unary, unary, constant + root)


class ConditionError(ValueError):
    """The expression cannot be parsed, uses something outside the grammar, is over a
    limit, or failed while being evaluated."""


@dataclass(frozen=True, slots=True)
class Condition:
    """A compiled condition: `refs` are the (stage, tensor) pairs it reads."""

    text: str
    refs: frozenset[tuple[str, str]]
    _fn: Evaluator

    def __call__(self, values: Values) -> bool:
        try:
            with np.errstate(all="raise"):
                result = self._fn(values)
                return bool(np.asarray(result).item())
        except KeyError as exc:
            raise ConditionError(f"condition {self.text!r}: value {exc} is missing") from exc
        except FloatingPointError as exc:
            raise ConditionError(f"condition {self.text!r} failed: numpy: {exc}") from exc
        except ValueError as exc:
            raise ConditionError(
                f"condition {self.text!r} did not give one boolean ({exc}); reduce "
                "multi-element tensors with max(), min(), any() or all()"
            ) from exc
        except Exception as exc:
            raise ConditionError(
                f"condition {self.text!r} failed: {type(exc).__name__}: {exc}"
            ) from exc


def parse_condition(text: str) -> Condition:
    """Parse `text` into a `Condition`, raising `ConditionError` with the reason."""
    if len(text) > MAX_CHARS:
        raise ConditionError(f"condition is {len(text)} characters long; the limit is {MAX_CHARS}")
    source = text
    for pattern, replacement in _CEL_TOKENS:
        source = pattern.sub(replacement, source)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"cannot parse condition {_short(text)}: {exc.msg}") from exc
    except (RecursionError, MemoryError) as exc:
        raise ConditionError(
            f"cannot parse condition {_short(text)}: nested too deeply "
            f"({type(exc).__name__}); the limit is {MAX_DEPTH} levels"
        ) from None
    except ValueError as exc:
        raise ConditionError(f"cannot parse condition {_short(text)}: {exc}") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise ConditionError(
            f"condition {_short(text)} is nested {depth} levels deep; the limit is {MAX_DEPTH}"
        )
    refs: set[tuple[str, str]] = set()
    fn = _compile(tree.body, refs, text)
    return Condition(text=text, refs=frozenset(refs), _fn=fn)


def _short(text: str, limit: int = 80) -> str:
    """`text` quoted, cut to `limit` characters (hostile text can be long)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} chars)"


def _depth(tree: ast.AST) -> int:
    """The syntax tree's depth, walked without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _compile(node: ast.expr, refs: set[tuple[str, str]], text: str) -> Evaluator:  # noqa: C901, PLR0911, PLR0912 - one branch per grammar rule
    if isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float):
        value = node.value
        return lambda _v: value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        stage, tensor = node.value.id, node.attr
        refs.add((stage, tensor))
        return lambda v: v[stage][tensor]
    if isinstance(node, ast.Name):
        if node.id in ("true", "false"):
            flag = node.id == "true"
            return lambda _v: flag
        name = node.id
        refs.add(("", name))
        return lambda v: v[""][name]
    if isinstance(node, ast.BoolOp):
        parts = [_compile(value, refs, text) for value in node.values]
        if isinstance(node.op, ast.And):
            return lambda v: all(bool(np.asarray(p(v)).item()) for p in parts)
        return lambda v: any(bool(np.asarray(p(v)).item()) for p in parts)
    if isinstance(node, ast.UnaryOp):
        inner = _compile(node.operand, refs, text)
        if isinstance(node.op, ast.Not):
            return lambda v: not bool(np.asarray(inner(v)).item())
        if isinstance(node.op, ast.USub):
            return lambda v: -inner(v)
    if isinstance(node, ast.Compare):
        left = _compile(node.left, refs, text)
        ops = [_COMPARE[type(op)] for op in node.ops if type(op) in _COMPARE]
        if len(ops) != len(node.ops):
            raise ConditionError(f"condition {text!r}: only < <= > >= == != compare")
        rights = [_compile(c, refs, text) for c in node.comparators]

        def compare(v: Values) -> bool:
            current = left(v)
            for op, right in zip(ops, rights, strict=True):
                nxt = right(v)
                if not bool(np.asarray(op(current, nxt)).item()):
                    return False
                current = nxt
            return True

        return compare
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        arith = _ARITH[type(node.op)]
        lhs, rhs = _compile(node.left, refs, text), _compile(node.right, refs, text)
        return lambda v: arith(lhs(v), rhs(v))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and len(node.args) == 1
        and not node.keywords
    ):
        reduce, arg = _FUNCTIONS[node.func.id], _compile(node.args[0], refs, text)
        return lambda v: reduce(arg(v))
    raise ConditionError(
        f"condition {text!r}: {ast.unparse(node)!r} is not allowed; use comparisons, "
        f"&& || !, arithmetic, stage.tensor references and {', '.join(_FUNCTIONS)}()"
    )
