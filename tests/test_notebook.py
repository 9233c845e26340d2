"""notebooks/colab.ipynb, executed headless by a real notebook executor (nbclient and an IPython kernel) on the CPU
with the demo data, offline: the parameter cell is overridden with tiny settings (a two-stage run stopped after its
first stage, which the resume cell finishes); the cells that need Colab or a GPU skip themselves by their own
checks. The kernel starts outside the project, as Colab's does in /content, and the notebook loads the export with
transformers and sentence-transformers from there, with Hugging Face's `datasets` installed (CI installs it)."""
import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "colab.ipynb"
DEMO = ROOT / "data" / "demo"


def read_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def cell(notebook, cell_id: str):
    return next(cell for cell in notebook.cells if cell.get("id") == cell_id)


def cell_text(cell) -> str:
    """What a code cell printed and displayed, as text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


def test_the_notebook_is_valid_committed_without_outputs_and_parameterised():
    notebook = read_notebook()
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"]
    for each in code:
        assert not each.outputs and each.execution_count is None, f"cell {each.id} was committed with its outputs"
    # Colab opens it on a GPU runtime; every Colab-only step checks IN_COLAB, the GPU check checks for a GPU.
    assert notebook.metadata["accelerator"] == "GPU"
    sources = {each.id: each.source for each in code}
    for cell_id in ("install", "drive", "tensorboard", "submit"):
        assert "if IN_COLAB" in sources[cell_id], cell_id
    assert "if GPU and GPU_CHECK" in sources["gpu-check"]
    assert "if SWEEP_TRIALS" in sources["sweep"]  # the optional sweep (scripts/sweep.py), off unless asked for


@pytest.mark.slow
def test_the_notebook_runs_headless_on_the_cpu_with_the_demo_data(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    kernelspec = pytest.importorskip("ipykernel.kernelspec")
    for oracle in ("transformers", "sentence_transformers", "tensorboard"):  # not imported here: see the docstring
        if importlib.util.find_spec(oracle) is None:
            pytest.skip(f"{oracle} (requirements-dev.txt) is not installed")
    notebook = read_notebook()
    runs = tmp_path / "runs"
    parameters = cell(notebook, "parameters")
    parameters.source += f"""

# tests/test_notebook.py: the demo data, a tiny two-stage run stopped after its first stage (the resume cell
# finishes it), no course checks (they have their own tests)
PROJECT_DIR = {str(ROOT)!r}
DATA_DIR = {str(DEMO)!r}
RECIPE = "gpu_best"
RUNS_DIR = {str(runs)!r}
EXTRA_FLAGS = "--report_to tensorboard --max_train_examples 16 --first_stages qqp --cycles 1 --cycle sts"
STOP_AFTER_STAGES = 1
COURSE_CHECKS = False
"""
    # The kernel is this Python (a kernelspec of its own), offline, on one thread, with nothing of the project on its
    # path, and starts in a folder of its own, as Colab's starts in /content.
    kernelspec.write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    for name, value in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg",
                            CUDA_VISIBLE_DEVICES="", PYDEVD_DISABLE_FILE_VALIDATION="1").items():
        monkeypatch.setenv(name, value)
    kept = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if entry and not Path(entry).resolve().is_relative_to(ROOT)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(kept))
    content = tmp_path / "content"
    content.mkdir()
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(content)}}).execute()

    text = {each.id: cell_text(each) for each in notebook.cells if each.cell_type == "code"}
    # Colab's and the GPU's steps said that they skipped, and nothing was cloned, installed or downloaded.
    assert "install: skipped (not on Colab)" in text["install"]
    assert "Google Drive: skipped (not on Colab)" in text["drive"]
    assert f"data: the course files are in {DEMO}" in text["data"]
    assert "gpu_check.sh: skipped (no CUDA GPU)" in text["gpu-check"]
    assert "TensorBoard inline: skipped (not on Colab)" in text["tensorboard"]
    # The GPU recipe's CPU twin ran its first stage; the resume cell finished the run.
    assert "no CUDA GPU: gpu_best's CPU twin cpu_best runs instead" in text["recipe"]
    assert "resuming after stage 1 of 2" in text["resume"]
    run = runs / "cpu_best"
    names = ["sst-dev-out.csv", "sst-test-out.csv", "para-dev-out.csv", "para-test-out.csv", "sts-dev-out.csv",
             "sts-test-out.csv"]
    assert sorted(path.name for path in (run / "predictions").iterdir()) == sorted(names)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert '"update"' in text["results"] and "forgetting" in text["results"]
    assert "sweep: skipped (SWEEP_TRIALS = 0)" in text["sweep"]
    with zipfile.ZipFile(run / "cs224n_default_final_project_submission.zip") as archive:
        assert sorted(archive.namelist()) == sorted(f"predictions/{name}" for name in names)
    # The export loaded in transformers and sentence-transformers, outside the project folder, with one embedding.
    assert (run / "hf_export" / "model.safetensors").is_file()
    assert "same sentence embeddings from both: True" in text["load-export"]
    assert text["load-export"].count("similarity ") == 3
