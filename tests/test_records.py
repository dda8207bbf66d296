"""The one record/summary schema: the runner, the loader, quality and W&B all use its fields; the one cell reader."""

import ast
import inspect
import json
from dataclasses import fields

import pytest

from spectr_repro import quality, records
from spectr_repro.analysis import load
from spectr_repro.analysis.load import load_cells
from spectr_repro.records import (
    CellSummary,
    PromptRecord,
    SchemaError,
    field_names,
    pooled_metrics,
    read_cells,
    record_totals,
    summary_from_json,
    table_columns,
)
from spectr_repro.tracking import conventions as tracking_conventions

# Every consumer's full column list (module, name, the schema's columns it must hold, in order).
FULL_COLUMN_LISTS = [
    (load, "SUMMARY_KEYS", [f.name for f in fields(CellSummary)]),
    (load, "RECORD_KEYS", [f.name for f in fields(PromptRecord)]),
    (tracking_conventions, "TABLE_COLUMNS", [f.name for f in fields(PromptRecord) if f.metadata["table"]]),
]
# Selections of columns written out by hand: each must name only fields of its schema dataclass.
HAND_WRITTEN_SELECTIONS = [
    ("records.REQUIRED_SUMMARY_KEYS", records.REQUIRED_SUMMARY_KEYS, CellSummary),
    ("quality.PROMPT_SETTING", quality.PROMPT_SETTING, CellSummary),
]


def derived_from_schema(source: str, name: str) -> bool:
    """``name`` is assigned at module level from a call of a function imported from spectr_repro.records
    (``field_names(CellSummary)``, ``tuple(table_columns())``): it follows a new field, a written-out list does not."""
    tree = ast.parse(source)
    schema_functions = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                        and node.module == "spectr_repro.records" for alias in node.names}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _called_function(node.value) in schema_functions
    return False


def _called_function(value: ast.expr) -> str | None:
    """The function a value is the call of, looking through list(...) and tuple(...)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        if value.func.id not in ("list", "tuple") or not value.args:
            return value.func.id
        value = value.args[0]
    return None


def unknown_columns(columns, schema) -> list[str]:
    names = {f.name for f in fields(schema)}
    return [column for column in columns if column not in names]


def test_every_consumer_reads_the_schema():
    """Full column lists are computed from the schema (so a new field reaches them), hand-picked ones name real
    fields (a renamed field breaks them here, not in a KeyError of a report)."""
    for module, name, expected in FULL_COLUMN_LISTS:
        assert derived_from_schema(inspect.getsource(module), name), f"{module.__name__}.{name} is written out"
        assert list(getattr(module, name)) == expected
    for name, columns, schema in HAND_WRITTEN_SELECTIONS:
        assert unknown_columns(columns, schema) == [], name
    assert "accepted_lengths" not in table_columns() and "completion" in table_columns()


def test_the_schema_check_catches_a_drifted_list():
    """Negative control: a written-out copy of the columns, a call of a function from elsewhere and a renamed
    column are each caught; the derived forms pass."""
    imports = "from spectr_repro.records import field_names, table_columns\nfrom other import columns\n"
    assert not derived_from_schema(imports + "SUMMARY_KEYS = ['experiment', 'cell_id', 'method']\n", "SUMMARY_KEYS")
    assert not derived_from_schema(imports + "SUMMARY_KEYS = columns(CellSummary)\n", "SUMMARY_KEYS")
    assert not derived_from_schema(imports, "SUMMARY_KEYS")
    assert derived_from_schema(imports + "SUMMARY_KEYS = field_names(CellSummary)\n", "SUMMARY_KEYS")
    assert derived_from_schema(imports + "TABLE_COLUMNS = tuple(table_columns())\n", "TABLE_COLUMNS")
    assert unknown_columns(("method", "max_tokens", "K"), CellSummary) == ["max_tokens"]


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


def _cell(root, name, summary=None, records_text=None):
    folder = root / "exp" / "cells" / name
    folder.mkdir(parents=True)
    if summary is not None:
        (folder / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    if records_text is not None:
        (folder / "records.jsonl").write_text(records_text)
    return folder


SUMMARY = {"method": "sd", "dataset": "gsm8k", "model_pair": "p", "K": 1, "L": 2, "temperature": 0.0}


def test_read_cells_reads_each_folder_with_a_summary(tmp_path):
    both = _cell(tmp_path, "a", SUMMARY, '{"prompt_id": "1", "completion": "x"}\n\n{"prompt_id": "2"}\n')
    summary_only = _cell(tmp_path, "b", {**SUMMARY, "method": "ar"})
    _cell(tmp_path, "c", records_text='{"prompt_id": "1"}\n')  # interrupted: no summary, not a cell yet
    cells = read_cells(tmp_path)
    assert [cell.folder for cell in cells] == [both, summary_only]
    assert [r["prompt_id"] for r in cells[0].records] == ["1", "2"] and cells[0].records[1]["completion"] is None
    assert cells[0].summary["method"] == "sd" and cells[0].summary["seed"] is None  # checked: schema keys filled
    assert cells[1].records is None
    assert [cell.folder for cell in read_cells(tmp_path / "exp" / "cells")] == [both, summary_only]


def test_read_cells_names_the_damaged_file(tmp_path):
    _cell(tmp_path, "a", SUMMARY, '{"prompt_id": "1"}\n{"prompt_id": \n')
    with pytest.raises(SchemaError, match=r"cells/a/records.jsonl:2: not valid JSON"):
        read_cells(tmp_path)
    _cell(tmp_path / "other", "b", "{not json")
    with pytest.raises(SchemaError, match=r"cells/b/summary.json: not valid JSON"):
        read_cells(tmp_path / "other")
