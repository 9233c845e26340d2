"""Checkpoints: tensors in safetensors, everything else in JSON beside them; nothing is ever unpickled.

A checkpoint PREFIX is the pair PREFIX.safetensors + PREFIX.json, written by `atomic_save` and read by
`read_checkpoint`. The training state that `--resume` needs (optimizer moments, RNG states) is turned
into tensors and JSON here; the trainer decides what goes in a checkpoint.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from base_bert import CheckpointError
from minbert.files import file_sha256, locked_folder, write_aside

MT19937_KEYS = 624  # the words of NumPy's Mersenne Twister state


def atomic_save(prefix: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    """Write PREFIX.safetensors + PREFIX.json so that a kill at any moment leaves a complete checkpoint.

    Both files are first written in full under .tmp names (files.write_aside); the JSON (with the weights' SHA-256)
    is then moved into place, and the weights last. A kill between the two moves leaves the new JSON beside
    the old weights and the new weights under .tmp: read_checkpoint (or settle_interrupted_saves) finishes that
    save. A kill before the first move leaves the previous checkpoint untouched.
    """
    weights, info = prefix.with_suffix(".safetensors"), prefix.with_suffix(".json")
    on_cpu = {k: v.cpu() for k, v in tensors.items()}
    pending_weights = write_aside(weights, lambda path: save_tensors(on_cpu, path), _pending(weights))
    text = json.dumps({**metadata, "sha256": file_sha256(pending_weights)}, indent=1, default=str)
    pending_info = write_aside(info, lambda path: path.write_text(text, encoding="utf-8"), _pending(info))
    os.replace(pending_info, info)
    os.replace(pending_weights, weights)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, its I/O errors (a full disk) raised as the OSErrors they are, which files.write_aside
    reports in one line naming the file."""
    try:
        save_file(tensors, str(path), metadata)
    except SafetensorError as err:
        raise OSError(f"cannot save the tensors ({err})") from None


def _pending(path: Path) -> Path:
    return path.with_name(path.name + PENDING)


PENDING = ".tmp"  # a checkpoint file written whole, waiting for its move (atomic_save)


@contextmanager
def checkpoint_folder(folder: str | os.PathLike) -> Iterator[None]:
    """files.locked_folder for a command that saves checkpoints in `folder`: holding the lock, it first settles the
    saves a kill interrupted there (settle_interrupted_saves), so --resume and a fresh run open a folder without
    half-done writes."""
    with locked_folder(folder):
        settle_interrupted_saves(Path(folder))
        yield


def settle_interrupted_saves(folder: Path) -> list[Path]:
    """Every checkpoint save in `folder` that a kill interrupted, settled: finished when its JSON was moved into
    place (the pending weights are those it names, as read_checkpoint would find), else its pending files removed
    (the previous checkpoint is whole beside them). Returns those removed. For the holder of the folder's lock
    (files.locked_folder): no save is under way there then."""
    removed = []
    for pending in sorted(folder.glob(f"*.safetensors{PENDING}")) + sorted(folder.glob(f"*.json{PENDING}")):
        if not pending.is_file():
            continue
        if pending.name.endswith(f".safetensors{PENDING}") and _completes_its_save(pending):
            os.replace(pending, pending.with_name(pending.name.removesuffix(PENDING)))
        else:
            pending.unlink()
            removed.append(pending)
    return removed


def _completes_its_save(pending_weights: Path) -> bool:
    info = pending_weights.with_name(pending_weights.name.removesuffix(f".safetensors{PENDING}") + ".json")
    try:
        return json.loads(info.read_text(encoding="utf-8")).get("sha256") == file_sha256(pending_weights)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        return False


def read_checkpoint(prefix: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the JSON metadata of a checkpoint, checked to belong together, with finite weights."""
    weights, info = prefix.with_suffix(".safetensors"), prefix.with_suffix(".json")
    if not info.is_file() and not weights.is_file():
        raise CheckpointError(f"{prefix}: no checkpoint here ({weights.name}, {info.name})")
    if not weights.is_file() and not _pending(weights).is_file():
        raise CheckpointError(f"{prefix}: checkpoint needs both {weights.name} and {info.name}")
    metadata = _read_json(info)
    if "sha256" not in metadata or not isinstance(metadata["sha256"], str):
        raise CheckpointError(f"{info}: no 'sha256' of the weights; not a checkpoint of this project")
    if not weights.is_file() or file_sha256(weights) != metadata["sha256"]:
        if _pending(weights).is_file() and file_sha256(_pending(weights)) == metadata["sha256"]:
            os.replace(_pending(weights), weights)  # finish the save that a kill interrupted
        else:
            raise CheckpointError(f"{prefix}: {weights.name} and {info.name} come from different saves or the "
                                  "weights were altered (SHA-256 differs); use another checkpoint or start again")
    try:
        with safe_open(str(weights), "pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as err:
        raise CheckpointError(f"{weights}: cannot read the weights ({type(err).__name__}: {err})") from None
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{weights}: tensor {key!r} holds NaN or infinite values")
    return tensors, metadata


def _read_json(info: Path) -> dict:
    if not info.is_file():
        raise CheckpointError(f"{info}: missing; a checkpoint needs it beside its weights")
    try:
        metadata = json.loads(info.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{info}: not valid JSON ({err})") from None
    except RecursionError:  # json's decoder recurses once per nested list or object
        raise CheckpointError(f"{info}: not a checkpoint's JSON (nested too deeply to read)") from None
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{info}: expected a JSON object, found a {type(metadata).__name__}")
    return metadata


def check_fields(info: Path, metadata: dict, expected: dict[str, type | tuple[type, ...]]) -> None:
    """One clear line when a (hand-edited) checkpoint JSON lacks a field or holds the wrong kind of value."""
    for name, kind in expected.items():
        if name not in metadata:
            raise CheckpointError(f"{info}: field {name!r} is missing")
        kinds = kind if isinstance(kind, tuple) else (kind,)
        value = metadata[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is no int
            names = "/".join(k.__name__ for k in kinds)
            raise CheckpointError(f"{info}: field {name!r} must be {names}, found {type(value).__name__}")


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """AdamW's moments as tensors 'optimizer.<index>.exp_avg(_sq)', its steps and groups as JSON. Step counts (and
    a learning rate) that AdamW holds as device tensors are written as the numbers they hold, read back to the
    host here at the save: the JSON reads as it did when they were Python numbers. A state that no step has moved
    (AdamW.initial_state's, made ahead of the first gradient) is left out, as if it were not there yet."""
    state = optimizer.state_dict()
    tensors, steps = {}, {}
    for index, moments in state["state"].items():
        if int(moments["step"]) == 0:  # created ahead of a step (captured_step.py): what no state starts from
            continue
        tensors[f"optimizer.{index}.exp_avg"] = moments["exp_avg"].contiguous()
        tensors[f"optimizer.{index}.exp_avg_sq"] = moments["exp_avg_sq"].contiguous()
        steps[str(index)] = int(moments["step"])
    groups = [{key: value.item() if torch.is_tensor(value) else value for key, value in group.items()}
              for group in state["param_groups"]]
    return tensors, {"steps": steps, "param_groups": groups}


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], saved: dict) -> None:
    """optimizer_state's save loaded into `optimizer`; AdamW.load_state_dict puts the step counts on the device.
    The saved groups replace the optimizer's: their settings (all but the learning rate, which follows its schedule)
    must be those the run's flags gave it (ValueError), or a damaged one would train on with other settings."""
    for index, (group, saved_group) in enumerate(zip(optimizer.param_groups, saved["param_groups"])):
        for key in group.keys() & saved_group.keys() - {"params", "lr"}:
            value, saved_value = (json.loads(json.dumps(v, default=str)) for v in (group[key], saved_group[key]))
            if saved_value != value:  # as JSON holds them: tuples as lists
                raise ValueError(f"optimizer.param_groups[{index}] {key} {saved_value!r} is not the {value!r} the "
                                 "run's flags give")
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
    random.setstate(python_generator_state(saved["python"]))
    np.random.set_state(_numpy_generator_state(saved["numpy"]))


