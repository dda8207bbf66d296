"""The law of a rule's first emitted token, estimated from draft sets, and a test of it against p.

Pure tensors in, numbers out (no models, configs or files). One context c; S independent draft sets
D_1..D_S, each K i.i.d. drafts of L tokens from q(.|c) with its target rows; the rule's first emitted
token has law m(y) = E_D[ m_D(y) ], where m_D is its law given the drafts. A lossless rule has m = p(.|c).

Estimators of m_D (``FirstTokenDraws``: per draft set, atoms with weights plus a residual law shared by
the context's draft sets, weight 1 - sum of the atoms' weights):

* ``sd``: exact given the draft (closed form): the drafted token x with probability a = min(1, p(x)/q(x)),
  else norm((p - q)+); the first token depends on position 0 only.
* ``spectr``: exact given the drafts (closed form from SpecTr's K-SEQ step at depth 0, where every draft
  survives): draft k's first token with probability prod_{j<k}(1 - a_j) a_k, a_k = min(1, p(x_k)/(rho* q(x_k))),
  else kseq_residual(p, q, rho*, K) (``spectr.optimal_rho`` / ``spectr.kseq_residual``, the rule's own code).
* every other rule (``spectr_gbv``, ``sbv``, ``sbvf``, ...): counted: R calls of the rule on each draft set
  (``get_verifier(name)(...)``), m_D estimated by the R first tokens (their block-level acceptance has no
  cheap closed form at V = 152k, and ``.law`` enumerates the vocabulary in Python).
* the negative controls on the same draft sets (draft 0 of each set): ``control_lenient_sd``, SD accepting
  with min(1, 2 p/q) (a deliberately biased rule), and ``control_draft``, which emits the drafted token
  (law q). Their exact marginal laws are known (``control_exact_law``), so their true TV is known.

The test (``analyse``): statistic TV(empirical law of one first token per draft set, p), where the token
is the rule's own draw (counted rules: the first call; closed forms: one exact draw from m_D). Under
H0: m = p the S tokens are i.i.d. from p, which we know exactly, so the statistic's null law is simulated
exactly (Monte-Carlo test; p-value (1 + #{null >= observed}) / (1 + N), valid at any S and any vocabulary
size: no chi-square asymptotics, which at 152k cells and S ~ 10^2 counts per context would be meaningless).
Power: the smallest TV detectable with 90 % power at level 0.05 is found by simulating alternatives
m_t = p + t (p_rest / (1 - p_top) - delta_top) (mass t moved off the target's most likely token onto the
others in proportion to p; TV(m_t, p) = t; the release's bias on the V=2 toy is of this kind). Pooled over
contexts: Fisher's combination of the independent per-context p-values (chi-square with 2C degrees of
freedom; MC p-values are super-uniform, so it stays valid), and its detectable TV for the same t at every
context, from the same simulations.

The TV estimate is the plug-in TV(mean of m_D, p) with the closed forms (far less variance) or the counts;
its interval is a percentile bootstrap over draft sets (95 %). The plug-in is biased upward by noise (most with
counted estimators over a long tail of unseen tokens): read it with ``detectable_tv``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from scipy import stats

from spectr_repro.verify import VERIFIERS, get_verifier

ALPHA = 0.05
POWER = 0.90
LENIENT_FACTOR = 2.0  # control_lenient_sd accepts with min(1, LENIENT_FACTOR * p / q)
CONTROLS = ("control_lenient_sd", "control_draft")
EXACT_GIVEN_DRAFTS = ("sd", "spectr", *CONTROLS)
# TV values at which the power is simulated (geometric; the detectable TV is the first with power >= 0.9).
TV_GRID = tuple(float(x) for x in torch.logspace(math.log10(0.002), math.log10(0.6), 32).tolist())


def estimator_name(method: str, calls: int) -> str:
    """How the first-token law given the drafts is obtained for ``method`` (report and CSV wording)."""
    if method in EXACT_GIVEN_DRAFTS:
        return "exact given drafts"
    return f"counted ({calls} rule call{'s' if calls != 1 else ''} per draft set)"


@dataclass(frozen=True)
class FirstTokenDraws:
    """Per draft set s: P(first token = atoms[s, j]) = weights[s, j] (the rest goes to ``residual``), and
    ``tested[s]``, one draw of the rule's first token given draft set s (the test's sample)."""

    atoms: torch.Tensor  # LongTensor [S, J]
    weights: torch.Tensor  # float64 [S, J]
    residual: torch.Tensor | None  # float64 [V], the correction law shared by the context's draft sets
    tested: torch.Tensor  # LongTensor [S]

    @property
    def samples(self) -> int:
        return int(self.atoms.shape[0])

    def head(self, n: int) -> FirstTokenDraws:
        return FirstTokenDraws(self.atoms[:n], self.weights[:n], self.residual, self.tested[:n])


def concat_draws(parts: Sequence[FirstTokenDraws]) -> FirstTokenDraws:
    """The draws of several batches of one context (their residual laws are the same: same p, q rows)."""
    return FirstTokenDraws(torch.cat([d.atoms for d in parts]), torch.cat([d.weights for d in parts]),
                           parts[0].residual, torch.cat([d.tested for d in parts]))


def _draw_from_mixture(atoms, weights, residual, generator) -> torch.Tensor:
    """One token per row from sum_j weights[s, j] delta_{atoms[s, j]} + (1 - sum_j weights[s, j]) residual."""
    S = atoms.shape[0]
    u = torch.rand(S, 1, generator=generator, dtype=torch.float64, device=generator.device).to(atoms.device)
    index = torch.searchsorted(weights.cumsum(-1), u, right=True).squeeze(-1)  # J: the residual
    from_atoms = atoms.gather(1, index.clamp(max=atoms.shape[1] - 1).unsqueeze(1)).squeeze(1)
    if residual is None:
        return from_atoms
    from_residual = torch.multinomial(residual.float().to(atoms.device), S, replacement=True, generator=generator)
    return torch.where(index < atoms.shape[1], from_atoms, from_residual)


def closed_form_draws(method: str, p0: torch.Tensor, q0: torch.Tensor, first_tokens: torch.Tensor,
                      generator: torch.Generator) -> FirstTokenDraws:
    """Exact first-token laws given the drafts (sd, spectr, the controls) from the position-0 rows alone.

    p0, q0: [V] target and draft laws at the context; first_tokens: [S, K] the drafts' first tokens.
    """
    p0, q0 = p0.double(), q0.double()
    x = first_tokens.long()
    ratio = p0[x] / q0[x]  # [S, K]; a drafted token has q > 0
    if method in ("sd", *CONTROLS):
        if method == "sd" and x.shape[1] != 1:
            raise ValueError(f"sd verifies a single draft; got K={x.shape[1]}")
        x = x[:, :1]
        if method == "control_draft":
            return FirstTokenDraws(x, torch.ones_like(ratio[:, :1]), None, x[:, 0].clone())
        factor = LENIENT_FACTOR if method == "control_lenient_sd" else 1.0
        accept = (factor * ratio[:, :1]).clamp(max=1.0)
        residual = _normalised((p0 - q0).clamp_min(0), fallback=p0)
    elif method == "spectr":
        from spectr_repro.verify.spectr import kseq_residual, optimal_rho

        K = x.shape[1]
        rho = optimal_rho(p0, q0, K)
        single = (ratio / rho).clamp(max=1.0)  # [S, K], each draft's test at depth 0
        none_before = torch.cumprod(torch.cat([torch.ones_like(single[:, :1]), 1 - single[:, :-1]], 1), 1)
        accept = none_before * single  # draft k is the first to pass
        residual = kseq_residual(p0, q0, rho, K).double()
    else:
        raise ValueError(f"no closed-form first-token law for {method!r} (use counted_draws)")
    return FirstTokenDraws(x, accept, residual, _draw_from_mixture(x, accept, residual, generator))


def control_exact_law(method: str, p0: torch.Tensor, q0: torch.Tensor) -> torch.Tensor:
    """The exact marginal first-token law of a control (drafts integrated out), float64 [V]."""
    p0, q0 = p0.double(), q0.double()
    if method == "control_draft":
        return q0
    if method != "control_lenient_sd":
        raise ValueError(f"not a control: {method!r}")
    accept = (LENIENT_FACTOR * p0 / q0.clamp_min(1e-300)).clamp(max=1.0)
    accepted = q0 * accept
    return accepted + (1 - accepted.sum()) * _normalised((p0 - q0).clamp_min(0), fallback=p0)


def _normalised(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = x.sum()
    return x / total if total > 0 else fallback


def counted_draws(method: str, draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                  calls: int, generator: torch.Generator, verifier=None) -> FirstTokenDraws:
    """R = ``calls`` runs of the rule on each draft set: draft_tokens [S, K, L], draft_probs [S, K, L, V],
    target_probs [S, K, L+1, V]. The rule's own public call, so whatever it does is what is measured."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    verify = verifier if verifier is not None else get_verifier(method)
    firsts = [[int(verify(draft_tokens[s], draft_probs[s], target_probs[s], generator=generator).tokens[0])
               for _ in range(calls)] for s in range(draft_tokens.shape[0])]  # the rule's API is one block a call
    atoms = torch.tensor(firsts, dtype=torch.long)
    return FirstTokenDraws(atoms, torch.full(atoms.shape, 1.0 / calls, dtype=torch.float64), None,
                           atoms[:, 0].clone())


