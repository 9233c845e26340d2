"""The course leaderboard's view of the tasks: each task's metrics as a run records them, the overall score and the
score that picks the model a run keeps, one-line summaries, and the leaderboard's prediction files. Each task says
what its metrics and its CSV cells are (minbert/tasks/); this module asks it. evaluation.py gives the course's names.

Tasks: SST-5 sentiment (accuracy), Quora paraphrase detection (accuracy), STS-B similarity
(Pearson r). The course leaderboard combines them as
    overall = ((pearson + 1) / 2 + sst_acc + paraphrase_acc) / 3
so that the Pearson correlation is mapped from [-1, 1] onto [0, 1] before averaging.

Everything here is pure (no model, no plotting), so importing this module stays cheap for training and tests.
"""

import csv
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from minbert.tasks import MULTITASK, TASKS, default_output
from minbert.tasks.base import first_few

LEADERBOARD_COLUMNS = {name: task.leaderboard_column for name, task in TASKS.items()}
DEFAULT_OUTPUTS = {(task, split): default_output(task, split) for task in MULTITASK for split in ("dev", "test")}


class PredictionsFileError(ValueError):
    """A predictions CSV is missing or malformed; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------
# Metrics


def task_metrics(task: str, predictions, labels) -> dict[str, float]:
    """The history's metric keys for one task: sst_acc, sst_f1_macro, sst_f1_weighted; qqp_acc, qqp_f1,
    qqp_f1_weighted; sts_pearson, sts_spearman."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}")
    return TASKS[task].model.metrics(predictions, labels)


def overall_score(sst_acc: float, paraphrase_acc: float, sts_pearson: float) -> float:
    return ((sts_pearson + 1) / 2 + sst_acc + paraphrase_acc) / 3


def overall_of(metrics: Mapping[str, float]) -> float:
    """The overall score of metrics that hold the score of every default task (the course's three)."""
    return overall_score(*(metrics[TASKS[task].model.score_key] for task in MULTITASK))


def kept_model_score(metrics: Mapping[str, float], trained_tasks: Iterable[str]) -> float:
    """What picks the model a run keeps: the mean score over the tasks the run trains (SST and QQP accuracy,
    (STS r + 1) / 2, SQuAD F1), so that a run training one task keeps that task's best model rather than the one
    whose untrained heads happen to score best. With the three tasks (or none) it is the overall score."""
    tasks = set(trained_tasks) or set(MULTITASK)
    scores = [TASKS[task].model.kept_score(metrics) for task in TASKS if task in tasks]
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
    """Write a leaderboard CSV `id,<column>` with one row per id, in the order given (TaskOutputs.write_predictions:
    moved into place whole)."""
    _column(task)  # an unknown task is refused as read_predictions refuses it
    TASKS[task].outputs.write_predictions(Path(path), ids, predictions)


def read_predictions(path: str | os.PathLike, task: str) -> dict[str, int | float]:
    """Parse a leaderboard CSV into {id: prediction}, rejecting anything the grader would.

    Accepts the comma-separated form written by write_predictions and the course starter's
    form ('id \\t Predicted_Sentiment' header, 'id , value' rows); cells are whitespace-stripped.
    """
    path = Path(path)
    column = _column(task)
    if not path.is_file():
        raise PredictionsFileError(f"{path}: file not found")
    try:
        return _read_predictions(path, task, column)
    except UnicodeDecodeError:
        raise PredictionsFileError(f"{path}: not UTF-8 text") from None


def _read_predictions(path: Path, task: str, column: str) -> dict[str, int | float]:
    with path.open(newline="", encoding="utf-8") as handle:
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
                predictions[row_id] = TASKS[task].outputs.parse_prediction(text)
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
