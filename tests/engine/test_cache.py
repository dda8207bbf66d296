"""Cache bookkeeping: after the crop / row selection, the models see exactly the committed text."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from spectr_repro.engine import generate
from spectr_repro.engine.cache import crop_to, keep_row, repeat_rows
from spectr_repro.engine.forward import forward_logits
from spectr_repro.sampling import probs_from_logits
from spectr_repro.verify import Verifier, get_verifier

VOCAB = 259


def test_logits_after_repeat_select_and_crop_equal_a_fresh_forward(tiny):
    target, _, _ = tiny
    text = torch.tensor([256, *b"cache me if you can"])
    rows = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])
    next_tokens = torch.tensor([[40, 41]])
    with torch.inference_mode():
        cache = DynamicCache()
        forward_logits(target, text[None], cache, VOCAB)
        repeat_rows(cache, 3)
        forward_logits(target, rows, cache, VOCAB)
        keep_row(cache, 1, 3, text.device)
        crop_to(cache, text.numel() + 2)
        assert cache.get_seq_length() == text.numel() + 2
        cached = forward_logits(target, next_tokens, cache, VOCAB)[0]
        fresh = target(torch.cat([text, rows[1, :2], next_tokens[0]])[None]).logits[0, -2:, :VOCAB]
    torch.testing.assert_close(cached, fresh, atol=1e-5, rtol=1e-5)


def test_crop_to_rejects_growing_and_keeps_equal_length(tiny):
    target, _, _ = tiny
    with torch.inference_mode():
        cache = DynamicCache()
        forward_logits(target, torch.tensor([[256, 1, 2]]), cache, VOCAB)
    crop_to(cache, 3)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="cannot crop"):
        crop_to(cache, 4)


class Recorder(Verifier):
    """Runs a real rule and keeps every call's inputs and state (for checking the engine's plumbing)."""

    def __init__(self, name: str, **options) -> None:
        super().__init__(check_inputs=False)
        self.inner = get_verifier(name, **options)
        self.name, self.single_draft = self.inner.name, self.inner.single_draft
        self.calls: list[dict] = []

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        result = self.inner(draft_tokens, draft_probs, target_probs, generator=generator, state=state)
        self.calls.append(dict(draft_tokens=draft_tokens.clone(), draft_probs=draft_probs.clone(),
                               target_probs=target_probs.clone(), state_in=state, result=result))
        return result


@pytest.mark.parametrize("method, K", [("sd", 1), ("spectr", 3), ("rbv", 2)])
def test_every_iteration_scores_the_committed_text_plus_each_draft(tiny, prompt_ids, method, K):
    """p and q handed to the verifier equal fresh, cache-free forwards on committed text + draft row."""
    target, draft, _ = tiny
    L, temperature = 3, 0.7
    recorder = Recorder(method)
    prompt = prompt_ids[1]
    out = generate(target, draft, prompt, method=recorder, K=K, L=L, temperature=temperature,
                   max_new_tokens=30, seed=7, vocab_size=VOCAB)
    assert len(recorder.calls) == out.target_calls >= 5
    assert any(tau == L for tau in out.stats["accepted_lengths"][:-1])  # the two-pending-tokens path ran
    committed = prompt.tolist()
    for call in recorder.calls:
        context = torch.tensor(committed).expand(K, -1)
        rows = torch.cat([context, call["draft_tokens"]], dim=1)  # [K, n + L]
        with torch.inference_mode():
            p = probs_from_logits(target(rows).logits[:, -(L + 1):, :VOCAB], temperature)
            q = probs_from_logits(draft(rows).logits[:, -(L + 1):-1, :VOCAB], temperature)
        torch.testing.assert_close(call["target_probs"], p, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(call["draft_probs"], q, atol=2e-5, rtol=1e-4)
        committed += call["result"].tokens.tolist()
    assert committed[prompt.numel():][: len(out.new_tokens)] == out.new_tokens


def test_verifier_state_is_threaded_through_iterations(tiny, prompt_ids):
    """GBV's carry-over: each call receives exactly the state the previous call returned."""
    target, draft, _ = tiny
    recorder = Recorder("gbv", carry_over=True)
    generate(target, draft, prompt_ids[0], method=recorder, K=1, L=4, temperature=0.7, max_new_tokens=40,
             seed=1, vocab_size=VOCAB)
    states_in = [call["state_in"] for call in recorder.calls]
    states_out = [call["result"].state for call in recorder.calls]
    assert states_in[0] is None
    assert all(now is before for now, before in zip(states_in[1:], states_out[:-1]))
    assert any(state is not None for state in states_in)  # some iteration left a carry-over
