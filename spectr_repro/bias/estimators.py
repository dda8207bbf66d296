"""The law of a rule's first emitted token, estimated from draft sets, and a test of it against p.

Pure tensors in, numbers out (no models, configs or files). One context c; S independent draft sets
D_1..D_S, each K i.i.d. drafts of L tokens from q(.|c) with its target rows; the rule's first emitted
token has law m(y) = E_D[ m_D(y) ], where m_D is its law given the drafts. A lossless rule has m = p(.|c).

Estimators of m_D (``FirstTokenDraws``: per draft set, atoms with weights plus a residual law shared by
the context's draft sets, weight 1 - sum of the atoms' weights):

* ``exact given drafts``: m_D itself (no sampling noise given the drafts: the only noise left is the drafts').
  ``sd``, ``spectr`` and the controls from the position-0 rows (closed forms below); every rule whose verifier
  has ``first_token_law`` (``spectr_gbv``: the release's scan as a dynamic programme; ``sbv``: its selection walk)
  from the whole block. ``tests/verify/test_first_token_law.py`` and ``tests/bias`` check each against the
  rule's own ``.law()`` on every draft tuple of toys.
* ``counted``: R calls of the rule on each draft set (``get_verifier(name)(...)``), m_D estimated by the R first
  tokens (``sbvf``, whose fallback has no cheap first-token law).
* the negative controls on the same draft sets (draft 0 of each set): ``control_lenient_sd``, SD accepting
  with min(1, 2 p/q) (a deliberately biased rule), and ``control_draft``, which emits the drafted token
  (law q). Their exact marginal laws are known (``control_exact_law``), so their true TV is known.

The test (``analyse``): Hotelling's T^2 on the probabilities of a few bins fixed by p alone (``bins_of``: p's most
likely tokens, at most ``MAX_BINS``, each with p >= max(0.01, 5/S), the rest of the vocabulary too). Per draft set,
y_s = m_D(bins) (exact or counted); under H0 the y_s are i.i.d. with mean p(bins), so T^2 = S d' Sigma^-1 d (d =
mean y - p(bins), Sigma the sample covariance plus 1/S of the multinomial covariance, its bound under H0: see
``hotelling``) gives F = T^2 (S - r) / (r (S - 1)) ~ F(r, S - r), r = rank of Sigma (exact under normality,
asymptotic in S otherwise).
Why valid at V = 152k: the bins are chosen before looking at the draws (from p, which the target forward gives
exactly), the statistic lives in r <= 4 dimensions whatever the vocabulary, and y_s is bounded, so the central
limit theorem applies at the S of a run; the level is checked by simulation in the tests (V = 2000, S = 300).
It uses the laws given the drafts directly (a Rao-Blackwellised test: no draw is thrown away), which is where
its power comes from. Counted laws (one-hot rows when R = 1) get Pearson's chi-square on the same bins instead
(``pearson``: the multinomial covariance, exact under H0 for R = 1 and conservative for R > 1): a covariance
estimated from one-hot rows is singular whenever a bin drew no token, which turns a chance gap into a tiny p.

Power: the smallest TV detectable with 90 % power at level 0.05 among the alternatives
m_t = p + t (p_rest / (1 - p_top) - delta_top) (mass t moved off the target's most likely token onto the others in
proportion to p; TV(m_t, p) = t; the release's bias on the V=2 toy is of this kind): noncentral F with
noncentrality S delta_t' Sigma^-1 delta_t, delta_t = m_t(bins) - p(bins), Sigma the observed covariance. Pooled over
contexts: Fisher's combination of the independent per-context p-values (chi-square with 2C degrees of freedom) and
its detectable TV (the same t at every context) simulated from the per-context noncentral F laws.

The TV estimate is TV on the bins (p's top tokens and the rest), a lower bound of the first token's TV (merging
tokens never increases TV), with a percentile bootstrap interval over draft sets (95 %). ``mean_law`` keeps the
whole estimated law (the report's figure).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from statsmodels.stats.multitest import multipletests

from spectr_repro.verify import VERIFIERS, get_verifier
from spectr_repro.verify.spectr import kseq_residual, optimal_rho

ALPHA = 0.05
POWER = 0.90
LENIENT_FACTOR = 2.0  # control_lenient_sd accepts with min(1, LENIENT_FACTOR * p / q)
CONTROLS = ("control_lenient_sd", "control_draft")
CLOSED_FORMS = ("sd", "spectr", *CONTROLS)  # from the position-0 rows alone
MAX_BINS = 4  # the test's dimension at most (p's most likely tokens)
MIN_BIN_MASS = 0.01  # a bin's p at least max(MIN_BIN_MASS, MIN_BIN_COUNT / S)
MIN_BIN_COUNT = 5  # (expected counts of >= 5 draft sets per bin: the CLT's usual floor for counted laws)
# The version of the test a context's results were computed by: part of a setting's folder name (BiasSetting.values),
# so contexts measured by an earlier test are never pooled with later ones. Change it with any change to the test.
TEST_VERSION = "2026-12-06: the rest of the vocabulary keeps the bins' floor of mass"
POOLED_REPLICATES = 2000  # simulations of the pooled statistic per TV of the grid (fixed seed)
# TV values at which the power is computed (geometric; the detectable TV is the first with power >= 0.9).
TV_GRID = tuple(float(x) for x in torch.logspace(math.log10(0.002), math.log10(0.6), 32).tolist())


@functools.cache
def has_exact_law(method: str) -> bool:
    """True when the first-token law given the drafts is computed exactly (closed form or the rule's own)."""
    if method in CLOSED_FORMS:
        return True
    return method in VERIFIERS and _answers(get_verifier(method, check_inputs=False))


def _answers(verifier) -> bool:
    """Whether the rule gives ``first_token_law`` (None: it has none, or declines with its options, as sbvf's
    fallback does): asked on a one-token toy block."""
    tokens = torch.zeros(1, 1, dtype=torch.long)
    rows = torch.tensor([[[0.5, 0.5]]], dtype=torch.float64)
    if not verifier.single_draft:
        tokens, rows = tokens.expand(2, 1), rows.expand(2, 1, 2)
    return verifier.first_token_law(tokens, rows, torch.cat([rows, rows], 1)) is not None


def estimator_name(method: str, calls: int) -> str:
    """How the first-token law given the drafts is obtained for ``method`` (report and CSV wording)."""
    if has_exact_law(method):
        return "exact given drafts"
    return f"counted ({calls} rule call{'s' if calls != 1 else ''} per draft set)"


@dataclass(frozen=True)
class FirstTokenDraws:
    """Per draft set s: P(first token = atoms[s, j]) = weights[s, j]; the rest goes to ``residual``."""

    atoms: torch.Tensor  # LongTensor [S, J]
    weights: torch.Tensor  # float64 [S, J]
    residual: torch.Tensor | None  # float64 [V], the correction law shared by the context's draft sets
    counted: bool = False  # frequencies of the rule's own draws (the test then uses the null covariance)

    @property
    def samples(self) -> int:
        return int(self.atoms.shape[0])


def concat_draws(parts: Sequence[FirstTokenDraws]) -> FirstTokenDraws:
    """The draws of several batches of one context (their residual laws are the same: same p, q rows)."""
    def residual_weight(part: FirstTokenDraws) -> float:
        return float((1 - part.weights.sum(-1)).max()) if part.samples else 0.0

    residual = max(parts, key=residual_weight).residual
    for part in parts:
        if residual_weight(part) > 1e-9:  # a batch that surely accepts may carry any residual
            _check_same_residual(residual, part.residual)
    return FirstTokenDraws(torch.cat([d.atoms for d in parts]), torch.cat([d.weights for d in parts]), residual,
                           parts[0].counted)


def _check_same_residual(first: torch.Tensor | None, other: torch.Tensor | None) -> None:
    if (first is None) != (other is None) or (first is not None and float((first - other).abs().max()) > 1e-6):
        raise ValueError("the draft sets of one context have different depth-0 corrections (they share p and q "
                         "at the context, so a rule's should not differ)")


def closed_form_draws(method: str, p0: torch.Tensor, q0: torch.Tensor, first_tokens: torch.Tensor) -> FirstTokenDraws:
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
            return FirstTokenDraws(x, torch.ones_like(ratio[:, :1]), None)
        factor = LENIENT_FACTOR if method == "control_lenient_sd" else 1.0
        accept = (factor * ratio[:, :1]).clamp(max=1.0)
        residual = _normalised((p0 - q0).clamp_min(0), fallback=p0)
    elif method == "spectr":
        K = x.shape[1]
        rho = optimal_rho(p0, q0, K)
        single = (ratio / rho).clamp(max=1.0)  # [S, K], each draft's test at depth 0
        none_before = torch.cumprod(torch.cat([torch.ones_like(single[:, :1]), 1 - single[:, :-1]], 1), 1)
        accept = none_before * single  # draft k is the first to pass
        residual = kseq_residual(p0, q0, rho, K).double()
    else:
        raise ValueError(f"no closed-form first-token law for {method!r} (use exact_draws or counted_draws)")
    return FirstTokenDraws(x, accept, residual)


def exact_draws(verifier, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                target_probs: torch.Tensor) -> FirstTokenDraws | None:
    """The rule's own ``first_token_law`` on each draft set (shapes as ``counted_draws``); None when the rule has
    none (or declines with its options, as sbvf's fallback does: it answers for every block alike)."""
    first = verifier.first_token_law(draft_tokens[0], draft_probs[0], target_probs[0])
    if first is None:
        return None
    laws = [first, *(verifier.first_token_law(draft_tokens[s], draft_probs[s], target_probs[s])
                     for s in range(1, draft_tokens.shape[0]))]
    # The residual only matters where it has weight: a set that accepts surely (weight 0) may report any law.
    reference = max(laws, key=lambda law: law.residual_weight)
    residual = reference.residual.double().cpu()
    for law in laws:
        if law.residual_weight > 1e-9:
            _check_same_residual(residual, law.residual.double().cpu())
    atoms = draft_tokens[:, :, 0].long().cpu()
    weights = torch.stack([law.draft_weights.double().cpu() for law in laws])
    return FirstTokenDraws(atoms, weights, residual)


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
    return FirstTokenDraws(atoms, torch.full(atoms.shape, 1.0 / calls, dtype=torch.float64), None, counted=True)


def rule_draws(method: str, draft_tokens, draft_probs, target_probs, calls: int,
               generator: torch.Generator, verifier=None) -> FirstTokenDraws:
    """The estimator ``estimator_name(method)`` names, on a batch of draft sets (shapes as ``counted_draws``)."""
    if method in CLOSED_FORMS:
        return closed_form_draws(method, target_probs[0, 0, 0], draft_probs[0, 0, 0], draft_tokens[:, :, 0])
    if method not in VERIFIERS:
        raise ValueError(f"unknown method {method!r}")
    verifier = verifier if verifier is not None else get_verifier(method, check_inputs=False)
    draws = exact_draws(verifier, draft_tokens, draft_probs, target_probs)
    if draws is not None:
        return draws
    return counted_draws(method, draft_tokens, draft_probs, target_probs, calls, generator, verifier)


# --------------------------------------------------------------------------------------------------
# Laws, bins and TV


def mean_law(draws: FirstTokenDraws, vocab_size: int) -> torch.Tensor:
    """The estimate of m: the mean over draft sets of m_D, float64 [V]."""
    S, J = draws.atoms.shape
    law = torch.zeros(vocab_size, dtype=torch.float64)
    law.index_add_(0, draws.atoms.cpu().reshape(-1), draws.weights.cpu().reshape(-1) / S)
    if draws.residual is not None:
        law.add_(draws.residual.cpu().double() * float((1 - draws.weights.cpu().sum(-1)).mean()))
    return law


def total_variation(law: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """0.5 * ||law - p||_1 along the last dim."""
    return 0.5 * (law - p.double()).abs().sum(-1)


def bins_of(p: torch.Tensor, samples: int) -> torch.Tensor:
    """The test's bins: p's most likely tokens (descending), at most MAX_BINS, each with
    p >= max(MIN_BIN_MASS, MIN_BIN_COUNT / samples), and the rest (every other token) with that mass too: the
    smallest bins join the rest until it has it. Always at least the top token. Fixed by p and S alone.

    Why the rest: Pearson's chi-square needs the expected count floor in every cell, the rest included. Found on
    2026-12-06: bins holding 0.9996 of p left the rest an expected 0.08 of 192 draft sets, and one draw there
    (a ',' from hsd) read as p = 0.004 where the chance of one or more such draws under H0 is 0.07."""
    p = p.double().cpu()
    order = torch.argsort(p, descending=True, stable=True)[:MAX_BINS]
    floor = max(MIN_BIN_MASS, MIN_BIN_COUNT / max(samples, 1))
    keep = int((p[order] >= floor).sum().clamp(min=1))
    while keep > 1 and 1 - float(p[order[:keep]].sum()) < floor:
        keep -= 1
    return order[:keep]


def binned_laws(draws: FirstTokenDraws, bins: torch.Tensor) -> torch.Tensor:
    """y [S, m]: each draft set's P(first token = bins[b] | drafts), float64."""
    atoms, weights = draws.atoms.cpu(), draws.weights.cpu().double()
    hits = (atoms.unsqueeze(-1) == bins.view(1, 1, -1)).double()  # [S, J, m]
    y = (weights.unsqueeze(-1) * hits).sum(1)
    if draws.residual is not None:
        y = y + (1 - weights.sum(-1, keepdim=True)) * draws.residual.cpu().double()[bins].unsqueeze(0)
    return y


def binned_tv(mean_bins: torch.Tensor, p_bins: torch.Tensor) -> torch.Tensor:
    """TV on the bins and the rest (the rest's mass: 1 - sum of the bins'), along the last dim."""
    rest = (1 - mean_bins.sum(-1)) - (1 - p_bins.sum(-1))
    return 0.5 * ((mean_bins - p_bins).abs().sum(-1) + rest.abs())


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


# --------------------------------------------------------------------------------------------------
# The test


def _critical(df1: int, df2: int | None, alpha: float) -> float:
    return float(stats.chi2.isf(alpha, df1) if df2 is None else stats.f.isf(alpha, df1, df2))


def _survival(statistic, df1: int, df2: int | None):
    return stats.chi2.sf(statistic, df1) if df2 is None else stats.f.sf(statistic, df1, df2)


def _power(df1: int, df2: int | None, noncentrality: float, alpha: float) -> float:
    critical = _critical(df1, df2, alpha)
    if df2 is None:
        return float(stats.ncx2.sf(critical, df1, noncentrality))
    return float(stats.ncf.sf(critical, df1, df2, noncentrality))


@dataclass(frozen=True)
class MeanTest:
    """A test of E[y] = target from S i.i.d. rows y [S, m]: the statistic (F with (df1, df2), or chi-square with df1
    when df2 is None), its p-value, and what the power needs (the covariance's kept eigenvectors and values; the
    power itself: ``power_model`` and ``detectable_of``)."""

    statistic: float
    p_value: float
    df1: int  # r, the covariance's rank (0: no variation, no test)
    df2: int | None  # S - r (Hotelling's F); None: chi-square (Pearson's, a known covariance)
    samples: int
    basis: torch.Tensor  # [m, r]
    eigenvalues: torch.Tensor  # [r]

    def noncentrality(self, shift: torch.Tensor) -> float:
        """S shift' Sigma^+ shift for a shift of the mean [m] (the alternative's noncentrality)."""
        if self.df1 == 0:
            return 0.0
        projected = self.basis.T @ shift.double()
        return float(self.samples * (projected ** 2 / self.eigenvalues).sum())


def _mean_test(y: torch.Tensor, target: torch.Tensor, covariance: torch.Tensor, hotelling: bool) -> MeanTest:
    S, m = y.shape
    eigenvalues, vectors = torch.linalg.eigh(covariance)
    keep = eigenvalues > max(1e-14, 1e-9 * float(eigenvalues.max()))
    basis, kept = vectors[:, keep], eigenvalues[keep]
    r = int(keep.sum())
    if r == 0 or (hotelling and S <= r):
        return MeanTest(0.0, 1.0, 0, None if not hotelling else 0, S, basis, kept)
    projected = basis.T @ (y.mean(0) - target)
    t2 = float(S * (projected ** 2 / kept).sum())
    if not hotelling:
        return MeanTest(t2, float(stats.chi2.sf(t2, r)), r, None, S, basis, kept)
    statistic = t2 * (S - r) / (r * (S - 1))
    return MeanTest(statistic, float(stats.f.sf(statistic, r, S - r)), r, S - r, S, basis, kept)


def hotelling(y: torch.Tensor, target: torch.Tensor) -> MeanTest:
    """Hotelling's one-sample T^2 test of E[y] = target for y [S, m] (rank-aware: directions in which the draft
    sets do not vary are left out, which can only lose power, never level). For exact laws given the drafts."""
    y, target = y.double(), target.double()
    S, m = y.shape
    if S < 2:
        return MeanTest(0.0, 1.0, 0, 0, S, torch.zeros(m, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))
    # + 1/S of the multinomial covariance diag(target) - target target', which bounds Cov(y) under H0 (y is a law
    # restricted to the bins): a regulariser that vanishes as S grows, so that a matrix estimated from few draft
    # sets is never singular.
    covariance = torch.cov(y.T).reshape(m, m) + multinomial_covariance(target) / S
    return _mean_test(y, target, covariance, hotelling=True)


def pearson(y: torch.Tensor, target: torch.Tensor) -> MeanTest:
    """Pearson's chi-square test of E[y] = target with the multinomial covariance diag(target) - target target':
    for counted laws (frequencies of R draws of the rule per draft set). With R = 1 the y_s are one-hot and that is
    their covariance under H0 exactly (the classical goodness-of-fit test on the bins and the rest); with R > 1 it
    bounds it, so the test is conservative. A covariance estimated from the one-hot rows instead would be singular
    whenever a bin drew no token, and turn a chance gap into a tiny p-value."""
    y, target = y.double(), target.double()
    return _mean_test(y, target, multinomial_covariance(target), hotelling=False)


def multinomial_covariance(target: torch.Tensor) -> torch.Tensor:
    return torch.diag(target) - torch.outer(target, target)


@dataclass(frozen=True)
class PowerModel:
    """What the pooled power needs from one context: the test's degrees of freedom and the noncentrality of each
    alternative of TV_GRID (NaN: not reachable, tv > p_top)."""

    df1: int
    df2: int | None  # None: chi-square
    noncentrality: list[float]

    def as_dict(self) -> dict:
        return {"df1": self.df1, "df2": self.df2, "noncentrality": self.noncentrality}

    @property
    def testable(self) -> bool:
        return self.df1 > 0 and (self.df2 is None or self.df2 > 0)

    def simulate_p_values(self, index: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """p-values of the test under the alternative TV_GRID[index] (uniform where it is untestable or out of
        reach, as a null context)."""
        noncentrality = self.noncentrality[index] if self.testable else math.nan
        if math.isnan(noncentrality):
            return rng.uniform(size=size)
        noncentrality = max(noncentrality, 1e-12)
        if self.df2 is None:
            draws = stats.ncx2.rvs(self.df1, noncentrality, size=size, random_state=rng)
        else:
            draws = stats.ncf.rvs(self.df1, self.df2, noncentrality, size=size, random_state=rng)
        return np.maximum(_survival(draws, self.df1, self.df2), 1e-300)


def power_model(test: MeanTest, p: torch.Tensor, bins: torch.Tensor) -> PowerModel:
    p = p.double().cpu()
    values = []
    for tv in TV_GRID:
        shifted = shifted_law(p, tv)
        values.append(math.nan if shifted is None else test.noncentrality(shifted[bins] - p[bins]))
    return PowerModel(test.df1, test.df2, values)


def detectable_of(model: PowerModel, alpha: float = ALPHA, power: float = POWER) -> float:
    """The first TV of TV_GRID whose power at ``alpha`` reaches ``power`` (inf if none)."""
    if not model.testable:
        return math.inf
    for tv, noncentrality in zip(TV_GRID, model.noncentrality):
        if not math.isnan(noncentrality) and _power(model.df1, model.df2, noncentrality, alpha) >= power:
            return tv
    return math.inf


@dataclass
class ContextResult:
    """One (method, context): the estimate, its interval, the test and its power."""

    samples: int
    tv_estimate: float  # TV on the bins (a lower bound of the first token's TV)
    interval: tuple[float, float]
    p_value: float
    detectable_tv: float  # inf: not reached on TV_GRID
    power_model: PowerModel
    bins: list[int]
    law: torch.Tensor  # the estimate of m, float64 [V]
    binned: torch.Tensor  # y [S, m]: each draft set's law at the bins (the test's data)
    test: str  # "hotelling" or "pearson"


def analyse(draws: FirstTokenDraws, p: torch.Tensor, generator: torch.Generator, bootstrap_replicates: int = 400,
            level: float = 0.95) -> ContextResult:
    """Estimate, interval, p-value (Hotelling's for exact laws, Pearson's for counted ones) and detectable TV of one
    method at one context (see the module doc)."""
    p = p.double().cpu()
    bins = bins_of(p, draws.samples)
    y = binned_laws(draws, bins)
    test = pearson(y, p[bins]) if draws.counted else hotelling(y, p[bins])
    estimate = float(binned_tv(y.mean(0), p[bins]))
    interval = bootstrap_interval(y, p[bins], estimate, generator, bootstrap_replicates, level)
    model = power_model(test, p, bins)
    return ContextResult(draws.samples, estimate, interval, test.p_value, detectable_of(model), model,
                         bins.tolist(), mean_law(draws, p.numel()), y, "pearson" if draws.counted else "hotelling")


def bootstrap_interval(y: torch.Tensor, p_bins: torch.Tensor, estimate: float, generator: torch.Generator,
                       replicates: int = 400, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the binned TV, resampling draft sets (widened to contain ``estimate``).
    Percentile, not basic: TV is not smooth at 0, where a basic interval collapses onto 0 for a lossless rule;
    the percentile one errs upward there (a conservative upper bound)."""
    S = y.shape[0]
    picks = torch.randint(0, S, (replicates, S), generator=generator, device=generator.device).cpu()
    values = binned_tv(y[picks].mean(1), p_bins)
    low, high = torch.quantile(values, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return min(float(low), estimate), max(float(high), estimate)


def pooled(p_values: Sequence[float], models: Sequence[PowerModel | dict], alpha: float = ALPHA,
           power: float = POWER, seed: int = 0) -> tuple[float, float]:
    """Fisher's combination over independent contexts: (pooled p-value, detectable TV when every context has that
    TV, from POOLED_REPLICATES simulations of each context's test under that alternative at a fixed seed)."""
    models = [m if isinstance(m, PowerModel) else PowerModel(**m) for m in models]
    count = len(p_values)
    statistic = -2 * sum(math.log(max(v, 1e-300)) for v in p_values)
    pooled_p = float(stats.chi2.sf(statistic, 2 * count))
    if not any(model.testable for model in models):
        return pooled_p, math.inf
    critical = stats.chi2.isf(alpha, 2 * count)
    rng = np.random.default_rng(seed)
    for index, tv in enumerate(TV_GRID):
        fisher = sum(-2 * np.log(model.simulate_p_values(index, POOLED_REPLICATES, rng)) for model in models)
        if float((fisher > critical).mean()) >= power:
            return pooled_p, tv
    return pooled_p, math.inf


def verdict(p_value: float, detectable_tv: float, alpha: float = ALPHA) -> str:
    """'bias detected (p <= alpha)' when rejected; else 'no bias detected (TV < x at 90 % power)' or
    'underpowered'. Uncorrected: the pooled row's verdict (Fisher over contexts, one test per method and setting).
    Per-context rows take ``context_verdicts`` (Holm over the contexts of that method and setting): uncorrected,
    among 16 lossless contexts one or more would read 'bias detected' 1 − 0.95^16 = 56 % of the time."""
    if p_value <= alpha:
        return f"bias detected (p <= {alpha:g})"
    if math.isinf(detectable_tv):
        return "underpowered"
    return f"no bias detected (TV < {detectable_tv:.3f} at 90 % power)"


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> tuple[list[bool], list[float]]:
    """Holm's step-down correction over one family of p-values (the contexts of one method and setting): which
    are rejected with family-wise error <= alpha under any dependence, and the Holm-adjusted p-values
    (statsmodels.stats.multitest.multipletests, method "holm")."""
    if len(p_values) == 0:
        return [], []
    reject, adjusted, _, _ = multipletests(list(p_values), alpha=alpha, method="holm")
    return [bool(r) for r in reject], [float(a) for a in adjusted]


def context_verdicts(p_values: Sequence[float], models: Sequence[PowerModel | dict],
                     alpha: float = ALPHA, power: float = POWER) -> list[tuple[float, float, str]]:
    """Per-context verdicts of one family (one method and setting) with Holm's correction: for each context its
    (Holm-adjusted p, detectable TV at level alpha / n, verdict). 'bias detected (Holm p <= alpha, n contexts)'
    only where Holm rejects; otherwise the detectable TV is the one at the Bonferroni level alpha / n, which Holm's
    every step is at least as lenient as, so 'no bias detected (TV < x ...)' stays a true statement of power.
    The rule's own verdict is the pooled test's (``pooled`` and ``verdict``), not these."""
    count = len(p_values)
    reject, adjusted = holm(p_values, alpha)
    out = []
    for rejected, adjusted_p, model in zip(reject, adjusted, models, strict=True):
        model = model if isinstance(model, PowerModel) else PowerModel(**model)
        detectable = detectable_of(model, alpha=alpha / max(count, 1), power=power)
        if rejected:
            text = f"bias detected (Holm p <= {alpha:g}, {count} contexts)"
        elif math.isinf(detectable):
            text = "underpowered"
        else:
            text = f"no bias detected (TV < {detectable:.3f} at 90 % power, Holm over {count} contexts)"
        out.append((adjusted_p, detectable, text))
    return out


__all__ = [
    "ALPHA", "CLOSED_FORMS", "CONTROLS", "MAX_BINS", "POWER", "TV_GRID", "ContextResult", "FirstTokenDraws",
    "MeanTest", "PowerModel", "analyse", "binned_laws", "binned_tv", "bins_of", "bootstrap_interval",
    "closed_form_draws", "concat_draws", "context_verdicts", "control_exact_law", "counted_draws", "detectable_of",
    "estimator_name",
    "exact_draws", "has_exact_law", "holm", "hotelling", "mean_law", "multinomial_covariance", "pearson", "pooled",
    "power_model", "rule_draws", "shifted_law", "total_variation", "verdict",
]
