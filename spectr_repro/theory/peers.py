"""Peer audit: transformers' assisted generation put through the audit's checks.

``target.generate(assistant_model=draft, do_sample=True)`` is the speculative decoding most users run. On a
tiny Llama pair over V = 4 tokens (spectr_repro.models.tiny, built in code, float32) the target's conditionals after
a fixed prompt are tabulated for every continuation (one batched forward), so the exact law of the first n
decoded tokens is known and transformers' output can be tested like our rules:

- decoded law: counts of the first ``n_tokens`` tokens over independent ``generate`` calls, Pearson
  chi-square (bins with expected count < 5 merged) and empirical TV against the target's exact law. The
  power is stated two ways. Worst case over the direction of a bias: with δ the bias per merged bin,
  λ = N·Σ δ²/p ≥ N·(Σ|δ|)² = 4·N·TV² (Cauchy–Schwarz), so every bias whose TV over the merged bins is at least
  ``detectable_tv`` is detected at α with ≥ 90 % power (noncentral chi-square approximation). Against known
  biases: the exact laws, on the same pair and schedule, of the released GBV rule (our ``gbv`` with
  ``carry_over=False``, = the released SpecTr-GBV at K = 1) and of the negative control, with the power
  simulated by drawing N-sample multinomials from them and running the same test;
- negative control through the same pipeline: transformers' own ``assistant_ensemble_weight`` (the DIVERSE
  static ensemble verification, documented by transformers as biased): acceptance min(1, 1 − w + w·p/q),
  residual norm((p − q)₊). Its exact law is computed here; its samples must be rejected against the target
  and must fit that exact law (so the pipeline measures what we think it measures);
- first iteration: a streamer receives the prompt and then each iteration's accepted tokens plus one
  (transformers calls ``streamer.put(valid_tokens)`` once per iteration), so the first chunk gives the
  first iteration's accepted length τ and outcome. τ's mean against SD's exact E[τ] on the same models (z
  score with the exact standard deviation), τ's law and the whole first-iteration outcome law against SD's
  exact iteration law (chi-square).

What it finds (transformers 5.x, read in generation/utils.py and candidate_generator.py): the decoded law is
the target's (no bias detected), but the drafts are not sampled from the draft model at temperature T. The
candidate generator hands the assistant's ``generate`` the main model's *prepared* logits processors (which
already hold ``TemperatureLogitsWarper(T)``, and any top-k/top-p warpers), and ``_get_logits_processor`` merges
that list in before it appends the warpers of the assistant's own generation config (a copy of the main one):
the assistant's logits are divided by T twice. Drafts come from softmax(logits/T²) and the acceptance test uses
the same scores, so the rule is still exact speculative sampling (lossless), with a different, sharper draft:
its first iteration matches SD's exact law with the draft at T², not at T, and its block efficiency is not
that of SD at equal T (higher when a sharper draft fits a peaked target, lower when draft = target). The
audit therefore models transformers' draft at T² wherever it needs transformers' exact law (the control,
the reference biases) and checks the first iteration against SD at both temperatures.

Settings: ``pinned`` (exactly L drafted tokens per iteration, constant schedule, no confidence stop: what
scripts/bench.py compares with our ``sd``), and transformers' defaults (up to 20 drafted tokens, the draft
stops early when its confidence in a drafted token is < 0.4). With ``max_new_tokens = n`` transformers
drafts min(L, n − 1 − emitted) tokens per iteration and samples the last wanted token from the target; the
exact laws below follow that schedule.

Exact-law precision: the tabulated conditionals come from the same float32 forward, softmax in float64; the
cached incremental forwards transformers runs differ by float32 round-off (~1e-7), far below what N samples
resolve. Models run with one CPU thread (tiny forwards are faster so) and transformers' global RNG, seeded
once per setting; the caller's RNG state and thread count are restored.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from scipy import optimize, stats

from spectr_repro.theory.exact import expected_accepted_length, iteration_law
from spectr_repro.theory.lawcheck import chi_square_test, total_variation
from spectr_repro.theory.toy import Context, ToyLM, block_tensors, draft_tuples, target_law
from spectr_repro.verify import Outcome, get_verifier
from spectr_repro.verify.thresholds import ALPHA  # the audit's p-value threshold (audit.P_VALUE_THRESHOLD)

POWER = 0.9  # the power at which the detectable TV is stated
POWER_REPLICATIONS = 1000  # multinomial replications behind each simulated power
Z_THRESHOLD = 4.0  # |z| of the mean accepted length above this is flagged (two-sided p ~ 6e-5)
PEER = "transformers assisted generation"


@dataclass(frozen=True)
class PeerPair:
    """The tiny Llama pair the peers run on: V = 4, draft = target + noise (TV(p, q) ~ 0.35 per context)."""

    vocab_size: int = 4
    seed: int = 0
    draft_noise: float = 1.0
    logit_scale: float = 0.7  # spread conditionals (entropy ~ 1 nat of log 4 = 1.39): many cells carry mass
    hidden_size: int = 32
    num_layers: int = 1
    temperature: float = 0.7
    prompt: tuple[int, ...] = (3,)

    def models(self):
        from spectr_repro.models.tiny import make_tiny_models  # transformers (~1 s): refusals exit first

        return make_tiny_models(self.vocab_size, seed=self.seed, draft_noise=self.draft_noise,
                                logit_scale=self.logit_scale, hidden_size=self.hidden_size,
                                num_layers=self.num_layers)

    def label(self) -> str:
        return (f"tiny Llama V={self.vocab_size} seed={self.seed} draft_noise={self.draft_noise} "
                f"T={self.temperature} prompt={list(self.prompt)}")


@dataclass(frozen=True)
class PeerSetting:
    """One way of running transformers' assisted generation."""

    name: str
    n_tokens: int  # max_new_tokens; the decoded law is tested on the first ``law_tokens``
    num_samples: int
    draft_length: int | None = None  # pinned L (constant schedule, no confidence stop); None: defaults
    ensemble_weight: float | None = None  # the negative control
    # The workaround: temperature=1 and logits_processor=[TemperatureLogitsWarper(T)].
    temperature_in_processor: bool = False
    law_tokens: int = 3
    seed: int = 0

    def describe(self) -> str:
        if self.draft_length is None:
            how = "transformers' defaults (num_assistant_tokens 20, constant schedule, confidence stop 0.4)"
        else:
            how = f"pinned L={self.draft_length} (constant schedule, confidence threshold 0)"
        if self.ensemble_weight is not None:
            how += f", assistant_ensemble_weight={self.ensemble_weight:g} (negative control)"
        if self.temperature_in_processor:
            how += ", temperature=1 with logits_processor=[TemperatureLogitsWarper(T)] (workaround)"
        return f"{how}, max_new_tokens={self.n_tokens}"


