"""sloline: serve multi-model prediction pipelines under a tail-latency SLO at the lowest cost."""

__version__ = "0.1.0"
