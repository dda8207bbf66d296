"""Generated blocks inside hand-written Markdown: the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``.

A command that writes figures into a document (README.md's results table, docs/speed.md's bench tables) replaces
only its block, so the prose around it stays hand-written and the figures inside it always come from a file.
"""

from __future__ import annotations

import os
from pathlib import Path


class BlockError(ValueError):
    """The document has no (or a broken) pair of markers for the block."""


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def read_block(text: str, name: str, where: str = "the document") -> str:
    """The text between the block's markers (without the marker lines' newlines)."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise BlockError(f"{where} needs exactly one `{begin}` followed by one `{end}` line")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace_block(text: str, name: str, body: str, where: str = "the document") -> str:
    read_block(text, name, where)  # the markers are there, once each, in order
    begin, end = markers(name)
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{begin}\n{body.strip(chr(10))}\n{end}{tail}"


def write_block(path: str | Path, name: str, body: str) -> bool:
    """Replace the block in the file at ``path``; True when its text changed."""
    path = Path(path)
    text = path.read_text()
    new = replace_block(text, name, body, where=str(path))
    if new == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    return True


__all__ = ["BlockError", "markers", "read_block", "replace_block", "write_block"]
