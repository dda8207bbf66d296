"""Damaged local data: the folder's SHA256SUMS is checked (cached by size and mtime), and every parse
error is one ValueError naming the file and the line. Each case runs on a writable copy of shared/datasets,
with and without its SHA256SUMS."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from spectr_repro.data import checksums, get_dataset
from spectr_repro.runner.cli import main_run

REPO = Path(__file__).resolve().parents[2]
_CANDIDATES = [Path(os.environ["SPECTR_REPRO_DATA"])] if os.environ.get("SPECTR_REPRO_DATA") else []
_CANDIDATES.append(REPO.parent / "shared" / "datasets")
DATA_DIR = next((p for p in _CANDIDATES if (p / "SHA256SUMS").is_file()), None)
pytestmark = pytest.mark.skipif(DATA_DIR is None, reason="no local dataset copies with a SHA256SUMS")
SUBFOLDERS = ("humaneval", "gsm8k", "mgsm", "alpaca", "lm1b")


@pytest.fixture(params=["with_sums", "without_sums"])
def data(request, tmp_path) -> tuple[Path, bool]:
    """A writable copy of the data folder; ``without_sums``: its SHA256SUMS removed."""
    copy = tmp_path / "datasets"
    copy.mkdir()
    for name in SUBFOLDERS:
        shutil.copytree(DATA_DIR / name, copy / name)
    shutil.copy(DATA_DIR / "SHA256SUMS", copy / "SHA256SUMS")
    for path in copy.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    if request.param == "without_sums":
        (copy / "SHA256SUMS").unlink()
    return copy, request.param == "with_sums"


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _load_error(name: str, folder: Path, **options) -> str:
    with pytest.raises(ValueError) as caught:
        get_dataset(name).load_records(folder, **options)
    return str(caught.value)


def _assert_names_damage(message: str, path: Path, checked: bool, where: str) -> None:
    assert str(path) in message, message
    if checked:
        assert "does not match" in message and "SHA256SUMS" in message and "sha256sum -c" in message, message
    else:
        assert where in message and ("truncated or damaged" in message or "not a number" in message), message


def test_truncated_humaneval_gz(data):
    folder, checked = data
    path = folder / "humaneval" / "HumanEval.jsonl.gz"
    _truncate(path, path.stat().st_size // 2)
    # without the sums: the gzip stream ends early (EOFError today), named with the last good line
    _assert_names_damage(_load_error("humaneval", folder), path, checked, "unreadable after line")


def test_truncated_gsm8k_jsonl(data):
    folder, checked = data
    path = folder / "gsm8k" / "test.jsonl"
    _truncate(path, path.stat().st_size - 100)  # the last record cut in the middle
    _assert_names_damage(_load_error("gsm8k", folder), path, checked, "line 1319")


def test_truncated_alpaca_json(data):
    folder, checked = data
    path = folder / "alpaca" / "alpaca_data_head.json"
    _truncate(path, path.stat().st_size // 3)
    _assert_names_damage(_load_error("alpaca", folder), path, checked, "line ")


@pytest.mark.parametrize("newline", [True, False])
def test_mgsm_answer_with_its_last_digit_cut(data, newline):
    folder, checked = data
    path = folder / "mgsm" / "mgsm_en.tsv"
    text = path.read_bytes()
    assert text.endswith(b"\t5,600\n")
    path.write_bytes(text[:-2] + (b"\n" if newline else b""))  # "5,600" -> "5,60": parsed as '5' today
    message = _load_error("mgsm", folder)
    _assert_names_damage(message, path, checked, "line 250")
    if not checked:
        assert "'5,60' is not a number" in message


def test_other_damage_names_file_and_line(data):
    folder, checked = data
    if checked:
        (folder / "SHA256SUMS").unlink()  # the parsers' own messages
    mgsm = folder / "mgsm" / "mgsm_de.tsv"
    lines = mgsm.read_bytes().split(b"\n")
    lines[6] = lines[6].replace(b"\t", b" ")  # one column on line 7
    mgsm.write_bytes(b"\n".join(lines))
    assert f"{mgsm}, line 7: expected 2 tab-separated columns" in _load_error("mgsm", folder, language="de")
    lm1b = folder / "lm1b" / "news.en.heldout-00000-of-00050"
    lm1b.write_bytes(b"fine line\nbad \xff byte\n")
    assert f"{lm1b}, line 2: not UTF-8" in _load_error("lm1b", folder)
    gsm = folder / "gsm8k" / "test.jsonl"
    gsm.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q"}\n')
    assert f"{gsm}, line 2: record lacks the text field(s) ['answer']" in _load_error("gsm8k", folder)
    gsm.write_text("")
    assert f"no records in {gsm}" in _load_error("gsm8k", folder)
    he = folder / "humaneval" / "HumanEval.jsonl.gz"
    he.write_bytes(b"not gzip at all")
    assert str(he) in _load_error("humaneval", folder)


def test_intact_folder_loads_and_is_hashed_once_per_size_and_mtime(data, monkeypatch):
    folder, checked = data
    if not checked:
        pytest.skip("nothing is hashed without a SHA256SUMS")
    hashed = []
    real = checksums.sha256_of
    monkeypatch.setattr(checksums, "sha256_of", lambda path: hashed.append(path.name) or real(path))
    assert len(get_dataset("mgsm").load_records(folder, language="en,de")) == 500
    assert len(get_dataset("mgsm").load_records(folder, language="en")) == 250
    assert hashed == ["mgsm_en.tsv", "mgsm_de.tsv"]  # each once; the second load hashed nothing
    # changed after it was checked (same size, new mtime): hashed again and refused
    path = folder / "mgsm" / "mgsm_en.tsv"
    text = path.read_bytes()
    path.write_bytes(text.replace(b"\t18\n", b"\t19\n", 1))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert "does not match" in _load_error("mgsm", folder)
    assert hashed[-1] == "mgsm_en.tsv" and len(hashed) == 3


def test_malformed_sums_file_names_its_line(data):
    folder, checked = data
    if not checked:
        pytest.skip("needs the SHA256SUMS")
    sums = folder / "SHA256SUMS"
    sums.write_text(sums.read_text() + "not a checksum line\n")
    assert f"{sums}, line 17: not a sha256sum line" in _load_error("gsm8k", folder)


def test_unlisted_files_are_read_unchecked(data):
    folder, checked = data
    # A full alpaca_data.json dropped in later is not in the list (SOURCES.md, section 5).
    full = folder / "alpaca" / "alpaca_data.json"
    full.write_text('[{"instruction": "i", "input": "", "output": "o"}]')
    assert len(get_dataset("alpaca").load_records(folder)) == 1


def test_runner_prints_a_damaged_file_as_one_message(data, monkeypatch, capsys):
    folder, checked = data
    path = folder / "humaneval" / "HumanEval.jsonl.gz"
    _truncate(path, path.stat().st_size // 2)
    monkeypatch.setenv("SPECTR_REPRO_DATA", str(folder))
    out = folder.parent / "results"
    code = main_run(["model_pair=tiny_random", "dataset=humaneval", "logger=disabled", "num_prompts=1",
                     "max_new_tokens=4", f"output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "EOFError" not in err.split(str(path))[0]
    assert "error: cannot load dataset humaneval" in err and str(path) in err


def test_gzip_copy_is_really_gzip():
    # the fixture's damage must hit the real format: the stored file is gzip, 164 records
    with gzip.open(DATA_DIR / "humaneval" / "HumanEval.jsonl.gz", "rt") as handle:
        assert sum(1 for line in handle if line.strip()) == 164
