"""An attack in embedding space, under SMART's own threat model: projected gradient ascent on the gold label's loss
(the task's training objective) over a perturbation of the input embeddings (MultitaskBERT.embed's output, where
SMART perturbs), within an eps-ball of SMART's norm (smart.SmartConfig: by default every entry within [-eps, eps]),
for each eps of a sweep.

    attack = EmbeddingAttack(epsilons=(1e-3, 1e-2, 1e-1), steps=10)
    result = attack_examples([model], "sst", examples, tokenizer, device, batch_size=32, max_length=128,
                             attack=attack)
    result.losses          # the mean loss, clean first then at each eps: never decreasing
    result.scores[eps]     # the model's scores under attack, in the examples' order

Each eps runs `steps` steps of smart.ascent_step (step size 2.5 eps / steps, Madry et al.'s rule), started from the
best perturbation of the eps before it (which lies inside the larger ball) and keeping the best iterate of the
batch's loss: so a larger eps never finds a smaller loss, and the sweep costs one ascent per eps. A pair task's two
sentences are both perturbed (an SBERT pair's embeddings hold both sides). Everything runs in exact float32 with
dropout off (runtime.float32_exact: autocast and TF32 would round small perturbations away); nothing is random.

Several models (an ensemble, ensemble_predictor.py) are attacked together, the standard attack on an averaged
ensemble: one perturbation, added to each model's own input embeddings of the same tokens, ascends the mean of the
models' gold losses (its gradient the mean of theirs), the best iterate is the one of the highest mean loss, and
`combine` makes the models' scores at it the ensemble's. They must read the same tokens the same way: one
tokenizer's ids at one max_length, each pair task's pairs as one sequence or as two alike, one hidden size.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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


Combine = Callable[[list[np.ndarray]], np.ndarray]  # each model's scores of the same examples -> the ensemble's


def attack_batch(models: Sequence[MultitaskBERT], task: str, batch: dict,
                 attack: EmbeddingAttack) -> list[tuple[float, list[Tensor]]]:
    """(the models' mean loss on the batch, each model's scores) clean, then at the best perturbation found for each
    eps; the models in eval. Each model's loss is differentiated on its own, so one model's graph is alive at a time."""
    members = []
    for model in models:
        model.set_adapter(task)
        inputs = model.encoder_inputs(task, batch)
        with torch.no_grad():
            members.append((model, inputs, model.embed(inputs)))  # (B, T, H), or (2B, T, H) for an SBERT pair

    def mean_loss(delta: Tensor, differentiate: bool) -> tuple[float, Tensor | None, list[Tensor]]:
        total, gradient, scores = 0.0, None, []
        for model, inputs, embeddings in members:
            with torch.set_grad_enabled(differentiate):
                outputs = model.outputs_from_embeddings(task, embeddings + delta, inputs)
                loss = model.objectives[task].loss(outputs, batch["labels"])
            if differentiate:
                (member_gradient,) = torch.autograd.grad(loss, delta)
                gradient = member_gradient if gradient is None else gradient + member_gradient
            total += loss.item()
            scores.append(model.objectives[task].score(outputs).detach())
        return total / len(members), None if gradient is None else gradient / len(members), scores

    best = torch.zeros_like(members[0][2])
    best_loss, _, best_scores = mean_loss(best, False)
    found = [(best_loss, best_scores)]
    for epsilon in attack.epsilons:
        config, delta = attack.config(epsilon), best
        for step in range(attack.steps + 1):
            delta.requires_grad_(step < attack.steps)
            loss, gradient, scores = mean_loss(delta, step < attack.steps)
            if loss > best_loss:
                best, best_loss, best_scores = delta.detach(), loss, scores
            if step < attack.steps:
                delta = ascent_step(delta.detach(), gradient, config)
        found.append((best_loss, best_scores))
    return found


def attack_examples(models: Sequence[MultitaskBERT], task: str, examples: Sequence, tokenizer, device: torch.device,
                    batch_size: int, max_length: int, attack: EmbeddingAttack,
                    combine: Combine | None = None) -> AttackResult:
    """attack_batch over labelled `examples` in length-sorted batches; the mean loss weighs each batch by its size.
    `combine`: the models' scores into the ensemble's; None: one model, its own scores."""
    if combine is None and len(models) != 1:
        raise ValueError(f"{len(models)} models and no way to combine their scores")
    if len({model.reads_pairs_jointly(task) for model in models}) > 1:
        raise ValueError(f"the models read {task}'s pairs differently (one sequence, two): one perturbation fits one")
    for model in models:
        model.eval()
    tokenized = TokenizedExamples.tokenize(examples, tokenizer, max_length, models[0].reads_pairs_jointly(task))
    totals = np.zeros(len(attack.epsilons) + 1)
    batch_ids, scores = [], []
    with float32_exact():
        for batch in tokenized_dataloader(tokenized, batch_size, shuffle=False):
            found = attack_batch(models, task, to_device(batch, device), attack)
            totals += [loss * len(batch["ids"]) for loss, _ in found]
            batch_ids += batch["ids"]
            host = [[values.float().cpu().numpy() for values in member_scores] for _, member_scores in found]
            scores.append(np.stack([combine(each) if combine else each[0] for each in host], axis=1))  # (B, E + 1, ...)
    ids, ordered = in_file_order(examples, batch_ids, np.concatenate(scores))
    return AttackResult(ids, (totals / len(examples)).tolist(), ordered[:, 0],
                        {epsilon: ordered[:, i + 1] for i, epsilon in enumerate(attack.epsilons)})
