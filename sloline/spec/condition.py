"""Conditional-edge expressions (`when:`) in CEL, parsed once and compiled to closures.

The text is parsed by cel-python's CEL parser (the grammar Kubernetes uses for CRD and
admission rules). The parse tree is then checked and compiled, once, into Python
closures over numpy for the supported subset, so the router's hot path never runs an
interpreter: comparisons (`< <= > >= == !=`), boolean `&& || !`, arithmetic
`+ - * / %` and unary `-`, numeric and boolean literals, references to upstream outputs as
`stage.tensor` (or a pipeline input by bare name), indexing (`fast.probabilities[0]`),
`has(stage.tensor)` (false when that stage was skipped), `size(x)` (length of the first
dimension) and the reductions `max min sum mean abs any all` over a tensor. Operands are
type-checked while compiling: `&& || !` take booleans, arithmetic and ordering take
numbers, and the whole condition must be a boolean. Nothing is ever passed to `eval`.

Hostile text is bounded before it can cost much: at most `MAX_CHARS` characters and
`MAX_DEPTH` levels of syntax tree (checked without recursion); whatever the parser raises
on it is a `ConditionError`. Evaluation runs under `numpy.errstate(all="raise")`: a
division by zero, overflow or invalid operation, like any other error while evaluating (a
missing value, an index or shape error), is a `ConditionError` naming the condition,
never a silent inf/nan and never an exception of another type. Reading a value of a
stage that was skipped (outside `has()`) makes the condition false.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import lark
import numpy as np
from celpy.celparser import CELParseError, CELParser

# Per-request values a condition can see: {"stage": {"tensor": array}} plus pipeline
# inputs under the key "" ({"": {"pixels": array}}). A skipped stage is absent.
Values = Mapping[str, Mapping[str, np.ndarray]]
Evaluator = Callable[[Values], Any]
Kind = Literal["bool", "num"]

_FUNCTIONS: dict[str, Callable[[np.ndarray], Any]] = {
    "max": np.max,
    "min": np.min,
    "sum": np.sum,
    "mean": np.mean,
    "abs": np.abs,
    "any": np.any,
    "all": np.all,
}
_BOOL_FUNCTIONS = {"any", "all"}
_ORDER: dict[str, Callable[[Any, Any], Any]] = {
    "relation_lt": operator.lt,
    "relation_le": operator.le,
    "relation_gt": operator.gt,
    "relation_ge": operator.ge,
}
_EQUALITY: dict[str, Callable[[Any, Any], Any]] = {
    "relation_eq": operator.eq,
    "relation_ne": operator.ne,
}
_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "addition_add": operator.add,
    "addition_sub": operator.sub,
    "multiplication_mul": operator.mul,
    "multiplication_div": operator.truediv,
    "multiplication_mod": operator.mod,
}
# Python spellings a user may bring, and the CEL to write instead.
_NOT_CEL = [
    (re.compile(r"\band\b"), "use && instead of and"),
    (re.compile(r"\bor\b"), "use || instead of or"),
    (re.compile(r"\bnot\b"), "use ! instead of not"),
    (re.compile(r"\bif\b.*\belse\b"), "use cond ? a : b instead of a if cond else b"),
]
# Grammar rules that only wrap their single child: they add no level of depth.
_WRAPPERS = {
    "expr",
    "conditionalor",
    "conditionaland",
    "relation",
    "addition",
    "multiplication",
    "unary",
    "member",
    "primary",
    "paren_expr",
    "exprlist",
}

MAX_CHARS = 1024  # the same bound as the spec's `when` field (and the CRD's maxLength)
MAX_DEPTH = 32  # levels of syntax tree: `-(-(1))` is 4 (unary, unary, constant + root)
MAX_BRACKETS = 4 * MAX_DEPTH  # nested ( and [, which the parser itself walks recursively


class ConditionError(ValueError):
    """The expression cannot be parsed, uses something outside the grammar, is over a
    limit, or failed while being evaluated."""


class _Absent(Exception):
    """A value of a skipped stage was read outside has(): the condition is false."""


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
        except _Absent:
            return False
        except KeyError as exc:
            raise ConditionError(f"condition {self.text!r}: value {exc} is missing") from exc
        except FloatingPointError as exc:
            raise ConditionError(f"condition {self.text!r} failed: numpy: {exc}") from exc
        except ValueError as exc:
            raise ConditionError(
                f"condition {self.text!r} did not give one boolean ({exc}); reduce "
                "multi-element tensors with max(), min(), any() or all(), or index them"
            ) from exc
        except Exception as exc:
            raise ConditionError(
                f"condition {self.text!r} failed: {type(exc).__name__}: {exc}"
            ) from exc


_PARSER: CELParser | None = None


def parse_condition(text: str) -> Condition:
    """Parse `text` as CEL into a `Condition`, raising `ConditionError` with the reason."""
    global _PARSER  # noqa: PLW0603 - the Lark parser is built once, on first use
    if len(text) > MAX_CHARS:
        raise ConditionError(f"condition is {len(text)} characters long; the limit is {MAX_CHARS}")
    nesting = _bracket_nesting(text)
    if nesting > MAX_BRACKETS:
        raise ConditionError(
            f"condition {_short(text)}: too many nested parentheses ({nesting}); "
            f"the limit is {MAX_BRACKETS}"
        )
    if _PARSER is None:
        _PARSER = CELParser()
    try:
        tree = _PARSER.parse(text)
    except CELParseError as exc:
        for pattern, advice in _NOT_CEL:
            if pattern.search(text):
                raise ConditionError(f"condition {_short(text)} is not CEL: {advice}") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise ConditionError(f"cannot parse condition {_short(text)} as CEL: {first}") from None
    except (RecursionError, MemoryError) as exc:
        raise ConditionError(
            f"cannot parse condition {_short(text)}: nested too deeply "
            f"({type(exc).__name__}); the limit is {MAX_DEPTH} levels"
        ) from None
    except Exception as exc:  # whatever else the parser raises is the user's error
        raise ConditionError(f"cannot parse condition {_short(text)}: {exc}") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise ConditionError(
            f"condition {_short(text)} is nested {depth} levels deep; the limit is {MAX_DEPTH}"
        )
    refs: set[tuple[str, str]] = set()
    fn, kind = _Compiler(text, refs).compile(tree)
    if kind != "bool":
        raise ConditionError(f"condition {_short(text)} is a number, not a boolean")
    return Condition(text=text, refs=frozenset(refs), _fn=fn)


def _short(text: str, limit: int = 80) -> str:
    """`text` quoted, cut to `limit` characters (hostile text can be long)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} chars)"


