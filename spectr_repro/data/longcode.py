"""Long inputs that are real text: repository-scale code completion cut from the Python standard library.

A "repository" is one package of the running interpreter's standard library (``email/``, ``asyncio/``, ...) or one
top-level module (``typing.py``): its files in sorted path order, each after a one-line header naming it, as a
code-completion model reads a repository. A prompt is the first ``tokens`` tokens of a repository, counted in the
pair's tokenizer (the prompt the run feeds, special tokens included) and cut at a token boundary of the text: the
prompt is always a prefix of the repository's text, so it never ends inside a multi-byte character, and its length
is within ``CUT_TOLERANCE`` of the bucket (:func:`cut_to_tokens`). The model continues the code.

Source and integrity: ``longcode_manifest.json`` (shipped beside this module) names the interpreter the files come
from (CPython 3.11.7, ``Lib/``; PSF License Version 2) and the sha256 of every file it reads. A file whose sha256
differs is one ValueError naming it; another interpreter version is one ValueError naming both versions (its files
differ, so the prompts would). Nothing is downloaded and nothing written here is prompt text.

Buckets are dataset configs (``conf/dataset/longcode_<n>k.yaml``): ``tokens`` is the bucket's input length and
``min_tokens`` the length a repository must be able to fill; the buckets of one experiment share ``min_tokens``, so
they draw the same repositories (seeded selection over the same records) and the 1K prompt of a repository is the
start of its 16K prompt. ``python -m spectr_repro.data.longcode`` rewrites the manifest from this interpreter.
"""

from __future__ import annotations

import json
import platform
import sys
import sysconfig
from pathlib import Path
from typing import Any

from spectr_repro.data.base import DatasetSpec, Example, HubSource
from spectr_repro.data.checksums import sha256_of

MANIFEST = Path(__file__).resolve().parent / "longcode_manifest.json"
# Standard-library folders left out: tests, the IDE and GUI demos, codec tables and pydoc's data (generated tables
# rather than code), bundled installers, the build configuration (config-*, _sysconfigdata*: generated), and
# third-party packages.
EXCLUDED_TOP = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "lib2to3", "encodings", "pydoc_data",
                "ensurepip", "__phello__", "__pycache__")
EXCLUDED_PARTS = ("test", "tests", "__pycache__")
# A repository is kept for a bucket when its text has at least this many bytes per token wanted: Python code runs
# 3-4 bytes per token in the Qwen and Llama tokenizers and 1 in a byte tokenizer, so 6 leaves room for any of them.
MIN_BYTES_PER_TOKEN = 6
# How far below the bucket a cut prompt may end (never above): re-encoding a cut text can merge differently at the
# cut, so the cut backs off token by token until the prompt fits; a few tokens at most in practice.
CUT_TOLERANCE = 0.01  # of the bucket's tokens, and at least CUT_TOLERANCE_MIN tokens
CUT_TOLERANCE_MIN = 8


def stdlib_root() -> Path:
    """The running interpreter's standard library folder (``Lib/`` of its source tree)."""
    return Path(sysconfig.get_paths()["stdlib"])


def interpreter_version() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def source_files(root: Path) -> list[str]:
    """The files the dataset reads under ``root`` (relative POSIX paths, sorted): every ``*.py`` outside the
    excluded folders."""
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if parts[0] in EXCLUDED_TOP or parts[0].startswith(("config-", "_sysconfigdata")) \
                or set(parts[:-1]) & set(EXCLUDED_PARTS):
            continue
        files.append(path.relative_to(root).as_posix())
    return sorted(files)


def write_manifest(root: Path | None = None, path: Path = MANIFEST) -> Path:
    """The manifest of ``root`` (default: this interpreter's standard library): version, licence, every file's
    sha256 and size."""
    root = root or stdlib_root()
    files = {name: {"sha256": sha256_of(root / name), "bytes": (root / name).stat().st_size}
             for name in source_files(root)}
    manifest = {"source": "the Python standard library (Lib/) of the interpreter below, as installed",
                "interpreter": interpreter_version(), "licence": "PSF License Version 2 (Python Software Foundation)",
                "excluded_top": list(EXCLUDED_TOP), "excluded_parts": list(EXCLUDED_PARTS), "files": files}
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"dataset longcode: cannot read its manifest {path} ({type(error).__name__}: {error})"
                         ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        raise ValueError(f"dataset longcode: {path} is not a manifest (a JSON object with 'files')")
    return manifest


def repository_of(name: str) -> str:
    """The repository a file belongs to: its top folder, or the module itself at the top level."""
    first, _, rest = name.partition("/")
    return first if rest else first.removesuffix(".py")


def repository_text(root: Path, files: list[str]) -> str:
    """The files one after another, each after a header line naming it (its path under ``Lib/``)."""
    parts = []
    for name in files:
        try:
            text = (root / name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"dataset longcode: source file {root / name} is not UTF-8 (byte {error.start})") from None
        parts.append(f"# ---- Lib/{name} ----\n{text}{'' if text.endswith(chr(10)) else chr(10)}")
    return "".join(parts)


