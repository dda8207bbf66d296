"""rule_costs: one row per registered rule, shape, block kind and carried state, with the counts that
count_ops measures for the same calls (small V, so it runs in seconds)."""

import pytest
import torch

from spectr_repro.bench.blocks import synthetic_block
from spectr_repro.bench.counters import count_ops
from spectr_repro.bench.verify_costs import carried_state, rule_costs, worst_by_rule
from spectr_repro.verify import VERIFIERS, get_verifier

V = 64


@pytest.fixture(scope="module")
def rows():
    real = [synthetic_block(3, 5, V, agreement="shared", seed=1), synthetic_block(3, 5, V, seed=2)]
    return rule_costs(real, Ks=(1, 3), Ls=(4,), V=V, seeds=range(1))


def test_every_rule_shape_and_block_kind_has_a_row(rows):
    keys = {(r.rule, r.K, r.L, r.block, r.carried_frames) for r in rows}
    for name, spec in VERIFIERS.items():
        frames = (0, 1, 2, 3) if spec.carries_state else (0,)
        Ks = (1,) if spec.single_draft else (1, 3)
        for K in Ks:
            for kind in ("independent/far", "independent/close", "shared/far", "shared/close"):
                assert all((name, K, 4, kind, f) in keys for f in frames), (name, K, kind)
        # Real blocks keep their shape; single-draft rules verify their first draft.
        assert all((name, Ks[-1], 5, "real", f) in keys for f in frames), name
    assert not any(VERIFIERS[r.rule].single_draft and r.K != 1 for r in rows)
    assert all(r.ops > 0 and r.host_reads >= 0 and r.calls > 0 for r in rows)
    assert all(r.mean_ops <= r.ops and r.mean_host_reads <= r.host_reads for r in rows)
    real_calls = {r.calls for r in rows if r.block == "real"}
    assert real_calls == {2}  # two blocks x one seed, per carried state


def test_counts_are_those_of_the_calls(rows):
    """The worst row of gbv with two frames on the real blocks equals counting those calls directly."""
    real = [synthetic_block(3, 5, V, agreement="shared", seed=1), synthetic_block(3, 5, V, seed=2)]
    verifier, state = get_verifier("gbv", check_inputs=False), carried_state(5, 2)
    measured = []
    for tokens, draft_probs, target_probs in real:
        with count_ops() as counts:
            verifier(tokens[:1], draft_probs[:1], target_probs[:1], generator=torch.Generator().manual_seed(0),
                     state=state)
        measured.append((counts.ops, counts.host_reads))
    (row,) = [r for r in rows if (r.rule, r.block, r.carried_frames) == ("gbv", "real", 2)]
    assert (row.ops, row.host_reads) == tuple(map(max, zip(*measured)))
    assert row.mean_ops == sum(m[0] for m in measured) / len(measured)


def test_worst_by_rule_takes_the_maximum_over_kinds(rows):
    worst = worst_by_rule(rows)
    for (name, K, L), (ops, reads) in worst.items():
        group = [r for r in rows if (r.rule, r.K, r.L) == (name, K, L)]
        assert ops == max(r.ops for r in group) and reads == max(r.host_reads for r in group)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="unknown rules"):
        rule_costs(rules=["spectre"], Ks=(1,), Ls=(4,), V=V)
    with pytest.raises(ValueError, match="real block"):
        rule_costs([(torch.zeros(3),)], rules=["sd"], Ks=(), Ls=())


def test_rule_times_one_row_per_rule_shape_and_block_kind():
    """rule_times (wall time per call, indicative): a row for each requested rule, K and block kind, with the
    number of timed calls and a positive median; unknown rules are refused."""
    from spectr_repro.bench.verify_costs import rule_times

    rows = rule_times(rules=["sd", "sbv"], Ks=(1, 3), Ls=(4,), V=V, seeds=range(2))
    keys = {(r.rule, r.K, r.block) for r in rows}
    kinds = ("independent/far", "independent/close", "shared/far", "shared/close")
    assert keys == {("sd", 1, k) for k in kinds} | {("sbv", K, k) for K in (1, 3) for k in kinds}
    assert all(r.calls == 2 and r.median_ms > 0 for r in rows)
    with pytest.raises(ValueError, match="unknown rules"):
        rule_times(rules=["nope"], V=V)
