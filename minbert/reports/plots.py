"""The figures of a run: the forgetting matrix, the training curves and the error-analysis plots, and
write_run_reports, which writes them beside the run's history.json and forgetting table. The numbers they draw
come from tables.py; matplotlib is imported on the first plot, so that importing this module (every run's
--help, every test) does not pay for it.
"""

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from minbert.files import atomic_write, atomic_write_text
from minbert.reports.tables import HISTORY_METRICS, error_counts, forgetting_table_markdown, history_matrix
from minbert.runtime import import_problem
from minbert.step_log import STEPS_FILE
from minbert.tasks.metrics import paired_arrays, paraphrase_metrics, sst_metrics, sts_metrics


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_problem(embeddings: bool = False) -> str | None:
    """Why a run's figures could not be drawn (matplotlib; scikit-learn's t-SNE with `embeddings`), in one line, or
    None: asked when a command starts, as both are imported only when the first figure is drawn, at a run's end."""
    problem = import_problem("matplotlib.pyplot", "drawing the figures", "matplotlib")
    if problem is None and embeddings:
        problem = import_problem("sklearn.manifold", "the t-SNE plot of the embeddings", "scikit-learn")
    return problem


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Write fig as a PNG (whole, as files.atomic_write does) and close it, so that a run's many plots do not pile up
    in memory."""
    path = Path(path)
    fig.tight_layout()
    try:
        atomic_write(path, lambda temporary: fig.savefig(temporary, dpi=120, format="png"))
    finally:
        pyplot().close(fig)
    return path


def plot_forgetting_matrix(history: Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Heat map of dev metrics after each completed stage, values written in the cells."""
    plt = pyplot()
    labels, names, matrix = history_matrix(history)
    fig, ax = plt.subplots(figsize=(1.6 * matrix.shape[1] + 2, 0.6 * matrix.shape[0] + 1.5))
    image = ax.imshow(matrix, cmap="viridis", vmin=min(0.0, matrix.min()), vmax=1.0, aspect="auto")
    ax.set_xticks(range(matrix.shape[1]), names)
    ax.set_yticks(range(matrix.shape[0]), labels)
    ax.set_xlabel("dev metric")
    ax.set_ylabel("after stage")
    for row in range(matrix.shape[0]):
        for col in range(matrix.shape[1]):
            value = matrix[row, col]
            ax.text(col, row, f"{value:.3f}", ha="center", va="center", color="white" if value < 0.6 else "black")
    fig.colorbar(image, ax=ax)
    ax.set_title("Dev performance after each training stage")
    return save_figure(fig, path)


def training_losses(steps: Sequence[Mapping]) -> dict[str, tuple[list[int], list[float]]]:
    """{the tasks a line trained ('qqp', 'sts,sst'): (updates, mean training losses)} of steps.jsonl's lines, in
    their order; a line without a numeric update and loss (a torn last line) is left out."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for line in steps:
        update, loss = line.get("update"), line.get("loss")
        if isinstance(update, int) and isinstance(loss, (int, float)):
            updates, losses = series.setdefault(str(line.get("task", "")), ([], []))
            updates.append(update)
            losses.append(float(loss))
    return series


def read_steps(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a run's steps.jsonl (none when it is absent); a line that is not one is skipped."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    steps = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            steps.append(value)
    return steps


def plot_training_curves(history: Sequence[Mapping], path: str | os.PathLike,
                         steps: Sequence[Mapping] = ()) -> Path:
    """One panel per default task: dev metric over history entries, plus train metric when logged
    (keys 'train_sst_acc', 'train_qqp_acc', 'train_sts_pearson'); beside them, the training loss over updates
    from steps.jsonl's lines (`steps`), one line per task trained, when there are any."""
    plt = pyplot()
    labels, _, matrix = history_matrix(history)
    tasks = HISTORY_METRICS[:-1]  # the last column is the overall score
    losses = training_losses(steps)
    panels = len(tasks) + bool(losses)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    if losses:
        plot_training_losses(axes[-1], losses)
    steps = np.arange(len(labels))
    for col, (ax, (key, name)) in enumerate(zip(axes, tasks)):
        ax.plot(steps, matrix[:, col], marker="o", label="dev")
        train = [entry.get(f"train_{key}", np.nan) for entry in history]
        if not np.all(np.isnan(np.asarray(train, dtype=float))):
            ax.plot(steps, train, marker="s", linestyle="--", label="train")
        ax.set_title(name)
        ax.set_xticks(steps, labels, rotation=45, ha="right")
        ax.grid(alpha=0.3)
        ax.legend()
    return save_figure(fig, path)


