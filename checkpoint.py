"""Checkpoints: tensors in safetensors, everything else in JSON beside them; nothing is ever unpickled.

A checkpoint PREFIX is the pair PREFIX.safetensors + PREFIX.json, written by `atomic_save` and read by
`read_checkpoint`. The training state that `--resume` needs (optimizer moments, RNG states) is turned
into tensors and JSON here; the trainer decides what goes in a checkpoint.
"""
from __future__ import annotations

import json
import os
import random
import uuid
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from base_bert import CheckpointError


def atomic_save(prefix: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    """Write PREFIX.safetensors then PREFIX.json, each via a temporary file and os.replace.

    Both carry the same random checkpoint id, so a crash between the two replaces is detected on
    reading instead of pairing new weights with old metadata.
    """
    prefix.parent.mkdir(parents=True, exist_ok=True)
    weights, info = prefix.with_suffix(".safetensors"), prefix.with_suffix(".json")
    checkpoint_id = uuid.uuid4().hex
    save_file({k: v.cpu() for k, v in tensors.items()}, str(weights) + ".tmp", metadata={"checkpoint_id": checkpoint_id})
    os.replace(str(weights) + ".tmp", weights)
    info.with_suffix(".json.tmp").write_text(json.dumps({**metadata, "checkpoint_id": checkpoint_id}, indent=1,
                                                        default=str), encoding="utf-8")
    os.replace(info.with_suffix(".json.tmp"), info)


def read_checkpoint(prefix: Path) -> tuple[dict[str, torch.Tensor], dict]:
    weights, info = prefix.with_suffix(".safetensors"), prefix.with_suffix(".json")
    if not weights.is_file() or not info.is_file():
        raise CheckpointError(f"{prefix}: checkpoint needs both {weights.name} and {info.name}")
    try:
        with safe_open(str(weights), "pt") as handle:  # one read: the save id and the tensors
            weights_id = (handle.metadata() or {}).get("checkpoint_id")
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = json.loads(info.read_text(encoding="utf-8"))
    except Exception as err:
        raise CheckpointError(f"{prefix}: cannot read checkpoint ({type(err).__name__}: {err})") from None
    if weights_id != metadata.get("checkpoint_id"):
        raise CheckpointError(f"{prefix}: {weights.name} and {info.name} come from different saves "
                              "(a write was interrupted); use the other checkpoint or start again")
    return tensors, metadata


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """AdamW's moments as tensors 'optimizer.<index>.exp_avg(_sq)', its steps and groups as JSON."""
    state = optimizer.state_dict()
    tensors, steps = {}, {}
    for index, moments in state["state"].items():
        tensors[f"optimizer.{index}.exp_avg"] = moments["exp_avg"].contiguous()
        tensors[f"optimizer.{index}.exp_avg_sq"] = moments["exp_avg_sq"].contiguous()
        steps[str(index)] = int(moments["step"])
    return tensors, {"steps": steps, "param_groups": state["param_groups"]}


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], saved: dict) -> None:
    state = {int(index): {"step": step, "exp_avg": tensors[f"optimizer.{index}.exp_avg"],
                          "exp_avg_sq": tensors[f"optimizer.{index}.exp_avg_sq"]}
             for index, step in saved["steps"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


def rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """The torch (and CUDA) generators as tensors; Python's and NumPy's global generators as JSON."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    return tensors, {"python": [python_state[0], list(python_state[1]), python_state[2]],
                     "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]]}


def restore_rng(tensors: dict[str, torch.Tensor], saved: dict) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    python_state = saved["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    numpy_state = saved["numpy"]
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))


def check_resume_settings(saved: dict, current: dict, free: set[str]) -> None:
    """Refuse to resume when a setting outside `free` (those that cannot change the result) differs."""
    current = json.loads(json.dumps(current, default=str))  # as it would read back from the checkpoint
    changed = sorted(k for k in saved.keys() | current.keys() if k not in free and saved.get(k) != current.get(k))
    if changed:
        details = ", ".join(f"--{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in changed[:4])
        raise CheckpointError(f"cannot resume: {len(changed)} flag(s) differ from the stopped run ({details}); "
                              "rerun with the original flags plus --resume")
