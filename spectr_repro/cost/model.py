"""Seconds of a forward, a decoding call, a prompt and a cell: the one cost model (``plan``, ``check``, the bench).

A forward's seconds come from one of two sources, and every estimate says which:

- a calibration (``spectr_repro.cost.calibration``): seconds per forward of the pair's target and draft
  measured on this machine by ``python -m spectr_repro check`` at the shapes of the run (rows x new tokens
  on a cached context), plus the overhead per call the forwards do not explain;
- else the estimate of the selected hardware (``hardware.estimate`` in conf/hardware/*.yaml) on the pair's shapes
  (``cost.shapes``; a pair whose architecture is not shipped: its parameter count alone, no context):

      seconds per forward = overhead + (weight bytes + rows x (context + tokens) x KV bytes) / bandwidth
                            + matmul FLOPs / compute + attention FLOPs over the cached context / attention rate

  so a forward on a 16K-token cache costs its attention and KV reads over 16K tokens, a prompt's prefill is priced
  chunk by chunk on the cache the earlier chunks left, and B prompts decoded together read the weights once for
  their B x K rows (:func:`batch_prompt_seconds`, the one price of a prompt or a batch, measured or modelled).

A call (one speculative iteration at K drafts of L tokens) is

    seconds per call = target(K rows x (L+1)) + draft(1 x 2) (the pending tokens, fed once)
                       + (L-1) x draft(K rows x 1)
                       + overhead per call (sampling, verification, cache bookkeeping; measured by ``check``)

(the target's K rows each start with the last emitted token: after the first call the target's cache holds
every committed token but that one, so no shared forward runs before the rows; ``engine.loop._score_drafts``)
(the roofline charges one target call over K x (L+1) tokens and L draft forwards over K rows). A prompt is
its prefill through target and draft plus its calls: tokens / block efficiency of them, the block efficiency
being the paper's for that pair and method when it gives one, else one measured by finished cells, else
(L+1)/2 (:func:`expected_block_efficiency` names which). A cell is its prompts plus the runner's warm-up.
The rules' own seconds (the replay's grid on a block) are measured by finished replay blocks
(:func:`rule_seconds_per_block`).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spectr_repro.cost.calibration import Calibration, ForwardCosts, _interpolate
from spectr_repro.cost.shapes import ModelledForwardCosts, Rates, model_shape
from spectr_repro.data import typical_prompt_tokens
from spectr_repro.paper import load_paper_numbers
from spectr_repro.settings import RunConfig

GB = 1e9


# --------------------------------------------------------------------------------------------------
# One forward, one call


def forward_seconds(estimate: dict[str, Any], params: float, bytes_per_param: int, tokens: int) -> float:
    """One forward of a model with ``params`` parameters over ``tokens`` tokens, on the roofline of
    ``hardware.estimate`` (see the module docstring)."""
    memory = params * bytes_per_param / (float(estimate["bandwidth_gbs"]) * GB)
    compute = tokens * 2 * params / (float(estimate["compute_tflops"]) * 1e12)
    return float(estimate["overhead_ms"]) / 1e3 + memory + compute


def section_forward_seconds(target: ForwardCosts, draft: ForwardCosts, K: int, L: int, context: int | None = None,
                            batch: int = 1) -> dict[str, float]:
    """The forwards of one speculative iteration at K drafts of L tokens, by the engine section that runs them
    (see the module docstring): the draft's (the pending tokens fed once, then L-1 steps over K rows) and the
    target's (K rows x (L+1) tokens, each row the last emitted token and its draft), on ``context`` cached
    tokens; ``batch`` prompts decoded together (``engine.generate_batch``) call them with ``batch`` x the rows.
    A call cut short at the end of a generation drafts fewer tokens: pass its block length as ``L``."""
    return {"draft": draft.seconds(batch, 2, context=context) + (L - 1) * draft.seconds(batch * K, 1, context=context),
            "target": target.seconds(batch * K, L + 1, "all", context=context)}


def seconds_per_call(target: ForwardCosts, draft: ForwardCosts, K: int, L: int, overhead_s: float = 0.0,
                     batch: int = 1, context: int | None = None) -> float:
    """Seconds of one speculative iteration at K drafts of L tokens from measured forward costs (see the module
    docstring) plus ``overhead_s``; :class:`CallCosts` adds the rule and each section's measured overhead."""
    return sum(section_forward_seconds(target, draft, K, L, context, batch).values()) + overhead_s


