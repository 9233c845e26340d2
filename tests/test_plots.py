"""plots.py: the run's figures are PNGs, and write_run_reports writes them with the history and forgetting table."""
import json
from pathlib import Path

import numpy as np

from evaluation import forgetting_table_markdown
from minbert.reports.plots import plot_error_analysis, plot_forgetting_matrix, plot_training_curves, write_run_reports
from minbert.reports.tables import HISTORY_METRICS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

HISTORY = [
    {"stage": "qqp", "sst_acc": 0.20, "qqp_acc": 0.80, "sts_pearson": 0.70, "train_qqp_acc": 0.85},
    {"stage": "sts", "sst_acc": 0.50, "qqp_acc": 0.75, "sts_pearson": 0.80, "train_sts_pearson": 0.9},
    {"stage": "sst", "sst_acc": 0.45, "qqp_acc": 0.70, "sts_pearson": 0.85, "train_sst_acc": 0.6},
]


def _assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def _dev_predictions(size=50, seed=1):
    """task -> (ids, predictions, gold), as a run's evaluation gives them: rough but not random predictions."""
    rng = np.random.default_rng(seed)
    sst_gold, para_gold, sts_gold = rng.integers(0, 5, size), rng.integers(0, 2, size), rng.uniform(0, 5, size)
    predictions = {"sst": np.clip(sst_gold + rng.integers(-1, 2, size), 0, 4), "qqp": rng.integers(0, 2, size),
                   "sts": sts_gold + rng.normal(0, 0.5, size)}
    gold = {"sst": sst_gold, "qqp": para_gold, "sts": sts_gold}
    return {task: ([str(i) for i in range(size)], predictions[task], gold[task]) for task in gold}


def test_plot_forgetting_matrix_and_training_curves(tmp_path):
    _assert_png(plot_forgetting_matrix(HISTORY, tmp_path / "plots" / "forgetting.png"))
    _assert_png(plot_training_curves(HISTORY, tmp_path / "curves.png"))


def test_plot_error_analysis_writes_three_pngs(tmp_path):
    dev = _dev_predictions()
    paths = plot_error_analysis(*dev["sst"][1:], *dev["qqp"][1:], *dev["sts"][1:], tmp_path)
    assert sorted(p.name for p in paths) == ["qqp_confusion_matrix.png", "sst_error_histogram.png", "sts_scatter.png"]
    for path in paths:
        _assert_png(path)


def test_run_reports_write_history_table_and_plots(tmp_path):
    history = [{"stage": "pretrained"}, *({**entry, "overall": 0.5} for entry in HISTORY)]
    table = write_run_reports(history, _dev_predictions(), tmp_path)
    assert json.loads((tmp_path / "history.json").read_text()) == history
    assert table == forgetting_table_markdown(history[1:]) == (tmp_path / "forgetting.md").read_text()
    for name in ("forgetting_matrix", "training_curves", "sst_error_histogram", "qqp_confusion_matrix", "sts_scatter"):
        _assert_png(tmp_path / f"{name}.png")


def test_a_run_without_evaluated_stages_gets_only_its_history(tmp_path):
    assert write_run_reports([{"stage": "pretrained"}], {}, tmp_path) == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["history.json"]


def test_a_run_with_a_broken_figure_library_stops_in_one_line_before_any_model_loads(
        tiny_checkpoint, tmp_path, monkeypatch, capsys, model_must_not_load):
    """The figures' libraries are imported only when the run, trained, draws them: checked when it starts."""
    import sys

    import multitask_classifier as mc
    from conftest import DEMO, prediction_flags
    monkeypatch.setitem(sys.modules, "sklearn.manifold", None)  # an install that fails to import it
    flags = ["--data_dir", str(DEMO), "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet",
             "--max_train_examples", "16", "--first_stages", "sst", "--cycles", "0",
             "--output_dir", str(tmp_path / "run"), *prediction_flags(tmp_path)]
    assert mc.main(flags) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "the t-SNE plot of the embeddings needs sklearn.manifold" in error[0], error
    assert "pip install --upgrade scikit-learn" in error[0]


def test_the_training_curves_show_the_training_loss_of_steps_jsonl_beside_the_dev_curves(tmp_path, monkeypatch):
    """Issue 59: a run's report drew only the dev curves; steps.jsonl's training loss is drawn beside them."""
    import minbert.reports.plots as plots
    drawn = {}
    save = plots.save_figure

    def keep_axes(fig, path):
        drawn[Path(path).name] = [(ax.get_title(), [line.get_label() for line in ax.get_lines()],
                                   [line.get_xydata().tolist() for line in ax.get_lines()]) for ax in fig.axes]
        return save(fig, path)
    monkeypatch.setattr(plots, "save_figure", keep_axes)
    steps = [{"update": 5, "stage": "stage 1 qqp", "task": "qqp", "loss": 0.7},
             {"update": 10, "stage": "stage 1 qqp", "task": "qqp", "loss": 0.5},
             {"update": 15, "stage": "stage 2 sts,sst", "task": "sts,sst", "loss": 1.5}]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(line) + "\n" for line in steps) + '{"update": 2')
    history = [{"stage": "pretrained"}, *({**entry, "overall": 0.5} for entry in HISTORY)]
    write_run_reports(history, _dev_predictions(), tmp_path)
    title, labels, points = drawn["training_curves.png"][-1]
    assert title == "training loss" and labels == ["qqp", "sts,sst"]
    assert points == [[[5, 0.7], [10, 0.5]], [[15, 1.5]]]
    assert [panel[0] for panel in drawn["training_curves.png"][:-1]] == [name for _, name in HISTORY_METRICS[:-1]]
    _assert_png(tmp_path / "training_curves.png")
