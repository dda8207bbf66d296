"""Decoding engine: AR and speculative decoding on HuggingFace causal LMs.

    from spectr_repro.engine import generate
    out = generate(target, draft, input_ids, method="spectr_gbv", K=3, L=12, temperature=0.4,
                   max_new_tokens=128, seed=0, eos_token_ids=(eos,))
    out.new_tokens, out.target_calls, out.block_efficiency, out.stats

Modules: ``loop`` (the iteration), ``drafting`` (K drafts as K batch rows), ``cache`` (crop and
row selection on transformers' Cache API), ``forward`` (forwards, shared vocabulary), ``timing``.
"""

from spectr_repro.engine.forward import shared_vocab_size
from spectr_repro.engine.loop import TIME_SECTIONS, GenerationOutput, acceptance_by_position, generate
from spectr_repro.engine.timing import SectionTimer

__all__ = ["TIME_SECTIONS", "GenerationOutput", "SectionTimer", "acceptance_by_position", "generate",
           "shared_vocab_size"]
