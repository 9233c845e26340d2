"""The tasks' metrics as a run records them, the overall score, leaderboard prediction files, the forgetting table
with its continual-learning figures, and error counts for the three multitask tasks. Each task says what its metrics
and its CSV cells are (minbert/tasks/); this module asks it.

Tasks: SST-5 sentiment (accuracy), Quora paraphrase detection (accuracy), STS-B similarity
(Pearson r). The course leaderboard combines them as
    overall = ((pearson + 1) / 2 + sst_acc + paraphrase_acc) / 3
so that the Pearson correlation is mapped from [-1, 1] onto [0, 1] before averaging.

Everything here is pure (no model, no torch, no plotting), so importing this module stays cheap for training
and tests; plots.py draws these numbers.
"""

import csv
import os
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minbert.tasks import MULTITASK, RUN_TASKS, TASKS, default_output
from minbert.tasks.base import first_few
from minbert.tasks.metrics import paired_arrays, paraphrase_metrics
from minbert.training.schedules import tasks_trained_by

LEADERBOARD_COLUMNS = {name: task.leaderboard_column for name, task in TASKS.items()}
DEFAULT_OUTPUTS = {(task, split): default_output(task, split) for task in MULTITASK for split in ("dev", "test")}

# (history key, human label) for the columns of forgetting tables and plots: each default task's own score, then
# the overall score.
HISTORY_METRICS = (*(TASKS[task].history_columns[0] for task in MULTITASK), ("overall", "overall"))
# Columns of their own when every entry has them: the default tasks' other metrics (the thesis' weighted F1s and
# STS's Spearman; histories written before they were computed lack them), then the score of each other task a run
# may train (SQuAD's F1, --tasks ...,qa).
OPTIONAL_HISTORY_METRICS = (*(column for task in MULTITASK for column in TASKS[task].history_columns[1:]),
                            *(TASKS[task].history_columns[0] for task in RUN_TASKS if task not in MULTITASK))
# The score of each task in the continual-learning figures (forgetting_measures): its own dev metric on its own
# scale, accuracy for SST and QQP, Pearson r for STS (not the overall score's (r + 1) / 2), F1 for SQuAD.
TASK_SCORES = {task: TASKS[task].score_key for task in RUN_TASKS}
# The stage label of the history's first record: the model before any training (minbert/training/trainer.py).
BEFORE_TRAINING = "pretrained"


class PredictionsFileError(ValueError):
    """A predictions CSV is missing or malformed; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------
# Metrics


def task_metrics(task: str, predictions, labels) -> dict[str, float]:
    """The history's metric keys for one task: sst_acc, sst_f1_macro, sst_f1_weighted; qqp_acc, qqp_f1,
    qqp_f1_weighted; sts_pearson, sts_spearman."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}")
    return TASKS[task].metrics(predictions, labels)


def overall_score(sst_acc: float, paraphrase_acc: float, sts_pearson: float) -> float:
    return ((sts_pearson + 1) / 2 + sst_acc + paraphrase_acc) / 3


def overall_of(metrics: Mapping[str, float]) -> float:
    """The overall score of metrics that hold the score of every default task (the course's three)."""
    return overall_score(*(metrics[TASKS[task].score_key] for task in MULTITASK))


def kept_model_score(metrics: Mapping[str, float], trained_tasks: Iterable[str]) -> float:
    """What picks the model a run keeps: the mean score over the tasks the run trains (SST and QQP accuracy,
    (STS r + 1) / 2, SQuAD F1), so that a run training one task keeps that task's best model rather than the one
    whose untrained heads happen to score best. With the three tasks (or none) it is the overall score."""
    tasks = set(trained_tasks) or set(MULTITASK)
    scores = [TASKS[task].kept_score(metrics) for task in TASKS if task in tasks]
    return sum(scores) / len(scores)


