"""Where and how a run computes: the device, the precision (bf16 / fp16 autocast or float32), seeding, moving
batches.

    precision = resolve_precision(device, "auto")   # bf16 on an Ampere+ GPU (L4, A100), fp16 on a T4 / V100,
    print(precision_notice(device, "auto"))         # float32 on a CPU without native bf16
    with autocast(device, precision): ...
    with float32_exact(): ...                       # what SMART's tiny perturbations need (smart.py)
"""
from __future__ import annotations

import importlib
import random
import warnings
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from torch.amp.grad_scaler import OptState

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # --compile_mode: torch.compile's modes
# CUDA batches are padded to a multiple of this many tokens (bucket_length): shapes that repeat, for torch.compile
# and CUDA graphs, and tensor-core-friendly widths. On the course's short sentences 8 costs 15% more grid tokens than
# padding to each batch's longest row, with at most 12 widths per task; 32 would cost 60% (`python
# scripts/benchmark.py padding --seq_len 128`, BENCHMARKS.md).
PAD_TO_MULTIPLE_OF = 8
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(use_gpu: bool) -> torch.device:
    """CUDA when asked for and present; otherwise the CPU, with a warning if CUDA was asked for."""
    if use_gpu and not torch.cuda.is_available():
        warnings.warn("--use_gpu given but CUDA is not available; training on the CPU")
    return torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: the instructions that make CPU bf16 autocast faster than float32."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def cuda_has_native_bf16(device: torch.device) -> bool:
    """bf16 tensor cores: compute capability 8.0 or more (A100, L4, H100). torch.cuda.is_bf16_supported()
    alone also counts the emulation a T4 or V100 offers, which runs far slower than fp16 there."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def has_native_bf16(device: torch.device) -> bool:
    return cuda_has_native_bf16(device) if device.type == "cuda" else cpu_has_native_bf16()


def legacy_bf16_flag(bf16: bool | None) -> str:
    """The precision that --bf16 / --no-bf16 (kept as aliases) ask for: bf16, fp32, or auto when neither is given."""
    return "auto" if bf16 is None else ("bf16" if bf16 else "fp32")


def requested_precision(precision: str, bf16: bool | None) -> str:
    """--precision with the --bf16 / --no-bf16 aliases folded in; a ValueError when the two contradict."""
    alias = legacy_bf16_flag(bf16)
    if alias == "auto":
        return precision
    if precision not in ("auto", alias):
        raise ValueError(f"--{'' if bf16 else 'no-'}bf16 contradicts --precision {precision}")
    return alias


def scaled_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """optimizer.step() through the gradient scaler, then its update; False when the step was skipped for inf /
    NaN gradients (update lowers the scale exactly then). A disabled scaler always steps and reads nothing back.

    The scale itself is never read. The inf / NaN flags are read once the gradients are unscaled and before the
    update is queued: the scaler's step reads them there too (it decides on the host whether to step), so neither
    read waits for more than the unscaling; read after scaler.step, they would wait for the update's kernels."""
    if not scaler.is_enabled():
        optimizer.step()
        return True
    if scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.READY:
        scaler.unscale_(optimizer)  # the trainer has unscaled already (for clipping); scaler.step would do it here
    skipped = any(bool(found) for found in scaler._found_inf_per_device(optimizer).values())
    scaler.step(optimizer)
    scaler.update()
    return not skipped


