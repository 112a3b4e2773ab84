"""Conditions are parsed to a whitelist and evaluated without eval()."""

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
        ("not fast.confidence < 0.85", False),
        ("0.1 < fast.confidence < 0.9", True),
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
    ],
)
def test_rejects_outside_grammar(text: str) -> None:
    with pytest.raises(ConditionError):
        parse_condition(text)


def test_ambiguous_array_comparison_is_a_clear_error() -> None:
    cond = parse_condition("a.x < 1")
    with pytest.raises(ConditionError, match="reduce"):
        cond(values(a={"x": [0.1, 0.2]}))
