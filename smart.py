"""SMART regularization (Jiang et al. 2020, "SMART: Robust and Efficient Fine-Tuning for Pre-trained
Natural Language Models through Principled Regularized Optimization"), written for any torch.nn.Module.

Fine-tuning minimises, at iteration t + 1,

    F(theta) = L(theta) + lambda_s * R_s(theta) + mu * D_Breg(theta, theta_tilde_t)

    R_s(theta)     = 1/n sum_i  max_{||x_tilde_i - x_i|| <= eps}  l_s(f(x_tilde_i; theta), f(x_i; theta))
    D_Breg(theta, theta_tilde_t) = 1/n sum_i  l_s(f(x_i; theta), f(x_i; theta_tilde_t))
    theta_tilde_t  = (1 - beta) * theta_t + beta * theta_tilde_{t-1}       (momentum Bregman proximal point)

where x_i is the output of the embedding layer, l_s is the symmetric KL divergence for classifiers
(softmax or a single sigmoid logit) and the squared error for regressors. The inner max is
approximated by projected gradient ascent on the perturbation, started from N(0, sigma^2) noise.

Usage with a model that splits into `embed(...)` and `outputs_from_embeddings(...)` (MultitaskBERT):

    regularizer = SmartRegularizer(model, SmartConfig())
    model.set_adapter(task)                                                 # the task's own adapters, if any
    inputs = model.encoder_inputs(task, batch)
    embeddings = model.embed(inputs)                                        # (B, T, H); SBERT pairs (2B, T, H)
    forward_fn = lambda e: model.outputs_from_embeddings(task, e, inputs)
    outputs = forward_fn(embeddings)                                        # the one clean forward
    loss = task_loss(outputs) + regularizer.penalty(forward_fn, embeddings, outputs, "categorical",
                                                    anchor_args=(task, batch))
    loss.backward(); optimizer.step(); regularizer.anchor.update(model)

Precision (SmartConfig.precision): by default the passes run in the run's own precision. The perturbation is
of order epsilon = 1e-5 relative to embeddings of order 1, which bf16 (8-bit mantissa), fp16 and TF32 (11 bits)
round away at the first matmul; but training runs with dropout on, and the disagreement of the clean and the
perturbed passes' dropout masks dominates R_s and its gradient in every precision (measured: docs/smart.md,
"Precision"). With precision "exact", all of it, the clean forward included, runs inside
`runtime.float32_exact()` (no autocast, no TF32), which resolves the perturbation itself (the dropout-off case,
scripts/smart_perturbation.py); the clean outputs then come from the same precision as the perturbed ones, or
R_s would measure the precision gap, and penalty() refuses to run under autocast.

Several regularizers of one model (one per task) share one BregmanAnchor; whoever steps the optimizer
updates it once per step, with the momentum of `bregman_momentum`.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ForwardFn = Callable[[Tensor], Tensor]  # the model's outputs from (perturbed) embeddings


def _at_least_float32(x: Tensor) -> Tensor:
    # Half-precision logits (autocast) lose the small differences these divergences measure.
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_same_shape(p: Tensor, q: Tensor) -> None:
    # Broadcasting (B,) against (B, 1) would silently compare every pair of examples.
    if p.shape != q.shape:
        raise ValueError(f"divergence inputs must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")


def _batch_mean(per_element: Tensor) -> Tensor:
    """Sum over everything but the batch dimension, then average over the batch."""
    return per_element.reshape(per_element.shape[0], -1).sum(dim=1).mean()


def symmetric_kl_categorical(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """KL(p||q) + KL(q||p) between softmax(logits_p) and softmax(logits_q) over the last dimension,
    averaged over the batch; computed in at least float32.

    The two KL terms combine into sum_c (p_c - q_c) * (log p_c - log q_c), which needs only
    log_softmax (no log of a probability that underflowed to zero, so no epsilon).
    """
    _check_same_shape(logits_p, logits_q)
    log_p = F.log_softmax(_at_least_float32(logits_p), dim=-1)
    log_q = F.log_softmax(_at_least_float32(logits_q), dim=-1)
    return _batch_mean((log_p.exp() - log_q.exp()) * (log_p - log_q))


def symmetric_kl_bernoulli(logit_p: Tensor, logit_q: Tensor) -> Tensor:
    """KL(p||q) + KL(q||p) between the two-class distributions (sigmoid(a), 1 - sigmoid(a)) given by
    single logits, averaged over the batch; computed in at least float32.

    With log sigmoid(a) - log(1 - sigmoid(a)) = a, the sum of both KL terms collapses to
    (sigmoid(a) - sigmoid(b)) * (a - b): exact and finite for any finite logits.
    """
    _check_same_shape(logit_p, logit_q)
    a, b = _at_least_float32(logit_p), _at_least_float32(logit_q)
    return _batch_mean((torch.sigmoid(a) - torch.sigmoid(b)) * (a - b))


def symmetric_kl_span(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """The mean over start and end of the symmetric KL between the distributions over a window's tokens
    that span logits (B, T, 2) give; padding, masked to a large negative logit in both, adds nothing."""
    _check_same_shape(logits_p, logits_q)
    return symmetric_kl_categorical(logits_p.transpose(1, 2), logits_q.transpose(1, 2)) / 2  # over T, per (B, 2)


def squared_error(p: Tensor, q: Tensor) -> Tensor:
    """(p - q)^2 summed over non-batch dimensions, averaged over the batch; in at least float32."""
    _check_same_shape(p, q)
    return _batch_mean((_at_least_float32(p) - _at_least_float32(q)) ** 2)


def _categorical_terms(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """(p_c - q_c) * (log p_c - log q_c) for each class c of the last dimension: the symmetric KL's per-class terms."""
    _check_same_shape(logits_p, logits_q)
    log_p = F.log_softmax(_at_least_float32(logits_p), dim=-1)
    log_q = F.log_softmax(_at_least_float32(logits_q), dim=-1)
    return (log_p.exp() - log_q.exp()) * (log_p - log_q)


