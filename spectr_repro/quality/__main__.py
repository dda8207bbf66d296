"""``python -m spectr_repro.quality RESULTS_DIR`` (also ``python -m spectr_repro quality``)."""

import sys

from spectr_repro.quality.cli import main

sys.exit(main())