def summarize_line(metrics: Mapping[str, object]) -> str:
    """One line like 'epoch 3 | sst_acc 0.5120 | sts_pearson 0.8610', keys in the given order."""

    def fmt(value: object) -> str:
        if isinstance(value, (float, np.floating)):
            return f"{float(value):.4f}"
        return str(value)

    return " | ".join(f"{key} {fmt(value)}" for key, value in metrics.items())


# ---------------------------------------------------------------------------------------
# Leaderboard prediction files


def _column(task: str) -> str:
    if task not in LEADERBOARD_COLUMNS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(LEADERBOARD_COLUMNS)}")
    return LEADERBOARD_COLUMNS[task]


def write_predictions(path: str | os.PathLike, ids: Sequence, predictions: Sequence, task: str) -> None:
    """Write a leaderboard CSV `id,<column>` with one row per id, in the order given (Task.write_predictions: moved
    into place whole)."""
    _column(task)  # an unknown task is refused as read_predictions refuses it
    TASKS[task].write_predictions(Path(path), ids, predictions)


def read_predictions(path: str | os.PathLike, task: str) -> dict[str, int | float]:
    """Parse a leaderboard CSV into {id: prediction}, rejecting anything the grader would.

    Accepts the comma-separated form written by write_predictions and the course starter's
    form ('id \\t Predicted_Sentiment' header, 'id , value' rows); cells are whitespace-stripped.
    """
    path = Path(path)
    column = _column(task)
    if not path.is_file():
        raise PredictionsFileError(f"{path}: file not found")
    with path.open(newline="") as handle:
        header_line = handle.readline()
        header = [cell.strip() for cell in re.split(r"[,\t]", header_line.strip())]
        if header != ["id", column]:
            raise PredictionsFileError(f"{path}: header is {header_line.strip()!r}, expected 'id,{column}'")
        predictions: dict[str, int | float] = {}
        for line_number, row in enumerate(csv.reader(handle), start=2):
            if not row:
                continue
            cells = [cell.strip() for cell in row]
            if len(cells) != 2 or not cells[0]:
                raise PredictionsFileError(f"{path}:{line_number}: expected 'id,value', got {','.join(row)!r}")
            row_id, text = cells
            if row_id in predictions:
                raise PredictionsFileError(f"{path}:{line_number}: duplicate id {row_id}")
            try:
                predictions[row_id] = TASKS[task].parse_prediction(text)
            except ValueError:
                raise PredictionsFileError(f"{path}:{line_number}: invalid {column} value {text!r}") from None
    if not predictions:
        raise PredictionsFileError(f"{path}: a header but no predictions")
    return predictions


def check_predictions_file(
    path: str | os.PathLike, expected_ids: Iterable | None, task: str
) -> dict[str, int | float]:
    """Read a predictions file and, when expected_ids is given, require exactly those ids.

    Returns the parsed {id: prediction}; raises PredictionsFileError naming the file and the
    missing or extra ids.
    """
    predictions = read_predictions(path, task)
    if expected_ids is not None:
        expected_list = [str(i) for i in expected_ids]
        expected = set(expected_list)
        if len(expected) != len(expected_list):
            raise ValueError("expected_ids contains duplicates")
        missing = expected - predictions.keys()
        extra = predictions.keys() - expected
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing ids ({first_few(missing)})")
        if extra:
            problems.append(f"{len(extra)} unexpected ids ({first_few(extra)})")
        if problems:
            raise PredictionsFileError(f"{path}: " + "; ".join(problems))
    return predictions


# ---------------------------------------------------------------------------------------
# Stage history and errors: the numbers plots.py draws


