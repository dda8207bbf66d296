"""The roofline (spectr_repro.cost.roofline): bytes, FLOPs and parameters by hand and against transformers, the
call and speed-up through the one cost model, the paper's table, the report section and the docs block."""

from __future__ import annotations

import datetime as dt
import inspect
import json
from pathlib import Path

import pytest

from spectr_repro.cost.calibration import Calibration, ForwardCosts, write_calibration
from spectr_repro.cost.model import seconds_per_call
from spectr_repro.cost.roofline import (
    ARCHITECTURE_CONFIGS,
    PAPER_ACCELERATORS,
    PAPER_CONTEXT,
    Accelerator,
    ModelShape,
    accelerator,
    allowed_speedup,
    allowed_tokens_per_s,
    forwards_per_call,
    implied_overhead_from_tokens_per_s,
    implied_overhead_s,
    load_accelerators,
    model_shape,
    pair_shapes,
    paper_speedups_against_roofline,
    release_tokens_per_s_against_roofline,
    roofline_against_calibration,
    roofline_call_costs,
    roofline_forward_seconds,
    shape_from_config,
)

REPO = Path(__file__).resolve().parents[2]

# Hand-sized models: every count below is worked out in the comments.
# target: q 2x2, k 2x2, v 2x2, o 2x2 = 16; MLP 3 x 2x3 = 18; two norms 4  -> 38 a layer; + final norm 2 = body 40;
#         embedding 5x2 = 10, untied head 10 -> 60 params; a forward reads 50 of them (not the input embedding).
TARGET = ModelShape("toy target", layers=1, hidden=2, intermediate=3, heads=1, kv_heads=1, head_dim=2, vocab=5,
                    tied=False)
# draft: attention 16, MLP 3 x 2x1 = 6, norms 4 -> 26 a layer; body 28; embedding 10, tied -> 38 params, all read.
DRAFT = ModelShape("toy draft", layers=1, hidden=2, intermediate=1, heads=1, kv_heads=1, head_dim=2, vocab=5,
                   tied=True)
# 1 byte/s and 1 FLOP/s: seconds are bytes or FLOPs, readable by hand.
SLOW = Accelerator(key="slow", name="1 B/s, 1 FLOP/s", bandwidth_gbs=1e-9, bf16_tflops=1e-12)
# 1 byte/s and so many FLOP/s that compute never binds: seconds are the bytes moved.
MEMORY_BOUND = Accelerator(key="memory", name="1 B/s, 1e15 FLOP/s", bandwidth_gbs=1e-9, bf16_tflops=1e3)


def test_parameters_and_bytes_by_hand():
    assert (TARGET.layer_params, TARGET.body_params, TARGET.params, TARGET.streamed_params) == (38, 40, 60, 50)
    assert (DRAFT.layer_params, DRAFT.body_params, DRAFT.params, DRAFT.streamed_params) == (26, 28, 38, 38)
    assert TARGET.weight_bytes(2) == 100 and DRAFT.weight_bytes(2) == 76
    assert TARGET.kv_bytes_per_token(2) == 2 * 1 * 1 * 2 * 2  # keys and values, 1 layer, 1 head of 2, 2 bytes


def test_a_forward_costs_the_slower_roof():
    """Float32 (4 bytes) on 1 B/s and 1 FLOP/s. Decode, 1 x 1 on 10 cached tokens: bytes 200 + 11 x 16 = 376;
    FLOPs 2 x 40 + 2 x 5 x 2 (head, one position) + 4 x 2 x (10 + 1) (attention) = 188: memory binds, 376 s.
    3 rows x 4 tokens, every position scored: bytes 200 + 3 x 14 x 16 = 872; FLOPs 2 x 40 x 12 + 2 x 10 x 12
    + 4 x 2 x 12 x (10 + 2.5) = 960 + 240 + 1200 = 2400: compute binds, 2400 s."""
    assert roofline_forward_seconds(TARGET, SLOW, 1, 1, 10, "last", width=4) == pytest.approx(376)
    assert roofline_forward_seconds(TARGET, SLOW, 3, 4, 10, "all", width=4) == pytest.approx(2400)
    # The max, not the sum (376 + 188 would be 564), and the overhead is added once per forward.
    assert roofline_forward_seconds(TARGET, SLOW, 1, 1, 10, "last", width=4, overhead_s=5.0) == pytest.approx(381)


