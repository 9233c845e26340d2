"""runtime.py: the device, bf16 autocast, seeding and moving batches."""
import random
import warnings

import numpy as np
import pytest
import torch

import runtime
from runtime import bf16_autocast, bf16_enabled, resolve_device, seed_everything, to_device, warn_if_bf16_is_emulated


@pytest.mark.parametrize("flag, enabled", [(None, False), (True, True), (False, False)])
def test_bf16_autocast_on_cpu_only_when_asked(flag, enabled):
    with bf16_autocast(torch.device("cpu"), flag):
        assert torch.is_autocast_enabled("cpu") == enabled
        assert (torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.bfloat16) == enabled


def test_bf16_is_on_by_default_for_cuda_only():
    assert bf16_enabled(torch.device("cuda"), None) and not bf16_enabled(torch.device("cpu"), None)
    assert not bf16_enabled(torch.device("cuda"), False) and bf16_enabled(torch.device("cpu"), True)


@pytest.mark.parametrize("native", [True, False])
def test_cpu_bf16_without_native_instructions_is_warned_about(monkeypatch, native):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_bf16_is_emulated(torch.device("cpu"), True)
        warn_if_bf16_is_emulated(torch.device("cpu"), None)  # float32: nothing to warn about
        warn_if_bf16_is_emulated(torch.device("cuda"), True)
    assert [str(w.message) for w in caught] == ([] if native else [
        "--bf16 on a CPU without native bf16 (no AVX512-BF16 or AMX): autocast is emulated and much slower than "
        "float32 here; leave --bf16 out on this machine"])


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
