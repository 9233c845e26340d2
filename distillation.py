"""Knowledge distillation from saved scores: a teacher (an ensemble from ensemble.py, or any run written with
--score_train) has left its outputs on the training examples in TEACHER/scores/{task}-train.csv (scores.py); a
student trains on the mix (1 - w) * gold loss + w * distillation loss, with no teacher model in memory.

    teacher = load_teacher("runs/ensemble", {"sst": sst_train_ids, ...})     # refuses scores that miss an id
    distillation = Distillation(teacher, weight=0.5, temperature=2.0)
    loss = distillation.mix("sst", gold_loss, objective, outputs, batch["ids"])

The losses compare scores in the space the runs save them in (SST's 5 logits, QQP's logit, STS's 0-5 score,
SQuAD's start and end logits of every window), so a teacher is any folder of saved scores, whatever model or
ensemble wrote them. (ensemble.py combines no SQuAD scores: a SQuAD teacher is one run.)
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from losses import Objective
from multitask_bert import PADDING_LOGIT
from scores import ScoresFileError, read_scores, read_span_logits, scores_path, span_logits_path
from squad import QAWindows

DISTILLED_TASKS = ("sst", "qqp", "sts", "qa")  # the tasks whose saved scores a student can learn from
SOFTENED_TASKS = ("sst", "qa")  # those whose distillation softens distributions at a temperature


def distillation_loss(task: str, student: Tensor, teacher: Tensor, temperature: float = 1.0,
                      sts_scale: float = 5.0) -> Tensor:
    """How far a student's scores are from its teacher's, 0 where they agree.

    sst: KL(teacher || student) of the softmaxes at temperature T, times T^2 so that the gradients keep their
    size as T changes (Hinton et al. 2015). qqp: the KL of the two Bernoulli distributions, i.e. the binary cross
    entropy on the teacher's probability minus that probability's entropy. sts: the squared error of the 0-5
    scores over sts_scale^2, the scale of the gold loss: the score is sts_scale times what the gold loss fits
    (5 cos against label / 5, so MSE(cos, teacher / 5); losses.py's score_scale). qa: as sst for the start and end
    distribution over a window's tokens (B, T, 2), averaged, as the gold loss averages its two cross entropies;
    padding holds PADDING_LOGIT on both sides, so it weighs nothing."""
    student, teacher = student.float(), teacher.float()
    if task == "sst":
        log_student = F.log_softmax(student / temperature, dim=-1)  # (B, 5)
        log_teacher = F.log_softmax(teacher / temperature, dim=-1)
        return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean") * temperature ** 2
    if task == "qqp":
        target = torch.sigmoid(teacher)  # (B,)
        return (F.binary_cross_entropy_with_logits(student, target)
                - F.binary_cross_entropy_with_logits(teacher, target))
    if task == "sts":
        return F.mse_loss(student, teacher) / sts_scale ** 2
    if task == "qa":
        log_student = F.log_softmax(student / temperature, dim=1)  # (B, T, 2): over the tokens
        log_teacher = F.log_softmax(teacher / temperature, dim=1)
        kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="sum") / (2 * len(student))
        return kl * temperature ** 2
    raise ValueError(f"no distillation loss for {task!r}; one of {DISTILLED_TASKS}")


def _fingerprint(rows) -> str:
    """SHA-256 of (id, array) rows, sorted by id."""
    digest = hashlib.sha256()
    for i, values in sorted(rows, key=lambda row: row[0]):
        digest.update(f"{i}\0{values.dtype}{values.shape}\0".encode())
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class TeacherScores:
    """One task's teacher scores on the training examples, looked up by example id."""
    rows: dict[str, int]
    scores: np.ndarray  # (N, columns) as scores.py reads them

    def of(self, ids: list[str], student: Tensor) -> Tensor:
        """The scores of these examples, shaped as the student's."""
        return torch.from_numpy(self.scores[[self.rows[i] for i in ids]]).squeeze(-1).to(student)  # (B, 5) or (B,)

    def fingerprint(self) -> str:
        """SHA-256 of the scores by id, whatever their row order: --resume refuses a teacher that changed."""
        return _fingerprint((i, self.scores[row]) for i, row in self.rows.items())


@dataclass(frozen=True)
class TeacherSpans:
    """SQuAD's teacher: each training window's start and end logits (its own length, (L, 2)), by window id."""
    logits: dict[str, np.ndarray]
    path: Path  # the file they came from, for the error messages

    def fingerprint(self) -> str:
        return _fingerprint(self.logits.items())

    def of(self, ids: list[str], student: Tensor) -> Tensor:
        """The windows' logits padded as the student's batch (B, T, 2), PADDING_LOGIT beyond each window."""
        target = torch.full(student.shape, PADDING_LOGIT, dtype=torch.float32)
        for row, i in enumerate(ids):
            logits = self.logits[i]
            target[row, :len(logits)] = torch.from_numpy(logits)
        return target.to(student.device)

    def check_windows(self, windows: QAWindows) -> None:
        """Refuse a teacher whose windows are not the student's: the same ids and token counts (another
        tokenizer, --qa_max_length or --qa_doc_stride cuts them differently), in one ScoresFileError line."""
        for window, length in zip(windows, windows.lengths):
            if window.id not in self.logits:
                raise ScoresFileError(f"{self.path}: no teacher logits for the training window {window.id}; the "
                                      "teacher must have cut this training set into the same windows")
            if len(self.logits[window.id]) != length:
                raise ScoresFileError(f"{self.path}: the teacher's window {window.id} has "
                                      f"{len(self.logits[window.id])} tokens, this run's {length}: another "
                                      "tokenizer or windowing; distil from a teacher with the student's")


def load_teacher(run_dir: str | Path, train_ids: dict[str, list[str]],
                 qa_windowing: tuple[int, int] | None = None) -> dict[str, TeacherScores | TeacherSpans]:
    """The teacher's train scores of every task in `train_ids` (the student's training ids per task; SQuAD's
    question ids). A missing file, or one that lacks an id the student trains on (another data set, or a teacher
    written with fewer training examples), raises ScoresFileError naming the file; so does SQuAD's when its
    (max_length, doc_stride) is not the student's `qa_windowing`."""
    if not Path(run_dir).is_dir():
        raise ScoresFileError(f"{run_dir}: not a folder; --distill names a teacher's folder (a run written with "
                              "--score_train, or ensemble.py --score_train's output)")
    teacher = {}
    for task, ids in train_ids.items():
        if task == "qa":
            teacher[task] = _load_teacher_spans(run_dir, ids, qa_windowing)
            continue
        path = scores_path(run_dir, task, "train")
        if not path.is_file():
            raise ScoresFileError(f"{path}: no train scores for --distill; write them with --score_train (a run) "
                                  "or ensemble.py --score_train (an ensemble of such runs)")
        teacher_ids, scores = read_scores(path, task)
        rows = {i: row for row, i in enumerate(teacher_ids)}
        missing = [i for i in ids if i not in rows]
        if missing:
            raise ScoresFileError(f"{path}: no teacher score for {len(missing)} of the {len(ids)} {task} training "
                                  f"examples (e.g. id {missing[0]}); the teacher must have scored this training set")
        teacher[task] = TeacherScores(rows, scores.reshape(len(teacher_ids), -1))
    return teacher


def _load_teacher_spans(run_dir: str | Path, question_ids: list[str],
                        windowing: tuple[int, int] | None) -> TeacherSpans:
    path = span_logits_path(run_dir)
    if not path.is_file():
        raise ScoresFileError(f"{path}: no SQuAD train logits for --distill; write them with --score_train")
    spans = read_span_logits(path)
    if windowing is not None and (spans.max_length, spans.doc_stride) != tuple(windowing):
        raise ScoresFileError(f"{path}: windows of {spans.max_length} tokens with stride {spans.doc_stride}, this run "
                              f"cuts {windowing[0]} with stride {windowing[1]} (--qa_max_length, --qa_doc_stride)")
    scored = {i.rpartition("#")[0] for i in spans.ids}
    missing = [i for i in question_ids if i not in scored]
    if missing:
        raise ScoresFileError(f"{path}: no teacher logits for {len(missing)} of the {len(question_ids)} qa training "
                              f"questions (e.g. id {missing[0]}); the teacher must have scored this training set")
    return TeacherSpans(dict(zip(spans.ids, spans.logits)), path)


@dataclass(frozen=True)
class Distillation:
    """The teacher's scores and how a student's loss mixes them in: (1 - weight) * gold + weight * distillation,
    with `weight` and `temperature` unless `per_task` gives a task its own (weight, temperature)."""
    teacher: dict[str, TeacherScores | TeacherSpans]
    weight: float = 0.5
    temperature: float = 1.0
    per_task: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self):
        for weight, temperature in [(self.weight, self.temperature), *self.per_task.values()]:
            if not (math.isfinite(weight) and 0 < weight <= 1):
                raise ValueError(f"the distillation weight must be in (0, 1], got {weight!r}")
            if not (math.isfinite(temperature) and temperature > 0):
                raise ValueError(f"the distillation temperature must be > 0, got {temperature!r}")

    def fingerprints(self) -> dict[str, str]:
        """The teacher's scores of each task, as --resume compares them ("distill/TASK")."""
        return {f"distill/{task}": teacher.fingerprint() for task, teacher in self.teacher.items()}

    def setting(self, task: str) -> tuple[float, float]:
        """The task's (weight, temperature)."""
        return self.per_task.get(task, (self.weight, self.temperature))

    def mix(self, task: str, gold_loss: Tensor, objective: Objective, outputs: Tensor, ids: list[str]) -> Tensor:
        """The task's training loss on a batch of the model's `outputs` (losses.py): gold and teacher mixed (the
        gold loss alone for a task the teacher has no scores of)."""
        if task not in self.teacher:
            return gold_loss
        weight, temperature = self.setting(task)
        if task == "sts":  # unclamped and on the gold loss's scale, whichever STS objective the run trains
            student = objective.unclamped_score(outputs)
            soft = distillation_loss(task, student, self.teacher[task].of(ids, student),
                                     sts_scale=objective.score_scale)
        else:
            student = objective.score(outputs)
            soft = distillation_loss(task, student, self.teacher[task].of(ids, student), temperature)
        return (1 - weight) * gold_loss + weight * soft
