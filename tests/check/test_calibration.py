"""The calibration file: measured shapes, kept entries, and `plan` using it in place of the cost model."""

from __future__ import annotations

import json

import pytest

from spectr_repro.cost.calibration import (
    Calibration,
    ForwardCosts,
    find_calibration,
    read_calibrations,
    write_calibration,
)
from spectr_repro.cost.measure import measure_forward_costs, plan_shapes


def _calibration(pair: str, scale: float = 1.0, dtype: str = "bfloat16") -> Calibration:
    shapes = plan_shapes([1, 3, 5], [4, 6, 8], [32, 180, 256], [1, 8])
    costs = {role: ForwardCosts(tuple((r, t, k, scale * (fixed + per * r * t)) for r, t, k in shapes[role]))
             for role, fixed, per in (("target", 0.2, 0.007), ("draft", 0.1, 0.003))}
    return Calibration("cpu", pair, dtype, "Test CPU", "2026-12-01", False, costs["target"], costs["draft"],
                       extra={"overhead_s_per_call": 0.01 * scale})


def test_plan_shapes_cover_the_run():
    shapes = plan_shapes([1, 3], [4, 8], [180], [1, 8])
    assert (3, 9, "all") in shapes["target"] and (24, 9, "all") in shapes["target"]  # K x (L+1), batched B*K
    assert (1, 180, "last") in shapes["target"] and (1, 180, "last") in shapes["draft"]  # prefill
    assert (24, 1, "last") in shapes["draft"] and (8, 2, "last") in shapes["draft"]  # draft steps, pending


def test_entries_are_kept_and_replaced(calibration_file):
    write_calibration(_calibration("qwen25coder_1.5b_0.5b"))
    write_calibration(_calibration("smollm2_135m_self"))
    write_calibration(_calibration("qwen25coder_1.5b_0.5b", scale=2.0))
    entries = read_calibrations()
    assert set(entries) == {"cpu/qwen25coder_1.5b_0.5b/bfloat16", "cpu/smollm2_135m_self/bfloat16"}
    assert entries["cpu/qwen25coder_1.5b_0.5b/bfloat16"].extra["overhead_s_per_call"] == 0.02
    assert find_calibration("cuda", "qwen25coder_1.5b_0.5b", "bfloat16") is None
    assert json.loads(calibration_file.read_text())["entries"]  # plain JSON a user can read
    calibration_file.write_text("{ damaged")
    assert read_calibrations() == {}  # a damaged file: the plan falls back to the cost model


def test_measured_costs_cover_every_shape_on_the_tiny_model():
    from spectr_repro.models.tiny import make_tiny_pair

    target, _, _ = make_tiny_pair(seed=0)
    shapes = [(1, 1, "last"), (3, 5, "all"), (1, 40, "last")]
    costs = measure_forward_costs(target, shapes, repeats=1, context_tokens=16, vocab_size=259)
    assert [(r, t, k) for r, t, k, _ in costs.points] == shapes
    assert all(seconds > 0 for *_, seconds in costs.points)


@pytest.fixture(scope="module")
def cpu_quick_cells(tmp_path_factory):
    """The cells of `plan experiment=cpu_quick` (composed once: composition is the slow part)."""
    from spectr_repro.launch.config import Composer, expand, parse_arguments
    from spectr_repro.runner.execute import plan_cells
    from spectr_repro.settings import run_config

    args = parse_arguments(["experiment=cpu_quick", f"output_dir={tmp_path_factory.mktemp('plan') / 'results'}"])
    with Composer() as composer:
        return plan_cells([run_config(cfg) for cfg in expand(composer, args, use_grid=True)])


def test_plan_uses_the_calibration_and_says_so(cpu_quick_cells):
    from spectr_repro.runner.plan import build_plan, format_plan

    assumed = build_plan(cpu_quick_cells)
    assert "calibrated on" not in format_plan(assumed) and "cost model (no finished AR cell" in format_plan(assumed)
    write_calibration(_calibration("qwen25coder_1.5b_0.5b"))
    calibrated = build_plan(cpu_quick_cells)
    assert "calibrated on Test CPU, 2026-12-01" in format_plan(calibrated)
    assert calibrated.seconds != assumed.seconds
    # every second of the estimate comes from the measured costs: twice the costs, twice the time
    write_calibration(_calibration("qwen25coder_1.5b_0.5b", scale=2.0))
    assert build_plan(cpu_quick_cells).seconds == pytest.approx(2 * calibrated.seconds, rel=1e-9)
    # a calibration of another dtype is not this run's
    write_calibration(_calibration("qwen25coder_1.5b_0.5b", dtype="float32"))
    write_calibration(_calibration("qwen25coder_1.5b_0.5b", scale=3.0, dtype="float32"))
    assert build_plan(cpu_quick_cells).seconds == pytest.approx(2 * calibrated.seconds, rel=1e-9)


