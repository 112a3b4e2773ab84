"""Shared vocabulary: tensor datatypes, traffic envelopes and arrival traces.

The bottom layer: it imports nothing else from sloline.
"""
