import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "results.ipynb"


def test_results_notebook_executes_on_the_fixture(synthetic, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RESULTS", str(synthetic.root))
    # the kernel imports spectr_repro from the checkout even when it is not pip-installed
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(NOTEBOOK.parents[1]), os.environ.get("PYTHONPATH")]))
    )
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert any("parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)
    NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"from {synthetic.root}" in text
    assert "5 figures drawn" in text  # K, L, T ablations + acceptance for Qwen, acceptance for DeepSeek
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 5
    tables = [
        o for o in outputs if "text/html" in o.get("data", {}) and "SpecTr-GBV" in o["data"]["text/html"]
    ]
    assert len(tables) == 4  # two metrics x two pairs
