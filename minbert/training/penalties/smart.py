"""SMART (Jiang et al. 2020) as the run's penalty, all of it but the algorithm (the course file smart.py): its flags
(--smart, --smart_tasks, the global settings and --smart_override TASK:key=value per task), their checks, each
task's SmartConfig (smart_configs), the penalty on the run's task losses (SmartPenalty: a regularizer per task, all
sharing one Bregman anchor, whose moving average follows the model after each update, is reset before a stage
(anchor "stage_start") and is kept in the checkpoint with the adversarial terms skipped so far), and what a resume
must keep (--cycles, where the anchor's momentum follows the run's updates).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minbert.model.multitask_bert import MultitaskBERT
from minbert.training.objective import Penalty, PenaltyFlag, PenaltyKind, TaskForward, UpdatePlace
from minbert.training.penalties.task_flags import named_tasks, run_tasks, task_overrides
from smart import (ANCHOR_MODES, ANCHORS, MOMENTUM_SCHEDULES, NORM_LEVELS, NORMS, PROJECTIONS, BregmanAnchor,
                   SmartConfig, SmartRegularizer, bregman_momentum, computes_exactly)
from smart import PRECISIONS as SMART_PRECISIONS
from smart import REDUCTIONS as SMART_REDUCTIONS

# The anchor's tensors in a checkpoint: the key predates the name "anchor", and runs saved with it must still resume.
ANCHOR_KEY = "teacher."
SKIPPED_KEY = "smart_skipped_steps"  # the checkpoint's field, and steps.jsonl's, of the adversarial terms dropped


@dataclass
class SmartPenalty(Penalty):
    """SMART's lambda_s * R_s and mu * D_Breg on the tasks of `regularizers`, as "smart_adversarial" and
    "smart_bregman"; with the shared `anchor` (None without a Bregman term)."""
    regularizers: dict[str, SmartRegularizer] = field(default_factory=dict)
    anchor: BregmanAnchor | None = None  # theta_tilde of every task's D_Breg
    anchor_momentum: float | None = None  # a fixed beta, or None for the SMART paper's schedule (bregman_momentum)
    # Whether that schedule's 10% is of the run's updates or of each stage's, restarting every stage
    # (smart.MOMENTUM_SCHEDULES).
    momentum_schedule: str = "run"
    # What D_Breg compares with (smart.ANCHORS): the moving average, or the weights the stage started from (the
    # anchor is reset before every stage and never updated).
    anchored_to: str = "moving_average"
    name = "smart"

    def applies_to(self, task: str) -> bool:
        return task in self.regularizers

    def computes_exactly(self, task: str, device_type: str) -> bool:
        return computes_exactly(self.regularizers[task].config, device_type)

    def add_to(self, loss: Tensor, forward: TaskForward) -> tuple[Tensor, dict[str, Tensor]]:
        regularizer = self.regularizers[forward.task]
        loss = loss + regularizer.penalty(forward.outputs_from_embeddings, forward.embeddings, forward.outputs,
                                          forward.objective.divergence, anchor_args=(forward.task, forward.batch),
                                          token_mask=forward.inputs.attention_mask)
        return loss, {f"smart_{name}": term for name, term in regularizer.terms.items()}

    def after_update(self, model: torch.nn.Module, place: UpdatePlace) -> None:
        """The moving average follows the model, at the momentum of the update's place."""
        if self.anchor is None or self.anchored_to != "moving_average":
            return
        position, count = ((place.stage_update, place.stage_updates) if self.momentum_schedule == "stage"
                           else (place.run_update, place.run_updates))
        self.anchor.momentum = bregman_momentum(position, count, self.anchor_momentum)
        self.anchor.update(model)

    def start_stage(self, model: torch.nn.Module) -> None:
        """The anchor "stage_start" becomes the weights the stage starts from."""
        if self.anchor is not None and self.anchored_to == "stage_start":
            self.anchor.reset(model)

    def skipped_steps(self) -> dict[str, int]:
        """The adversarial terms dropped for a non-finite ascent so far, by task."""
        return {task: regularizer.skipped_steps for task, regularizer in self.regularizers.items()}

    def state_tensors(self) -> dict[str, Tensor]:
        if self.anchor is None:
            return {}
        return {f"{ANCHOR_KEY}{k}": v.contiguous() for k, v in self.anchor.state_dict().items()}

    def checkpoint_values(self) -> dict:
        return {SKIPPED_KEY: self.skipped_steps()}

    def load_state(self, tensors: dict[str, Tensor], metadata: dict, device: torch.device) -> None:
        if self.anchor is not None:
            self.anchor.load_state_dict(prefixed(tensors, ANCHOR_KEY, device))
        for task, skipped in metadata.get(SKIPPED_KEY, {}).items():
            if task in self.regularizers:
                self.regularizers[task].skipped_steps = skipped

    def log_values(self) -> dict:
        return {SKIPPED_KEY: sum(self.skipped_steps().values())}

    def device_tensors(self) -> list[Tensor]:
        """Every regularizer's (the anchor they share once)."""
        tensors = {id(t): t for regularizer in self.regularizers.values() for t in regularizer.device_tensors()}
        return list(tensors.values())


