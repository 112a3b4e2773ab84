"""Monitoring assets built from code: the Grafana dashboard (:mod:`.dashboard`).

The metrics themselves live in :mod:`sloline.serving.metrics`; the alert rules are the
Prometheus rule file ``helm/sloline/files/rules/sloline.rules.yaml``, tested with
``promtool test rules``.
"""