def _bracket_nesting(text: str) -> int:
    """The deepest nesting of ( and [ in `text`."""
    deepest = level = 0
    for char in text:
        if char in "([":
            level += 1
            deepest = max(deepest, level)
        elif char in ")]":
            level -= 1
    return deepest


def _depth(tree: lark.Tree[Any]) -> int:
    """Levels of meaning in the parse tree (single-child wrappers don't count), walked
    without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        for child in node.children:
            if isinstance(child, lark.Tree):
                wrapper = child.data in _WRAPPERS and len(child.children) == 1
                todo.append((child, level if wrapper else level + 1))
    return deepest


def _stage_value(stage: str, tensor: str) -> Evaluator:
    def read(v: Values) -> Any:
        if stage not in v:
            raise _Absent
        return v[stage][tensor]

    return read


def _truth(value: Any) -> bool:
    return bool(np.asarray(value).item())


@dataclass(slots=True)
class _Compiler:
    """Compiles a checked CEL parse tree into a closure, with its kind (bool or num)."""

    text: str
    refs: set[tuple[str, str]]

    def fail(self, what: str) -> ConditionError:
        return ConditionError(
            f"condition {_short(self.text)}: {what}; use comparisons, && || !, arithmetic, "
            f"stage.tensor references, indexing, has(), size() and {', '.join(_FUNCTIONS)}()"
        )

    def compile(self, node: lark.Tree[Any]) -> tuple[Evaluator, Kind]:  # noqa: C901, PLR0911, PLR0912 - one branch per grammar rule
        node = _unwrap(node)
        rule, kids = node.data, node.children
        if rule == "expr":
            raise self.fail("the ?: operator is not supported")
        if rule in ("conditionalor", "conditionaland"):
            left, right = self.boolean(kids[0]), self.boolean(kids[1])
            if rule == "conditionalor":
                return (lambda v: _truth(left(v)) or _truth(right(v))), "bool"
            return (lambda v: _truth(left(v)) and _truth(right(v))), "bool"
        if rule == "relation":
            op_node, rhs_node = kids
            op_name = op_node.data
            (lhs_node,) = op_node.children
            lhs, lhs_kind = self.compile(lhs_node)
            rhs, rhs_kind = self.compile(rhs_node)
            if op_name in _EQUALITY:
                if lhs_kind != rhs_kind:
                    raise self.fail(f"== and != compare values of one type, not {lhs_kind}")
                cmp = _EQUALITY[op_name]
            elif op_name in _ORDER:
                if "bool" in (lhs_kind, rhs_kind):
                    raise self.fail("< <= > >= compare numbers (CEL does not chain them)")
                cmp = _ORDER[op_name]
            else:
                raise self.fail("'in' is not supported")
            return (lambda v: cmp(lhs(v), rhs(v))), "bool"
        if rule in ("addition", "multiplication"):
            op_node, rhs_node = kids
            (lhs_node,) = op_node.children
            arith = _ARITH[op_node.data]
            lhs, rhs = self.number(lhs_node), self.number(rhs_node)
            return (lambda v: arith(lhs(v), rhs(v))), "num"
        if rule == "unary":
            op_node, operand = kids
            if op_node.data == "unary_not":
                inner = self.boolean(operand)
                return (lambda v: not _truth(inner(v))), "bool"
            number = self.number(operand)
            return (lambda v: -number(v)), "num"
        if rule == "literal":
            return self.literal(cast(lark.Token, kids[0]))
        if rule == "ident":
            name = str(kids[0])
            self.refs.add(("", name))
            return (lambda v: v[""][name]), "num"
        if rule == "member_dot":
            stage, tensor = self.stage_tensor(node)
            self.refs.add((stage, tensor))
            return _stage_value(stage, tensor), "num"
        if rule == "member_index":
            base, index = self.number(kids[0]), self.number(kids[1])
            return (lambda v: base(v)[int(index(v))]), "num"
        if rule == "ident_arg":
            return self.call(str(kids[0]), kids[1] if len(kids) > 1 else None)
        raise self.fail(f"{rule.replace('_', ' ')} is not supported")

    def boolean(self, node: lark.Tree[Any]) -> Evaluator:
        fn, kind = self.compile(node)
        if kind != "bool":
            raise self.fail("&& || ! take booleans, not numbers")
        return fn

    def number(self, node: lark.Tree[Any]) -> Evaluator:
        fn, kind = self.compile(node)
        if kind != "num":
            raise self.fail("arithmetic, indexing and functions take numbers, not booleans")
        return fn

    def literal(self, token: lark.Token) -> tuple[Evaluator, Kind]:
        if token.type == "BOOL_LIT":
            flag = token.value == "true"
            return (lambda _v: flag), "bool"
        if token.type in ("INT_LIT", "UINT_LIT", "FLOAT_LIT"):
            raw = token.value.rstrip("uU")
            value = float(raw) if token.type == "FLOAT_LIT" else int(raw, 0)
            return (lambda _v: value), "num"
        raise self.fail(f"{token.type.removesuffix('_LIT').lower()} literals are not supported")

    def stage_tensor(self, node: lark.Tree[Any]) -> tuple[str, str]:
        base, attr = node.children
        base = _unwrap(base)
        if base.data == "ident":
            return str(base.children[0]), str(attr)
        raise self.fail("references are stage.tensor")

    def call(self, name: str, args: lark.Tree[Any] | None) -> tuple[Evaluator, Kind]:
        items = list(args.children) if args is not None else []
        if len(items) != 1:
            raise self.fail(f"{name}() takes one argument")
        if name == "has":
            target = _unwrap(items[0])
            if not (isinstance(target, lark.Tree) and target.data == "member_dot"):
                raise self.fail("has() takes stage.tensor")
            stage, tensor = self.stage_tensor(target)
            self.refs.add((stage, tensor))
            return (lambda v: stage in v and tensor in v[stage]), "bool"
        arg = self.number(items[0])
        if name == "size":
            return (lambda v: len(arg(v))), "num"
        if name in _FUNCTIONS:
            reduce = _FUNCTIONS[name]
            kind: Kind = "bool" if name in _BOOL_FUNCTIONS else "num"
            return (lambda v: reduce(arg(v))), kind
        raise self.fail(f"{name}() is not a known function")


def _unwrap(node: lark.Tree[Any]) -> lark.Tree[Any]:
    while node.data in _WRAPPERS and len(node.children) == 1:
        child = node.children[0]
        if not isinstance(child, lark.Tree):
            break
        node = child
    return node
