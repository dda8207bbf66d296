"""Which version of each rule a replayed prompt was judged by, and pooling only one version per rule.

A replay grows over many sessions and commits (committed ``results/``). Each finished prompt names, for every rule it
evaluated, the rule's fingerprint (``done.json``: ``rules_fingerprint``, written by the replay; or the group's
``manifest.json`` for prompts sealed before the replay wrote it: ``spectr_repro.committed``). The report never pools
prompts judged by two versions of one rule: for each rule it keeps the *current* version's prompts and names the rest.

The current version of a rule is the one in the newest manifest's ``current_rules_fingerprint`` (what the code that
sealed the results computes); without a manifest, the version of the most recently finished prompt. Folders written
before any fingerprint was recorded have no version at all and are pooled as they always were.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

VERSION_COLUMN = "rules_version"  # the prompt's fingerprint of the row's rule ("" where none is recorded)
MANIFEST_FILE = "manifest.json"


def prompt_versions(done: Mapping[str, Any], manifest: Mapping[str, Any] | None, index: str) -> dict[str, str]:
    """{rule: fingerprint} of one prompt: its done.json's, else its manifest entry's, else {} (not recorded)."""
    recorded = done.get("rules_fingerprint")
    if isinstance(recorded, Mapping):
        return {str(k): str(v) for k, v in recorded.items()}
    entry = (manifest or {}).get("prompts", {}).get(index) or {}
    versions = (manifest or {}).get("rules_fingerprints", {}).get(entry.get("rules_fingerprint"))
    return {str(k): str(v) for k, v in versions.items()} if isinstance(versions, Mapping) else {}


def current_versions(manifests: list[Mapping[str, Any]], finished: list[tuple[str, dict[str, str]]]
                     ) -> dict[str, str] | None:
    """{rule: its current fingerprint}: the newest manifest's, else that of the last finished prompt that recorded
    one (``finished``: (finished_at, versions) per prompt); None when nothing recorded a version."""
    sealed = [m for m in manifests if isinstance(m.get("current_rules_fingerprint"), Mapping)]
    if sealed:
        newest = max(sealed, key=lambda m: str(m.get("sealed_at", "")))
        return dict(newest["current_rules_fingerprint"])
    recorded = [(when, versions) for when, versions in finished if versions]
    if not recorded:
        return None
    return dict(max(recorded, key=lambda item: item[0])[1])


def keep_current(frame: pd.DataFrame, current: Mapping[str, str] | None) -> tuple[pd.DataFrame, list[str]]:
    """The rows judged by each rule's current version, and one note per rule naming the prompts left out (how many,
    under which version). Rules without a current version (none recorded) keep every row."""
    if current is None or frame.empty or VERSION_COLUMN not in frame:
        return frame, []
    wanted = frame["method"].map(current)
    keep = wanted.isna() | (frame[VERSION_COLUMN] == wanted)
    notes = []
    dropped = frame.loc[~keep]
    for (method, version), rows in dropped.groupby(["method", VERSION_COLUMN], sort=True):
        prompts = rows[["dataset", "temperature", "prompt_id"]].drop_duplicates()
        label = version or "no recorded version"
        notes.append(f"left out {method} on {len(prompts)} prompt(s) replayed with fingerprint {label}, not the "
                     f"current {current[method]}: never pooled with another version of the rule")
    return frame.loc[keep].reset_index(drop=True), notes


__all__ = ["MANIFEST_FILE", "VERSION_COLUMN", "current_versions", "keep_current", "prompt_versions"]
