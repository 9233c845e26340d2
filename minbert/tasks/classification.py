"""Classification tasks: labels are classes 0 .. C - 1, predicted from saved scores by the task's own rule, written
as integers in the leaderboard CSV, scored by accuracy and F1, and combined in ensembles by a vote or the mean
of the members' class probabilities. SentenceClassification is the kind of one sentence and C logits (SST, CFIMDB);
QQP's paraphrase (minbert/tasks/qqp.py) classifies a pair from one logit.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from minbert.tasks.base import Task, TaskData, TaskModel, TaskOutputs
from minbert.tasks.course_files import SentenceExample, read_rows
from minbert.tasks.losses import ClassificationObjective, argmax_class, softened_kl
from minbert.tasks.metrics import sst_metrics


def class_range(num_classes: int) -> str:
    """The classes 0 .. num_classes - 1 in words: '0 or 1', 'an integer 0-4'."""
    return "0 or 1" if num_classes == 2 else f"an integer 0-{num_classes - 1}"


class ClassLabels:
    """What the data part of a classification task requires of a label: one of its classes."""

    def label_problem(self, value: float) -> str | None:
        """What a label of its data files must be, when `value` is not one of its classes."""
        return None if value in range(self.task.num_classes) else class_range(self.task.num_classes)


class SentenceClassData(ClassLabels, TaskData):
    def load(self, path: str | Path, split: str) -> list[SentenceExample]:
        """Labels are ints, None for split="test"."""
        task = self.task
        return [SentenceExample(example_id, sentence, None if label is None else int(label))
                for example_id, (sentence,), label in read_rows(path, split, task.text_columns, task.label_column,
                                                                self.label_problem, task.name)]


class ClassifierModel(TaskModel):
    """The metrics of classes: accuracy (its score) and F1."""

    @property
    def history_columns(self) -> tuple[tuple[str, str], ...]:
        name, title = self.task.name, self.task.title
        return (f"{name}_acc", f"{title} acc"), (f"{name}_f1_weighted", f"{title} F1 (w)")

    def resampled_scores(self, predictions: np.ndarray, gold: np.ndarray) -> np.ndarray:
        return (predictions == gold).mean(axis=-1)  # accuracy, its score


class SentenceClassifierModel(ClassifierModel):
    """Dropout and a linear head on the pooled sentence (through the task's dense layer with --head_hidden), C
    logits; cross entropy; distilled by the softened KL of the softmaxes."""

    def build_head(self, in_features: int) -> nn.Module:
        return nn.Linear(in_features, self.task.num_classes)

    def outputs(self, model: nn.Module, hidden: Tensor, inputs) -> Tensor:
        return self.head(model)(model.readout.head_input(self.task.name, hidden, inputs.attention_mask))  # (B, C)

    def objective(self, options) -> ClassificationObjective:
        return ClassificationObjective()

    def distillation_loss(self, objective, outputs: Tensor, teacher, ids: list[str], temperature: float) -> Tensor:
        student = objective.score(outputs)
        return softened_kl(student, teacher.of(ids, student), temperature)

    def decide(self, scores: Tensor) -> Tensor:
        return argmax_class(scores)

    def metrics(self, predictions, gold) -> dict[str, float]:
        m, name = sst_metrics(predictions, gold), self.task.name
        return {f"{name}_acc": m["acc"], f"{name}_f1_macro": m["f1_macro"], f"{name}_f1_weighted": m["f1_weighted"]}


class ClassOutputs(TaskOutputs):
    """Integer classes in the leaderboard CSV; class probabilities of the saved scores, which ensembles vote with or
    average."""

    def class_name(self, value: int) -> str:
        """A class in words ('somewhat positive'), or its number where the task names none."""
        return self.task.label_names[value] if self.task.label_names else str(value)

    def format_prediction(self, value) -> str:
        number, task = float(value), self.task
        if not number.is_integer():
            raise ValueError(f"{task.name} prediction {value!r} is not an integer class")
        if int(number) not in range(task.num_classes):
            raise ValueError(f"{task.name} prediction {value!r} is not {class_range(task.num_classes)}")
        return str(int(number))

    def parse_prediction(self, text: str) -> int:
        number = float(text)  # ValueError on junk
        if not (number.is_integer() and int(number) in range(self.task.num_classes)):
            raise ValueError(f"{text!r} is not {class_range(self.task.num_classes)}")
        return int(number)

    @abstractmethod
    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        """(N, C) class probabilities of one member's saved scores."""

    @abstractmethod
    def scores_of(self, probabilities: np.ndarray) -> np.ndarray:
        """The saved scores whose class probabilities are these (N, C): an ensemble teacher's scores."""

    def ensemble_terms(self, scores: np.ndarray, weight: float, method: str) -> np.ndarray:
        """The member's class probabilities (N, C), followed for a vote by one vote for its own class (N, 2C)."""
        probabilities = self.probabilities(scores)
        if method == "mean":
            return probabilities
        votes = np.zeros_like(probabilities)
        votes[np.arange(len(scores)), self.task.model.decide(torch.from_numpy(scores)).numpy()] = 1
        return np.concatenate([probabilities, votes], axis=-1)

    def ensemble_predictions(self, total: np.ndarray, weights: list[float], method: str) -> np.ndarray:
        """mean: the class of the highest mean probability; vote: the class with the most votes, and among tied
        classes the one with the higher mean probability."""
        if method == "mean":
            return (total / len(weights)).argmax(axis=-1)
        classes = total.shape[-1] // 2
        probabilities, votes = total[:, :classes] / len(weights), total[:, classes:]
        leading = votes == votes.max(axis=-1, keepdims=True)
        return np.where(leading, probabilities, -np.inf).argmax(axis=-1)

    def teacher_scores(self, members: list[np.ndarray], shares: np.ndarray) -> np.ndarray:
        """The scores of the members' mean class probabilities: a teacher gives those whichever way the ensemble
        decides (a vote has no probability)."""
        mean = sum(w * self.probabilities(scores) for w, scores in zip(shares, members))
        return self.scores_of(np.clip(mean, 1e-12, 1.0))  # a logit of a probability of 0 or 1 would be infinite


class LogitsOutputs(ClassOutputs):
    """Saved scores are the C logits."""

    @property
    def score_columns(self) -> tuple[str, ...]:
        return tuple(f"logit_{c}" for c in range(self.task.num_classes))

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        return softmax(scores)

    def scores_of(self, probabilities: np.ndarray) -> np.ndarray:
        return np.log(probabilities)  # (N, C): logits whose softmax is these probabilities


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exponentials = np.exp(shifted)
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


@dataclass(frozen=True, kw_only=True, eq=False)
class Classification(Task):
    num_classes: int
    ensemble_methods: tuple[str, ...] = ("vote", "mean")
    label_names: tuple[str, ...] = ()  # each class's name in words, in class order (what predictions show a user)


@dataclass(frozen=True, kw_only=True, eq=False)
class SentenceClassification(Classification):
    """One sentence, C logits (SentenceClassData, SentenceClassifierModel, LogitsOutputs)."""
    data_part = SentenceClassData
    model_part = SentenceClassifierModel
    outputs_part = LogitsOutputs
    text_columns: tuple[str, ...] = ("sentence",)
    softens: bool = True
