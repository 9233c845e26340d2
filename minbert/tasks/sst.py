"""SST-5: the sentiment of a movie review's sentence, five ordered classes (0 negative .. 4 positive), the first
task of the course's leaderboard and of the handout's part 1. With --sst_objective ordinal the loss also charges
probability put on far-off classes (losses.ordinal_cross_entropy), --ordinal_weight times; the model holds that weight
as its option sentiment_ordinal_weight (0: cross entropy alone)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from minbert.tasks.base import TaskOption
from minbert.tasks.classification import SentenceClassification, SentenceClassifierModel
from minbert.tasks.losses import SENTIMENT_OBJECTIVES, ClassificationObjective

OPTIONS = (
    TaskOption("sst_objective", "ce", "ce: cross entropy; ordinal: plus --ordinal_weight x the expected distance "
               "|y - j| of the predicted class (AllBERT)", argparse=dict(choices=SENTIMENT_OBJECTIVES)),
    TaskOption("ordinal_weight", 1.0, "lambda of --sst_objective ordinal", argparse=dict(type=float)),
)


class SentimentModel(SentenceClassifierModel):
    def objective(self, options: Mapping[str, object]) -> ClassificationObjective:
        return ClassificationObjective(options["sentiment_ordinal_weight"])


@dataclass(frozen=True, kw_only=True, eq=False)
class Sentiment(SentenceClassification):
    model_part = SentimentModel

    def check_settings(self, settings: Mapping[str, object], pair_encoders: Mapping[str, str]) -> None:
        settings = self.own_settings(settings)
        if settings["sst_objective"] not in SENTIMENT_OBJECTIVES:
            raise ValueError(f"--sst_objective must be one of {', '.join(SENTIMENT_OBJECTIVES)}, "
                             f"got {settings['sst_objective']!r}")
        weight = settings["ordinal_weight"]
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
            raise ValueError("--ordinal_weight must be finite and >= 0")

    def head_options(self, settings: Mapping[str, object]) -> dict[str, object]:
        settings = self.own_settings(settings)
        ordinal = settings["sst_objective"] == "ordinal"
        return {"sentiment_ordinal_weight": settings["ordinal_weight"] if ordinal else 0.0}


TASK = Sentiment(name="sst", order=0, default=True, trainable=True, part1=True, title="SST", file_prefix="ids-sst",
                 flag_prefix="sst", label_column="sentiment", leaderboard_column="Predicted_Sentiment", num_classes=5,
                 head_name="sentiment_head", plots_embeddings=True, options=OPTIONS, calibrated=True,
                 label_names=("negative", "somewhat negative", "neutral", "somewhat positive", "positive"))
