"""Bias of a verification rule on real models: the law of one iteration's first emitted token against p.

``python -m spectr_repro bias`` (``spectr_repro.bias.driver``); the estimators and the test are pure
tensors in ``spectr_repro.bias.estimators``.
"""
