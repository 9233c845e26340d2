"""One training objective per task: its loss, the score a run saves for ensembles, the prediction decided
from that score, and the divergence SMART compares outputs with. Every function here is pure (tensors
in, tensors out); a prediction is always decide(score(outputs)).

         model output        loss                     score               prediction   SMART divergence
    sst  5 logits            cross entropy (or        the 5 logits        argmax       symmetric KL (categorical)
                             ordinal cross entropy)
    qqp  1 logit             binary cross entropy     the logit           logit > 0    symmetric KL (Bernoulli)
    sts  sbert / hybrid:     `similarity_objective`   a 0-5 similarity    the score    squared error
           a cosine
         cross: 1 logit      MSE(sigmoid, label / 5)  5 * sigmoid         the score    squared error
    qa   start and end       cross entropy of the     the logits          per question symmetric KL of the start
         logits per token    gold start and end                           (squad.py)   and end distributions

Similarity objectives for the SBERT cosine (measured in RESULTS.md: `cosine` is best on STS-B dev):
    cosine   MSE(cos, label / 5)              sentence-transformers' CosineSimilarityLoss
    shifted  MSE(cos, (label - 2.5) / 2.5)    the thesis' 2.5 cos + 2.5 against the 0-5 label (its dropout on the
                                              two embeddings before the cosine is MultitaskBERT's sts_cosine_dropout)
    cosent   CoSENT ranking loss (Su 2022)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

SIMILARITY_OBJECTIVES = ("cosine", "shifted", "cosent")
SENTIMENT_OBJECTIVES = ("ce", "ordinal")


def cosent_loss(cosine: Tensor, labels: Tensor, scale: float = 20.0) -> Tensor:
    """CoSENT (Su 2022): log(1 + sum over pairs with label_i > label_j of exp(scale * (cos_j - cos_i)))."""
    differences = scale * (cosine[None, :] - cosine[:, None])  # (B, B): entry (i, j) = s*(cos_j - cos_i)
    ordered = labels[:, None] > labels[None, :]  # (B, B): pairs where i should score higher than j
    differences = differences.masked_fill(~ordered, float("-inf")).flatten()
    return torch.logsumexp(torch.cat([differences.new_zeros(1), differences]), dim=0)


def decision(task: str, scores: Tensor) -> Tensor:
    """The prediction a task's scores decide: SST's argmax class (the lowest one on a tie), QQP's logit > 0, STS's
    0-5 score as it is. The one rule behind a run's own CSVs (the objectives' decide) and an ensemble's members
    (ensemble_scores.py, on their saved scores), so that a member predicts exactly what its CSVs hold."""
    if task == "sst":
        return scores.argmax(dim=-1)  # (B,)
    if task == "qqp":
        return (scores > 0).long()  # (B,)
    if task == "sts":
        return scores
    raise ValueError(f"{task!r} has no per-example decision (SQuAD's answers are decoded per question: squad.py)")


def ordinal_cross_entropy(logits: Tensor, labels: Tensor, weight: float) -> Tensor:
    """Cross entropy plus weight * sum_j p_j |y - j|, the probability mass placed j classes away from the
    label, weighted by that distance (AllBERT's ordinal cross entropy, seed 004 eq. 2); batch mean."""
    logits = logits.float()
    classes = torch.arange(logits.shape[-1], device=logits.device)  # (C,)
    distance = (labels[:, None] - classes[None, :]).abs().float()  # (B, C)
    expected_distance = (logits.softmax(dim=-1) * distance).sum(dim=-1)  # (B,)
    return F.cross_entropy(logits, labels) + weight * expected_distance.mean()


@dataclass(frozen=True)
class SentimentObjective:
    """SST-5 on 5 logits (B, 5): cross entropy, or with ordinal_weight > 0 the ordinal cross entropy that
    also charges probability put on far-off classes; predicts the argmax class."""
    ordinal_weight: float = 0.0
    divergence: str = "categorical"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.ordinal_weight:
            return ordinal_cross_entropy(logits, labels, self.ordinal_weight)
        return F.cross_entropy(logits.float(), labels)

    def score(self, logits: Tensor) -> Tensor:
        return logits.float()  # (B, 5)

    def decide(self, scores: Tensor) -> Tensor:
        return decision("sst", scores)


@dataclass(frozen=True)
class ParaphraseObjective:
    """QQP: binary cross entropy on one logit (B,); predicts 1 where the logit is positive."""
    divergence: str = "bernoulli"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())

    def score(self, logits: Tensor) -> Tensor:
        return logits.float()  # (B,)

    def decide(self, scores: Tensor) -> Tensor:
        return decision("qqp", scores)


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

    def score(self, cosine: Tensor) -> Tensor:
        """The 0-5 similarity that predictions report."""
        if self.name == "cosine":  # trained towards label / 5, so only [0, 1] is meaningful
            return self.unclamped_score(cosine).clamp(0, 5)
        return self.unclamped_score(cosine)

    def unclamped_score(self, cosine: Tensor) -> Tensor:
        """The score before the prediction's clamp: what distillation compares with a teacher's 0-5 score, so
        that a student whose cosine is below 0 is still pulled towards the teacher (a clamp passes no gradient)."""
        cosine = cosine.float()
        if self.name == "cosine":
            return 5 * cosine
        # shifted is trained on 2.5 cos + 2.5; cosent ranks cosines anywhere in [-1, 1], and a clamp
        # would tie every negative cosine at 0, so both use the same monotone map onto [0, 5].
        return 2.5 * cosine + 2.5

    @property
    def score_scale(self) -> float:
        """Score units per unit of the cosine's regression target: cosine fits cos to label / 5 (5); shifted fits
        it to (label - 2.5) / 2.5 (2.5), and cosent, which ranks, is distilled on shifted's scale."""
        return 5.0 if self.name == "cosine" else 2.5

    def decide(self, scores: Tensor) -> Tensor:
        return decision("sts", scores)


