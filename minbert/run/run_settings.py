"""What the run's flags resolve to: the settings derived from several flags (the run's tasks, its schedule, SMART's
per-task configs, LNSR's layer, the distillation teachers, the adapters), and `resolve_run_settings`, which turns
every flag the training objects read into the dataclasses they are built from, in one pass:

    settings = resolve_run_settings(args, num_layers, device)     # plain values, nothing built yet
    settings.loop, settings.optimizer, settings.penalties, ...    # what run_setup.build_trainer builds from

training_args.py defines, parses and validates the flags (its validation calls the functions here, so a bad
combination is refused before anything is read); run_setup.py builds the run from what they resolve to.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from minbert.model.adapters import AdapterConfig
from minbert.runtime import pad_to_multiple_of, resolve_precision
from minbert.tasks import task_settings
from minbert.training.distillation import DISTILLED_TASKS
from minbert.training.lnsr import LnsrConfig
from minbert.training.loop import LoopConfig
from minbert.training.penalties import PENALTY_KINDS, PenaltySettings, SmartSettings
from minbert.training.schedules import Stage, build_schedule, train_tasks
from minbert.training.stage_transitions import TransitionSettings
from smart import SmartConfig

if TYPE_CHECKING:
    from minbert.run.training_args import TrainingArguments

CUDA_SAVE_MINUTES = 20.0  # --save_every_minutes' default on a GPU: what a Colab disconnect can lose at most


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW's (optimization.build_optimizer)."""
    lr: float
    weight_decay: float
    layerwise_lr_decay: float
    compiled: bool  # the encoder's layers are compiled: a fused optimizer step too


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
    precision, padding = resolve_precision(device, args.precision), pad_to_multiple_of(device, args.compile)
    loop = LoopConfig(output_dir=Path(args.output_dir), lr=args.lr, seed=args.seed, batch_size=args.batch_size,
                      eval_batch_size=args.eval_batch_size, max_length=args.max_length, num_workers=args.num_workers,
                      grad_accumulation_steps=args.grad_accumulation_steps, max_grad_norm=args.max_grad_norm,
                      lr_schedule=args.lr_schedule, warmup_ratio=args.warmup_ratio, schedule=args.schedule,
                      epochs=args.epochs, precision=precision, quiet=args.quiet,
                      stop_after_stages=args.stop_after_stages, keep_stage_models=args.keep_stage_models,
                      eval_train_examples=args.eval_train_examples,
                      max_eval_examples=args.max_eval_examples, logging_steps=args.logging_steps,
                      report_to=args.report_to, save_steps=args.save_steps, save_every_minutes=minutes,
                      transitions=TransitionSettings(args.patience, args.stage_start, args.simcse_keep),
                      pad_to_multiple_of=padding)
    return RunSettings(loop=loop,
                       optimizer=OptimizerSettings(args.lr, args.weight_decay, args.layerwise_lr_decay, args.compile),
                       simcse=SimcseSettings(args.simcse_objective, args.simcse_temperature, args.simcse_lr),
                       gradient_surgery=args.gradient_surgery, cagrad_c=args.cagrad_c, penalties=penalties,
                       task_settings=own_options, record=asdict(args))


def penalty_settings(args: TrainingArguments, num_layers: int) -> PenaltySettings:
    """The penalties' settings (PenaltySettings) for a model of `num_layers` layers (LNSR's default layer)."""
    distillation = {task: (setting["weight"], setting["temperature"])
                    for task, setting in distill_settings(args).items()}
    smart_tasks = regularized_tasks(args)
    smart = None
    if smart_tasks:
        configs = smart_configs(args)
        smart = SmartSettings({task: configs[task] for task in smart_tasks}, args.smart_momentum,
                              args.smart_momentum_schedule, args.smart_anchor)
    lnsr = {task: lnsr_config(args, num_layers) for task in lnsr_tasks(args)}
    kinds = {name: SimpleNamespace(**{flag: getattr(args, flag) for flag in kind.flags})
             for name, kind in PENALTY_KINDS.items()}
    return PenaltySettings(distillation, args.distill_weight, args.distill_temperature, lnsr, smart, kinds)


def save_minutes(requested: float | None, device: torch.device) -> float:
    """--save_every_minutes for the device: as given, or by default every CUDA_SAVE_MINUTES on a GPU (a Colab session
    may end at any moment) and never on the CPU (short runs, whose saves would cost more than they keep)."""
    if requested is not None:
        return requested
    return CUDA_SAVE_MINUTES if device.type == "cuda" else 0.0


def run_tasks(args: TrainingArguments) -> tuple[str, ...]:
    """The run's tasks (--tasks), in RUN_TASKS' order."""
    return tuple(args.tasks.split(","))


def run_task_settings(args: TrainingArguments) -> dict[str, object]:
    """The tasks' own options as the run sets them (tasks.task_settings): what each task reads its own from."""
    return task_settings(vars(args))


def run_schedule(args: TrainingArguments) -> list[Stage]:
    """The run's stages: schedules.build_schedule of --schedule, --first_stages, --cycle, --cycles, --epochs and the
    SimCSE and mlm epochs."""
    return build_schedule(args.schedule, args.first_stages, args.cycle, args.cycles, args.epochs,
                          args.simcse_epochs if args.simcse_data else 0, args.mlm_epochs, run_tasks(args))