SECTIONS = ("draft", "target", "verify", "other")  # the engine's sections of a call (engine.loop), prefill apart


def section_residual(measured: dict[str, float], target: ForwardCosts, draft: ForwardCosts,
                     rule_seconds: dict[tuple[str, int, int], float], rule: str, K: int, L: int,
                     context: int | None, batch: int = 1) -> dict[str, float]:
    """Per engine section, the seconds per call of a real decode (``measured``) beyond what the forwards and the
    rule explain under this model: kept apart from the measurement, so that a calibration is refitted when the
    model changes (:meth:`CallCosts.from_calibration`)."""
    forwards = section_forward_seconds(target, draft, K, L, context, batch)
    return {"draft": measured["draft"] - forwards["draft"], "target": measured["target"] - forwards["target"],
            "verify": measured["verify"] - batch * rule_seconds.get((rule, int(K), int(L)), 0.0),
            "other": measured["other"]}


OVERHEAD_TERMS = ("fixed", "per_position", "per_row", "per_token", "per_row_context", "per_context")
CONTEXT_TERMS = 2  # the last two: fitted only when the decodes ran at two contexts or more


def overhead_terms(K: int, L: int, context: float) -> list[float]:
    """The regressors of a call's overhead (:class:`SectionOverheads`) at K drafts of L tokens on ``context`` tokens."""
    return [1.0, float(L), float(K), float(K * (L + 1)), float(K * context), float(context)]


