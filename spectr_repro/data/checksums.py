"""Integrity of the local data folder: the files a dataset reads must match the folder's ``SHA256SUMS``.

``$SPECTR_REPRO_DATA`` is laid out like ``shared/datasets``, whose ``SHA256SUMS`` is in ``sha256sum``
format (``<64 hex digits>  <path relative to the folder>``). When the file exists, every listed file a
dataset reads is hashed the first time and again only when its size or modification time changes (once
per process in practice); a mismatch is one ValueError naming the file. Files the list does not name
(e.g. a full ``alpaca_data.json`` dropped in later) are read unchecked, as ``sha256sum -c`` would.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

SUMS_NAME = "SHA256SUMS"
_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")

# resolved path -> (size, mtime_ns) when its digest last matched; the parsed lists likewise
_VERIFIED: dict[Path, tuple[int, int]] = {}
_PARSED: dict[Path, tuple[tuple[int, int], dict[str, str]]] = {}


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def read_sums(sums: Path) -> dict[str, str]:
    """``relative path -> lower-case hex digest`` from a ``sha256sum`` file (ValueError naming a bad line)."""
    key, stamp = sums.resolve(), _stamp(sums)
    if key in _PARSED and _PARSED[key][0] == stamp:
        return _PARSED[key][1]
    digests = {}
    for number, line in enumerate(sums.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(
                f"{sums}, line {number}: not a sha256sum line (want '<64 hex digits>  <path>'), got {line[:80]!r}"
            )
        digests[match.group(2)] = match.group(1).lower()
    _PARSED[key] = (stamp, digests)
    return digests


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_files(data_dir: Path, paths: Iterable[Path]) -> None:
    """Check ``paths`` (inside ``data_dir``) against ``data_dir/SHA256SUMS`` when that file exists."""
    sums = data_dir / SUMS_NAME
    if not sums.is_file():
        return
    expected = read_sums(sums)
    for path in paths:
        try:
            name = path.relative_to(data_dir).as_posix()
        except ValueError:
            continue  # not inside the folder: the list cannot speak for it
        if name not in expected:
            continue
        key, stamp = path.resolve(), _stamp(path)
        if _VERIFIED.get(key) == stamp:
            continue
        actual = sha256_of(path)
        if actual != expected[name]:
            raise ValueError(
                f"dataset file {path} does not match {sums} (sha256 {actual[:16]}..., expected "
                f"{expected[name][:16]}...; {stamp[0]:,} bytes): it is damaged, truncated or was changed. "
                f"Restore it (see SOURCES.md there) and check with `cd {data_dir} && sha256sum -c {SUMS_NAME}`"
            )
        _VERIFIED[key] = stamp


__all__ = ["SUMS_NAME", "read_sums", "sha256_of", "verify_files"]
