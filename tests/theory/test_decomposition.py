"""The decomposition of the released SpecTr-GBV rule's bias (spectr_repro.theory.decomposition): each corrective
step's exact TV to the target on toys, the final step lossless, a skipped step failing (negative control), and
the two facts the table rests on (h never leaves [0, 1] in exact arithmetic; the cap keeps T − B ≥ 0)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from spectr_repro.theory import decomposition as dec
from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.theory.toy import ToySpec, exact_decoded_law, target_law
from spectr_repro.verify.spectr_gbv import SpecTrGBV
from spectr_repro.verify.thresholds import EXACT_TV

# V=2, L=2 keeps every K <= 3 in seconds (2^(K L) draft sets); V=3, L=2 at K=2 is the audit's first toy, where the
# coupling residual differs from the release's (at V=2 both normalise to the same one-hot correction).
SMALL = ToySpec(2, 2, 0)
AUDIT_TOY = ToySpec(3, 2, 0)
N_TOKENS = 3
BIASED = 1e-4  # every biased step seen is off by > 2e-5; round-off is ~1e-16 (EXACT_TV = 1e-9 sits between)


def _tv(step: str, toy: ToySpec, K: int) -> float:
    target, draft = toy.pair()
    law = dec.step_decoded_law(step, target, draft, K, toy.L, N_TOKENS)
    return total_variation(law, target_law(target, N_TOKENS))


@pytest.mark.parametrize("toy, K", [(SMALL, 1), (SMALL, 2), (SMALL, 3), (AUDIT_TOY, 2)])
def test_final_step_is_lossless(toy, K):
    assert _tv(dec.FINAL_STEP, toy, K) < EXACT_TV


@pytest.mark.parametrize("toy, K", [(SMALL, 2), (SMALL, 3), (AUDIT_TOY, 2)])
def test_every_rule_step_is_biased_at_several_drafts(toy, K):
    """At K >= 2 none of the per-block corrections (h clamped, the coupling residual, the carry-over) removes
    the bias: the release's correction assumes the scan realises the coupling's law, and it does not."""
    for step, _ in dec.RULE_STEPS:
        assert _tv(step, toy, K) > EXACT_TV, step


def test_at_one_draft_the_carry_over_closes_the_bias():
    """K = 1 is GBV: the release's scan realises B = min(P, Q), so the carried target suffices."""
    assert _tv("coupling", SMALL, 1) > BIASED
    assert _tv("carry_over", SMALL, 1) < EXACT_TV


@pytest.mark.parametrize("K", [2, 3])
def test_skipping_the_cap_fails_where_the_scan_overshoots_a_carried_target(K):
    """Negative control: without the cap, the correction from the scan's own law is not enough on this toy, because
    the scan run against a carried target accepts some prefix more often than that target emits it."""
    target, draft = SMALL.pair()
    oracle = dec.MarginalOracle(target, draft, K, SMALL.L, carry_over=True, cap=False)
    tv = total_variation(oracle.decoded_law(N_TOKENS), target_law(target, N_TOKENS))
    assert tv > 1e-5
    assert oracle.min_carried_mass < -1e-4  # the reason: B(s) > T(s) somewhere


@pytest.mark.parametrize("K", [1, 2, 3])
def test_skipping_the_carry_over_fails(K):
    """Negative control: the final step without its carry-over (the correction alone, every iteration from p)."""
    assert _tv(dec.NEGATIVE_CONTROL, SMALL, K) > BIASED


def test_clamping_h_leaves_the_law_unchanged():
    """u < h already accepts always when h > 1 and never when h < 0: the clamp cannot move the law."""
    target, draft = AUDIT_TOY.pair()
    release = exact_decoded_law(SpecTrGBV(), target, draft, 2, AUDIT_TOY.L, N_TOKENS)
    clamped = exact_decoded_law(SpecTrGBV(clamp_h=True), target, draft, 2, AUDIT_TOY.L, N_TOKENS)
    assert total_variation(release, clamped) < 1e-15


def test_the_scan_departs_from_the_coupling_only_with_several_drafts():
    target, draft = SMALL.pair()
    assert dec.coupling_gap(dec.MarginalOracle(target, draft, 1, SMALL.L)) < 1e-12
    assert dec.coupling_gap(dec.MarginalOracle(target, draft, 2, SMALL.L)) > 0.05


def test_h_stays_in_the_unit_interval_in_exact_arithmetic():
    """Numerator >= 0 by Jensen ((1 − x)^K convex, Σ p_v c_v <= c); denominator − numerator =
    [1 − (1 − Q)^K] − P·[1 − (1 − min(1, Q/P))^K] >= 0 (concavity, P <= 1). Random blocks, fixed seed."""
    generator = torch.Generator().manual_seed(0)
    rule = SpecTrGBV(check_inputs=False)
    K, L, V = 3, 3, 5
    for _ in range(200):
        draft_probs = torch.distributions.Dirichlet(torch.full((V,), 0.3)).sample((K, L)).double()
        target_probs = torch.distributions.Dirichlet(torch.full((V,), 0.3)).sample((K, L + 1)).double()
        tokens = torch.multinomial(draft_probs.view(-1, V), 1, generator=generator).view(K, L)
        assert rule.h_excursions(tokens, draft_probs, target_probs) == []


