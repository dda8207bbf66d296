"""`python -m spectr_repro bias` on the tiny random pair: end to end, resume after an interruption, bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from spectr_repro.__main__ import main as cli
from spectr_repro.bias import driver
from spectr_repro.bias import measure as bias_measure

SMALL = ["model_pair=tiny_random", "K=2", "L=3", "num_prompts=1", "bias.samples=8", "bias.batch=4",
         "bias.continuation_tokens=6", "logger=disabled"]


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


@pytest.mark.parametrize("arguments,message", [
    (["bias.samples=0"], "bias.samples must be an integer >= 1 (draft sets per context), got 0"),
    (["bias.draft_temperature=0"], "bias.draft_temperature must be null (the target's temperature) or a number > 0"),
    (["method=sd", "K=3"], "method sd verifies a single draft"),
    (["method=nosuch"], "unknown method 'nosuch'"),
    (["method=spectr_gbv,sd"], "method sd verifies a single draft"),
    (["bias.colour=1"], "unknown key 'bias.colour'"),
])
def test_bad_input_is_refused_with_one_message_before_any_model_loads(tmp_path, capsys, monkeypatch, arguments,
                                                                     message):
    def no_models(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("spectr_repro.models.load_pair", no_models)
    code = cli(["bias", *SMALL, f"output_dir={tmp_path / 'out'}", "method=spectr_gbv", *arguments])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_runs_end_to_end_and_resumes_after_an_interruption(tmp_path, monkeypatch):
    arguments = ["bias", *SMALL, "method=spectr_gbv,spectr", f"output_dir={tmp_path}", "bias.contexts_per_prompt=2"]
    measure = bias_measure.measure_context
    calls = []

    def interrupted_on_the_second(*args, **kwargs):
        calls.append(args[4])  # the context number
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(bias_measure, "measure_context", interrupted_on_the_second)
    assert cli(arguments) == 130
    folder = tmp_path / "default" / "bias"
    first = pd.read_csv(folder / "bias.csv")
    assert set(first.context.str.startswith("pooled")) == {False, True}
    assert first.context[~first.context.str.startswith("pooled")].nunique() == 1  # the finished context

    calls.clear()
    monkeypatch.setattr(bias_measure, "measure_context", lambda *a, **k: (calls.append(a[4]), measure(*a, **k))[1])
    assert cli(arguments) == 0
    assert calls == [1]  # only the context that was interrupted is computed again
    table = pd.read_csv(folder / "bias.csv")
    assert list(table.columns[:15]) == ["model_pair", "dataset", "method", "K", "L", "temperature",
                                        "draft_temperature", "context", "samples", "tv_estimate", "interval",
                                        "p_value", "p_value_holm", "detectable_tv", "verdict"]
    per_context = table[~table.context.str.startswith("pooled")]
    assert sorted(per_context.method.unique()) == sorted(["spectr_gbv", "spectr", "control_draft",
                                                          "control_lenient_sd"])
    assert per_context.context.nunique() == 2 and len(per_context) == 8
    assert (per_context.samples == 8).all()
    assert ((table.p_value > 0) & (table.p_value <= 1)).all()
    # per context: Holm-adjusted within its family (never below the raw p), the verdict says Holm; pooled: none
    assert (per_context.p_value_holm >= per_context.p_value).all() and per_context.verdict.str.contains("Holm").all()
    assert table[table.context.str.startswith("pooled")].p_value_holm.isna().all()
    kept = first[~first.context.str.startswith("pooled")].set_index(["method", "context"]).tv_estimate
    again = per_context.set_index(["method", "context"]).tv_estimate
    assert (again.loc[kept.index] == kept).all()  # the finished context was kept, not redone
    # The tiny draft is far from the target: the control that emits the drafted token must be detected.
    control = table[(table.method == "control_draft") & table.context.str.startswith("pooled")]
    assert float(control.p_value.iloc[0]) <= 0.05


@pytest.mark.parametrize("cap", [{"nope": 3}, {"sbvf": 0}, {"sbvf": True}])
def test_a_sample_cap_maps_registered_rules_to_counts(cap):
    from spectr_repro.bias.settings import BiasSettings
    from spectr_repro.errors import UsageError
    from spectr_repro.settings import read_settings

    values = {"samples": 8, "batch": 4, "rule_calls": 1, "continuation_tokens": 0, "contexts_per_prompt": 1}
    assert read_settings(BiasSettings, {**values, "sample_cap": {"sbvf": 2}}, "bias").sample_cap == {"sbvf": 2}
    with pytest.raises(UsageError, match=r"^bias.sample_cap must be a map of registered rules to integers >= 1"):
        read_settings(BiasSettings, {**values, "sample_cap": cap}, "bias")


def test_a_settings_folder_name_does_not_change_when_its_settings_are_read_differently(tmp_path):
    """A setting's folder is named by the JSON of its values (``BiasSetting.id``): a refactor of how the values are
    read (typed at the door since 2026-12-06) must give every setting the name it had, or the contexts measured so
    far are orphaned. The ids were first printed by the code that read ``cfg.bias`` field by field (da1b22c); they
    changed once on purpose since, on 2026-12-06, when the values took the test's version (``TEST_VERSION``): contexts
    measured by the earlier test are not pooled with later ones."""
    ids = {setting.id for setting in driver.parse(
        ["experiment=bias_qwen", "bias.draft_temperature=1", "+bias.sample_cap={sbv: 100}", "logger=disabled",
         f"output_dir={tmp_path}"])}
    assert ids == {"qwen25coder_1.5b_0.5b__humaneval__K1_L6_T0.4_Tq1__390446cf",
                   "qwen25coder_1.5b_0.5b__humaneval__K1_L6_T0.7_Tq1__fab3c310",
                   "qwen25coder_1.5b_0.5b__humaneval__K3_L6_T0.4_Tq1__90a7c891",
                   "qwen25coder_1.5b_0.5b__humaneval__K7_L6_T0.7_Tq1__fb8b0c52"}
