"""SST-5: the sentiment of a movie review's sentence, five ordered classes (0 negative .. 4 positive), the first
task of the course's leaderboard and of the handout's part 1. With --sst_objective ordinal the loss also charges
probability put on far-off classes (losses.ordinal_cross_entropy)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from minbert.tasks.classification import SentenceClassification
from minbert.tasks.losses import ClassificationObjective


@dataclass(frozen=True, kw_only=True, eq=False)
class Sentiment(SentenceClassification):
    def objective(self, options: Mapping[str, object]) -> ClassificationObjective:
        return ClassificationObjective(options["sentiment_ordinal_weight"])


TASK = Sentiment(name="sst", order=0, default=True, trainable=True, part1=True, title="SST", file_prefix="ids-sst",
                 flag_prefix="sst", label_column="sentiment", leaderboard_column="Predicted_Sentiment", num_classes=5,
                 head_name="sentiment_head", plots_embeddings=True)
