"""The paper's bound claims of theory.claims: against each rule (a table where a rule passes the bound must FAIL
the claim) and its limit as K grows on binary toys."""

from __future__ import annotations

import pandas as pd

from spectr_repro.theory import claims
from spectr_repro.theory.bounds import paper_bound
from spectr_repro.theory.toy import ToySpec


def _table(rule_value: float) -> pd.DataFrame:
    rows = [{"toy": "t", "K": 2, "quantity": "paper_bound", "value": 1.5}]
    rows += [{"toy": "t", "K": 2, "quantity": rule, "value": 1.2} for rule in claims.THEORY_RULES]
    rows[1]["value"] = rule_value
    return pd.DataFrame(rows)


def test_a_rule_above_the_bound_fails_the_claim_and_none_above_holds():
    assert claims.rules_against_bound(_table(1.2))[1] == "holds"
    claim, verdict, evidence = claims.rules_against_bound(_table(1.6))
    assert verdict == "FAILS" and f"{claims.THEORY_RULES[0]}: above in 1/1" in evidence


def test_the_bound_grows_to_L_on_binary_toys():
    claim, verdict, evidence = claims.bound_limit_on_binary_toys((ToySpec(2, 2, 0),), max_K=16)
    assert verdict == "holds" and "K=16" in evidence
    target, draft = ToySpec(2, 2, 0).pair()
    values = [paper_bound(target, draft, K, 2) for K in (1, 16)]
    assert values[0] < values[1] <= 2 and 2 - values[1] < 0.05  # L = 2: the bound's limit
