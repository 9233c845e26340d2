"""What a benchmark run asks for (BenchmarkSettings, from scripts/benchmark.py's flags) and the setup each result
records beside its figures (describe).
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from minbert.runtime import has_native_bf16, precision_notice

ROOT = Path(__file__).resolve().parents[2]  # the repository: the recipes' flags (scripts/_common.sh), data folders


@dataclass(frozen=True)
class BenchmarkSettings:
    """scripts/benchmark.py's flags, checked (command_line.parse_args): `precision` is bf16, fp16 or fp32, resolved
    for `device`, and `requested_precision` what was asked (auto, or --bf16 / --no-bf16 through their alias)."""
    which: str
    config: str
    device: str
    threads: int
    precision: str
    requested_precision: str
    batch_size: int
    seq_len: int
    warmup: int
    steps: int
    rounds: int
    data_dir: str
    train_flags: str
    compile: bool
    compile_mode: str
    token_layout: str
    json: Path | None


def sixteen_bit(settings: BenchmarkSettings, device) -> str:
    """The 16-bit autocast that the precision benchmark sets against float32: on CUDA the device's (bf16 where
    it is native, else fp16); on the CPU the one --precision names, bf16 by default."""
    if device.type == "cuda":
        return "bf16" if has_native_bf16(device) else "fp16"
    return settings.requested_precision if settings.requested_precision in ("bf16", "fp16") else "bf16"


def describe(settings: BenchmarkSettings, device) -> dict:
    info = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
            "config": settings.config, "batch": f"{settings.batch_size}x{settings.seq_len}",
            "python": platform.python_version(), "machine": platform.machine()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["native_bf16"] = has_native_bf16(device)
    info["precision"] = settings.precision  # resolved: bf16, fp16 or fp32 (the precision benchmark sets its own)
    info["precision_notice"] = precision_notice(device, settings.requested_precision)
    info["float32_matmul_precision"] = torch.get_float32_matmul_precision()  # "high": TF32 (runtime.use_tf32)
    info["compile"], info["token_layout"] = settings.compile, settings.token_layout
    if settings.compile:
        info["compile_mode"] = settings.compile_mode
    return info