def test_a_call_and_the_allowed_speed_up_by_hand():
    """Memory-bound, 2-byte weights, no cached context: target(r, t) = 100 + 8 r t, draft(r, t) = 76 + 8 r t.
    K=1, L=2: call = target(1, 3) + draft(1, 2) + 1 x draft(1, 1) = 124 + 92 + 84 = 300; AR = target(1, 1) = 108;
    at BE 2 the speed-up is 2 x 108 / 300 = 0.72. K=2, L=2: target(2, 3) + draft(1, 2) + draft(2, 1) =
    148 + 92 + 92 = 332 (each of the K rows starts with the last emitted token: no forward of that token alone)."""
    target, draft = roofline_call_costs(TARGET, DRAFT, MEMORY_BOUND, 1, 2, context=0)
    assert seconds_per_call(target, draft, 1, 2) == pytest.approx(300)
    assert allowed_speedup(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, context=0) == pytest.approx(0.72)
    assert allowed_speedup(TARGET, DRAFT, MEMORY_BOUND, 2, 2, 3.0, context=0) == pytest.approx(3 * 108 / 332)


def test_the_implied_overhead_by_hand_and_back():
    """K=1, L=2 on the memory-bound toy: AR 108, a call of 300 in n = 3 forwards, BE 2. The roofline allows 0.72,
    and as a per-forward overhead o grows, 2 (108 + o) / (300 + 3 o) falls towards BE / n = 0.67. A reported 0.70
    needs o = (0.70 x 300 - 2 x 108) / (2 - 0.70 x 3) = 60; 0.5 (below 0.67) and 0.8 (above 0.72) need none."""
    assert forwards_per_call(1, 2) == 3 and forwards_per_call(3, 2) == 3
    overhead = implied_overhead_s(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, speedup=0.70)
    assert overhead == pytest.approx(60)
    assert allowed_speedup(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, overhead_s=overhead) == pytest.approx(0.70)
    # Below BE / n no overhead reaches it, and above the roofline's own bound none either.
    assert implied_overhead_s(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, speedup=0.5) is None
    assert implied_overhead_s(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, speedup=0.8) is None
    # Tokens/s: BE / (300 + 3 o) = 2 / 480 at o = 60; a rate above the roofline's (2 / 300) has none.
    assert implied_overhead_from_tokens_per_s(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, 2 / 480) == pytest.approx(60)
    assert implied_overhead_from_tokens_per_s(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, 2 / 299) is None
    assert allowed_tokens_per_s(TARGET, DRAFT, MEMORY_BOUND, 1, 2, 2.0, 0, overhead_s=60) == pytest.approx(2 / 480)


def test_the_allowed_speed_up_grows_with_block_efficiency_and_falls_with_the_drafts_cost():
    target, draft = pair_shapes("deepseek_33b_1.3b")
    h100 = accelerator("H100")
    speedups = [allowed_speedup(target, draft, h100, 3, 12, be, PAPER_CONTEXT) for be in (1.0, 2.0, 4.0, 8.0)]
    assert all(a < b for a, b in zip(speedups, speedups[1:]))
    assert speedups[3] == pytest.approx(8 * speedups[0])  # tokens per call only scale the call's tokens
    _, bigger_draft = pair_shapes("codellama_13b_7b")  # a 6.7B draft instead of 1.3B, same block efficiency
    assert allowed_speedup(target, bigger_draft, h100, 3, 12, 8.0, PAPER_CONTEXT) < speedups[3]
    # Longer drafts cost more draft forwards: at a fixed block efficiency, L=24 allows less than L=12.
    assert allowed_speedup(target, draft, h100, 3, 24, 8.0, PAPER_CONTEXT) < speedups[3]


