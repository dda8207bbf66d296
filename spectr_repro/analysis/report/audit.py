"""The Lossless status (audit) section, from the audit file read into the context (``load.Audit``)."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.format import markdown, relative, unique_text
from spectr_repro.analysis.load import METHOD_LABELS, METHOD_ORDER, ordered
from spectr_repro.analysis.report.context import ReportContext

# Where the released SpecTr-GBV rule's bias comes from: the exact decomposition of docs/theory.md
# (`python -m spectr_repro theory --decomposition`, 2026-12-03), one sentence beside the rule's verdict.
RELEASE_BIAS_SOURCE = (
    "its bias comes from the correction (and at K = 1 the missing carry-over): the release draws it as if its "
    "scan accepted each prefix with the conditionally independent coupling's probability, which the scan does at "
    "K = 1 but misses by up to 0.12 at K >= 2; h never leaves [0, 1] in exact arithmetic, and a correction and "
    "carried target taken from the scan's actual law (capped at the target) make it exactly lossless "
    "(docs/theory.md of the repository, \"Where the released rule's bias comes from\")"
)

# Where MP-BV beats SBV-F and how SBV-F's option closes it (docs/theory.md; exact E[tau] on the gap toys,
# 2026-12-03), one sentence beside MP-BV's verdict.
MPBV_SBVF_FINDING = (
    "where MP-BV's exact E[tau] is above SBV-F's (four K = 2 toys, by 0.0016 to 0.0085) it is because SBV-F picks "
    "its selection's rho per survivor count while BV sees the mixture over the count; SBV-F's option "
    "`selection=\"mixture\"` (rho for that mixture, the greedy point included) is lossless (exact audit) and at least "
    "MP-BV and SBV-F on all 30 gap toys computed (docs/theory.md of the repository, \"Where MP-BV beats SBV-F\")"
)

# The columns the audit contract names, plus its flags; per-toy details stay in AUDIT.md / audit.json.
AUDIT_COLUMNS = ["rule", "K", "options", "exact_tv", "exact_tv_vs_default", "p_value", "mc_tv", "verdict",
                 "claimed_lossless", "harness_lossless", "flags"]


def audit_section(context: ReportContext) -> str | None:
    if context.results is None:  # a report of replay or bias output alone: the verdicts carry the audit
        return None
    audit = context.audit
    if audit is None:
        return "## Lossless status (audit)\n\nNo audit found (run `python -m spectr_repro audit`).\n"
    out_dir = context.out_dir
    lines = [
        "## Lossless status (audit)",
        "",
        f"From [{audit.path.name}]({relative(audit.path, out_dir)}): exact total-variation distance between each "
        "rule's decoded law and the target's, a Monte-Carlo chi-square check through the real sampler, and the "
        "audit's verdict.",
        "",
        *[f"- {key}: {value}" for key, value in audit.settings.items()],
        "",
    ]
    if not audit.rows:
        return "\n".join(lines + ["The audit file holds no rows.", ""])
    table = _audit_table(audit.rows)
    lines += [markdown(table.astype(object).where(table.notna(), "").astype(str)), ""]
    details = audit.path.parent / "AUDIT.md"
    if details.is_file():
        lines += [f"Details per toy model: [{details.name}]({relative(details, out_dir)}).", ""]
    lines += _verdict_lines(table)
    if "exact_tv_vs_default" in table:
        lines += ["`exact_tv_vs_default`: an option variant's exact TV to the same rule with default options (for "
                  "spectr_gbv `arithmetic=release_*`: how far the release's half-precision rows and float32 "
                  "arithmetic move the law from the float64 replica's).", ""]
    lines += peer_lines(audit.peers)
    lines += claims_lines(context.theory)
    return "\n".join(lines)


def claims_lines(theory_md) -> list[str]:
    """The paper's theory claims checked exactly on toys: ``claims.csv`` beside THEORY.md (written by
    ``python -m spectr_repro theory``), one row per claim; nothing without it."""
    if theory_md is None or not (theory_md.parent / "claims.csv").is_file():
        return []
    claims = pd.read_csv(theory_md.parent / "claims.csv").fillna("")
    return [
        "The paper's theory claims, checked exactly on toy models (`python -m spectr_repro theory`, "
        "claims.csv beside THEORY.md): its bound for conditionally independent couplings against the LP limit of "
        "any valid rule and against what each rule reaches, monotone in K, the limit as K grows, K = 1 equals GBV.",
        "",
        markdown(claims[["claim", "verdict", "evidence"]].astype(str)),
        "",
    ]


def _scientific(value) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.2e}"


def _options_cell(options) -> str:
    if isinstance(options, dict):
        return ", ".join(f"{key}={value}" for key, value in sorted(options.items()))
    return "" if options is None else str(options)


def _audit_table(rows: list[dict]) -> pd.DataFrame:
    """``AUDIT_COLUMNS`` of the rows, as text."""
    table = pd.DataFrame(rows)
    table = table[[c for c in AUDIT_COLUMNS if c in table]].copy()
    for column in ("exact_tv", "exact_tv_vs_default", "mc_tv"):
        if column in table:
            table[column] = table[column].map(_scientific)
    if "p_value" in table:
        table["p_value"] = table["p_value"].map(lambda v: "" if v is None or pd.isna(v) else f"{v:.3g}")
    if "options" in table:
        table["options"] = table["options"].map(_options_cell)
    if "flags" in table:
        table["flags"] = table["flags"].map(lambda v: "; ".join(map(str, v)) if isinstance(v, list) else v)
    return table


def _verdict_lines(table: pd.DataFrame) -> list[str]:
    """One line per rule: its verdict at each K and option variant, and whether its authors claim it lossless."""
    lines = ["Per method:", ""]
    for rule in ordered(table["rule"], METHOD_ORDER):
        rule_rows = table[table["rule"] == rule]
        verdicts = "; ".join(
            f"K={row.get('K', '?')}{' ' + row['options'] if row.get('options') else ''}: {row['verdict']}"
            for _, row in rule_rows.iterrows()
        )
        claimed = ""
        if "claimed_lossless" in rule_rows:
            claimed = f" (claimed lossless: {unique_text(rule_rows['claimed_lossless'])})"
        source = f"; {RELEASE_BIAS_SOURCE}" if rule == "spectr_gbv" and "NOT lossless" in verdicts else ""
        source += f"; {MPBV_SBVF_FINDING}" if rule == "mpbv" else ""
        lines.append(f"- **{METHOD_LABELS.get(rule, rule)}**{claimed}: {verdicts}{source}")
    return lines + [""]


def peer_lines(peers: list[dict]) -> list[str]:
    """The peer rows of the audit (transformers' assisted generation): one line of table per setting."""
    if not peers:
        return []
    rows = []
    for peer in peers:
        first = peer.get("first_iteration") or {}
        squared = first.get("draft_at_T_squared") or {}
        rows.append({
            "peer": f"{peer.get('peer', '?')} ({peer.get('setting', '?')})",
            "samples": peer.get("num_samples"),
            "p_value": f"{peer.get('p_value', float('nan')):.3g}",
            "mc_tv": f"{peer.get('mc_tv', float('nan')):.3f}",
            "detectable_tv (90 % power)": f"{peer.get('detectable_tv', float('nan')):.3f}",
            "first iteration mean tau (SD exact, draft at T / T^2)": (
                f"{first['mean_tau']:.3f} ({first['exact_mean_tau']:.3f} / {squared.get('exact_mean_tau', 0):.3f})"
                if first else ""),
            "verdict": peer.get("verdict", ""),
            "flags": "; ".join(map(str, peer.get("flags", []))),
        })
    return [
        "Peers (`spectr_repro.theory.peers`, details in AUDIT.md): the decoded law of the first tokens of "
        "transformers' assisted generation on a tiny Llama pair against the target's exact law; any bias of at "
        "least `detectable_tv` would be detected with 90 % power; the first iteration's accepted length against "
        "SD's exact expectation with the draft at temperature T and at T^2.",
        "",
        markdown(pd.DataFrame(rows).astype(str)),
        "",
    ]
