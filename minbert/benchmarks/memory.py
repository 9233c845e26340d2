"""The memory of a training step: live tensor bytes counted operator by operator (LiveTensorBytes), 16-bit matmuls
stood in for where a CPU emulates them (FloatMatmuls), the peak a step adds measured in a fresh process, and the
`memory` benchmark's table of plain / SMART steps with checkpointing and 16-bit autocast.
"""
from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from queue import Empty

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from minbert.benchmarks.models import multitask_setup, random_twin, synchronize
from minbert.benchmarks.settings import BenchmarkSettings, sixteen_bit
from minbert.benchmarks.timing import multitask_step_fn
from minbert.runtime import has_native_bf16


def attention_operators(names) -> str:
    """The fused attention kernels among aten operator names (scaled_dot_product_attention's backends: flash,
    memory-efficient or cuDNN on CUDA, flash on the CPU), or "math" for none: its math path, whose (B, heads,
    T, T) softmax and dropout tensors are kept for the backward."""
    return ", ".join(sorted(n for n in names if "attention" in n and not n.endswith("_backward"))) or "math"


def _memory_status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: peak resident)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def first_row(batch: dict, tokens: int) -> dict:
    """The batch cut to its first row and at most `tokens` tokens (its host lengths cut with it)."""
    return {k: np.minimum(v[:1], tokens) if isinstance(v, np.ndarray) else v[:1, :tokens] if v.dim() == 2 else v[:1]
            for k, v in batch.items()}


def _peak_memory_worker(settings: BenchmarkSettings, device, smart, adapter, checkpointing, queue):
    torch.set_num_threads(settings.threads)
    if device.type == "cpu":
        # Random weights of the same shape: loading a checkpoint would set a higher-water mark than a step.
        settings = replace(settings, config=random_twin(settings.config))
    model, optimizer, regularizer, batch = multitask_setup(settings, device, smart, adapter, checkpointing)
    small = first_row(batch, 8)
    # A float32 step creates the optimizer state (an fp16 gradient scaler could skip the step that would).
    multitask_step_fn(model, optimizer, regularizer, small, device, "fp32")()
    # Without the gradients of that step: every step frees them first (set_to_none) and makes them anew, so
    # they belong to the step's memory, not the base (else full fine-tuning's 87 MiB of them go uncounted).
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current size
        base = _memory_status("VmRSS")
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, settings.precision)
    for _ in range(2):
        step()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _memory_status("VmHWM")
    queue.put(peak - base)


