"""``python -m spectr_repro check``: does the harness work on this machine, and what will a run cost here?

    python -m spectr_repro check model_pair=tiny_random                       # seconds, CI
    python -m spectr_repro check                                              # the Qwen pair (after make models)
    python -m spectr_repro check experiment=cpu_quick check.quick=true        # what `make reproduce` runs
    python -m spectr_repro check hardware=cuda model_pair=deepseek_33b_1.3b check.random_weights=true

Keys: those of ``run`` (hardware, model_pair, K, L, experiment, ...; composed by the runner's Hydra config)
plus ``check.*`` (conf/config.yaml): ``random_weights`` (build the pair from its configs, no download),
``quick`` (fewer shapes: the smallest and largest L and prefill chunk), ``output`` (folder of check.json),
``replay_summary`` (a replay's CSV: predict the fastest lossless configuration). With an experiment, the
shapes calibrated are those of its grid (every K and L, its prompt batch size).

It checks, in order:

1. environment: device, free memory, bfloat16/float16, whether torch.compile works, the sandbox mode;
2. memory: whether the pair fits at the largest K, L and batch without offload, before anything loads;
3. correctness on the device, on the pair's draft model in float32 as the target (its own dtype as the
   draft; the tiny pair when weights are absent): greedy AR and sd tokens equal ``model.generate``'s,
   batched decoding gives batch 1's tokens at T=0, every registered rule runs one block;
4. calibration: seconds per forward of target and draft at the run's shapes, written to this machine's
   calibration file (``spectr_repro.cost.calibration``), which ``plan`` then uses;
5. timing sanity: the section times of one prompt sum to its synchronised wall time within 5 %.

One table on stdout, ``<check.output>/check.json`` beside it; exit 0 only when every correctness and
timing item passed (1 when one failed or the pair cannot be loaded, 2 for bad input).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from spectr_repro import tracking
from spectr_repro.check.checker import Item
from spectr_repro.check.run import run_check
from spectr_repro.cost import describe_best
from spectr_repro.errors import ResourceError, UsageError
from spectr_repro.files import atomic_write_text
from spectr_repro.launch.config import print_help_if_asked


def format_table(items: Sequence[Item]) -> str:
    frame = pd.DataFrame([{"section": i.section, "item": i.name, "result": i.status.upper(),
                           "detail": i.detail, "s": f"{i.seconds:.1f}"} for i in items])
    return frame.to_markdown(index=False)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if print_help_if_asked(argv, __doc__):
        return 0
    try:
        code, result = run_check(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ValueError, ResourceError) as error:  # a pair config that names no usable architecture, no dataset
        print(f"error: {error}", file=sys.stderr)
        return 1
    items = [Item(**item) for item in result["items"]]
    print(format_table(items))
    if result.get("prediction"):
        print("\n" + describe_best(result["prediction"]["best"]))
    output = Path(result["output"]).expanduser() / "check.json"
    atomic_write_text(output, json.dumps(result, indent=2, default=str) + "\n")
    verdict = "every correctness item passed" if code == 0 else "SOME CORRECTNESS ITEM FAILED (see the table)"
    print(f"\n{verdict}; {result['wall_time_s']:.0f} s; wrote {output}")

    tracking.log_command("check", tracking.logger_from_argv(argv), output.parent, results=result,
                         config={k: result.get(k) for k in ("model_pair", "hardware", "random_weights", "quick",
                                                            "shapes", "environment")})
    return code


__all__ = ["format_table", "main"]
