"""Counting what a computation dispatches: every aten operator and each host sync (an operator or copy that makes the
host wait for the device), by what and by the project line that asked for it, and the weight casts among them.
"""
from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minbert.benchmarks.settings import ROOT
from minbert.training.precision import casts_a_parameter, parameter_storages


# ---------------------------------------------------------------------------------------------------
# step_audit: what one training step makes the host wait for, and where torch.compile breaks its graph

# Operators whose result the host must have before it goes on: a scalar read back (item(), bool() or float() of a
# tensor), or an output whose size depends on the data (nonzero, masked_select, unique), which CUDA knows only once
# the kernel has run.
READ_BACK_OPERATORS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "equal", "_unique2",
                                 "unique_dim", "unique_consecutive"})
# Indexing with a boolean mask (x[mask], x[mask] = y) runs a nonzero inside the operator.
INDEXING_OPERATORS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
COPY_OPERATORS = frozenset({"copy_", "_to_copy"})
# The benchmarks' own code, whose frames are never a sync's site: this package and its command line.
BENCHMARK_CODE = (Path(__file__).resolve().parent, ROOT / "scripts" / "benchmark.py")


def copy_sync(name: str, args, kwargs, out) -> str | None:
    """Why the host waits for this copy_ / _to_copy, or None: a copy to the host waits for the device's queue; so
    does a blocking copy to the device (torch synchronizes the stream after it), and a non-blocking one from
    pageable memory may (CUDA: "might be synchronous with respect to host"); one from pinned memory does not."""
    if name == "copy_":
        destination, source = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    else:
        source, destination = args[0], out
        non_blocking = kwargs.get("non_blocking", False)
    if source.device.type != "cpu" and destination.device.type == "cpu":
        return f"device-to-host copy (aten::{name})"
    if source.device.type != "cpu" or destination.device.type == "cpu":
        return None
    if not non_blocking:
        return f"blocking host-to-device copy (aten::{name})"
    return None if source.is_pinned() else f"host-to-device copy from pageable memory (aten::{name})"


def host_sync(func, args, kwargs, out, device: torch.device) -> str | None:
    """Why the host waits for this operator call, or None. Audited on the CPU, every tensor stands for the one a GPU
    run holds on the device (the step moves its whole batch there); on CUDA an operator on host tensors alone (a
    CPU tensor's item()) does not wait for the GPU."""
    name = func.overloadpacket.__name__
    if name in COPY_OPERATORS:
        return copy_sync(name, args, kwargs, out)
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if device.type != "cpu" and all(t.device.type == "cpu" for t in tensors):
        return None
    if name in READ_BACK_OPERATORS:
        return f"aten::{name}"
    if name in INDEXING_OPERATORS and any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                                          for t in tree_flatten(args[1])[0]):
        return f"aten::{name} with a boolean mask (a nonzero inside)"
    return None


def project_frame(frames) -> str | None:
    """'file.py:line (function)' of the innermost frame of the project's own code among `frames` (innermost last),
    neither torch's nor the benchmarks' (BENCHMARK_CODE); None when there is none."""
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        installed = {"site-packages", "dist-packages"} & set(path.parts)  # a virtual environment inside the repo
        mine = any(path.is_relative_to(code) for code in BENCHMARK_CODE)
        if not mine and path.is_relative_to(ROOT) and not installed:
            return f"{path.relative_to(ROOT)}:{frame.lineno} ({frame.name})"
    return None


@dataclass
class StepCount:
    """What counting() saw: every aten operator call by operator, the host syncs by (what, where), the views among
    the operators (a new tensor's metadata over the same memory: no kernel on a GPU) and the dtype conversions of
    the weights (precision.casts_a_parameter: under bf16 autocast one per nn.Linear weight and bias, unless
    --bf16_weights keeps their bf16 copies)."""
    operators: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    views: int = 0
    weight_casts: int = 0

    @property
    def host_syncs(self) -> int:
        return sum(self.syncs.values())

    @property
    def ops(self) -> int:
        return sum(self.operators.values())

    def add_sync(self, what: str) -> None:
        # CUDA runs the backward pass on a thread of its own, where no frame of the project's is on the stack.
        self.syncs[(what, project_frame(traceback.extract_stack()) or "the backward pass")] += 1


class OperatorCounter(TorchDispatchMode):
    """Counts every aten operator dispatched while active, the backward pass's included, its host syncs and its
    casts of the weights (tensors on the storages of parameter_storages)."""

    def __init__(self, count: StepCount, device: torch.device, weights: set[int]):
        super().__init__()
        self.count, self.device, self.weights = count, device, weights

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.count.operators[f"aten::{func.overloadpacket.__name__}"] += 1
        self.count.views += func.is_view
        self.count.weight_casts += casts_a_parameter(func, args, kwargs, self.weights)
        what = host_sync(func, args, kwargs, out, self.device)
        if what is not None:
            self.count.add_sync(what)
        return out


class HostReadCounter(TorchFunctionMode):
    """Tensor.tolist() and .numpy() read a CPU tensor's memory directly, with no operator that OperatorCounter
    could see; on a GPU the same call first copies the tensor to the host. Counted when auditing on the CPU."""

    READS = frozenset({"tolist", "numpy"})

    def __init__(self, count: StepCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", None)
        if name in self.READS:
            self.count.add_sync(f"Tensor.{name}() (a device-to-host copy on a GPU)")
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(device: torch.device, weights: Iterable[torch.Tensor] = ()):
    """A StepCount of what runs inside the block; its weight_casts, those of `weights` (the model's parameters)."""
    count = StepCount()
    operators = OperatorCounter(count, device, parameter_storages(weights))
    with HostReadCounter(count) if device.type == "cpu" else nullcontext(), operators:
        yield count
