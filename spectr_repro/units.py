"""One store for units of work (a sweep's cell, a replayed prompt, a bias context): state, records written then the
done file last, set aside, claim.

A unit is one folder. Its records are written first (each through a temporary file and ``os.replace``), its done
file last: the unit is finished once the done file exists and vouches for the records. A replayed prompt and a bias
context use ``done.json``, which lists each record file with its sha256 and line count
(:func:`spectr_repro.records.file_integrity`)::

    <unit>/blocks.jsonl        (or <method>.json ...: whatever the command records)
    <unit>/done.json           {..., "records": {"blocks.jsonl": {"sha256": ..., "lines": ...}}}, written last
    <unit>/claim.json          while a runner computes the unit (spectr_repro.launch.claims)

:func:`unit_state` reads one folder, never raising for bad content: ``absent`` (no records), ``partial`` (records
without a done file: stopped between the two), ``finished`` (the done file vouches for every file it lists),
``unverified`` (a done file written before done files recorded the sha256, beside the files named ``legacy``:
counted as finished) or ``damaged`` (``problem`` names the file and, for a JSON-lines file, the line).
:func:`set_aside` moves a damaged or partial unit's files (never its claim) to
``<aside_root>/<unit>-<UTC stamp>/``: never deleted, out of the readers' way. :func:`claim_unit` claims a unit for
a runner and looks at it under the claim (finished by another runner meanwhile, or set aside and to be computed).

A sweep's cell (:mod:`spectr_repro.runner.store`) shares the write order (:func:`write_last`: records, then its
config, then ``summary.json`` last) and the claim files, but keeps ``summary.json`` as its done file rather than a
``done.json``: the summary already vouches for its records (count, prompt ids, totals and ``records_sha256``, checked
by ``records.summary_disagreements``), it is the file the analysis and the committed results read, and every cell on
disk has one; a second done file would only say the same twice. Its state (``runner.store.cell_state``) is
therefore the summary's check, not :func:`unit_state`, and a damaged cell is overwritten by its rerun (its records
are rewritten whole) rather than set aside.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectr_repro.errors import ResourceError
from spectr_repro.files import atomic_write_text
from spectr_repro.records import file_integrity, integrity_problems

DONE_FILE = "done.json"
CLAIM_FILE = "claim.json"  # a runner's claim (spectr_repro.launch.claims): never a record, never set aside
TAKEOVER_FILE = "claim.json.takeover"
NOT_RECORDS = (CLAIM_FILE, TAKEOVER_FILE)
FINISHED = ("finished", "unverified")  # unverified: a done file written before it vouched for its records
SET_ASIDE = "set_aside"


@dataclass(frozen=True)
class UnitState:
    """What a unit folder holds (see the module docstring); ``done``: its done file, once it could be read."""

    status: str
    problem: str | None = None
    done: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def record_names(directory: Path) -> list[str]:
    """The files a unit folder holds besides its claim and the temporaries of a write (sorted; [] when absent)."""
    try:
        return sorted(p.name for p in Path(directory).iterdir()
                      if p.name not in NOT_RECORDS and not p.name.startswith(".") and p.name != DONE_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return []


def unit_state(directory: Path, legacy: Iterable[str] = ()) -> UnitState:
    """Read and check one unit folder (never raises for bad content: a damaged unit says why). ``legacy``: the files
    beside which a done file without its ``records`` counts as ``unverified`` (none given: it is damaged)."""
    directory = Path(directory)
    done_path = directory / DONE_FILE
    if not done_path.exists():
        names = record_names(directory)
        if not names:
            return UnitState("absent")
        written = "; ".join(f"{directory / name}: written without its {DONE_FILE}" for name in names)
        return UnitState("partial", f"{directory}: no {DONE_FILE} (stopped before it finished): {written}")
    try:
        done = json.loads(done_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return UnitState("damaged", f"{done_path}: cannot be read ({type(error).__name__}: {error})")
    if not isinstance(done, dict):
        return UnitState("damaged", f"{done_path}: not a done file (a JSON object)")
    files = done.get("records")
    if not isinstance(files, dict) or not files:
        legacy = list(legacy)
        missing = [name for name in legacy if not (directory / name).exists()]
        if legacy and not missing:
            return UnitState("unverified", None, done)
        if missing:
            return UnitState("damaged", f"{directory / missing[0]}: missing ({DONE_FILE} says it finished)", done)
        return UnitState("damaged", f"{done_path}: lists no records (cannot be read as a done file)", done)
    if not all(isinstance(v, Mapping) for v in files.values()):
        return UnitState("damaged", f"{done_path}: its records are not name -> sha256 and lines", done)
    problems = integrity_problems(directory, files)
    return UnitState("damaged", "; ".join(problems), done) if problems else UnitState("finished", None, done)


def set_aside(directory: Path, aside_root: Path) -> Path:
    """Move a damaged or partial unit's files (all but its claim) to ``<aside_root>/<unit>-<UTC stamp>/``: never
    deleted, out of the readers' way; the unit's folder goes too when nothing is left in it. Returns where they went
    (ResourceError naming both folders when they cannot be moved)."""
    directory = Path(directory)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = Path(aside_root) / f"{directory.name}-{stamp}"
    try:
        target.mkdir(parents=True, exist_ok=False)
        for path in sorted(directory.iterdir()):
            if path.name not in NOT_RECORDS:
                os.replace(path, target / path.name)
    except OSError as error:
        raise ResourceError(f"cannot set aside {directory} into {target}: {error}") from error
    try:
        directory.rmdir()  # a claimed unit keeps its folder (the claim is in it)
    except OSError:
        pass
    return target


def write_last(directory: Path, files: Mapping[str, str], done_name: str, done_text: str,
               keep_done: bool = False) -> None:
    """``files`` (name -> text), each atomically, then ``done_name`` last: the unit is finished once it exists.
    An earlier done file is removed first (a rerun is unfinished until its own done file is written) unless
    ``keep_done`` (the new files extend a finished unit and leave its listed files as they are)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not keep_done:
        (directory / done_name).unlink(missing_ok=True)
    for name, text in files.items():
        atomic_write_text(directory / name, text)
    atomic_write_text(directory / done_name, done_text)


