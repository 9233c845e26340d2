"""SMART as a penalty of the run's task losses (objective.Penalty): a regularizer per task (smart.py), all sharing one
Bregman anchor, whose moving average follows the model after each update, is reset before a stage (anchor
"stage_start") and is kept in the checkpoint with the adversarial terms skipped so far.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from minbert.training.objective import Penalty, TaskForward, UpdatePlace
from smart import BregmanAnchor, SmartRegularizer, bregman_momentum, computes_exactly

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


def prefixed(tensors: dict[str, Tensor], prefix: str, device: torch.device) -> dict[str, Tensor]:
    """The tensors whose keys begin with `prefix`, without it, on `device`."""
    return {name[len(prefix):]: tensor.to(device) for name, tensor in tensors.items() if name.startswith(prefix)}
