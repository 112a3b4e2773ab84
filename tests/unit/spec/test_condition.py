"""Conditions are CEL, parsed by the CEL parser and compiled to closures (no eval())."""

from __future__ import annotations

import numpy as np
import pytest

from sloline.spec import ConditionError, parse_condition


def values(**stages: dict[str, list[float]]) -> dict[str, dict[str, np.ndarray]]:
    return {s: {k: np.asarray(v) for k, v in t.items()} for s, t in stages.items()}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fast.confidence < 0.85", True),
        ("fast.confidence >= 0.85", False),
        ("max(fast.probs) < 0.9 && fast.confidence < 1", True),
        ("max(fast.probs) > 0.9 || !(fast.confidence > 0.5)", True),
        ("!(fast.confidence < 0.85)", False),
        ("0.1 < fast.confidence && fast.confidence < 0.9", True),
        ("fast.probs[0] < 0.2 && fast.probs[2] == 0.5", True),
        ("fast.probs[1] > 0.9 || fast.probs[2] > 0.9", False),
        ("size(fast.probs) == 3 && fast.probs[size(fast.probs) - 1] > 0.4", True),
        ("has(fast.confidence) && !has(slow.score)", True),
        ("has(slow.score) && slow.score[0] > 0", False),
        ("slow.score[0] > 0 || fast.confidence < 1", False),
        ("7 % 4 == 3 && min(fast.probs) * 10 == 1", True),
        ("fast.confidence * 2 - 1 < 0", True),
        ("true", True),
    ],
)
def test_evaluates(text: str, expected: bool) -> None:
    cond = parse_condition(text)
    v = values(fast={"confidence": [0.4], "probs": [0.1, 0.4, 0.5]})
    assert cond(v) is expected


def test_refs() -> None:
    assert parse_condition("a.x < b.y && z > 1").refs == {("a", "x"), ("b", "y"), ("", "z")}


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "a.x.y < 1",
        "open('f')",
        "[1][0] < 2",
        "a.x if 1 else 2",
        "lambda: 1",
        "a.x in (1, 2)",
        "max(a.x, 2) < 1",
        "a.x in [1, 2]",
        "a.x < 1 ? true : false",
        "'s' == a.x",
        "has(a)",
        "1 + 1",
        "a.x < 1 && 2",
        "0.1 < a.x < 0.9",
        "a.x + (a.y < 1) > 0",
    ],
)
def test_rejects_outside_grammar(text: str) -> None:
    with pytest.raises(ConditionError):
        parse_condition(text)


def test_ambiguous_array_comparison_is_a_clear_error() -> None:
    cond = parse_condition("a.x < 1")
    with pytest.raises(ConditionError, match="reduce"):
        cond(values(a={"x": [0.1, 0.2]}))


@pytest.mark.parametrize(
    ("text", "advice"),
    [
        ("a.x < 1 and a.y > 2", "use && instead of and"),
        ("a.x < 1 or a.y > 2", "use || instead of or"),
        ("not a.x < 1", "use ! instead of not"),
    ],
)
def test_python_syntax_is_a_one_line_cel_error(text: str, advice: str) -> None:
    with pytest.raises(ConditionError, match=advice) as info:
        parse_condition(text)
    assert "\n" not in str(info.value)


def test_a_skipped_stage_is_absent_not_an_error() -> None:
    cond = parse_condition("!has(slow.score) || slow.score[0] > 0.5")
    assert cond.refs == {("slow", "score")}
    assert cond(values(fast={"c": [1.0]})) is True
    assert cond(values(slow={"score": [0.7]})) is True
    assert cond(values(slow={"score": [0.2]})) is False


def test_index_out_of_range_is_a_condition_error() -> None:
    with pytest.raises(ConditionError, match="IndexError"):
        parse_condition("a.x[5] < 1")(values(a={"x": [0.1]}))
