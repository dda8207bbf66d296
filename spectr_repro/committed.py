"""Committed results: the long replays that back a published number, sealed for git and checked on any clone.

    results/<experiment>/replay/<group>/
        replay.json                      the group's settings (written by the replay)
        manifest.json                    written by `seal`: each finished prompt, the sha256 of its files, the
                                         environment that replayed it and the rules' fingerprint it was judged by
        prompts/<index>/done.json        the replay's done file: vouches for blocks.jsonl (sha256 of its text, lines)
        prompts/<index>/blocks.jsonl.gz  the blocks, gzip'd deterministically (no name, no time): what git holds

A replay writes ``blocks.jsonl``; ``seal`` adds its gzip'd copy beside it (the replay still running beside it keeps
reading its own files) and the manifest; git holds the copy (.gitignore names the committed experiments' files and
nothing else). Readers take either file (``records.read_record_text``): done.json's sha256 is of the text, so it
checks both.

``check`` is what a reviewer runs on a fresh clone, without models: every prompt the manifest lists is there and is
the file it records, every finished prompt is in the manifest, and nothing is named twice.

    python -m spectr_repro seal results/replay_qwen_grid          # before committing a round
    python -m spectr_repro seal --check results/replay_qwen_grid  # on any clone: exit 1 naming each problem

The command is ``spectr_repro.replay.seal`` (it computes the rules' fingerprint); this module reads and writes files.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectr_repro.environment import git_commit
from spectr_repro.files import atomic_write_text
from spectr_repro.records import compressed_path, integrity_problems, read_record_text

MANIFEST_FILE, MANIFEST_VERSION = "manifest.json", 1
BLOCKS_FILE, DONE_FILE, SETTINGS_FILE = "blocks.jsonl", "done.json", "replay.json"
# Environment keys that decide whether a re-run can match a record token for token (bf16 rounding follows the
# CPU's kernels and the thread count's reduction order; the library versions pick the kernels).
# dtype: the models' (done.json records it since 2026-12-06; before, the folder's name held it: the pair's own)
ENVIRONMENT_KEYS = ("device", "device_name", "dtype", "torch", "transformers", "python", "num_threads", "git_commit")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def packed_blocks(text: str) -> bytes:
    """The committed copy of a blocks file: gzip level 9, no file name, time 0 (the same bytes on every machine)."""
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def groups_under(root: Path) -> list[Path]:
    """Every replay group folder under ``root`` (a results folder, its replay/ or one group)."""
    return sorted({path.parent for path in Path(root).rglob(SETTINGS_FILE) if (path.parent / "prompts").is_dir()})


def _key(content: Mapping[str, Any], prefix: str) -> str:
    return prefix + sha256_bytes(json.dumps(content, sort_keys=True).encode())[:10]


@dataclass
class SealReport:
    groups: int = 0
    prompts: int = 0
    packed: int = 0  # gzip copies written (new or out of date)
    backfilled: int = 0  # prompts whose done.json named no environment or fingerprint
    skipped: list[str] = field(default_factory=list)  # unfinished or damaged prompts, each named


def _read_done(directory: Path) -> tuple[dict | None, str | None]:
    """(done.json's content, None) of a finished prompt whose blocks are as vouched, else (None, the problem)."""
    path = directory / DONE_FILE
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{directory}: not finished (no {DONE_FILE})"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"{path}: cannot be read ({error})"
    files = done.get("records") if isinstance(done, dict) else None
    if not isinstance(files, dict) or BLOCKS_FILE not in files:
        return None, f"{path}: records no sha256 of {BLOCKS_FILE} (written before 2026-12-03): not sealable"
    problems = integrity_problems(directory, files)
    return (None, "; ".join(problems)) if problems else (done, None)


def _pack(directory: Path) -> bool:
    """Write the gzip'd copy of the prompt's blocks unless it is there with the same text; True when written."""
    text = read_record_text(directory / BLOCKS_FILE)
    packed_path = compressed_path(directory / BLOCKS_FILE)
    if packed_path.exists():
        try:
            if gzip.decompress(packed_path.read_bytes()).decode("utf-8") == text:
                return False
        except (OSError, EOFError, UnicodeDecodeError):
            pass  # a damaged copy is rewritten from the text done.json vouches for
    data = packed_blocks(text)
    temporary = packed_path.with_name(f".{packed_path.name}.tmp")
    temporary.write_bytes(data)
    temporary.replace(packed_path)
    return True


def _sealed_before(folder: Path) -> dict[str, dict[str, Any]]:
    """The group's manifest as last sealed, by prompt: its entry, environment and rules' fingerprint (empty when
    there is none or it cannot be read: then nothing is kept from it)."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        return {name: {"entry": entry, "environment": manifest["environments"][entry["environment"]],
                       "rules_fingerprint": manifest["rules_fingerprints"][entry["rules_fingerprint"]]}
                for name, entry in manifest["prompts"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def seal_group(folder: Path, current: Mapping[str, str], backfill: Mapping[str, Any] | None,
               report: SealReport) -> dict[str, Any]:
    """Pack every finished prompt of one group and write its manifest (returned). ``current``: the rules' fingerprint
    of the code that seals; ``backfill``: the environment and fingerprint of the run that wrote prompts whose
    done.json records neither (None: such prompts are skipped, named)."""
    settings = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
    environments: dict[str, dict] = {}
    fingerprints: dict[str, dict] = {}
    prompts: dict[str, dict] = {}
    sealed = _sealed_before(folder)
    for directory in sorted(p for p in (folder / "prompts").iterdir() if p.is_dir()):
        done, problem = _read_done(directory)
        if done is None:
            report.skipped.append(problem)
            continue
        environment, versions = done.get("environment"), done.get("rules_fingerprint")
        backfilled = not (isinstance(environment, dict) and isinstance(versions, dict))
        before = sealed.get(directory.name)
        if backfilled and backfill is None and before is not None and \
                before["entry"].get(DONE_FILE) == sha256_bytes((directory / DONE_FILE).read_bytes()):
            # backfilled by an earlier seal (--backfill-commit) and unchanged since: keep what that seal named
            environment, versions = before["environment"], before["rules_fingerprint"]
        elif backfilled:
            if backfill is None:
                report.skipped.append(f"{directory}: done.json names no environment or rules' fingerprint (seal "
                                      f"--backfill-commit names the run that wrote it)")
                continue
            environment, versions = backfill["environment"], backfill["rules_fingerprint"]
            report.backfilled += 1
        environment = {k: environment.get(k) for k in ENVIRONMENT_KEYS}
        env_key, fp_key = _key(environment, "env-"), _key(versions, "rules-")
        environments[env_key], fingerprints[fp_key] = environment, dict(versions)
        report.packed += _pack(directory)
        packed = compressed_path(directory / BLOCKS_FILE).read_bytes()
        prompts[directory.name] = {
            "prompt_id": str(done.get("prompt_id")), DONE_FILE: sha256_bytes((directory / DONE_FILE).read_bytes()),
            BLOCKS_FILE: done["records"][BLOCKS_FILE], BLOCKS_FILE + ".gz": sha256_bytes(packed),
            "environment": env_key, "rules_fingerprint": fp_key, "backfilled": backfilled}
    manifest = {"manifest_version": MANIFEST_VERSION, "group": folder.name, "settings": settings,
                "sealed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "sealed_by_commit": git_commit(), "current_rules_fingerprint": dict(current),
                "environments": environments, "rules_fingerprints": fingerprints, "prompts": prompts}
    atomic_write_text(folder / MANIFEST_FILE, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    report.groups += 1
    report.prompts += len(prompts)
    return manifest


def check_group(folder: Path) -> tuple[int, list[str]]:
    """(prompts checked, problems) of one sealed group: each listed prompt's done.json and gzip'd blocks are the files
    the manifest records and hold the text done.json vouches for; a finished prompt the manifest lacks is named."""
    path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        prompts = manifest["prompts"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        return 0, [f"{path}: cannot be read ({type(error).__name__}: {error})"]
    problems = []
    for index, entry in sorted(prompts.items()):
        directory = folder / "prompts" / index
        for name in (DONE_FILE, BLOCKS_FILE + ".gz"):
            file = directory / name
            if not file.exists():
                problems.append(f"{file}: missing ({MANIFEST_FILE} lists it)")
            elif sha256_bytes(file.read_bytes()) != entry.get(name):
                problems.append(f"{file}: not the file {MANIFEST_FILE} records (sha256 differs)")
        if not problems or not any(str(directory) in p for p in problems):
            problems += integrity_problems(directory, {BLOCKS_FILE: entry.get(BLOCKS_FILE, {})})
    finished = {p.parent.name for p in (folder / "prompts").glob(f"*/{DONE_FILE}")}
    problems += [f"{folder / 'prompts' / index}: finished but not in {MANIFEST_FILE} (run seal)"
                 for index in sorted(finished - set(prompts))]
    return len(prompts), problems


def backfill_of(commit: str, environment: Callable[[], dict], fingerprint: Mapping[str, str]) -> dict[str, Any]:
    """What seal records for prompts whose done.json names no environment: this machine's, at ``commit``."""
    return {"environment": {**environment(), "git_commit": commit}, "rules_fingerprint": dict(fingerprint)}


__all__ = ["BLOCKS_FILE", "ENVIRONMENT_KEYS", "MANIFEST_FILE", "SETTINGS_FILE", "SealReport", "backfill_of",
           "check_group", "groups_under", "packed_blocks", "seal_group", "sha256_bytes"]
