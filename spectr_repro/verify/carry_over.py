"""The carry-over target that makes greedy block verification (GBV) exactly lossless.

GBV's correction norm((P(x^τ)·p − Q(x^τ)·q)₊) uses the *unclipped* joint ratio P/Q, so one iteration
alone does not reproduce the target law. It does once later tokens are drawn from, and verified
against, a modified target: after an iteration that started at absolute position a and ended with a
correction, every token at position a+m with m ≤ L is governed by

    p′(z | v) ∝ (P(v)·T(z | v) − Q(v)·q(z | v))₊

where v = the m−1 tokens emitted since position a, T = the effective target that iteration used,
P(v) = the product of T along v and Q(v) = the product of the draft q along v. Beyond that horizon the
previous effective target applies; when several such *frames* are alive they compose, oldest first
(an older frame always expires before a newer one). The form is our reconstruction of the paper's
"Algorithm 2", checked by exact enumeration in tests/verify/test_gbv.py.

The frame target depends on P(v) and Q(v) only through their ratio, so a frame stores log P − log Q
(float64, may be ±inf), the number of rows it still governs, and the power K of the residual form:
    power 1:  (P·T − Q·q)₊                              (GBV)
    power K:  P·T·(1 − min(1, Q·q / (P·T))^K)           (the released SpecTr-GBV correction at K drafts;
                                                         equal to the power-1 form at K = 1)
    power K, ``coupling``:  P·T·(1 − min(1, Q·q / (P·T)))^K   (the target mass the paper's conditionally
                                                         independent coupling leaves at each token: the
                                                         decomposition of docs/theory.md; also = power 1 at K = 1)

State is a small frozen dataclass so that callers (the engine, the exact-law kit) can hash and thread
it without knowing what is inside; ``None`` means "no frame alive: the next target is plain p".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectr_repro.verify.common import normalize


@dataclass(frozen=True)
class CarryFrame:
    """One modification of the target left by an iteration that ended with a correction."""

    log_ratio: float  # log P(v) − log Q(v) over the tokens v emitted since that iteration began
    remaining: int  # how many more tokens (rows) this frame governs
    power: int = 1  # residual form, see the module docstring
    coupling: bool = False  # power K in the coupling form (1 − c)^K instead of the release's 1 − c^K


@dataclass(frozen=True)
class CarryOverState:
    frames: tuple[CarryFrame, ...]  # oldest first


def resolve_frames(state, L: int, name: str, carry_over: bool) -> tuple:
    """The frames a rule applies: the checked ``state`` with carry-over on; none without (a state is then an error)."""
    if carry_over:
        return check_state(state, L, name)
    if state is not None:
        raise ValueError(f"{name}: carry_over=False takes no state, got {type(state).__name__}")
    return ()


def check_state(state, L: int, name: str) -> tuple[CarryFrame, ...]:
    """The frames of ``state`` (``None`` = none), or ValueError if it cannot belong to this block."""
    if state is None:
        return ()
    if not isinstance(state, CarryOverState):
        raise ValueError(f"{name}: state must be None or the CarryOverState returned by the previous call, "
                         f"got {type(state).__name__}")
    for frame in state.frames:
        # Rows 0..L-1 have a draft row q; the bonus row L does not, so a frame may not reach it.
        if not 1 <= frame.remaining <= L:
            raise ValueError(f"{name}: carry-over state governs {frame.remaining} more tokens but this block "
                             f"has L={L} draft positions; keep L fixed across iterations")
    return state.frames


def residual_weights(prev: torch.Tensor, draft: torch.Tensor, log_ratio: torch.Tensor,
                     power: int, coupling: bool = False) -> torch.Tensor:
    """Unnormalised frame target: prev, draft [..., V]; log_ratio [...] = log P − log Q (float64).

    Computed in the rows' dtype (float32 in the engine): only the per-row coefficients come from the
    float64 log ratio. Scaled by 1/max(P, Q) so that tiny products never underflow; a frame only ever
    gets normalised. In float32 a coefficient below ~1e-38 rounds to 0; that needs P/Q (or Q/P) < 1e-38,
    and an iteration ends with such a correction with probability about P/Q itself (h ≤ g), so the law
    moves by that much at most.
    """
    dtype = prev.dtype if prev.dtype == draft.dtype else torch.promote_types(prev.dtype, draft.dtype)
    log_ratio = log_ratio.unsqueeze(-1)
    if power == 1:
        # (P·T − Q·q)₊ / max(P, Q) = (min(1, r)·T − min(1, 1/r)·q)₊ with r = P/Q: two fused passes.
        # r = NaN (P = Q = 0 along a probability-0 history: inf − inf in log space) gives no mass at all.
        scale_target, scale_draft = torch.stack([log_ratio, -log_ratio]).clamp_(max=0).exp_().nan_to_num_(0.0).to(
            dtype)
        return torch.mul(prev, scale_target).addcmul_(draft, scale_draft, value=-1).clamp_(min=0)
    # P·T·(1 − min(1, q / (r·T))^K) / P; T = 0 gives 0, r = +inf gives T, r = 0 gives 0.
    tiny = torch.finfo(prev.dtype).tiny
    ratio = torch.mul(draft, torch.exp(-log_ratio).to(dtype)).div_(prev.clamp_min(tiny))
    ratio = torch.where(prev > 0, ratio, torch.ones((), dtype=dtype, device=prev.device))
    ratio = ratio.clamp_(max=1).nan_to_num_(1.0)
    if coupling:
        return prev * integer_power(1 - ratio, power)
    return prev * (1 - integer_power(ratio, power))


def integer_power(base: torch.Tensor, exponent: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """base ** exponent (exponent >= 1) by square-and-multiply: ~log2(exponent) full passes, not pow's
    exp/log per element. ``base`` is left untouched; ``out`` (same shape) is used when given."""
    if exponent < 1:
        raise ValueError(f"exponent must be >= 1, got {exponent}")
    if exponent == 1:
        return base
    bits = bin(exponent)[3:]  # left-to-right binary exponentiation after the leading 1
    result = torch.mul(base, base, out=out) if out is not None else base * base
    if bits[0] == "1":
        result.mul_(base)
    for bit in bits[1:]:
        result.mul_(result)
        if bit == "1":
            result.mul_(base)
    return result


def frame_chain(base: torch.Tensor, draft: torch.Tensor, log_ratios: list[torch.Tensor],
                powers: list[int], couplings: list[bool] | None = None) -> list[torch.Tensor]:
    """Targets T_0 = base, T_f = frame f applied to T_{f−1}, for the frames alive at one row.

    base, draft: [..., V]; log_ratios: one [...] float64 tensor per frame (oldest first).
    """
    chain = [base]
    couplings = couplings if couplings is not None else [False] * len(powers)
    for log_ratio, power, coupling in zip(log_ratios, powers, couplings):
        chain.append(apply_frame(chain[-1], draft, log_ratio, power, coupling))
    return chain


def apply_frame(prev: torch.Tensor, draft: torch.Tensor, log_ratio: torch.Tensor, power: int,
                coupling: bool = False) -> torch.Tensor:
    """norm(frame residual of ``prev``) [..., V]; a row whose residual has no mass (a probability-0 history)
    keeps ``prev``. On the device, no host read: the fallback is arithmetic on the totals, not a branch."""
    return normalize(residual_weights(prev, draft, log_ratio, power, coupling), fallback=prev)


@dataclass
class EffectiveTargets:
    """Effective target of every draft row and position, plus what is needed to advance the state.

    Frames only reach rows 0..H−1 (H = the longest frame's remaining count, < L+1), so only those rows
    are materialised (``head``); later rows are the caller's ``raw`` target rows, never copied.

    raw: [K, L+1, V] the input target_probs; head: [K, H, V] the effective rows 0..H−1 (None when no
    frame is alive); token_target, token_draft: [K, L] float64, effective target / draft probability of
    each draft token; log_ratios: [F, K, L+1] float64, frame f's log P − log Q over the draft's first i
    tokens (column i, for i up to the frame's remaining count); frames: the frames alive at the start of
    the block (oldest first).
    """

    raw: torch.Tensor
    head: torch.Tensor | None
    token_target: torch.Tensor
    token_draft: torch.Tensor
    log_ratios: torch.Tensor
    frames: tuple[CarryFrame, ...]

    @property
    def horizon(self) -> int:
        return 0 if self.head is None else self.head.shape[1]

    def row(self, k: int, i: int) -> torch.Tensor:
        """Effective target [V] of draft k after its first i tokens (a view, never to be modified)."""
        return self.head[k, i] if i < self.horizon else self.raw[k, i]

    def rows(self, k: int, positions: list[int]) -> torch.Tensor:
        """Effective targets [n, V] of draft k at ``positions`` (increasing): a view when they form one
        contiguous run on one side of the horizon, else a gathered copy. Never to be modified."""
        lo, hi = positions[0], positions[-1] + 1
        if hi - lo == len(positions) and (lo >= self.horizon or hi <= self.horizon):
            return self.raw[k, lo:hi] if lo >= self.horizon else self.head[k, lo:hi]
        return torch.stack([self.row(k, i) for i in positions])

    @property
    def probs(self) -> torch.Tensor:
        """All effective rows [K, L+1, V] (one copy when frames are alive)."""
        if self.head is None:
            return self.raw
        return torch.cat([self.head, self.raw[:, self.horizon :]], 1)


def effective_targets(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                      frames: tuple[CarryFrame, ...]) -> EffectiveTargets:
    """Apply the alive frames to the raw target rows of every draft (vectorised over drafts, rows and V).

    Frame f governs rows 0..remaining_f − 1 and modifies the target below it (the raw rows with the older
    frames applied); its log P − log Q at row i runs along the draft tokens under that target below, which
    is known for every row once the older frames are applied: so the frames are applied one at a time
    (oldest first), each to all its rows at once. No host read; the token probabilities are gathered as
    float64 scalars (P and Q are long products, kept out of the input dtype).
    """
    K, L = draft_tokens.shape
    tokens = draft_tokens.long().unsqueeze(-1)
    token_target = target_probs[:, :L].gather(-1, tokens).squeeze(-1).double()
    token_draft = draft_probs.gather(-1, tokens).squeeze(-1).double()
    log_ratios = torch.empty(len(frames), K, L + 1, dtype=torch.float64, device=target_probs.device)
    if not frames:
        return EffectiveTargets(target_probs, None, token_target, token_draft, log_ratios, frames)
    horizon = max(f.remaining for f in frames)  # <= L, checked by check_state
    start = torch.tensor([f.log_ratio for f in frames], dtype=torch.float64, device=target_probs.device)
    log_q = torch.log(token_draft)
    # Our own copy of rows 0..H−1, updated in place frame by frame: before frame f it holds the target
    # below f (older frames expire first, so rows at or past an older frame's reach are still raw).
    head = target_probs[:, :horizon].clone()
    for f_idx, frame in enumerate(frames):
        n = frame.remaining
        below = head[:, :n]
        # log P − log Q of frame f after each prefix: its stored value, then a running sum along the tokens.
        steps = below.gather(-1, tokens[:, :n]).squeeze(-1).double().log_().sub_(log_q[:, :n])  # [K, n]
        ratios = torch.cat([start[f_idx].expand(K, 1), steps], 1).cumsum_(1)  # [K, n + 1]
        log_ratios[f_idx, :, : n + 1] = ratios
        # apply_frame, written into the rows in place (warm memory; same arithmetic as normalize):
        # below <- weights / total, or below itself where the residual has no mass.
        weights = residual_weights(below, draft_probs[:, :n], ratios[:, :n], frame.power, frame.coupling)
        total = weights.sum(-1, keepdim=True)
        no_mass = total <= 0
        torch.addcmul(weights.div_(total + no_mass), below, no_mass, out=below)
    token_target[:, :horizon] = head.gather(-1, tokens[:, :horizon]).squeeze(-1)
    return EffectiveTargets(target_probs, head, token_target, token_draft, log_ratios, frames)


def next_state(effective: EffectiveTargets, draft_probs: torch.Tensor, target_probs: torch.Tensor,
               draft_index: int, num_accepted: int, last_token: int | torch.Tensor,
               new_frame_log_ratio: float | torch.Tensor | None, power: int, L: int,
               coupling: bool = False) -> CarryOverState | None:
    """State after emitting draft ``draft_index``'s first ``num_accepted`` tokens and ``last_token``.

    ``new_frame_log_ratio``: log P − log Q through the correction token (None after a bonus token);
    the new frame governs the L − τ − 1 positions left in this iteration's horizon. ``last_token`` and
    the new ratio may be device tensors: the state's numbers are read in one host read (none when no
    frame is left).
    """
    tau = num_accepted
    consumed = tau + 1
    frames = effective.frames
    survivors = [f_idx for f_idx, f in enumerate(frames) if f.remaining > consumed]
    new_frame = new_frame_log_ratio is not None and L - consumed > 0
    if not survivors and not new_frame:
        return None
    values = []  # float64 device scalars: the survivors' extended ratios, then the new frame's
    if survivors:
        # Frames alive past this block were alive at row τ (τ < L since remaining <= L): extend their
        # ratio by the last token, under the target below each of them at row τ of the chosen draft.
        alive = [f_idx for f_idx, f in enumerate(frames) if f.remaining > tau]
        row_ratios = effective.log_ratios[alive, draft_index, tau]  # [A]
        draft_row = draft_probs[draft_index, tau]
        # Levels below the alive frames: raw, then each alive frame but the newest applied (oldest first).
        chain = frame_chain(target_probs[draft_index, tau], draft_row, list(row_ratios[:-1].unbind()),
                            [frames[f].power for f in alive[:-1]], [frames[f].coupling for f in alive[:-1]])
        token = torch.as_tensor(last_token, device=draft_row.device).reshape(1)
        below = torch.cat([level.gather(0, token) for level in chain]).double()  # [A]
        extended = row_ratios + below.log() - draft_row.gather(0, token).double().log()
        keep = [position for position, f_idx in enumerate(alive) if f_idx in survivors]
        values.append(extended[keep])
    if new_frame:
        values.append(torch.as_tensor(new_frame_log_ratio, dtype=torch.float64, device=draft_probs.device)
                      .reshape(1))
    numbers = torch.cat(values).tolist()
    kept = [CarryFrame(numbers[i], frames[f_idx].remaining - consumed, frames[f_idx].power, frames[f_idx].coupling)
            for i, f_idx in enumerate(survivors)]
    if new_frame:
        kept.append(CarryFrame(numbers[-1], L - consumed, power, coupling))
    return CarryOverState(tuple(kept))
