"""A batch of prompts that cannot fit the device's memory is refused before loading (issue 50 item 4)."""

from __future__ import annotations

import pytest

from spectr_repro.cost.shapes import batch_memory_bytes, largest_batch, pair_shapes
from spectr_repro.plan import main as main_plan


def test_the_memory_of_a_batch_grows_with_B_by_its_caches_and_logits():
    target, draft = pair_shapes("qwen25coder_1.5b_0.5b")
    one, four = (batch_memory_bytes(target, draft, 1000, 48, 7, 24, b) for b in (1, 4))
    per_prompt = 8 * 1073 * (target.kv_bytes_per_token(2) + draft.kv_bytes_per_token(2)) + 7 * 25 * (
        target.vocab * 4 + target.intermediate * 2 * 2)
    assert four - one == 3 * per_prompt
    assert one > (target.params + draft.params) * 2
    assert largest_batch(lambda b: b <= 37) == 37
    assert largest_batch(lambda b: False) == 0


def test_plan_refuses_a_replay_batch_beyond_a_tiny_memory_and_names_the_largest_that_fits(capsys):
    target, draft = pair_shapes("qwen25coder_1.5b_0.5b")
    budget = batch_memory_bytes(target, draft, 180, 48, 7, 24, 2) / 0.85 / 1e9 * 1.0001  # B = 2 fits, 3 does not
    code = main_plan(["experiment=replay_qwen_grid", f"hardware.memory_gb={budget}", "replay.batch_prompts=4",
                      "replay.datasets=[humaneval]", "replay.temperatures=[0.4]", "output_dir=unused"])
    error = capsys.readouterr().err
    assert code == 2
    assert error.count("\n") == 1 and "replay.batch_prompts=4 does not fit" in error
    assert "the largest that fits is replay.batch_prompts=2" in error
    # the same batch on the memory the device's spec offers is planned
    assert main_plan(["experiment=replay_qwen_grid", "hardware.memory_gb=141", "replay.batch_prompts=4",
                      "replay.datasets=[humaneval]", "replay.temperatures=[0.4]", "output_dir=unused"]) == 0


def test_a_cell_batch_beyond_the_memory_is_refused_too(capsys):
    code = main_plan(["model_pair=qwen25coder_1.5b_0.5b", "hardware=cpu", "hardware.batch_prompts=64",
                      "hardware.memory_gb=7", "K=3", "L=6", "num_prompts=64", "dataset=humaneval"])
    error = capsys.readouterr().err
    assert code == 2 and "hardware.batch_prompts=64 does not fit" in error and "largest that fits is" in error


def test_the_replay_refuses_it_before_any_model_loads(monkeypatch):
    from spectr_repro.errors import UsageError
    from spectr_repro.replay.driver import check_groups, parse

    groups = parse(["experiment=replay_qwen_grid", "hardware.memory_gb=7", "replay.batch_prompts=16",
                    "replay.datasets=[humaneval]", "replay.temperatures=[0.4]"])
    with pytest.raises(UsageError, match=r"replay.batch_prompts=16 does not fit.*largest that fits is"):
        check_groups(groups)
