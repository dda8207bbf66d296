"""The physical limit: the best E[tau] of ANY valid verifier used as is, as a linear program.

Variables (docs/methods.md, "The physical limit"): pi(o | D), the law of the output o given the draft tuple D
(o extends a prefix of some draft in D by one token), and R(w) for every sequence w of length 1..L+1.
Constraints: sum_o pi(o | D) = 1; R(w x) = R(w) p(x | w) - sum_D q(D) pi(w x | D) with R(empty) = 1;
R >= 0; R = 0 at length L+1. Objective: maximise sum_D q(D) sum_o pi(o | D) (|o| - 1).

Two exact reductions keep it small, neither changes the optimum:
1. Joint masses y(o, D) = q(D) pi(o | D) replace pi (better scaled; sum_o y(o, D) = q(D)).
2. D ranges over SETS of distinct draft sequences instead of ordered K-tuples. Which outputs are allowed
   depends only on the set, and the constraints only on M(o) = sum_D y(o, D); averaging an optimal pi over
   all tuples with the same set (weights q) is feasible with the same M, hence optimal. The weight of a set
   S is P({X_1, ..., X_K} = S) for i.i.d. draws, a sum over the ways to spread K draws over S.

Solved with scipy's HiGHS. Sizes on 2 CPU cores (see THEORY.md for the measured times): V=3, L=2, K <= 4 and
V=2, L=3, K <= 4 in well under a second; V=3, L=3, K=3 (3,303 sets, ~10^5 variables) in seconds;
V=3, L=3, K=4 (20,853 sets) and V=4, L=3, K=3 take tens of seconds to minutes.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from spectr_repro.toy import ToyLM


@dataclass(frozen=True)
class LPResult:
    value: float  # optimal E[tau] over all valid rules used as is
    law: dict[tuple[int, ...], float] = field(repr=False)  # M(o) of an optimal rule
    num_draft_sets: int
    num_variables: int
    num_constraints: int
    seconds: float
    message: str


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """All (c_1..c_parts), c_j >= 1, summing to ``total``."""
    return [
        tuple(b - a for a, b in zip((0, *cuts), (*cuts, total)))
        for cuts in itertools.combinations(range(1, total), parts - 1)
    ]


def draft_set_weights(sequence_probs: np.ndarray, K: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Every set S of 1..K distinct sequence indices with P(set of K i.i.d. draws = S) > 0.

    sequence_probs: [N] draft probabilities of the N sequences. Returns (sets, weights [len(sets)]);
    the weights sum to 1.
    """
    support = np.flatnonzero(sequence_probs > 0)
    sets: list[tuple[int, ...]] = []
    weights: list[np.ndarray] = []
    for size in range(1, min(K, len(support)) + 1):
        combos = np.array(list(itertools.combinations(support, size)), dtype=np.int64).reshape(-1, size)
        probs = sequence_probs[combos]  # [m, size]
        weight = np.zeros(len(combos))
        for counts in _compositions(K, size):
            coefficient = math.factorial(K) / math.prod(math.factorial(c) for c in counts)
            weight += coefficient * np.prod(probs ** np.array(counts), axis=1)
        sets.extend(tuple(int(i) for i in row) for row in combos)
        weights.append(weight)
    return sets, np.concatenate(weights)