def test_a_decode_forward_of_the_33b_target_is_its_weights_over_the_bandwidth():
    """33.34e9 parameters, 32256 x 7168 of them the untied input embedding (not read): 33.11e9 x 2 bytes over
    2,039 GB/s = 32.5 ms on an A100-80GB; 62 layers x 8 KV heads x 128 x 2 x 2 bytes = 254 kB per cached token."""
    target, _ = pair_shapes("deepseek_33b_1.3b")
    assert target.kv_bytes_per_token(2) == 2 * 62 * 8 * 128 * 2
    seconds = roofline_forward_seconds(target, accelerator("A100-80GB"), 1, 1, 0)
    assert seconds == pytest.approx((33.343e9 - 32256 * 7168) * 2 / 2039e9, rel=1e-3)
    assert seconds == pytest.approx(0.0325, rel=0.01)


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen2.5-Coder-0.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                    "deepseek-ai/deepseek-coder-1.3b-instruct", "JackFram/llama-68m"])
def test_parameter_and_cache_counts_agree_with_transformers(hub_id):
    """The hand formula against the model transformers builds from the same config (on the meta device): Qwen2's
    q/k/v biases and tied head, SmolLM2's grouped KV heads, DeepSeek's and JackFram's untied heads."""
    from transformers import AutoConfig

    from spectr_repro.check.architectures import kv_cache_bytes, parameter_count

    config_json = json.loads((ARCHITECTURE_CONFIGS / (hub_id.replace("/", "__") + ".json")).read_text())
    shape = shape_from_config(hub_id, config_json)
    config = AutoConfig.for_model(**config_json)
    assert shape.params == parameter_count(config)
    assert 3 * 100 * shape.kv_bytes_per_token(2) == kv_cache_bytes(config, rows=3, context=100, width=2)


def test_the_shipped_architectures_match_the_model_cards():
    """Every packaged hub pair's shipped config.json gives the parameter count its pair config states (params_b,
    from the model cards) within 1.5 %: a wrong layer count, width or vocabulary would be off by far more."""
    from spectr_repro.models import pair_config, pair_names

    checked = 0
    for name in pair_names():
        pair = pair_config(name)
        if pair["source"] == "tiny":
            continue
        for role in ("target", "draft"):
            hub_id = pair[role]["hub_id"]
            shape = shape_from_config(hub_id, json.loads(
                (ARCHITECTURE_CONFIGS / (hub_id.replace("/", "__") + ".json")).read_text()))
            assert shape.params / 1e9 == pytest.approx(pair[role]["params_b"], rel=0.015), (name, role, hub_id)
            checked += 1
    assert checked >= 20


def test_the_tiny_pair_has_its_code_shape():
    from spectr_repro.models import pair_config
    from spectr_repro.models.tiny import make_tiny_pair

    target, draft, _ = make_tiny_pair()
    pair = pair_config("tiny_random")
    for model, role in ((target, "target"), (draft, "draft")):
        assert model_shape(pair, role).params == sum(p.numel() for p in model.parameters())


def test_the_accelerators_carry_sources_dates_and_dense_figures():
    accelerators = load_accelerators()
    assert {"A100-40GB", "A100-80GB", "H100", "H20", "H200"} <= set(accelerators)
    for device in accelerators.values():
        assert device.source and device.bandwidth_gbs > 100 and device.bf16_tflops > 10 and device.memory_gb
        dt.date.fromisoformat(device.recorded)
    # Dense, not the 2:4-sparse figures datasheets print first (1,979 for Hopper, 624 for the A100).
    assert accelerators["H100"].bf16_tflops == pytest.approx(1979 / 2, rel=0.01)
    assert accelerators["A100-80GB"].bf16_tflops == pytest.approx(624 / 2)
    with pytest.raises(ValueError, match="known: .*H100"):
        accelerator("H1000")


def test_the_paper_table_sets_each_reported_speed_up_beside_the_roofline():
    from spectr_repro.paper import load_paper_numbers

    paper = load_paper_numbers()
    labelled = paper[paper["model_pair"] != ""]
    both = labelled.pivot_table(index=["model_pair", "dataset", "method"], columns="metric", values="value")
    expected = both.dropna(subset=["block_efficiency", "speedup"])
    table = paper_speedups_against_roofline(paper)
    assert len(table) == len(expected) == 8
    assert dict(zip(table["method"], table["K"])) == {"sd": 1, "gbv": 1, "spectr": 3, "spectr_gbv": 3}
    assert set(table["L"]) == {12}
    row = table[(table["model_pair"] == "deepseek_6.7b_1.3b") & (table["method"] == "spectr_gbv")].iloc[0]
    assert row["paper_block_efficiency"] == 6.84 and row["paper_speedup"] == 1.20
    target, draft = pair_shapes("deepseek_6.7b_1.3b")
    for key in PAPER_ACCELERATORS:
        allowed = allowed_speedup(target, draft, accelerator(key), 3, 12, 6.84, PAPER_CONTEXT)
        assert row[f"allowed_{key}"] == pytest.approx(allowed)
        assert row[f"reported_over_allowed_{key}"] == pytest.approx(1.20 / allowed)
    # Fewer rows without the speed-ups: a pair with a block efficiency only is not set against anything.
    assert paper_speedups_against_roofline(paper[paper["metric"] != "speedup"]).empty