def test_calibrated_batched_cells_decode_their_untimed_prompts_together():
    """8 prompts, the first 2 timed alone and 6 in one batch: the batch's calls cost more than one prompt's, and
    less than six prompts' alone."""
    from spectr_repro.cost.model import CellSpec, calibrated_cell_seconds
    from spectr_repro.launch.config import Composer
    from spectr_repro.runner.batched import split_prompts
    from spectr_repro.settings import run_config

    calibration = _calibration("qwen25coder_1.5b_0.5b")
    cell = ["experiment=cpu_quick", "method=sbv", "num_prompts=8"]
    with Composer() as composer:
        alone = run_config(composer.compose([*cell, "hardware.batch_prompts=1"]))
        batched = run_config(composer.compose([*cell, "hardware.batch_prompts=8", "hardware.timed_prompts=2"]))
    per_prompt = (calibrated_cell_seconds(CellSpec.of(alone), calibration, 3.0)
                  - calibrated_cell_seconds(CellSpec.of(alone.replace(num_prompts=7)), calibration, 3.0))
    hardware = batched.hardware
    groups = [len(batch) for batch in split_prompts(hardware.batch_prompts, hardware.timed_prompts, 8).batches]
    assert groups == [6]  # as the plan passes them
    seconds = calibrated_cell_seconds(CellSpec.of(batched), calibration, 3.0, groups)
    two_alone = calibrated_cell_seconds(CellSpec.of(alone.replace(num_prompts=2)), calibration, 3.0)
    assert two_alone + per_prompt < seconds < two_alone + 6 * per_prompt


def test_check_calibrates_the_shapes_of_the_experiments_replay():
    """`check experiment=paper_main` (make reproduce PRESET=paper) measures every K and L the replay predicts
    speed-ups at, not only those of the few timed cells; without a replay block only the cells' shapes."""
    from spectr_repro.check.run import compose, run_shapes

    base, cells = compose(["experiment=paper_main", "hardware=cpu", "model_pair=deepseek_33b_1.3b",
                           "dataset=humaneval"])
    shapes = run_shapes(base, cells)
    replay = base.group("replay")
    assert set(shapes["Ks"]) == {1, *replay["K"]} and set(shapes["Ls"]) == set(replay["L"])
    assert set(replay["L"]) - {c.L for c in cells}, "the replay's L grid is wider than the timed cells'"
    plain, plain_cells = compose(["hardware=cpu", "K=3", "L=8"])  # config.yaml's replay names no dataset
    assert run_shapes(plain, plain_cells) == {**run_shapes(plain, plain_cells), "Ks": [1, 3], "Ls": [8]}