def optimal_expected_accepted(target: ToyLM, draft: ToyLM, K: int, L: int, context: Sequence[int] = (),
                              time_limit: float | None = None) -> LPResult:
    """Solve the LP; raises RuntimeError if HiGHS does not reach optimality."""
    if K < 1 or L < 1:
        raise ValueError(f"need K >= 1 and L >= 1, got K={K}, L={L}")
    start = time.perf_counter()
    context = tuple(context)
    V = target.vocab_size
    # Sequences of length n are coded base V (first token most significant); global index offset[n] + code.
    offset = np.zeros(L + 3, dtype=np.int64)
    for n in range(1, L + 2):
        offset[n + 1] = offset[n] + V ** n
    num_sequences = int(offset[L + 2] - offset[1])

    def decode(n: int, code: int) -> tuple[int, ...]:
        return tuple((code // V ** (n - 1 - j)) % V for j in range(n))

    # Conditionals p(. | w) and the draft law of the length-L sequences.
    target_cond = {n: np.stack([target.probs(context + decode(n, c)).numpy() for c in range(V ** n)])
                   for n in range(L + 1)}
    draft_cond = {n: np.stack([draft.probs(context + decode(n, c)).numpy() for c in range(V ** n)])
                  for n in range(L)}
    draft_seq = np.ones(1)
    for n in range(L):
        draft_seq = (draft_seq[:, None] * draft_cond[n]).reshape(-1)
    sets, weights = draft_set_weights(draft_seq, K)

    # y variables: for each set, its distinct prefixes (length 0..L) times V next tokens.
    y_set, y_seq = [], []
    tokens = np.arange(V)
    for s, members in enumerate(sets):
        members_arr = np.array(members)
        for t in range(L + 1):
            for prefix_code in np.unique(members_arr // V ** (L - t)):
                y_set.append(np.full(V, s))
                y_seq.append(offset[t + 1] + prefix_code * V + tokens)
    y_set = np.concatenate(y_set)
    y_seq = np.concatenate(y_seq)
    num_y = len(y_set)
    lengths = np.searchsorted(offset[1:], y_seq, side="right")  # |o| for each y variable

    # Equality constraints: rows [0, S) normalise each set; rows S + g define R at sequence g.
    num_sets = len(sets)
    rows = [y_set, num_sets + (y_seq - offset[1])]
    cols = [np.arange(num_y), np.arange(num_y)]
    vals = [np.ones(num_y), np.ones(num_y)]
    b_eq = np.concatenate([weights, np.zeros(num_sequences)])
    for n in range(1, L + 2):
        codes = np.arange(V ** n)
        g = offset[n] + codes - offset[1]  # local index of sequences of length n
        rows.append(num_sets + g)
        cols.append(num_y + g)
        vals.append(np.ones(len(codes)))
        cond = target_cond[n - 1][codes // V, codes % V]  # p(x | parent)
        if n == 1:
            b_eq[num_sets + g] = cond
        else:
            parent = offset[n - 1] + codes // V - offset[1]
            rows.append(num_sets + g)
            cols.append(num_y + parent)
            vals.append(-cond)
    A_eq = sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(num_sets + num_sequences, num_y + num_sequences),
    )
    cost = np.concatenate([-(lengths - 1).astype(float), np.zeros(num_sequences)])
    terminal = np.arange(num_sequences) >= offset[L + 1] - offset[1]
    upper = np.concatenate([np.full(num_y, np.inf), np.where(terminal, 0.0, np.inf)])
    bounds = np.stack([np.zeros(num_y + num_sequences), upper], axis=1)
    # Tiny set weights (products of K sequence probabilities) make HiGHS's presolve fragile: on some
    # toys it declares this always-feasible LP (SD is a feasible point) infeasible. Retry without presolve.
    attempts = [{"presolve": True}, {"presolve": False}]
    for attempt in attempts:
        options = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10, **attempt}
        if time_limit is not None:
            options["time_limit"] = float(time_limit)
        result = linprog(cost, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs", options=options)
        if result.status == 0:
            break
    else:
        raise RuntimeError(f"LP (V={V}, L={L}, K={K}) not solved: {result.message}")
    masses = np.zeros(num_sequences)
    np.add.at(masses, y_seq - offset[1], result.x[:num_y])
    law = {}
    for n in range(1, L + 2):
        for code in range(V ** n):
            mass = float(masses[offset[n] + code - offset[1]])
            if mass > 0:
                law[decode(n, code)] = mass
    return LPResult(
        value=float(-result.fun), law=law, num_draft_sets=num_sets, num_variables=A_eq.shape[1],
        num_constraints=A_eq.shape[0], seconds=time.perf_counter() - start, message=str(result.message),
    )