def python_generator_state(saved: list) -> tuple:
    """A Python generator's state as rng_state (and a multi-task epoch's position) writes it in JSON, as
    random.setstate takes it."""
    version, state, gauss = saved
    return version, tuple(state), gauss


def _numpy_generator_state(saved: list) -> tuple:
    name, keys, position, *gauss = saved
    # NumPy takes any position, and then draws other numbers
    if len(keys) != MT19937_KEYS or not (isinstance(position, int) and 0 <= position <= MT19937_KEYS):
        raise ValueError(f"expected {MT19937_KEYS} keys and a position from 0 to {MT19937_KEYS}, found {len(keys)} "
                         f"and {position!r}")
    return name, np.array(keys, dtype=np.uint32), position, *gauss


def rng_info_problem(saved: dict) -> str | None:
    """Why rng_state's JSON part cannot go back into the generators (None: it can), tried on throwaway ones: a
    damaged state would otherwise fail halfway through a resume's restore, or draw other numbers."""
    for name, restore in (("python", lambda state: random.Random().setstate(python_generator_state(state))),
                          ("numpy", lambda state: np.random.RandomState().set_state(_numpy_generator_state(state)))):
        try:
            restore(saved[name])
        except (KeyError, IndexError, TypeError, ValueError, OverflowError) as err:
            return f"rng.{name} is not a {name} generator state ({type(err).__name__}: {err})"
    return None


