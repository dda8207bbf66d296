"""The ``run`` and ``sweep`` commands: ``python -m spectr_repro run ...`` (one cell), ``sweep ...`` (a grid).

The command line is :mod:`spectr_repro.runner.cli`; decoding one cell (decode -> records -> summary)
:mod:`~spectr_repro.runner.cell`; a session of cells (claims, resume, AR bookkeeping, writing, W&B)
:mod:`~spectr_repro.runner.execute`; records :mod:`~spectr_repro.runner.store`; the cells' plan
:mod:`~spectr_repro.runner.plan` (the ``plan`` command, which adds the replays', is :mod:`spectr_repro.plan`).
What every command that runs models shares (configs and their checks at the door, the model-pair cache, the memory
fit, budgets and signals, stop strings, claims) is the library :mod:`spectr_repro.launch`, below every command.
"""
