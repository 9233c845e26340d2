"""Regularisers against forgetting in a sequential schedule: penalties that a stage adds to its task loss,
loss = task loss + penalty(model), to hold the weights that earlier knowledge lives in near where it was.

    EWC    (Kirkpatrick et al. 2017)  lambda / 2 * sum_i F_i (theta_i - theta*_i)^2, F the diagonal Fisher
           information of earlier stages' losses, estimated at theta*, the weights at the end of those stages
    L2-SP  (Li et al. 2018)           alpha / 2 * sum over the pretrained weights of (theta - theta_pretrained)^2

They are the standard defences beside the project's own (rehearsal, SMART's Bregman term, frozen-encoder
adapters). Both take a model and plain values; which parameters they hold is a list of names, so that the caller
picks the shared encoder, the pretrained weights or every trainable parameter.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping

import torch
from torch import Tensor, nn

from minbert.training.objective import FinishedBlock, Penalty, TaskForward

# The --help group of their flags (minbert/training/penalties/ewc.py, l2sp.py).
DEFENCES_TITLE = ("defences against forgetting in the sequential schedule (continual.py), added to every task step's "
                  "loss; 0 turns one off")
EWC_KEY = "ewc."  # the Fisher's and the anchor's tensors in a checkpoint


def _check_weight(owner: str, weight: float) -> None:
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
        raise ValueError(f"{owner}: the weight must be a finite number >= 0, got {weight!r}")


def trainable_parameters(model: nn.Module, names: Collection[str] | None = None) -> dict[str, nn.Parameter]:
    """The model's trainable parameters by name: those named in `names`, or every one when None. A name the model
    lacks or a frozen parameter is an error: a penalty on a weight that cannot move would silently hold nothing."""
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if names is None:
        selected = trainable
    else:
        unknown = sorted(set(names) - trainable.keys())
        if unknown:
            raise ValueError(f"not trainable parameters of the model: {unknown}")
        selected = {name: trainable[name] for name in names}
    if not selected:
        raise ValueError("no trainable parameters to regularise")
    return selected


def _squared_distance(model: nn.Module, anchors: Mapping[str, Tensor],
                      scales: Mapping[str, Tensor] | None = None) -> Tensor:
    """sum_i s_i (theta_i - anchor_i)^2 over the anchored parameters (s_i = 1 without scales), differentiable in
    the model's parameters."""
    live = dict(model.named_parameters())
    missing = sorted(anchors.keys() - live.keys())
    if missing:
        raise ValueError(f"the model lacks the regularised parameters {missing}")
    total = torch.zeros((), device=next(iter(anchors.values())).device)
    for name, anchor in anchors.items():
        squared = (live[name] - anchor).pow(2)
        total = total + (squared if scales is None else scales[name] * squared).sum()
    return total


def diagonal_fisher(model: nn.Module, batch_losses: Callable[[], Iterable[Tensor]],
                    names: Collection[str] | None = None) -> dict[str, Tensor]:
    """The diagonal of the empirical Fisher information at the model's current weights: the mean over batches of
    the squared gradient of each batch's loss, per parameter (float32, zero for a parameter a loss does not reach).

    batch_losses(): yields one scalar loss per batch of the data, computed by the model on its gold labels (the
    task loss of an earlier stage). With one example per batch this is the empirical Fisher of Kirkpatrick et al.;
    a larger batch squares the batch-mean gradient, a smaller estimate that lambda absorbs. The model runs with
    dropout off (eval mode, restored afterwards), so that the estimate does not depend on dropout masks; no
    parameter's .grad is touched.
    """
    params = trainable_parameters(model, names)
    fisher = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}
    batches = 0
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            for loss in batch_losses():
                if not torch.isfinite(loss):
                    raise ValueError(f"diagonal_fisher: the loss of batch {batches + 1} is not finite ({loss.item()})")
                gradients = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
                for name, gradient in zip(params, gradients):
                    if gradient is not None:
                        fisher[name] += gradient.detach().float().pow(2)
                batches += 1
    finally:
        model.train(was_training)
    if batches == 0:
        raise ValueError("diagonal_fisher: batch_losses yielded no loss")
    return {name: value / batches for name, value in fisher.items()}


