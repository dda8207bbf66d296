"""spectr_repro: a reference harness for SpecTr-GBV (arXiv 2604.25925) and its baselines.

Data flows one way: conf/ -> runner -> models + data -> engine -> verify -> records -> analysis.
See docs/development.md ("Layout") for the map.
"""

__version__ = "0.1.0"
