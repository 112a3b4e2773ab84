"""The estimator imports the routed pipeline's kernel on first use; importing it here loads
it from numba's cache (or compiles it, 13-15 s, on a fresh checkout) at collection, so no
test pays that inside its own time."""

import sloline.planner.routed  # noqa: F401
