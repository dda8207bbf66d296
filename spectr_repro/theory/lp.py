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

from spectr_repro.theory.toy import ToyLM


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
    coding = _SequenceCoding(target.vocab_size, L)
    target_cond, draft_seq = _laws(target, draft, tuple(context), coding)
    sets, weights = draft_set_weights(draft_seq, K)
    y_set, y_seq = _output_variables(sets, coding)
    A_eq, b_eq = _equalities(y_set, y_seq, weights, target_cond, coding)
    num_y, num_sequences = len(y_set), coding.num_sequences
    lengths = np.searchsorted(coding.offset[1:], y_seq, side="right")  # |o| for each y variable
    cost = np.concatenate([-(lengths - 1).astype(float), np.zeros(num_sequences)])
    terminal = np.arange(num_sequences) >= coding.offset[L + 1] - coding.offset[1]
    upper = np.concatenate([np.full(num_y, np.inf), np.where(terminal, 0.0, np.inf)])
    bounds = np.stack([np.zeros(num_y + num_sequences), upper], axis=1)
    result = _solve(cost, A_eq, b_eq, bounds, time_limit, f"LP (V={coding.V}, L={L}, K={K})")
    masses = np.zeros(num_sequences)
    np.add.at(masses, y_seq - coding.offset[1], result.x[:num_y])
    law = {}
    for n in range(1, L + 2):
        for code in range(coding.V ** n):
            mass = float(masses[coding.offset[n] + code - coding.offset[1]])
            if mass > 0:
                law[coding.decode(n, code)] = mass
    return LPResult(
        value=float(-result.fun), law=law, num_draft_sets=len(sets), num_variables=A_eq.shape[1],
        num_constraints=A_eq.shape[0], seconds=time.perf_counter() - start, message=str(result.message),
    )