def prefixed(tensors: dict[str, Tensor], prefix: str, device: torch.device) -> dict[str, Tensor]:
    """The tensors whose keys begin with `prefix`, without it, on `device`."""
    return {name[len(prefix):]: tensor.to(device) for name, tensor in tensors.items() if name.startswith(prefix)}


def regularized_tasks(settings) -> tuple[str, ...]:
    """The tasks --smart regularises (none without --smart)."""
    return named_tasks(settings.smart_tasks) if settings.smart else ()


def smart_configs(settings) -> dict[str, SmartConfig]:
    """SMART settings per task of the run: the global flags, then any --smart_override TASK:key=value,...
    The Bregman anchor's momentum is shared by all tasks, so it is not among them."""
    base = dict(adv_weight=settings.smart_adv_weight, bregman_weight=settings.smart_bregman_weight,
                noise_std=settings.smart_noise_std, epsilon=settings.smart_epsilon, step_size=settings.smart_step_size,
                ascent_steps=settings.smart_ascent_steps, norm=settings.smart_norm,
                norm_level=settings.smart_norm_level, precision=settings.smart_precision,
                projection=settings.smart_projection, reduction=settings.smart_reduction,
                anchor_mode=settings.smart_anchor_mode)
    per_task = task_overrides("smart_override", settings.smart_override, base, run_tasks(settings))
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


def check(settings) -> None:
    momentum = settings.smart_momentum
    if not (momentum is None or (isinstance(momentum, (int, float)) and math.isfinite(momentum)
                                 and 0 <= momentum < 1)):
        raise ValueError(f"--smart_momentum must be in [0, 1), got {momentum}")
    if settings.smart:
        smart_configs(settings)


def build(settings, model: MultitaskBERT) -> SmartPenalty | None:
    """SMART's regularizers of its tasks, one Bregman anchor shared by every task that needs one."""
    tasks = regularized_tasks(settings)
    if not tasks:
        return None
    configs = smart_configs(settings)
    anchor = None
    if any(configs[task].bregman_weight > 0 for task in tasks):
        anchor = BregmanAnchor(model, bregman_momentum(0, 1, settings.smart_momentum))
    return SmartPenalty({task: SmartRegularizer(model, configs[task], anchor) for task in tasks}, anchor,
                        settings.smart_momentum, settings.smart_momentum_schedule, settings.smart_anchor)


def check_resume(saved: dict, settings) -> None:
    """The SMART paper's momentum (0.99 for the first 10% of the run's updates) follows the total number of updates,
    which --cycles changes: refused where a task's Bregman term reads that anchor."""
    run_momentum = settings.smart_momentum is None and settings.smart_momentum_schedule == "run" and \
        settings.smart_anchor == "moving_average"
    tasks = regularized_tasks(settings) if run_momentum else ()
    configs = smart_configs(settings) if tasks else {}
    if any(configs[task].bregman_weight > 0 for task in tasks) and saved.get("cycles") != settings.cycles:
        raise ValueError(f"cannot resume: --cycles {saved.get('cycles')!r} -> {settings.cycles!r} changes the total "
                         "number of updates, which SMART's momentum follows; resume with --cycles "
                         f"{saved.get('cycles')}")


