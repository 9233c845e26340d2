"""The penalties that a run's task steps add to the task's loss: SMART (a regularizer per task, all sharing one
Bregman anchor), LNSR (a config per task) and the defences against forgetting of a sequential schedule (EWC and
L2-SP, continual.py); and what becomes of their state after each update, between stages and in a checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minbert.training.continual import L2SP, ElasticWeightConsolidation
from minbert.training.lnsr import LnsrConfig
from smart import BregmanAnchor, SmartRegularizer, bregman_momentum

# The anchor's tensors in a checkpoint: the key predates the name "anchor", and runs saved with it must still resume.
ANCHOR_KEY = "teacher."
EWC_KEY = "ewc."


@dataclass
class Regularization:
    """SMART, LNSR, EWC and L2-SP as a run uses them; none of them by default."""
    smart: dict[str, SmartRegularizer] = field(default_factory=dict)
    anchor: BregmanAnchor | None = None  # theta_tilde of every task's D_Breg
    anchor_momentum: float | None = None  # a fixed beta, or None for the SMART paper's schedule (bregman_momentum)
    # Whether that schedule's 10% is of the run's updates or of each stage's, restarting every stage
    # (smart.MOMENTUM_SCHEDULES).
    momentum_schedule: str = "run"
    # What D_Breg compares with (smart.ANCHORS): the moving average, or the weights the stage started from (the
    # anchor is reset before every stage and never updated).
    anchored_to: str = "moving_average"
    lnsr: dict[str, LnsrConfig] = field(default_factory=dict)
    ewc: ElasticWeightConsolidation | None = None  # consolidated when a block of task stages gives way to the next
    ewc_fisher_batches: int = 100  # the Fisher's batches: the first ones of the block's last stage
    l2sp: L2SP | None = None

    @property
    def defences(self) -> dict[str, ElasticWeightConsolidation | L2SP]:
        """The defences against forgetting by their penalties' names (trainer.task_loss_and_penalties)."""
        return {name: defence for name, defence in (("ewc", self.ewc), ("l2sp", self.l2sp)) if defence is not None}

    def after_update(self, model: torch.nn.Module, stage_update: int, stage_updates: int, run_update: int,
                     run_updates: int) -> None:
        """After an optimizer update (`stage_update` of its stage's `stage_updates`, `run_update` of the run's
        `run_updates`, 0-based): the moving average follows the model, at the momentum of the update's place."""
        if self.anchor is None or self.anchored_to != "moving_average":
            return
        position, count = ((stage_update, stage_updates) if self.momentum_schedule == "stage"
                           else (run_update, run_updates))
        self.anchor.momentum = bregman_momentum(position, count, self.anchor_momentum)
        self.anchor.update(model)

    def start_stage(self, model: torch.nn.Module) -> None:
        """Before a stage: the anchor "stage_start" becomes the weights the stage starts from."""
        if self.anchor is not None and self.anchored_to == "stage_start":
            self.anchor.reset(model)

    def skipped_steps(self) -> dict[str, int]:
        """SMART's adversarial terms dropped for a non-finite ascent so far, by task."""
        return {task: regularizer.skipped_steps for task, regularizer in self.smart.items()}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The anchor's and EWC's tensors, by their checkpoint keys."""
        tensors = {}
        if self.anchor is not None:
            tensors.update({f"{ANCHOR_KEY}{k}": v.contiguous() for k, v in self.anchor.state_dict().items()})
        if self.ewc is not None:
            tensors.update({f"{EWC_KEY}{k}": v.contiguous() for k, v in self.ewc.state_dict().items()})
        return tensors

    def load_state(self, tensors: dict[str, torch.Tensor], skipped_steps: dict[str, int],
                   device: torch.device) -> None:
        """state_tensors' tensors of a checkpoint among `tensors`, and skipped_steps' counts, put back."""
        if self.anchor is not None:
            self.anchor.load_state_dict(_prefixed(tensors, ANCHOR_KEY, device))
        if self.ewc is not None:
            self.ewc.load_state_dict(_prefixed(tensors, EWC_KEY, device))
        for task, skipped in skipped_steps.items():
            if task in self.smart:
                self.smart[task].skipped_steps = skipped


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str, device: torch.device) -> dict[str, torch.Tensor]:
    return {name[len(prefix):]: tensor.to(device) for name, tensor in tensors.items() if name.startswith(prefix)}