def test_the_release_table_prices_its_tokens_per_s_on_an_h20():
    table = release_tokens_per_s_against_roofline()
    # Block efficiency and tokens/s are both reported for the 7B pairs' GBV and SpecTr-GBV (MCSD is a tree: not priced).
    assert sorted(zip(table["model_pair"], table["method"])) == [
        ("llama2_7b_160m", "gbv"), ("llama2_7b_160m", "spectr_gbv"), ("llama2_7b_68m", "gbv"),
        ("llama2_7b_68m", "spectr_gbv")]
    assert dict(zip(table["method"], table["K"])) == {"gbv": 1, "spectr_gbv": 7} and set(table["L"]) == {6}
    row = table[(table["model_pair"] == "llama2_7b_68m") & (table["method"] == "spectr_gbv")].iloc[0]
    target, draft = pair_shapes("llama2_7b_68m")
    h20 = accelerator("H20")
    allowed = allowed_tokens_per_s(target, draft, h20, 7, 6, 3.17, 200)
    assert row["allowed_tokens_per_s"] == pytest.approx(allowed)
    assert row["reported_over_allowed"] == pytest.approx(68.77 / allowed)
    # The implied overhead brings the roofline down to the reported rate.
    assert allowed_tokens_per_s(target, draft, h20, 7, 6, 3.17, 200,
                                overhead_s=row["implied_overhead_ms"] / 1e3) == pytest.approx(68.77)


def _calibration(extra: dict) -> Calibration:
    costs = ForwardCosts(((1, 1, "last", 0.05), (3, 13, "all", 0.2)))
    return Calibration(hardware="cpu", model_pair="smollm2_135m_self", dtype="float32", device="test CPU",
                       date="2026-12-03", random_weights=False, target=costs, draft=costs, extra=extra)


def test_the_report_section_renders_from_files(tmp_path):
    from spectr_repro.analysis.report.context import ReportContext
    from spectr_repro.analysis.report.physics import CPU_CSV, RELEASE_CSV, TABLE_CSV, physics_section
    from spectr_repro.paper import load_paper_numbers

    context = ReportContext(folders=[tmp_path], report_path=tmp_path / "REPORT.md", paper=load_paper_numbers())
    text = physics_section(context)
    assert text.startswith("## The paper's speed-ups against physics")
    assert "A model, not a measurement" in text and "SpecTr-GBV" in text
    assert all(f"allowed, {key}" in text for key in PAPER_ACCELERATORS)
    assert len((tmp_path / TABLE_CSV).read_text().splitlines()) == 1 + 8
    assert len((tmp_path / RELEASE_CSV).read_text().splitlines()) == 1 + 4 and "one H20" in text
    assert "on this machine" not in text and not (tmp_path / CPU_CSV).exists()  # no measured bandwidth yet

    write_calibration(_calibration({"memory_bandwidth_gbs": 10.0, "matmul_tflops": 0.5}))
    text = physics_section(context)
    assert "on this machine, against its calibrated forwards" in text and "test CPU" in text
    assert (tmp_path / CPU_CSV).is_file()


def test_the_roofline_against_a_calibration_by_hand():
    """SmolLM2's float32 target on 10 GB/s, decode on 64 cached tokens: its read bytes over the bandwidth."""
    device = Accelerator(key="cpu", name="cpu", bandwidth_gbs=10.0, bf16_tflops=1.0)
    table = roofline_against_calibration(_calibration({}), device, pair_name="smollm2_135m_self")
    decode = table[(table["role"] == "target") & (table["rows"] == 1)].iloc[0]
    shape = shape_from_config("smol", json.loads(
        (ARCHITECTURE_CONFIGS / "HuggingFaceTB__SmolLM2-135M-Instruct.json").read_text()))
    expected = (shape.weight_bytes(4) + 65 * shape.kv_bytes_per_token(4)) / 10e9
    assert decode["roofline_s"] == pytest.approx(expected)
    assert decode["calibrated_over_roofline"] == pytest.approx(0.05 / expected)


def test_the_roofline_of_a_calibration_assumes_its_cached_context():
    from spectr_repro.cost.measure import CONTEXT_TOKENS

    default = inspect.signature(roofline_against_calibration).parameters["context"].default
    assert default == CONTEXT_TOKENS


