"""Analysis of results folders: load records, Table 1 beside the paper (with intervals over prompts),
paired method comparisons (``stats``), ablation figures, REPORT.md.

Reads files only (``cells/<cell_id>/summary.json`` and ``records.jsonl``), never the engine or
models, so a report can be rebuilt anywhere from a results folder.

    from spectr_repro.analysis import load_results, build_table1, make_figures, load_paper_numbers
    python -m spectr_repro report results/cpu_quick
"""

from spectr_repro.analysis.figures import (
    ablation_data,
    acceptance_data,
    make_figures,
    plot_ablation,
    plot_acceptance,
)
from spectr_repro.analysis.load import Results, load_results
from spectr_repro.analysis.tables import (
    Setting,
    build_table1,
    main_setting,
    method_differences,
    table1,
    table1_intervals,
)
from spectr_repro.paper import load_paper_numbers

__all__ = [
    "Results",
    "Setting",
    "ablation_data",
    "acceptance_data",
    "build_table1",
    "load_paper_numbers",
    "load_results",
    "main_setting",
    "make_figures",
    "method_differences",
    "plot_ablation",
    "plot_acceptance",
    "table1",
    "table1_intervals",
]
