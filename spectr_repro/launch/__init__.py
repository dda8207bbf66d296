"""What every command that runs models shares, below the commands (``run``/``sweep``, ``replay``, ``bias``,
``check``, ``bench``, ``plan``, ``excursions``, ``spotcheck``): composing a config and checking it at the door
(:mod:`~spectr_repro.launch.config`: one message, exit 2, before any model loads), whether a run fits in memory
(:mod:`~spectr_repro.launch.fit`), the model pairs loaded once per process (:mod:`~spectr_repro.launch.pairs`), budgets
and signals (:mod:`~spectr_repro.launch.signals`), stop strings (:mod:`~spectr_repro.launch.stops`) and the claims of
runners on units of work (:mod:`~spectr_repro.launch.claims`). No command's module is imported from here.
"""
