"""The one record/summary schema: the runner, the loader and W&B all use its fields."""

import json

import pytest

from spectr_repro import tracking
from spectr_repro.analysis.load import RECORD_KEYS, SUMMARY_KEYS, load_cells
from spectr_repro.records import (
    CellSummary,
    PromptRecord,
    SchemaError,
    field_names,
    pooled_metrics,
    record_totals,
    summary_from_json,
    table_columns,
)


def test_every_consumer_reads_the_schema():
    assert SUMMARY_KEYS == field_names(CellSummary)
    assert RECORD_KEYS == field_names(PromptRecord)
    assert list(tracking.TABLE_COLUMNS) == table_columns()
    assert "accepted_lengths" not in table_columns() and "completion" in table_columns()


def _record(prompt_id, tokens, calls, wall, ar):
    return {"prompt_id": prompt_id, "new_tokens": tokens, "target_calls": calls, "block_efficiency": tokens / calls,
            "wall_time_s": wall, "ar_wall_time_s": ar}


def test_pooled_metrics_pool_tokens_and_times():
    records = [_record("a", 10, 2, 1.0, 3.0), _record("b", 6, 3, 2.0, 3.0)]
    metrics = pooled_metrics(records)
    assert metrics["block_efficiency"] == 16 / 5  # pooled, not the mean of 5 and 2
    assert metrics["speedup"] == 6.0 / 3.0
    assert metrics["tokens_per_s"] == 16 / 3.0
    assert record_totals(records).prompt_ids == ("a", "b")


def test_batched_records_count_for_block_efficiency_but_never_for_time():
    """A batched prompt (wall_time_s None) adds tokens and calls, not time: speed-up and tokens/s come from
    the prompts decoded alone."""
    records = [_record("a", 10, 2, 1.0, 3.0), _record("b", 6, 3, None, None), _record("c", 9, 3, None, None)]
    metrics = pooled_metrics(records)
    assert metrics["block_efficiency"] == 25 / 8
    assert metrics["wall_time_s"] == 1.0 and metrics["ar_wall_time_s"] == 3.0
    assert metrics["speedup"] == 3.0 and metrics["tokens_per_s"] == 10.0
    assert metrics["timed_prompts"] == 1 and metrics["num_prompts"] == 3
    untimed = pooled_metrics(records[1:])
    assert untimed["timed_prompts"] == 0 and untimed["wall_time_s"] == 0.0
    assert untimed["speedup"] != untimed["speedup"]  # NaN: no speed-up without a timed prompt


def test_a_summary_missing_a_required_key_names_the_file(tmp_path):
    with pytest.raises(SchemaError, match="x/summary.json: summary lacks required keys \\['K'\\]"):
        summary_from_json({"method": "sd", "dataset": "d", "model_pair": "p", "L": 1, "temperature": 0.0},
                          "x/summary.json")
    cell = tmp_path / "exp" / "cells" / "c1"
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text(json.dumps({"method": "sd"}))
    with pytest.raises(ValueError, match="c1/summary.json: summary lacks required keys"):
        load_cells(tmp_path)


def test_older_summaries_load_with_new_fields_empty():
    summary = summary_from_json({"method": "sd", "dataset": "d", "model_pair": "p", "K": 1, "L": 2,
                                 "temperature": 0.5, "extra": 1})
    assert summary["schema_version"] is None and summary["extra"] == 1
    assert set(field_names(CellSummary)) <= set(summary)
