"""Committed results (spectr_repro.committed, `seal`, `spotcheck`) on a replay of the tiny random pair.

What a reviewer relies on: sealing packs every finished prompt and names its environment and rules' fingerprint;
`seal --check` finds any edited, missing or unsealed file on a clone that holds only the packed copies; the report
reads the packed copies and never pools two versions of a rule; the spot check re-runs committed prompts and
finds them identical here, and finds an edited record (negative control).
"""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from spectr_repro.analysis.replay import read_blocks
from spectr_repro.committed import check_group, groups_under, packed_blocks
from spectr_repro.environment import environment
from spectr_repro.errors import UsageError
from spectr_repro.records import file_integrity
from spectr_repro.replay import seal, spotcheck
from spectr_repro.replay.driver import main as replay

ARGS = ["model_pair=tiny_random", "dataset=humaneval", "temperature=0.7", "logger=disabled", "method=sd,bv,sbv",
        "K=1,2", "L=2,3", "max_new_tokens=8", "replay.draws=2", "replay.batch_prompts=2"]


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


@pytest.fixture(scope="module")
def sealed_results(tmp_path_factory):
    """A replay of 3 prompts (a batch of two, then one alone), sealed once for the module."""
    root = tmp_path_factory.mktemp("sealed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECTR_REPRO_RUNNERS", str(root / "runners"))
        assert replay([*ARGS, f"output_dir={root / 'results'}", "num_prompts=3"]) == 0
        assert seal.main([str(root / "results")]) == 0
    return root / "results"


@pytest.fixture
def replayed(sealed_results, tmp_path):
    """This test's own copy of the sealed replay; returns its group folder."""
    shutil.copytree(sealed_results, tmp_path / "results")
    [group] = groups_under(tmp_path / "results")
    return group


def clone_of(group, tmp_path):
    """What a fresh clone holds: the files .gitignore re-includes (settings, manifest, done files, packed blocks)."""
    target = tmp_path / "clone" / group.name
    for path in group.rglob("*"):
        if path.is_file() and (path.name in ("replay.json", "manifest.json", "done.json")
                               or path.name.endswith(".jsonl.gz")):
            (target / path.relative_to(group)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / path.relative_to(group))
    return target


def test_seal_records_every_prompt_with_its_environment_and_fingerprint(replayed):
    manifest = json.loads((replayed / "manifest.json").read_text())
    assert sorted(manifest["prompts"]) == ["0000", "0001", "0002"]
    for index, entry in manifest["prompts"].items():
        done = json.loads((replayed / "prompts" / index / "done.json").read_text())
        assert manifest["rules_fingerprints"][entry["rules_fingerprint"]] == done["rules_fingerprint"]
        assert set(done["rules_fingerprint"]) == {"sd", "bv", "sbv"}
        assert manifest["environments"][entry["environment"]]["torch"] == done["environment"]["torch"]
        assert manifest["environments"][entry["environment"]]["dtype"] == done["environment"]["dtype"] == "float32"
        assert entry["backfilled"] is False
        text = (replayed / "prompts" / index / "blocks.jsonl").read_text()
        packed = (replayed / "prompts" / index / "blocks.jsonl.gz").read_bytes()
        assert gzip.decompress(packed).decode() == text and packed == packed_blocks(text)  # deterministic bytes
    assert [json.loads((replayed / "prompts" / i / "done.json").read_text())["batch"] for i in ("0000", "0002")] \
        == [[0, 1], [2]]
    assert manifest["current_rules_fingerprint"]["bv"] == manifest["rules_fingerprints"][
        manifest["prompts"]["0000"]["rules_fingerprint"]]["bv"]


def test_a_clone_with_packed_blocks_only_checks_and_reports_the_same(replayed, tmp_path, capsys):
    clone = clone_of(replayed, tmp_path)
    assert not list(clone.rglob("blocks.jsonl"))
    assert check_group(clone) == (3, [])
    assert seal.main(["--check", str(clone)]) == 0
    original, _ = read_blocks(replayed.parent)
    cloned, left_out = read_blocks(clone.parent)
    assert left_out == [] and len(cloned) == len(original) > 0
    assert cloned["tokens"].tolist() == original["tokens"].tolist()