@dataclass(frozen=True)
class SectionOverheads:
    """What each engine section spends per call beyond the forwards and the rule, fitted per section as

        fixed + per_position x L + per_row x K + per_token x K(L+1) + per_row_context x K x context
              + per_context x context

    by least squares over real decodes at the corners of the grid's (K, L), at each measured context
    (``cost.measure.measure_section_residuals``): at one context the first four terms, bilinear in (K, L)
    through the four corners. Each term is a piece of work the forwards do not time: a softmax over the
    vocabulary per drafted position whatever K (the K rows are sampled at once); per row; the target's
    probabilities over the K(L+1) verified tokens; the committed cache repeated over the K rows and the chosen row
    kept afterwards, copies of the whole context. On the Qwen pair here (2026-12-03) the draft's residual grew by
    ~30 ms per drafted position at K = 1 and K = 7 alike; a line in K(L+1) alone missed cells by up to 28 %.
    The context terms are fitted only when the decodes ran at two contexts or more. AR's per token: ``ar``.

    With B prompts decoded together (``engine.generate_batch``) part of a call's overhead is paid once per call
    (building the attention mask, transformers' bookkeeping) and part once per prompt (each prompt's sampling and
    books, in Python loops). Decodes at two batch sizes or more (``batch`` in the residuals) tell them apart: each
    section is fitted as ``per_call`` + B x ``fits``, both in the terms above, and AR's step as ``ar["per_call"]`` +
    B x ``ar["per_prompt"]``. From decodes at B = 1 alone everything is charged per prompt (``per_call`` empty): on
    the Qwen pair that over-priced AR's step at B = 2-8 by 25-40 % (2026-12-07). ``seconds`` is always the B = 1
    total, what a batch-1 call costs."""

    fits: dict[str, tuple[float, ...]]  # section -> coefficients of OVERHEAD_TERMS, per prompt of a call
    ar: dict[str, float]  # "target", "other" -> seconds per token
    context: int | None = None  # the context a call is priced at when none is given (the decodes' first)
    per_call: dict[str, tuple[float, ...]] = field(default_factory=dict)  # section -> coefficients, once per call

    def seconds(self, section: str, K: int, L: int, context: int | None = None) -> float:
        """The section's overhead of one call at batch 1."""
        return self.batch_seconds(section, K, L, context, batch=1)

    def batch_seconds(self, section: str, K: int, L: int, context: int | None = None, batch: int = 1) -> float:
        """The section's overhead of one call with ``batch`` prompts running: once per call, plus once per prompt."""
        at = context if context is not None else (self.context or 0)
        terms = overhead_terms(K, L, at)

        def value(coefficients: Sequence[float]) -> float:
            return float(sum(c * x for c, x in zip(coefficients, terms)))

        return value(self.per_call.get(section, ())) + batch * value(self.fits.get(section, ()))

    def ar_step_seconds(self, batch: int) -> float | None:
        """AR's overhead of one step over ``batch`` prompts, when decodes at two batch sizes split it; else None."""
        if "per_prompt" not in self.ar:
            return None
        return self.ar.get("per_call", 0.0) + batch * self.ar["per_prompt"]

    @classmethod
    def fit(cls, residuals: Sequence[dict]) -> SectionOverheads:
        """Least squares per section over the decodes' residuals (per call; ``batch``: the prompts each call ran,
        1 when absent)."""
        decodes = [r for r in residuals if r["K"] > 0]
        ar_rows = [r for r in residuals if r["K"] == 0]
        contexts = [r.get("context") or 0 for r in decodes]
        batches = [int(r.get("batch", 1)) for r in decodes]
        terms = np.array([overhead_terms(r["K"], r["L"], c) for r, c in zip(decodes, contexts)], dtype=float)
        # one context cannot be told from the fixed term (nor K x context from K)
        used = len(OVERHEAD_TERMS) - (0 if len(set(contexts)) >= 2 else CONTEXT_TERMS)
        split = len(set(batches)) >= 2  # per call apart from per prompt
        design = terms[:, :used]
        if split:
            design = np.hstack([design, design * np.array(batches, dtype=float)[:, None]])
        fits, per_call = {}, {}
        for section in SECTIONS:
            values = np.array([r.get(section, 0.0) for r in decodes], dtype=float)
            solved = np.zeros(design.shape[1])
            if len(values):
                # lstsq gives the least-norm fit when the corners do not pin every term (one K, or one L): exact
                # at the measured shapes, and a mean when only one shape was decoded.
                solved = np.linalg.lstsq(design, values, rcond=None)[0]
            once, each = (solved[:used], solved[used:]) if split else (np.zeros(0), solved)
            fits[section] = tuple(float(c) for c in np.pad(each, (0, len(OVERHEAD_TERMS) - used)))
            if split:
                per_call[section] = tuple(float(c) for c in np.pad(once, (0, len(OVERHEAD_TERMS) - used)))
        return cls(fits, cls._fit_ar(ar_rows), int(contexts[0]) if contexts and contexts[0] else None, per_call)

    @staticmethod
    def _fit_ar(rows: Sequence[dict]) -> dict[str, float]:
        """AR's per-token residuals, target and other: a line in the context through AR's decodes when they ran at
        two contexts or more (``<section>_per_context``), else their mean."""
        ar: dict[str, float] = {}
        batches = [int(r.get("batch", 1)) for r in rows]
        if len(set(batches)) >= 2:
            # a step's overhead over B prompts, a line in B; the B = 1 decodes alone give the per-token terms below
            steps = [float(r.get("target", 0.0)) + float(r.get("other", 0.0)) for r in rows]
            slope, intercept = np.polyfit(batches, steps, 1)
            ar["per_call"], ar["per_prompt"] = float(intercept), float(slope)
            rows = [r for r, b in zip(rows, batches) if b == 1] or rows
        contexts = [float(r.get("context") or 0) for r in rows]
        for section in ("target", "other"):
            values = [float(r.get(section, 0.0)) for r in rows]
            if len(set(contexts)) >= 2:
                slope, intercept = np.polyfit(contexts, values, 1)
                ar[section], ar[f"{section}_per_context"] = float(intercept), float(slope)
            else:
                ar[section] = float(np.mean(values)) if values else 0.0
        return ar

    def to_json(self) -> dict[str, Any]:
        data = {"terms": list(OVERHEAD_TERMS), "fits": {k: list(v) for k, v in self.fits.items()},
                "ar": dict(self.ar), "context": self.context}
        if self.per_call:
            data["per_call"] = {k: list(v) for k, v in self.per_call.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SectionOverheads:
        """Also reads the two-term fits (fixed, per verified token) that calibrations wrote before 2026-12-03."""
        def terms(values: Sequence[float]) -> tuple[float, ...]:
            values = [float(v) for v in values]
            return (values[0], 0.0, 0.0, values[1]) if len(values) == 2 else tuple(values)

        return cls({k: terms(v) for k, v in data["fits"].items()},
                   {k: float(v) for k, v in data.get("ar", {}).items()}, data.get("context"),
                   {k: terms(v) for k, v in (data.get("per_call") or {}).items()})


@dataclass(frozen=True)
class CallCosts:
    """The one per-call cost model of a pair on a machine: seconds of a speculative call by section (draft,
    target, verify, other) at (rule, K, L, context), of an AR token, and of a prompt's prefill.

    Sources: forwards from a calibration (``check``) or a roofline (``cost.roofline``), the rules' seconds timed
    on real blocks (:func:`cost.measure.measure_rule_seconds`), each section's overhead fitted on real decodes
    (:class:`SectionOverheads`). ``source`` names them; ``relative_spread`` is the relative spread of the
    measured forwards, which a prediction's interval carries.
    """

    target: ForwardCosts
    draft: ForwardCosts
    rule_seconds: dict[tuple[str, int, int], float] = field(default_factory=dict)
    overheads: SectionOverheads | None = None
    source: str = ""

    @property
    def relative_spread(self) -> float:
        return max(self.target.spread, self.draft.spread)

    def rule_call_seconds(self, rule: str, K: int, L: int) -> float:
        """The rule's measured seconds at (K, L); else linear in L between its measured L at that K (the slope of
        the nearest two beyond them); 0 when the rule was not timed at that K (said by :meth:`missing_rules`)."""
        if (rule, K, L) in self.rule_seconds:
            return self.rule_seconds[(rule, K, L)]
        measured = sorted((l_, s) for (r, k, l_), s in self.rule_seconds.items() if r == rule and k == K)
        if not measured:
            return 0.0

        return max(0.0, _interpolate(measured, L)) if L >= measured[0][0] else measured[0][1] * L / measured[0][0]

    def missing_rules(self, grid: Iterable[tuple[str, int, int]]) -> list[tuple[str, int]]:
        timed = {(r, k) for r, k, _ in self.rule_seconds}
        return sorted({(r, k) for r, k, _ in grid if (r, k) not in timed and r != "ar"})

    def call_sections(self, rule: str, K: int, L: int, context: int | None = None) -> dict[str, float]:
        """Seconds of one call at (rule, K, L) on ``context`` cached tokens, by engine section."""
        forwards = section_forward_seconds(self.target, self.draft, K, L, context)
        sections = {"draft": forwards["draft"], "target": forwards["target"],
                    "verify": self.rule_call_seconds(rule, K, L), "other": 0.0}
        if self.overheads is not None:
            for section in SECTIONS:
                sections[section] += self.overheads.seconds(section, K, L, context)
        return sections

    def call_seconds(self, rule: str, K: int, L: int, context: int | None = None) -> float:
        return sum(self.call_sections(rule, K, L, context).values())

    def ar_token_sections(self, context: int | None = None) -> dict[str, float]:
        """Seconds of one AR token by section (the target's forward over one token and the rest)."""
        extra = self.overheads.ar if self.overheads is not None else {}
        at = context if context is not None else ((self.overheads.context if self.overheads else None) or 0)

        def residual(section: str) -> float:
            return extra.get(section, 0.0) + extra.get(f"{section}_per_context", 0.0) * at

        return {"draft": 0.0, "target": self.target.seconds(1, 1, context=context) + residual("target"),
                "verify": 0.0, "other": residual("other")}

    def ar_token_seconds(self, context: int | None = None) -> float:
        return sum(self.ar_token_sections(context).values())

    def prefill_seconds(self, prompt_tokens: int, with_draft: bool = True) -> float:
        """The prompt through the target (and the draft): one forward of the whole prompt each."""
        seconds = self.target.seconds(1, prompt_tokens)
        return seconds + (self.draft.seconds(1, prompt_tokens) if with_draft else 0.0)

    def to_json(self) -> dict[str, Any]:
        """Everything the model prices from, so a bench interrupted after its calibration resumes on the same costs."""
        return {"target": self.target.to_json(), "draft": self.draft.to_json(),
                "rule_seconds": {rule_key(*key): float(s) for key, s in self.rule_seconds.items()},
                "overheads": None if self.overheads is None else self.overheads.to_json(), "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallCosts:
        return cls(ForwardCosts.from_json(data["target"]), ForwardCosts.from_json(data["draft"]),
                   {_rule_key(key): float(s) for key, s in data.get("rule_seconds", {}).items()},
                   None if data.get("overheads") is None else SectionOverheads.from_json(data["overheads"]),
                   str(data.get("source", "")))

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> CallCosts:
        """The cost model of a calibration; its section overheads are fitted once per calibration content
        (:func:`calibration_overheads`), however often plan, report or bench load it."""
        rules = calibration_rule_seconds(calibration)
        return cls(calibration.target, calibration.draft, rules, calibration_overheads(calibration), calibration.note)


def calibration_rule_seconds(calibration: Calibration) -> dict[tuple[str, int, int], float]:
    """The rules' timed seconds of a calibration, by (rule, K, L)."""
    return {tuple(_rule_key(key)): float(value) for key, value in (calibration.extra.get("rule_seconds") or {}).items()}


_OVERHEAD_FITS: dict[str, SectionOverheads | None] = {}  # calibration's JSON -> its fitted overheads
_OVERHEAD_FITS_KEPT = 16  # calibrations whose fit is kept (one per pair and hardware a process prices)


def calibration_overheads(calibration: Calibration) -> SectionOverheads | None:
    """The section overheads of a calibration (:func:`fit_calibration_overheads`), fitted once per content: a
    calibration file is read again by every plan group, report section and bench contender that prices a call, each
    read a new object, so the fit is kept by what was measured (the entry's JSON), not by object or path."""
    key = json.dumps(calibration.to_json(), sort_keys=True, default=str)
    if key not in _OVERHEAD_FITS:
        if len(_OVERHEAD_FITS) >= _OVERHEAD_FITS_KEPT:
            _OVERHEAD_FITS.pop(next(iter(_OVERHEAD_FITS)))  # the oldest
        _OVERHEAD_FITS[key] = fit_calibration_overheads(calibration)
    return _OVERHEAD_FITS[key]


def fit_calibration_overheads(calibration: Calibration) -> SectionOverheads | None:
    """A calibration's section overheads: refitted under this cost model from its decodes' raw section seconds when
    it kept them, else as stored (or the single overhead per call of calibrations older still)."""
    extra = calibration.extra
    rules = calibration_rule_seconds(calibration)
    overheads = SectionOverheads.from_json(extra["section_overheads"]) if extra.get("section_overheads") else None
    decodes = extra.get("section_residuals") or []
    if decodes and all("measured" in row for row in decodes if row["K"] > 0):
        # The decodes' raw section seconds are kept: refit under this model (a calibration outlives a change
        # in the model, e.g. the phantom shared target forward removed on 2026-12-03).
        def refit(row: dict) -> dict:
            if row["K"] > 0:
                return {**row, **section_residual(row["measured"], calibration.target, calibration.draft, rules,
                                                  row["rule"], row["K"], row["L"], row.get("context"))}
            if "measured" in row:
                return {**row, "target": row["measured"]["target"] - calibration.target.seconds(
                    1, 1, context=row.get("context")), "other": row["measured"]["other"]}
            return row

        overheads = SectionOverheads.fit([refit(row) for row in decodes])
    if overheads is None and extra.get("overhead_s_per_call"):
        overheads = SectionOverheads({"other": (float(extra["overhead_s_per_call"]),)}, {})
    return overheads


def rule_key(rule: str, K: int, L: int) -> str:
    """(rule, K, L) as a calibration file's key ("sbvf/3/6")."""
    return f"{rule}/{int(K)}/{int(L)}"


def _rule_key(key: str) -> tuple[str, int, int]:
    rule, K, L = key.rsplit("/", 2)
    return rule, int(K), int(L)


def calls_to_emit(new_tokens: int, tokens_per_call: float) -> float:
    """Expected target calls to emit ``new_tokens`` at ``tokens_per_call`` a call: the last call is cut at the
    length, so it yields only part of a block. By renewal theory the calls to pass N tokens number
    N/mu + E[X^2]/(2 mu^2) >= N/mu + 1/2 (X: a call's tokens, mu = E[X]); the replay gives mu only, so this is
    the +1/2 of a block of constant length, a lower bound (measured 2026-12-02, gbv K=1 L=6, 48 tokens: 9 calls a
    generation against 48/5.65 = 8.5)."""
    return new_tokens / tokens_per_call + 0.5


def rule_seconds_per_block(blocks: Iterable[dict]) -> tuple[float | None, str]:
    """The rules' seconds per replay block (mean ``rule_seconds`` of finished blocks) and where it comes from;
    None without a finished block."""
    seconds = [b["rule_seconds"] for b in blocks if "rule_seconds" in b]
    if not seconds:
        return None, "rules not estimated (no finished replay here)"
    mean = statistics.fmean(seconds)
    return mean, f"rules {mean:.3g} s per block, mean of {len(seconds)} finished replay block(s) here"


@dataclass(frozen=True)
class CellSpec:
    """What the cost model reads of one cell's config, read once by :meth:`of` at the command that prices it:
    nothing below takes a raw config. ``estimate``: ``hardware.estimate`` resolved (None: the hardware has none)."""

    method: str
    K: int
    L: int
    model_pair: str
    dataset: str
    hardware: str  # the hardware config's name, for messages
    num_prompts: int
    max_new_tokens: int
    dtype: str | None = None  # hardware.dtype (None: the pair's own)
    prefill_chunk: int | None = None
    estimate: dict[str, Any] | None = None

    @classmethod
    def of(cls, run: RunConfig) -> CellSpec:
        hardware = run.hardware
        return cls(method=run.method, K=run.K, L=run.L, model_pair=run.model_pair, dataset=run.dataset,
                   hardware=run.hardware_name, num_prompts=run.num_prompts, max_new_tokens=run.max_new_tokens,
                   dtype=hardware.dtype, prefill_chunk=hardware.prefill_chunk,
                   estimate=None if hardware.estimate is None else dict(hardware.estimate))


def model_calls_source(cell: CellSpec, calibration: Calibration | None) -> str:
    """Where a cell's or a replay's model-call seconds come from: this machine's calibration, else the
    hardware's roofline, else nowhere (not estimated)."""
    if calibration is not None:
        return calibration.note
    if cell.estimate is not None:
        return f"cost model, {cell.estimate.get('device', 'hardware.estimate')}"
    return f"no cost model (hardware {cell.hardware} has no `estimate`): not estimated"


# --------------------------------------------------------------------------------------------------
# Tokens per call


def expected_block_efficiency(cell: CellSpec, measured: dict[tuple, float]) -> tuple[float, str]:
    """Block efficiency to expect for the cell: the paper's, else measured here (``measured``: finished cells'
    per (pair, method, K, L)), else (L+1)/2; and which of the three."""
    method, pair = cell.method, cell.model_pair
    if method == "ar":
        return 1.0, "ar"
    paper = _paper_block_efficiency()
    for key in ((pair, cell.dataset, method), (pair, "average", method)):
        if key in paper:
            return min(paper[key], cell.L + 1.0), "paper"
    key = (pair, method, cell.K, cell.L)
    if key in measured:
        return measured[key], "measured"
    return (cell.L + 1) / 2, "(L+1)/2"


@functools.cache
def _paper_block_efficiency() -> dict[tuple[str, str, str], float]:
    table = load_paper_numbers()
    table = table[table["metric"] == "block_efficiency"]
    return {(r.model_pair, r.dataset, r.method): float(r.value) for r in table.itertuples() if r.model_pair}


# --------------------------------------------------------------------------------------------------
# A prompt, a cell


def model_parameters(pair: dict, role: str) -> float:
    """Parameters of the pair's ``role`` model: ``params_b`` of its config; the tiny pair's are ~1e5."""
    if pair.get("source") == "tiny":
        return 1e5
    return float((pair.get(role) or {}).get("params_b") or 1.0) * 1e9


def bytes_per_parameter(cell: CellSpec, pair: dict) -> int:
    dtype = str(cell.dtype or pair.get("dtype") or "float32")
    return 4 if dtype == "float32" else 2


def estimate_forward_costs(cell: CellSpec, pair: dict, context: int = 0) -> tuple[Any, Any] | None:
    """(target, draft) forward costs on ``hardware.estimate`` (None without one): from each model's shape
    (``cost.shapes``: the weight matmuls, attention over the cached context and the KV bytes it reads) at the
    estimate's rates, summed; a pair whose architecture is not shipped falls back to its parameter count alone
    (:func:`forward_seconds`, no context)."""
    estimate = cell.estimate
    if estimate is None:
        return None
    width = bytes_per_parameter(cell, pair)
    try:
        rates = Rates.from_estimate(estimate)
        return tuple(ModelledForwardCosts(model_shape(pair, role), rates, width, context)
                     for role in ("target", "draft"))
    except (ValueError, OSError, KeyError):
        return tuple(ParameterForwardCosts(estimate, model_parameters(pair, role), width)
                     for role in ("target", "draft"))


@dataclass(frozen=True)
class ParameterForwardCosts:
    """A forward priced from its parameter count alone (:func:`forward_seconds`): the estimate of a pair whose
    architecture is not known here (no attention, no context)."""

    estimate: dict
    params: float
    width: int
    spread: float = 0.0

    def seconds(self, rows: int, tokens: int, logits: str = "last", context: int | None = None) -> float:
        return forward_seconds(self.estimate, self.params, self.width, rows * tokens)


def chunked_prefill_seconds(costs: Any, prompt_tokens: int, chunk: int | None) -> float:
    """A prompt's prefill on one model: its chunks one after another, each on the context the earlier ones left
    (``chunk`` None: one forward), so that attention over the growing cache is charged to every chunk."""
    chunk = int(chunk or prompt_tokens) or 1
    seconds, start = 0.0, 0
    while start < prompt_tokens:
        size = min(chunk, prompt_tokens - start)
        seconds += costs.seconds(1, size, "last", context=start)
        start += size
    return seconds


def batch_prompt_seconds(target: Any, draft: Any | None, prompt_tokens: int, chunk: int | None, new_tokens: int,
                         K: int, L: int, iterations: float, batch: int = 1, overhead_s: float = 0.0) -> float:
    """``batch`` prompts decoded together: each prompt's prefill (chunked, each chunk on the context before it),
    then ``iterations`` calls of B x K rows on the calls' mean context (prompt + half the new tokens). ``draft``
    None: AR, one target forward over ``batch`` rows x 1 token per emitted token (``iterations`` of them)."""
    context = int(prompt_tokens) + int(new_tokens) // 2
    prefill = chunked_prefill_seconds(target, prompt_tokens, chunk)
    if draft is None:
        return batch * prefill + iterations * target.seconds(batch, 1, context=context)
    prefill += chunked_prefill_seconds(draft, prompt_tokens, chunk)
    return batch * prefill + iterations * seconds_per_call(target, draft, K, L, overhead_s, batch=batch,
                                                           context=context)


def _costs_of(cell: CellSpec, pair: dict | None, calibration: Calibration | None) -> tuple[Any, Any, float] | None:
    """(target, draft, overhead per call) of a calibration, else of ``hardware.estimate`` (None without either)."""
    if calibration is not None:
        return calibration.target, calibration.draft, float(calibration.extra.get("overhead_s_per_call", 0.0))
    costs = estimate_forward_costs(cell, pair) if pair is not None else None
    return None if costs is None else (*costs, 0.0)


def cell_seconds(cell: CellSpec, pair: dict, block_efficiency: float, calibration: Calibration | None = None,
                 batches: Sequence[int] = ()) -> float | None:
    """Estimated seconds of one cell on its hardware (warm-up included); None when there is no calibration
    and the hardware config has no ``estimate``. With a ``calibration`` its costs replace the estimate.
    ``batches``: the sizes of the groups of untimed prompts decoded together (``runner.batched``)."""
    costs = _costs_of(cell, pair, calibration)
    if costs is None:
        return None
    target, draft, overhead = costs
    timed = cell.num_prompts - sum(batches)
    prompt, chunk, tokens = typical_prompt_tokens(cell.dataset), cell.prefill_chunk, cell.max_new_tokens

    def prompts_seconds(batch: int) -> float:
        """``batch`` prompts decoded together (1: alone)."""
        if cell.method == "ar":  # the per-call overhead is measured on sd-like loops
            return batch_prompt_seconds(target, None, prompt, chunk, tokens, 1, 1, tokens, batch)
        return batch_prompt_seconds(target, draft, prompt, chunk, tokens, cell.K, cell.L,
                                    math.ceil(tokens / block_efficiency), batch, overhead)

    seconds = timed * prompts_seconds(1) + sum(prompts_seconds(size) for size in batches)
    warmup = target.seconds(1, 32) + 8 * target.seconds(1, 1)
    return seconds + warmup


def calibrated_cell_seconds(cell: CellSpec, calibration: Calibration, block_efficiency: float,
                            batches: Sequence[int] = ()) -> float:
    """:func:`cell_seconds` from a calibration's measured forward costs."""
    return cell_seconds(cell, {}, block_efficiency, calibration, batches)


def prompt_seconds(cell: CellSpec, pair: dict | None, calibration: Calibration | None, K: int, L: int,
                   iterations: int, batch: int = 1) -> float | None:
    """``batch`` prompts decoded together at K drafts of L tokens (B*K rows a call): calibrated when
    ``calibration`` is given, else on ``hardware.estimate`` for the ``pair`` config (None without either)."""
    costs = _costs_of(cell, pair, calibration)
    if costs is None:
        return None
    target, draft, overhead = costs
    return batch_prompt_seconds(target, draft, typical_prompt_tokens(cell.dataset), cell.prefill_chunk,
                                cell.max_new_tokens, K, L, iterations, batch, overhead)


def speculative_prompt_seconds(cell: CellSpec, pair: dict, K: int, L: int, iterations: int,
                               batch: int = 1) -> float | None:
    """``batch`` prompts decoded together at K drafts of L tokens on ``hardware.estimate`` (None without one)."""
    return prompt_seconds(cell, pair, None, K, L, iterations, batch)


def calibrated_prompt_seconds(cell: CellSpec, calibration: Calibration, K: int, L: int, iterations: int,
                              batch: int = 1) -> float:
    """``batch`` prompts decoded together at K drafts of L tokens, from measured forward costs."""
    return prompt_seconds(cell, None, calibration, K, L, iterations, batch)


def prefill_pieces(cell: CellSpec) -> list[int]:
    """The prompt's prefill chunks (tokens each; ``hardware.prefill_chunk``, else the whole prompt)."""
    prompt = typical_prompt_tokens(cell.dataset)
    chunk = int(cell.prefill_chunk or prompt)
    return [chunk] * (prompt // chunk) + ([prompt % chunk] if prompt % chunk else [])


__all__ = ["GB", "SECTIONS", "CallCosts", "CellSpec", "ParameterForwardCosts", "SectionOverheads",
           "batch_prompt_seconds",
           "bytes_per_parameter", "calibrated_cell_seconds", "chunked_prefill_seconds", "estimate_forward_costs",
           "calibration_overheads", "calibration_rule_seconds", "fit_calibration_overheads",
           "calibrated_prompt_seconds", "calls_to_emit", "cell_seconds", "expected_block_efficiency", "forward_seconds",
           "model_calls_source", "model_parameters", "prefill_pieces", "prompt_seconds", "rule_key",
           "rule_seconds_per_block", "section_forward_seconds", "seconds_per_call", "speculative_prompt_seconds"]