class ElasticWeightConsolidation(Penalty):
    """EWC's penalty lambda / 2 * sum_i F_i (theta_i - theta*_i)^2 over the named parameters, as "ewc".

    Built before training with no Fisher (penalty 0); consolidate() at the end of a stage estimates F on that
    stage's data at its final weights theta*. A later consolidate adds its F to the earlier ones and moves theta*
    to the newer weights (online EWC, Schwarz et al. 2018, with no decay): one Fisher and one anchor whatever the
    number of stages, where Kirkpatrick et al.'s one penalty per stage would hold two copies of the weights each.
    As a run's penalty, it consolidates when a block of task stages ends, on the first `fisher_batches` batches of
    the block's last stage, by the task's loss alone.
    """
    name = "ewc"

    def __init__(self, model: nn.Module, weight: float, names: Collection[str] | None = None,
                 fisher_batches: int = 100):
        _check_weight("ElasticWeightConsolidation", weight)
        self.weight, self.fisher_batches = weight, fisher_batches
        self.shapes = {name: p.shape for name, p in trainable_parameters(model, names).items()}
        self.names = tuple(self.shapes)
        self.fisher: dict[str, Tensor] = {}
        self.anchor: dict[str, Tensor] = {}

    def consolidate(self, model: nn.Module, batch_losses: Callable[[], Iterable[Tensor]]) -> None:
        """Add the diagonal Fisher of batch_losses() (see diagonal_fisher) at the model's current weights, and
        anchor the penalty to those weights."""
        fisher = diagonal_fisher(model, batch_losses, self.names)
        if self.fisher:
            fisher = {name: self.fisher[name] + value for name, value in fisher.items()}
        self.fisher = fisher
        params = dict(model.named_parameters())
        self.anchor = {name: params[name].detach().clone() for name in self.names}

    def penalty(self, model: nn.Module) -> Tensor:
        """lambda / 2 * sum_i F_i (theta_i - theta*_i)^2; a constant 0 before the first consolidate()."""
        if not self.fisher:
            return torch.zeros((), device=next(model.parameters()).device)
        return 0.5 * self.weight * _squared_distance(model, self.anchor, self.fisher)

    def terms(self, forward: TaskForward) -> dict[str, Tensor]:
        return {"ewc": self.penalty(forward.model)}  # on the weights alone: computed on the device, nothing read back

    def end_block(self, model: nn.Module, block: FinishedBlock) -> None:
        self.consolidate(model, lambda: block.losses(self.fisher_batches))
        self.fisher = dict(zip(self.fisher, block.average(list(self.fisher.values()))))

    def state_tensors(self) -> dict[str, Tensor]:
        return {f"{EWC_KEY}{k}": v.contiguous() for k, v in self.state_dict().items()}

    def load_state(self, tensors: dict[str, Tensor], metadata: dict, device: torch.device) -> None:
        self.load_state_dict({name[len(EWC_KEY):]: tensor.to(device) for name, tensor in tensors.items()
                              if name.startswith(EWC_KEY)})

    def state_dict(self) -> dict[str, Tensor]:
        """The Fisher and the anchor by name, 'fisher.NAME' and 'anchor.NAME' (empty before a consolidation), so
        that a resumed run keeps the penalty of the stages before it."""
        return {**{f"fisher.{name}": value for name, value in self.fisher.items()},
                **{f"anchor.{name}": value for name, value in self.anchor.items()}}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if not state:  # saved before the first consolidation
            self.fisher, self.anchor = {}, {}
            return
        expected = {f"{kind}.{name}" for kind in ("fisher", "anchor") for name in self.names}
        if state.keys() != expected:
            raise ValueError(f"ElasticWeightConsolidation.load_state_dict: missing "
                             f"{sorted(expected - state.keys())}, unexpected {sorted(state.keys() - expected)}")
        wrong = sorted(key for key in expected if state[key].shape != self.shapes[key.partition(".")[2]])
        if wrong:  # a differently shaped tensor would broadcast in the penalty instead of failing
            raise ValueError(f"ElasticWeightConsolidation.load_state_dict: shapes differ from the model's for {wrong}")
        self.fisher = {name: state[f"fisher.{name}"] for name in self.names}
        self.anchor = {name: state[f"anchor.{name}"] for name in self.names}


class L2SP(Penalty):
    """L2-SP's penalty alpha / 2 * sum (theta - theta_start)^2 over the named parameters, as "l2sp", theta_start
    their values when it is built: build it on the pretrained model, before any training, and name the pretrained
    weights (Li et al.'s second term, beta / 2 times the squared norm of the new weights, is weight decay on the
    heads)."""
    name = "l2sp"

    def __init__(self, model: nn.Module, weight: float, names: Collection[str] | None = None):
        _check_weight("L2SP", weight)
        self.weight = weight
        self.start = {name: p.detach().clone() for name, p in trainable_parameters(model, names).items()}

    def penalty(self, model: nn.Module) -> Tensor:
        return 0.5 * self.weight * _squared_distance(model, self.start)

    def terms(self, forward: TaskForward) -> dict[str, Tensor]:
        return {"l2sp": self.penalty(forward.model)}
