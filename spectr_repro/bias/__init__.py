"""Bias of a verification rule on real models: the law of one iteration's first emitted token against p.

``python -m spectr_repro bias`` (``spectr_repro.bias.driver``, the command) measures each context with
``spectr_repro.bias.measure`` and keeps its records and table with ``spectr_repro.bias.records``; the estimators
and the test are pure tensors in ``spectr_repro.bias.estimators``.
"""
