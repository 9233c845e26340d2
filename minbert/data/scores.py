"""A finished run's raw dev and test outputs, saved beside its checkpoints so that an ensemble
(scripts/ensemble.py) combines runs without running any model again; with --score_train also its train outputs, which
minbert/training/distillation.py learns from.

    RUN/scores/{sst,qqp,sts}-{dev,test}.csv      one row per example, in the data file's order
    RUN/scores/{sst,qqp,sts}-train.csv           --score_train (an ensemble's: the teacher it combines)
    RUN/scores/qa-train.safetensors              --score_train on SQuAD: every training window's start and end
                                                 logits (span_logits_path; too many numbers for a CSV)
    sst  id,logit_0,...,logit_4     the five class logits
    qqp  id,logit                   the duplicate logit (its sign is the prediction)
    sts  id,score                   the 0-5 similarity the leaderboard CSV reports
    qa   id,no_answer_margin,answer SQuAD: no-answer score - best span score, and that span (minbert/tasks/squad.py)

Each task names its columns and checks its values (minbert/tasks/: score_columns, score_problem); the files' format is
minbert/tasks/score_files.py's, SQuAD's train logits minbert/tasks/qa.py's.

The scores are those of the best model, the one that wrote the run's leaderboard CSVs, so that
the task's decide(score) gives exactly the CSVs' predictions: the run decides from its scores as saved
(`as_saved`), the values an ensemble reads back. Plain CSV, nothing to unpickle; floats are written with 9
significant digits, which float32 reads back exactly.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from minbert.tasks import TASKS
from minbert.tasks.qa import span_logits_path  # noqa: F401 (SQuAD's train logits, in a run's folder)
from minbert.tasks.score_files import ScoresFileError, scores_path  # noqa: F401 (read where a run's folder is)


def write_scores(path: str | os.PathLike, ids: Sequence[str], scores: np.ndarray, task: str) -> None:
    """One row per id, in the order given; written to a temporary sibling and moved into place."""
    TASKS[task].outputs.write_scores(path, ids, scores)


def read_scores(path: str | os.PathLike, task: str) -> tuple[list[str], np.ndarray]:
    """(ids, scores): scores (N, 5) for sst, (N,) for qqp and sts. Raises ScoresFileError on a missing or unreadable
    file, one that is not a UTF-8 CSV, a wrong header, a short row, a value that is not a finite number or not the
    task's, or a repeated id."""
    return TASKS[task].outputs.read_scores(path)
