"""Helpers shared by the rules: residual distributions and sampling from them.

All pure tensor functions. ``x`` arguments are [..., V].
"""

from __future__ import annotations

import torch

from spectr_repro.sampling import sample, uniform

__all__ = ["normalize", "positive_part", "residual", "sample", "sample_residual", "uniform"]

EPS = 1e-300  # only guards 0/0; every rule states what happens when a mass is exactly 0


def normalize(x: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """x / sum(x) along the last dim; rows with zero mass become ``fallback`` (or stay zero)."""
    total = x.sum(-1, keepdim=True)
    out = x / total.clamp_min(EPS)
    if fallback is not None:
        out = torch.where(total > 0, out, fallback.to(out.dtype))
    return out


def positive_part(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(0)


def residual(a: torch.Tensor, b: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """norm((a - b)+): the law of the correction token. ``fallback`` where (a - b)+ has no mass."""
    return normalize(positive_part(a - b), fallback=fallback if fallback is not None else None)


def sample_residual(
    a: torch.Tensor, b: torch.Tensor, generator: torch.Generator | None = None, fallback: torch.Tensor | None = None
) -> int:
    """One token from norm((a - b)+) (a, b: [V]); from ``fallback`` (default a) when that has no mass."""
    mass = positive_part(a - b)
    if float(mass.sum()) > 0:
        return int(sample(mass, generator))
    return int(sample(fallback if fallback is not None else a, generator))