def plot_training_losses(ax, losses: Mapping[str, tuple[list[int], list[float]]]) -> None:
    for task, (updates, values) in losses.items():
        ax.plot(updates, values, marker=".", label=task or "loss")
    ax.set_title("training loss")
    ax.set_xlabel("update")
    ax.grid(alpha=0.3)
    ax.legend()


def plot_error_analysis(
    sst_pred, sst_gold, para_pred, para_gold, sts_pred, sts_gold, out_dir: str | os.PathLike
) -> list[Path]:
    """Write sst_error_histogram.png, qqp_confusion_matrix.png and sts_scatter.png."""
    plt = pyplot()
    out_dir = Path(out_dir)
    sst_p, sst_g = paired_arrays(sst_pred, sst_gold)
    para_p, para_g = paired_arrays(para_pred, para_gold)
    sts_p, sts_g = paired_arrays(sts_pred, sts_gold)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(sst_p - sst_g, bins=np.arange(-4.5, 5.5, 1.0), rwidth=0.85)
    ax.set_xticks(range(-4, 5))
    ax.set_xlabel("predicted − gold sentiment class")
    ax.set_ylabel("examples")
    ax.set_title(f"SST errors (acc {sst_metrics(sst_p, sst_g)['acc']:.3f})")
    paths.append(save_figure(fig, out_dir / "sst_error_histogram.png"))

    para = paraphrase_metrics(para_p, para_g)
    qqp = error_counts(sst_p, sst_g, para_p, para_g, sts_p, sts_g)["qqp"]  # the counts error_analysis.py prints
    confusion = np.array([[qqp["true_negatives"], qqp["false_positives"]],  # rows: gold, columns: predicted
                          [qqp["false_negatives"], qqp["true_positives"]]])
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(confusion, cmap="Blues")
    for gold in range(2):
        for pred in range(2):
            ax.text(pred, gold, str(confusion[gold, pred]), ha="center", va="center",
                    color="white" if confusion[gold, pred] > confusion.max() / 2 else "black")
    ax.set_xticks([0, 1], ["not para", "para"])
    ax.set_yticks([0, 1], ["not para", "para"])
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(f"QQP (acc {para['acc']:.3f}, F1 {para['f1']:.3f})")
    paths.append(save_figure(fig, out_dir / "qqp_confusion_matrix.png"))

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(sts_g, sts_p, s=6, alpha=0.4)
    ax.set_xlabel("gold similarity")
    ax.set_ylabel("predicted similarity")
    ax.set_title(f"STS (Pearson r = {sts_metrics(sts_p, sts_g)['pearson']:.3f})")
    paths.append(save_figure(fig, out_dir / "sts_scatter.png"))
    return paths


def write_run_reports(history: Sequence[Mapping], dev_predictions: Mapping, out_dir: str | os.PathLike) -> str:
    """history.json, forgetting.md, the forgetting matrix, training curves (with the training loss of out_dir's
    steps.jsonl) and error-analysis plots of a run in out_dir; dev_predictions maps each task to (ids, predictions, gold). Returns the forgetting table;
    a run without all three of sst, qqp and sts gets only history.json and returns ""."""
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "history.json", json.dumps(list(history), indent=1))
    evaluated = [record for record in history if "overall" in record]
    if not evaluated:
        return ""
    table = forgetting_table_markdown(evaluated)
    atomic_write_text(out_dir / "forgetting.md", table)
    plot_forgetting_matrix(evaluated, out_dir / "forgetting_matrix.png")
    plot_training_curves(evaluated, out_dir / "training_curves.png", read_steps(out_dir / STEPS_FILE))
    plot_error_analysis(*dev_predictions["sst"][1:], *dev_predictions["qqp"][1:], *dev_predictions["sts"][1:],
                        out_dir)
    return table