FULL_SETTINGS = (
    PeerSetting("pinned_L2", 3, 6000, draft_length=2, seed=1),
    PeerSetting("defaults", 3, 2000, seed=2),
    PeerSetting("pinned_L4", 5, 2000, draft_length=4, seed=3),
    PeerSetting("workaround_L2", 3, 2000, draft_length=2, temperature_in_processor=True, seed=5),
    PeerSetting("control_ensemble", 3, 2000, draft_length=2, ensemble_weight=0.8, seed=4),
)
QUICK_SETTINGS = (
    PeerSetting("pinned_L2", 3, 1500, draft_length=2, seed=1),
    PeerSetting("workaround_L2", 3, 800, draft_length=2, temperature_in_processor=True, seed=5),
    PeerSetting("control_ensemble", 3, 800, draft_length=2, ensemble_weight=0.8, seed=4),
)
REFERENCE_ENSEMBLE_WEIGHTS = (0.8, 0.9)  # known biases the power is simulated against (besides released GBV)


# --- exact laws on a real model ------------------------------------------------------------------------

class TabulatedLM(ToyLM):
    """A causal LM's conditionals after a fixed prompt, tabulated: the toy-model interface (``probs``,
    ``sequence_prob``) over a real model, so the toy kit's exact laws apply to it unchanged."""

    def __init__(self, table: dict[Context, torch.Tensor], vocab_size: int, depth: int) -> None:
        super().__init__(vocab_size, seed=-1)
        self.depth = depth
        self._cache.update(table)

    def _draw(self, context: Context) -> torch.Tensor:
        raise ValueError(f"context {context} is longer than the tabulated depth {self.depth}")


