"""The experiment runner: ``python -m spectr_repro run ...`` (one cell), ``sweep ...`` (a grid), ``plan ...``.

The command line is :mod:`spectr_repro.runner.cli`; configs and their checks :mod:`~spectr_repro.runner.config`;
cells' plans and their execution :mod:`~spectr_repro.runner.execute`; claims :mod:`~spectr_repro.runner.claims`;
records :mod:`~spectr_repro.runner.store`; a sweep's cost :mod:`~spectr_repro.runner.plan`.
"""
