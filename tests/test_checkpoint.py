"""checkpoint.py: atomic safetensors + JSON pairs, optimizer and RNG state round trips, the resume check."""
import dataclasses
import json
import random

import numpy as np
import pytest
import torch

from base_bert import CheckpointError
from minbert.model.checkpoint import (atomic_save, check_resume_settings, optimizer_state, read_checkpoint,
                                      restore_optimizer, restore_rng, rng_state)
from optimizer import AdamW


def test_checkpoint_halves_from_different_saves_are_detected(tmp_path):
    atomic_save(tmp_path / "a", {"w": torch.zeros(2)}, {"n": 1})
    atomic_save(tmp_path / "b", {"w": torch.ones(2)}, {"n": 2})
    assert read_checkpoint(tmp_path / "a")[1]["n"] == 1
    (tmp_path / "b.json").replace(tmp_path / "a.json")  # as if the JSON write of a later save finished alone
    with pytest.raises(CheckpointError, match="come from different saves"):
        read_checkpoint(tmp_path / "a")
    assert not list(tmp_path.glob("*.tmp"))


def test_round_trip_and_missing_half(tmp_path):
    tensors = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1, 2], dtype=torch.int64)}
    atomic_save(tmp_path / "sub" / "ckpt", tensors, {"path": tmp_path, "x": [1, 2]})  # non-JSON values as str
    read, metadata = read_checkpoint(tmp_path / "sub" / "ckpt")
    assert read.keys() == tensors.keys() and all(torch.equal(read[k], tensors[k]) for k in tensors)
    assert metadata["path"] == str(tmp_path) and metadata["x"] == [1, 2]
    (tmp_path / "sub" / "ckpt.json").unlink()
    with pytest.raises(CheckpointError, match="ckpt.json"):
        read_checkpoint(tmp_path / "sub" / "ckpt")


