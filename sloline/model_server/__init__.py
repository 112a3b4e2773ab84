"""The worker process (`sloline worker`): serves one stage's model to the router."""
