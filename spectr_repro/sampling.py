"""The one place where logits become probabilities and probabilities become tokens.

Used by the engine (target and draft alike) and by every verifier, so that the distribution a
token was sampled from is, bit for bit, the distribution handed to the acceptance test.
"""

from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax of ``logits / temperature`` in float32; temperature 0 gives a one-hot argmax.

    logits: [..., V] of any floating dtype. Returns float32 [..., V].
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits.float()
    if temperature == 0:
        # Greedy decoding as a distribution: ties go to the lowest id, as torch.argmax does.
        one_hot = torch.zeros_like(logits)
        return one_hot.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.softmax(logits / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` ([..., V], non-negative, need not be normalised).

    Inverse-CDF sampling on a float64 cumulative sum: exact to float64 round-off (a float32 cumsum
    over 152k entries would misstate small probabilities by ~1e-7 each, ~1e-3 in TV), tokens with
    probability 0 are never drawn, and it is ~3x faster than torch.multinomial on CPU at V = 152k.
    Returns a LongTensor of shape ``probs.shape[:-1]``, on the device of ``probs``.

    The draw never waits for the device (no host read): the engine calls this for every draft token.
    A row with no mass (all zeros, or NaN) is a caller's bug that must never yield a token: it is
    caught by an on-device assertion, which raises ValueError at once when the row lives on the host
    and, on a GPU, fails the stream at the next synchronisation (a device-side assert, which no later
    result of this process survives), so a bad row can never decode quietly.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    cumulative = torch.cumsum(flat, dim=-1, dtype=torch.float64)
    total = cumulative[:, -1:]
    _assert_has_mass(total)
    u = torch.rand(flat.shape[0], 1, generator=generator, device=flat.device, dtype=torch.float64) * total
    # u * total can round up onto the total (probability ~1e-16): keep it strictly below, so that the
    # search lands on the last token with mass, never past the end nor on a zero-probability token
    # (the first index whose cumulative sum exceeds u always has positive probability).
    u = torch.minimum(u, torch.nextafter(total, total.new_zeros(())))
    tokens = torch.searchsorted(cumulative, u, right=True).squeeze(-1)
    return tokens.reshape(probs.shape[:-1])


NO_MASS_MESSAGE = "cannot sample from a row with no probability mass"


def _assert_has_mass(total: torch.Tensor) -> None:
    """Every entry of ``total`` > 0, checked on the device (an asynchronous assertion, no host read)."""
    try:
        torch._assert_async((total > 0).all(), NO_MASS_MESSAGE)
    except RuntimeError as error:  # raised synchronously only for host tensors
        raise ValueError(NO_MASS_MESSAGE) from error


def uniform(n: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """``n`` i.i.d. U(0, 1) draws in float64 (acceptance tests compare them with float64 ratios)."""
    if device is None and generator is not None:
        device = generator.device
    return torch.rand(n, generator=generator, device=device, dtype=torch.float64)
