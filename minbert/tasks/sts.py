"""STS-B: how similar two sentences are in meaning, a score from 0 to 5, scored by its Pearson correlation with the
gold scores (mapped onto [0, 1] as (r + 1) / 2 in the course's overall score).

    sbert / hybrid   cos(u, v) of the two sentence embeddings (through the task's dense layer, a projection of each
                     side, with --head_hidden; through the heads' dropout with --sts_cosine_dropout), trained by
                     --similarity_objective and reported as a 0-5 score
    cross            a linear head on the pooled joint encoding: one logit, reported as 5 sigmoid
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from minbert.tasks.base import Task, TaskOption, TaskOutputs, check_weights
from minbert.tasks.losses import (SIMILARITY_OBJECTIVES, CosineSimilarityObjective, CrossSimilarityObjective,
                                  scaled_squared_error)
from minbert.tasks.metrics import sts_metrics
from minbert.tasks.pairs import PAIR_COLUMNS, PairData, PairModel, is_cross_encoded

SCORE_RANGE = (0.0, 5.0)
# A saved score may be the range's bound give or take float32's rounding of a cosine.
SCORE_ROUNDING = 1e-4
# The model's options as well (a checkpoint's "heads" keys), under the same names.
OPTIONS = (
    TaskOption("similarity_objective", "cosine", "cosine: MSE(cos, label/5) (measured best); shifted: the thesis' "
               "2.5cos+2.5; cosent (sbert and hybrid STS)", argparse=dict(choices=SIMILARITY_OBJECTIVES)),
    TaskOption("sts_cosine_dropout", False, "--hidden_dropout_prob's dropout on both sentence embeddings before the "
               "STS cosine, as the thesis' listing A.6 does with its 2.5cos+2.5 (--similarity_objective shifted)",
               argparse=dict(action=argparse.BooleanOptionalAction)),
)


class SimilarityData(PairData):
    def label_problem(self, value: float) -> str | None:
        low, high = SCORE_RANGE
        return None if low <= value <= high else f"a number in [{low:g}, {high:g}]"  # NaN fails both comparisons


class SimilarityModel(PairModel):
    @property
    def history_columns(self) -> tuple[tuple[str, str], ...]:
        name, title = self.task.name, self.task.title
        return (f"{name}_pearson", f"{title} r"), (f"{name}_spearman", f"{title} rho")

    def has_head(self, pair_encoders: Mapping[str, str]) -> bool:
        """Only a cross-encoded STS has a linear head: the others' output is the cosine of u and v."""
        return is_cross_encoded(self.task.name, pair_encoders)

    def outputs_of_embeddings(self, model: nn.Module, u: Tensor, v: Tensor) -> Tensor:
        name = self.task.name
        u, v = model.readout.features(name, u), model.readout.features(name, v)  # a dense layer projects each side
        if model.task_options["sts_cosine_dropout"]:
            u, v = model.dropout(u), model.dropout(v)
        return F.cosine_similarity(u.float(), v.float(), dim=-1)  # (B,)

    def check_options(self, options: Mapping[str, object]) -> None:
        if options["similarity_objective"] not in SIMILARITY_OBJECTIVES:
            raise ValueError(f"similarity_objective must be one of {SIMILARITY_OBJECTIVES}, "
                             f"got {options['similarity_objective']!r}")
        if options["sts_cosine_dropout"] and is_cross_encoded(self.task.name, options["pair_encoder"]):
            raise ValueError("sts_cosine_dropout applies to the STS cosine (sbert, hybrid); a cross-encoded STS has "
                             "none")

    def objective(self, options: Mapping[str, object]) -> CosineSimilarityObjective | CrossSimilarityObjective:
        """A cosine trained by the similarity objective, unless cross-encoded into one logit."""
        similarity_objective = options["similarity_objective"]
        if not is_cross_encoded(self.task.name, options["pair_encoder"]):
            return CosineSimilarityObjective(similarity_objective)
        if similarity_objective != "cosine":
            raise ValueError(f"similarity objective {similarity_objective!r} applies to a cosine (sbert, hybrid); "
                             "the STS cross-encoder is trained as MSE(sigmoid(logit), label / 5)")
        return CrossSimilarityObjective()

    def distillation_loss(self, objective, outputs: Tensor, teacher, ids: list[str], temperature: float) -> Tensor:
        """The squared error of the unclamped score (a student whose cosine is below 0 is still pulled towards the
        teacher) on the gold loss's scale, whichever similarity objective the run trains."""
        student = objective.unclamped_score(outputs)
        return scaled_squared_error(student, teacher.of(ids, student), objective.score_scale)

    def decide(self, scores: Tensor) -> Tensor:
        return scores  # the 0-5 similarity is its own prediction

    def metrics(self, predictions, gold) -> dict[str, float]:
        m, name = sts_metrics(predictions, gold), self.task.name
        return {f"{name}_pearson": m["pearson"], f"{name}_spearman": m["spearman"]}

    def resampled_scores(self, predictions: np.ndarray, gold: np.ndarray) -> np.ndarray:
        """Pearson's r of each row (0 where a row is constant, as sts_metrics reports it)."""
        x = predictions - predictions.mean(axis=-1, keepdims=True)
        y = gold - gold.mean(axis=-1, keepdims=True)
        spread = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
        return np.divide((x * y).sum(axis=-1), spread, out=np.zeros(spread.shape), where=spread > 0)

    def kept_score(self, metrics: Mapping[str, float]) -> float:
        return (metrics[self.score_key] + 1) / 2  # Pearson's r mapped onto [0, 1], as the overall score does


