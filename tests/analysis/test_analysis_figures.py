import numpy as np
import pytest
from matplotlib.image import imread

from spectr_repro.analysis.figures import (
    ablation_data,
    acceptance_data,
    dodge,
    make_figures,
    plot_ablation,
    plot_acceptance,
    ratio_interval,
)
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


def _legend_outside_every_axes(figure):
    """The figure's legends, each checked to lie clear of every panel (drawn, in display coordinates)."""
    figure.canvas.draw()
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    for legend in legends:
        box = legend.get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in figure.axes if ax.get_visible())
    return legends


def test_legends_sit_off_the_data_and_coinciding_methods_stay_apart(results):
    """The L ablation draws seven methods at L=6, some with equal speed-ups: each has its own marker and x offset
    (so no line hides another), and the one legend lies right of the panels (until 2026-12-03 it sat in the
    speed-up panel). Negative control: a legend placed in the axes, as before, is caught."""
    data = ablation_data(results.cells, results.records, QWEN, "L")
    figure = plot_ablation(data, "L")
    assert len(_legend_outside_every_axes(figure)) == 1
    lines = [container.lines[0] for container in figure.axes[1].containers]  # the errorbars' data lines
    assert len({line.get_marker() for line in lines}) == len(lines) >= 7
    x_at_six = [x for line in lines for x in line.get_xdata() if abs(x - 6) < 0.5]
    assert len(set(np.round(x_at_six, 6))) == len(x_at_six)  # every method's point at L=6 on its own x
    assert len(_legend_outside_every_axes(plot_acceptance(acceptance_data(results.cells, QWEN)))) == 1
    figure.axes[1].legend(loc="best")
    with pytest.raises(AssertionError):
        _legend_outside_every_axes(figure)


def test_dodge_spreads_methods_over_a_quarter_of_the_spacing():
    assert dodge(0, 1, [1, 3, 5]) == 0.0
    offsets = [dodge(i, 3, [1, 3, 5]) for i in range(3)]
    assert offsets == pytest.approx([-0.25, 0.0, 0.25])  # a quarter of the spacing 2, centred
    assert dodge(1, 2, [0.1, 0.4, 0.7]) == pytest.approx(0.0375)
