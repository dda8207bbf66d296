"""The rules' fingerprint: one short hash per registered rule of the values it gives on fixed synthetic blocks.

Committed replays accumulate over many sessions and commits. A prompt replayed by one version of a rule must never
be pooled with a prompt replayed by another, so every finished prompt records the fingerprint of each rule it
evaluated (``done.json``: ``rules_fingerprint``), and the report pools, rule by rule, only the prompts that share it.

What is hashed, per rule (float64, seeded, on toy models of ``theory.toy`` whose conditionals depend on the whole
context, so a rule that is only right for context-free laws cannot hide):

* its exact outcome law (``Verifier.law``) on three toy pairs at K in {1, 2} (1 for single-draft rules), L in {1, 2}:
  every outcome's tokens and probability;
* what the replay records for it on one synthetic 4 x 3 block (``replay.core.block_estimates``, as the grid runs it:
  exact values where the rule has them, its sampler's seeded draws where it is sampled), at every K and L.

Values are rounded to 10 significant digits before hashing, so a refactor that moves only the last bits keeps the
fingerprint, and any change of a value (a new acceptance ratio, a different use of the draws) changes it. Adding a
rule changes no other rule's fingerprint. ``FINGERPRINT_VERSION`` changes when what is hashed changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

import torch

from spectr_repro.environment import environment
from spectr_repro.replay.core import block_estimates
from spectr_repro.theory.toy import block_tensors, sample_drafts, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier

FINGERPRINT_VERSION = 1
SIGNIFICANT_DIGITS = 10
LAW_TOYS = ((3, 0), (3, 1), (4, 2))  # (vocabulary, seed) of the toy pairs whose exact laws are hashed
LAW_SHAPES = ((1, 1), (1, 2), (2, 1), (2, 2))  # (K, L)
BLOCK_SHAPE = (4, 3)  # (K_max, L_max) of the synthetic block replayed
BLOCK_VOCABULARY, BLOCK_SEED, BLOCK_DRAWS = 6, 7, 8


def _rounded(value: float) -> str:
    return f"{float(value):.{SIGNIFICANT_DIGITS - 1}e}"


def _toy_block(vocab_size: int, seed: int, K: int, L: int):
    """(draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L + 1, V]) drafted from a seeded toy pair."""
    target, draft = toy_pair(vocab_size, seed)
    generator = torch.Generator().manual_seed(1_000 * seed + 10 * K + L)
    tokens = sample_drafts(draft, (), K, L, generator)
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    return tokens, draft_probs, target_probs


def _law_values(method: str) -> list[Any]:
    """The rule's exact outcome law on the toys, as sorted (tokens, rounded probability) atoms per toy and shape."""
    verifier = get_verifier(method)
    shapes = [(K, L) for K, L in LAW_SHAPES if K == 1 or not VERIFIERS[method].single_draft]
    values = []
    for vocab_size, seed in LAW_TOYS:
        for K, L in shapes:
            atoms: dict[tuple[int, ...], float] = {}
            for outcome in verifier.law(*_toy_block(vocab_size, seed, K, L)):
                atoms[outcome.tokens] = atoms.get(outcome.tokens, 0.0) + outcome.probability
            values.append([vocab_size, seed, K, L, sorted((list(t), _rounded(p)) for t, p in atoms.items())])
    return values


@cache
def _replayed_values(methods: tuple[str, ...], sampled: tuple[str, ...]) -> dict[str, list[Any]]:
    """What the replay records for each rule on the synthetic block: (K, L, rounded tokens, estimator, draws)."""
    K_max, L_max = BLOCK_SHAPE
    block = _toy_block(BLOCK_VOCABULARY, BLOCK_SEED, K_max, L_max)
    estimates = block_estimates(*block, methods=methods, K_values=range(1, K_max + 1), L_values=range(1, L_max + 1),
                                draws=BLOCK_DRAWS, generator=torch.Generator().manual_seed(BLOCK_SEED),
                                sampled=[m for m in sampled if m in methods])
    values: dict[str, list[Any]] = {method: [] for method in methods}
    for estimate in estimates:
        values[estimate.method].append([estimate.K, estimate.L, _rounded(estimate.tokens), estimate.estimator,
                                        estimate.draws])
    return values


def rule_fingerprint(method: str, sampled: Sequence[str] = ()) -> str:
    """The fingerprint of one registered rule (12 hex digits); ``sampled``: the rules the replay takes by their
    sampler's draws (``replay.sampled``), which changes what it records for them."""
    return rules_fingerprint([method], sampled)[method]


def rules_fingerprint(methods: Iterable[str] | None = None, sampled: Sequence[str] = ()) -> dict[str, str]:
    """{rule: fingerprint} of ``methods`` (default every registered rule), in the registry's order."""
    methods = tuple(VERIFIERS if methods is None else methods)
    unknown = [m for m in methods if m not in VERIFIERS]
    if unknown:
        raise ValueError(f"not registered rules: {', '.join(unknown)}")
    is_sampled = tuple(sorted(set(sampled)))
    replayed = _replayed_values(methods, is_sampled)
    fingerprints = {}
    for method in methods:
        content = {"version": FINGERPRINT_VERSION, "method": method, "sampled": method in is_sampled,
                   "law": _law_values(method), "replayed": replayed[method]}
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        fingerprints[method] = digest[:12]
    return fingerprints


def provenance(methods: Sequence[str], sampled: Sequence[str], device: str, dtype: str) -> dict[str, Any]:
    """What each finished prompt's done.json records of how it was replayed: the environment (device and its model,
    the models' dtype, library versions, threads, commit) and the fingerprint of every rule it evaluated (the report
    pools prompts rule by rule on it; the spot check compares it and re-runs in the recorded dtype)."""
    return {"environment": {**environment(device), "dtype": dtype},
            "rules_fingerprint": dict(_cached_fingerprint(tuple(methods), tuple(sampled)))}


@cache
def _cached_fingerprint(methods: tuple[str, ...], sampled: tuple[str, ...]) -> dict[str, str]:
    """One computation per process: the replay records it for every batch, the rules do not change meanwhile."""
    return rules_fingerprint(methods, sampled)


__all__ = ["FINGERPRINT_VERSION", "provenance", "rule_fingerprint", "rules_fingerprint"]
