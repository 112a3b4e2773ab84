"""Measurement tools: the profiler, the probe and the calibration workflow.

They drive the embedded server, so they sit above it.
"""
