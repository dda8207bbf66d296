"""What the LP optimum needs that selection rules deciding depth by depth cannot give (docs/sbvf.md).

A *selection-then-BV* rule picks one path through the K drafts and runs block verification on it with the
path's exact law as the draft law (SBV, SBV-F's first stages, greedy multi-path BV). With the best possible path
law this family reaches the LP limit (the accepted prefix of an optimal rule, extended along any draft that
carries it, is a path whose law dominates the optimum's). ``myopic_selection_limit`` solves for the best path law
among selections that choose the token at depth d+1 from the tokens of depths <= d+1 only, seen for every draft
(the selection may use p and q everywhere and the counts, but no later token): the gap between it and the LP
is what looking at later tokens is worth.

LP: variables J_d(x^{d+1} | T_{d+1}) = P(the selected prefix is x^{d+1} | the drafts truncated to depth d+1 are
T_{d+1}), with sum_y J_d(x^d y | T_{d+1}) = J_{d-1}(x^d | T_d) for every T_{d+1} extending T_d (the choice at
depth d+1 may not look further) and J >= 0; the path law Q_sel(a) = sum_T P(T) J(a | T); and BV's accepted mass
nu(a x) <= min(Q_sel(a x), p(x|a) nu(a)); maximise sum nu (= E[tau] of BV on the selected path).
The LP enumerates ordered K-tuples of draft paths: V^(K L) of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from spectr_repro.theory.toy import ToyLM


def myopic_selection_limit(target: ToyLM, draft: ToyLM, K: int, L: int, context: Sequence[int] = ()) -> float:
    """The best E[tau] of BV on a path selected depth by depth (see the module docstring)."""
    if K < 1 or L < 1:
        raise ValueError(f"need K >= 1 and L >= 1, got K={K}, L={L}")
    context = tuple(context)
    V = target.vocab_size
    paths = list(itertools.product(range(V), repeat=L))
    tuples = list(itertools.product(paths, repeat=K))
    column: dict[tuple, int] = {}

    def col(key: tuple) -> int:
        return column.setdefault(key, len(column))

    equalities: list[tuple[dict[int, float], float]] = []
    truncations = [sorted({tuple(x[:d] for x in drafts) for drafts in tuples}) for d in range(L + 1)]
    for d in range(L):
        for seen in truncations[d + 1]:
            before = tuple(x[:d] for x in seen)
            for prefix in {x[:d] for x in seen}:
                row = {col((d, prefix + (y,), seen)): 1.0 for y in sorted({x[d] for x in seen if x[:d] == prefix})}
                if d > 0:
                    row[col((d - 1, prefix, before))] = -1.0
                equalities.append((row, 1.0 if d == 0 else 0.0))
    node_mass = _selected_node_mass(draft, context, paths, tuples, L, column)
    num_j = len(column)
    nodes = [w for n in range(1, L + 1) for w in itertools.product(range(V), repeat=n)]
    nu = {a: num_j + i for i, a in enumerate(nodes)}
    n = num_j + len(nodes)
    inequalities: list[tuple[dict[int, float], float]] = []
    for a in nodes:
        row = {nu[a]: 1.0}
        for j, w in node_mass.get(a, {}).items():
            row[j] = -w
        inequalities.append((row, 0.0))  # nu(a) <= Q_sel(a)
        p_here = float(target.probs(context + a[:-1])[a[-1]])
        if len(a) == 1:
            inequalities.append(({nu[a]: 1.0}, p_here))  # nu(x) <= p(x)
        else:
            inequalities.append(({nu[a]: 1.0, nu[a[:-1]]: -p_here}, 0.0))  # nu(a x) <= p(x|a) nu(a)

    def matrix(rows):
        r, c, v = zip(*((i, k, x) for i, (row, _) in enumerate(rows) for k, x in row.items()))
        return sparse.csr_matrix((v, (r, c)), shape=(len(rows), n))

    cost = np.zeros(n)
    cost[num_j:] = -1.0
    result = linprog(cost, A_ub=matrix(inequalities), b_ub=[b for _, b in inequalities],
                     A_eq=matrix(equalities), b_eq=[b for _, b in equalities], bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"myopic-selection LP (V={V}, L={L}, K={K}) not solved: {result.message}")
    return float(-result.fun)


def _selected_node_mass(draft: ToyLM, context: tuple[int, ...], paths: list[tuple[int, ...]], tuples: list[tuple],
                        L: int, column: dict[tuple, int]) -> dict[tuple[int, ...], dict[int, float]]:
    """Path-law masses: Q_sel(a) = sum over tuples of P(tuple) J(a | the tuple truncated to depth |a|), as
    {node a: {column of J: coefficient}}."""
    draft_prob = {x: draft.sequence_prob(context, x) for x in paths}
    node_mass: dict[tuple[int, ...], dict[int, float]] = {}
    for drafts in tuples:
        weight = float(np.prod([draft_prob[x] for x in drafts]))
        for d in range(L):
            seen = tuple(x[:d + 1] for x in drafts)
            for node in set(seen):
                j = column[(d, node, seen)]
                node_mass.setdefault(node, {})
                node_mass[node][j] = node_mass[node].get(j, 0.0) + weight
    return node_mass
