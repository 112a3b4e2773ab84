"""The planner: profiles, planning traces, the Estimator and the greedy Planner (InferLine §4).

- :mod:`~sloline.planner.profile` — batch-latency profiles per (stage, hardware), scale
  factors, hop overhead, visit matrix (what the profiler produces, §4.1);
- :mod:`~sloline.common.trace` — planning traces: gamma arrivals or recorded timestamps;
- :mod:`~sloline.planner.estimator` — the discrete-event simulation of the router (§4.2),
  on the event simulation of :mod:`~sloline.planner.sim`;
- :mod:`~sloline.planner.planner` — Algorithms 1 and 2 (§4.3) and :func:`plan`;
- :mod:`~sloline.planner.describe` — a configuration packaged as a plan, its headroom;
- :mod:`~sloline.lab.optimum` — branch and bound, to measure the greedy gap;
- :mod:`~sloline.lab.cg` — CG-Mean and CG-Peak (§6);
- :mod:`~sloline.planner.plan` — the plan as data, for the CLI, the operator and the tuner.

Nothing is re-exported here: importing this package must stay cheap for the light data
modules (``plan``, ``profile``), while the estimator loads numba.
"""
