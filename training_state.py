"""The training state a run saves after every stage (OUTPUT_DIR/last.*) and --resume continues from.

    save_training_state(trainer, output_dir / "last")
    resume_training(trainer, output_dir / "last", stages)    # refused, with the reason, when it cannot fit
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from base_bert import CheckpointError
from checkpoint import (atomic_save, check_fields, check_resume_settings, optimizer_state, read_checkpoint,
                        restore_optimizer, restore_rng, rng_state)
from multitask_bert import load_trained_tensors, model_metadata, trained_tensors
from schedules import Stage
from training_args import field_defaults, resume_free_fields

if TYPE_CHECKING:  # the trainer saves its state through this module
    from trainer import Trainer

TRAINING_STATE_FIELDS = {"args": dict, "data_sha256": dict, "next_stage": int, "history": list, "best_score": (int, float),
                         "updates": int, "optimizer": dict, "rng": dict, "smart_skipped_steps": dict}
OPTIONAL_FIELDS = {"grad_scaler": dict, "skipped_updates": int}


def save_training_state(trainer: Trainer, prefix: Path) -> None:
    """Everything --resume needs after a finished stage: the model (or what of it trains), optimizer, SMART
    teacher, MLM head, RNG states, history and schedule position. Under torchrun every rank calls it
    (each one's dropout generator is kept) and rank 0 writes."""
    rng_tensors, rng_info = rng_state()
    ranks = trainer.distributed.gather_objects(rng_tensors)
    if not trainer.distributed.is_main:
        return
    for rank, rank_tensors in enumerate(ranks[1:], start=1):
        rng_tensors.update({f"{name}.rank{rank}": tensor for name, tensor in rank_tensors.items()})
    tensors = {f"model.{k}": v for k, v in trained_tensors(trainer.model).items()}
    optimizer_tensors, optimizer_info = optimizer_state(trainer.optimizer)
    tensors.update(optimizer_tensors)
    tensors.update(rng_tensors)
    if trainer.teacher is not None:
        tensors.update({f"teacher.{k}": v.contiguous() for k, v in trainer.teacher.state_dict().items()})
    if trainer.mlm_head is not None:
        tensors.update({f"mlm_head.{k}": v.detach().contiguous() for k, v in trainer.mlm_head.state_dict().items()})
    atomic_save(prefix, tensors, {
        **model_metadata(trainer.model), "args": dataclasses.asdict(trainer.args), "next_stage": trainer.next_stage,
        "history": trainer.history, "best_score": trainer.best_score, "updates": trainer.updates,
        "data_sha256": trainer.data_sha256, "world_size": trainer.distributed.world_size,
        "optimizer": optimizer_info, "rng": rng_info,
        "smart_skipped_steps": {t: r.skipped_steps for t, r in trainer.regularizers.items()},
        # The fp16 gradient scaler's scale and growth counter (plain numbers; {} without fp16).
        "grad_scaler": trainer.scaler.state_dict(), "skipped_updates": trainer.skipped_updates})

def resume_training(trainer: Trainer, prefix: Path, stages: list[Stage]) -> None:
    """Continue from a training state: refused when a setting that changes the result differs, or
    when the stages already done do not begin `stages`."""
    tensors, metadata = read_checkpoint(prefix)
    check_fields(prefix.with_suffix(".json"), metadata, TRAINING_STATE_FIELDS)
    check_fields(prefix.with_suffix(".json"), metadata,  # added later: runs saved before lack them
                 {name: kind for name, kind in OPTIONAL_FIELDS.items() if name in metadata})
    free = resume_free_fields(type(trainer.args))
    if trainer.args.lr_schedule != "constant" or (trainer.regularizers and trainer.args.smart_momentum is None):
        saved = metadata["args"].get("cycles")
        if saved != trainer.args.cycles:
            raise CheckpointError(f"cannot resume: --cycles {saved!r} -> {trainer.args.cycles!r} changes the total "
                                  "number of updates, which the learning rate or SMART's momentum follows; "
                                  f"resume with --cycles {saved}")
    check_resume_settings(metadata["args"], dataclasses.asdict(trainer.args), free, field_defaults(type(trainer.args)))
    saved_world = metadata.get("world_size", 1)
    if saved_world != trainer.distributed.world_size:  # each rank's data slice and dropout stream would differ
        raise CheckpointError(f"cannot resume: the run was trained by {saved_world} process(es), this one has "
                              f"{trainer.distributed.world_size}; resume with the same torchrun --nproc_per_node")
    try:
        _restore(trainer, tensors, metadata)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{prefix}: cannot resume with these flags; the checkpoint was saved by a "
                              f"different model, optimizer or SMART setup ({type(err).__name__}: {err})") from None
    done = [record["stage"] for record in trainer.history if record["index"] > 0]
    if done != [stage.label for stage in stages[:len(done)]]:
        raise CheckpointError(f"cannot resume: the stages already done ({', '.join(done)}) do not begin "
                              "this run's schedule")
    changed = sorted(name for name in trainer.data_sha256.keys() & metadata["data_sha256"].keys()
                     if trainer.data_sha256[name] != metadata["data_sha256"][name])
    if changed:  # a split only one of the two runs reads cannot have changed what was trained
        raise CheckpointError(f"cannot resume: the data files' content differs from the stopped run's "
                              f"({', '.join(changed)})")
    # A kill between a stage's log line and its checkpoint leaves a record the checkpoint does not
    # have: the checkpoint's history is the truth.
    if trainer.distributed.is_main:
        (trainer.output_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trainer.history),
                                                        encoding="utf-8")

def _restore(trainer: Trainer, tensors: dict, metadata: dict) -> None:
    load_trained_tensors(trainer.model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    restore_optimizer(trainer.optimizer, tensors, metadata["optimizer"])
    if trainer.teacher is not None:
        trainer.teacher.load_state_dict({k[8:]: v.to(trainer.device) for k, v in tensors.items()
                                      if k.startswith("teacher.")})
    if trainer.mlm_head is not None:
        trainer.mlm_head.load_state_dict({k[9:]: v for k, v in tensors.items() if k.startswith("mlm_head.")})
    for task, skipped in metadata["smart_skipped_steps"].items():
        if task in trainer.regularizers:
            trainer.regularizers[task].skipped_steps = skipped
    # A run saved before these fields existed, or in another precision (a resume on another GPU kind), starts a
    # fresh scaler, as a run does.
    if trainer.scaler.is_enabled() and metadata.get("grad_scaler"):
        trainer.scaler.load_state_dict(metadata["grad_scaler"])
    trainer.skipped_updates = metadata.get("skipped_updates", 0)
    restore_rng(tensors, metadata["rng"])
    if trainer.distributed.rank > 0:
        suffix = f".rank{trainer.distributed.rank}"
        restore_rng({name[:-len(suffix)]: tensor for name, tensor in tensors.items() if name.endswith(suffix)},
                    metadata["rng"])
    trainer.history, trainer.best_score = metadata["history"], metadata["best_score"]
    trainer.next_stage, trainer.updates = metadata["next_stage"], metadata["updates"]