def make_linear_and_optimizer(optimizer_class=AdamW):
    """A seeded 3 -> 2 linear layer and an optimizer of it: the weight decayed, the bias not."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, optimizer_class([{"params": [model.weight], "weight_decay": 0.1},
                                   {"params": [model.bias], "weight_decay": 0.0}], lr=1e-2)


def train_step(model, optimizer, seed):
    torch.manual_seed(seed)
    model(torch.randn(4, 3)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_optimizer_state_round_trips_and_continues_identically(tmp_path):
    make, step = make_linear_and_optimizer, train_step
    model, optimizer = make()
    for seed in range(3):
        step(model, optimizer, seed)
    tensors, info = optimizer_state(optimizer)
    atomic_save(tmp_path / "opt", {**tensors, **{f"model.{k}": v for k, v in model.state_dict().items()}}, info)
    step(model, optimizer, 3)

    tensors, info = read_checkpoint(tmp_path / "opt")
    restored_model, restored = make()
    restored_model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    restore_optimizer(restored, tensors, info)
    assert [g["weight_decay"] for g in restored.param_groups] == [0.1, 0.0]
    step(restored_model, restored, 3)
    assert torch.equal(restored_model.weight, model.weight) and torch.equal(restored_model.bias, model.bias)


def test_optimizer_state_of_device_step_counts_and_a_tensor_rate_reads_as_numbers_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    rate = torch.tensor(1e-2, dtype=torch.float64)
    optimizer = AdamW([{"params": [model.weight], "lr": rate, "weight_decay": 0.1}, {"params": [model.bias]}])
    for step in range(3):
        model(torch.randn(4, 3)).square().sum().backward()
        if step == 1:
            model.bias.grad = None  # the bias steps twice, the weight three times
        optimizer.step()
        optimizer.zero_grad()
    rate.fill_(3e-3)
    tensors, info = optimizer_state(optimizer)
    atomic_save(tmp_path / "opt", tensors, info)
    # The JSON as it read when step counts and rates were Python numbers, so an older loader reads it too.
    saved = json.loads((tmp_path / "opt.json").read_text())
    assert saved["steps"] == {"0": 3, "1": 2} and [group["lr"] for group in saved["param_groups"]] == [3e-3, 1e-3]

    tensors, info = read_checkpoint(tmp_path / "opt")
    restored_rate = torch.tensor(0.5, dtype=torch.float64)
    restored = AdamW([{"params": [model.weight], "lr": restored_rate, "weight_decay": 0.1}, {"params": [model.bias]}])
    restore_optimizer(restored, tensors, info)
    assert restored.param_groups[0]["lr"] is restored_rate and restored_rate.item() == 3e-3
    for p in model.parameters():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(restored.state[p][key], optimizer.state[p][key]), key
        assert restored.state[p]["step"].dtype == torch.float64


def test_optimizer_state_saved_with_integer_step_counts_resumes_the_run(tmp_path):
    # ReferenceAdamW keeps Python-int step counts and host step sizes, as AdamW did before; its save is what
    # --resume finds in a checkpoint written then.
    from test_optimizer import ReferenceAdamW, assert_within_1_ulp
    make, step = make_linear_and_optimizer, train_step

    old_model, old = make(ReferenceAdamW)
    for seed in range(3):
        step(old_model, old, seed)
    tensors, info = optimizer_state(old)
    assert info["steps"] == {"0": 3, "1": 3}
    atomic_save(tmp_path / "old", {**tensors, **{f"model.{k}": v for k, v in old_model.state_dict().items()}}, info)
    for seed in (3, 4):
        step(old_model, old, seed)

    tensors, info = read_checkpoint(tmp_path / "old")
    model, optimizer = make(AdamW)
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    restore_optimizer(optimizer, tensors, info)
    assert [optimizer.state[p]["step"].item() for p in model.parameters()] == [3, 3]
    for seed in (3, 4):
        step(model, optimizer, seed)
    for p, q in zip(model.parameters(), old_model.parameters()):
        assert_within_1_ulp(p.detach(), q.detach())


def test_rng_state_round_trips_every_generator(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    tensors, info = rng_state()
    atomic_save(tmp_path / "rng", tensors, info)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    tensors, info = read_checkpoint(tmp_path / "rng")
    restore_rng(tensors, info)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_resume_check_names_the_changed_settings_and_ignores_free_ones():
    saved = {"lr": 1e-3, "cycles": 2, "quiet": False, "output_dir": "runs/a"}
    check_resume_settings(saved, {**saved, "quiet": True, "output_dir": "runs/b/"}, free={"quiet", "output_dir"})
    with pytest.raises(CheckpointError, match=r"cannot resume: 2 flag\(s\) differ .*--cycles 2 -> 3, --lr 0.001 -> 0.01"):
        check_resume_settings(saved, {**saved, "lr": 1e-2, "cycles": 3}, free={"quiet"})
    with pytest.raises(CheckpointError, match="--pooling None -> 'mean'"):  # a setting the stopped run did not have
        check_resume_settings(saved, {**saved, "pooling": "mean"}, free=set())


def test_a_flag_added_after_the_run_began_resumes_at_its_default_only():
    saved = {"lr": 1e-3, "cycles": 2}
    check_resume_settings(saved, {**saved, "mlm_epochs": 0}, free=set(), defaults={"mlm_epochs": 0, "lr": 5e-5})
    with pytest.raises(CheckpointError, match="--mlm_epochs 0 -> 1"):
        check_resume_settings(saved, {**saved, "mlm_epochs": 1}, free=set(), defaults={"mlm_epochs": 0})


def test_every_training_flag_has_a_default_that_a_run_resumes_with():
    from minbert.run.training_args import TrainingArguments, build_parser, field_defaults, from_namespace
    parsed = dataclasses.asdict(from_namespace(TrainingArguments, build_parser(TrainingArguments).parse_args([])))
    assert field_defaults(TrainingArguments) == parsed


def test_resume_check_compares_values_as_they_read_back_from_json():
    from pathlib import Path
    saved = {"data_files": {"sst_train": None}, "simcse_data": ["a.csv"], "output_dir": "x"}
    # A Path for its string and a tuple for its list are the same settings once written to JSON: no CheckpointError.
    check_resume_settings(saved, {"data_files": {"sst_train": None}, "simcse_data": ("a.csv",),
                                  "output_dir": Path("x")}, free=set())
    # Compared after that round trip, not waved through: other values in those types are named.
    with pytest.raises(CheckpointError, match=r"2 flag\(s\) differ .*\(--output_dir 'x' -> 'y', "
                                              r"--simcse_data \['a.csv'\] -> \['b.csv'\]\)"):
        check_resume_settings(saved, {"data_files": {"sst_train": None}, "simcse_data": ("b.csv",),
                                      "output_dir": Path("y")}, free=set())
