"""Ops and host reads per engine iteration (batch 1), counted on the CPU by dispatch (bench.counters).

What a GPU pays for, counted anywhere: every non-view aten op is a kernel launch, every host read a
synchronisation (``spectr_repro.bench.counters``). Each count is attributed to where it happens:
model forwards (hooks), the sampler (``sampling.sample``, wrapped where the engine calls it), the
verification rule (a wrapper around it) and the engine's own remainder: cache bookkeeping,
softmaxes, stacking, reading the outcome.

Budgets for the engine's own work, per iteration (AR: per token), and why:
- host reads: exactly 1. AR reads its token (EOS and stop strings are host decisions, as in
  transformers' generate); a speculative iteration reads the emitted tokens once, in the same
  transfer as the draft prefix they claim to accept. Everything else stays on the device.
- ops: at most 8 + 4 L + 8 n_layers. Per draft position a softmax of the draft's logits (cast, divide,
  softmax) and the stacks; per layer the cache's repeat, row selection and crop of keys and values
  (two tensors, one op each; none of it at K = 1 but the crop); a constant for the target's softmax,
  concatenations and the outcome read. Measured below the bound with room for a few ops, not for a
  per-token loop or a per-vocabulary one.
The sampler's reads (two scalars per draw today) and the rules' are their modules' budgets
(tests/verify/test_op_budgets.py); the sampler's is a strict xfail here until it reads nothing.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest

import spectr_repro.engine.drafting as drafting
import spectr_repro.engine.loop as loop
from spectr_repro.bench.counters import OpCounts, count_ops
from spectr_repro.engine import generate
from spectr_repro.verify import Verifier, get_verifier

VOCAB, L, TOKENS = 259, 4, 40
CASES = [("ar", 1), ("sd", 1), ("spectr", 3)]


class _Counted(Verifier):
    """A rule whose reads and ops are set aside (the engine's budget is what remains)."""

    def __init__(self, name: str, meter: _Meter) -> None:
        super().__init__(check_inputs=False)
        self.inner = get_verifier(name, check_inputs=False)
        self.name, self.lossless, self.single_draft = name, self.inner.lossless, self.inner.single_draft
        self.meter = meter

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        with self.meter.part("verify"):
            return self.inner(draft_tokens, draft_probs, target_probs, generator=generator, state=state)


class _Meter:
    """Splits one count_ops run into forwards, sampler, verify and the engine's remainder."""

    def __init__(self) -> None:
        self.counts = OpCounts()
        self.parts = {"forward": OpCounts(), "sample": OpCounts(), "verify": OpCounts()}
        self._depth = 0

    @contextmanager
    def part(self, name: str):
        if self._depth:  # nested (a rule calling the sampler): charged to the outer part
            yield
            return
        ops, reads = self.counts.ops, self.counts.host_reads
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.parts[name].ops += self.counts.ops - ops
            self.parts[name].host_reads += self.counts.host_reads - reads

    def engine(self) -> OpCounts:
        rest = OpCounts(self.counts.ops, self.counts.host_reads)
        for part in self.parts.values():
            rest.ops -= part.ops
            rest.host_reads -= part.host_reads
        return rest


def measure(tiny, prompt, method, K, monkeypatch):
    target, draft, _ = tiny
    meter = _Meter()
    for module in (loop, drafting):
        original = module.sample

        def metered(probs, generator=None, original=original):
            with meter.part("sample"):
                return original(probs, generator)

        monkeypatch.setattr(module, "sample", metered)
    entered = {}
    hooks = []
    for model in (target, draft):
        def before(module, args, kwargs):
            entered[module] = meter.part("forward")
            entered[module].__enter__()

        def after(module, args, kwargs, output):
            entered.pop(module).__exit__(None, None, None)

        hooks += [model.register_forward_pre_hook(before, with_kwargs=True),
                  model.register_forward_hook(after, with_kwargs=True)]
    rule = "ar" if method == "ar" else _Counted(method, meter)
    try:
        with count_ops() as counts:
            meter.counts = counts
            out = generate(target, draft, prompt, method=rule, K=K, L=L, temperature=0.7, max_new_tokens=TOKENS,
                           seed=0, vocab_size=VOCAB)
    finally:
        for hook in hooks:
            hook.remove()
    return out, meter


@pytest.mark.parametrize("method, K", CASES)
def test_engine_reads_the_host_once_per_iteration(tiny, prompt_ids, method, K, monkeypatch):
    out, meter = measure(tiny, prompt_ids[0], method, K, monkeypatch)
    assert out.target_calls >= 8
    assert meter.parts["forward"].host_reads == 0
    # One read per iteration, plus one of the prompt's id range (checked once per prompt, before decoding).
    assert meter.engine().host_reads == out.target_calls + 1


@pytest.mark.parametrize("method, K", CASES)
def test_engine_ops_per_iteration_within_budget(tiny, prompt_ids, method, K, monkeypatch):
    out, meter = measure(tiny, prompt_ids[0], method, K, monkeypatch)
    layers = tiny[0].config.num_hidden_layers
    per_iteration = meter.engine().ops / out.target_calls
    assert per_iteration <= 8 + 4 * L + 8 * layers, per_iteration


@pytest.mark.parametrize("method, K", CASES)
def test_the_sampler_reads_nothing(tiny, prompt_ids, method, K, monkeypatch):
    _, meter = measure(tiny, prompt_ids[0], method, K, monkeypatch)
    assert meter.parts["sample"].host_reads == 0
