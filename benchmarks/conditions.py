"""Per-request cost of a `when` condition: sloline's compiled CEL against cel-python's
own evaluator, on the values a cascade's second stage sees (a [10] probability vector).

    python benchmarks/conditions.py [--n 20000]

Prints microseconds per evaluation for each expression and evaluator.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import celpy
import numpy as np

from sloline.spec import parse_condition

EXPRESSIONS = [
    "max(fast.probabilities) < 0.9",
    "fast.probabilities[0] < 0.9 && fast.probabilities[1] < 0.9",
    "has(fast.probabilities) && !(fast.probabilities[3] * 2 > 1.5)",
]


def per_call_us(fn: Callable[[], object], n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="evaluations per measurement")
    args = parser.parse_args()
    probabilities = np.linspace(0.05, 0.5, 10, dtype=np.float32)
    values = {"fast": {"probabilities": probabilities}}
    env = celpy.Environment()
    functions = {"max": lambda x: celpy.celtypes.DoubleType(max(x))}
    activation = {"fast": celpy.json_to_cel({"probabilities": probabilities.tolist()})}
    print(f"{'expression':<64} {'sloline us':>10} {'cel-python us':>14}")
    for text in EXPRESSIONS:
        condition = parse_condition(text)
        program = env.program(env.compile(text), functions=functions)
        ours = per_call_us(lambda c=condition: c(values), args.n)
        theirs = per_call_us(lambda p=program: p.evaluate(activation), max(args.n // 10, 1))
        print(f"{text:<64} {ours:>10.2f} {theirs:>14.2f}")


if __name__ == "__main__":
    main()
