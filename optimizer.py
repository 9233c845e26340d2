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

Every number the update reads lives on the parameters' device. Each parameter's step count t is a 0-dim
float64 tensor beside it (a parameter without a gradient in an update does not advance), alpha_t and
lr * weight_decay are computed from it there, and a group's "lr" may be a 0-dim tensor on the device as well
as a Python float. So step() never waits for the device (no .item(), no branch on a tensor's value): it can
be captured in a CUDA graph or compiled, and a trainer that updates a tensor lr in place (lr.fill_(value))
changes the rate without a recompile. Steps once held the step count as a Python int and computed alpha_t
in Python doubles, a host-side number that CUDA-graph capture and torch.compile would each bake in. The
device computes it in float64, in the order of that Python expression, so each parameter's alpha_t is the
same double and the update the same bits on the CPU (tests/test_optimizer.py compares 100 steps).

Groups that share betas, eps and correct_bias are updated in one pass (the learning rate and the weight decay
enter per parameter), cut into chunks of at most `chunk_elements` elements (a larger parameter is a chunk of
its own): eight multi-tensor (torch._foreach_*) calls per chunk, and the temporary sqrt(v) + eps takes one
chunk's memory rather than a copy of the whole model's (off the CPU alpha_t * m is a second one, see
addcdiv_reads_scalar_tensors). Every operation acts element by element, so neither the chunks nor the merged
groups change a single bit of the update. Off the CPU the two operations that pair each parameter with its
own 0-dim scalar (alpha_t * m and the decay) run one kernel per parameter, as the multi-tensor kernels need
equal shapes: there the step is meant to be captured in a CUDA graph, or compiled: AdamW(..., compiled=True)
runs the pass through torch.compile, which fuses it into a few kernels without temporaries (so it takes no
chunks).
"""

from collections.abc import Callable, Iterable, Sequence

import torch

FOREACH_CHUNK_ELEMENTS = 2**24  # 64 MiB of float32 temporaries per chunk; bert-base holds 110M parameters


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        correct_bias: bool = True,
        chunk_elements: int = FOREACH_CHUNK_ELEMENTS,
        compiled: bool = False,
    ):
        """`chunk_elements`: the most elements one step's multi-tensor kernels take at once (the size of the
        step's temporaries); a memory setting, not a hyperparameter, so the state dict does not keep it.
        `compiled`: run each update through torch.compile(fullgraph=True), which needs no chunks; it recompiles
        when the set of parameters with a gradient changes, not when a rate does. Its update is the same to
        float rounding, not to the bit, on the CPU: inductor's C++ rounds m + (1 - beta1) * g twice (and forms
        addcmul's product in another order) where ATen's CPU kernels use one fused multiply-add; on CUDA it
        emits the fused multiply-adds eager does.
        `lr` (and a group's "lr"): a Python float or a 0-dim tensor on the parameters' device, best float64
        (alpha_t is computed in float64; a float32 rate is used as the float32 number it holds)."""
        if chunk_elements < 1:
            raise ValueError(f"AdamW: chunk_elements must be at least 1, got {chunk_elements!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias)
        super().__init__(params, defaults)
        self.chunk_elements = None if compiled else chunk_elements
        # parameter -> a copy in another dtype that each update rewrites (keep_copies); not state: rebuilt from the
        # parameters, so neither saved nor loaded.
        self.copies: dict[torch.Tensor, torch.Tensor] = {}
        self._update = torch.compile(adamw_update, fullgraph=True) if compiled else adamw_update

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        # Validate after the base class fills in defaults, so per-group overrides are checked too.
        group = self.param_groups[-1]
        try:
            _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        except ValueError:
            self.param_groups.pop()
            raise

    def keep_copies(self, copies: dict[torch.Tensor, torch.Tensor]) -> None:
        """From now on each update of a parameter in `copies` also rewrites its copy (of the same shape, any
        dtype: the parameter rounded to it) in the same pass."""
        self.copies.update(copies)

    def load_state_dict(self, state_dict: dict) -> None:
        """The base class's load, then each step count as this optimizer keeps it (a 0-dim float64 tensor on its
        parameter's device; a state dict saved before step counts were tensors holds Python ints), and a
        group whose lr is a tensor keeps that tensor, set to the loaded rate: whoever updates it in place (the
        trainer, a captured CUDA graph) still holds the rate the optimizer reads."""
        rates = [group["lr"] for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, rate in zip(self.param_groups, rates):
            if torch.is_tensor(rate):
                rate.fill_(group["lr"])
                group["lr"] = rate
        for param, state in self.state.items():
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float64).to(param.device, copy=True)

    def initial_state(self, param: torch.Tensor) -> dict:
        """The parameter's state, created (step count 0, zero moments) if it has none yet. A step creates it at the
        parameter's first gradient; a captured step (CUDA graphs) creates every one beforehand, so that its graph reads
        tensors that stay where they are: the update is the same, the moments of a parameter that never had a gradient
        stay zero and its count 0."""
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float64, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        passes: dict[tuple, dict[str, list]] = {}
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("AdamW does not support sparse gradients; use torch.optim.SparseAdam instead")
            lr = group["lr"]
            if not torch.is_tensor(lr):
                # On the device by a fill (the value travels as a kernel argument, nothing waits), so that one
                # update serves both kinds of rate and a compiled update sees a new float as a new input.
                lr = torch.full((), lr, dtype=torch.float64, device=params[0].device)
            beta1, beta2 = group["betas"]
            lists = passes.setdefault((beta1, beta2, group["eps"], group["correct_bias"]),
                                      {name: [] for name in UPDATE_LISTS})
            for p in params:
                state = self.initial_state(p)
                for name, value in zip(UPDATE_LISTS, (p, p.grad, state["exp_avg"], state["exp_avg_sq"],
                                                      state["step"], lr, group["weight_decay"],
                                                      self.copies.get(p))):
                    lists[name].append(value)

        for (beta1, beta2, eps, correct_bias), lists in passes.items():
            self._update(**lists, beta1=beta1, beta2=beta2, eps=eps, correct_bias=correct_bias,
                         chunk_elements=self.chunk_elements)
        return loss


# One entry per parameter in each list adamw_update takes.
UPDATE_LISTS = ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps", "lrs", "weight_decays", "copies")


def adamw_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    lrs: list[torch.Tensor],
    weight_decays: list[float],
    copies: list[torch.Tensor | None] | None = None,
    *,
    beta1: float, beta2: float, eps: float,
    correct_bias: bool, chunk_elements: int | None,
) -> None:
    """One AdamW update of `params` in place: their moments, their step counts (0-dim float64 tensors on their
    device) and each one's learning rate (a 0-dim tensor there; parameters of one group share it) and weight
    decay. `copies`: each parameter's lower-precision copy, rewritten from it after its update, or None (see
    AdamW.keep_copies). `chunk_elements`: see AdamW; None takes all parameters at once."""
    torch._foreach_add_(steps, 1)
    step_sizes = negative_step_sizes(steps, lrs, beta1, beta2, correct_bias)
    decayed = [i for i, weight_decay in enumerate(weight_decays) if weight_decay != 0]
    # -lr * weight_decay per decayed parameter, a tensor as lr is; lr * (-wd) is the double -lr * wd was.
    rates = torch._foreach_mul([lrs[i] for i in decayed], [-weight_decays[i] for i in decayed]) if decayed else []
    decay_rates = dict(zip(decayed, rates))
    for chunk in parameter_chunks([p.numel() for p in params], chunk_elements):
        exp_avgs_, exp_avg_sqs_, grads_ = exp_avgs[chunk], exp_avg_sqs[chunk], grads[chunk]
        # One multi-tensor kernel per operation for the whole chunk, not one small kernel per parameter.
        torch._foreach_mul_(exp_avgs_, beta1)
        torch._foreach_add_(exp_avgs_, grads_, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs_, beta2)
        torch._foreach_addcmul_(exp_avg_sqs_, grads_, grads_, value=1 - beta2)

        denominators = torch._foreach_sqrt(exp_avg_sqs_)
        torch._foreach_add_(denominators, eps)
        if addcdiv_reads_scalar_tensors(params[0].device):
            torch._foreach_addcdiv_(params[chunk], exp_avgs_, denominators, torch.stack(step_sizes[chunk]))
        else:
            # theta + (-alpha_t * m) / denominator: the product first, as the CPU's addcdiv with the step size as
            # its scalar computes it (alpha_t is rounded to the parameter's dtype in the product, as it is there).
            updates = torch._foreach_mul(exp_avgs_, step_sizes[chunk])
            torch._foreach_addcdiv_(params[chunk], updates, denominators)

        decayed_ = [i for i in range(chunk.start, chunk.stop) if i in decay_rates]
        if decayed_:
            # theta + (-lr*wd)*theta, the course reference's form, not theta * (1 - lr*wd): in float32 the factor
            # 1 - 1e-7 rounds to 1 - 1.19e-7, which drifts 1.8e-5 off the course's weights. addcmul with the
            # rate as a tensor rounds as add(theta, theta, alpha=rate) did, one fused multiply-add.
            decayed_params = [params[i] for i in decayed_]
            torch._foreach_addcmul_(decayed_params, decayed_params, [decay_rates[i] for i in decayed_])
        rewrite_copies(params[chunk], copies[chunk] if copies else [])


def rewrite_copies(params: list[torch.Tensor], copies: list[torch.Tensor | None]) -> None:
    """Each parameter's copy (None: none) rewritten from it, rounded to the copy's dtype: one multi-tensor copy."""
    copied = [(copy, param) for copy, param in zip(copies, params) if copy is not None]
    if copied:
        torch._foreach_copy_([copy for copy, _ in copied], [param for _, param in copied])


def negative_step_sizes(steps: list[torch.Tensor], lrs: list[torch.Tensor], beta1: float, beta2: float,
                        correct_bias: bool) -> list[torch.Tensor]:
    """-alpha_t per parameter as 0-dim float64 tensors on the device: -lr * sqrt(1 - beta2^t) / (1 - beta1^t),
    operation by operation the double that Python's `-lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)` gives
    (pow, sqrt and the four operations round the same; negating any intermediate is exact)."""
    if not correct_bias:
        return torch._foreach_neg(lrs)
    bias1 = torch._foreach_pow(beta1, steps)
    bias2 = torch._foreach_pow(beta2, steps)
    torch._foreach_sub_(bias1 + bias2, 1)  # beta^t - 1 = -(1 - beta^t)
    torch._foreach_neg_(bias2)
    torch._foreach_sqrt_(bias2)
    torch._foreach_mul_(bias2, lrs)
    torch._foreach_div_(bias2, bias1)  # lr * sqrt(1 - beta2^t) / (beta1^t - 1)
    return bias2


def addcdiv_reads_scalar_tensors(device: torch.device) -> bool:
    """Whether addcdiv should take the step sizes as a tensor of scalars, which it reads before its kernel runs:
    on the CPU, where they already lie, that saves the alpha_t * m temporary (a fresh allocation per step that
    made the step 1.4x slower, measured on minilm-l6's parameters); elsewhere it would copy them to the host, a
    sync. A compiled update forms the product, which inductor fuses into the same loop."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


def parameter_chunks(sizes: list[int], max_elements: int | None) -> list[slice]:
    """Consecutive runs of the parameters with these element counts, in order, of at most max_elements elements
    in all (None: one run); a parameter larger than that is a run of its own."""
    if max_elements is None:
        return [slice(0, len(sizes))]
    chunks, start, size = [], 0, 0
    for index, numel in enumerate(sizes):
        if index > start and size + numel > max_elements:
            chunks.append(slice(start, index))
            start, size = index, 0
        size += numel
    chunks.append(slice(start, len(sizes)))
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


def _check_hyperparameters(lr: float | torch.Tensor, betas: Sequence[float], eps: float, weight_decay: float) -> None:
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
