"""What the run's flags resolve to: `resolve_run_settings` turns every flag the training objects read into the
dataclasses they are built from (each penalty's settings are its file's, minbert/training/penalties/), in one pass:

    settings = resolve_run_settings(args, num_layers, device)     # plain values, nothing built yet
    settings.loop, settings.optimizer, settings.penalties, ...    # what run_setup.build_trainer builds from

training_args.py defines, parses and validates the flags, and holds what its validation reads of several of them
(the run's tasks, its schedule, the adapters: a bad combination is refused before anything is read); this module
builds on it, and run_setup.py builds the run from what the flags resolve to.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from minbert.run.training_args import CUDA_SAVE_MINUTES, TrainingArguments
from minbert.runtime import pad_to_multiple_of, resolve_precision
from minbert.tasks import task_settings
from minbert.training.captured_step import capture_backend
from minbert.training.loop import LoopConfig
from minbert.training.penalties import PENALTY_KINDS, PenaltySettings
from minbert.training.stage_transitions import TransitionSettings


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW's (optimization.build_optimizer)."""
    lr: float
    weight_decay: float
    layerwise_lr_decay: float
    compiled: bool  # the encoder's layers are compiled: a fused optimizer step too
    bf16_weights: bool = False  # bf16 copies of the weights kept between steps (precision.keep_bf16_copies)


@dataclass(frozen=True)
class SimcseSettings:
    """A SimCSE stage's loss (training/simcse.py's SIMCSE_OBJECTIVES) and its learning rate."""
    objective: str
    temperature: float
    lr: float


@dataclass(frozen=True)
class RunSettings:
    """Everything run_setup.build_trainer builds a run's objects from. `record`: the flags as plain values, which
    every checkpoint saves and --resume checks."""
    loop: LoopConfig
    optimizer: OptimizerSettings
    simcse: SimcseSettings
    gradient_surgery: str  # gradient_surgery.GRADIENT_SURGERIES, or "none"
    cagrad_c: float
    penalties: PenaltySettings
    task_settings: dict[str, object]
    record: dict


def resolve_run_settings(args: TrainingArguments, num_layers: int, device: torch.device) -> RunSettings:
    """The run's settings resolved for a model of `num_layers` layers on `device` (the precision, the checkpoints'
    interval and the length buckets follow the device). The flags are validated, their task names already the
    internal ones (training_args.validate), so this is one pass that reads them."""
    penalties = penalty_settings(args, num_layers)
    minutes = save_minutes(args.save_every_minutes, device)
    own_options = task_settings(vars(args))
    precision = resolve_precision(device, args.precision)
    padding = pad_to_multiple_of(device, args.compile or args.capture_step)
    loop = LoopConfig(output_dir=Path(args.output_dir), lr=args.lr, seed=args.seed, batch_size=args.batch_size,
                      eval_batch_size=args.eval_batch_size, max_length=args.max_length, num_workers=args.num_workers,
                      grad_accumulation_steps=args.grad_accumulation_steps, max_grad_norm=args.max_grad_norm,
                      lr_schedule=args.lr_schedule, warmup_ratio=args.warmup_ratio, schedule=args.schedule,
                      epochs=args.epochs, precision=precision, quiet=args.quiet,
                      stop_after_stages=args.stop_after_stages, keep_stage_models=args.keep_stage_models,
                      eval_train_examples=args.eval_train_examples,
                      max_eval_examples=args.max_eval_examples, logging_steps=args.logging_steps,
                      report_to=args.report_to, save_steps=args.save_steps, save_every_minutes=minutes,
                      save_total_limit=args.save_total_limit,
                      transitions=TransitionSettings(args.patience, args.stage_start, args.simcse_keep),
                      pad_to_multiple_of=padding,
                      capture_step=capture_backend(device) if args.capture_step else None)
    return RunSettings(loop=loop,
                       optimizer=OptimizerSettings(args.lr, args.weight_decay, args.layerwise_lr_decay, args.compile,
                                                           args.bf16_weights),
                       simcse=SimcseSettings(args.simcse_objective, args.simcse_temperature, args.simcse_lr),
                       gradient_surgery=args.gradient_surgery, cagrad_c=args.cagrad_c, penalties=penalties,
                       task_settings=own_options, record=asdict(args))


def penalty_settings(args: TrainingArguments, num_layers: int) -> PenaltySettings:
    """Each penalty's settings (PenaltySettings): its flags' values, the run's tasks and the model's `num_layers`
    (LNSR's default layer)."""
    return PenaltySettings({name: SimpleNamespace(**{flag: getattr(args, flag) for flag in kind.flags},
                                                  tasks=args.tasks, num_layers=num_layers)
                            for name, kind in PENALTY_KINDS.items()})


def save_minutes(requested: float | None, device: torch.device) -> float:
    """--save_every_minutes for the device: as given, or by default every CUDA_SAVE_MINUTES on a GPU (a Colab session
    may end at any moment) and never on the CPU (short runs, whose saves would cost more than they keep)."""
    if requested is not None:
        return requested
    return CUDA_SAVE_MINUTES if device.type == "cuda" else 0.0
