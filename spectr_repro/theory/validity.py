"""The validity check of docs/methods.md for a rule used as is, applied to its per-iteration law M.

R(empty) = 1 and R(w x) = R(w) p(x | w) - M(w x): the target mass of "w is a prefix of the final text and
the iteration has not stopped yet". The iteration law M is valid (the decoded text has exactly the
target's law when every iteration starts again from plain p) iff every R >= 0 and R(z) = 0 for every z of
length L+1 (docs/methods.md, "Validity"; the LP of ``theory.lp`` is built on the same constraints). The
tolerance absorbs float64 round-off only: audited lossless rules give |violations| ~ 1e-16.

A rule with a carry-over (gbv) is not valid as is by design: check it across iterations with the audit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spectr_repro.theory.toy import ToyLM


@dataclass(frozen=True)
class ValidityReport:
    valid: bool
    min_residual: float  # min over w of R(w) (< 0: the rule emits w more often than the target)
    max_terminal_residual: float  # max over z of length L+1 of |R(z)| (> 0: mass never emitted)
    mass_error: float  # |sum M - 1|
    worst_prefix: tuple[int, ...]  # where the largest violation occurs (() if none)
    tolerance: float
    reason: str  # "" when valid


def residuals(law: Mapping[tuple[int, ...], float], target: ToyLM, L: int,
              context: Sequence[int] = ()) -> dict[tuple[int, ...], float]:
    """R(w) for every w of length 1..L+1 (vectorised over the next token)."""
    context = tuple(context)
    V = target.vocab_size
    out: dict[tuple[int, ...], float] = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(L + 1):
        next_frontier = {}
        for prefix, mass in frontier.items():
            values = mass * target.probs(context + prefix).numpy()
            for token in range(V):
                word = prefix + (token,)
                next_frontier[word] = float(values[token]) - float(law.get(word, 0.0))
        out.update(next_frontier)
        frontier = next_frontier
    return out


def check_validity(law: Mapping[tuple[int, ...], float], target: ToyLM, L: int,
                   context: Sequence[int] = (), tolerance: float = 1e-9) -> ValidityReport:
    """Apply "R >= 0, R = 0 at length L+1" to the per-iteration law ``law`` (a dict output -> prob)."""
    bad_lengths = [z for z, p in law.items() if p > 0 and not 1 <= len(z) <= L + 1]
    mass_error = abs(sum(law.values()) - 1.0)
    if bad_lengths:
        return ValidityReport(False, np.nan, np.nan, mass_error, bad_lengths[0], tolerance,
                              f"output of length {len(bad_lengths[0])} outside 1..L+1={L + 1}")
    R = residuals(law, target, L, context)
    inner = {w: r for w, r in R.items()}
    terminal = {w: abs(r) for w, r in R.items() if len(w) == L + 1}
    worst_negative = min(inner, key=inner.get)
    worst_terminal = max(terminal, key=terminal.get)
    min_residual = inner[worst_negative]
    max_terminal = terminal[worst_terminal]
    reasons = []
    if min_residual < -tolerance:
        reasons.append(f"R{worst_negative} = {min_residual:.3g} < 0")
    if max_terminal > tolerance:
        reasons.append(f"|R{worst_terminal}| = {max_terminal:.3g} > 0 at length L+1")
    if mass_error > tolerance:
        reasons.append(f"M sums to 1 {'+' if sum(law.values()) > 1 else '-'} {mass_error:.3g}")
    worst = worst_negative if min_residual < -tolerance or max_terminal <= tolerance else worst_terminal
    return ValidityReport(not reasons, min_residual, max_terminal, mass_error,
                          worst if reasons else (), tolerance, "; ".join(reasons))