PENALTY = PenaltyKind(
    name="smart", title="SMART (Jiang et al. 2020); defaults are the paper's", switch="smart", early=True,
    after="stage_start", build=build, check=check, check_resume=check_resume, captured=True, flags={
        "smart": PenaltyFlag(False, "regularise the tasks in --smart_tasks (--no-smart: not, e.g. after a recipe's "
                             "--smart)", type=None, action=argparse.BooleanOptionalAction),
        "smart_tasks": PenaltyFlag(None, "default: every task of --tasks", type=None, tasks="list", every_task=True),
        "smart_adv_weight": PenaltyFlag(1.0, "lambda_s"),
        "smart_bregman_weight": PenaltyFlag(1.0, "mu"),
        "smart_momentum": PenaltyFlag(None, "beta of the Bregman anchor's moving average (default: the SMART paper's "
                                      "0.99 for the first 10%% of the updates, then 0.999: see "
                                      "--smart_momentum_schedule; a number fixes it; 0: vanilla)"),
        "smart_momentum_schedule": PenaltyFlag("run", "what the default momentum's 10%% is of: run, the run's "
                                               "updates (the SMART paper's), or stage, each stage's, restarting every "
                                               "stage (the thesis' code restarts it every epoch)", type=None,
                                               choices=MOMENTUM_SCHEDULES),
        "smart_anchor": PenaltyFlag("moving_average", "what D_Breg compares with: moving_average (theta_tilde, the "
                                    "weights' moving average) or stage_start, the weights the stage started from "
                                    "(the thesis' code: a variable-name slip never loads its moving average, so its "
                                    "anchor is the epoch's first weights)", type=None, choices=ANCHORS),
        "smart_projection": PenaltyFlag("clamp", "how an ascent step returns to the eps-ball: clamp (every coordinate "
                                        "within +-eps) or rescale (each slice of --smart_norm_level rescaled to norm "
                                        "eps: with --smart_norm_level sentence, the thesis' listing A.4)", type=None,
                                        choices=PROJECTIONS),
        "smart_reduction": PenaltyFlag("sum", "how R_s reduces an example's divergence over the classes: sum (the "
                                       "symmetric KL) or max, the largest class's term (the thesis' listing A.1)",
                                       type=None, choices=SMART_REDUCTIONS),
        "smart_anchor_mode": PenaltyFlag("eval", "the Bregman anchor's forward: eval (dropout off, a fixed target) or "
                                         "train (dropout on, as the thesis' copy of the model runs)", type=None,
                                         choices=ANCHOR_MODES),
        "smart_noise_std": PenaltyFlag(1e-5, "sigma"),
        "smart_epsilon": PenaltyFlag(1e-5, "epsilon, radius of the ball (0: no perturbation and no ascent, R_s the "
                                     "divergence of two dropout forwards: docs/smart.md)"),
        "smart_step_size": PenaltyFlag(1e-3, "eta"),
        "smart_ascent_steps": PenaltyFlag(1, "K", type=int),
        "smart_norm": PenaltyFlag("inf", None, type=None, choices=NORMS),
        "smart_norm_level": PenaltyFlag("token", None, type=None, choices=NORM_LEVELS),
        "smart_precision": PenaltyFlag("run", "where SMART's passes compute: run (the run's --precision, exact "
                                       "float32 under fp16, which would underflow the ascent; with dropout on the "
                                       "ascent, R_s and the gradient agree with exact float32: docs/smart.md) or "
                                       "exact (float32 without autocast or TF32, for studies with dropout off)",
                                       type=None, choices=SMART_PRECISIONS),
        "smart_override": PenaltyFlag([], "per-task setting, e.g. sst:adv_weight=10 (repeatable)", type=None,
                                      action="append", metavar="TASK:key=value,...", tasks="overrides")})
