"""Classification tasks: labels are classes 0 .. C - 1, predicted from saved scores by the task's own rule, written
as integers in the leaderboard CSV, scored by accuracy and F1, and combined in ensembles by a vote or the mean
of the members' class probabilities. SentenceClassification is the kind of one sentence and C logits (SST, CFIMDB);
QQP's paraphrase (minbert/tasks/qqp.py) classifies a pair from one logit.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from minbert.tasks.base import Task
from minbert.tasks.course_files import SentenceExample, read_rows
from minbert.tasks.losses import ClassificationObjective, argmax_class, softened_kl
from minbert.tasks.metrics import sst_metrics


@dataclass(frozen=True, kw_only=True, eq=False)
class Classification(Task):
    num_classes: int
    ensemble_methods: tuple[str, ...] = ("vote", "mean")
    label_names: tuple[str, ...] = ()  # each class's name in words, in class order (what predictions show a user)

    def class_name(self, value: int) -> str:
        """A class in words ('somewhat positive'), or its number where the task names none."""
        return self.label_names[value] if self.label_names else str(value)

    @property
    def history_columns(self) -> tuple[tuple[str, str], ...]:
        return (f"{self.name}_acc", f"{self.title} acc"), (f"{self.name}_f1_weighted", f"{self.title} F1 (w)")

    def class_range(self) -> str:
        """Its classes in words: '0 or 1', 'an integer 0-4'."""
        return "0 or 1" if self.num_classes == 2 else f"an integer 0-{self.num_classes - 1}"

    def label_problem(self, value: float) -> str | None:
        """What a label of its data files must be, when `value` is not one of its classes."""
        return None if value in range(self.num_classes) else self.class_range()

    def format_prediction(self, value) -> str:
        number = float(value)
        if not number.is_integer():
            raise ValueError(f"{self.name} prediction {value!r} is not an integer class")
        if int(number) not in range(self.num_classes):
            raise ValueError(f"{self.name} prediction {value!r} is not {self.class_range()}")
        return str(int(number))

    def parse_prediction(self, text: str) -> int:
        number = float(text)  # ValueError on junk
        if not (number.is_integer() and int(number) in range(self.num_classes)):
            raise ValueError(f"{text!r} is not {self.class_range()}")
        return int(number)

    def resampled_scores(self, predictions: np.ndarray, gold: np.ndarray) -> np.ndarray:
        return (predictions == gold).mean(axis=-1)  # accuracy, its score

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
        votes[np.arange(len(scores)), self.decide(torch.from_numpy(scores)).numpy()] = 1
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


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exponentials = np.exp(shifted)
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


@dataclass(frozen=True, kw_only=True, eq=False)
class SentenceClassification(Classification):
    """One sentence, C logits: dropout and a linear head on the pooled sentence (through the task's dense layer
    with --head_hidden); cross entropy; saved scores are the C logits; distilled by the softened KL of the
    softmaxes."""
    text_columns: tuple[str, ...] = ("sentence",)
    softens: bool = True

    @property
    def score_columns(self) -> tuple[str, ...]:
        return tuple(f"logit_{c}" for c in range(self.num_classes))

    def load(self, path: str | Path, split: str) -> list[SentenceExample]:
        """Labels are ints, None for split="test"."""
        return [SentenceExample(example_id, sentence, None if label is None else int(label))
                for example_id, (sentence,), label in read_rows(path, split, self.text_columns, self.label_column,
                                                                self.label_problem, self.name)]

    def build_head(self, in_features: int) -> nn.Module:
        return nn.Linear(in_features, self.num_classes)

    def outputs(self, model: nn.Module, hidden: Tensor, inputs) -> Tensor:
        return self.head(model)(model.head_input(self.name, hidden, inputs))  # (B, C)

    def objective(self, options: Mapping[str, object]) -> ClassificationObjective:
        return ClassificationObjective()

    def decide(self, scores: Tensor) -> Tensor:
        return argmax_class(scores)

    def metrics(self, predictions, gold) -> dict[str, float]:
        m = sst_metrics(predictions, gold)
        return {f"{self.name}_acc": m["acc"], f"{self.name}_f1_macro": m["f1_macro"],
                f"{self.name}_f1_weighted": m["f1_weighted"]}

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        return softmax(scores)

    def scores_of(self, probabilities: np.ndarray) -> np.ndarray:
        return np.log(probabilities)  # (N, C): logits whose softmax is these probabilities

    def distillation_loss(self, objective, outputs: Tensor, teacher, ids: list[str], temperature: float) -> Tensor:
        student = objective.score(outputs)
        return softened_kl(student, teacher.of(ids, student), temperature)
