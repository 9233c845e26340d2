"""The objectives the tasks are built from (each task picks its own), and the losses distillation compares
a student with its teacher by. Every function here is pure (tensors in, tensors out); a prediction is always
decide(score(outputs)).

                          model output         loss                     score              prediction   SMART divergence
    ClassificationObjective  C logits (B, C)   cross entropy (or        the C logits       argmax       symmetric KL
                                                ordinal cross entropy)                                  (categorical)
    BinaryObjective          1 logit (B,)      binary cross entropy     the logit          logit > 0    symmetric KL
                                                                                                        (Bernoulli)
    CosineSimilarityObjective  cos(u, v) (B,)  `similarity_objective`   a 0-5 similarity   the score    squared error
    CrossSimilarityObjective   1 logit (B,)    MSE(sigmoid, label / 5)  5 * sigmoid        the score    squared error
    SpanObjective            start and end     cross entropy of the     the logits         per question symmetric KL of
                             logits per token  gold start and end                          (squad.py)   the start and end
                                                                                                        distributions

Similarity objectives for the SBERT cosine (measured in RESULTS.md: `cosine` is best on STS-B dev):
    cosine   MSE(cos, label / 5)              sentence-transformers' CosineSimilarityLoss
    shifted  MSE(cos, (label - 2.5) / 2.5)    the thesis' 2.5 cos + 2.5 against the 0-5 label (its dropout on the
                                              two embeddings before the cosine is STS's option sts_cosine_dropout)
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


def argmax_class(scores: Tensor) -> Tensor:
    """The class of the highest score, the lowest one on a tie: the prediction of class logits (B, C)."""
    return scores.argmax(dim=-1)  # (B,)


def positive_logit(scores: Tensor) -> Tensor:
    """1 where one logit (B,) is positive, else 0 (a logit of 0 is a 0)."""
    return (scores > 0).long()  # (B,)


def ordinal_cross_entropy(logits: Tensor, labels: Tensor, weight: float) -> Tensor:
    """Cross entropy plus weight * sum_j p_j |y - j|, the probability mass placed j classes away from the
    label, weighted by that distance (AllBERT's ordinal cross entropy, seed 004 eq. 2); batch mean."""
    logits = logits.float()
    classes = torch.arange(logits.shape[-1], device=logits.device)  # (C,)
    distance = (labels[:, None] - classes[None, :]).abs().float()  # (B, C)
    expected_distance = (logits.softmax(dim=-1) * distance).sum(dim=-1)  # (B,)
    return F.cross_entropy(logits, labels) + weight * expected_distance.mean()


@dataclass(frozen=True)
class ClassificationObjective:
    """C classes on C logits (B, C): cross entropy, or with ordinal_weight > 0 the ordinal cross entropy that
    also charges probability put on far-off classes (SST-5's ordered sentiments); predicts the argmax class."""
    ordinal_weight: float = 0.0
    divergence: str = "categorical"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.ordinal_weight:
            return ordinal_cross_entropy(logits, labels, self.ordinal_weight)
        return F.cross_entropy(logits.float(), labels)

    def score(self, logits: Tensor) -> Tensor:
        return logits.float()  # (B, C)

    def decide(self, scores: Tensor) -> Tensor:
        return argmax_class(scores)


@dataclass(frozen=True)
class BinaryObjective:
    """Two classes on one logit (B,) (QQP's duplicate logit): binary cross entropy; predicts 1 where the logit is
    positive."""
    divergence: str = "bernoulli"

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())

    def score(self, logits: Tensor) -> Tensor:
        return logits.float()  # (B,)

    def decide(self, scores: Tensor) -> Tensor:
        return positive_logit(scores)


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
        return scores  # the 0-5 similarity is its own prediction


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
        return scores  # the 0-5 similarity is its own prediction


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


Objective = (ClassificationObjective | BinaryObjective | CosineSimilarityObjective | CrossSimilarityObjective
             | SpanObjective)


# -- distillation: how far a student's scores are from its teacher's, 0 where they agree -------------------------

def softened_kl(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(teacher || student) of the softmaxes of class logits (B, C) at temperature T, times T^2 so that the
    gradients keep their size as T changes (Hinton et al. 2015); batch mean."""
    log_student = F.log_softmax(student.float() / temperature, dim=-1)  # (B, C)
    log_teacher = F.log_softmax(teacher.float() / temperature, dim=-1)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean") * temperature ** 2


def bernoulli_kl(student: Tensor, teacher: Tensor) -> Tensor:
    """The KL of the Bernoulli distributions of two logits (B,): the binary cross entropy on the teacher's
    probability minus that probability's entropy."""
    student, teacher = student.float(), teacher.float()
    target = torch.sigmoid(teacher)  # (B,)
    return (F.binary_cross_entropy_with_logits(student, target)
            - F.binary_cross_entropy_with_logits(teacher, target))


def scaled_squared_error(student: Tensor, teacher: Tensor, scale: float) -> Tensor:
    """The squared error of two scores (B,) over scale^2: with `scale` the score units per unit of what the gold loss
    fits (an objective's score_scale), the gold loss's own scale."""
    return F.mse_loss(student.float(), teacher.float()) / scale ** 2


def softened_span_kl(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """softened_kl of the start and of the end distributions over a window's tokens (B, T, 2), averaged, as the
    span loss averages its two cross entropies; padding holds the padding logit on both sides, so it weighs
    nothing."""
    log_student = F.log_softmax(student.float() / temperature, dim=1)  # (B, T, 2): over the tokens
    log_teacher = F.log_softmax(teacher.float() / temperature, dim=1)
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="sum") / (2 * len(student))
    return kl * temperature ** 2
