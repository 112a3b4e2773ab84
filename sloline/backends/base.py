"""The backend protocol: how the planner's and tuner's decisions reach real replicas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    desired: int
    running: int  # processes / pods that exist (starting or serving)
    restarts: int = 0
    last_error: str = ""


class Backend(Protocol):
    """Start, scale, observe and stop the replicas of a pipeline's stages."""

    async def start(self) -> None: ...

    def scale(self, stage: str, replicas: int) -> None:
        """Set the desired replica count; the backend converges to it asynchronously."""
        ...

    def status(self) -> dict[str, ReplicaStatus]: ...

    async def stop(self) -> None:
        """Stop every replica gracefully (SIGTERM, then kill after the grace period)."""
        ...
