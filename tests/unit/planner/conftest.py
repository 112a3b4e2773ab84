"""The estimator imports the whole-pipeline kernel on first use; importing it here loads
it from numba's cache (or compiles it, 13-15 s, on a fresh checkout) at collection, so no
test pays that inside its own time."""

import sloline.planner.shared  # noqa: F401
