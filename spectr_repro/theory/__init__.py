"""Theory and audit on toy models: exact per-iteration laws, the validity check, the LP limit of any
valid rule, the paper's bound, whole-generation efficiency of GBV with its carry-over, and the
losslessness audit of every registered rule.

    python -m spectr_repro theory    # results/theory/THEORY.md, theory.csv, theory.png
    python -m spectr_repro audit     # results/audit/AUDIT.md, audit.json
    python -m spectr_repro theory --gap --cache gap.json   # GAP.md, gap.csv (the broad toy set)

Modules: exact (M(z) of a rule), validity (R >= 0, R = 0 at length L+1), lp (the physical limit: the draft-set LP
and the node LP), structure (the limit of depth-by-depth selections), gap (each rule's share of the SpecTr -> LP
gap on a broad toy set), bounds (paper's bound, GBV's value), generation (tokens per target call over N tokens),
audit, peers; claims (the theory tables and the paper's claims checked on them), markdown (THEORY.md, AUDIT.md),
figure (theory.png), cli (the two commands).
"""
