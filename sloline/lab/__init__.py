"""The research lab: closed-loop simulation, baselines, oracle and trace families.

Nothing in the product imports this package (``make lint`` checks it); the lab
imports the product to measure it.
"""