def distilled_tasks(args: TrainingArguments, stages: list[Stage]) -> list[str]:
    """The tasks that learn from a --distill teacher: those with one whose train split the stages read, in
    distillation.DISTILLED_TASKS' order."""
    teachers, trained = distill_teachers(args), train_tasks(stages, run_tasks(args))
    return [task for task in DISTILLED_TASKS if task in teachers and task in trained]


def named_tasks(text: str) -> tuple[str, ...]:
    """The tasks of a validated flag that names some, comma-separated (training_args.name_tasks has made them the
    internal names, in the run's order)."""
    return tuple(task for task in text.split(",") if task)


def regularized_tasks(args: TrainingArguments) -> tuple[str, ...]:
    """The tasks --smart regularises (none without --smart)."""
    return named_tasks(args.smart_tasks) if args.smart else ()


def smart_configs(args: TrainingArguments) -> dict[str, SmartConfig]:
    """SMART settings per task: the global flags, then any --smart_override TASK:key=value,...
    The Bregman anchor's momentum is shared by all tasks, so it is not among them."""
    base = dict(adv_weight=args.smart_adv_weight, bregman_weight=args.smart_bregman_weight,
                noise_std=args.smart_noise_std, epsilon=args.smart_epsilon, step_size=args.smart_step_size,
                ascent_steps=args.smart_ascent_steps, norm=args.smart_norm, norm_level=args.smart_norm_level,
                precision=args.smart_precision, projection=args.smart_projection, reduction=args.smart_reduction,
                anchor_mode=args.smart_anchor_mode)
    per_task = task_overrides("smart_override", args.smart_override, base, run_tasks(args))
    configs = {}
    for task, values in per_task.items():
        try:
            configs[task] = SmartConfig(**values)
        except ValueError as err:  # SmartConfig names its field: say which flag set it
            field_name = next((name for name in values if str(err).startswith(f"SmartConfig: {name} ")), None)
            if field_name is None:
                raise
            overridden = values[field_name] is not base[field_name]  # an override parses a new value (NaN too)
            where = f"--smart_override {task}:{field_name}" if overridden else f"--smart_{field_name}"
            raise ValueError(str(err).replace(f"SmartConfig: {field_name}", where, 1)) from None
    return configs


def distill_settings(args: TrainingArguments) -> dict[str, dict]:
    """Distillation's teacher folder, weight and temperature per task: --distill / --distill_weight /
    --distill_temperature, then any --distill_override TASK:key=value,... (a task's best weight differs, and a
    specialist may teach its task best: RESULTS.md, "Distillation"). teacher "" means the task has none."""
    base = dict(teacher=args.distill or "", weight=args.distill_weight, temperature=args.distill_temperature)
    return task_overrides("distill_override", args.distill_override, base, run_tasks(args))


def distill_teachers(args: TrainingArguments) -> dict[str, str]:
    """The teacher folder of each task that has one."""
    return {task: setting["teacher"] for task, setting in distill_settings(args).items() if setting["teacher"]}


def task_overrides(flag: str, overrides: list[str], base: dict, tasks: tuple[str, ...]) -> dict[str, dict]:
    """`base` for every task, then each --FLAG TASK:key=value[,key=value] applied to its task (each value of
    its base value's type; TASK an internal name, as training_args.name_tasks leaves it)."""
    per_task = {task: dict(base) for task in tasks}
    for override in overrides:
        task, _, settings = override.partition(":")
        if task not in per_task or not settings:
            raise ValueError(f"--{flag} {override!r}: expected TASK:key=value[,key=value]")
        for setting in settings.split(","):
            key, _, value = setting.partition("=")
            if key not in base:
                raise ValueError(f"--{flag} {override!r}: unknown or shared setting {key!r}")
            try:
                per_task[task][key] = type(base[key])(value)
            except ValueError:
                raise ValueError(f"--{flag} {override!r}: {key} must be a "
                                 f"{type(base[key]).__name__}, got {value!r}") from None
    return per_task


def lnsr_tasks(args: TrainingArguments) -> tuple[str, ...]:
    """The tasks --lnsr regularises (none without --lnsr)."""
    return named_tasks(args.lnsr_tasks) if args.lnsr else ()


def lnsr_config(args: TrainingArguments, num_layers: int | None) -> LnsrConfig:
    """LNSR's settings; the default layer b is L - 2 of the model's L layers (checked once L is known)."""
    layer = args.lnsr_layer if args.lnsr_layer is not None else max(0, (num_layers or 2) - 2)
    if num_layers is not None and layer >= num_layers:
        raise ValueError(f"--lnsr_layer {layer} leaves no layer to measure in a {num_layers}-layer encoder; "
                         f"use 0..{num_layers - 1}")
    return LnsrConfig(args.lnsr_weight, layer, args.lnsr_noise_std)


def adapter_config(args: TrainingArguments) -> AdapterConfig | None:
    """The adapters of --adapter (None for none)."""
    if args.adapter == "none":
        return None
    targets = tuple(t.strip() for t in args.adapter_targets.split(",") if t.strip())
    try:
        return AdapterConfig(args.adapter, args.adapter_rank, args.adapter_alpha, args.adapter_dropout, targets,
                             args.adapter_sharing, args.pal_size)
    except ValueError as err:
        raise ValueError(f"--adapter {args.adapter}: {err}") from None
