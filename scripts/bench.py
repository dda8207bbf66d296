"""Kept for old habits: the benchmarks live in the package (``python -m spectr_repro bench [--quick]``)."""

import sys

from spectr_repro.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
