"""The tuner: traffic envelopes and InferLine's reactive scaling policy (InferLine §5).

Pure core: :mod:`sloline.common.envelope` (envelopes of traces and of live streams) and
:mod:`sloline.tuner.policy` (Algorithms 3 and 4 as plain functions). I/O lives in
:mod:`sloline.tuner.sources` (metric sources, actuators, the async loop shell).
"""
