"""Verifier.expected_emitted: the exact E[tau + 1 | drafts] in closed form, checked against the exact law.

On random toy blocks (float64) the closed form must equal sum(probability * len(tokens)) over ``law()``'s
outcomes to 1e-9 (both are exact; observed ~1e-16). Negative control: the same closed form on a perturbed
target differs from the original law by far more than 1e-9 (the check can fail). At Qwen's vocabulary the
closed form runs on the device with no host read and returns a 0-dim float64 tensor in [1, L + 1].
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.bench.blocks import synthetic_block
from spectr_repro.bench.counters import count_ops
from spectr_repro.verify import VERIFIERS, get_verifier

from .conftest import EXACT_TV

CLOSED_FORM = ("sd", "bv", "gbv")  # the rules that must have one (others may return None)


def _random_block(V: int, K: int, L: int, generator: torch.Generator):
    """Drafts sharing the context: K drafts of L tokens drawn from q, rows tied along shared prefixes."""
    rows: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def row_pair(prefix):
        if prefix not in rows:
            p = torch.rand(V, generator=generator, dtype=torch.float64) ** 3 + 1e-3
            q = torch.rand(V, generator=generator, dtype=torch.float64) ** 3 + 1e-3
            rows[prefix] = (p / p.sum(), q / q.sum())
        return rows[prefix]

    tokens = torch.zeros(K, L, dtype=torch.long)
    draft_probs = torch.zeros(K, L, V, dtype=torch.float64)
    target_probs = torch.zeros(K, L + 1, V, dtype=torch.float64)
    for k in range(K):
        for i in range(L + 1):
            p, q = row_pair(tuple(tokens[k, :i].tolist()))
            target_probs[k, i] = p
            if i < L:
                draft_probs[k, i] = q
                tokens[k, i] = torch.multinomial(q, 1, generator=generator)[0]
    return tokens, draft_probs, target_probs


def _law_mean(verifier, block, state=None) -> float:
    return sum(o.probability * len(o.tokens) for o in verifier.law(*block, state=state))


def _cases(name: str):
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    Ks = [1] if VERIFIERS[name].single_draft else [1, 2, 3]
    for index in range(24):
        V = 2 + index % 4
        K = Ks[index % len(Ks)]
        L = 1 + index % 4
        yield _random_block(V, K, L, generator)


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_closed_form_is_the_law_mean(name):
    verifier = get_verifier(name)
    blocks = list(_cases(name))
    values = [verifier.expected_emitted(*block) for block in blocks]
    if name not in CLOSED_FORM and values[0] is None:
        assert all(v is None for v in values)  # no closed form: the rule says so on every block
        return
    for block, value in zip(blocks, values):
        assert value is not None and value.dtype == torch.float64 and value.dim() == 0
        assert abs(float(value) - _law_mean(verifier, block)) < EXACT_TV


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_negative_control_perturbed_target(name):
    """The closed form on a target mixed with the uniform law no longer matches the original law's mean."""
    verifier = get_verifier(name)
    gaps = []
    for tokens, dp, tp in _cases(name):
        perturbed = 0.7 * tp + 0.3 / tp.shape[-1]
        closed_form = float(verifier.expected_emitted(tokens, dp, perturbed))
        gaps.append(abs(closed_form - _law_mean(verifier, (tokens, dp, tp))))
    assert max(gaps) > 1e-3  # a thousand times above the 1e-9 threshold of the real check


def test_gbv_closed_form_with_a_carried_state():
    """gbv with the state a previous iteration returns (its carry-over frames) still matches its law."""
    verifier = get_verifier("gbv")
    generator = torch.Generator().manual_seed(5)
    checked = 0
    for _ in range(6):
        first = _random_block(3, 1, 3, generator)
        states = [o.state for o in verifier.law(*first) if o.state is not None and o.state.frames]
        for state in states[:3]:
            block = _random_block(3, 1, 3, generator)
            assert abs(float(verifier.expected_emitted(*block, state=state)) - _law_mean(verifier, block, state)) \
                < EXACT_TV
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_closed_form_at_qwen_vocabulary_reads_nothing(name):
    L = 12
    block = synthetic_block(1, L, 151_936, seed=3, draft_noise=1.0)
    verifier = get_verifier(name, check_inputs=False)
    with count_ops() as counts:
        value = verifier.expected_emitted(*block)
    assert counts.host_reads == 0
    assert value.dtype == torch.float64 and value.dim() == 0 and value.device == block[1].device
    assert 1.0 <= float(value) <= L + 1