@torch.inference_mode()
def tabulate(model, prompt: Sequence[int], depth: int, temperature: float) -> TabulatedLM:
    """softmax(logits / T) in float64 after ``prompt`` + every continuation of up to ``depth`` tokens.

    One forward over all V^depth continuations: position m of row r is the conditional after the prompt and
    the row's first m tokens (causal model, no padding).
    """
    V = int(model.config.vocab_size)
    grid = torch.cartesian_prod(*[torch.arange(V)] * depth).view(-1, depth)  # [V^depth, depth], last fastest
    rows = torch.cat([torch.tensor(list(prompt)).repeat(len(grid), 1), grid], 1)
    logits = model(rows).logits[:, len(prompt) - 1:].double()  # [V^depth, depth + 1, V]
    probs = torch.softmax(logits / temperature, -1)
    table = {}
    for m in range(depth + 1):
        stride = V ** (depth - m)  # rows sharing their first m tokens are consecutive
        for r in range(0, len(grid), stride):
            table[tuple(grid[r, :m].tolist())] = probs[r, m].clone()
    return TabulatedLM(table, V, depth)


class EnsembleVerification:
    """The exact law of transformers' ``assistant_ensemble_weight`` = w (one draft): token i is accepted with
    probability min(1, 1 − w + w·p(x_i)/q(x_i)) (transformers' ``r <= ratio`` with r ~ U[0, 1)), up to the first
    rejection; then a token from norm((p − q)₊) (p itself if that has no mass), or a bonus from p after L."""

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def law(self, draft_tokens, draft_probs, target_probs, state=None) -> list[Outcome]:
        tokens = [int(t) for t in draft_tokens[0]]
        L = len(tokens)
        p, q = target_probs[0].double(), draft_probs[0].double()
        outcomes, survive = [], 1.0
        for i in range(L + 1):
            if i < L:
                ratio = 1 - self.weight + self.weight * float(p[i, tokens[i]]) / float(q[i, tokens[i]])
                accept = min(1.0, ratio)
                residual = (p[i] - q[i]).clamp_min(0)
                last = residual / residual.sum() if float(residual.sum()) > 0 else p[i]
                stop = survive * (1 - accept)
            else:
                accept, last, stop = 0.0, p[L], survive
            if stop > 0:
                outcomes += [Outcome(stop * float(w), tuple(tokens[:i]) + (v,)) for v, w in enumerate(last.tolist())
                             if w > 0]
            survive *= accept
        return outcomes


def scheduled_decoded_law(rule, target: ToyLM, draft: ToyLM, L: int, n: int) -> dict[Context, float]:
    """Exact law of the first ``n`` tokens under transformers' schedule with ``max_new_tokens = n``: each
    iteration drafts min(L, n − 1 − emitted) tokens (one draft, ``rule.law`` integrates the verification);
    when that is 0 the last token is sampled from the target."""
    memo: dict[tuple[Context, int], dict[Context, float]] = {}

    def recurse(context: Context, remaining: int) -> dict[Context, float]:
        if (context, remaining) in memo:
            return memo[context, remaining]
        block = min(L, remaining - 1)
        law: dict[Context, float] = {}
        if block == 0:
            law = {(v,): float(w) for v, w in enumerate(target.probs(context).tolist())}
        else:
            for prob, tokens in draft_tuples(draft, context, 1, block):
                draft_probs, target_probs = block_tensors(target, draft, context, tokens)
                for outcome in rule.law(tokens, draft_probs, target_probs):
                    emitted = tuple(int(t) for t in outcome.tokens)
                    weight = prob * outcome.probability
                    if len(emitted) == remaining:
                        law[emitted] = law.get(emitted, 0.0) + weight
                        continue
                    for suffix, p in recurse(context + emitted, remaining - len(emitted)).items():
                        law[emitted + suffix] = law.get(emitted + suffix, 0.0) + weight * p
        memo[context, remaining] = law
        return law

    return recurse((), n)


def accepted_length_law(iteration: dict[Context, float]) -> dict[tuple[int], float]:
    """Law of τ = |z| − 1 from an iteration law M(z) (keys are 1-tuples, as the chi-square test wants)."""
    law: dict[tuple[int], float] = {}
    for tokens, prob in iteration.items():
        law[(len(tokens) - 1,)] = law.get((len(tokens) - 1,), 0.0) + prob
    return law


# --- running transformers ------------------------------------------------------------------------------

class IterationRecorder:
    """A streamer (transformers' streamer protocol: ``put``, ``end``) that keeps what it is handed: the
    prompt, then, in assisted generation, each iteration's accepted tokens plus one."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, ...]] = []

    def put(self, value) -> None:
        self.chunks.append(tuple(int(t) for t in value.reshape(-1).tolist()))

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _quiet_single_thread(seed: int):
    """One CPU thread, transformers' warnings off and the global RNG seeded; all restored on exit."""
    import transformers  # transformers (~1 s): refusals and light commands exit before any model loads

    threads = torch.get_num_threads()
    verbosity = transformers.logging.get_verbosity()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)