def gather_rank_states(distributed, local: dict[str, torch.Tensor] | None = None
                       ) -> tuple[dict[str, torch.Tensor], dict] | None:
    """Every rank's RNG states and `local` tensors for a checkpoint, on rank 0: its own by their names, rank R's as
    NAME.rankR, and rank 0's Python and NumPy states as JSON; None on the other ranks. A collective under torchrun
    (`distributed`: distributed.Distributed): every rank calls it."""
    rng_tensors, rng_info = rng_state()
    own = rng_tensors | {name: tensor.cpu() for name, tensor in (local or {}).items()}
    ranks = distributed.gather_objects(own)
    if not distributed.is_main:
        return None
    for rank, rank_tensors in enumerate(ranks[1:], start=1):
        own.update({f"{name}.rank{rank}": tensor for name, tensor in rank_tensors.items()})
    return own, rng_info


def rank_states(tensors: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """The tensors gather_rank_states saved for `rank`, by their names without the rank suffix (rank 0: all)."""
    if rank == 0:
        return tensors
    suffix = f".rank{rank}"
    return {name[:-len(suffix)]: tensor for name, tensor in tensors.items() if name.endswith(suffix)}


def changed_settings(saved: dict, current: dict, free: set[str],
                     defaults: dict | None = None) -> list[tuple[str, object, object]]:
    """(setting, its value in `saved`, in `current`) of each setting outside `free` (those that cannot change the
    result) in which `current` differs from `saved`, a checkpoint's recorded args, sorted; `current` as it would read
    back from a checkpoint. A setting `saved` does not have came with a later version of the code, and reads as its
    entry in `defaults`: a new flag's default keeps what the code did before it existed."""
    current = json.loads(json.dumps(current, default=str))
    added = json.loads(json.dumps({k: v for k, v in (defaults or {}).items() if k not in saved}, default=str))
    saved = {**added, **saved}
    return [(k, saved.get(k), current.get(k)) for k in sorted(saved.keys() | current.keys())
            if k not in free and saved.get(k) != current.get(k)]


def check_resume_settings(saved: dict, current: dict, free: set[str], defaults: dict | None = None) -> None:
    """Refuse to resume when a setting outside `free` (those that cannot change the result) differs
    (changed_settings)."""
    changed = changed_settings(saved, current, free, defaults)
    if changed:
        details = ", ".join(f"--{k} {before!r} -> {after!r}" for k, before, after in changed[:4])
        raise CheckpointError(f"cannot resume: {len(changed)} flag(s) differ from the stopped run ({details}); "
                              "rerun with the original flags plus --resume")
