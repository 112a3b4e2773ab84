"""A held-out evaluation set: random pipelines and production-shaped traces that the
planner and the tuner are not developed against.

:mod:`~sloline.lab.heldout.pipelines` draws planning problems (GPU-like and CPU stages,
chains and fan-out/fan-in DAGs, conditional stages, a cloud-priced hardware catalog);
:mod:`~sloline.lab.heldout.shapes` draws traces in the published shapes of production
traffic. Both are deterministic per seed. A run fixes its seeds; each release draws fresh
ones with :func:`fresh_seed` and records them with its results, so the evaluation set
keeps changing under the code it judges.
"""

from __future__ import annotations

import secrets

__all__ = ["fresh_seed"]


def fresh_seed() -> int:
    """A new random seed (63 bits, from the OS). Use a new seed each release; record it in
    the result, so the run can be repeated."""
    return secrets.randbits(63)
