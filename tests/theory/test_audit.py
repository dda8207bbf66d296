"""The audit: it must flag a deliberately broken rule, pass lossless ones, and write its report."""

from __future__ import annotations

import json

import pytest
import torch

from spectr_repro.theory import audit
from spectr_repro.theory.cli import main_audit
from spectr_repro.verify import VERIFIERS, Outcome, Verifier, VerifyResult, get_verifier
from spectr_repro.verify.common import sample


class AlwaysAccept(Verifier):
    """Broken on purpose: accepts the whole first draft and adds a bonus from p (claims losslessness)."""

    name = "always_accept"
    lossless = True

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        bonus = sample(target_probs[0, -1], generator).view(1)
        return VerifyResult(torch.cat([draft_tokens[0].long(), bonus]), draft_tokens.shape[1], 0, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state):
        prefix = tuple(int(t) for t in draft_tokens[0])
        return [Outcome(float(p), prefix + (y,)) for y, p in enumerate(target_probs[0, -1].tolist()) if p > 0]


@pytest.mark.parametrize("K", [1, 2])
def test_audit_flags_a_broken_rule(K):
    row = audit.audit_verifier(AlwaysAccept(), K, audit.QUICK_TOYS, n_tokens=3, num_samples=1500, seed=0)
    assert row.verdict == "NOT lossless"
    assert row.exact_tv > 0.01
    assert row.p_value < audit.P_VALUE_THRESHOLD  # MC has the power to see it too
    assert row.p_value_vs_law > audit.P_VALUE_THRESHOLD  # its sampler does implement its (wrong) law
    assert "HARNESS CALLS THIS RULE LOSSLESS" in row.flags


def test_audit_passes_a_lossless_rule():
    row = audit.audit_verifier(get_verifier("bv"), 1, audit.QUICK_TOYS, n_tokens=3, num_samples=1500, seed=0)
    assert row.verdict == "lossless" and row.exact_tv < 1e-12
    assert row.p_value > audit.P_VALUE_THRESHOLD and not row.flags


def test_exact_verdicts_match_the_registry_for_every_rule():
    # Exact part only (num_samples=0) for speed: every registered rule's verdict at its default options
    # must match what the registry states; the release's rule at K >= 2 must be caught.
    rows = audit.run_audit(quick=True, Ks=(1, 2), num_samples=0)
    for row in rows:
        if row.options:
            continue
        assert (row.verdict == "lossless") == VERIFIERS[row.rule].lossless or (
            row.rule == "spectr_gbv" and row.K == 1
        ), (row.rule, row.K, row.exact_tv)
    by_key = {(r.rule, r.K, tuple(sorted(r.options.items()))): r for r in rows}
    assert by_key["gbv", 1, (("carry_over", False),)].verdict == "NOT lossless"
    assert by_key["spectr_gbv", 2, ()].verdict == "NOT lossless"
    assert by_key["sbvf", 2, (("selection", "mixture"),)].verdict == "lossless"  # the option is audited too


def test_audit_cli_quick_writes_report(tmp_path):
    out = tmp_path / "audit"
    assert main_audit(["--quick", "--rules", "bv,gbv", "--samples", "800", "--out", str(out), "--no-peers"]) == 0
    payload = json.loads((out / "audit.json").read_text())
    rows = payload["rows"]
    assert {"rule", "K", "options", "exact_tv", "p_value", "mc_tv", "verdict", "claimed_lossless"} <= set(
        rows[0]
    )
    verdicts = {(r["rule"], json.dumps(r["options"])): r["verdict"] for r in rows}
    assert verdicts["bv", "{}"] == "lossless"
    assert verdicts["gbv", "{}"] == "lossless"
    assert verdicts["gbv", '{"carry_over": false}'] == "NOT lossless"
    assert "NOT lossless" in (out / "AUDIT.md").read_text()


def test_audit_cli_rejects_unknown_rule(tmp_path, capsys):
    out = tmp_path / "audit"
    assert main_audit(["--quick", "--rules", "nope", "--out", str(out)]) == 2
    assert not out.exists()
    assert "unknown" in capsys.readouterr().err


@pytest.mark.slow
def test_full_audit():
    rows = audit.run_audit(quick=False)
    for row in rows:
        assert "SAMPLER DISAGREES WITH ITS EXACT LAW" not in row.flags, (row.rule, row.K, row.options)
        assert "HARNESS CALLS THIS RULE LOSSLESS" not in row.flags, (row.rule, row.K, row.options)
        if row.verdict == "lossless":
            assert row.p_value > audit.P_VALUE_THRESHOLD, (row.rule, row.K, row.options)