def peak_step_memory(settings: BenchmarkSettings, device, smart: bool, adapter: str | None = None,
                     checkpointing: bool = False) -> int:
    """Peak memory a training step adds over the loaded model, measured in a fresh process
    (CPU: peak resident set size; CUDA: peak allocated bytes)."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_peak_memory_worker, args=(settings, device, smart, adapter, checkpointing, queue))
    process.start()
    while True:  # a worker that fails (its traceback on stderr) is an error here, not a wait forever
        try:
            value = queue.get(timeout=1)
            break
        except Empty:
            if not process.is_alive():
                raise RuntimeError(f"the memory probe's process failed (exit code {process.exitcode}): "
                                   "its traceback is above") from None
    process.join()
    return value


class LiveTensorBytes(TorchDispatchMode):
    """The bytes of the tensor storages that operators create while it is active and that are still alive, and
    their peak: what a computation adds to the memory already held (weights, optimizer state), at operator
    granularity. Each storage counts once, from the operator whose output it is (views and in-place results
    share their input's storage and add nothing) until it is freed (a weakref finalizer on the storage). The
    backward pass is seen too (autograd runs it with this thread's dispatch modes). Not seen: what a kernel
    allocates and frees inside itself (workspaces), and on CUDA the caching allocator's rounding (to 512-byte
    blocks) and fragmentation, which torch.cuda.max_memory_allocated includes. Also records operator names."""

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self.live: set[int] = set()  # the storages counted and still alive, by address of their StorageImpl
        self.names: set[str] = set()
        self.lock = threading.RLock()  # finalizers may run on autograd's threads, or inside a dispatch here

    def _freed(self, key: int, nbytes: int) -> None:
        with self.lock:
            self.live.discard(key)
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.names.add(func.overloadpacket.__name__)
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            with self.lock:
                if key in inputs or key in self.live:
                    continue
                self.live.add(key)
                self.current += nbytes
                self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


class FloatMatmuls(TorchDispatchMode):
    """Matrix products (and the CPU's flash attention) of bf16 / fp16 tensors computed in float32, their outputs
    rounded to the dtypes the 16-bit kernels return (read off the operator's meta kernel): the same tensors, of
    the same sizes, without the 16-bit kernels that a CPU lacking them emulates (two orders of magnitude slower
    than float32 on an AVX2 CPU). For counting memory under LiveTensorBytes entered after it (which then sees
    the 16-bit operator and its 16-bit output, not the float32 copies); never for timing."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
    SIXTEEN_BIT = (torch.bfloat16, torch.float16)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.OPS or not any(isinstance(t, torch.Tensor) and t.dtype in self.SIXTEEN_BIT
                                           for t in tree_flatten((args, kwargs))[0]):
            return func(*args, **kwargs)
        meta_args, meta_kwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
        dtypes = [t.dtype if isinstance(t, torch.Tensor) else None
                  for t in tree_flatten(func(*meta_args, **meta_kwargs))[0]]
        upcast = (lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in self.SIXTEEN_BIT else t)
        outputs, spec = tree_flatten(func(*tree_map(upcast, args), **tree_map(upcast, kwargs)))
        return tree_unflatten([t.to(dtype) if dtype is not None and t.dtype != dtype else t
                               for t, dtype in zip(outputs, dtypes)], spec)


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages that `tensors` hold."""
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


MEMORY_ROWS = {  # name: (SMART, gradient checkpointing, 16-bit autocast)
    "plain": (False, False, False),
    "plain, checkpointing": (False, True, False),
    "plain, 16-bit": (False, False, True),
    "plain, 16-bit, checkpointing": (False, True, True),
    "SMART": (True, False, False),
    "SMART, checkpointing": (True, True, False),
}
CUDA_CONTEXT_GIB = 0.5  # an assumption (CUDA context and kernels), to be checked on a GPU: see BENCHMARKS.md


def emulates_sixteen_bit(device: torch.device, precision: str) -> bool:
    """Whether the device computes this 16-bit precision's matmuls by emulation (CPUs without the instructions)."""
    return device.type == "cpu" and precision != "fp32" and not (precision == "bf16" and has_native_bf16(device))


def step_memory(settings: BenchmarkSettings, device, smart: bool, checkpointing: bool, precision: str,
                fused_attention: bool, float_matmuls: bool | None = None) -> dict:
    """Bytes of one QQP SBERT training step over the loaded model and optimizer state (LiveTensorBytes' peak,
    the gradients the step makes included), and the static bytes held across steps. `fused_attention` on the
    CPU: attention dropout off, so that scaled_dot_product_attention runs the CPU's flash kernel, which keeps
    what CUDA's fused kernels keep for the backward (output and log-sum-exp, dropout replayed from a seed);
    with dropout on, the CPU runs the math path, which keeps (B, heads, T, T) probabilities and masks.
    `float_matmuls` (by default where 16-bit is emulated): FloatMatmuls, the same bytes in a fraction of the time."""
    if float_matmuls is None:
        float_matmuls = emulates_sixteen_bit(device, precision)
    overrides = {"attention_probs_dropout_prob": 0.0} if fused_attention and device.type == "cpu" else {}
    model, optimizer, regularizer, batch = multitask_setup(settings, device, smart, checkpointing=checkpointing,
                                                           full_length=True, **overrides)
    small = first_row(batch, 8)
    multitask_step_fn(model, optimizer, regularizer, small, device, "fp32")()  # the AdamW state now exists
    optimizer.zero_grad(set_to_none=True)  # every step frees the gradients first and makes them anew
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, precision)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    with FloatMatmuls() if float_matmuls else nullcontext(), LiveTensorBytes() as counter:
        step()
    synchronize(device)
    figures = {
        "step_peak": counter.peak, "step_s": time.perf_counter() - start,
        "attention": attention_operators(counter.names),
        "weights": tensor_bytes([*model.parameters(), *model.buffers()]),
        "gradients": tensor_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "adamw_states": tensor_bytes(t for state in optimizer.state.values() for t in state.values()
                                     if torch.is_tensor(t)),
        "smart_teacher_copy": tensor_bytes(regularizer.anchor.params.values()) if smart else 0}
    if device.type == "cuda":
        figures["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(device) - base
    return figures


def bench_memory(settings: BenchmarkSettings, device) -> dict:
    """Peak memory of one QQP SBERT training step, counted tensor by tensor (LiveTensorBytes), for every
    sequence of the batch full length (the worst case): plain and SMART steps (SMART's in float32, as an fp16 run
    or --smart_precision exact computes its passes: the largest case), with and without gradient checkpointing, plain steps
    in float32 and 16-bit autocast (bf16 and fp16 keep activations in 2 bytes alike). On the CPU every row is
    measured twice: with the attention the CPU runs in training (the math path: dropout rules out its fused
    kernel) and with a fused kernel's memory (as CUDA runs it); on CUDA once, as it runs. The GPU estimate of
    a row: weights + AdamW states (+ SMART's anchor copy) + the step's peak with fused attention
    + CUDA_CONTEXT_GIB."""
    half = sixteen_bit(settings, device)
    variants = {"fused_attention": True, "attention_as_run_here": False} if device.type == "cpu" else {
        "attention_as_run_here": True}
    rows, static, kernels = {}, {}, {}
    for name, (smart, checkpointing, sixteen) in MEMORY_ROWS.items():
        rows[name] = {"precision": "fp32 (SMART in float32: fp16 runs, --smart_precision exact)" if smart else half if sixteen else "fp32"}
        for variant, fused in variants.items():
            figures = step_memory(settings, device, smart, checkpointing, half if sixteen else "fp32", fused)
            gc.collect()
            print(f"memory: {name}, {variant}: step peak {figures['step_peak'] / 2**20:.1f} MiB "
                  f"({figures['step_s']:.1f} s)", file=sys.stderr, flush=True)
            rows[name][f"step_peak_mib_{variant}"] = round(figures["step_peak"] / 2**20, 1)
            rows[name][f"step_s_{variant}"] = round(figures["step_s"], 2)
            if "cuda_peak_allocated" in figures:
                rows[name]["cuda_peak_allocated_mib"] = round(figures["cuda_peak_allocated"] / 2**20, 1)
            # The plain step's: SMART's anchor forward, in eval mode, has no dropout to keep it off the flash kernel.
            kernels.setdefault(variant, figures["attention"])
            for key in ("weights", "gradients", "adamw_states", "smart_teacher_copy"):
                static[key] = max(static.get(key, 0), figures[key])
            if fused:
                held = figures["weights"] + figures["adamw_states"] + figures["smart_teacher_copy"]
                rows[name]["held_across_steps_mib"] = round(held / 2**20, 1)
                rows[name]["gpu_estimate_gib"] = round((held + figures["step_peak"]) / 2**30 + CUDA_CONTEXT_GIB, 2)
    return {"benchmark": f"peak live-tensor memory of one QQP SBERT training step, {settings.batch_size} pairs x "
                         f"{settings.seq_len} tokens, no padding",
            "sixteen_bit": half, "attention_kernels": kernels,
            "sixteen_bit_matmuls": "in float32, rounded to 16 bits (FloatMatmuls: the same tensors; this device "
                                   "emulates 16-bit matmuls)" if emulates_sixteen_bit(device, half) else "native",
            "static_mib": {k: round(v / 2**20, 1) for k, v in static.items()},
            "cuda_context_gib_assumed": CUDA_CONTEXT_GIB, "rows": rows}