@dataclass
class PeerSamples:
    decoded: Counter  # first ``law_tokens`` tokens
    first_iteration: Counter  # tokens the first iteration emitted (accepted + one)
    seconds: float


def run_assisted_generation(target, draft, prompt: Sequence[int], setting: PeerSetting,
                            temperature: float) -> PeerSamples:
    """``setting.num_samples`` independent calls of ``target.generate(assistant_model=draft, do_sample=True)``."""
    # transformers (~1 s): refusals and light commands exit before any model loads
    from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper

    processors = None
    if setting.temperature_in_processor:
        # The target's list is the caller's processor (no warper is added at temperature 1); the assistant
        # receives that prepared list and, at temperature 1, adds no second warper: both run at T.
        processors = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        temperature = 1.0
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                              max_new_tokens=setting.n_tokens, pad_token_id=0,
                              assistant_ensemble_weight=setting.ensemble_weight)
    saved = copy.deepcopy(draft.generation_config)
    if setting.draft_length is not None:
        # transformers reads these from the assistant's generation config.
        draft.generation_config.num_assistant_tokens = setting.draft_length
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
    input_ids = torch.tensor([list(prompt)])
    attention_mask = torch.ones_like(input_ids)
    decoded: Counter = Counter()
    first: Counter = Counter()
    start = time.perf_counter()
    try:
        with _quiet_single_thread(setting.seed), torch.inference_mode():
            for _ in range(setting.num_samples):
                recorder = IterationRecorder()
                out = target.generate(input_ids, attention_mask=attention_mask, generation_config=config,
                                      assistant_model=draft, streamer=recorder, logits_processor=processors)
                new = tuple(out[0, input_ids.shape[1]:].tolist())
                if len(new) != setting.n_tokens or recorder.chunks[0] != tuple(prompt):
                    raise RuntimeError(f"unexpected generate output {new} / streamer chunks {recorder.chunks}")
                decoded[new[: setting.law_tokens]] += 1
                first[recorder.chunks[1]] += 1
    finally:
        draft.generation_config = saved
    return PeerSamples(decoded, first, time.perf_counter() - start)


# --- power ---------------------------------------------------------------------------------------------

def worst_case_power(num_samples: int, dof: int, tv: float, alpha: float = ALPHA) -> float:
    """Power of the chi-square test (dof) against ANY bias of total variation ``tv`` over its bins: λ ≥ 4·N·TV²."""
    critical = stats.chi2.isf(alpha, dof)
    return float(stats.ncx2.sf(critical, dof, 4 * num_samples * tv**2))


def detectable_tv(num_samples: int, dof: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest TV (over the test's bins) that every bias must reach to be detected with ``power``."""
    critical = stats.chi2.isf(alpha, dof)
    noncentrality = optimize.brentq(lambda lam: stats.ncx2.sf(critical, dof, lam) - power, 1e-9, 1e6)
    return math.sqrt(noncentrality / (4 * num_samples))


def simulated_power(alternative: dict, null: dict, num_samples: int, alpha: float = ALPHA,
                    replications: int = POWER_REPLICATIONS, seed: int = 0) -> float:
    """Fraction of N-sample multinomials from ``alternative`` that the chi-square test rejects against ``null``."""
    keys = sorted(set(alternative) | set(null))
    probs = np.array([alternative.get(k, 0.0) for k in keys])
    draws = np.random.default_rng(seed).multinomial(num_samples, probs / probs.sum(), size=replications)
    rejected = 0
    for row in draws:
        counts = {k: int(c) for k, c in zip(keys, row) if c}
        rejected += chi_square_test(counts, null).p_value < alpha
    return rejected / replications


# --- the audit -----------------------------------------------------------------------------------------

@dataclass
class PeerRow:
    peer: str
    setting: str
    description: str
    is_control: bool
    num_samples: int
    law_tokens: int
    p_value: float  # decoded law vs the target's exact law
    mc_tv: float
    expected_mc_tv: float  # from sampling noise alone
    dof: int
    detectable_tv: float  # any bias with TV >= this (over the merged bins) is detected with POWER
    reference_biases: list[dict]  # {label, exact_tv, power}: simulated power against known biased laws
    exact_tv: float | None  # the control's exact TV to the target (None: unknown, a black box)
    p_value_vs_own_law: float | None  # the control against its own exact law
    first_iteration: dict | None  # τ vs SD's exact law (pinned settings)
    verdict: str
    flags: list[str]
    seconds: float
    pair: str = ""
    extras: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def first_iteration_check(counts: Counter, exact_iteration: dict) -> dict:
    """τ and the first iteration's outcome against an exact iteration law."""
    n = sum(counts.values())
    taus: Counter = Counter()
    for tokens, c in counts.items():
        taus[(len(tokens) - 1,)] += c
    tau_law = accepted_length_law(exact_iteration)
    mean_exact = expected_accepted_length(exact_iteration)
    variance = sum(p * (t - mean_exact) ** 2 for (t,), p in tau_law.items())
    mean = sum(t * c for (t,), c in taus.items()) / n
    z = (mean - mean_exact) / math.sqrt(variance / n) if variance > 0 else 0.0
    return {
        "L": max(t for (t,) in tau_law),
        "mean_tau": mean,
        "exact_mean_tau": mean_exact,
        "se": math.sqrt(variance / n),
        "z": z,
        "p_value_tau_law": chi_square_test(taus, tau_law).p_value,
        "p_value_outcome_law": chi_square_test(counts, exact_iteration).p_value,
        "tau_counts": {str(t): c for (t,), c in sorted(taus.items())},
        "exact_tau_law": {str(t): p for (t,), p in sorted(tau_law.items())},
    }


def first_iteration_match(first: dict) -> str:
    """Which exact SD first-iteration law the counts fit: "T", "T^2", "both" or "neither" (|z| <= Z_THRESHOLD
    on the mean accepted length and outcome-law p >= ALPHA)."""
    def fits(check: dict) -> bool:
        return abs(check["z"]) <= Z_THRESHOLD and check["p_value_outcome_law"] >= ALPHA

    at_T, at_T2 = fits(first), fits(first["draft_at_T_squared"])
    return {(True, True): "both", (True, False): "T", (False, True): "T^2", (False, False): "neither"}[at_T, at_T2]


def audit_peers(quick: bool = False, pair: PeerPair = PeerPair(), settings: Sequence[PeerSetting] | None = None,
                progress=None) -> list[PeerRow]:
    """Every peer setting on ``pair``: decoded law, power, negative control, first iteration."""
    settings = (QUICK_SETTINGS if quick else FULL_SETTINGS) if settings is None else settings
    start = time.perf_counter()
    target, draft = pair.models()
    # Contexts the exact laws read: the first law_tokens − 1 tokens (decoded laws on transformers' schedule
    # never look further) and L tokens (one iteration's drafts); the reference biases below need 2.
    depth = max(2, *(max(s.law_tokens - 1, s.draft_length or 0) for s in settings))
    T = pair.temperature
    target_lm = tabulate(target, pair.prompt, depth, T)
    draft_lm = tabulate(draft, pair.prompt, depth, T)  # the draft SD at temperature T samples from
    draft_hf_lm = tabulate(draft, pair.prompt, depth, T * T)  # what transformers' assistant samples from
    setup_seconds = time.perf_counter() - start
    truth = {n: target_law(target_lm, n) for n in {s.law_tokens for s in settings}}
    references = _reference_laws(target_lm, draft_hf_lm)
    sd_iterations: dict[tuple[int, float], dict] = {}

    def sd_iteration(L: int, draft_lm_used: TabulatedLM, temperature: float) -> dict:
        if (L, temperature) not in sd_iterations:
            sd_iterations[L, temperature] = iteration_law(get_verifier("sd"), target_lm, draft_lm_used, 1, L)
        return sd_iterations[L, temperature]

    rows = []
    for s in settings:
        samples = run_assisted_generation(target, draft, pair.prompt, s, T)
        law = truth[s.law_tokens]
        check = chi_square_test(samples.decoded, law)
        reference_biases = [
            {"label": label, "exact_tv": total_variation(ref, law),
             "power": simulated_power(ref, law, s.num_samples, seed=s.seed)}
            for label, ref in references.items() if len(next(iter(ref))) == s.law_tokens
        ]
        exact_tv = own = first = None
        if s.ensemble_weight is not None:
            control_law = scheduled_decoded_law(EnsembleVerification(s.ensemble_weight), target_lm, draft_hf_lm,
                                                s.draft_length, s.law_tokens)
            exact_tv = total_variation(control_law, law)
            own = chi_square_test(samples.decoded, control_law).p_value
        if s.draft_length is not None:
            first = _first_iteration(s, samples.first_iteration, sd_iteration(s.draft_length, draft_lm, T),
                                     sd_iteration(s.draft_length, draft_hf_lm, T * T), target_lm, draft_hf_lm)
        verdict, flags = _verdict(s, check.p_value < ALPHA, first, own)
        row = PeerRow(
            peer=PEER, setting=s.name, description=s.describe(), is_control=s.ensemble_weight is not None,
            num_samples=s.num_samples, law_tokens=s.law_tokens, p_value=check.p_value, mc_tv=check.tv,
            expected_mc_tv=check.expected_tv, dof=check.dof, detectable_tv=detectable_tv(s.num_samples, check.dof),
            reference_biases=reference_biases, exact_tv=exact_tv, p_value_vs_own_law=own, first_iteration=first,
            verdict=verdict, flags=flags, seconds=samples.seconds, pair=pair.label(),
            extras={"setup_seconds": setup_seconds, "alpha": ALPHA, "power": POWER,
                    "transformers_draft_temperature": T * T},
        )
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def _reference_laws(target_lm: TabulatedLM, draft_hf_lm: TabulatedLM) -> dict[str, dict]:
    """Known biases on the same pair and schedule (pinned L = 2, first 3 tokens), for the simulated power:
    the released GBV rule (K = 1, no carry-over) and transformers' own ensemble verification."""
    references = {"released GBV (gbv carry_over=False), L=2":
                  scheduled_decoded_law(get_verifier("gbv", carry_over=False), target_lm, draft_hf_lm, 2, 3)}
    for weight in REFERENCE_ENSEMBLE_WEIGHTS:
        references[f"ensemble w={weight:g}, L=2"] = scheduled_decoded_law(EnsembleVerification(weight), target_lm,
                                                                        draft_hf_lm, 2, 3)
    return references


def _first_iteration(s: PeerSetting, counts: Counter, sd_at_T: dict, sd_at_T_squared: dict, target_lm: TabulatedLM,
                     draft_hf_lm: TabulatedLM) -> dict:
    """The recorded first iterations against SD's exact law with the draft at T, at T^2 and (a control) against the
    control's own exact law."""
    first = first_iteration_check(counts, sd_at_T)
    squared = first_iteration_check(counts, sd_at_T_squared)
    first["draft_at_T_squared"] = {key: squared[key] for key in
                                   ("exact_mean_tau", "z", "p_value_tau_law", "p_value_outcome_law")}
    if s.ensemble_weight is not None:
        control_iteration = iteration_law(EnsembleVerification(s.ensemble_weight), target_lm, draft_hf_lm, 1,
                                          s.draft_length)
        first["control_own_law"] = {
            "exact_mean_tau": expected_accepted_length(control_iteration),
            "p_value_outcome_law": chi_square_test(counts, control_iteration).p_value,
        }
    return first


def _verdict(s: PeerSetting, detected: bool, first: dict | None, own: float | None) -> tuple[str, list[str]]:
    """A peer's verdict and flags (a negative control: whether it was rejected); sets ``first["matches"]``."""
    flags = []
    if s.ensemble_weight is None:
        verdict = "BIASED (detected)" if detected else "no bias detected"
        if detected:
            flags.append("MC detects bias vs target")
        if first is not None:
            first["matches"] = first_iteration_match(first)
            if first["matches"] == "T^2":
                flags.append("first iteration = SD with the draft at T^2, not T (temperature applied twice "
                             "to the assistant)")
            elif first["matches"] == "neither":
                flags.append("FIRST ITERATION MATCHES NO SD LAW")
    else:
        verdict = "control rejected" if detected else "CONTROL NOT REJECTED (no power)"
        if own is not None and own < ALPHA:
            flags.append("CONTROL DISAGREES WITH ITS EXACT LAW")
    return verdict, flags


__all__ = [
    "ALPHA", "EnsembleVerification", "FULL_SETTINGS", "IterationRecorder", "PEER", "POWER", "PeerPair", "PeerRow",
    "PeerSetting", "QUICK_SETTINGS", "TabulatedLM", "accepted_length_law", "audit_peers", "detectable_tv",
    "run_assisted_generation", "scheduled_decoded_law", "simulated_power", "tabulate",
    "worst_case_power",
]
