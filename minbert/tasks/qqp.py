"""Quora Question Pairs: whether two questions are paraphrases (1) or not (0), predicted from one logit. The course
calls it para (its flags, its submission files) and quora (its data files), which name it on the command line too.

    sbert / hybrid   a linear head on [u, v, |u - v|] of the two sentence embeddings
    cross            a linear head on the pooled joint encoding
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from minbert.tasks.classification import ClassifierModel, ClassLabels, ClassOutputs, Classification
from minbert.tasks.losses import BinaryObjective, bernoulli_kl, positive_logit
from minbert.tasks.metrics import paraphrase_metrics
from minbert.tasks.pairs import PAIR_COLUMNS, PairData, PairModel, is_cross_encoded


class ParaphraseData(ClassLabels, PairData):
    """Two questions and whether they are paraphrases: a class, 0 or 1."""


class ParaphraseModel(PairModel, ClassifierModel):
    def feature_size(self, pair_encoders: Mapping[str, str], hidden: int) -> int:
        cross = is_cross_encoded(self.task.name, pair_encoders)
        return hidden if cross else 3 * hidden  # [u, v, |u - v|] unless cross

    def outputs_of_embeddings(self, model: nn.Module, u: Tensor, v: Tensor) -> Tensor:
        features = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3H)
        features = model.readout.features(self.task.name, features)  # (B, 3H) or (B, head_hidden)
        return self.head(model)(model.dropout(features)).squeeze(-1)  # (B,)

    def objective(self, options: Mapping[str, object]) -> BinaryObjective:
        return BinaryObjective()

    def distillation_loss(self, objective, outputs: Tensor, teacher, ids: list[str], temperature: float) -> Tensor:
        student = objective.score(outputs)
        return bernoulli_kl(student, teacher.of(ids, student))

    def decide(self, scores: Tensor) -> Tensor:
        return positive_logit(scores)

    def decide_at(self, scores: Tensor, threshold: float) -> Tensor:
        return (scores > threshold).long()  # at 0: decide's

    def metrics(self, predictions, gold) -> dict[str, float]:
        m, name = paraphrase_metrics(predictions, gold), self.task.name
        return {f"{name}_acc": m["acc"], f"{name}_f1": m["f1"], f"{name}_f1_weighted": m["f1_weighted"]}


class ParaphraseOutputs(ClassOutputs):
    score_columns = ("logit",)  # the duplicate logit: its sign is the prediction

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        duplicate = 1 / (1 + np.exp(-scores))
        return np.stack([1 - duplicate, duplicate], axis=-1)  # (N, 2)

    def scores_of(self, probabilities: np.ndarray) -> np.ndarray:
        return np.log(probabilities[:, 1]) - np.log(probabilities[:, 0])  # (N,): the duplicate's log-odds


@dataclass(frozen=True, kw_only=True, eq=False)
class Paraphrase(Classification):
    data_part = ParaphraseData
    model_part = ParaphraseModel
    outputs_part = ParaphraseOutputs
    text_columns: tuple[str, ...] = PAIR_COLUMNS
    num_classes: int = 2
    has_threshold: bool = True  # the logit's, 0 unless chosen on dev


TASK = Paraphrase(name="qqp", order=1, default=True, trainable=True, aliases=("quora", "para"), title="QQP",
                  file_prefix="quora", flag_prefix="para", label_column="is_duplicate",
                  leaderboard_column="Predicted_Is_Paraphrase", head_name="paraphrase_head", calibrated=True,
                  label_names=("not paraphrase", "paraphrase"))