class SimilarityOutputs(TaskOutputs):
    score_columns = ("score",)  # the 0-5 similarity the leaderboard CSV reports

    def format_prediction(self, value) -> str:
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"similarity prediction {value!r} is not finite")
        return f"{number:.6g}"

    def rounding_effect(self, predictions: np.ndarray) -> float:
        """The rounding to 6 significant digits moves each score by at most half its last digit, delta; Pearson's r
        is the cosine of the centred scores with the centred gold, and a change delta turns the centred scores by an
        angle of at most |delta| / |centred scores| (radians), which bounds the change of r (a cosine's slope is at
        most 1). Kept tight: with scores spread over 0-5, a few 1e-6."""
        values = np.asarray(predictions, dtype=np.float64)
        magnitude = np.floor(np.log10(np.maximum(np.abs(values), 1e-300)))
        delta = np.linalg.norm(0.5 * 10.0 ** (magnitude - 5))
        spread = np.linalg.norm(values - values.mean())
        return float("inf") if spread <= delta else 1.01 * delta / (spread - delta)

    def parse_prediction(self, text: str) -> float:
        number = float(text)  # ValueError on junk
        if not math.isfinite(number):
            raise ValueError(f"{text!r} is not finite")
        return number

    def score_problem(self, numbers: list[float]) -> str | None:
        low, high = SCORE_RANGE
        if not low - SCORE_ROUNDING <= numbers[0] <= high + SCORE_ROUNDING:
            return f"STS score {numbers[0]:g} is outside {low:g}-{high:g}"
        return None

    def ensemble_terms(self, scores: np.ndarray, weight: float, method: str) -> np.ndarray:
        """The member's scores, times its weight (in float64, as np.average has it) for `weighted`."""
        return scores * np.float64(weight) if self.weighs_members(method) else scores

    def ensemble_predictions(self, total: np.ndarray, weights: list[float], method: str) -> np.ndarray:
        """The mean score, or the weighted mean (summed afresh, pairwise as np.average sums the weights)."""
        if not self.weighs_members(method):
            return total / len(weights)
        check_weights(self.task.title, weights, len(weights))
        return total / np.sum(weights)

    def weighs_members(self, method: str) -> bool:
        return method == "weighted"

    def member_weights(self, method: str, chosen: list[int], metrics: list[float]) -> list[float] | None:
        """weighted: each chosen member's dev Pearson r (0 if negative)."""
        return [max(metrics[i], 0.0) for i in chosen] if self.weighs_members(method) else None

    def ensemble_problem(self, method: str, metrics: list[float]) -> str | None:
        name = self.task.name
        if self.weighs_members(method) and not any(r > 0 for r in metrics):
            return (f"--{name} weighted: every member's dev Pearson r is <= 0 "
                    f"({', '.join(f'{r:.4f}' for r in metrics)}), so none has a weight; use --{name} mean")
        return None

    def teacher_scores(self, members: list[np.ndarray], shares: np.ndarray) -> np.ndarray:
        return sum(w * scores for w, scores in zip(shares, members))


@dataclass(frozen=True, kw_only=True, eq=False)
class Similarity(Task):
    data_part = SimilarityData
    model_part = SimilarityModel
    outputs_part = SimilarityOutputs
    text_columns: tuple[str, ...] = PAIR_COLUMNS
    ensemble_methods: tuple[str, ...] = ("mean", "weighted")
    headless_output: str = "cosine"

    def check_settings(self, settings: Mapping[str, object], pair_encoders: Mapping[str, str]) -> None:
        settings = self.own_settings(settings)
        if is_cross_encoded(self.name, pair_encoders) and settings["similarity_objective"] != "cosine":
            raise ValueError("--similarity_objective applies to a cosine; a cross-encoded STS is trained as "
                             "MSE(sigmoid, label/5)")
        if is_cross_encoded(self.name, pair_encoders) and settings["sts_cosine_dropout"]:
            raise ValueError("--sts_cosine_dropout applies to the STS cosine (sbert, hybrid); a cross-encoded STS has "
                             "none")

    def head_options(self, settings: Mapping[str, object]) -> dict[str, object]:
        return self.own_settings(settings)


TASK = Similarity(name="sts", order=2, default=True, trainable=True, title="STS", file_prefix="sts", flag_prefix="sts",
                  label_column="similarity", leaderboard_column="Predicted_Similarity", head_name="similarity_head",
                  simcse_score="dev Pearson", options=OPTIONS)
