"""The inner loop of training: a stage's steps driven with gradient accumulation (StepLoop.run_steps), each one the
forward and backward of a batch (a task's objective with its penalties: objective.TaskObjective; a SimCSE or
masked-LM batch; gradient surgery's batch of every task), the optimizer's updates at the schedule's learning rate,
a line of steps.jsonl every logging_steps updates and the checkpoints inside the stage.

    steps = StepLoop(model, device, config, optimizer, state, run_log, save_checkpoint, penalties)
    mean_loss = steps.run_steps(((partial(steps.task_step, "sst"), b) for b in loader), len(loader), "stage 1 sst")
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from minbert.distributed import SINGLE_PROCESS, Distributed
from minbert.model.checkpoint import restore_rng
from minbert.model.multitask_bert import MultitaskBERT
from minbert.runtime import autocast, to_device
from minbert.step_log import DeviceSums, RunLog, StageLosses, read_line
from minbert.training.gradient_surgery import GradientSurgery
from minbert.training.mlm import MaskedLanguageModelHead, mlm_loss
from minbert.training.objective import Penalty, TaskObjective, UpdatePlace
from minbert.training.optimization import update_weights
from minbert.training.schedules import learning_rate_factor
from minbert.training.stage_transitions import TransitionSettings
from minbert.training.training_state import TrainingState
from optimizer import AdamW


@dataclass(frozen=True)
class LoopConfig:
    """The training loop's own settings. The run's objects (optimizer, SMART and LNSR, the SimCSE loss, gradient
    surgery) are built outside (run_setup.build_trainer does it from the command line) and handed over; the
    trainer's outer loop (trainer.py) reads them as its inner one (StepLoop) does."""
    output_dir: Path
    lr: float  # the base learning rate of task and mlm stages (each parameter group scales it)
    seed: int
    batch_size: int
    eval_batch_size: int
    max_length: int
    num_workers: int
    grad_accumulation_steps: int
    max_grad_norm: float  # 0: no clipping
    lr_schedule: str  # schedules.LR_SCHEDULES
    warmup_ratio: float
    schedule: str  # how multi-task epochs order their batches (schedules.multitask_order)
    epochs: int  # multi-task epochs in the run: annealed sampling's horizon
    precision: str  # resolved (runtime.resolve_precision): fp32, bf16 or fp16 autocast
    quiet: bool  # no progress bars
    stop_after_stages: int | None  # stop, resumably, after this many stages
    keep_stage_models: bool  # also save the model after every stage (OUTPUT_DIR/stage_N.*)
    pad_to_multiple_of: int | None  # batches padded to length buckets (runtime.pad_to_multiple_of), or None
    eval_train_examples: int  # also score this many train examples per task after each stage
    # The host reads the losses (progress bar, divergence check) and writes a line of steps.jsonl every this many
    # updates.
    logging_steps: int = 50
    report_to: str = "none"  # also where the steps and the stage metrics go: step_log.REPORT_TO
    # Checkpoints inside a stage (OUTPUT_DIR/last.*, which --resume continues at the next batch): every this many
    # updates, and every this many minutes (0: neither).
    save_steps: int = 0
    save_every_minutes: float = 0.0
    # Between stages: early stopping and what the stage after a block of repeated stages starts from.
    transitions: TransitionSettings = TransitionSettings()


@dataclass
class StagePlace:
    """The stage that run_steps trains, for a checkpoint inside it: its index and label, and what else says where it
    stands (a multi-task epoch: its loaders' passes and batches, and the random state of gradient surgery)."""
    index: int
    label: str
    extras: Callable[[], dict] = dict


@dataclass
class ResumedStage:
    """A checkpoint saved inside a stage (Trainer.state_dict's position), as load_state_dict found it: run_stage
    continues that stage at the next batch. `tensors`: this rank's loss sums and RNG states, without rank suffix."""
    position: dict
    tensors: dict[str, torch.Tensor]
    rng: dict