def _bernoulli_terms(logit_p: Tensor, logit_q: Tensor) -> Tensor:
    """The per-class terms of the two classes (1 - sigmoid(a), sigmoid(a)), as a new last dimension: softmax([0, a])."""
    _check_same_shape(logit_p, logit_q)
    a, b = _at_least_float32(logit_p), _at_least_float32(logit_q)
    two_classes = [torch.stack([torch.zeros_like(x), x], dim=-1) for x in (a, b)]
    return _categorical_terms(*two_classes)


def _span_terms(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """Per-token terms of the start and the end distributions (B, 2, T), halved as symmetric_kl_span halves them."""
    _check_same_shape(logits_p, logits_q)
    return _categorical_terms(logits_p.transpose(1, 2), logits_q.transpose(1, 2)) / 2


def _squared_terms(p: Tensor, q: Tensor) -> Tensor:
    """(p - q)^2 of each output, as its own one-class distribution (a regressor has no classes to take the max of)."""
    _check_same_shape(p, q)
    return ((_at_least_float32(p) - _at_least_float32(q)) ** 2).unsqueeze(-1)


# Each divergence's terms per class (last dimension), for the reduction "max" (SmartConfig.reduction).
CLASS_TERMS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "categorical": _categorical_terms,
    "bernoulli": _bernoulli_terms,
    "span": _span_terms,
    "squared": _squared_terms,
}

DIVERGENCES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "categorical": symmetric_kl_categorical,
    "bernoulli": symmetric_kl_bernoulli,
    "span": symmetric_kl_span,
    "squared": squared_error,
}


