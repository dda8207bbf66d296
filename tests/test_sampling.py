"""sampling.sample keeps every draw on the device: no host read, an on-device check against rows without
mass, and a uniform that lands on the total still draws a token with mass. (Its law: tests/test_toy_kit.py.)"""

import pytest
import torch

from spectr_repro import sampling
from spectr_repro.bench.counters import count_ops
from spectr_repro.sampling import sample


def test_a_draw_reads_nothing_back_from_the_device():
    probs = torch.rand(3, 1000)
    with count_ops() as counts:
        tokens = sample(probs, torch.Generator().manual_seed(0))
    assert counts.host_reads == 0 and counts.ops <= 12, counts
    assert tokens.shape == (3,) and tokens.dtype == torch.long


def test_a_uniform_on_the_total_draws_the_last_token_with_mass(monkeypatch):
    """u = 1 puts u * total on the total, past every cumulative sum: the cap must bring it back inside,
    onto the last token with mass, never past the end nor onto the zero-probability tail."""
    def rand_one(*shape, generator=None, device=None, dtype=None):
        return torch.ones(*shape, device=device, dtype=dtype)

    monkeypatch.setattr(sampling.torch, "rand", rand_one)
    probs = torch.tensor([[0.2, 0.5, 0.3, 0.0, 0.0], [0.0, 0.0, 0.7, 0.0, 0.3]], dtype=torch.float64)
    assert sample(probs).tolist() == [2, 4]
    assert sample(probs.float()).tolist() == [2, 4]


@pytest.mark.parametrize("bad_row", [[0.0, 0.0, 0.0], [float("nan"), 0.5, 0.5]])
def test_a_row_without_mass_is_a_value_error_even_among_good_rows(bad_row):
    probs = torch.tensor([[0.2, 0.3, 0.5], bad_row])
    with pytest.raises(ValueError, match="no probability mass"):
        sample(probs)
