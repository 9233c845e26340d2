"""AdamW with decoupled weight decay, written out by hand (CS224N minBERT, handout Algorithm 1).

Update for every parameter theta with gradient g at its step t:

    m     <- beta1 * m + (1 - beta1) * g
    v     <- beta2 * v + (1 - beta2) * g^2
    alpha_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)     (alpha_t = lr when correct_bias=False)
    theta <- theta - alpha_t * m / (sqrt(v) + eps)
    theta <- theta - lr * weight_decay * theta            (decoupled decay, after the Adam step)

The bias correction is the handout's "efficient" form: it folds both corrections into the
step size instead of forming m_hat and v_hat, so eps is added to sqrt(v), not sqrt(v_hat).
torch.optim.AdamW differs in two ways: it decays before the Adam step and it adds eps to
sqrt(v_hat); tests/test_optimizer.py bounds the resulting difference.

Each parameter group is updated in chunks of at most `chunk_elements` elements (a larger parameter is a
chunk of its own), one multi-tensor (torch._foreach_*) kernel per operation per chunk: the temporary
sqrt(v) + eps then takes one chunk's memory rather than a copy of the whole model's. Every operation acts
element by element, so the chunking does not change a single bit of the update.
"""

import math
from collections.abc import Callable, Iterable, Sequence

import torch

FOREACH_CHUNK_ELEMENTS = 2**24  # 64 MiB of float32 temporaries per chunk; bert-base holds 110M parameters


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        correct_bias: bool = True,
        chunk_elements: int = FOREACH_CHUNK_ELEMENTS,
    ):
        """`chunk_elements`: the most elements one step's multi-tensor kernels take at once (the size of the
        step's temporaries); a memory setting, not a hyperparameter, so the state dict does not keep it."""
        if chunk_elements < 1:
            raise ValueError(f"AdamW: chunk_elements must be at least 1, got {chunk_elements!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias)
        super().__init__(params, defaults)
        self.chunk_elements = chunk_elements

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        # Validate after the base class fills in defaults, so per-group overrides are checked too.
        group = self.param_groups[-1]
        try:
            _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        except ValueError:
            self.param_groups.pop()
            raise

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("AdamW does not support sparse gradients; use torch.optim.SparseAdam instead")
            for chunk in parameter_chunks(params, self.chunk_elements):
                self._step_chunk(group, chunk)

        return loss

    def _step_chunk(self, group: dict, params: list[torch.Tensor]) -> None:
        lr = group["lr"]
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params]

        states = [self.state[p] for p in params]
        for p, state in zip(params, states):
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
        exp_avgs = [state["exp_avg"] for state in states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in states]

        # One multi-tensor kernel per operation for the whole chunk, not one small kernel per parameter.
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)

        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denominators, group["eps"])

        # Step counts are per parameter (a parameter may have had no gradient on some steps),
        # so each parameter gets its own step size.
        if group["correct_bias"]:
            step_sizes = [
                -lr * math.sqrt(1 - beta2 ** state["step"]) / (1 - beta1 ** state["step"]) for state in states
            ]
        else:
            step_sizes = [-lr] * len(params)
        torch._foreach_addcdiv_(params, exp_avgs, denominators, step_sizes)

        if group["weight_decay"] != 0:
            # theta - (lr*wd)*theta, the course reference's form, not theta * (1 - lr*wd): in float32
            # the factor 1 - 1e-7 rounds to 1 - 1.19e-7, which drifts 1.8e-5 off the course's weights.
            torch._foreach_add_(params, params, alpha=-lr * group["weight_decay"])


def parameter_chunks(params: list[torch.Tensor], max_elements: int) -> list[list[torch.Tensor]]:
    """`params` cut, in order, into consecutive runs of at most max_elements elements in all; a parameter
    larger than that is a run of its own."""
    chunks, chunk, size = [], [], 0
    for p in params:
        if chunk and size + p.numel() > max_elements:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(p)
        size += p.numel()
    chunks.append(chunk)
    return chunks


def encoder_depth(parameter_name: str, num_layers: int) -> int:
    """Where a parameter sits for layer-wise learning-rate decay: 0 for BERT's embeddings, l for its
    layer l (1..L), L + 1 for everything above the last layer (pooler, task heads)."""
    parts = parameter_name.split(".")
    if "embeddings" in parts[:2]:
        return 0
    if "layers" in parts and parts.index("layers") + 1 < len(parts) and "encoder" in parts:
        return int(parts[parts.index("layers") + 1]) + 1
    return num_layers + 1


def weight_decay_groups(named_parameters, weight_decay: float, layerwise_lr_decay: float = 1.0,
                        num_layers: int = 0) -> list[dict]:
    """Parameter groups with BERT's weight-decay convention: decay every weight matrix and embedding, never
    a bias or a LayerNorm weight (the 1-dimensional parameters). Frozen parameters are left out.

    Each group carries an "lr_scale" for layer-wise learning-rate decay (Howard & Ruder 2018; Sun et al.
    2019): layer l of L trains at decay^(L - l) times the rate, the embeddings at decay^L, the pooler and
    the heads at the full rate. With decay 1 every scale is 1.
    """
    groups: dict[tuple[bool, float], list] = {}
    for name, parameter in named_parameters:
        if parameter.requires_grad:
            depth = min(encoder_depth(name, num_layers), num_layers)
            key = (parameter.dim() >= 2, layerwise_lr_decay ** (num_layers - depth))
            groups.setdefault(key, []).append(parameter)
    ordered = sorted(groups.items(), key=lambda item: (not item[0][0], -item[0][1]))  # matrices first
    return [{"params": params, "weight_decay": weight_decay if is_matrix else 0.0, "lr_scale": scale}
            for (is_matrix, scale), params in ordered]


def _check_hyperparameters(lr: float, betas: Sequence[float], eps: float, weight_decay: float) -> None:
    if not lr >= 0.0:
        raise ValueError(f"AdamW: invalid learning rate {lr!r}, must be >= 0")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"AdamW: betas must be a pair (beta1, beta2), got {betas!r}")
    for name, beta in zip(("beta1", "beta2"), betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"AdamW: invalid {name} {beta!r}, must be in [0, 1)")
    if not eps >= 0.0:
        raise ValueError(f"AdamW: invalid eps {eps!r}, must be >= 0")
    if not weight_decay >= 0.0:
        raise ValueError(f"AdamW: invalid weight_decay {weight_decay!r}, must be >= 0")
