"""The scores files of a run (RUN/scores/TASK-SPLIT.csv): one row per example, an id and the task's score columns,
in plain CSV (nothing to unpickle). Floats are written with 9 significant digits, which float32 reads back
exactly. minbert/data/scores.py is where a run's folder meets them; each task names its columns and checks its values.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from minbert.files import atomic_write_csv, atomic_write_text, file_sha256

# A logit (SST's, QQP's, SQuAD's start and end) beyond +-1e4 is no trained model's (SQuAD's padding is -1e4,
# tasks.qa.PADDING_LOGIT) and overflows the float32 losses that distil it.
MAX_LOGIT = 1e4


class ScoresFileError(ValueError):
    """A scores file that cannot be read; the message names the file and the problem in one line."""


def scores_path(run_dir: str | os.PathLike, task: str, split: str) -> Path:
    return Path(run_dir) / "scores" / f"{task}-{split}.csv"


def score_text(value: float) -> str:
    return f"{value:.9g}"


def as_saved(scores: np.ndarray) -> np.ndarray:
    """The scores as a scores file holds them: float64 read back from their 9-digit text. A run decides its CSVs
    from these, not from the model's float32, so a one-member ensemble writes the same CSVs: the float32 STS score
    1.2917850017... rounds to "1.29179", but its text "1.291785" reads back as 1.2917849999... and rounds to
    "1.29178"."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.array([float(score_text(v)) for v in scores.ravel()], dtype=np.float64).reshape(scores.shape)


def write_score_rows(path: str | os.PathLike, columns: Sequence[str], ids: Sequence[str], scores: np.ndarray) -> None:
    """One row per id, in the order given, `scores` (N, len(columns)); written to a temporary sibling and moved
    into place."""
    atomic_write_csv(path, [["id", *columns], *([str(i), *(score_text(v) for v in row)] for i, row in zip(ids, scores))])


def read_score_rows(path: str | os.PathLike, columns: Sequence[str],
                    row_problem: Callable[[list[float]], str | None]) -> tuple[list[str], np.ndarray]:
    """(ids, scores (N, len(columns)) float64). Raises ScoresFileError on a missing or unreadable file, one that is
    not a UTF-8 CSV, a wrong header, a short row, a value that is not a finite number, one that `row_problem`
    refuses (it says why), or a repeated id."""
    path = Path(path)
    if not path.is_file():
        raise ScoresFileError(f"{path}: no such scores file (a run writes RUN/scores/ when it finishes)")
    expected = ["id", *columns]
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
        problem = row_problem(numbers)
        if problem:
            raise ScoresFileError(f"{path}, line {line}: {problem}")
        ids.append(row[0])
        values.append(numbers)
    if not ids:
        raise ScoresFileError(f"{path}: no rows")
    repeated = [i for i, count in Counter(ids).items() if count > 1]
    if repeated:
        raise ScoresFileError(f"{path}: repeated id {repeated[0]!r}")
    return ids, np.array(values, dtype=np.float64)


def logit_problem(numbers: list[float]) -> str | None:
    """Why a row of logits is no trained model's, or None."""
    if any(abs(v) > MAX_LOGIT for v in numbers):
        return f"a logit beyond +-{MAX_LOGIT:g} ({max(numbers, key=abs):g}), which no trained model gives"
    return None


def fingerprint(rows) -> str:
    """SHA-256 of (id, array) rows, sorted by id: --resume refuses a teacher whose scores changed."""
    digest = hashlib.sha256()
    for i, values in sorted(rows, key=lambda row: row[0]):
        digest.update(f"{i}\0{values.dtype}{values.shape}\0".encode())
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class TeacherScores:
    """One task's teacher scores on the training examples (a scores file's rows), looked up by example id."""
    rows: dict[str, int]
    scores: np.ndarray  # (N, columns) as read_score_rows reads them

    def of(self, ids: list[str], student: Tensor) -> Tensor:
        """The scores of these examples, shaped as the student's."""
        return torch.from_numpy(self.scores[[self.rows[i] for i in ids]]).squeeze(-1).to(student)  # (B, C) or (B,)

    def fingerprint(self) -> str:
        """SHA-256 of the scores by id, whatever their row order."""
        return fingerprint((i, self.scores[row]) for i, row in self.rows.items())

    def check_windows(self, inputs) -> None:
        """Nothing to refuse in the student's tokenised train split: these scores are one per example, and
        load_teacher found every example's (a teacher of SQuAD's windows, qa.py's TeacherSpans, checks them)."""


# --score_train's record (RUN/scores/train.json): what ties a folder's train scores to the model that wrote them, so
# that --distill and scripts/ensemble.py --score_train refuse another run's copied in (or an earlier model's).
TRAIN_RECORD = "train.json"


def train_record_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "scores" / TRAIN_RECORD


def model_sha256(run_dir: str | os.PathLike, model: str) -> str | None:
    """The digest of the folder's model that the record names: a run's best.json "sha256" (its kept weights'), or
    an ensemble's ensemble.json's own SHA-256 (its members, weights and methods); None when there is none."""
    path = Path(run_dir) / model
    try:
        if model == "ensemble.json":
            return file_sha256(path)
        digest = json.loads(path.read_text(encoding="utf-8")).get("sha256")
        return digest if isinstance(digest, str) else None
    except (OSError, ValueError, AttributeError):
        return None


def write_train_record(run_dir: str | os.PathLike, files: Sequence[str | os.PathLike],
                       model: str = "best.json") -> Path:
    """RUN/scores/train.json: the SHA-256 of each train scores file in `files` and of the model (`model`: best.json
    or ensemble.json, model_sha256) that wrote them."""
    digest = model_sha256(run_dir, model)
    if digest is None:
        raise ScoresFileError(f"{Path(run_dir) / model}: no model digest to tie the train scores to")
    record = {"model": model, "model_sha256": digest,
              "files": {Path(path).name: file_sha256(path) for path in files}}
    path = train_record_path(run_dir)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def check_train_scores(run_dir: str | os.PathLike, files: Sequence[str | os.PathLike]) -> None:
    """Refuses (ScoresFileError, one line naming the file) a train scores file of `files` that the folder's record
    does not tie to its current model: not recorded, changed since, or written by a model the folder no longer
    holds. A folder without a record (train scores written before the record existed) is not checked."""
    record_path = train_record_path(run_dir)
    if not record_path.is_file():
        return
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        model, digest, recorded = record["model"], record["model_sha256"], dict(record["files"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ScoresFileError(f"{record_path}: not a train scores record ({err})") from None
    for path in map(Path, files):
        if not path.is_file():
            continue  # the task's reader says it is missing
        if path.name not in recorded:
            raise ScoresFileError(f"{path}: not among the train scores {record_path} records; not this run's")
        if file_sha256(path) != recorded[path.name]:
            raise ScoresFileError(f"{path}: not the train scores {record_path} records (its SHA-256 differs); "
                                  "not this run's")
        if model_sha256(run_dir, model) != digest:
            raise ScoresFileError(f"{path}: written by another model than {Path(run_dir) / model}'s ({record_path} "
                                  "records another digest); rewrite them with --score_train")
