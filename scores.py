"""A finished run's raw dev and test outputs, saved beside its checkpoints so that an ensemble
(ensemble.py) combines runs without running any model again; with --score_train also its train outputs, which
distillation.py learns from.

    RUN/scores/{sst,qqp,sts}-{dev,test}.csv      one row per example, in the data file's order
    RUN/scores/{sst,qqp,sts}-train.csv           --score_train (an ensemble's: the teacher it combines)
    RUN/scores/qa-train.safetensors              --score_train on SQuAD: every training window's start and end
                                                 logits (span_logits_path; too many numbers for a CSV)
    sst  id,logit_0,...,logit_4     the five class logits
    qqp  id,logit                   the duplicate logit (its sign is the prediction)
    sts  id,score                   the 0-5 similarity the leaderboard CSV reports
    qa   id,no_answer_margin,answer SQuAD: no-answer score - best span score, and that span (squad.py)

The scores are those of the best model, the one that wrote the run's leaderboard CSVs, so that
decide(score) gives exactly the CSVs' predictions (losses.py): the run decides from its scores as saved
(`as_saved`), the values an ensemble reads back. Plain CSV, nothing to unpickle; floats are written with 9
significant digits, which float32 reads back exactly.
"""
from __future__ import annotations

import csv
import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from files import atomic_write_bytes, atomic_write_csv
from squad import Answer
from tasks import TASKS

SCORE_COLUMNS = {"sst": tuple(f"logit_{c}" for c in range(TASKS["sst"].num_classes)), "qqp": ("logit",),
                 "sts": ("score",)}


QA_SCORE_COLUMNS = ("no_answer_margin", "answer")
# What each task's objective can take, as a model or an ensemble writes it. A logit (SST's, QQP's, SQuAD's start and
# end) beyond +-1e4 is no trained model's (SQuAD's padding is -1e4, multitask_bert.PADDING_LOGIT) and overflows the
# float32 losses that distil it; STS's score is the 0-5 similarity, give or take float32's rounding of a cosine.
MAX_LOGIT = 1e4
STS_RANGE = (0.0, 5.0)
STS_ROUNDING = 1e-4


class ScoresFileError(ValueError):
    """A scores file that cannot be read; the message names the file and the problem in one line."""


def scores_path(run_dir: str | os.PathLike, task: str, split: str) -> Path:
    return Path(run_dir) / "scores" / f"{task}-{split}.csv"


def _text(value: float) -> str:
    return f"{value:.9g}"