def cut_to_tokens(text: str, tokenizer, tokens: int, add_special_tokens: bool = True) -> tuple[str, int]:
    """(the longest prefix of ``text`` ending at a token boundary whose encoding has at most ``tokens`` tokens, its
    token count). The cut is at a character offset of the tokenizer's own tokens (``offset_mapping``), so the prompt is
    a prefix of ``text``: never inside a multi-byte character. ValueError when ``text`` has fewer tokens, or when the
    cut would fall more than the tolerance below ``tokens``."""
    def count(piece: str) -> int:
        return len(tokenizer(piece, add_special_tokens=add_special_tokens).input_ids)

    specials = count("")
    window = text[: tokens * 8 + 64]  # no tokenizer packs more than 8 characters a token on code: enough text
    encoded = tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
    ends = [end for _, end in encoded["offset_mapping"]]
    wanted = tokens - specials
    if len(ends) < wanted:
        raise ValueError(f"text of {len(ends)} tokens is shorter than the {tokens} wanted")
    floor = tokens - max(CUT_TOLERANCE_MIN, int(CUT_TOLERANCE * tokens))
    for last in range(wanted, 0, -1):
        prompt = text[: max(ends[:last])]
        length = count(prompt)
        if length <= tokens:
            if length < floor:
                break
            return prompt, length
    raise ValueError(f"no cut of {tokens} tokens within {tokens - floor} below it (tokenizer merges across the cut)")


def tolerance(tokens: int) -> int:
    """How many tokens below ``tokens`` a cut prompt may end (it never ends above)."""
    return max(CUT_TOLERANCE_MIN, int(CUT_TOLERANCE * tokens))


class LongCode(DatasetSpec):
    name = "longcode"
    description = "the first N tokens of a Python standard-library package or module (repository-scale completion)"
    hub = HubSource("", None, "")  # never on the hub: read from the running interpreter
    typical_prompt_tokens = 4096
    needs_tokenizer = True
    option_defaults = {"tokens": 4096, "min_tokens": None}

    def __init__(self, root: Path | None = None, manifest: Path = MANIFEST) -> None:
        self.root, self.manifest = root, manifest
        self._checked: dict[str, tuple[int, int]] = {}

    def prompt_tokens(self, options: dict) -> int | None:
        return int(self.resolve_options(dict(options))["tokens"])

    def resolve_options(self, options):
        options = super().resolve_options(options)
        tokens, min_tokens = options["tokens"], options["min_tokens"]
        for key, value in (("tokens", tokens), ("min_tokens", min_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 16):
                raise ValueError(f"dataset longcode: {key} must be an integer >= 16, got {value!r}")
        if min_tokens is not None and min_tokens < tokens:
            raise ValueError(f"dataset longcode: min_tokens={min_tokens} is below tokens={tokens}: a repository "
                             f"must hold the whole prompt")
        return options

    def load_records(self, data_dir=None, **options) -> list[dict]:
        """One record per repository long enough for ``min_tokens`` (default ``tokens``), its files checked against
        the manifest (``data_dir`` is not used: the source is the interpreter)."""
        options = self.resolve_options(options)
        manifest = read_manifest(self.manifest)
        root = self.root or stdlib_root()
        if self.root is None and manifest.get("interpreter") != interpreter_version():
            raise ValueError(f"dataset longcode: its manifest ({self.manifest}) lists the standard library of "
                             f"{manifest.get('interpreter')}, this interpreter is {interpreter_version()} "
                             f"({sys.executable}): its files differ, so would the prompts. Run it under "
                             f"{manifest.get('interpreter')}, or rewrite the manifest with `python -m "
                             f"spectr_repro.data.longcode` (new prompts: say so beside the results)")
        files: dict[str, dict] = manifest["files"]
        self._verify(root, files)
        by_repository: dict[str, list[str]] = {}
        for name in sorted(files):
            by_repository.setdefault(repository_of(name), []).append(name)
        needed = MIN_BYTES_PER_TOKEN * int(options["min_tokens"] or options["tokens"])
        records = [{"repository": repo, "files": names, "bytes": sum(int(files[n]["bytes"]) for n in names)}
                   for repo, names in sorted(by_repository.items())]
        kept = [record for record in records if record["bytes"] >= needed]
        if not kept:
            raise ValueError(f"dataset longcode: no repository of {root} has {needed:,} bytes "
                             f"({MIN_BYTES_PER_TOKEN} a token of {options['min_tokens'] or options['tokens']})")
        return [{**record, "root": str(root), "tokens": int(options["tokens"])} for record in kept]

    def _verify(self, root: Path, files: dict[str, dict]) -> None:
        for name, entry in files.items():
            path = root / name
            try:
                stat = path.stat()
            except OSError:
                raise ValueError(f"dataset longcode: source file {path} is missing (listed in {self.manifest})"
                                 ) from None
            stamp = (stat.st_size, stat.st_mtime_ns)
            if self._checked.get(name) == stamp:
                continue
            actual = sha256_of(path)
            if actual != entry["sha256"]:
                raise ValueError(f"dataset longcode: source file {path} does not match its manifest {self.manifest} "
                                 f"(sha256 {actual[:16]}..., expected {str(entry['sha256'])[:16]}...): it was "
                                 f"changed or damaged; restore it (reinstall {interpreter_version()})")
            self._checked[name] = stamp

    def record_id(self, record, index):
        return f"longcode/{record['repository']}"

    def to_example(self, record: dict, index: int, tokenizer=None, style: str = "base") -> Example:
        """The repository's first ``tokens`` tokens in ``tokenizer``'s tokens (base style always: the model continues
        raw code; a chat template would wrap it in a conversation)."""
        if tokenizer is None:
            raise ValueError("dataset longcode: cutting a prompt at N tokens needs the pair's tokenizer")
        text = repository_text(Path(record["root"]), record["files"])
        try:
            prompt, length = cut_to_tokens(text, tokenizer, int(record["tokens"]))
        except ValueError as error:
            raise ValueError(f"dataset longcode: repository {record['repository']}: {error}") from None
        return Example(id=self.record_id(record, index), prompt=prompt, reference=None, stop_strings=(),
                       meta={"dataset": self.name, "index": index, "prompt_style": "base",
                             "repository": record["repository"], "prompt_tokens": length,
                             "bucket_tokens": int(record["tokens"])})


if __name__ == "__main__":  # rewrite the manifest from this interpreter's standard library
    print(write_manifest())
