"""The data plane: front doors, the router and its per-stage queues, the worker channel."""
