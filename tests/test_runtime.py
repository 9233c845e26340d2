"""runtime.py: the device, bf16 autocast, seeding and moving batches."""
import random
import warnings

import numpy as np
import pytest
import torch

from runtime import bf16_autocast, bf16_enabled, resolve_device, seed_everything, to_device


@pytest.mark.parametrize("flag, enabled", [(None, False), (True, True), (False, False)])
def test_bf16_autocast_on_cpu_only_when_asked(flag, enabled):
    with bf16_autocast(torch.device("cpu"), flag):
        assert torch.is_autocast_enabled("cpu") == enabled
        assert (torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.bfloat16) == enabled


def test_bf16_is_on_by_default_for_cuda_only():
    assert bf16_enabled(torch.device("cuda"), None) and not bf16_enabled(torch.device("cpu"), None)
    assert not bf16_enabled(torch.device("cuda"), False) and bf16_enabled(torch.device("cpu"), True)


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