@dataclass(frozen=True)
class CrossSimilarityObjective:
    """STS with a cross-encoder: one logit z (B,), trained as MSE(sigmoid(z), label / 5); reports 5 sigmoid(z)."""
    divergence: str = "squared"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.mse_loss(torch.sigmoid(logits.float()), labels.float() / 5)

    def score(self, logits: Tensor) -> Tensor:
        return 5 * torch.sigmoid(logits.float())

    def unclamped_score(self, logits: Tensor) -> Tensor:
        return self.score(logits)  # already within [0, 5], with a gradient everywhere

    score_scale = 5.0  # score units per unit of sigmoid(z), which the gold loss fits to label / 5

    def decide(self, scores: Tensor) -> Tensor:
        return decision("sts", scores)


@dataclass(frozen=True)
class SpanObjective:
    """SQuAD: start and end logits over a window's tokens (B, T, 2); the mean of the cross entropies of the gold
    start and end positions (both 0, [CLS], when the window does not hold the answer; Devlin et al. 2019).
    Its predictions are decoded per question over all of its windows (squad.decode_answers), not per window."""
    divergence: str = "span"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        logits = logits.float()
        return (F.cross_entropy(logits[..., 0], labels[:, 0]) + F.cross_entropy(logits[..., 1], labels[:, 1])) / 2

    def score(self, logits: Tensor) -> Tensor:
        return logits.float()  # (B, T, 2)


Objective = (SentimentObjective | ParaphraseObjective | CosineSimilarityObjective | CrossSimilarityObjective
             | SpanObjective)


def task_objectives(pair_encoders: dict[str, str], similarity_objective: str = "cosine",
                    ordinal_weight: float = 0.0) -> dict[str, Objective]:
    """The objective of each task; pair_encoders gives 'sbert', 'cross' or 'hybrid' for qqp and sts.
    STS is a cosine (trained by `similarity_objective`) unless it is cross-encoded into one logit."""
    if pair_encoders["sts"] == "cross":
        if similarity_objective != "cosine":
            raise ValueError(f"similarity objective {similarity_objective!r} applies to a cosine (sbert, hybrid); "
                             "the STS cross-encoder is trained as MSE(sigmoid(logit), label / 5)")
        similarity = CrossSimilarityObjective()
    else:
        similarity = CosineSimilarityObjective(similarity_objective)
    return {"sst": SentimentObjective(ordinal_weight), "qqp": ParaphraseObjective(), "sts": similarity,
            "qa": SpanObjective()}