def rule_draws(method: str, draft_tokens, draft_probs, target_probs, calls: int,
               generator: torch.Generator) -> FirstTokenDraws:
    """The estimator ``estimator_name(method)`` names, on a batch of draft sets (shapes as ``counted_draws``)."""
    if method in EXACT_GIVEN_DRAFTS:
        return closed_form_draws(method, target_probs[0, 0, 0], draft_probs[0, 0, 0], draft_tokens[:, :, 0],
                                 generator)
    if method not in VERIFIERS:
        raise ValueError(f"unknown method {method!r}")
    return counted_draws(method, draft_tokens, draft_probs, target_probs, calls, generator)


# --------------------------------------------------------------------------------------------------
# Laws and TV


def mean_law(draws: FirstTokenDraws, vocab_size: int) -> torch.Tensor:
    """The estimate of m: the mean over draft sets of m_D, float64 [V]."""
    return _laws(draws, torch.ones(1, draws.samples, dtype=torch.float64), vocab_size)[0]


def _laws(draws: FirstTokenDraws, counts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, V] laws sum_s counts[r, s] m_{D_s} / S (counts: bootstrap multiplicities, [R, S])."""
    S, J = draws.atoms.shape
    scale = counts.to(torch.float64) / S  # [R, S]
    laws = torch.zeros(counts.shape[0], vocab_size, dtype=torch.float64)
    weights = (scale.unsqueeze(-1) * draws.weights.cpu().unsqueeze(0)).reshape(counts.shape[0], S * J)
    laws.scatter_add_(1, draws.atoms.cpu().reshape(1, S * J).expand(counts.shape[0], -1), weights)
    if draws.residual is not None:
        left = (scale * (1 - draws.weights.cpu().sum(-1)).unsqueeze(0)).sum(-1, keepdim=True)  # [R, 1]
        laws.add_(left * draws.residual.cpu().unsqueeze(0))
    return laws


def total_variation(law: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """0.5 * ||law - p||_1 along the last dim."""
    return 0.5 * (law - p.double()).abs().sum(-1)


def empirical_tv(tokens: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """TV(empirical law of each row of ``tokens`` [N, S], p) for N rows at once, without [N, V] tensors.

    Tokens never drawn contribute their p; so TV = (1 + sum over drawn y of (|n_y/S - p_y| - p_y)) / 2.
    """
    N, S = tokens.shape
    V = p.shape[-1]
    keys = (torch.arange(N).unsqueeze(1) * V + tokens.cpu()).reshape(-1)
    unique, counts = torch.unique(keys, return_counts=True)
    rows, ids = unique // V, unique % V
    p = p.double().cpu()
    contribution = (counts.double() / S - p[ids]).abs() - p[ids]
    return 0.5 * (1 + torch.zeros(N, dtype=torch.float64).index_add_(0, rows, contribution))


def simulated_tv(law: torch.Tensor, p: torch.Tensor, samples: int, replicates: int,
                 generator: torch.Generator) -> torch.Tensor:
    """``replicates`` values of empirical_tv for ``samples`` i.i.d. draws from ``law`` (compared with p)."""
    draws = torch.multinomial(law.float().cpu(), replicates * samples, replacement=True, generator=generator)
    return empirical_tv(draws.view(replicates, samples), p)


def mc_p_values(observed: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
    """(1 + #{null >= observed}) / (1 + N) for each observed value (the Monte-Carlo test's p-value)."""
    null_sorted = torch.sort(null).values
    at_least = null.numel() - torch.searchsorted(null_sorted, observed.double(), right=False)
    return (1 + at_least.double()) / (1 + null.numel())


def shifted_law(p: torch.Tensor, tv: float) -> torch.Tensor | None:
    """m_t: mass ``tv`` moved off p's most likely token onto the others in proportion to p (None: tv > p_top)."""
    p = p.double().cpu()
    top = int(p.argmax())
    p_top = float(p[top])
    if tv > p_top or p_top >= 1:
        return None
    law = p * (1 + tv / (1 - p_top))  # the others gain tv in proportion to p
    law[top] = p_top - tv
    return law


@dataclass(frozen=True)
class Calibration:
    """The test's null law and power at one context and sample count (the same for every method there)."""

    samples: int
    null: torch.Tensor  # [N] TV statistics of S i.i.d. draws from p
    alternative_p_values: list[list[float]]  # [len(TV_GRID)][replicates]: p-values under m_t, for pooling
    detectable_tv: float  # inf: not reached on TV_GRID


def calibrate(p: torch.Tensor, samples: int, generator: torch.Generator, null_replicates: int = 1000,
              alternative_replicates: int = 200) -> Calibration:
    """Simulate the statistic under H0 (S draws from p) and under each m_t of TV_GRID."""
    p = p.double().cpu()
    null = simulated_tv(p, p, samples, null_replicates, generator)
    alternative = []
    for tv in TV_GRID:
        shifted = shifted_law(p, tv)
        if shifted is None:  # cannot move that much off the top token: count as never detected
            alternative.append([1.0] * alternative_replicates)
            continue
        alt = simulated_tv(shifted, p, samples, alternative_replicates, generator)
        alternative.append(mc_p_values(alt, null).tolist())
    return Calibration(samples, null, alternative, detectable_from(alternative))


@dataclass
class ContextResult:
    """One (method, context): the estimate, its interval, the test and its power."""

    samples: int
    tv_estimate: float
    interval: tuple[float, float]
    p_value: float
    detectable_tv: float  # inf: not reached on TV_GRID
    alternative_p_values: list[list[float]]  # [len(TV_GRID)][replicates]: for the pooled power
    law: torch.Tensor  # the estimate of m, float64 [V]


def analyse(draws: FirstTokenDraws, p: torch.Tensor, generator: torch.Generator,
            calibration: Calibration | None = None, bootstrap_replicates: int = 400, level: float = 0.95
            ) -> ContextResult:
    """Estimate, interval, MC p-value and detectable TV of one method at one context (see the module doc).

    ``calibration``: ``calibrate(p, draws.samples, ...)``, shared by the methods of a context (computed here
    when None)."""
    p = p.double().cpu()
    V, S = p.numel(), draws.samples
    if calibration is None:
        calibration = calibrate(p, S, generator)
    if calibration.samples != S:
        raise ValueError(f"calibration for S={calibration.samples} used with S={S} draft sets")
    law = mean_law(draws, V)
    estimate = float(total_variation(law, p))
    interval = bootstrap_interval(draws, p, estimate, generator, bootstrap_replicates, level)
    observed = empirical_tv(draws.tested.view(1, S), p)
    p_value = float(mc_p_values(observed, calibration.null)[0])
    return ContextResult(S, estimate, interval, p_value, calibration.detectable_tv,
                         calibration.alternative_p_values, law)


def detectable_from(alternative_p_values: Sequence[Sequence[float]], alpha: float = ALPHA,
                    power: float = POWER) -> float:
    """The first TV of TV_GRID whose simulated rejection rate at ``alpha`` reaches ``power`` (inf if none)."""
    for tv, values in zip(TV_GRID, alternative_p_values):
        if torch.tensor(values).le(alpha).double().mean() >= power:
            return tv
    return math.inf


def bootstrap_interval(draws: FirstTokenDraws, p: torch.Tensor, estimate: float, generator: torch.Generator,
                       replicates: int = 400, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of TV(m, p), resampling draft sets (widened to contain ``estimate``).
    Percentile, not basic: TV is not smooth at 0, where a basic interval collapses onto 0 for a lossless
    rule; the percentile one errs upward there (a conservative upper bound)."""
    S = draws.samples
    picks = torch.randint(0, S, (replicates, S), generator=generator, device=generator.device).cpu()
    counts = torch.zeros(replicates, S, dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(replicates, S, dtype=torch.float64))
    values = resampled_tv(draws, counts, p)
    low, high = torch.quantile(values, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return min(float(low), estimate), max(float(high), estimate)


def resampled_tv(draws: FirstTokenDraws, counts: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """TV(sum_s counts[r, s] m_{D_s} / S, p) for each row r of ``counts`` [R, S], without [R, V] tensors.

    A resampled law is A_r + rho_r * residual, A_r on the atoms' tokens U. Off U, the TV term
    sum_y |rho r_y - p_y| is piecewise linear in the scalar rho with breakpoints p_y / r_y: sorted once,
    then evaluated for every rho by a binary search on cumulative sums.
    """
    p = p.double().cpu()
    R, S = counts.shape
    atoms, weights = draws.atoms.cpu(), draws.weights.cpu()
    tokens, inverse = torch.unique(atoms.reshape(-1), return_inverse=True)
    scale = counts.to(torch.float64) / S
    on_atoms = torch.zeros(R, tokens.numel(), dtype=torch.float64).scatter_add_(
        1, inverse.view(1, -1).expand(R, -1), (scale.unsqueeze(-1) * weights.unsqueeze(0)).reshape(R, -1))
    off = torch.ones_like(p, dtype=torch.bool)
    off[tokens] = False
    if draws.residual is None:
        return 0.5 * ((on_atoms - p[tokens]).abs().sum(-1) + p[off].sum())
    residual = draws.residual.double().cpu()
    rho = (scale * (1 - weights.sum(-1)).unsqueeze(0)).sum(-1)  # [R]
    inside = (on_atoms + rho.unsqueeze(1) * residual[tokens] - p[tokens]).abs().sum(-1)
    r_off, p_off = residual[off], p[off]
    has_r = r_off > 0
    constant = p_off[~has_r].sum()  # |0 - p_y|
    breakpoints, order = torch.sort(p_off[has_r] / r_off[has_r])
    r_sorted, p_sorted = r_off[has_r][order], p_off[has_r][order]
    zero = torch.zeros(1, dtype=torch.float64)
    cum_r, cum_p = torch.cat([zero, r_sorted.cumsum(0)]), torch.cat([zero, p_sorted.cumsum(0)])
    below = torch.searchsorted(breakpoints, rho, right=True)  # y with p_y / r_y <= rho: rho r_y >= p_y
    r_le, p_le = cum_r[below], cum_p[below]
    outside = (rho * r_le - p_le) + (cum_p[-1] - p_le) - rho * (cum_r[-1] - r_le) + constant
    return 0.5 * (inside + outside)


def pooled(p_values: Sequence[float], alternatives: Sequence[Sequence[Sequence[float]]], alpha: float = ALPHA,
           power: float = POWER) -> tuple[float, float]:
    """Fisher's combination over independent contexts: (pooled p-value, detectable TV when every context has
    that TV). ``alternatives``: per context, ``ContextResult.alternative_p_values`` (same grid, same count)."""
    count = len(p_values)
    statistic = -2 * sum(math.log(v) for v in p_values)
    pooled_p = float(stats.chi2.sf(statistic, 2 * count))
    critical = stats.chi2.isf(alpha, 2 * count)
    alt = torch.tensor([list(a) for a in alternatives], dtype=torch.float64)  # [C, grid, replicates]
    fisher = -2 * alt.log().sum(0)  # [grid, replicates]
    detectable = math.inf
    for tv, rate in zip(TV_GRID, (fisher > critical).double().mean(-1).tolist()):
        if rate >= power:
            detectable = tv
            break
    return pooled_p, detectable


def verdict(p_value: float, detectable_tv: float, alpha: float = ALPHA) -> str:
    """'bias detected (p <= alpha)' when rejected; else 'no bias detected (TV < x at 90 % power)' or
    'underpowered'. Per context there is no correction for multiplicity: among many lossless contexts about
    5 % are rejected by chance; the pooled row (Fisher over contexts) is one test per method and setting."""
    if p_value <= alpha:
        return f"bias detected (p <= {alpha:g})"
    if math.isinf(detectable_tv):
        return "underpowered"
    return f"no bias detected (TV < {detectable_tv:.3f} at 90 % power)"


__all__ = [
    "ALPHA", "CONTROLS", "EXACT_GIVEN_DRAFTS", "POWER", "TV_GRID", "Calibration", "ContextResult",
    "FirstTokenDraws", "analyse", "bootstrap_interval", "calibrate", "closed_form_draws", "concat_draws",
    "control_exact_law", "counted_draws", "detectable_from", "empirical_tv", "estimator_name", "mc_p_values",
    "mean_law", "pooled", "resampled_tv", "rule_draws", "shifted_law", "simulated_tv", "total_variation", "verdict",
]