def as_saved(scores: np.ndarray) -> np.ndarray:
    """The scores as a scores file holds them: float64 read back from their 9-digit text. A run decides its CSVs
    from these, not from the model's float32, so a one-member ensemble writes the same CSVs: the float32 STS score
    1.2917850017... rounds to "1.29179", but its text "1.291785" reads back as 1.2917849999... and rounds to
    "1.29178"."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.array([float(_text(v)) for v in scores.ravel()], dtype=np.float64).reshape(scores.shape)


def write_scores(path: str | os.PathLike, ids: Sequence[str], scores: np.ndarray, task: str) -> None:
    """One row per id, in the order given; written to a temporary sibling and moved into place."""
    path = Path(path)
    scores = np.asarray(scores, dtype=np.float64).reshape(len(ids), -1)
    if scores.shape[1] != len(SCORE_COLUMNS[task]):
        raise ValueError(f"{path}: {task} has {len(SCORE_COLUMNS[task])} score column(s), got {scores.shape[1]}")
    atomic_write_csv(path, [["id", *SCORE_COLUMNS[task]],
                            *([str(i), *(_text(v) for v in row)] for i, row in zip(ids, scores))])


def write_qa_scores(path: str | os.PathLike, answers: dict[str, Answer]) -> None:
    """SQuAD's scores: per question (in the order given) the no-answer margin, what a threshold or an ensemble
    decides answerability from, and the best non-empty span it would otherwise answer."""
    atomic_write_csv(path, [["id", *QA_SCORE_COLUMNS],
                            *([qid, _text(answer.margin), answer.text] for qid, answer in answers.items())])


def _out_of_range(task: str, numbers: list[float]) -> str | None:
    """Why these scores of `task` are outside what its objective can take (MAX_LOGIT, STS_RANGE), or None."""
    if task == "sts":
        low, high = STS_RANGE
        if not low - STS_ROUNDING <= numbers[0] <= high + STS_ROUNDING:
            return f"STS score {numbers[0]:g} is outside {low:g}-{high:g}"
    elif any(abs(v) > MAX_LOGIT for v in numbers):
        return f"a logit beyond +-{MAX_LOGIT:g} ({max(numbers, key=abs):g}), which no trained model gives"
    return None


def read_scores(path: str | os.PathLike, task: str) -> tuple[list[str], np.ndarray]:
    """(ids, scores): scores (N, 5) for sst, (N,) for qqp and sts. Raises ScoresFileError on a missing or unreadable
    file, one that is not a UTF-8 CSV, a wrong header, a short row, a value that is not a finite number, or a
    repeated id."""
    path = Path(path)
    if not path.is_file():
        raise ScoresFileError(f"{path}: no such scores file (a run writes RUN/scores/ when it finishes)")
    expected = ["id", *SCORE_COLUMNS[task]]
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError as err:
        raise ScoresFileError(f"{path}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ScoresFileError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except csv.Error as err:  # e.g. a field longer than the csv module's limit
        raise ScoresFileError(f"{path}: not a scores CSV ({err})") from None
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
        problem = _out_of_range(task, numbers)
        if problem:
            raise ScoresFileError(f"{path}, line {line}: {problem}")
        ids.append(row[0])
        values.append(numbers)
    if not ids:
        raise ScoresFileError(f"{path}: no rows")
    repeated = [i for i, count in Counter(ids).items() if count > 1]
    if repeated:
        raise ScoresFileError(f"{path}: repeated id {repeated[0]!r}")
    array = np.array(values, dtype=np.float64)
    return ids, array if task == "sst" else array[:, 0]


# -- SQuAD's train scores: the start and end logits of every window ------------------------------------

def span_logits_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "scores" / "qa-train.safetensors"


def write_span_logits(path: str | os.PathLike, ids: Sequence[str], logits: Sequence[np.ndarray], max_length: int,
                      doc_stride: int) -> None:
    """SQuAD windows' start and end logits, window `ids[i]`'s as `logits[i]` (its own length L_i, (L_i, 2)), in
    safetensors: "logits" (sum L_i, 2) float32 and "lengths" (N,) int64, the window ids and the windowing
    (max_length, doc_stride) as JSON in its metadata "windows". Atomic, as every write of the project."""
    lengths = np.array([len(row) for row in logits], dtype=np.int64)
    flat = np.concatenate([np.asarray(row, dtype=np.float32).reshape(-1, 2) for row in logits])  # (sum L_i, 2)
    # One metadata key: safetensors writes several in no fixed order, and the file must be byte-reproducible.
    windows = json.dumps({"ids": list(ids), "max_length": max_length, "doc_stride": doc_stride})
    atomic_write_bytes(path, save({"logits": flat, "lengths": lengths}, metadata={"windows": windows}))


@dataclass(frozen=True)
class SpanLogits:
    """A qa-train.safetensors file: window ids and each window's (length, 2) logits."""
    ids: list[str]
    logits: list[np.ndarray]  # N arrays (L_i, 2)
    max_length: int
    doc_stride: int


def read_span_logits(path: str | os.PathLike) -> SpanLogits:
    """write_span_logits' file, checked (tensors, lengths, ids, finite values); nothing is unpickled. Raises
    ScoresFileError naming the file."""
    path = Path(path)
    try:
        with safe_open(path, framework="np") as handle:
            windows = json.loads((handle.metadata() or {})["windows"])
            flat, lengths = handle.get_tensor("logits"), handle.get_tensor("lengths")
        ids, max_length, doc_stride = windows["ids"], int(windows["max_length"]), int(windows["doc_stride"])
    except FileNotFoundError:
        raise ScoresFileError(f"{path}: no such scores file (a run writes it with --score_train)") from None
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as err:
        raise ScoresFileError(f"{path}: not a SQuAD train-logits file ({type(err).__name__}: {err})") from None
    if lengths.dtype.kind not in "iu":  # window lengths count tokens: a float would split the logits anywhere
        raise ScoresFileError(f"{path}: the window lengths must be integers, found {lengths.dtype}")
    if (flat.ndim != 2 or flat.shape[1] != 2 or lengths.ndim != 1 or not isinstance(ids, list)
            or not all(isinstance(i, str) for i in ids) or len(lengths) != len(ids) or (lengths < 1).any()
            or int(lengths.sum()) != len(flat)):
        raise ScoresFileError(f"{path}: the logits, lengths and window ids do not fit together")
    if not np.isfinite(flat).all():
        raise ScoresFileError(f"{path}: a logit that is not finite")
    if (np.abs(flat) > MAX_LOGIT).any():
        raise ScoresFileError(f"{path}: a logit beyond +-{MAX_LOGIT:g} ({flat.flat[np.abs(flat).argmax()]:g}), which "
                              "no trained model gives")
    if len(set(ids)) != len(ids):
        raise ScoresFileError(f"{path}: repeated window id {next(i for i, c in Counter(ids).items() if c > 1)!r}")
    return SpanLogits(ids, np.split(flat, np.cumsum(lengths)[:-1]), max_length, doc_stride)
