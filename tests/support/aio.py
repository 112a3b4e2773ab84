"""Waiting in async tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll `predicate` on the running loop until it holds; fail naming `what` after
    `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