class StepLoop:
    """Trains the steps of each stage and takes the optimizer's updates; holds what carries from step to step: the
    learning rate's place in its schedule, fp16's gradient scaler, the sums steps.jsonl reports and the clocks of
    the stage and of the last checkpoint. `state`: the run's TrainingState (its update counters advance here).
    `save_checkpoint(position, local)`: saves OUTPUT_DIR/last.* with where the stage stands (the trainer's)."""

    def __init__(self, model: MultitaskBERT, device: torch.device, config: LoopConfig, optimizer: AdamW,
                 state: TrainingState, run_log: RunLog, save_checkpoint: Callable[[dict, dict], None],
                 penalties: list[Penalty],
                 simcse_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 gradient_surgery: GradientSurgery | None = None, mlm_head: MaskedLanguageModelHead | None = None,
                 distributed: Distributed = SINGLE_PROCESS):
        self.model, self.device, self.config, self.optimizer = model, device, config, optimizer
        self.state, self.run_log, self.save_checkpoint = state, run_log, save_checkpoint
        self.penalties = penalties
        self.objectives: dict[str, TaskObjective] = {}  # each task's, built at its first step
        self.simcse_loss, self.gradient_surgery, self.mlm_head = simcse_loss, gradient_surgery, mlm_head
        self.distributed = distributed
        self.quiet = config.quiet or not distributed.is_main
        self.amp = autocast(device, config.precision)
        # fp16 (GPUs without bf16: T4, V100) underflows small gradients: the loss is scaled up before backward
        # and the gradients unscaled before clipping and the step; a step with inf / NaN gradients is skipped.
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        # The optimizer update under way within its stage, and the stage's updates: SMART's momentum schedule "stage".
        self.stage_update, self.stage_updates, self.total_updates = 0, 1, 1
        self.stage_lr = self.learning_rate = config.lr  # the stage's base rate, and that of the last update
        # Since the last line of steps.jsonl, on the device: each task's losses (simcse and mlm stages: theirs),
        # and the penalties (their terms, by the names their objective gives them).
        self.task_losses, self.penalty_terms = DeviceSums(), DeviceSums()
        self.last_save = time.monotonic()  # of the last checkpoint: save_every_minutes counts from it
        self.stage_start = time.time()  # when the stage being trained began (a resumed one: its earlier seconds too)

    def backward(self, loss: torch.Tensor, count: int | torch.Tensor, group_size: int) -> None:
        """Backward of a mean loss over `count` local items (examples, masked tokens), divided by its
        accumulation group's size; under torchrun weighted by this rank's share of the global batch."""
        if self.distributed.enabled:
            loss = loss * self.distributed.share(count, self.device)
        self.scaler.scale(loss / group_size).backward()

    def task_step(self, task: str, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        if task not in self.objectives:
            self.objectives[task] = TaskObjective(task, self.penalties)
        with self.amp:
            loss, penalties = self.objectives[task](self.model, batch)
        if loss.requires_grad:  # not so for the SBERT cosine with --option pretrain: it has no trainable weight
            self.backward(loss, len(batch["labels"]), group_size)
        self.task_losses.add(task, loss)
        for name, value in penalties.items():
            self.penalty_terms.add(name, value)
        return loss.detach()

    def simcse_step(self, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            embeddings = self.model.encode_sentences(batch["input_ids"], batch["attention_mask"])
            # Under torchrun every rank's triplets are in-batch negatives (gradients reach the local slice).
            anchor, positive, negative = (self.distributed.gather_with_grad(e) for e in embeddings.chunk(3))
            loss = self.simcse_loss(anchor, positive, negative)
        # The loss is already the global batch's; the gradient average over ranks would divide it.
        self.scaler.scale(loss * self.distributed.world_size / group_size).backward()
        self.task_losses.add("simcse", loss)
        return loss.detach()

    def mlm_step(self, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            loss = mlm_loss(self.model.bert, self.mlm_head, batch)
        self.backward(loss, len(batch["masked"]), group_size)  # mlm_batches' masked positions, on the host
        self.task_losses.add("mlm", loss)
        return loss.detach()

    def surgery_step(self, batches: list[tuple[str, dict]], group_size: int, rng: random.Random) -> torch.Tensor:
        """One backward per task (a task's batches summed), then the tasks' gradients combined by the gradient
        surgery into .grad."""
        named = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        accumulated = [p.grad for p in params]
        task_gradients, losses = [], []
        for task in dict.fromkeys(task for task, _ in batches):
            for p in params:
                p.grad = None
            losses += [self.task_step(task, batch, group_size) for name, batch in batches if name == task]
            gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            task_gradients.append(self.distributed.average_tensors(gradients))  # the surgery sees global gradients
        combined = self.gradient_surgery.combine(task_gradients, [self.model.is_shared(name) for name, _ in named], rng)
        for p, previous, gradient in zip(params, accumulated, combined):
            p.grad = gradient if previous is None else previous + gradient
        return torch.stack(losses).mean()

    def optimizer_step(self, gradients_reduced: bool = False, measure_norm: bool = False) -> torch.Tensor | None:
        """Average the gradients over ranks (unless `gradients_reduced`), clip them and step at the schedule's
        learning rate. Returns the gradients' total norm before clipping, a 0-dim device tensor, when clipping
        computes it or `measure_norm` asks for it (a step that logs it); else None."""
        if not gradients_reduced:
            self.distributed.average_gradients(self.model.parameters())
            if self.mlm_head is not None:
                self.distributed.average_gradients(self.mlm_head.parameters())
        config = self.config
        self.learning_rate = self.stage_lr * learning_rate_factor(self.state.updates, self.total_updates,
                                                                  config.lr_schedule, config.warmup_ratio)
        norm, stepped = update_weights(self.optimizer, self.scaler, self.learning_rate, config.max_grad_norm,
                                       measure_norm)
        if not stepped:
            # Nothing moved: neither SMART's anchor nor the schedules (learning rate, SMART's momentum) advance.
            self.state.skipped_updates += 1
            return norm
        place = UpdatePlace(self.stage_update, self.stage_updates, self.state.updates, self.total_updates)
        for penalty in self.penalties:
            penalty.after_update(self.model, place)
        self.state.updates += 1
        return norm

    def run_steps(self, steps, total: int, description: str, gradients_reduced: bool = False,
                  batches_per_step: int = 1, place: StagePlace | None = None,
                  resumed: ResumedStage | None = None) -> float:
        """Drive (step_fn, batch) pairs with gradient accumulation; returns the mean loss. Each loss is
        divided by the size of its accumulation group, the last (possibly shorter) one included.
        Under torchrun gradients are averaged over ranks once per optimizer step, unless the step
        functions did it themselves (`gradients_reduced`: gradient surgery, `batches_per_step` batches a step).

        The losses stay on the device (StageLosses), and so does what steps.jsonl reports (log_steps): the host
        reads them every logging_steps updates (those skipped by fp16's scaler count) and at the end of the stage,
        so no other step waits for the device to finish.

        `place`: the stage these steps train, named by the checkpoints saved inside it (save_steps,
        save_every_minutes; none without a place). `resumed`: such a checkpoint of this stage; `steps` then holds
        the pairs after those it had trained, and its sums and RNG states are restored before the first of them."""
        self.model.train()
        accumulation = self.config.grad_accumulation_steps
        losses = StageLosses(self.device)
        self.task_losses.clear()
        self.penalty_terms.clear()
        done = 0 if resumed is None else self.continue_stage(resumed, losses)
        # Examples counted in full batches of every rank (a stage's last batch may be shorter).
        step_examples = self.config.batch_size * self.distributed.world_size * batches_per_step
        bar = tqdm(steps, total=total, initial=done, desc=description, leave=False, disable=self.quiet, unit="ex",
                   unit_scale=step_examples)  # tqdm's rate and time left, in examples
        start, examples = time.time(), 0
        self.stage_updates = math.ceil(total / accumulation)
        for index, (step_fn, batch) in enumerate(bar, start=done):
            group_size = min(accumulation, total - (index - index % accumulation))
            losses.add(step_fn(batch, group_size), self.state.updates)
            examples += step_examples
            if (index + 1) % accumulation == 0 or index + 1 == total:
                self.stage_update = index // accumulation
                attempts = self.state.updates + self.state.skipped_updates + 1
                logs = attempts % self.config.logging_steps == 0 or index + 1 == total
                norm = self.optimizer_step(gradients_reduced, measure_norm=logs)
                if logs:
                    loss = self.log_steps(losses, description, norm, time.time() - start, examples)
                    bar.set_postfix(loss=f"{loss:.4f}")
                    start, examples = time.time(), 0
                # Not after the stage's last update: the stage's own checkpoint follows its dev pass.
                if place is not None and index + 1 < total and self.save_due(attempts, logs):
                    self.save_inside_stage(place, losses, index + 1, total, description)
        return losses.read_mean(description)

    def save_due(self, attempts: int, synced: bool) -> bool:
        """Whether a checkpoint is due after this update (`attempts`: the run's updates, fp16's skipped ones too),
        the same answer on every rank. `synced`: the host has just waited for the device (a line of steps.jsonl)."""
        config = self.config
        if config.save_steps and attempts % config.save_steps == 0:
            return True
        # Under torchrun rank 0's clock decides for every rank, in a collective that would make each update wait
        # for the device: it is asked only where the host waits anyway.
        if not config.save_every_minutes or (self.distributed.enabled and not synced):
            return False
        return self.distributed.main_decides(time.monotonic() - self.last_save >= 60 * config.save_every_minutes)

    def save_inside_stage(self, place: StagePlace, losses: StageLosses, done: int, total: int,
                          description: str) -> None:
        """OUTPUT_DIR/last.* after `done` of the stage's `total` steps (at an update's end) with where the stage
        stands: what --resume needs to continue at the next batch as if the run had never stopped."""
        losses.check(description)  # a diverged state is never saved: its resume could only diverge again
        accumulation = self.config.grad_accumulation_steps
        loss_tensors, loss_counts = losses.state()
        local = {f"position.losses.{name}": tensor for name, tensor in loss_tensors.items()}
        local |= {f"position.task_losses.{name}": tensor for name, tensor in self.task_losses.sums.items()}
        local |= {f"position.penalties.{name}": tensor for name, tensor in self.penalty_terms.sums.items()}
        position = {"stage": place.index, "label": place.label, "steps_done": done, "steps": total,
                    "updates": math.ceil(done / accumulation), "stage_updates": math.ceil(total / accumulation),
                    "seconds": time.time() - self.stage_start, "losses": loss_counts,
                    "task_losses": dict(self.task_losses.counts), "penalties": dict(self.penalty_terms.counts),
                    **place.extras()}
        self.save_checkpoint(position, local)

    def continue_stage(self, resumed: ResumedStage, losses: StageLosses) -> int:
        """Put back what a checkpoint inside the stage kept of its sums (the stage's losses, steps.jsonl's since its
        last line) and RNG states; returns the steps it had done."""
        position, tensors = resumed.position, resumed.tensors
        losses.load_state({name: tensors[f"position.losses.{name}"] for name in ("total", "recent", "first_nonfinite")},
                          position["losses"])
        for name, sums in (("task_losses", self.task_losses), ("penalties", self.penalty_terms)):
            sums.load_state({key: tensors[f"position.{name}.{key}"].to(self.device) for key in position[name]},
                            position[name])
        # Only now that the stage's loaders exist: each iter(DataLoader) draws a seed from torch's generator, as the
        # saving run's had done before it saved.
        restore_rng(tensors, resumed.rng)
        return position["steps_done"]

    def log_steps(self, losses: StageLosses, description: str, grad_norm: torch.Tensor, seconds: float,
                  examples: int) -> float:
        """A line of steps.jsonl (and TensorBoard's train/ scalars) for the updates since the last one
        (step_log.read_line); returns its loss. `grad_norm`: the last update's, before clipping."""
        line = {"update": self.state.updates, "stage": description,
                **read_line(losses, description, self.task_losses, self.penalty_terms, self.learning_rate, grad_norm)}
        for penalty in self.penalties:  # their counters so far in the run (SMART's adversarial terms dropped)
            line |= penalty.log_values()
        if self.scaler.is_enabled():
            line |= {"fp16_scale": self.scaler.get_scale(), "fp16_skipped_updates": self.state.skipped_updates}
        line |= {"seconds": seconds, "examples_per_second": examples / max(seconds, 1e-9)}
        self.run_log.step(line)
        return line["loss"]