def write_unit(directory: Path, files: Mapping[str, str], done: Mapping[str, Any] | None = None,
               extend: bool = False) -> None:
    """A unit's record files, then ``done.json`` (``done`` plus ``records``: each file's sha256 and line count).
    ``extend``: add ``files`` to a finished unit (its done file then lists the earlier files and the new ones)."""
    listed: dict[str, Any] = {}
    if extend:
        earlier = unit_state(directory)
        if earlier.status == "finished" and earlier.done is not None:
            listed = dict(earlier.done["records"])
            done = {**{k: v for k, v in earlier.done.items() if k != "records"}, **(done or {})}
    listed.update({name: file_integrity(text) for name, text in files.items()})
    text = json.dumps({**(done or {}), "records": listed}, indent=2) + "\n"
    write_last(directory, files, DONE_FILE, text, keep_done=extend)


@dataclass(frozen=True)
class Claimed:
    """What :func:`claim_unit` found: ``claimed`` (this runner computes the unit; ``state``: what the folder held
    under the claim, ``moved``: where its damaged or partial files went), ``busy`` (another live runner holds it)
    or ``finished`` (finished meanwhile by another runner: the claim is released)."""

    status: str
    state: UnitState
    moved: Path | None = None
    holder: Any = None  # the live holder of a busy unit (launch.claims.Holder)


def claim_unit(runner, directory: Path, aside_root: Path, force: bool = False,
               legacy: Iterable[str] = ()) -> Claimed:
    """Claim ``directory`` for ``runner`` (a :class:`spectr_repro.launch.claims.Runner`: ``claim`` and ``release``;
    a dead runner's claim is taken over there) and look at the unit under the claim: finished by another runner
    meanwhile (released; kept claimed when ``force``: it is computed again), else its damaged or partial files set
    aside. OSError from the claim itself propagates (the caller names the folder)."""
    result = runner.claim(directory)
    if not result.acquired:
        return Claimed("busy", UnitState("absent"), holder=result.holder)
    try:
        state = unit_state(directory, legacy)
        if state.finished and not force:
            runner.release(directory)
            return Claimed("finished", state)
        moved = set_aside(directory, aside_root) if state.status in ("damaged", "partial") else None
    except BaseException:
        runner.release(directory)
        raise
    return Claimed("claimed", state, moved)


__all__ = ["CLAIM_FILE", "DONE_FILE", "FINISHED", "NOT_RECORDS", "SET_ASIDE", "TAKEOVER_FILE", "Claimed",
           "UnitState", "claim_unit", "record_names", "set_aside", "unit_state", "write_last", "write_unit"]