def history_matrix(history: Sequence[Mapping]) -> tuple[list[str], list[str], np.ndarray]:
    """Row labels ('1. qqp', ...), column names and a (stages, metrics) matrix of dev metrics: HISTORY_METRICS,
    then each of OPTIONAL_HISTORY_METRICS that every entry has.

    'overall' is derived from the three task metrics when an entry does not carry it.
    """
    if not history:
        raise ValueError("history is empty; nothing to tabulate")
    keys = [key for key, _ in HISTORY_METRICS[:-1]]  # the default tasks' scores; the last column is the overall one
    labels, rows = [], []
    for index, entry in enumerate(history, start=1):
        stage = entry.get("stage", f"stage {index}")
        for key in keys:
            if key not in entry:
                raise ValueError(f"history entry {index} ({stage}) lacks {key!r}")
        labels.append(f"{index}. {stage}")
        rows.append([*(entry[key] for key in keys), entry.get("overall", overall_of(entry))])
    names = [name for _, name in HISTORY_METRICS]
    for key, name in OPTIONAL_HISTORY_METRICS:
        if all(key in entry for entry in history):
            names.append(name)
            rows = [row + [entry[key]] for row, entry in zip(rows, history)]
    return labels, names, np.array(rows, dtype=float)


def forgetting_table_markdown(history: Sequence[Mapping]) -> str:
    """Markdown table stage × metric, closed by a 'forgetting' row = best-ever minus final, then the
    continual-learning figures of history_forgetting_measures where the schedule has them.

    A forgetting of 0 means the final model is as good as the best stage on that metric.
    """
    labels, names, matrix = history_matrix(history)
    lines = ["| stage | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, row in zip(labels, matrix):
        lines.append(f"| {label} | " + " | ".join(f"{v:.4f}" for v in row) + " |")
    forgetting = matrix.max(axis=0) - matrix[-1]
    lines.append("| forgetting (best − final) | " + " | ".join(f"{v:.4f}" for v in forgetting) + " |")
    measures = history_forgetting_measures(history)
    if measures is not None:
        lines += ["", *measures.markdown_lines()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ForgettingMeasures:
    """The standard continual-learning figures of a forgetting matrix R, R[l, i] = the score of task i after
    stage l (rows in training order, T the last), over the *earlier* tasks: those a stage before T trained and
    stage T did not (the tasks i < T of a schedule that trains each task once; a task trained several times is
    measured from the last stage that trained it, s_i).

    average_score: A_T, the mean over every task (columns) of its score after the last stage.
    backward_transfer: BWT (Lopez-Paz & Ranzato 2017), the mean over the earlier tasks of R[T, i] - R[s_i, i]:
        negative when later stages lowered what a task had reached when it was last trained.
    forgetting: per earlier task, f_i (Chaudhry et al. 2018), the max over the rows before the last,
        l < T, of R[l, i] - R[T, i]: how far the final model is below the task's best before it (negative
        when the last stage raised the task above every earlier score).
    """
    tasks: tuple[str, ...]
    average_score: float
    backward_transfer: float
    forgetting: dict[str, float]

    @property
    def average_forgetting(self) -> float:
        return float(np.mean(list(self.forgetting.values())))

    def markdown_lines(self) -> list[str]:
        scores = ", ".join(TASK_SCORES[task] for task in self.tasks)
        earlier = ", ".join(self.forgetting)
        per_task = ", ".join(f"{task} {value:.4f}" for task, value in self.forgetting.items())
        return [f"Continual-learning figures over the stages (task scores {scores}; the model before training is "
                "not a row):",
                f"- average score after the last stage: {self.average_score:.4f}",
                f"- backward transfer (Lopez-Paz & Ranzato 2017) over {earlier}: {self.backward_transfer:.4f}",
                f"- forgetting (Chaudhry et al. 2018): {per_task}; mean {self.average_forgetting:.4f}"]


def forgetting_measures(scores, tasks: Sequence[str],
                        trained: Sequence[Collection[str]]) -> ForgettingMeasures | None:
    """ForgettingMeasures of the forgetting matrix `scores` (stages × tasks; row l: each task's score after
    stage l), whose columns are `tasks` and whose stage l trained the tasks `trained[l]`.

    None when no task is an earlier one (a single stage; a multi-task schedule, whose every stage trains every
    task): without a task that later stages could take something from, BWT and forgetting are undefined.
    """
    matrix = np.asarray(scores, dtype=float)
    if matrix.shape != (len(trained), len(tasks)):
        raise ValueError(f"scores of shape {matrix.shape}, but {len(trained)} stages and {len(tasks)} tasks")
    last = len(trained) - 1
    last_trained = {task: max(l for l, stage in enumerate(trained) if task in stage)
                    for task in tasks if any(task in stage for stage in trained)}
    earlier = [i for i, task in enumerate(tasks) if task in last_trained and last_trained[task] < last]
    if not earlier:
        return None
    final = matrix[last]
    transfer = [final[i] - matrix[last_trained[tasks[i]], i] for i in earlier]
    return ForgettingMeasures(
        tasks=tuple(tasks), average_score=float(final.mean()), backward_transfer=float(np.mean(transfer)),
        forgetting={tasks[i]: float(matrix[:last, i].max() - final[i]) for i in earlier})


def history_forgetting_measures(history: Sequence[Mapping]) -> ForgettingMeasures | None:
    """forgetting_measures of a run's history: one row per stage record (not the record of the model before
    training: the rows l of Chaudhry et al.'s max are stages), a column per task whose TASK_SCORES key every row
    has, each stage's trained tasks read from its label."""
    stages = [record for record in history if record.get("stage") != BEFORE_TRAINING]
    tasks = [task for task, key in TASK_SCORES.items() if stages and all(key in record for record in stages)]
    if not tasks:
        return None
    scores = [[record[TASK_SCORES[task]] for task in tasks] for record in stages]
    return forgetting_measures(scores, tasks, [tasks_trained_by(record["stage"], tasks) for record in stages])


def error_counts(sst_pred, sst_gold, para_pred, para_gold, sts_pred, sts_gold) -> dict:
    """The counts the error-analysis plots draw, as numbers: SST examples per (predicted − gold) offset,
    the QQP confusion matrix with precision and recall of the duplicate class, and per gold STS bin
    ([0, 1), …, [4, 5]) the number of pairs, their mean prediction and mean absolute error."""
    sst_p, sst_g = paired_arrays(sst_pred, sst_gold)
    para_p, para_g = paired_arrays(para_pred, para_gold)
    sts_p, sts_g = paired_arrays(sts_pred, sts_gold)
    offsets = Counter((sst_p - sst_g).astype(int).tolist())
    paraphrase_metrics(para_p, para_g)  # validates the 0/1 values counted below
    true_pos = int(np.sum((para_p == 1) & (para_g == 1)))
    false_pos = int(np.sum((para_p == 1) & (para_g == 0)))
    false_neg = int(np.sum((para_p == 0) & (para_g == 1)))
    bins = []
    for low in range(5):
        # the last bin is closed: gold 5.0 belongs to [4, 5]
        inside = (sts_g >= low) & ((sts_g < low + 1) if low < 4 else (sts_g <= 5))
        if inside.any():
            bins.append({"gold": f"[{low}, {low + 1}{')' if low < 4 else ']'}", "pairs": int(inside.sum()),
                         "mean_prediction": float(sts_p[inside].mean()),
                         "mean_abs_error": float(np.abs(sts_p[inside] - sts_g[inside]).mean())})
    return {
        "sst_offsets": {offset: offsets.get(offset, 0) for offset in range(-4, 5)},
        "qqp": {"true_negatives": int(np.sum((para_p == 0) & (para_g == 0))), "false_positives": false_pos,
                "false_negatives": false_neg, "true_positives": true_pos,
                "precision": true_pos / (true_pos + false_pos) if true_pos + false_pos else 0.0,
                "recall": true_pos / (true_pos + false_neg) if true_pos + false_neg else 0.0},
        "sts_bins": bins,
        "sts_mean_prediction": float(sts_p.mean()), "sts_mean_gold": float(sts_g.mean()),
    }
