import numpy as np
import pytest
from matplotlib.image import imread

from spectr_repro.analysis.figures import ablation_data, acceptance_data, make_figures, ratio_interval
from spectr_repro.analysis.load import load_results

QWEN = "qwen25coder_1.5b_0.5b"
DEEPSEEK = "deepseek_33b_1.3b"


@pytest.fixture(scope="module")
def results(synthetic):
    return load_results(synthetic.root)


def test_ratio_interval_is_ratio_of_sums_with_a_bootstrap_interval():
    num, den = np.array([8.0, 10.0, 12.0, 30.0]), np.array([2.0, 2.0, 2.0, 4.0])
    statistic, low, high = ratio_interval(num, den)
    assert statistic == pytest.approx(60 / 10)
    assert low < statistic < high
    assert ratio_interval(num, den) == (statistic, low, high)  # seeded
    # equal per-row ratios: nothing to resample, the interval collapses
    assert ratio_interval([4.0, 8.0, 12.0], [1.0, 2.0, 3.0])[1:] == pytest.approx((4.0, 4.0))
    assert np.isnan(ratio_interval([3.0], [1.0])[1])
    with pytest.raises(ValueError):
        ratio_interval([1.0, 2.0], [1.0])


def test_k_ablation_holds_l_and_t_at_the_main_setting(results, synthetic):
    data = ablation_data(results.cells, results.records, QWEN, "K")
    line = data[
        (data["method"] == "spectr_gbv")
        & (data["dataset"] == "humaneval")
        & (data["metric"] == "block_efficiency")
    ].sort_values("value")
    assert list(line["value"]) == [1, 3, 5]
    expected = [synthetic.expected_block_efficiency("spectr_gbv", "humaneval", K, 6, 0.4) for K in (1, 3, 5)]
    assert list(line["mean"]) == pytest.approx(expected)
    assert (line["num_prompts"] == 3).all()
    # per-prompt token counts differ, so the bootstrap interval has width; per-prompt speed-ups do not
    assert (line["err_low"] > 0).all() and (line["err_high"] > 0).all()
    speed = data[(data["method"] == "spectr_gbv") & (data["metric"] == "speedup")]
    assert speed["err_low"].to_numpy() == pytest.approx(0.0, abs=1e-9)
    assert "ar" not in set(data["method"])


def test_l_and_t_ablations_pick_their_own_cells(results, synthetic):
    for axis, values in (("L", [4, 6, 8]), ("temperature", [0.1, 0.4, 0.7])):
        data = ablation_data(results.cells, results.records, QWEN, axis)
        line = data[
            (data["method"] == "spectr_gbv")
            & (data["metric"] == "block_efficiency")
            & (data["dataset"] == "humaneval")
        ].sort_values("value")
        assert list(line["value"]) == pytest.approx(values)
        settings = [(3, v, 0.4) if axis == "L" else (3, 6, v) for v in values]
        expected = [synthetic.expected_block_efficiency("spectr_gbv", "humaneval", *s) for s in settings]
        assert list(line["mean"]) == pytest.approx(expected)


def test_acceptance_data_has_one_value_per_position(results):
    data = acceptance_data(results.cells, QWEN)
    line = data[(data["method"] == "spectr") & (data["dataset"] == "gsm8k")]
    assert list(line["position"]) == list(range(1, 7))
    assert line["acceptance"].between(0, 1).all()


def _assert_drawn_png(path):
    assert path.is_file() and path.stat().st_size > 5000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels[..., :3].std() > 0.05  # not a blank canvas


def test_make_figures_writes_png_and_svg(results, tmp_path):
    written = make_figures(results.cells, results.records, QWEN, tmp_path)
    assert set(written) == {"ablation_K", "ablation_L", "ablation_T", "acceptance"}
    for png, svg in written.values():
        _assert_drawn_png(png)
        assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    # a pair with only the main table has nothing to sweep: only the acceptance figure
    assert set(make_figures(results.cells, results.records, DEEPSEEK, tmp_path / "ds")) == {"acceptance"}