@pytest.mark.parametrize("damage, message", [
    ("edit_packed", "not the file manifest.json records"),
    ("drop_packed", "missing (manifest.json lists it)"),
    ("edit_done", "prompts/0001/done.json: not the file manifest.json records"),
    ("unsealed", "finished but not in manifest.json"),
])
def test_check_names_each_damage(replayed, tmp_path, capsys, damage, message):
    clone = clone_of(replayed, tmp_path)
    prompt = clone / "prompts" / "0001"
    if damage == "edit_packed":
        text = gzip.decompress((prompt / "blocks.jsonl.gz").read_bytes()).decode().replace('"sd"', '"bv"', 1)
        (prompt / "blocks.jsonl.gz").write_bytes(packed_blocks(text))
    elif damage == "drop_packed":
        (prompt / "blocks.jsonl.gz").unlink()
    elif damage == "edit_done":
        done = json.loads((prompt / "done.json").read_text())
        (prompt / "done.json").write_text(json.dumps({**done, "new_tokens": 99}))
    else:
        shutil.copytree(prompt, clone / "prompts" / "0009")
    assert seal.main(["--check", str(clone)]) == 1
    assert message in capsys.readouterr().err


def test_the_readme_table_of_committed_results_comes_from_their_records(replayed, tmp_path):
    """README's results block for committed results is built from the records a clone holds (no summary file is
    committed), names them as its source and leaves nothing in the committed tree."""
    from spectr_repro.analysis.readme import render

    clone = clone_of(replayed, tmp_path)
    before = sorted(p.name for p in clone.parent.rglob("*"))
    text = render(clone.parent, tmp_path)
    assert "From the committed records in `clone` (sealed " in text and "| SBV " in text
    assert sorted(p.name for p in clone.parent.rglob("*")) == before