def resolve_precision(device: torch.device, requested: str = "auto") -> str:
    """bf16, fp16 or fp32 for --precision `requested` on this device. auto: bf16 where the device computes it
    natively (Ampere or newer GPUs; CPUs with AVX512-BF16 or AMX), fp16 on older GPUs (T4, V100: tensor cores
    for fp16 only, so a gradient scaler guards the gradients), float32 on other CPUs (bf16 is emulated there,
    an order of magnitude slower: BENCHMARKS.md)."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}, expected one of {', '.join(PRECISIONS)}")
    if requested != "auto":
        return requested
    if has_native_bf16(device):
        return "bf16"
    return "fp16" if device.type == "cuda" else "fp32"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "this CPU"


def precision_notice(device: torch.device, requested: str, smart: bool = False, smart_precision: str = "run") -> str:
    """One line saying which precision a run computes in and why (with `smart`: where SMART's passes compute, at
    `smart_precision`); a warning when the choice is emulated."""
    precision = resolve_precision(device, requested)
    native = has_native_bf16(device)
    why = "as asked (--precision)" if requested != "auto" else {
        "bf16": f"{device_name(device)} has native bf16",
        "fp16": f"{device_name(device)} has no native bf16",
        "fp32": f"{device_name(device)} has no native bf16",
    }[precision]
    what = {"bf16": "bf16 autocast", "fp16": "fp16 autocast with a gradient scaler", "fp32": "float32"}[precision]
    line = f"precision: {what} ({why})"
    if smart and precision != "fp32" and smart_precision == "exact":
        line += "; SMART's steps run in exact float32 (--smart_precision exact)"
    elif smart and precision == "fp16":
        line += "; SMART's steps run in exact float32 (fp16 would underflow the ascent's gradients)"
    emulated = (precision == "bf16" and not native) or (precision == "fp16" and device.type == "cpu")
    if emulated:
        line += f"; warning: {precision} is emulated on {device_name(device)}, much slower than " + (
            "fp16" if device.type == "cuda" else "float32")
    return line


def compile_notice(device: torch.device, compile: bool) -> str | None:
    """A warning, in one line, for --compile on a CPU, or None: inductor compiles each graph (training, evaluation,
    each new batch shape until it turns the shape dynamic) with a C++ compiler, minutes on a laptop's cores that a
    CPU run does not earn back."""
    if not compile or device.type != "cpu":
        return None
    return ("warning: --compile on a CPU: torch.compile spends minutes compiling each training and evaluation graph "
            "(and each new batch shape) with a C++ compiler, more than a CPU run saves (the demo runs over 10x slower "
            "than eager); leave --compile off on a CPU, it pays on CUDA")


def import_problem(module: str, feature: str, package: str) -> str | None:
    """Why `module`, which `feature` needs, does not import, in one line naming `package` (what pip installs) and
    the fix; None when
    it imports. Imported for real, not looked up: an installed but broken package (a protobuf mismatch, a version
    too old to say its own __version__) passes a lookup and fails only at the feature's first use, after the
    model has loaded or the run has trained."""
    try:
        importlib.import_module(module)
    except Exception as err:  # a broken package raises whatever its own imports raise (TypeError, AttributeError)
        if isinstance(err, ModuleNotFoundError) and err.name in (package, module.split(".")[0]):
            return f"{feature} needs the {package} package: pip install {package}"
        reason = next(iter(str(err).strip().splitlines()), "")
        return (f"{feature} needs {module}, which fails to import ({type(err).__name__}: {reason[:160]}); "
                f"repair the {package} install: pip install --upgrade {package}")
    return None


def autocast(device: torch.device, precision: str):
    """The autocast context of a resolved precision (bf16 / fp16), or none for fp32."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])


def use_tf32(device: torch.device) -> None:
    """float32 matmuls on CUDA through TF32 tensor cores (Ampere or newer: several times faster; inputs rounded
    to an 11-bit mantissa, float32 accumulation), as transformers' --tf32 and nanoGPT do. Left alone on the CPU."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")


@contextmanager
def float32_exact():
    """Autocast off on every device and float32 matmuls in full float32 (no TF32): for computations whose
    result is a difference of order 1e-5 relative (SMART's perturbed passes), which bf16's 8-bit, fp16's
    11-bit and TF32's 11-bit mantissas round away. Inside a graph torch.compile captures, autocast alone: the
    matmul precision is global state, which the captured step sets around its whole graph instead
    (captured_step.CapturedStep)."""
    cuda = torch.autocast("cuda", enabled=False) if torch.cuda.is_available() else nullcontext()
    matmuls = nullcontext() if torch.compiler.is_compiling() else full_float32_matmuls()
    with matmuls, torch.autocast("cpu", enabled=False), cuda:
        yield


@contextmanager
def full_float32_matmuls():
    """float32 matmuls in full float32 (no TF32) inside the block."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def bucket_length(longest: int, multiple: int | None, max_length: int | None = None) -> int:
    """The length a batch whose longest row has `longest` tokens is padded to: that, or with `multiple` the next
    multiple of it, capped at max_length (e.g. 32, 64, 96, 128 for 128), so that few shapes repeat."""
    if multiple is None:
        return longest
    rounded = -(-longest // multiple) * multiple
    return max(longest, min(rounded, max_length)) if max_length is not None else rounded


def pad_to_multiple_of(device: torch.device, compiled: bool = False) -> int | None:
    """How a run pads its batches: to buckets on CUDA or when compiled (shapes that repeat), else to each
    batch's longest row (the CPU's packed layout skips padding anyway)."""
    return PAD_TO_MULTIPLE_OF if device.type == "cuda" or compiled else None


def place_encoder(encoder, device: torch.device, compile: bool = False, compile_mode: str = "default",
                  padded: bool = False) -> None:
    """How a BertEncoder computes on `device`: on the real tokens only (packed) on the CPU, where it measures
    faster, and on the padded grid on CUDA or where `padded` asks for it (--capture_step: a captured graph's shapes
    cannot follow a token count), where shapes then depend on the batch's bucket alone and no kernel waits for a
    token count (bert.TokenLayout); its layers compiled with torch.compile if asked."""
    encoder.pack_tokens = device.type != "cuda" and not padded
    if compile:
        encoder.compile_layers(None if compile_mode == "default" else compile_mode)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def to_device(batch: dict, device: torch.device) -> dict:
    """Tensors to `device`; asynchronous from pinned memory (make_dataloader pins batches for CUDA)."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
