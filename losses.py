"""One training objective per task: its loss, how raw model outputs decode into a prediction, and the
divergence SMART compares outputs with. Every function here is pure (tensors in, tensors out).

    sst  5 logits            cross entropy            argmax              symmetric KL (categorical)
    qqp  1 logit             binary cross entropy     logit > 0           symmetric KL (Bernoulli)
    sts  SBERT: a cosine     `similarity_objective`   a 0-5 score         squared error
         cross: 1 logit      MSE(sigmoid, label / 5)  5 * sigmoid         squared error

Similarity objectives for the SBERT cosine (measured in README: `cosine` is best on STS-B dev):
    cosine   MSE(cos, label / 5)              sentence-transformers' CosineSimilarityLoss
    shifted  MSE(cos, (label - 2.5) / 2.5)    the handout's 2.5 cos + 2.5 against the 0-5 label
    cosent   CoSENT ranking loss (Su 2022)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

SIMILARITY_OBJECTIVES = ("cosine", "shifted", "cosent")


def cosent_loss(cosine: Tensor, labels: Tensor, scale: float = 20.0) -> Tensor:
    """CoSENT (Su 2022): log(1 + sum over pairs with label_i > label_j of exp(scale * (cos_j - cos_i)))."""
    differences = scale * (cosine[None, :] - cosine[:, None])  # (B, B): entry (i, j) = s*(cos_j - cos_i)
    ordered = labels[:, None] > labels[None, :]  # (B, B): pairs where i should score higher than j
    differences = differences.masked_fill(~ordered, float("-inf")).flatten()
    return torch.logsumexp(torch.cat([differences.new_zeros(1), differences]), dim=0)


@dataclass(frozen=True)
class SentimentObjective:
    """SST-5: cross entropy on 5 logits (B, 5); predicts the argmax class."""
    divergence: str = "categorical"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float(), labels)

    def decode(self, logits: Tensor) -> Tensor:
        return logits.argmax(dim=-1)  # (B,)


@dataclass(frozen=True)
class ParaphraseObjective:
    """QQP: binary cross entropy on one logit (B,); predicts 1 where the logit is positive."""
    divergence: str = "bernoulli"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())

    def decode(self, logits: Tensor) -> Tensor:
        return (logits > 0).long()  # (B,)


@dataclass(frozen=True)
class CosineSimilarityObjective:
    """STS with SBERT: the output is cos(u, v) (B,), trained by `name` (one of SIMILARITY_OBJECTIVES)."""
    name: str = "cosine"
    divergence: str = "squared"

    def __post_init__(self):
        if self.name not in SIMILARITY_OBJECTIVES:
            raise ValueError(f"similarity objective must be one of {SIMILARITY_OBJECTIVES}, got {self.name!r}")

    def loss(self, cosine: Tensor, labels: Tensor) -> Tensor:
        cosine, labels = cosine.float(), labels.float()
        if self.name == "cosine":
            return F.mse_loss(cosine, labels / 5)
        if self.name == "shifted":
            return F.mse_loss(cosine, (labels - 2.5) / 2.5)
        return cosent_loss(cosine, labels)

    def decode(self, cosine: Tensor) -> Tensor:
        """The 0-5 similarity that predictions report."""
        cosine = cosine.float()
        if self.name == "cosine":  # trained towards label / 5, so only [0, 1] is meaningful
            return (5 * cosine).clamp(0, 5)
        # shifted is trained on 2.5 cos + 2.5; cosent ranks cosines anywhere in [-1, 1], and a clamp
        # would tie every negative cosine at 0, so both use the same monotone map onto [0, 5].
        return 2.5 * cosine + 2.5


@dataclass(frozen=True)
class CrossSimilarityObjective:
    """STS with a cross-encoder: one logit z (B,), trained as MSE(sigmoid(z), label / 5); reports 5 sigmoid(z)."""
    divergence: str = "squared"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.mse_loss(torch.sigmoid(logits.float()), labels.float() / 5)

    def decode(self, logits: Tensor) -> Tensor:
        return 5 * torch.sigmoid(logits.float())


Objective = SentimentObjective | ParaphraseObjective | CosineSimilarityObjective | CrossSimilarityObjective


def task_objectives(pair_encoder: str, similarity_objective: str) -> dict[str, Objective]:
    """The objective of each task for a model with this pair encoder ('sbert' or 'cross')."""
    if pair_encoder == "cross":
        if similarity_objective != "cosine":
            raise ValueError(f"similarity objective {similarity_objective!r} applies to the SBERT cosine; "
                             "the cross-encoder is trained as MSE(sigmoid(logit), label / 5)")
        similarity = CrossSimilarityObjective()
    else:
        similarity = CosineSimilarityObjective(similarity_objective)
    return {"sst": SentimentObjective(), "qqp": ParaphraseObjective(), "sts": similarity}
