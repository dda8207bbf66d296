"""Synthetic verification inputs of any size, shaped like what the engine hands a rule.

    draft_tokens, draft_probs, target_probs = synthetic_block(K=3, L=12, V=32_022, agreement="shared")

Rows that share a prefix carry the same conditionals (as K i.i.d. drafts from one draft model do), so
multi-draft rules see valid inputs. ``agreement`` picks how much the K drafts agree, which decides how
much work a multi-draft rule does:
- ``"independent"``: each row draws its own tokens (the rows usually part at the first token);
- ``"shared"``: every row carries row 0's tokens (K survivors at every depth: the worst case for rules
  that work per survivor, e.g. SpecTr's rho* solve at every depth and SBV's count posterior).
p and q come from peaked random logits (scale 4, temperature 0.7), q = p's logits plus Gaussian noise of
scale ``draft_noise`` (1: many rejections; 0.05: q close to p, so blocks are accepted deep into L).
"""

from __future__ import annotations

import torch

from spectr_repro.sampling import probs_from_logits, sample

AGREEMENTS = ("independent", "shared")


def synthetic_block(K: int, L: int, V: int, agreement: str = "independent", seed: int = 0,
                    device: str | torch.device = "cpu", temperature: float = 0.7, draft_noise: float = 1.0):
    """(draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V]), float32."""
    if agreement not in AGREEMENTS:
        raise ValueError(f"agreement must be one of {AGREEMENTS}, got {agreement!r}")
    generator = torch.Generator(device=device).manual_seed(seed)
    rows = 1 if agreement == "shared" else K
    base = torch.randn(rows, L + 1, V, generator=generator, device=device) * 4
    noise = torch.randn(rows, L, V, generator=generator, device=device) * draft_noise
    target_probs = probs_from_logits(base, temperature)
    draft_probs = probs_from_logits(base[:, :L] + noise, temperature)
    draft_tokens = sample(draft_probs, generator)
    if agreement == "shared":
        draft_tokens = draft_tokens.expand(K, L).contiguous()
        draft_probs = draft_probs.expand(K, L, V).contiguous()
        target_probs = target_probs.expand(K, L + 1, V).contiguous()
    return draft_tokens, draft_probs, target_probs


__all__ = ["AGREEMENTS", "synthetic_block"]
