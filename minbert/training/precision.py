"""bf16 copies of the weights the matmuls read, kept between steps (--bf16_weights), and the count of the weight
casts and operators a step dispatches.

Under bf16 autocast every nn.Linear call casts its float32 weight and bias to bf16 (autocast keeps a cast for one
autocast region only, so every step casts every weight again: on a GPU one kernel launch each, 274 of bert-base's
~870 launches per step). keep_bf16_copies gives each nn.Linear bf16 copies of its weight and bias that its forward
reads under bf16 autocast instead; AdamW rewrites a parameter's copy in the pass that updates it (one multi-tensor
copy, optimizer.AdamW.keep_copies), and any other change to a parameter (a checkpoint loaded, a stage's best
restored) shows in its version counter, and its copy is rewritten at its next forward.

The parameters stay float32, and so does everything that reads them: checkpoints, the optimizer's state and update,
SMART's exact float32 passes (autocast is off there: the forward reads the parameters) and a forward with other
weights (torch.func.functional_call, SMART's anchor). The backward casts each copy's bf16 gradient to float32, as
autocast's cast does. One difference to autocast: where one autocast region reads a weight twice (the two sentences
of a pair), autocast's single cached cast sums the two bf16 gradients in bf16 and then casts; here each is cast and
they sum in float32.

    copies = keep_bf16_copies([model, mlm_head], optimizer)
    counts = count_dispatches(lambda: train_step(model, batch), model.parameters())  # counts.weight_casts == 0
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from optimizer import AdamW


def reads_bf16(device_type: str) -> bool:
    """Whether a matmul here computes in bf16 autocast (and so reads the bf16 copies)."""
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16


class ReadCopy(torch.autograd.Function):
    """The parameter's bf16 copy forward; backward, its gradient cast to the parameter's dtype (autocast's cast)."""

    @staticmethod
    def forward(ctx, parameter: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        ctx.dtype = parameter.dtype
        return copy

    @staticmethod
    def backward(ctx, gradient: torch.Tensor):
        return gradient.to(ctx.dtype), None


class Bf16WeightCopies:
    """Each kept parameter's bf16 copy and the parameter's version counter when the copy was written."""

    def __init__(self):
        self.copies: dict[torch.Tensor, torch.Tensor] = {}
        self.versions: dict[torch.Tensor, int] = {}

    def add(self, parameter: torch.Tensor) -> None:
        if parameter not in self.copies:
            self.copies[parameter] = parameter.detach().to(torch.bfloat16)
            self.versions[parameter] = parameter._version

    def read(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """What a matmul reads for `tensor`: its bf16 copy under bf16 autocast (rewritten first if the parameter
        changed since), else `tensor` itself (float32 passes; weights put in by functional_call have no copy)."""
        copy = self.copies.get(tensor) if tensor is not None else None
        if copy is None or not reads_bf16(tensor.device.type):
            return tensor
        if tensor._version != self.versions[tensor]:
            with torch.no_grad():
                copy.copy_(tensor)
            self.versions[tensor] = tensor._version
        return ReadCopy.apply(tensor, copy)

    def updated(self, optimizer: AdamW, args, kwargs) -> None:
        """After an AdamW step (a step post-hook): the copies it rewrote, those of the parameters it updated (the
        ones with a gradient), hold the parameters' new values."""
        for parameter in optimizer.copies:
            if parameter.grad is not None:
                self.versions[parameter] = parameter._version


class LinearReadingCopies(nn.Linear):
    """An nn.Linear whose forward reads its weight and bias through Bf16WeightCopies.read (keep_bf16_copies makes
    a model's nn.Linear layers this class, in place: their parameters, names and state dicts stay as they were)."""
    weight_copies: Bf16WeightCopies

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight_copies.read(self.weight), self.weight_copies.read(self.bias))


def keep_bf16_copies(modules: Iterable[nn.Module | None], optimizer: AdamW) -> Bf16WeightCopies:
    """bf16 copies of the weight and bias of every nn.Linear in `modules` (None: skipped), read by their forward
    under bf16 autocast and rewritten by `optimizer`'s updates. Call it once the modules are on their device."""
    copies = Bf16WeightCopies()
    for module in modules:
        for layer in module.modules() if module is not None else ():
            if type(layer) is nn.Linear:
                layer.__class__ = LinearReadingCopies
                layer.weight_copies = copies
                for parameter in (layer.weight, layer.bias):
                    if parameter is not None:
                        copies.add(parameter)
    optimized = {p for group in optimizer.param_groups for p in group["params"]}
    optimizer.keep_copies({p: copy for p, copy in copies.copies.items() if p in optimized})
    optimizer.register_step_post_hook(copies.updated)
    return copies


# The operators a dtype conversion dispatches (Tensor.to decomposes into _to_copy; copy_ converts when its source's
# dtype differs).
CONVERSIONS = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)


@dataclass
class DispatchCounts:
    operators: int = 0  # every ATen operator dispatched (a multi-tensor one counts once)
    views: int = 0  # of which views (a new tensor's metadata over the same memory: no kernel on a GPU)
    weight_casts: int = 0  # single-tensor dtype conversions whose source is a parameter's storage


class DispatchCounter(TorchDispatchMode):
    """Counts the operators dispatched under it, and among them the dtype conversions of a parameter (a tensor
    sharing one of `parameters`' storages: the parameter itself or a view of it)."""

    def __init__(self, parameters: Iterable[torch.Tensor]):
        super().__init__()
        self.storages = parameter_storages(parameters)
        self.counts = DispatchCounts()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.counts.operators += 1
        self.counts.views += func.is_view
        self.counts.weight_casts += casts_a_parameter(func, args, kwargs, self.storages)
        return func(*args, **kwargs)


def parameter_storages(parameters: Iterable[torch.Tensor]) -> set[int]:
    """Where `parameters`' storages start: a tensor whose storage starts at one of them is a parameter or its view."""
    return {p.untyped_storage().data_ptr() for p in parameters}


def casts_a_parameter(func, args, kwargs, storages: set[int]) -> bool:
    """Whether this operator call converts the dtype of a tensor on one of `storages` (parameter_storages)."""
    if func not in CONVERSIONS:
        return False
    source = args[1] if func is torch.ops.aten.copy_.default else args[0]
    if not isinstance(source, torch.Tensor) or source.untyped_storage().data_ptr() not in storages:
        return False
    if func is torch.ops.aten.copy_.default:
        return args[0].dtype != source.dtype
    return kwargs.get("dtype") not in (None, source.dtype)


def count_dispatches(step: Callable[[], object], parameters: Iterable[torch.Tensor]) -> DispatchCounts:
    """The operators that `step()` dispatches and the casts of `parameters` among them."""
    counter = DispatchCounter(parameters)
    with counter:
        step()
    return counter.counts
