"""Names the engine tests share (fixtures stay in conftest.py, which pytest loads; helpers are imported from here)."""

from __future__ import annotations

from spectr_repro.verify import VERIFIERS, Verifier, get_verifier

VOCAB = 259  # the tiny pair's tokenizer (conftest.tiny): its heads are cut to it
SPECULATIVE = tuple(VERIFIERS)  # every rule of the registry
ALL_METHODS = ("ar", *SPECULATIVE)


def draft_count(method: str, K: int = 3) -> int:
    """K for a method: single-draft rules take one draft."""
    return 1 if method == "ar" or VERIFIERS[method].single_draft else K


class RecordingRule(Verifier):
    """SpecTr, recording each block it verifies on the instance (as the replay's reference records its blocks);
    ``lossless`` decides, as for any instance, whether the engine shortens a last block."""

    name = "recording_spectr"

    def __init__(self, lossless: bool) -> None:
        super().__init__(check_inputs=True)
        self.lossless = lossless
        self.rule = get_verifier("spectr", check_inputs=True)
        self.blocks: list[tuple[list[list[int]], int]] = []  # (draft tokens, tokens emitted) per call

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        result = self.rule(draft_tokens, draft_probs, target_probs, generator=generator, state=state)
        self.blocks.append((draft_tokens.tolist(), int(result.num_accepted) + 1))
        return result