def _divergence(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    if name not in DIVERGENCES:
        raise ValueError(f"unknown divergence {name!r}, expected one of {sorted(DIVERGENCES)}")
    return DIVERGENCES[name]


def reduced_divergence(name: str, p: Tensor, q: Tensor, reduction: str = "sum") -> Tensor:
    """The divergence `name` of p and q, each example's terms reduced over the classes by `reduction` (REDUCTIONS), then
    averaged over the batch: "sum" is DIVERGENCES[name] (the symmetric KL itself), "max" the largest class's term, as
    the thesis' listing A.1 computes R_s (torch.max(ls, -1) of the per-class terms, then their batch mean)."""
    if reduction == "sum":
        return _divergence(name)(p, q)
    _divergence(name)  # the same message for an unknown name
    return _batch_mean(CLASS_TERMS[name](p, q).amax(dim=-1))


NORMS = ("inf", "l2")  # p of the perturbation ball and of the gradient normalisation
NORM_LEVELS = ("token", "sentence")  # the slice a norm is taken over
PRECISIONS = ("run", "exact")  # where the passes compute: the run's precision, or exact float32
PROJECTIONS = ("clamp", "rescale")  # how an ascent step is brought back to the eps-ball (SmartConfig.projection)
MOMENTUM_SCHEDULES = ("run", "stage")  # what bregman_momentum's 10% is a share of: the run's updates, or the stage's
ANCHORS = ("moving_average", "stage_start")  # what D_Breg compares with: theta_tilde, or the stage's first weights
REDUCTIONS = ("sum", "max")  # how R_s reduces an example's divergence over its classes (SmartConfig.reduction)
ANCHOR_MODES = ("eval", "train")  # the anchor's forward with dropout off, or on (SmartConfig.anchor_mode)


@dataclass
class SmartConfig:
    """SMART hyperparameters; symbols as in Jiang et al. 2020. Defaults are the paper's."""

    adv_weight: float = 1.0
    """lambda_s: weight of the smoothness-inducing adversarial regularizer R_s (0 disables it)."""
    bregman_weight: float = 1.0
    """mu: weight of the Bregman proximal point term D_Breg (0 disables it and the anchor's copy)."""
    anchor_momentum: float = 0.99
    """beta of the anchor a regularizer builds for itself (a shared anchor has its own; see
    bregman_momentum): theta_tilde <- (1 - beta) * theta + beta * theta_tilde; 0 is vanilla BPP."""
    noise_std: float = 1e-5
    """sigma: standard deviation of the random start of the perturbation."""
    epsilon: float = 1e-5
    """epsilon: radius of the perturbation ball. 0: no perturbation and no ascent (noise_std, step_size,
    ascent_steps, norm, norm_level and projection unused): R_s compares the clean outputs with a second forward of
    the same embeddings under its own dropout mask, a pure dropout-consistency term as in R-Drop (Liang et al. 2021),
    the ablation that separates SMART's adversarial part from its consistency part."""
    step_size: float = 1e-3
    """eta: ascent step size on the normalised gradient."""
    ascent_steps: int = 1
    """K (T_x in the paper's algorithm): projected gradient ascent steps per batch."""
    norm: str = "inf"
    """p of the ball and of the gradient normalisation: "inf" (the paper's) or "l2"."""
    norm_level: str = "token"
    """Which slice a norm is taken over: "token" (each (H,) vector) or "sentence" (each (T, H) block)."""
    precision: str = "run"
    """Where the passes compute: "run" (the run's precision: bf16 / fp16 autocast, or float32 with TF32 on CUDA)
    or "exact" (float32 without autocast or TF32, runtime.float32_exact). Only exact float32 resolves a 1e-5
    perturbation of order-1 embeddings; but in training dropout is on, and the clean and perturbed passes'
    different masks move the outputs far more than the perturbation does, so the ascent direction, R_s and the
    gradient agree between the two (docs/smart.md, "Precision"). Exact is for studies with dropout off."""
    projection: str = "clamp"
    """How a step returns to the ball. "clamp": projected gradient ascent, delta <- project(delta + eta * g / ||g||)
    (with norm "inf" every entry clamped to [-eps, eps], so after a per-token normalised step nearly every entry sits
    at +-eps). "rescale": the thesis' listing A.4: the ascent accumulates delta <- delta + eta * g / ||g|| unprojected
    (from the random start), and every pass perturbs by delta rescaled to norm exactly eps over each norm_level slice
    (the thesis': norm "inf", norm_level "sentence", each example's (T, H) block), g being the gradient at that
    rescaled perturbation."""
    reduction: str = "sum"
    """How R_s reduces each example's divergence over the classes before the batch mean: "sum" (the symmetric KL, the
    SMART paper's l_s) or "max", the largest class's term max_c (p_c - q_c)(log p_c - log q_c), as the thesis' listing
    A.1 does (A.3: QQP's two classes; a regressor's one output is the same either way). Only R_s: the ascent's
    gradient and D_Breg sum over the classes, as the listings do."""
    anchor_mode: str = "eval"
    """The Bregman anchor's forward: "eval", dropout off (a fixed target, f(x; theta_tilde) as in the paper), or
    "train", dropout on with masks of its own, as the thesis' deep copy of the training model runs it."""

    def __post_init__(self) -> None:
        for name in ("adv_weight", "bregman_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SmartConfig: {name} must be finite and >= 0, got {value!r}")
        if not 0 <= self.anchor_momentum < 1:
            raise ValueError(f"SmartConfig: anchor_momentum must be in [0, 1), got {self.anchor_momentum!r}")
        for name in ("noise_std", "step_size"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SmartConfig: {name} must be finite and > 0, got {value!r}")
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"SmartConfig: epsilon must be finite and >= 0 (0: no perturbation), got {self.epsilon!r}")
        if isinstance(self.ascent_steps, bool) or not isinstance(self.ascent_steps, int) or self.ascent_steps < 1:
            raise ValueError(f"SmartConfig: ascent_steps must be an integer >= 1, got {self.ascent_steps!r}")
        for name, allowed in (("norm", NORMS), ("norm_level", NORM_LEVELS), ("precision", PRECISIONS),
                              ("projection", PROJECTIONS), ("reduction", REDUCTIONS), ("anchor_mode", ANCHOR_MODES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"SmartConfig: {name} must be one of {allowed}, got {getattr(self, name)!r}")


def computes_exactly(config: SmartConfig, device_type: str) -> bool:
    """Whether SMART's passes run in exact float32 here: at precision "exact", and under fp16 autocast whatever the
    precision, where the ascent's gradient of a divergence of order 1e-8 to 1e-3 would underflow fp16's 5-bit
    exponent in the backward pass (bf16 keeps float32's exponent: measured, README's precision page)."""
    fp16 = torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.float16
    return config.precision == "exact" or fp16


def _norm_dims(x: Tensor, level: str) -> tuple[int, ...]:
    return (-1,) if level == "token" else tuple(range(1, x.dim()))


def _normalise(gradient: Tensor, config: SmartConfig) -> Tensor:
    dims = _norm_dims(gradient, config.norm_level)
    if config.norm == "inf":
        norm = gradient.abs().amax(dim=dims, keepdim=True)
    else:
        norm = torch.linalg.vector_norm(gradient, ord=2, dim=dims, keepdim=True)
    # Near the random start the gradient is O(sigma), so an additive eps like 1e-8 would shrink the
    # step; the clamp only guards 0 / 0.
    return gradient / norm.clamp_min(torch.finfo(norm.dtype).tiny)


def _project(delta: Tensor, config: SmartConfig) -> Tensor:
    if config.norm == "inf":
        # The inf-ball is the same set per token or per sentence: every entry within [-eps, eps].
        return delta.clamp(-config.epsilon, config.epsilon)
    norm = torch.linalg.vector_norm(delta, ord=2, dim=_norm_dims(delta, config.norm_level), keepdim=True)
    return delta * (config.epsilon / norm.clamp_min(config.epsilon))  # shrinks only slices outside the ball


def _rescale(delta: Tensor, config: SmartConfig) -> Tensor:
    """delta scaled to norm exactly eps over each norm_level slice (the thesis divides by the norm + 1e-8, which is
    1e-5 of a step's norm of about eta = 1e-3; the clamp here only guards 0 / 0)."""
    dims = _norm_dims(delta, config.norm_level)
    if config.norm == "inf":
        norm = delta.abs().amax(dim=dims, keepdim=True)
    else:
        norm = torch.linalg.vector_norm(delta, ord=2, dim=dims, keepdim=True)
    return delta * (config.epsilon / norm.clamp_min(torch.finfo(norm.dtype).tiny))


def _perturbation(iterate: Tensor, config: SmartConfig) -> Tensor:
    """What a pass adds to the embeddings from the ascent's iterate: the iterate itself (clamp: it is kept in the
    ball), or the iterate rescaled onto the eps-sphere (rescale)."""
    return _rescale(iterate, config) if config.projection == "rescale" else iterate


def ascent_step(iterate: Tensor, gradient: Tensor, config: SmartConfig) -> Tensor:
    """One step of the ascent on the perturbation: iterate + eta * g / ||g|| (norm and slice as configured), brought
    back to the eps-ball (projection "clamp") or left unprojected ("rescale"). The robustness suite's embedding
    attack takes the same steps on another objective (minbert/robustness/embedding_attack.py)."""
    iterate = iterate + config.step_size * _normalise(gradient, config)
    return iterate if config.projection == "rescale" else _project(iterate, config)


def _perturb(embeddings: Tensor, delta: Tensor) -> Tensor:
    return (embeddings + delta).to(embeddings.dtype)


def ascend(
    forward_fn: ForwardFn,
    embeddings: Tensor,
    clean_outputs: Tensor,
    divergence: str,
    config: SmartConfig,
    token_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Approximate argmax over the eps-ball of divergence(forward_fn(embeddings + delta), clean_outputs).

    Starts from delta ~ N(0, sigma^2) and takes K steps delta <- project(delta + eta * g / ||g||), with g
    the gradient w.r.t. the perturbation only (no parameter gradients, no graph kept); with projection "rescale"
    the steps are not projected and every pass perturbs by the rescaled iterate (SmartConfig.projection). Returns
    the detached perturbation, shaped like the embeddings (kept in at least float32 so that steps of size ~eps
    survive), and a 0-dim bool tensor on the device: whether every ascent gradient was finite (if not, the
    perturbation is zero). Nothing is read back to the host: the flag is gathered on the device and read by the
    caller once. `token_mask` (B, T), 1 at real tokens: the random start is zero at padding, which the outputs
    never read, so that padding adds nothing to a sentence-level norm (its gradient there is zero anyway).
    With epsilon 0 the ball is one point: the perturbation is zero, found without a pass or a random draw.
    """
    divergence_fn = _divergence(divergence)
    anchor = embeddings.detach()
    target = clean_outputs.detach()
    if config.epsilon == 0:
        return (torch.zeros_like(anchor, dtype=torch.promote_types(anchor.dtype, torch.float32)),
                torch.ones((), dtype=torch.bool, device=anchor.device))
    delta = torch.randn_like(anchor, dtype=torch.promote_types(anchor.dtype, torch.float32)) * config.noise_std
    if token_mask is not None:
        delta = delta * token_mask.unsqueeze(-1).to(delta.dtype)
    finite = torch.ones((), dtype=torch.bool, device=anchor.device)
    for _ in range(config.ascent_steps):
        with torch.no_grad():
            perturbation = _perturbation(delta, config)
        perturbation.requires_grad_()
        with torch.enable_grad():
            value = divergence_fn(forward_fn(_perturb(anchor, perturbation)), target)
            # Traced (--capture_step), dynamo counts every grad_fn reachable from value as consumed, autocast's
            # casts of the weights too, which the step's backward then reaches again: it refuses unless the graph is
            # kept (the compiled graph frees what it no longer needs either way); eagerly nothing changes.
            (gradient,) = torch.autograd.grad(value, perturbation, retain_graph=torch.compiler.is_compiling())
        finite = finite & torch.isfinite(gradient).all()
        with torch.no_grad():
            delta = ascent_step(delta.detach(), gradient, config)
            perturbation = _perturbation(delta, config)
    return torch.where(finite, perturbation, torch.zeros_like(perturbation)), finite


def find_perturbation(
    forward_fn: ForwardFn,
    embeddings: Tensor,
    clean_outputs: Tensor,
    divergence: str,
    config: SmartConfig,
) -> Tensor | None:
    """ascend's perturbation, or None when an ascent gradient is not finite (for analyses: it reads the flag back
    to the host, which training never does)."""
    delta, finite = ascend(forward_fn, embeddings, clean_outputs, divergence, config)
    return delta if bool(finite) else None


def adversarial_regularizer(
    forward_fn: ForwardFn,
    embeddings: Tensor,
    clean_outputs: Tensor,
    divergence: str,
    config: SmartConfig,
    token_mask: Tensor | None = None,
) -> tuple[Tensor, bool | Tensor]:
    """R_s = divergence(forward_fn(embeddings + delta*), clean_outputs) for the ascent's delta*, reduced over the
    classes as config.reduction says.

    Differentiable w.r.t. the weights through both the perturbed and the clean outputs (delta* itself
    is a constant). Returns (R_s, False), or (a constant 0, True) when the ascent or R_s is not finite,
    so that a NaN never reaches the weights; the caller counts the skip. Deciding that is the SMART step's one
    host sync: the finiteness of every ascent step and of R_s is gathered on the device and read once, after
    the adversarial pass (a NaN in the perturbed pass would reach the weights through its backward even if
    R_s were replaced by a zero on the device). With epsilon 0 the perturbed forward is a second clean forward under
    its own dropout mask (ascend takes no step).

    Inside a graph torch.compile captures (--capture_step), where nothing is read back, the decision stays on the
    device: R_s where finite, else 0, and whether it was dropped as a 0-dim bool tensor. A non-finite ascent has
    zeroed the perturbation already, so the perturbed pass is a clean one and its backward stays finite; only a
    perturbed pass that overflows where the clean one did not would reach the weights, and the run then stops on
    its non-finite loss (the loop's divergence check) rather than going on.
    """
    delta, finite = ascend(forward_fn, embeddings, clean_outputs, divergence, config, token_mask)
    value = reduced_divergence(divergence, forward_fn(_perturb(embeddings, delta)), clean_outputs, config.reduction)
    kept = finite & torch.isfinite(value)
    if torch.compiler.is_compiling():
        return torch.where(kept, value, torch.zeros_like(value)), ~kept
    if not bool(kept):
        return torch.zeros((), device=clean_outputs.device), True
    return value, False


def bregman_momentum(update: int, total_updates: int, fixed: float | None = None) -> float:
    """beta for optimizer update `update` (0-based) of `total_updates`: `fixed` if given, else the SMART
    paper's schedule (its appendix): 0.99 for the first 10% of the updates, 0.999 after. Over the run's updates
    (schedule "run"), or over each stage's, restarting every stage (schedule "stage", the thesis' code, which
    restarts it every epoch): the caller passes the position and the count it means."""
    if fixed is not None:
        return fixed
    return 0.99 if update < 0.1 * total_updates else 0.999


class BregmanAnchor:
    """theta_tilde, the weights D_Breg anchors to: the moving average of the model's parameters (update), or the
    weights a stage started from when it is reset before every stage and never updated (anchor "stage_start").

    Holds one detached copy of each trainable parameter (not a copy of the module); frozen parameters and
    buffers are read from the live model at call time. Build it after the model is on its final device and dtype.
    """

    def __init__(self, model: nn.Module, momentum: float):
        if not 0 <= momentum < 1:
            raise ValueError(f"BregmanAnchor: momentum must be in [0, 1), got {momentum!r}")
        self.momentum = momentum
        # Frozen parameters are the same in theta and theta_tilde: the anchor reads them from the model.
        self.params: dict[str, Tensor] = {
            name: p.detach().clone(memory_format=torch.contiguous_format)
            for name, p in model.named_parameters() if p.requires_grad
        }

    def __call__(self, model: nn.Module, *args, **kwargs):
        """model(*args, **kwargs) evaluated with theta_tilde and dropout off (outputs)."""
        return self.outputs(model, args, kwargs)

    @torch.no_grad()
    def outputs(self, model: nn.Module, args: tuple = (), kwargs: Mapping | None = None, mode: str = "eval"):
        """model(*args, **kwargs) evaluated with theta_tilde, in `mode` (ANCHOR_MODES): "eval", dropout off, or
        "train", dropout on, as the thesis' copy of its training model runs.

        theta_tilde is a fixed target, f(x; theta_tilde) as in the paper: dropout noise in it only adds variance to
        D_Breg, and a dropout-free forward is cheaper (about a third on CPU), so "eval" is the default. The model's
        train/eval mode is restored afterwards.
        """
        was_training = model.training
        model.train(mode == "train")
        try:
            return torch.func.functional_call(model, {**self.params, **dict(model.named_buffers())}, args,
                                              dict(kwargs or {}))
        finally:
            model.train(was_training)

    @torch.no_grad()
    def reset(self, model: nn.Module) -> None:
        """theta_tilde <- theta, in place: the anchor "stage_start" (the thesis' code anchors D_Breg to the weights
        its epoch started from: through a variable-name slip its moving average is never loaded)."""
        live = dict(model.named_parameters())
        torch._foreach_copy_(list(self.params.values()), [live[name].detach() for name in self.params])

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """theta_tilde <- (1 - beta) * theta + beta * theta_tilde, in place."""
        live = dict(model.named_parameters())
        missing = self.params.keys() - live.keys()
        if missing:
            raise ValueError(f"BregmanAnchor.update: model lacks parameters {sorted(missing)}")
        names = list(self.params)
        torch._foreach_lerp_([self.params[n] for n in names], [live[n].detach() for n in names], 1 - self.momentum)

    def state_dict(self) -> dict[str, Tensor]:
        """The anchor's parameters by name (the live tensors, contiguous: safetensors can save them)."""
        return dict(self.params)

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        missing, unexpected = self.params.keys() - state.keys(), state.keys() - self.params.keys()
        if missing or unexpected:
            raise ValueError(
                f"BregmanAnchor.load_state_dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
            )
        for name, tensor in self.params.items():
            if state[name].shape != tensor.shape:
                raise ValueError(
                    f"BregmanAnchor.load_state_dict: {name} has shape {tuple(state[name].shape)}, "
                    f"expected {tuple(tensor.shape)}"
                )
            tensor.copy_(state[name])


class SmartRegularizer:
    """lambda_s * R_s + mu * D_Breg for one model, plus the anchor bookkeeping between steps."""

    def __init__(self, model: nn.Module, config: SmartConfig, anchor: BregmanAnchor | None = None):
        """`anchor`: a BregmanAnchor shared with other regularizers of the same model (one parameter
        copy for all tasks); without one, an anchor is built here. Unused when bregman_weight is 0."""
        self.model = model
        self.config = config
        if config.bregman_weight == 0:
            anchor = None
        elif anchor is None:
            anchor = BregmanAnchor(model, config.anchor_momentum)
        self.anchor = anchor
        self.skipped_host = 0
        # the adversarial terms a captured step dropped (adversarial_regularizer decides on the device there), in
        # place: a tensor that stays where it is, as CUDA graphs need of what they update
        self.skipped_on_device = torch.zeros((), dtype=torch.int64, device=next(model.parameters()).device)
        # The terms of the last penalty, weighted as added (lambda_s * R_s as "adversarial", mu * D_Breg as
        # "bregman"), detached on the device: a caller that logs them sums them there and reads them back rarely.
        self.terms: dict[str, Tensor] = {}

    def penalty(
        self,
        forward_fn: ForwardFn,
        embeddings: Tensor,
        clean_outputs: Tensor,
        divergence: str,
        anchor_args: tuple = (),
        anchor_kwargs: Mapping | None = None,
        token_mask: Tensor | None = None,
    ) -> Tensor:
        """lambda_s * R_s + mu * divergence(clean_outputs, anchor(model, *anchor_args, **anchor_kwargs)), the anchor's
        forward in config.anchor_mode.

        clean_outputs = forward_fn(embeddings) from the caller's one clean forward, reused here; the
        anchor's outputs are a fixed target. A skipped adversarial term adds 0 and bumps skipped_steps. The two terms
        are kept in `terms`. `token_mask`: the embeddings' attention mask (ascend's).
        """
        divergence_fn = _divergence(divergence)
        device_type = clean_outputs.device.type
        if torch.is_autocast_enabled(device_type) and computes_exactly(self.config, device_type):
            raise RuntimeError("SMART's passes must run in float32 with precision='exact' or under fp16 autocast: "
                               "compute the clean forward and the penalty inside runtime.float32_exact() (autocast "
                               "rounds the 1e-5 perturbation away; fp16 underflows the ascent's gradient)")
        terms = {}
        if self.config.adv_weight > 0:
            smoothness, skipped = adversarial_regularizer(
                forward_fn, embeddings, clean_outputs, divergence, self.config, token_mask
            )
            if isinstance(skipped, Tensor):
                self.skipped_on_device.add_(skipped)
            else:
                self.skipped_host += skipped
            terms["adversarial"] = self.config.adv_weight * smoothness
        if self.anchor is not None:
            anchor_outputs = self.anchor.outputs(self.model, anchor_args, anchor_kwargs, self.config.anchor_mode)
            terms["bregman"] = self.config.bregman_weight * divergence_fn(clean_outputs, anchor_outputs)
        self.terms = {name: term.detach() for name, term in terms.items()}
        return sum(terms.values(), torch.zeros((), device=clean_outputs.device))

    @property
    def skipped_steps(self) -> int:
        """The adversarial terms dropped for a non-finite ascent or R_s so far (reading a captured step's count
        waits for the device)."""
        return self.skipped_host + int(self.skipped_on_device)

    @skipped_steps.setter
    def skipped_steps(self, count: int) -> None:  # a resume's saved count
        self.skipped_host = count
        self.skipped_on_device.zero_()

    def device_tensors(self) -> list[Tensor]:
        """What a captured step reads or updates in place from one step to the next: the anchor's weights and the
        dropped terms' count."""
        anchor = list(self.anchor.params.values()) if self.anchor is not None else []
        return [*anchor, self.skipped_on_device]
