"""A finished run's raw dev and test outputs, saved beside its checkpoints so that an ensemble
(ensemble.py) combines runs without running any model again; with --score_train also its train outputs, which
distillation.py learns from.

    RUN/scores/{sst,qqp,sts}-{dev,test}.csv      one row per example, in the data file's order
    RUN/scores/{sst,qqp,sts}-train.csv           --score_train (an ensemble's: the teacher it combines)
    sst  id,logit_0,...,logit_4     the five class logits
    qqp  id,logit                   the duplicate logit (its sign is the prediction)
    sts  id,score                   the 0-5 similarity the leaderboard CSV reports
    qa   id,no_answer_margin,answer SQuAD: no-answer score - best span score, and that span (squad.py)

The scores are those of the best model, the one that wrote the run's leaderboard CSVs, so that
decide(score) gives exactly the CSVs' predictions (losses.py). Plain CSV, nothing to unpickle;
floats are written with 9 significant digits, which float32 reads back exactly.
"""
from __future__ import annotations

import csv
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from files import atomic_write_csv
from squad import Answer
from tasks import TASKS

SCORE_COLUMNS = {"sst": tuple(f"logit_{c}" for c in range(TASKS["sst"].num_classes)), "qqp": ("logit",),
                 "sts": ("score",)}


QA_SCORE_COLUMNS = ("no_answer_margin", "answer")


class ScoresFileError(ValueError):
    """A scores file that cannot be read; the message names the file and the problem in one line."""


def scores_path(run_dir: str | os.PathLike, task: str, split: str) -> Path:
    return Path(run_dir) / "scores" / f"{task}-{split}.csv"


def write_scores(path: str | os.PathLike, ids: Sequence[str], scores: np.ndarray, task: str) -> None:
    """One row per id, in the order given; written to a temporary sibling and moved into place."""
    path = Path(path)
    scores = np.asarray(scores, dtype=np.float64).reshape(len(ids), -1)
    if scores.shape[1] != len(SCORE_COLUMNS[task]):
        raise ValueError(f"{path}: {task} has {len(SCORE_COLUMNS[task])} score column(s), got {scores.shape[1]}")
    atomic_write_csv(path, [["id", *SCORE_COLUMNS[task]],
                            *([str(i), *(f"{v:.9g}" for v in row)] for i, row in zip(ids, scores))])


def write_qa_scores(path: str | os.PathLike, answers: dict[str, Answer]) -> None:
    """SQuAD's scores: per question (in the order given) the no-answer margin, what a threshold or an ensemble
    decides answerability from, and the best non-empty span it would otherwise answer."""
    atomic_write_csv(path, [["id", *QA_SCORE_COLUMNS],
                            *([qid, f"{answer.margin:.9g}", answer.text] for qid, answer in answers.items())])


def read_scores(path: str | os.PathLike, task: str) -> tuple[list[str], np.ndarray]:
    """(ids, scores): scores (N, 5) for sst, (N,) for qqp and sts. Raises ScoresFileError on a missing file, a
    wrong header, a short row, a value that is not a finite number, or a repeated id."""
    path = Path(path)
    if not path.is_file():
        raise ScoresFileError(f"{path}: no such scores file (a run writes RUN/scores/ when it finishes)")
    expected = ["id", *SCORE_COLUMNS[task]]
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows or rows[0] != expected:
        raise ScoresFileError(f"{path}: header must be {','.join(expected)}")
    ids, values = [], []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(expected):
            raise ScoresFileError(f"{path}, line {line}: {len(row)} fields, expected {len(expected)}")
        try:
            numbers = [float(v) for v in row[1:]]
        except ValueError:
            raise ScoresFileError(f"{path}, line {line}: a score that is not a number") from None
        if not all(math.isfinite(v) for v in numbers):
            raise ScoresFileError(f"{path}, line {line}: a score that is not finite")
        ids.append(row[0])
        values.append(numbers)
    if not ids:
        raise ScoresFileError(f"{path}: no rows")
    repeated = [i for i, count in Counter(ids).items() if count > 1]
    if repeated:
        raise ScoresFileError(f"{path}: repeated id {repeated[0]!r}")
    array = np.array(values, dtype=np.float64)
    return ids, array if task == "sst" else array[:, 0]
