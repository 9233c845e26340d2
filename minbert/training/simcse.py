"""Contrastive sentence-embedding losses (SimCSE, Gao et al. 2021) and the batches of NLI triplets they train on.

Every loss takes sentence embeddings (B, H), compares them by cosine similarity and divides by a
temperature tau; equivalently multiplies by scale = 1 / tau (tau = 0.05 is scale = 20). Maths runs in
at least float32, autocast or not (the similarity matmul included, which autocast would run in bf16 / fp16:
an error of 2^-8 in a cosine is 0.08 in a logit at scale 20), so the embeddings keep their precision.

The triplets themselves are read by minbert/data/nli.py; simcse.py gives the course's names.
"""

import random
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minbert.data.nli import NLITriplet
from minbert.distributed import cut_global_batches, shard_batch
from minbert.runtime import float32_exact


def _unit(x: Tensor) -> Tensor:
    return F.normalize(x.to(torch.promote_types(x.dtype, torch.float32)), dim=-1)


def supervised_simcse_loss(
    anchor: Tensor, positive: Tensor, hard_negative: Tensor | None = None, temperature: float = 0.05
) -> Tensor:
    """Supervised SimCSE (Gao et al. 2021, eq. 5), averaged over the batch:

        l_i = -log  exp(cos(h_i, h_i+) / tau) / sum_j [ exp(cos(h_i, h_j+) / tau) + exp(cos(h_i, h_j-) / tau) ]

    Every other example's positive and hard negative is a negative for anchor i: the logits are the
    (B, 2B) matrix [cos(anchor, positive) | cos(anchor, hard_negative)] / tau, with targets arange(B).
    Without hard negatives this is the in-batch InfoNCE of unsupervised SimCSE (eq. 1).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    a = _unit(anchor)  # (B, H)
    candidates = positive if hard_negative is None else torch.cat([positive, hard_negative])
    with float32_exact():
        logits = a @ _unit(candidates).T / temperature  # (B, B) or (B, 2B)
    return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))


def pairwise_contrastive_loss(anchor: Tensor, positive: Tensor, negative: Tensor, temperature: float = 0.05) -> Tensor:
    """The SMART-SBERT thesis' triplet loss (its sections 3.2.4.3 and B.1.2), averaged over the batch:

        s_i+ = cos(a_i, p_i),   s_i- = cos(a_i, n_i)
        l_i  = -log  exp(s_i+ / tau) / (exp(s_i+ / tau) + exp(s_i- / tau))  =  softplus((s_i- - s_i+) / tau)

    Each anchor sees only its own positive and negative: no in-batch negatives. (The thesis' listing
    B.2 broadcasts the positive term across the wrong axis; this follows its stated formula.)
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    a = _unit(anchor)
    positive_similarity = (a * _unit(positive)).sum(dim=-1)  # (B,)
    negative_similarity = (a * _unit(negative)).sum(dim=-1)  # (B,)
    return F.softplus((negative_similarity - positive_similarity) / temperature).mean()


def triplet_batches(triplets: Sequence[NLITriplet], tokenizer, batch_size: int, seed: int, max_length: int,
                    world_size: int = 1, rank: int = 0, start: int = 0):
    """Batches of (anchor, positive, negative) texts in a seeded random order, each tokenized as one
    (3B, T) batch: anchors, then positives, then negatives. Under torchrun, this rank's slice of each
    global batch (distributed.shard_batch). `start`: the batches to leave out at the beginning (a resumed
    stage's, never tokenized)."""
    order = list(range(len(triplets)))
    random.Random(seed).shuffle(order)
    for indices in cut_global_batches(order, batch_size, world_size)[start:]:
        chosen = [triplets[i] for i in shard_batch(indices, world_size, rank)]
        texts = [t.anchor for t in chosen] + [t.positive for t in chosen] + [t.negative for t in chosen]
        yield tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")


# --simcse_objective: the SimCSE stage's loss of (anchor, positive, negative) embeddings, by name.
SIMCSE_OBJECTIVES = {"supervised": supervised_simcse_loss, "pairwise": pairwise_contrastive_loss}


class SimcseObjective:
    """A SimCSE stage's objective, called as a task's (objective.TaskObjective): the `loss` of a triplet batch's
    (anchor, positive, negative) embeddings, and its terms (none). Under torchrun every rank's triplets are in-batch
    negatives (gradients reach the local slice), so the loss is already the global batch's: `local_items` is None."""
    name = "simcse"

    def __init__(self, loss: Callable[[Tensor, Tensor, Tensor], Tensor], distributed):
        self.loss, self.distributed = loss, distributed

    def __call__(self, model, batch: dict) -> tuple[Tensor, dict[str, Tensor]]:
        embeddings = model.encode_sentences(batch["input_ids"], batch["attention_mask"])
        anchor, positive, negative = (self.distributed.gather_with_grad(e) for e in embeddings.chunk(3))
        return self.loss(anchor, positive, negative), {}

    def local_items(self, batch: dict) -> None:
        return None
