"""Decoding engine: AR and speculative decoding on HuggingFace causal LMs.

    from spectr_repro.engine import generate
    out = generate(target, draft, input_ids, method="spectr_gbv", K=3, L=12, temperature=0.4,
                   max_new_tokens=128, seed=0, eos_token_ids=(eos,))
    out.new_tokens, out.target_calls, out.block_efficiency, out.stats

    out = generate_batch(target, draft, [ids_0, ids_1, ...], method="sbv", K=3, L=6, temperature=0.4,
                         max_new_tokens=64, seeds=[0, 1, ...])   # B prompts at once, batch-1 law per prompt
    out.outputs[b].new_tokens, out.outputs[b].block_efficiency

    for step in drafted_blocks(target, draft, [ids_0, ...], K=7, L=24, ...):   # the rule is the caller's
        step.results[i] = rule(...)            # one per step.blocks[i]   (the replay; see engine.blocks)

Modules: ``loop`` (the iteration), ``common`` (argument checks and helpers loop and batched share),
``drafting`` (K drafts as K batch rows), ``cache`` (crop and row selection on transformers' Cache API),
``forward`` (forwards, shared vocabulary), ``timing``, ``batched`` and ``batch_cache`` (B prompts at once,
for block-efficiency runs), ``blocks`` (the decoding a step at a time, for a caller that verifies the blocks).
"""

from spectr_repro.engine.batched import BatchOutput, generate_batch
from spectr_repro.engine.blocks import drafted_blocks
from spectr_repro.engine.common import BlockStep, Decoding, DraftedBlock
from spectr_repro.engine.forward import shared_vocab_size
from spectr_repro.engine.loop import TIME_SECTIONS, GenerationOutput, acceptance_by_position, generate
from spectr_repro.engine.timing import SectionTimer

__all__ = ["TIME_SECTIONS", "BatchOutput", "BlockStep", "Decoding", "DraftedBlock", "GenerationOutput", "SectionTimer",
           "acceptance_by_position", "drafted_blocks", "generate", "generate_batch", "shared_vocab_size"]
