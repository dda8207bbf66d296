"""The experiment runner: ``python -m spectr_repro run ...`` (one cell), ``sweep ...`` (a grid), ``plan ...``.

The command line is :mod:`spectr_repro.runner.cli`; configs and their checks :mod:`~spectr_repro.runner.config`;
decoding one cell (decode -> records -> summary) :mod:`~spectr_repro.runner.cell`; a session of cells (claims,
resume, AR bookkeeping, writing, W&B) :mod:`~spectr_repro.runner.execute`; the model-pair cache every command
shares :mod:`~spectr_repro.runner.pairs`; stop strings :mod:`~spectr_repro.runner.stops`; claims
:mod:`~spectr_repro.runner.claims`; records :mod:`~spectr_repro.runner.store`; the cells' plan
:mod:`~spectr_repro.runner.plan` (the ``plan`` command, which adds the replays', is :mod:`spectr_repro.plan`).
"""
