"""An attack in embedding space, under SMART's own threat model: projected gradient ascent on the gold label's loss
(the task's training objective) over a perturbation of the input embeddings (MultitaskBERT.embed's output, where
SMART perturbs), within an eps-ball of SMART's norm (smart.SmartConfig: by default every entry within [-eps, eps]),
for each eps of a sweep.

    attack = EmbeddingAttack(epsilons=(1e-3, 1e-2, 1e-1), steps=10)
    result = attack_examples(model, "sst", examples, tokenizer, device, batch_size=32, max_length=128,
                             attack=attack)
    result.losses          # the mean loss, clean first then at each eps: never decreasing
    result.scores[eps]     # the model's scores under attack, in the examples' order

Each eps runs `steps` steps of smart.ascent_step (step size 2.5 eps / steps, Madry et al.'s rule), started from the
best perturbation of the eps before it (which lies inside the larger ball) and keeping the best iterate of the
batch's loss: so a larger eps never finds a smaller loss, and the sweep costs one ascent per eps. A pair task's two
sentences are both perturbed (an SBERT pair's embeddings hold both sides). Everything runs in exact float32 with
dropout off (runtime.float32_exact: autocast and TF32 would round small perturbations away); nothing is random.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from minbert.data.batches import TokenizedExamples, in_file_order, tokenized_dataloader
from minbert.model.multitask_bert import MultitaskBERT
from minbert.runtime import float32_exact, to_device
from smart import NORM_LEVELS, NORMS, SmartConfig, ascent_step


@dataclass(frozen=True)
class EmbeddingAttack:
    """The sweep: radii (ascending, > 0), ascent steps per radius, and the ball's norm and slice (SMART's)."""
    epsilons: tuple[float, ...]
    steps: int = 10
    norm: str = "inf"
    norm_level: str = "token"

    def __post_init__(self):
        if not self.epsilons or any(not (math.isfinite(e) and e > 0) for e in self.epsilons):
            raise ValueError(f"epsilons must be finite numbers > 0, got {list(self.epsilons)}")
        if list(self.epsilons) != sorted(set(self.epsilons)):
            raise ValueError(f"epsilons must ascend without repeats, got {list(self.epsilons)}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.norm not in NORMS or self.norm_level not in NORM_LEVELS:
            raise ValueError(f"norm must be one of {NORMS} and norm_level one of {NORM_LEVELS}")

    def config(self, epsilon: float) -> SmartConfig:
        return SmartConfig(epsilon=epsilon, step_size=2.5 * epsilon / self.steps, norm=self.norm,
                           norm_level=self.norm_level)


@dataclass(frozen=True)
class AttackResult:
    """The examples' ids; the mean gold loss, clean first then at each eps; the scores (as a run saves them) of the
    clean inputs and under attack at each eps, in the ids' order."""
    ids: list[str]
    losses: list[float]
    clean_scores: np.ndarray
    scores: dict[float, np.ndarray]


def attack_batch(model: MultitaskBERT, task: str, batch: dict, attack: EmbeddingAttack) -> list[tuple[float, Tensor]]:
    """(the batch's loss, its scores) clean, then at the best perturbation found for each eps; the model in eval."""
    model.set_adapter(task)
    inputs = model.encoder_inputs(task, batch)
    objective = model.objectives[task]
    with torch.no_grad():
        embeddings = model.embed(inputs)  # (B, T, H), or (2B, T, H) for an SBERT pair's two sides

    def loss_and_outputs(delta: Tensor) -> tuple[Tensor, Tensor]:
        outputs = model.outputs_from_embeddings(task, embeddings + delta, inputs)
        return objective.loss(outputs, batch["labels"]), outputs

    best = torch.zeros_like(embeddings)
    with torch.no_grad():
        loss, outputs = loss_and_outputs(best)
    best_loss, best_scores = loss.item(), objective.score(outputs)
    found = [(best_loss, best_scores)]
    for epsilon in attack.epsilons:
        config, delta = attack.config(epsilon), best
        for step in range(attack.steps + 1):
            delta.requires_grad_(step < attack.steps)
            with torch.set_grad_enabled(step < attack.steps):
                loss, outputs = loss_and_outputs(delta)
            if loss.item() > best_loss:
                best, best_loss, best_scores = delta.detach(), loss.item(), objective.score(outputs).detach()
            if step < attack.steps:
                (gradient,) = torch.autograd.grad(loss, delta)
                delta = ascent_step(delta.detach(), gradient, config)
        found.append((best_loss, best_scores))
    return found


def attack_examples(model: MultitaskBERT, task: str, examples: Sequence, tokenizer, device: torch.device,
                    batch_size: int, max_length: int, attack: EmbeddingAttack) -> AttackResult:
    """attack_batch over labelled `examples` in length-sorted batches; the mean loss weighs each batch by its size."""
    model.eval()
    tokenized = TokenizedExamples.tokenize(examples, tokenizer, max_length, model.reads_pairs_jointly(task))
    totals = np.zeros(len(attack.epsilons) + 1)
    batch_ids, scores = [], []
    with float32_exact():
        for batch in tokenized_dataloader(tokenized, batch_size, shuffle=False):
            found = attack_batch(model, task, to_device(batch, device), attack)
            totals += [loss * len(batch["ids"]) for loss, _ in found]
            batch_ids += batch["ids"]
            scores.append(np.stack([values.float().cpu().numpy() for _, values in found], axis=1))  # (B, E + 1, ...)
    ids, ordered = in_file_order(examples, batch_ids, np.concatenate(scores))
    return AttackResult(ids, (totals / len(examples)).tolist(), ordered[:, 0],
                        {epsilon: ordered[:, i + 1] for i, epsilon in enumerate(attack.epsilons)})