def test_check_measures_at_the_shortest_and_the_longest_typical_context():
    """The timed cells of `speedup_qwen` decode HumanEval (~530-token prompts) while its replay's median dataset is
    far shorter: the forwards and the decodes are measured at both ends and interpolated between (one context in a
    quick check)."""
    from spectr_repro.check.run import compose, run_shapes
    from spectr_repro.data import typical_prompt_tokens

    base, cells = compose(["experiment=speedup_qwen", "hardware=cpu"])
    shapes = run_shapes(base, cells)
    datasets = {c.dataset for c in cells} | set(base.group("replay")["datasets"])
    typical = [typical_prompt_tokens(d) + int(base.max_new_tokens) // 2 for d in datasets]
    assert shapes["contexts"] == sorted({min(typical), max(typical)}) and len(shapes["contexts"]) == 2
    assert typical_prompt_tokens("humaneval") + int(base.max_new_tokens) // 2 == shapes["contexts"][-1]
    assert run_shapes(base, cells, quick=True)["contexts"] == [shapes["context"]]


class _WordTokenizer:
    """A tokenizer of whitespace-separated words, without a chat template (base prompts)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True, return_tensors="pt"):
        import torch

        return type("Encoded", (), {"input_ids": torch.zeros(1, len(text.split()), dtype=torch.long)})()


def test_the_contexts_come_from_the_real_prompts_in_the_pairs_tokens():
    """After loading, `check` replaces the registry's typical lengths with the mean length of the prompts a run
    decodes (the seeded first num_prompts) in the pair's tokens, plus half the new tokens: shortest and longest."""
    from types import SimpleNamespace

    from spectr_repro.check.costs import prompt_contexts
    from spectr_repro.check.run import compose, run_shapes
    from spectr_repro.data import encode_prompt, load_examples

    base, cells = compose(["experiment=speedup_qwen", "hardware=cpu"])
    shapes = run_shapes(base, cells)
    tokenizer = _WordTokenizer()
    prompt_contexts(base, SimpleNamespace(tokenizer=tokenizer), shapes)
    means = []
    for name in ("humaneval", "lm1b"):
        examples = load_examples(name, int(base.num_prompts), seed=int(base.seed), tokenizer=tokenizer)
        lengths = [encode_prompt(tokenizer, e).shape[-1] for e in examples]
        means.append(round(sum(lengths) / len(lengths)) + int(base.max_new_tokens) // 2)
    assert means[0] in shapes["contexts"]  # HumanEval's prompts are the longest of the five datasets'
    assert shapes["contexts"][0] <= means[1] and len(shapes["contexts"]) == 2
    unchanged = run_shapes(base, cells)
    prompt_contexts(base, SimpleNamespace(tokenizer=None), unchanged)  # no tokenizer (the tiny pair): the registry's
    assert unchanged["contexts"] == run_shapes(base, cells)["contexts"]


def test_check_calibrates_each_long_input_buckets_context():
    """`check experiment=context_qwen` measures the forwards at each bucket's mean context (its input plus half the
    new tokens) beside the usual one, so the buckets' calls are priced from measurements; without buckets, one."""
    from spectr_repro.check.run import compose, run_shapes

    base, cells = compose(["experiment=context_qwen"])
    shapes = run_shapes(base, cells)
    half = int(base.max_new_tokens) // 2
    assert {n + half for n in (1024, 4096, 8192, 16384)} <= set(shapes["contexts"])
    assert set(shapes["Ks"]) == {1, 3, 7} and set(shapes["Ls"]) == {1, 2, 3, 4, 5, 6}
    # a decode prefills its context: never at a bucket while an ordinary context (here the base cell's) is there
    assert len(shapes["decode_contexts"]) == 1 and shapes["decode_contexts"][0] < 1024
    plain, plain_cells = compose(["hardware=cpu", "K=3", "L=8"])
    plain_shapes = run_shapes(plain, plain_cells)
    assert plain_shapes["contexts"] == plain_shapes["decode_contexts"] == [plain_shapes["context"]]


def test_the_calibration_prompts_tokenize_each_dataset_prompt_once_for_every_context(monkeypatch):
    """`check` cuts the forwards' context and each decode context from the dataset's first prompts one after
    another: each prompt goes through the tokenizer once per run, not once per context (16 prompts a context
    before). Each cut is the text's last tokens, as long as asked; a context longer than the text is random tokens."""
    from types import SimpleNamespace

    import torch

    from spectr_repro.check import costs
    from spectr_repro.check.costs import CALIBRATION_PROMPTS, calibration_prompts
    from spectr_repro.check.run import compose

    encoded = []
    original = costs.encode_prompt
    monkeypatch.setattr(costs, "encode_prompt", lambda tokenizer, example, **kw: encoded.append(example.id)
                        or original(tokenizer, example, **kw))
    base, _ = compose(["hardware=cpu", "dataset=humaneval"])
    loaded = SimpleNamespace(tokenizer=_WordTokenizer(), vocab_size=50)
    lengths = [64, 200, 100_000]
    prompts = calibration_prompts(base, loaded, lengths, "cpu")
    assert len(encoded) == CALIBRATION_PROMPTS and len(set(encoded)) == len(encoded)  # each prompt once
    assert [p.numel() for p in prompts] == lengths and all(p.dtype == torch.long for p in prompts)
    assert torch.equal(prompts[0], prompts[1][-64:])  # cut from the same text: the shorter is the longer's end
    assert (prompts[0] == 0).all() and prompts[2].max() > 0  # the word tokenizer's ids are 0; random ones are not
