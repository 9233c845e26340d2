"""runtime.py: the device, the precision, seeding and moving batches."""
import random
import warnings

import numpy as np
import pytest
import torch

import minbert.runtime as runtime
from minbert.runtime import (autocast, float32_exact, precision_notice, resolve_device, resolve_precision,
                             seed_everything, to_device, use_tf32)


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_autocast_computes_in_the_precision_asked(precision, dtype):
    with autocast(torch.device("cpu"), precision):
        assert torch.is_autocast_enabled("cpu") == (precision != "fp32")
        assert torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == dtype


@pytest.mark.parametrize("device, capability, native_cpu, expected", [
    ("cuda", (8, 9), False, "bf16"),   # L4: native bf16
    ("cuda", (7, 5), False, "fp16"),   # T4: bf16 only emulated, which torch.cuda.is_bf16_supported() counts
    ("cuda", (7, 0), False, "fp16"),   # V100
    ("cpu", None, True, "bf16"),       # AVX512-BF16 or AMX
    ("cpu", None, False, "fp32"),
])
def test_auto_precision_follows_native_support(monkeypatch, device, capability, native_cpu, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native_cpu)
    assert resolve_precision(torch.device(device), "auto") == expected
    assert resolve_precision(torch.device(device), "fp32") == "fp32"
    line = precision_notice(torch.device(device), "auto", smart=True)
    assert line.startswith(f"precision: {dict(bf16='bf16 autocast', fp16='fp16 autocast', fp32='float32')[expected]}")
    # SMART at the run's precision computes exactly only under fp16 (its ascent would underflow); asked, always
    assert ("SMART's steps run in exact float32" in line) == (expected == "fp16") and "warning" not in line
    exact = precision_notice(torch.device(device), "auto", smart=True, smart_precision="exact")
    assert ("SMART's steps run in exact float32" in exact) == (expected != "fp32")


def test_notice_warns_when_the_precision_asked_is_emulated(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert precision_notice(torch.device("cuda"), "bf16").endswith(
        "warning: bf16 is emulated on Tesla T4, much slower than fp16")
    assert precision_notice(torch.device("cpu"), "bf16").endswith(
        "warning: bf16 is emulated on this CPU, much slower than float32")
    with pytest.raises(ValueError, match="unknown precision"):
        resolve_precision(torch.device("cpu"), "fp8")


def test_float32_exact_turns_autocast_and_tf32_off_and_restores_them():
    torch.set_float32_matmul_precision("high")
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), float32_exact():
            assert not torch.is_autocast_enabled("cpu") and torch.get_float32_matmul_precision() == "highest"
            assert torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.float32
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision("highest")


def test_resolve_device_falls_back_to_the_cpu_with_a_warning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="CUDA is not available"):
        assert resolve_device(True) == torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_device(False) == torch.device("cpu")


def test_seed_everything_seeds_every_generator():
    seed_everything(7)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_to_device_moves_tensors_and_keeps_the_rest():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "ids": ["a", "b"], "labels": None}
    moved = to_device(batch, torch.device("cpu"))
    assert moved["ids"] == ["a", "b"] and moved["labels"] is None and torch.equal(moved["input_ids"], batch["input_ids"])


def test_tf32_is_turned_on_for_cuda_runs_only():
    try:
        use_tf32(torch.device("cpu"))
        assert torch.get_float32_matmul_precision() == "highest"  # CPU numbers stay float32's
        use_tf32(torch.device("cuda"))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize("gradient, stepped", [(1.0, True), (float("inf"), False)])
def test_scaled_step_reads_the_inf_flags_before_the_update_is_queued(gradient, stepped):
    """fp16's step reads back whether a gradient was inf / NaN (the scaler must, to decide whether to step); read
    after optimizer.step() had queued the update, it would make the host wait for the update's kernels too."""
    from torch.utils._python_dispatch import TorchDispatchMode
    events = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.name in ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero"):
                events.append("read")
            return func(*args, **(kwargs or {}))

    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    original_step = optimizer.step

    def step(*args, **kwargs):
        events.append("step")
        return original_step(*args, **kwargs)
    optimizer.step = step
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale((parameter * gradient).sum()).backward()
    scaler.unscale_(optimizer)  # as the trainer does before clipping
    with Reads():
        assert runtime.scaled_step(scaler, optimizer) is stepped
    assert ("step" in events) is stepped and "read" in events
    assert "read" not in events[events.index("step"):] if stepped else True
    assert scaler.get_scale() == (4.0 if stepped else 2.0)


def test_scaled_step_unscales_when_the_caller_did_not():
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([parameter], lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(parameter.sum()).backward()
    assert runtime.scaled_step(scaler, optimizer) is True
    assert torch.equal(parameter.detach(), torch.full((3,), 0.5))  # the true gradient 1, not the scaled 8
