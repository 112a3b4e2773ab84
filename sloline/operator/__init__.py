"""The Kubernetes operator (`sloline operator`, kopf): validate, profile with Jobs, plan,
render and apply, report status, and tune replicas from Prometheus (docs/operator.md).

Nothing is re-exported: `handlers` imports kopf, which only the `k8s` extra installs.
"""