class _SequenceCoding:
    """Sequences of length n = 1..L+1 coded base V (first token most significant); global index offset[n] + code."""

    def __init__(self, V: int, L: int) -> None:
        self.V, self.L = V, L
        self.offset = np.zeros(L + 3, dtype=np.int64)
        for n in range(1, L + 2):
            self.offset[n + 1] = self.offset[n] + V ** n
        self.num_sequences = int(self.offset[L + 2] - self.offset[1])

    def decode(self, n: int, code: int) -> tuple[int, ...]:
        return tuple((code // self.V ** (n - 1 - j)) % self.V for j in range(n))


def _laws(target: ToyLM, draft: ToyLM, context: tuple[int, ...], coding: _SequenceCoding):
    """The target's conditionals p(. | w) for |w| <= L ({n: [V^n, V]}) and the draft law of the length-L sequences."""
    V, L, decode = coding.V, coding.L, coding.decode
    target_cond = {n: np.stack([target.probs(context + decode(n, c)).numpy() for c in range(V ** n)])
                   for n in range(L + 1)}
    draft_cond = {n: np.stack([draft.probs(context + decode(n, c)).numpy() for c in range(V ** n)])
                  for n in range(L)}
    draft_seq = np.ones(1)
    for n in range(L):
        draft_seq = (draft_seq[:, None] * draft_cond[n]).reshape(-1)
    return target_cond, draft_seq


def _output_variables(sets: list[tuple[int, ...]], coding: _SequenceCoding) -> tuple[np.ndarray, np.ndarray]:
    """The y variables: for each set, its distinct prefixes (length 0..L) times V next tokens, as (set, sequence)."""
    V, L = coding.V, coding.L
    y_set, y_seq = [], []
    tokens = np.arange(V)
    for s, members in enumerate(sets):
        members_arr = np.array(members)
        for t in range(L + 1):
            for prefix_code in np.unique(members_arr // V ** (L - t)):
                y_set.append(np.full(V, s))
                y_seq.append(coding.offset[t + 1] + prefix_code * V + tokens)
    return np.concatenate(y_set), np.concatenate(y_seq)


def _equalities(y_set, y_seq, weights, target_cond, coding: _SequenceCoding):
    """Rows [0, S) normalise each set (sum_o y(o, D) = q(D)); rows S + g define R at sequence g."""
    V, L, offset = coding.V, coding.L, coding.offset
    num_y, num_sets, num_sequences = len(y_set), len(weights), coding.num_sequences
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
    return A_eq, b_eq


def _solve(cost, A_eq, b_eq, bounds, time_limit: float | None, name: str):
    """HiGHS, with presolve and then without: tiny set weights (products of K sequence probabilities) make its
    presolve fragile, on some toys it declares this always-feasible LP (SD is a feasible point) infeasible."""
    attempts = [{"presolve": True}, {"presolve": False}]
    for attempt in attempts:
        options = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10, **attempt}
        if time_limit is not None:
            options["time_limit"] = float(time_limit)
        result = linprog(cost, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs", options=options)
        if result.status == 0:
            return result
    raise RuntimeError(f"{name} not solved: {result.message}")


# ------------------------------------------------------------------------------------------------------------
# The same limit from a much smaller LP over the nodes of the draft tree (docs/sbvf.md, "The limit as a node LP").
#
# A rule used as is outputs A + one token, A = its accepted prefix. Let nu(a) = P(A extends a) (= R(a) of the
# validity recursion). Validity is M(a x) = nu(a) p(x|a) - nu(a x) >= 0 (and M = nu p at depth L: the bonus),
# and E[tau] = sum_{1 <= |a| <= L} nu(a). A law of A can be produced from the drafts iff it is a selection of
# the random set T of prefixes of the K drafts, which by Hall's / Artstein's theorem means mu(F) <= P(T meets F)
# for every set F of nodes; it suffices to take F up-closed, F = the subtrees of an antichain B, where it reads
# nu(B) <= 1 - (1 - Q(B))^K (Q = the draft's joint probability). Hence
#     maximise sum nu  s.t.  nu(x) <= p(x), nu(a x) <= p(x|a) nu(a), nu(B) <= 1 - (1 - Q(B))^K for antichains B,
# an LP with one variable per node. The antichain constraints are generated as cuts. Separation is exact: the
# most violated B maximises nu(B) - lambda Q(B) at lambda = g'(Q(B)) (g(s) = 1 - (1 - s)^K is concave), so it
# is among the maximisers of the parametric tree DP max_B sum_{a in B} (nu(a) - lambda Q(a)) over lambda in
# [0, K], whose breakpoints are enumerated exactly (Eisner-Severance).


@dataclass(frozen=True)
class NodeLPResult:
    value: float  # optimal E[tau] over all valid rules used as is (equals optimal_expected_accepted's)
    nu: dict[tuple[int, ...], float] = field(repr=False)  # nu(a) = P(accepted prefix extends a) of an optimum
    law: dict[tuple[int, ...], float] = field(repr=False)  # its M(o): M(a x) = nu(a) p(x|a) - nu(a x)
    num_nodes: int
    num_cuts: int  # antichain constraints generated
    seconds: float
    message: str


class _NodeTree:
    """Nodes of depth 1..L coded base V per depth; conditionals p(.|a) for |a| <= L, joint draft masses Q(a)."""

    def __init__(self, target: ToyLM, draft: ToyLM, L: int, context: tuple[int, ...]) -> None:
        V = target.vocab_size
        self.V, self.L = V, L
        decode = lambda n, code: tuple((code // V ** (n - 1 - j)) % V for j in range(n))  # noqa: E731
        self.decode = decode
        self.p = [np.stack([target.probs(context + decode(n, c)).numpy() for c in range(V ** n)]) for n in range(L + 1)]
        q = [np.stack([draft.probs(context + decode(n, c)).numpy() for c in range(V ** n)]) for n in range(L)]
        self.Q = [np.ones(1)]
        for n in range(L):
            self.Q.append((self.Q[-1][:, None] * q[n]).reshape(-1))
        self.offset = np.cumsum([0] + [V ** n for n in range(1, L + 1)])  # variable index of depth n starts here
        self.num_nodes = int(self.offset[-1])

    def depth_slices(self, values: np.ndarray) -> list[np.ndarray]:
        return [values[self.offset[n - 1]:self.offset[n]] for n in range(1, self.L + 1)]

    def best_antichain(self, weight: np.ndarray) -> tuple[float, np.ndarray]:
        """max over antichains B (nodes of depth 1..L, possibly empty) of sum_B weight, and B as a 0/1 vector."""
        per_depth = self.depth_slices(weight)
        best = [None] * (self.L + 1)
        take = [None] * (self.L + 1)
        best[self.L] = per_depth[self.L - 1]
        take[self.L] = np.ones_like(best[self.L], dtype=bool)
        for n in range(self.L - 1, 0, -1):
            below = np.maximum(best[n + 1], 0.0).reshape(-1, self.V).sum(-1)
            take[n] = per_depth[n - 1] >= below
            best[n] = np.where(take[n], per_depth[n - 1], below)
        chosen = np.zeros(self.num_nodes, dtype=bool)
        active = best[1] > 0  # subtrees worth entering at depth 1
        for n in range(1, self.L + 1):
            here = active & take[n]
            chosen[self.offset[n - 1]:self.offset[n]] = here
            if n < self.L:
                active = np.repeat(active & ~take[n], self.V) & (best[n + 1] > 0)
        return float(np.maximum(best[1], 0.0).sum()), chosen


def optimal_expected_accepted_nodes(target: ToyLM, draft: ToyLM, K: int, L: int, context: Sequence[int] = (),
                                    tolerance: float = 1e-11, max_rounds: int = 1000) -> NodeLPResult:
    """The LP limit of ``optimal_expected_accepted`` from the node formulation (see the comment above).

    One variable per node of depth 1..L (V + ... + V^L), the antichain constraints added as cuts until none is
    violated by more than ``tolerance``. V=4, L=3, K=3 takes seconds (the draft-set LP: minutes).
    """
    if K < 1 or L < 1:
        raise ValueError(f"need K >= 1 and L >= 1, got K={K}, L={L}")
    start = time.perf_counter()
    tree = _NodeTree(target, draft, L, tuple(context))
    V, n = tree.V, tree.num_nodes
    Q_all = np.concatenate(tree.Q[1:])
    capacity = lambda s: 1.0 - (1.0 - min(s, 1.0)) ** K  # noqa: E731
    tree_matrix, tree_rhs = _tree_constraints(tree)
    cuts: list[np.ndarray] = [np.eye(1, n, i, dtype=bool)[0] for i in range(n)]  # singletons
    seen = {c.tobytes() for c in cuts}
    message = ""
    for _ in range(max_rounds):
        cut_matrix = sparse.csr_matrix(np.stack(cuts).astype(float))
        A = sparse.vstack([tree_matrix, cut_matrix])
        b = np.concatenate([tree_rhs, [capacity(float(Q_all[c].sum())) for c in cuts]])
        result = linprog(-np.ones(n), A_ub=A, b_ub=b, bounds=(0, None), method="highs",
                         options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
        if result.status != 0:
            raise RuntimeError(f"node LP (V={V}, L={L}, K={K}) not solved: {result.message}")
        nu = result.x
        new = []
        for chosen in _antichain_candidates(tree, nu, Q_all, K):
            violation = nu[chosen].sum() - capacity(float(Q_all[chosen].sum()))
            if violation > tolerance and chosen.tobytes() not in seen:
                seen.add(chosen.tobytes())
                new.append(chosen)
        if not new:
            message = str(result.message)
            break
        cuts.extend(new)
    else:
        raise RuntimeError(f"node LP (V={V}, L={L}, K={K}): no convergence in {max_rounds} rounds")
    nu_map, law = _nu_and_law(tree, nu)
    return NodeLPResult(value=float(nu.sum()), nu=nu_map, law=law, num_nodes=n, num_cuts=len(cuts) - n,
                        seconds=time.perf_counter() - start, message=message)


def _tree_constraints(tree: _NodeTree) -> tuple[sparse.csr_matrix, np.ndarray]:
    """nu(a x) - p(x|a) nu(a) <= 0 (depth 1: nu(x) <= p(x)), one row per node: (matrix, right-hand side)."""
    V, L, n = tree.V, tree.L, tree.num_nodes
    rows, cols, vals, rhs = [np.arange(n)], [np.arange(n)], [np.ones(n)], [np.zeros(n)]
    rhs[0][: V] = tree.p[0][0]
    for depth in range(2, L + 1):
        child = np.arange(tree.offset[depth - 1], tree.offset[depth])
        parent = tree.offset[depth - 2] + (child - tree.offset[depth - 1]) // V
        rows.append(child)
        cols.append(parent)
        vals.append(-tree.p[depth - 1].reshape(-1))
    matrix = sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return matrix, np.concatenate(rhs)


def _nu_and_law(tree: _NodeTree, nu: np.ndarray) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float]]:
    """nu by node (the root: 1) and the law M(a x) = nu(a) p(x|a) - nu(a x) of the outputs it implies."""
    V, L = tree.V, tree.L
    nu_map = {(): 1.0}
    law: dict[tuple[int, ...], float] = {}
    for depth in range(1, L + 1):
        for code in range(V ** depth):
            nu_map[tree.decode(depth, code)] = float(nu[tree.offset[depth - 1] + code])
    for depth in range(0, L + 1):
        for code in range(V ** depth):
            a = tree.decode(depth, code)
            for x in range(V):
                mass = nu_map[a] * float(tree.p[depth][code, x]) - (nu_map[a + (x,)] if depth < L else 0.0)
                if mass > 0:
                    law[a + (x,)] = mass
    return nu_map, law


def _antichain_candidates(tree: _NodeTree, nu: np.ndarray, Q_all: np.ndarray, K: int) -> list[np.ndarray]:
    """The maximisers of sum_B (nu - lambda Q) over antichains B at every breakpoint piece of lambda in [0, K]:
    among them is the antichain maximising nu(B) - (1 - (1 - Q(B))^K) (exact separation)."""
    found: dict[bytes, np.ndarray] = {}

    def solve(lam: float) -> np.ndarray:
        _, chosen = tree.best_antichain(nu - lam * Q_all)
        found.setdefault(chosen.tobytes(), chosen)
        return chosen

    def line(chosen: np.ndarray) -> tuple[float, float]:
        return float(nu[chosen].sum()), float(Q_all[chosen].sum())  # value nu(B) - lambda Q(B)

    def refine(lo: float, hi: float, b_lo: np.ndarray, b_hi: np.ndarray, depth: int = 0) -> None:
        (n1, q1), (n2, q2) = line(b_lo), line(b_hi)
        if depth > 60 or abs(q1 - q2) < 1e-15:
            return
        lam = (n1 - n2) / (q1 - q2)  # where the two lines cross
        if not lo < lam < hi:
            return
        b_mid = solve(lam)
        n3, q3 = line(b_mid)
        if n3 - lam * q3 > n1 - lam * q1 + 1e-13:  # a third piece lies above the crossing
            refine(lo, lam, b_lo, b_mid, depth + 1)
            refine(lam, hi, b_mid, b_hi, depth + 1)

    refine(0.0, float(K), solve(0.0), solve(float(K)))
    return list(found.values())
