"""AdamW for a run and the update it takes: parameter groups by weight decay and layer-wise rate, each group's
learning rate a 0-dim tensor on the device set in place, and the gradients' handling before a step (fp16's
unscaling, clipping or measuring their norm).

    optimizer = build_optimizer(model, lr, weight_decay, layerwise_lr_decay, mlm_head)
    norm, stepped = update_weights(optimizer, scaler, learning_rate, max_grad_norm)
"""
from __future__ import annotations

import torch

from minbert.model.multitask_bert import MultitaskBERT
from minbert.runtime import scaled_step
from minbert.training.mlm import MaskedLanguageModelHead
from minbert.training.precision import keep_bf16_copies
from optimizer import AdamW, weight_decay_groups


def build_optimizer(model: MultitaskBERT, lr: float, weight_decay: float = 0.0, layerwise_lr_decay: float = 1.0,
                    mlm_head: MaskedLanguageModelHead | None = None, compiled: bool = False,
                    bf16_weights: bool = False) -> AdamW:
    """AdamW over the model's parameters (and the mlm head's), grouped by weight decay and layer-wise rate. Each
    group's learning rate is a 0-dim tensor on the model's device that set_learning_rate fills in place, so that
    setting it never waits for the device nor recompiles a compiled step (`compiled`: AdamW's compiled update).
    `bf16_weights`: the nn.Linear layers read bf16 copies of their weights under bf16 autocast, which each update
    rewrites (precision.keep_bf16_copies)."""
    named = list(model.named_parameters())
    if mlm_head is not None:
        named += [(f"mlm_head.{name}", p) for name, p in mlm_head.named_parameters()]
    groups = weight_decay_groups(named, weight_decay, layerwise_lr_decay, model.bert.config.num_hidden_layers)
    device = next(model.parameters()).device
    for group in groups:  # one tensor per group: their lr_scale differs
        group["lr"] = torch.full((), lr * group["lr_scale"], dtype=torch.float64, device=device)
    optimizer = AdamW(groups, lr=lr, compiled=compiled)
    if bf16_weights:
        keep_bf16_copies([model, mlm_head], optimizer)
    return optimizer


def set_learning_rate(optimizer: AdamW, base_rate: float) -> None:
    """Every group's rate, `base_rate` times its scale, in place: nothing waits, nothing recompiles."""
    for group in optimizer.param_groups:
        group["lr"].fill_(base_rate * group["lr_scale"])


def gradient_norm(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The L2 norm of all the parameters' gradients together, a 0-dim tensor on the device (what clip_grad_norm_
    returns), without clipping."""
    norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32) for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros((), device=device)


def update_weights(optimizer: AdamW, scaler: torch.amp.GradScaler, learning_rate: float, max_grad_norm: float,
                   measure_norm: bool = False) -> tuple[torch.Tensor | None, bool]:
    """One AdamW step at `learning_rate` (the base rate) on the gradients as they are (averaged over ranks
    already), unscaled from fp16's loss scale and clipped to `max_grad_norm` (0: not clipped); the gradients are
    cleared after. Returns the gradients' total norm before clipping, a 0-dim device tensor, when clipping computes
    it or `measure_norm` asks for it, else None; and whether the step was taken (fp16's scaler skips a step with
    inf / NaN gradients)."""
    scaler.unscale_(optimizer)  # clipping and the step see the true gradients
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = None
    if max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    elif measure_norm:
        norm = gradient_norm(params, params[0].device)
    set_learning_rate(optimizer, learning_rate)
    stepped = scaled_step(scaler, optimizer)
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped
