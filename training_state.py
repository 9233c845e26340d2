"""The training state a run saves after every stage (OUTPUT_DIR/last.*) and --resume continues from: its
files, and the checks that a checkpoint fits the run that wants to continue it. What the state holds is the
trainer's (Trainer.state_dict / load_state_dict).

    save_training_state(output_dir / "last", *trainer.state_dict())
    tensors, metadata = read_training_state(output_dir / "last")
    check_resumable(metadata, world_size, stage_labels, data_sha256)  # refused, with the reason
    trainer.load_state_dict(tensors, metadata)
"""
from __future__ import annotations

from pathlib import Path

import torch

from base_bert import CheckpointError
from checkpoint import atomic_save, check_fields, read_checkpoint

TRAINING_STATE_FIELDS = {"args": dict, "data_sha256": dict, "next_stage": int, "history": list, "best_score": (int, float),
                         "updates": int, "optimizer": dict, "rng": dict, "smart_skipped_steps": dict}
OPTIONAL_FIELDS = {"grad_scaler": dict, "skipped_updates": int}


def save_training_state(prefix: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    """PREFIX.safetensors (tensors) and PREFIX.json (plain values), each replaced whole."""
    atomic_save(prefix, tensors, metadata)


def read_training_state(prefix: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """A saved training state, its fields checked (CheckpointError names the file and the field)."""
    tensors, metadata = read_checkpoint(prefix)
    check_fields(prefix.with_suffix(".json"), metadata, TRAINING_STATE_FIELDS)
    check_fields(prefix.with_suffix(".json"), metadata,  # added later: runs saved before lack them
                 {name: kind for name, kind in OPTIONAL_FIELDS.items() if name in metadata})
    return tensors, metadata


def check_resumable(metadata: dict, world_size: int, stage_labels: list[str], data_sha256: dict[str, str]) -> None:
    """Refuse a resume the saved state cannot continue: another number of processes, a schedule that the
    stages already done do not begin, or data whose content changed (a --distill teacher's scores included:
    "distill/TASK")."""
    saved_world = metadata.get("world_size", 1)
    if saved_world != world_size:  # each rank's data slice and dropout stream would differ
        raise CheckpointError(f"cannot resume: the run was trained by {saved_world} process(es), this one has "
                              f"{world_size}; resume with the same torchrun --nproc_per_node")
    done = [record["stage"] for record in metadata["history"] if record["index"] > 0]
    if done != stage_labels[:len(done)]:
        raise CheckpointError(f"cannot resume: the stages already done ({', '.join(done)}) do not begin "
                              "this run's schedule")
    changed = sorted(name for name in data_sha256.keys() & metadata["data_sha256"].keys()
                     if data_sha256[name] != metadata["data_sha256"][name])
    if changed:  # a split only one of the two runs reads cannot have changed what was trained
        raise CheckpointError(f"cannot resume: the data files' content differs from the stopped run's "
                              f"({', '.join(changed)})")
