"""The replay proper: prompts decoded by the reference rule, every rule evaluated on every block on the way.

Per iteration and prompt still running:
    1. the engine drafts a K_max x L_max block and the target scores it (``engine.drafted_blocks``; one prompt goes
       through the one-prompt loop, several through the batched one, each with its own seed);
    2. every (rule, K, L) of the grid is evaluated on that block (``replay.core.block_estimates``: exact values,
       or draws from the replay's own generator for the sampled rules);
    3. the reference rule, on the block's first reference_K x reference_L, picks what the trajectory emits (it is
       lossless, so the next blocks are the contexts a lossless decoder meets);
    4. the block's record: its values, the reference's tokens, where in the output it sits, the rules' seconds.

Blocks are always drafted whole (L_max): a replay value is never truncated; the end of a trajectory (max_new_tokens,
EOS, a stop string) only decides how many blocks a prompt contributes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spectr_repro.engine import drafted_blocks
from spectr_repro.replay.core import block_estimates
from spectr_repro.replay.settings import GroupSettings
from spectr_repro.verify import get_verifier

PromptReplay = tuple[list[dict[str, Any]], dict[str, Any]]  # (block rows, prompt summary) of one prompt


def replay_generator(device, seed: int) -> torch.Generator:
    """The replay's own draws for the prompt whose engine seed is ``seed`` (the same at every batch size)."""
    return torch.Generator(device=device).manual_seed(seed * 7919 + 17)


@torch.inference_mode()  # the rules too: the engine's tensors are inference tensors, and nothing here is trained
def replay_prompts(pair, prompts: Sequence[Sequence[int]], group: GroupSettings, seeds: Sequence[int],
                   should_stops: Sequence[Callable[[list[int]], bool] | None]) -> list[PromptReplay]:
    """(block rows, summary) of each prompt's trajectory, the prompts decoded together (prompt b from engine seed
    ``seeds[b]``, its rules' draws from ``replay_generator(seeds[b])``), so that a prompt's blocks do not depend on
    its batch mates."""
    s = group.settings
    reference = get_verifier(s.reference, check_inputs=False)
    K, L = s.reference_K, s.reference_L
    rule_draws = [replay_generator(pair.device, seed) for seed in seeds]
    records: list[list[dict[str, Any]]] = [[] for _ in prompts]
    start = time.perf_counter()
    decoding = drafted_blocks(pair.target, pair.draft, prompts, K=s.K_max, L=s.L_max, temperature=group.temperature,
                              max_new_tokens=group.max_new_tokens, seeds=seeds, eos_token_ids=pair.eos_token_ids,
                              should_stop=should_stops, vocab_size=pair.vocab_size,
                              prefill_chunk=group.prefill_chunk)
    for step in decoding:  # 1. a drafted, scored block for each prompt still running
        for i, block in enumerate(step.blocks):
            started = time.perf_counter()  # the estimates end in host reads: the clock sees their device work too
            # 2. every rule, K and L of the grid on this block
            estimates = block_estimates(block.draft_tokens, block.draft_probs, block.target_probs, s.methods,
                                        s.K_values, s.L_values, s.draws, rule_draws[block.prompt],
                                        row_groups=s.row_groups, sampled=s.sampled, support_mass=s.support_mass)
            # 3. the reference rule continues the trajectory (with the prompt's engine generator, as generate would)
            result = reference(block.draft_tokens[:K, :L], block.draft_probs[:K, :L], block.target_probs[:K, :L + 1],
                               generator=block.generator, state=block.state)
            step.results[i] = result
            # 4. the block's record
            records[block.prompt].append({
                "iteration": len(records[block.prompt]),
                "output_position": block.output_position,  # tokens generated before it (0: right after the prompt)
                "reference_tokens": int(result.num_accepted) + 1,
                "values": [[e.method, e.K, e.L, e.tokens, e.estimator, e.draws] for e in estimates],
                "rule_seconds": time.perf_counter() - started,  # the grid and the reference (plan: replay cost)
            })
    seconds = time.perf_counter() - start
    return [(blocks, _summary(out, len(blocks), seconds, len(prompts))) for blocks, out in zip(records,
                                                                                                decoding.outputs)]


def _summary(out, blocks: int, seconds: float, batch_prompts: int) -> dict[str, Any]:
    summary = {"new_tokens": len(out.new_tokens), "target_calls": out.target_calls, "blocks": blocks,
               "trajectory_block_efficiency": out.block_efficiency}
    if batch_prompts == 1:
        return {**summary, "seconds": seconds}
    # A batch has one wall time: each prompt is charged an equal share of it, so that the prompts' seconds still
    # add up to the replay's time (prompts per hour); batch_seconds keeps the whole.
    return {**summary, "seconds": seconds / batch_prompts, "batch_prompts": batch_prompts, "batch_seconds": seconds}


__all__ = ["PromptReplay", "replay_generator", "replay_prompts"]