def test_h_excursions_reports_the_release_float32_cancellation():
    """In float32, 1 − (1 − Q)^K is 0 for Q < 2^-25: the full-block h divides by eps alone and leaves [0, 1]
    (the reading of the release's arithmetic in spectr_gbv's docstring); the float64 replica's does not.
    Q = 1e-9, P = 2e-9: the numerator P·(1 − (1 − Q/P)^K) = 1.5e-9 does not cancel."""
    V, K, L = 3, 2, 1
    draft_probs = torch.tensor([[[1e-9, 0.5 - 5e-10, 0.5 - 5e-10]]] * K, dtype=torch.float32)
    target_probs = torch.tensor([[[2e-9, 0.5 - 1e-9, 0.5 - 1e-9], [1 / 3] * 3]] * K, dtype=torch.float32)
    tokens = torch.zeros(K, L, dtype=torch.long)
    excursions = SpecTrGBV(arithmetic="release_fp32").h_excursions(tokens, draft_probs, target_probs)
    assert excursions and all(h > 1 for _, _, h in excursions)
    assert SpecTrGBV().h_excursions(tokens, draft_probs.double(), target_probs.double()) == []
    assert V == draft_probs.shape[-1]


def test_cap_keeps_the_accepted_law_under_the_target():
    accepted = {(): 0.1, (0,): 0.5, (0, 1): 0.4}
    target_mass = {(0,): 0.7, (0, 1): 0.3, (1,): 0.3}
    capped = dec._capped(accepted, target_mass)
    through = dec._through(capped)
    assert sum(capped.values()) == pytest.approx(1.0)
    assert through[(0,)] == pytest.approx(0.7) and through[(0, 1)] == pytest.approx(0.3)
    assert capped[()] == pytest.approx(0.3)  # what the cap cut at (0,) falls back to the root


def test_unknown_step_and_residual_are_rejected():
    target, draft = SMALL.pair()
    with pytest.raises(ValueError, match="unknown step"):
        dec.step_decoded_law("nope", target, draft, 1, SMALL.L)
    with pytest.raises(ValueError, match="residual must be one of"):
        SpecTrGBV(residual="paper")
    with pytest.raises(ValueError, match="reproduces the release"):
        SpecTrGBV(residual="coupling", arithmetic="release_fp16")


def test_the_command_writes_the_table_and_refuses_a_bad_k(tmp_path, capsys):
    from spectr_repro.theory.cli import main_theory

    assert main_theory(["--decomposition", "--max-k", "5", "--out", str(tmp_path / "bad")]) == 2
    assert "--max-k in 1..3" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main_theory(["--decomposition", "--quick", "--max-k", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "DECOMPOSITION.md").read_text()
    assert "| V=2,L=2,seed=0 | 1 |" in table and "capped" in table
    assert set(pd.read_csv(tmp_path / "decomposition.csv").step) == {*dec.STEPS, dec.NEGATIVE_CONTROL}


@pytest.mark.slow
@pytest.mark.parametrize("toy", dec.DECOMPOSITION_TOYS, ids=lambda toy: toy.label())
@pytest.mark.parametrize("K", [1, 2, 3])
def test_on_the_audit_toys_the_final_step_is_lossless_and_the_release_is_not(toy, K):
    """The table of docs/theory.md, its first and last columns (slow: K = 3 enumerates up to 3^6 draft sets at every
    context the oracle reaches)."""
    assert _tv(dec.FINAL_STEP, toy, K) < EXACT_TV
    assert _tv("release", toy, K) > BIASED


def test_0_over_0_slots_are_set_apart_from_excursions():
    """V=2, L=3, K=1: some blocks have a prefix with P >= Q and Q·q_v <= P·p_v for every v, where h is 0/0 and its
    rounded value leaves [0, 1]; h_excursions reports them only when asked (undefined=True), and the toy's
    defined h never leave [0, 1]."""
    toy = ToySpec(2, 3, 1)
    target, draft = toy.pair()
    rule = SpecTrGBV(check_inputs=False)
    undefined_blocks = 0
    for _, tokens in dec.draft_tuples(draft, (), 1, toy.L):
        draft_probs, target_probs = dec.block_tensors(target, draft, (), tokens)
        assert rule.h_excursions(tokens, draft_probs, target_probs) == []
        undefined_blocks += bool(rule.h_excursions(tokens, draft_probs, target_probs, undefined=True))
    assert undefined_blocks > 0
