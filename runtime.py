"""Where and how a run computes: the device, bf16 autocast, seeding, moving batches."""
from __future__ import annotations

import random
import warnings
from contextlib import nullcontext

import numpy as np
import torch


def resolve_device(use_gpu: bool) -> torch.device:
    """CUDA when asked for and present; otherwise the CPU, with a warning if CUDA was asked for."""
    if use_gpu and not torch.cuda.is_available():
        warnings.warn("--use_gpu given but CUDA is not available; training on the CPU")
    return torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")


def bf16_enabled(device: torch.device, bf16: bool | None) -> bool:
    """--bf16 / --no-bf16; None (the default) means on for CUDA, off for CPU, because CPUs without native
    bf16 instructions emulate it slowly."""
    return device.type == "cuda" if bf16 is None else bf16


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: the instructions that make CPU bf16 autocast faster than float32."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def warn_if_bf16_is_emulated(device: torch.device, bf16: bool | None) -> None:
    """--bf16 on a CPU without native bf16 runs every matmul through a slow emulation (BENCHMARKS.md: many
    times slower than float32 on an AVX2-only CPU), so a long run should hear of it before it starts."""
    if device.type == "cpu" and bf16_enabled(device, bf16) and not cpu_has_native_bf16():
        warnings.warn("--bf16 on a CPU without native bf16 (no AVX512-BF16 or AMX): autocast is emulated and much "
                      "slower than float32 here; leave --bf16 out on this machine")


def bf16_autocast(device: torch.device, bf16: bool | None):
    """The autocast context that --bf16 / --no-bf16 (see bf16_enabled) asks for on this device."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16_enabled(device, bf16) else nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
