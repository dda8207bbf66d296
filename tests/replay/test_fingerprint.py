"""The rules' fingerprint (replay/fingerprint.py): stable under what does not change a value, changed by what does.

Committed replays pool prompts across sessions only when each rule's fingerprint matches, so both directions matter:
a fingerprint that moved under a refactor would split the grid for nothing, and one that missed a changed value
would pool two versions of a rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectr_repro.replay import fingerprint
from spectr_repro.replay.fingerprint import rule_fingerprint, rules_fingerprint
from spectr_repro.verify import VERIFIERS, get_verifier

SAMPLED = ["spectr_gbv"]
COMMITTED = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture(autouse=True)
def _fresh_cache():
    fingerprint._replayed_values.cache_clear()
    yield
    fingerprint._replayed_values.cache_clear()


def test_every_rule_has_a_distinct_fingerprint_independent_of_the_others():
    together = rules_fingerprint(sampled=SAMPLED)
    assert list(together) == list(VERIFIERS)
    assert all(len(value) == 12 for value in together.values())
    assert len(set(together.values())) == len(together)  # no two rules give the same values
    # Adding or removing a rule changes no other rule's fingerprint (the grid keeps its prompts when hsd arrives).
    assert {m: rule_fingerprint(m, SAMPLED) for m in VERIFIERS} == together


def test_repeatable_and_sampling_changes_only_the_sampled_rule():
    first = rules_fingerprint(sampled=SAMPLED)
    fingerprint._replayed_values.cache_clear()
    assert rules_fingerprint(sampled=SAMPLED) == first
    exact = rules_fingerprint()
    assert [m for m in VERIFIERS if exact[m] != first[m]] == ["spectr_gbv"]


def test_a_changed_value_changes_the_fingerprint(monkeypatch):
    """Negative control: bv's expected value moved by 1e-6 (far below any interval the report shows) is caught,
    its law moved by 1e-6 is caught, and rules that do not use bv keep theirs."""
    before = rules_fingerprint(["bv", "sd", "gbv"])
    verifier_class = type(get_verifier("bv"))
    original = verifier_class.expected_emitted

    def shifted(self, *args, **kwargs):
        value = original(self, *args, **kwargs)
        return None if value is None else value + 1e-6

    monkeypatch.setattr(verifier_class, "expected_emitted", shifted)
    fingerprint._replayed_values.cache_clear()
    after = rules_fingerprint(["bv", "sd", "gbv"])
    assert after["bv"] != before["bv"]
    assert after["sd"] == before["sd"] and after["gbv"] == before["gbv"]


def test_a_changed_law_changes_the_fingerprint(monkeypatch):
    before = rule_fingerprint("sd")
    verifier_class = type(get_verifier("sd"))
    original = verifier_class._law

    def tilted(self, *args, **kwargs):
        outcomes = original(self, *args, **kwargs)
        first = outcomes[0]
        return [type(first)(first.probability * (1 + 1e-7), first.tokens, first.state), *outcomes[1:]]

    monkeypatch.setattr(verifier_class, "_law", tilted)
    fingerprint._replayed_values.cache_clear()
    assert rule_fingerprint("sd") != before


def test_rounding_absorbs_last_bit_noise(monkeypatch):
    """A refactor that moves values by float64 round-off (1e-15 relative) keeps every fingerprint."""
    before = rules_fingerprint(["bv"])
    verifier_class = type(get_verifier("bv"))
    original = verifier_class.expected_emitted

    def jittered(self, *args, **kwargs):
        value = original(self, *args, **kwargs)
        return None if value is None else value * (1 + 1e-15)

    monkeypatch.setattr(verifier_class, "expected_emitted", jittered)
    fingerprint._replayed_values.cache_clear()
    assert rules_fingerprint(["bv"]) == before


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="not registered rules: nope"):
        rules_fingerprint(["bv", "nope"])


def test_inputs_are_float64_toys():
    tokens, draft_probs, target_probs = fingerprint._toy_block(3, 0, 2, 2)
    assert draft_probs.dtype == target_probs.dtype == torch.float64
    assert tuple(tokens.shape) == (2, 2) and tuple(target_probs.shape) == (2, 3, 3)


def _rules_unlike_the_last_seal() -> dict[str, list[str]]:
    """{committed replay group: the rules whose fingerprint at this commit differs from its last seal's}."""
    unlike = {}
    for path in sorted(COMMITTED.glob("*/replay/*/manifest.json")):
        manifest = json.loads(path.read_text())
        sealed = manifest["current_rules_fingerprint"]
        now = rules_fingerprint(list(sealed), manifest["settings"].get("sampled") or [])
        unlike[path.parent.name] = [rule for rule in sealed if now[rule] != sealed[rule]]
    return unlike


def test_this_commit_keeps_the_rules_the_committed_replays_were_sealed_with(monkeypatch):
    """The committed grid grows over many sittings (issue 48): a refactor of a rule (rbv's host bookkeeping, say)
    must keep every value it records, else the report sets the earlier prompts aside as another version. So each
    committed group's last seal (`current_rules_fingerprint`, with the group's sampled rules) must be this code's.
    A rule changed on purpose is named here until the folder is sealed again (then the report pools it apart).
    Negative control: rbv's expected value moved by 1e-6 is named, and only rbv."""
    unlike = _rules_unlike_the_last_seal()
    assert unlike, "no committed replay under results/"
    assert {group: rules for group, rules in unlike.items() if rules} == {}

    verifier_class = type(get_verifier("rbv"))
    original = verifier_class.expected_emitted
    monkeypatch.setattr(verifier_class, "expected_emitted",
                        lambda self, *args, **kwargs: original(self, *args, **kwargs) + 1e-6)
    fingerprint._replayed_values.cache_clear()
    assert {tuple(rules) for rules in _rules_unlike_the_last_seal().values()} == {("rbv",)}
