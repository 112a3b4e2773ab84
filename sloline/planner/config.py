"""A pipeline configuration: the three control parameters per stage (InferLine §4.3).

Kept apart from the estimator so that plain-data consumers (plans, the tuner) can use it
without importing the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Config", "StageConfig"]


@dataclass(frozen=True, slots=True)
class StageConfig:
    """One stage's configuration: hardware class, maximum batch size, replicas."""

    hardware: str
    max_batch: int
    replicas: int

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.replicas < 1:
            raise ValueError(
                f"max_batch and replicas must be >= 1, got {self.max_batch}, {self.replicas}"
            )


Config = tuple[StageConfig, ...]  # one entry per stage, in topology order
