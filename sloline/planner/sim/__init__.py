"""The event simulation of the router's dispatch rule, shared by every estimate of it.

- :mod:`~sloline.planner.sim.rule` — the rule itself, compiled: what a batch costs, when a
  stage is ready for a query;
- :mod:`~sloline.planner.sim.draws` — service times and overheads drawn from profiles;
- :mod:`~sloline.planner.sim.stage` — one stage's queue, by batches (the estimator's
  inner loop);
- :mod:`~sloline.planner.sim.pipeline` — the whole pipeline event by event, the router,
  hops, request paths and shared cores included (its state and handlers in
  :mod:`~sloline.planner.sim.state`, its queues in :mod:`~sloline.planner.sim.queues`).

numba's disk cache keys each compiled function by its own file only: after editing
``rule.py``, ``queues.py`` or ``state.py``, delete the ``*.nbi`` / ``*.nbc`` files under
``sloline/planner/sim/__pycache__`` (or touch the calling module) so that the kernels
that inline them recompile.

Nothing is re-exported here: the pipeline kernel takes seconds to compile where numba's
cache is empty, and only estimates of profiles with a serving overhead load it.
"""