def test_the_docs_block_is_generated_and_checked(tmp_path, capsys):
    from spectr_repro.analysis.physics_docs import BLOCK, main

    page = REPO / "docs" / "speed.md"
    assert main(["--check", "--docs", str(page)]) == 0, "docs/speed.md is stale: python -m " \
                                                         "spectr_repro.analysis.physics_docs"
    stale = tmp_path / "speed.md"
    stale.write_text(f"# Speed\n\n<!-- {BLOCK}:begin -->\nold\n<!-- {BLOCK}:end -->\n\nprose\n")
    assert main(["--check", "--docs", str(stale)]) == 1  # negative control: a stale block is caught
    assert main(["--docs", str(stale)]) == 0
    assert main(["--check", "--docs", str(stale)]) == 0 and stale.read_text().endswith("\n\nprose\n")
    assert main(["--docs", str(tmp_path / "missing.md")]) == 2


def test_the_machine_measurements_are_in_bytes_and_flops_per_second():
    """Units, not speed: any machine reads faster than 100 MB/s and slower than 100 TB/s, multiplies faster than
    0.1 GFLOP/s; a result in GB/s or TFLOP/s (a unit slip) would fall outside."""
    from spectr_repro.cost.measure import measure_matmul_flops, measure_memory_bandwidth

    assert 1e8 < measure_memory_bandwidth(size_bytes=16 << 20, repeats=1) < 1e14
    assert 1e8 < measure_matmul_flops(size=128, repeats=1) < 1e16


def test_the_matmul_rate_sizes_its_product_to_the_machine(monkeypatch):
    """size=None doubles the product from 256 until one takes min_seconds, and never past max_size: the sizes
    it multiplies are read off the operands it builds."""
    import torch

    import spectr_repro.cost.measure as measure

    sizes = []
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: sizes.append(shape[0]) or real_randn(*shape, **kw))
    assert 1e8 < measure.measure_matmul_flops(dtype=torch.float32, repeats=1, min_seconds=float("inf"),
                                              max_size=1024) < 1e16
    assert sorted(set(sizes)) == [256, 512, 1024]  # doubled up to the cap: every product was under infinity
    sizes.clear()
    measure.measure_matmul_flops(dtype=torch.float32, repeats=1, min_seconds=0.0, max_size=1024)
    assert set(sizes) == {256}  # the first product already took >= 0 s


@pytest.mark.slow
def test_the_cpu_roofline_is_within_a_factor_of_a_measured_decode_forward():
    """SmolLM2-135M's float32 decode forward (1 x 1 on 64 cached tokens), timed by ``measure_forward_costs``,
    against the roofline of this machine's measured read bandwidth. Between 0.7 and 4 times the roofline:
    - not below 0.7: the roofline is a lower bound, and a forward cannot read its 0.54 GB of weights faster than
      memory delivers them; 0.7 leaves room for the bandwidth measurement itself (one summed tensor, a different
      access pattern than the matmuls' streams) reading low by up to 30 %;
    - not above 4: at float32 the CPU's matrix-vector products run near bandwidth, and what the roofline leaves
      out (30 layers of eager PyTorch ops, a few ms of launches on 2 cores) is a fraction of the ~0.05 s the
      weights take; 4x would mean the forward is mostly not reading weights, i.e. the model no longer explains it.
    Needs SmolLM2 (`make models`) and a quiet machine."""
    from spectr_repro.cost.measure import CONTEXT_TOKENS, measure_forward_costs, measure_memory_bandwidth
    from spectr_repro.models.offline import OFFLINE_MODELS

    if not OFFLINE_MODELS["smollm2-135m-instruct"].is_converted():
        pytest.skip("SmolLM2 is not converted (make models)")
    import torch
    from transformers import AutoModelForCausalLM

    from spectr_repro.models import pair_config

    path = OFFLINE_MODELS["smollm2-135m-instruct"].path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    measured = measure_forward_costs(model, [(1, 1, "last")], repeats=5).seconds(1, 1)
    bandwidth = measure_memory_bandwidth() / 1e9
    device = Accelerator(key="cpu", name="this CPU", bandwidth_gbs=bandwidth, bf16_tflops=1.0)
    shape = model_shape(pair_config("smollm2_135m_self"), "target")
    roofline = roofline_forward_seconds(shape, device, 1, 1, CONTEXT_TOKENS, width=4)
    assert 0.7 <= measured / roofline <= 4.0, (measured, roofline, bandwidth)
