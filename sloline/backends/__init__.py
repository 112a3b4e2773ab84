"""Actuators that run stage replicas: `local` (processes) and, later, `kubernetes`."""

from sloline.backends.base import Backend, ReplicaStatus

__all__ = ["Backend", "ReplicaStatus"]