def test_seal_refuses_a_folder_without_a_replay(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert seal.main([str(tmp_path / "empty")]) == 2
    assert "no replay group" in capsys.readouterr().err
    assert not list((tmp_path / "empty").iterdir())


def test_prompts_without_provenance_need_a_named_backfill(replayed, capsys):
    """Prompts written before done.json named its environment (the grid's first round) are sealed only when the
    sealer names the commit of the run that wrote them; they are marked backfilled."""
    done_path = replayed / "prompts" / "0002" / "done.json"
    done = json.loads(done_path.read_text())
    done_path.write_text(json.dumps({k: v for k, v in done.items() if k not in ("environment", "rules_fingerprint")}))
    assert seal.main([str(replayed)]) == 0
    assert "0002" not in json.loads((replayed / "manifest.json").read_text())["prompts"]
    assert "names no environment" in capsys.readouterr().err
    assert seal.main([str(replayed), "--backfill-commit", "abc1234"]) == 0
    entry = json.loads((replayed / "manifest.json").read_text())["prompts"]["0002"]
    manifest = json.loads((replayed / "manifest.json").read_text())
    assert entry["backfilled"] is True and manifest["environments"][entry["environment"]]["git_commit"] == "abc1234"
    # a later seal (new prompts of a later round) keeps the backfilled prompt as that seal named it, while its
    # done.json is unchanged (2026-12-06: re-sealing the grid dropped 16 backfilled prompts from their manifests)
    assert seal.main([str(replayed)]) == 0
    again = json.loads((replayed / "manifest.json").read_text())
    assert again["prompts"]["0002"] == entry and again["environments"][entry["environment"]]["git_commit"] == "abc1234"
    assert seal.main([str(replayed), "--check"]) == 0
    # negative control: an edited done.json is not vouched for by the old entry; it is skipped, named
    done_path.write_text(done_path.read_text() + " ")
    assert seal.main([str(replayed)]) == 0
    assert "0002" not in json.loads((replayed / "manifest.json").read_text())["prompts"]


def test_the_report_pools_one_version_of_each_rule(replayed, tmp_path):
    """A prompt whose sbv was judged by another version (its fingerprint differs from the current one) gives no sbv
    rows, named in what was left out; its sd and bv rows stay. Negative control: the same version is kept."""
    clone = clone_of(replayed, tmp_path)
    done_path = clone / "prompts" / "0001" / "done.json"
    done = json.loads(done_path.read_text())
    before, _ = read_blocks(clone.parent)
    done["rules_fingerprint"]["sbv"] = "000000000000"
    done_path.write_text(json.dumps(done))
    after, left_out = read_blocks(clone.parent)
    prompt = done["prompt_id"]
    assert not ((after["prompt_id"] == prompt) & (after["method"] == "sbv")).any()
    assert ((after["prompt_id"] == prompt) & (after["method"] == "bv")).any()
    assert len(before) - len(after) == ((before["prompt_id"] == prompt) & (before["method"] == "sbv")).sum()
    assert any("left out sbv on 1 prompt(s) replayed with fingerprint 000000000000" in note for note in left_out)


def test_spotcheck_finds_committed_prompts_identical_and_an_edited_one(replayed, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert spotcheck.main([str(replayed.parent), "-k", "2", "--seed", "1", "--logger", "disabled"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 prompt(s) identical, 0 unexplained" in out
    report = json.loads((tmp_path / "results" / "spotcheck" / "spotcheck.json").read_text())
    assert len(report) == 2 and all(row["identical"] for row in report)
    # Negative control: a committed value edited (its hashes made to agree, as a careless rewrite would) is found.
    for index in ("0000", "0001", "0002"):
        prompt = replayed / "prompts" / index
        lines = [json.loads(line) for line in (prompt / "blocks.jsonl").read_text().splitlines()]
        lines[0]["values"][0][3] += 0.25
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (prompt / "blocks.jsonl").write_text(text)
        done = json.loads((prompt / "done.json").read_text())
        (prompt / "done.json").write_text(json.dumps({**done, "records": {"blocks.jsonl": file_integrity(text)}}))
    assert seal.main([str(replayed)]) == 0
    assert spotcheck.main([str(replayed.parent), "-k", "1", "--logger", "disabled"]) == 1
    assert "DIFFERS, unexplained" in capsys.readouterr().out


def test_two_prompts_of_one_batch_rerun_it_once(replayed, tmp_path, capsys, monkeypatch):
    """Prompts 0 and 1 were replayed together: drawing both re-runs their batch once and compares each."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(spotcheck, "choose", lambda folders, k, seed, like: [(replayed, "0000"), (replayed, "0001")])
    batches, real = [], spotcheck.rerun
    monkeypatch.setattr(spotcheck, "rerun", lambda *args: batches.append(args[2]) or real(*args))
    assert spotcheck.main([str(replayed.parent), "-k", "2", "--logger", "disabled"]) == 0
    assert batches == [[0, 1]] and "2 of 2 prompt(s) identical" in capsys.readouterr().out


def test_here_draws_only_prompts_recorded_in_this_environment(replayed, tmp_path):
    """--here: a prompt recorded on another machine kind is never drawn; with none left, a refusal before any model
    loads. Control: without --here the same seeds draw it."""
    manifest_path = replayed / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    elsewhere = {**manifest["environments"][manifest["prompts"]["0001"]["environment"]], "device_name": "Other CPU"}
    manifest["environments"]["elsewhere"] = elsewhere
    manifest["prompts"]["0001"]["environment"] = "elsewhere"
    manifest_path.write_text(json.dumps(manifest))
    here = environment()
    drawn_here = {index for seed in range(20) for _, index in spotcheck.choose([replayed], 2, seed, here)}
    drawn_anywhere = {index for seed in range(20) for _, index in spotcheck.choose([replayed], 2, seed)}
    assert drawn_here == {"0000", "0002"} and "0001" in drawn_anywhere
    with pytest.raises(UsageError, match="2 committed recorded in this environment"):
        spotcheck.choose([replayed], 3, 0, here)


def test_spotcheck_reruns_a_prompt_in_its_recorded_dtype():
    """A prompt's done.json names its dtype; a replay.json of before 2026-12-06 named the folder's; neither: the
    pair's own (no override)."""
    meta = {"model_pair": "tiny_random", "dataset": "humaneval", "temperature": 0.7, "num_prompts": 2,
            "max_new_tokens": 8, "seed": 0, "K": [1], "L": [2], "reference": "sbv", "reference_K": 1,
            "reference_L": 2, "draws": 2, "row_groups": "disjoint", "sampled": []}

    def dtype_argument(meta, dtype):
        argv = spotcheck.rebuild_arguments(meta, None, 1, ["sd"], None, dtype)
        return [a for a in argv if a.startswith("hardware.dtype=")]

    assert dtype_argument(meta, "bfloat16") == ["hardware.dtype=bfloat16"]
    assert dtype_argument({**meta, "dtype": "float32"}, None) == ["hardware.dtype=float32"]
    assert dtype_argument({**meta, "dtype": "float32"}, "bfloat16") == ["hardware.dtype=bfloat16"]
    assert dtype_argument({**meta, "dtype": "None"}, None) == dtype_argument(meta, None) == []


def test_spotcheck_bad_input_is_exit_2(tmp_path, capsys):
    assert spotcheck.main([str(tmp_path), "--logger", "disabled"]) == 2
    assert "no sealed replay group" in capsys.readouterr().err
