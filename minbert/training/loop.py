"""The training loop: a stage's steps, read top to bottom in StepLoop.run_steps — the forward and the loss terms of a
batch and its backward (BatchSteps: a task's objective with its penalties, a SimCSE or masked-LM batch, gradient
surgery's batch of every task), then at each update's end the learning rate, clipping and the optimizer's step, a
line of steps.jsonl and the checkpoint inside the stage. The run's progress is one TrainingState (training_state.py)
that the loop advances and its RunCheckpoint saves and restores; what follows an update is decided in a
TrainerControl the loop reads (should_log, should_save, should_evaluate), and between stages whether the run stops
(should_stop). The loop saves its checkpoints itself; the trainer (trainer.py) runs the schedule around it.

    loop = StepLoop(steps, stage_data, config, optimizer, checkpoint, run_log, penalties, simcse_lr)
    mean_loss = loop.run_stage(index, stage)      # then the trainer evaluates, and loop.save() the stage's checkpoint
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
from minbert.model.checkpoint import (gather_rank_states, optimizer_state, rank_states, restore_optimizer,
                                      restore_rng)
from minbert.model.multitask_bert import MultitaskBERT, load_trained_tensors, model_metadata, trained_tensors
from minbert.runtime import autocast, to_device
from minbert.step_log import RunLog, StageLosses, read_line
from minbert.training.captured_step import CapturedStep
from minbert.training.checkpoint_files import LAST, keep_earlier_checkpoint
from minbert.training.gradient_surgery import GradientSurgery, SeparateTaskGradients
from minbert.training.mlm import MaskedLanguageModelHead, MaskedLanguageModelObjective
from minbert.training.objective import Penalty, TaskObjective, UpdatePlace, penalties_state
from minbert.training.optimization import update_weights
from minbert.training.schedules import Stage, StageKind, learning_rate_factor, multitask_order
from minbert.training.simcse import SimcseObjective
from minbert.training.stage_data import StageData
from minbert.training.stage_transitions import StageTransitions, TransitionSettings
from minbert.training.training_state import StageProgress, TrainingState, save_training_state
from optimizer import AdamW


@dataclass(frozen=True)
class LoopConfig:
    """The training loop's own settings. The run's objects (optimizer, SMART and LNSR, the SimCSE loss, gradient
    surgery) are built outside (run_setup.build_trainer does it from the command line) and handed over; the
    trainer (trainer.py) reads them as its step loop does."""
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
    # The dev scoring after each stage that picks the kept model: this many dev examples per task, a subset drawn once
    # from the seed (None: every example); the kept model's final dev predictions cover every example.
    max_eval_examples: int | None = None
    # The host reads the losses (progress bar, divergence check) and writes a line of steps.jsonl every this many
    # updates.
    logging_steps: int = 50
    report_to: str = "none"  # also where the steps and the stage metrics go: step_log.REPORT_TO
    # Checkpoints inside a stage (OUTPUT_DIR/last.*, which --resume continues at the next batch): every this many
    # updates, and every this many minutes (0: neither).
    save_steps: int = 0
    save_every_minutes: float = 0.0
    save_total_limit: int = 1  # checkpoints kept: last.* and the N-1 before it (checkpoint_files.py)
    # Between stages: early stopping and what the stage after a block of repeated stages starts from.
    transitions: TransitionSettings = TransitionSettings()
    # --capture_step: torch.compile's (backend, mode) of each task batch's whole step (captured_step.py), or None:
    # the eager step.
    capture_step: tuple[str, str | None] | None = None


@dataclass
class TrainerControl:
    """What the loop does next, decided from the settings and the state, never written by another object (as
    transformers' TrainerControl): after an update, whether to write a line of steps.jsonl (should_log), save a
    checkpoint inside the stage (should_save) or end the stage for its dev pass (should_evaluate); before a stage,
    whether the run stops there (should_stop: --stop_after_stages)."""
    should_log: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_stop: bool = False


class StepParts:
    """What a step works with besides the optimizer, shared by the step loop and its checkpoint: the model on its
    device, the run's autocast and fp16's loss scale, the penalties every task's objective adds, and what some runs
    add (SimCSE's loss, gradient surgery, the MLM head), with this process's place under torchrun."""

    def __init__(self, model: MultitaskBERT, device: torch.device, precision: str, penalties: list[Penalty],
                 simcse_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 gradient_surgery: GradientSurgery | None = None, mlm_head: MaskedLanguageModelHead | None = None,
                 distributed: Distributed = SINGLE_PROCESS):
        self.model, self.device, self.penalties = model, device, penalties
        self.simcse_loss, self.gradient_surgery, self.mlm_head = simcse_loss, gradient_surgery, mlm_head
        self.distributed = distributed
        self.amp = autocast(device, precision)
        # fp16 (GPUs without bf16: T4, V100) underflows small gradients: the loss is scaled up before backward
        # and the gradients unscaled before clipping and the step; a step with inf / NaN gradients is skipped.
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def tasks_together(pairs: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """A gradient surgery step's (task, batch) pairs with each task's batches side by side (its gradient is kept
    apart from the others'), the tasks in the order they first come."""
    return [pair for task in dict.fromkeys(name for name, _ in pairs) for pair in pairs if pair[0] == task]


def rank_share(distributed: Distributed, objective, batch: dict, loss: torch.Tensor) -> torch.Tensor:
    """The loss as this rank's part of the global batch's under torchrun (its share of the objective's local_items;
    SimCSE's, None, is the global batch's already, which the average over ranks would divide)."""
    if not distributed.enabled:
        return loss
    items = objective.local_items(batch)
    return loss * (distributed.world_size if items is None else distributed.share(items, loss.device))


class StepLoop:
    """Trains each stage's steps and takes the optimizer's updates (run_stage, run_steps), logs them and saves the
    checkpoints inside the stage; owns the run's TrainingState, which its RunCheckpoint saves (save) and restores
    (resume). The trainer reads the state and records its stages in it."""

    def __init__(self, parts: StepParts, stage_data: StageData, config: LoopConfig, optimizer: AdamW,
                 checkpoint: RunCheckpoint, run_log: RunLog, simcse_lr: float | None = None):
        """`simcse_lr`: the base learning rate of SimCSE stages (config.lr: the others')."""
        self.parts, self.stage_data, self.config, self.optimizer = parts, stage_data, config, optimizer
        self.checkpoint, self.run_log, self.simcse_lr = checkpoint, run_log, simcse_lr
        self.model, self.device, self.distributed = parts.model, parts.device, parts.distributed
        self.penalties = parts.penalties
        self.quiet = config.quiet or not self.distributed.is_main
        self.state = TrainingState(learning_rate=config.lr)
        self.control = TrainerControl()
        self.objectives: dict[str, object] = {}  # by the name of what a batch trains: objective()
        self.captured = None if config.capture_step is None else CapturedStep(
            self.model, optimizer, parts.amp, config.max_grad_norm, *config.capture_step)

    def objective(self, name: str) -> TaskObjective | MaskedLanguageModelObjective | SimcseObjective:
        """What a batch of `name` trains: "mlm", "simcse", or a task's loss with the penalties that apply to it
        (SMART, distillation, LNSR, EWC, L2-SP), built at its first batch. Each is called as objective(model, batch)
        and returns the loss and its terms."""
        if name not in self.objectives:
            parts = self.parts
            self.objectives[name] = (MaskedLanguageModelObjective(parts.mlm_head) if name == "mlm"
                                     else SimcseObjective(parts.simcse_loss, self.distributed) if name == "simcse"
                                     else TaskObjective(name, self.penalties))
        return self.objectives[name]

    # -- a stage: its batches, from where it stands ------------------------------------------------------
    def run_stage(self, index: int, stage: Stage) -> float:
        """Train stage `index` of the schedule (continuing it where a checkpoint inside it stood); its mean loss."""
        seed = self.config.seed + 1000 * index  # data order depends on the stage only: resumable
        description = f"stage {index + 1} {stage.label}"
        progress = self.state.stage  # a checkpoint inside this stage (check_resumable: it is this one), or none
        done = 0 if progress is None else progress.steps_done  # skipped below without a forward pass
        if stage.kind is StageKind.MULTITASK:
            return self.run_multitask_epoch(index, stage, seed, description)
        if stage.kind is StageKind.TASK:
            name, batches = stage.task, self.stage_data.task_batches(stage, seed, done)
            total = len(batches)
        elif stage.kind is StageKind.SIMCSE:
            name, batches = "simcse", self.stage_data.simcse_batches(seed, done)
            total = self.stage_data.stage_batches(stage)
        else:
            name, batches = "mlm", self.stage_data.mlm_batches(stage, seed, done)
            total = self.stage_data.stage_batches(stage)
        lr = self.simcse_lr if stage.kind is StageKind.SIMCSE else self.config.lr
        return self.run_steps(([(name, b)] for b in batches), total, description, stage=self.stage_progress(
            index, stage, total, lr))

    def run_multitask_epoch(self, index: int, stage: Stage, seed: int, description: str) -> float:
        progress = self.stage_progress(index, stage, self.stage_data.stage_batches(stage), self.config.lr)
        batches = self.stage_data.multitask_loaders(seed, progress.saved.get("loaders"))
        rng = random.Random(seed)
        sizes = {t: self.stage_data.train_items(t) for t in self.stage_data.tasks}
        surgery = self.parts.gradient_surgery
        per_step = len(sizes) if surgery else 1  # surgery: a batch of every task a step (round_robin: in turn)
        order = multitask_order(self.config.schedule, sizes, stage.epoch, self.config.epochs,
                                progress.steps * per_step, rng)
        if "rng" in progress.saved:  # where gradient surgery's draws stood
            version, state, gauss = progress.saved["rng"]
            rng.setstate((version, tuple(state), gauss))

        def where() -> dict:
            version, state, gauss = rng.getstate()
            return {"loaders": batches.position(), "rng": [version, list(state), gauss]}
        progress.where, done, steps = where, progress.steps_done, progress.steps
        if surgery:
            groups = (order[i * per_step:(i + 1) * per_step] for i in range(done, steps))
            pairs = (tasks_together([(t, batches.next(t)) for t in group]) for group in groups)  # drawn in turn
            return self.run_steps(pairs, steps, f"{description} {surgery.method}", surgery_rng=rng,
                                  batches_per_step=per_step, stage=progress)
        return self.run_steps(([(t, batches.next(t))] for t in order[done:]), steps, description, stage=progress)

    def stage_progress(self, index: int, stage: Stage, steps: int, lr: float) -> StageProgress:
        """Stage `index`'s progress: the resumed one's, or a fresh one."""
        progress = self.state.stage or StageProgress(index, stage.label, steps, 0, StageLosses(self.device))
        progress.updates, progress.lr = math.ceil(steps / self.config.grad_accumulation_steps), lr
        return progress

    # -- a training step, top to bottom ---------------------------------------------------------------
    def run_steps(self, steps, total: int, description: str, surgery_rng: random.Random | None = None,
                  batches_per_step: int = 1, stage: StageProgress | None = None) -> float:
        """Train `steps`, each a list of (name, batch) pairs: one batch (a task's, "mlm" or "simcse": objective()),
        or under gradient surgery `batches_per_step` batches, one of every task, whose gradients are kept apart and
        combined (`surgery_rng`: its draws). Gradients accumulate over grad_accumulation_steps steps, each loss
        divided by the size of its accumulation group (the last, possibly shorter, one included), and are averaged
        over torchrun's ranks once per update (gradient surgery averages each task's itself). Returns the mean loss.

        The losses stay on the device, and so does what steps.jsonl reports: the host reads them every
        logging_steps updates (those skipped by fp16's scaler count) and at the end of the stage, so no other step
        waits for the device. `stage`: where the stage stands (a resumed one: `steps` holds those after the ones
        it had done); without one, steps outside a schedule, never checkpointed inside."""
        state, parts, accumulation = self.state, self.parts, self.config.grad_accumulation_steps
        stage = stage or StageProgress(None, description, total, math.ceil(total / accumulation),
                                       StageLosses(self.device), self.config.lr)
        self.begin_steps(stage)
        # Examples counted in full batches of every rank (a stage's last batch may be shorter).
        step_examples = self.config.batch_size * self.distributed.world_size * batches_per_step
        bar = tqdm(steps, total=total, initial=stage.steps_done, desc=description, leave=False, disable=self.quiet,
                   unit="ex", unit_scale=step_examples)  # tqdm's rate and time left, in examples
        start, examples = time.time(), 0
        for index, step_batches in enumerate(bar, start=stage.steps_done):
            group_size = min(accumulation, total - (index - index % accumulation))
            separate = (None if surgery_rng is None
                        else SeparateTaskGradients(self.model, parts.gradient_surgery, self.distributed))
            rate = self.learning_rate(stage)  # from the updates done: the same for every batch of the update
            losses = []
            for name, batch in step_batches:
                if separate is not None:
                    separate.start(name)
                objective, batch = self.objective(name), to_device(batch, self.device)
                if self.captured is not None:  # all of it in one graph, the update too (one batch per update)
                    loss, terms, norm = self.captured(objective, batch, rate)
                else:
                    with parts.amp:  # the forward, the task's loss and its penalties (SMART, distillation...)
                        loss, terms = objective(self.model, batch)
                    if loss.requires_grad:  # not so for the SBERT cosine with --option pretrain: no trainable weight
                        parts.scaler.scale(rank_share(self.distributed, objective, batch, loss) / group_size).backward()
                state.task_losses.add(name, loss)
                for term, value in terms.items():
                    state.penalty_terms.add(term, value)
                losses.append(loss.detach())
            if separate is not None:
                separate.combine(surgery_rng)
            stage.losses.add(losses[0] if len(losses) == 1 else torch.stack(losses).mean(), state.updates)
            examples += step_examples
            stage.steps_done = index + 1
            if stage.steps_done % accumulation and stage.steps_done < total:
                continue  # the accumulation group goes on
            stage.update = index // accumulation
            control = self.decide_update(stage)  # should_log, should_evaluate (the stage's end)
            state.learning_rate = rate
            # the gradients averaged over ranks, clipped, the optimizer's step (fp16's scaler may skip it); the
            # captured step has taken it already
            norm, stepped = ((norm, True) if self.captured is not None
                             else self.optimizer_step(surgery_rng is not None, measure_norm=control.should_log))
            if stepped:  # the penalties follow the weights (SMART's anchor), and the schedules advance
                place = UpdatePlace(stage.update, stage.updates, state.updates, state.total_updates)
                for penalty in self.penalties:
                    penalty.after_update(self.model, place)
                state.updates += 1
            else:  # nothing moved: neither the penalties nor the schedules (learning rate, SMART's momentum)
                state.skipped_updates += 1
            if control.should_log:
                bar.set_postfix(loss=f"{self.log_steps(stage, description, norm, time.time() - start, examples):.4f}")
                start, examples = time.time(), 0
            if self.decide_save(stage, control).should_save:
                self.save(stage, description)
        self.state.stage = None  # the stage's own checkpoint, after its dev pass, is not inside it
        return stage.losses.read_mean(description)

    def begin_steps(self, stage: StageProgress) -> None:
        """Make `stage` the state's stage under way. A resumed one gets back its RNG states (now that its loaders
        exist: each iter(DataLoader) draws a seed from torch's generator, as the saving run's had before it saved)
        and its clock; a fresh one starts the sums steps.jsonl reports."""
        self.model.train()
        if stage.rng is not None:
            restore_rng(*stage.rng)
            stage.rng, stage.started = None, time.time()
        else:
            self.state.task_losses.clear()
            self.state.penalty_terms.clear()
        self.state.stage = stage

    def decide_stage(self, index: int) -> TrainerControl:
        """Before stage `index`: whether the run stops there (--stop_after_stages; --resume continues it)."""
        stop_after = self.config.stop_after_stages
        self.control = TrainerControl(should_stop=stop_after is not None and index >= stop_after)
        return self.control

    def decide_update(self, stage: StageProgress) -> TrainerControl:
        """After the update about to be taken: a line of steps.jsonl every logging_steps attempts (fp16's skipped
        updates count) and at the stage's end, when the stage's dev pass follows."""
        attempts = self.state.updates + self.state.skipped_updates + 1
        last = stage.steps_done == stage.steps
        self.control = TrainerControl(should_log=attempts % self.config.logging_steps == 0 or last,
                                      should_evaluate=last)
        return self.control

    def decide_save(self, stage: StageProgress, control: TrainerControl) -> TrainerControl:
        """Whether a checkpoint inside the stage is due after this update, the same answer on every rank: every
        save_steps attempts, and every save_every_minutes (asked after the log line: see below). Not at the stage's
        end (its own checkpoint follows its dev pass), nor for steps outside a schedule."""
        config, attempts = self.config, self.state.updates + self.state.skipped_updates
        if stage.index is None or control.should_evaluate:
            control.should_save = False
        elif config.save_steps and attempts % config.save_steps == 0:
            control.should_save = True
        # Under torchrun rank 0's clock decides for every rank, in a collective that would make each update wait
        # for the device: it is asked only where the host waits anyway (a line of steps.jsonl).
        elif not config.save_every_minutes or (self.distributed.enabled and not control.should_log):
            control.should_save = False
        else:
            control.should_save = self.distributed.main_decides(
                time.monotonic() - self.state.last_save >= 60 * config.save_every_minutes)
        return control

    def learning_rate(self, stage: StageProgress) -> float:
        """The schedule's learning rate for the update about to be taken: the stage's base rate (its own under
        the schedule's per-stage rates) times the warm-up / decay factor at the run's count of updates."""
        state, config = self.state, self.config
        return stage.lr * learning_rate_factor(state.updates, state.total_updates, config.lr_schedule,
                                               config.warmup_ratio)

    def optimizer_step(self, gradients_reduced: bool = False,
                       measure_norm: bool = False) -> tuple[torch.Tensor | None, bool]:
        """Average the gradients over ranks (unless `gradients_reduced`), clip them and step at the state's
        learning rate. Returns the gradients' total norm before clipping, a 0-dim device tensor, when clipping
        computes it or `measure_norm` asks for it (a step that logs it), else None; and whether the step was
        taken (fp16's scaler skips one with inf / NaN gradients)."""
        if not gradients_reduced:
            self.distributed.average_gradients(self.model.parameters())
            if self.parts.mlm_head is not None:
                self.distributed.average_gradients(self.parts.mlm_head.parameters())
        return update_weights(self.optimizer, self.parts.scaler, self.state.learning_rate, self.config.max_grad_norm,
                              measure_norm)

    def log_steps(self, stage: StageProgress, description: str, grad_norm: torch.Tensor, seconds: float,
                  examples: int) -> float:
        """A line of steps.jsonl (and TensorBoard's train/ scalars) for the updates since the last one
        (step_log.read_line); returns its loss. `grad_norm`: the last update's, before clipping."""
        state = self.state
        line = {"update": state.updates, "stage": description, **read_line(
            stage.losses, description, state.task_losses, state.penalty_terms, state.learning_rate, grad_norm)}
        for penalty in self.penalties:  # their counters so far in the run (SMART's adversarial terms dropped)
            line |= penalty.log_values()
        if self.parts.scaler.is_enabled():
            line |= {"fp16_scale": self.parts.scaler.get_scale(), "fp16_skipped_updates": state.skipped_updates}
        line |= {"seconds": seconds, "examples_per_second": examples / max(seconds, 1e-9)}
        self.run_log.step(line)
        return line["loss"]

    # -- the checkpoint: saved here, restored by resume ------------------------------------------------
    def save(self, stage: StageProgress | None = None, description: str = "") -> None:
        """OUTPUT_DIR/last.* (a collective: every rank calls it), which --resume continues from: after a stage, or
        inside `stage` at an update's end with where it stands, to continue at its next batch."""
        position, local = None, None
        if stage is not None:
            stage.losses.check(description)  # a diverged state is never saved: its resume could only diverge again
            position, local = stage.position(self.config.grad_accumulation_steps, self.state)
        self.checkpoint.save(self.state, position, local)
        self.state.last_save = time.monotonic()

    def resume(self, tensors: dict[str, torch.Tensor], metadata: dict, saved_schedule_length: int | None) -> None:
        """Continue from a checkpoint (training_state.read_training_state reads and checks it): everything it holds
        back in place, and the state it saved (inside a stage: run_stage continues that stage)."""
        self.state = self.checkpoint.load(tensors, metadata, saved_schedule_length)


class RunCheckpoint:
    """What OUTPUT_DIR/last.* holds, and puts back: the model (or what of it trains), the optimizer, the penalties'
    tensors and values, the MLM head, fp16's gradient scaler, the block's best stage, every rank's RNG states, the
    TrainingState, the data's fingerprints and the run's settings."""

    def __init__(self, parts: StepParts, optimizer: AdamW, transitions: StageTransitions, output_dir: Path,
                 settings: dict, data_sha256: dict[str, str], total_limit: int = 1):
        """`total_limit`: how many checkpoints stay (LoopConfig.save_total_limit)."""
        self.parts, self.optimizer, self.transitions, self.output_dir = parts, optimizer, transitions, output_dir
        self.settings, self.data_sha256 = settings, data_sha256
        self.model, self.distributed, self.penalties = parts.model, parts.distributed, parts.penalties
        self.total_limit = total_limit
        self.seconds = 0.0  # spent saving, in this process: the run's summary reports it

    def save(self, state: TrainingState, position: dict | None = None,
             local: dict[str, torch.Tensor] | None = None) -> None:
        start = time.time()
        checkpoint = self.state_dict(state, position, local)
        if checkpoint is not None:
            keep_earlier_checkpoint(self.output_dir, self.total_limit)
            save_training_state(self.output_dir / LAST, *checkpoint)
        self.seconds += time.time() - start

    def state_dict(self, state: TrainingState, position: dict | None = None,
                   local: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The checkpoint, as (tensors, plain values), on rank 0; None on the others. A collective under torchrun:
        every rank must call it (each one's dropout generator is kept). Inside a stage also `position`, where the
        stage stands, and every rank's `local` tensors (its sums of the stage's losses)."""
        gathered = gather_rank_states(self.distributed, local)
        if gathered is None:
            return None
        rank_tensors, rng_info = gathered
        tensors = {f"model.{k}": v for k, v in trained_tensors(self.model).items()}
        optimizer_tensors, optimizer_info = optimizer_state(self.optimizer)
        block_tensors, block_best = self.transitions.state()
        penalty_tensors, penalty_values = penalties_state(self.penalties)
        tensors |= optimizer_tensors | rank_tensors | penalty_tensors | block_tensors
        if self.parts.mlm_head is not None:
            tensors |= {f"mlm_head.{k}": v.detach().contiguous() for k, v in self.parts.mlm_head.state_dict().items()}
        return tensors, {
            **model_metadata(self.model), "args": self.settings, **state.saved_values(),
            "data_sha256": self.data_sha256, "world_size": self.distributed.world_size,
            "optimizer": optimizer_info, "rng": rng_info, **penalty_values,
            # The fp16 gradient scaler's scale and growth counter (plain numbers; {} without fp16).
            "grad_scaler": self.parts.scaler.state_dict(), "skipped_updates": state.skipped_updates,
            # The block's best stage so far (stage_transitions), its tensors under block_best.; None outside a block.
            "block_best": block_best, "skipped_stages": list(state.skipped_stages),
            **({"position": position} if position is not None else {})}

    def load(self, tensors: dict[str, torch.Tensor], metadata: dict,
             saved_schedule_length: int | None = None) -> TrainingState:
        """Put back what state_dict saved, in a schedule of `saved_schedule_length` stages (None: this run's; the
        trainer extends a finished shorter one); returns the run's state as it was saved."""
        device = self.parts.device
        load_trained_tensors(self.model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        restore_optimizer(self.optimizer, tensors, metadata["optimizer"])
        for penalty in self.penalties:
            penalty.load_state(tensors, metadata, device)
        if self.parts.mlm_head is not None:
            self.parts.mlm_head.load_state_dict({k[9:]: v for k, v in tensors.items() if k.startswith("mlm_head.")})
        self.transitions.load_state(tensors, metadata.get("block_best"), saved_schedule_length)
        # A run saved before these fields existed, or in another precision (a resume on another GPU kind),
        # starts a fresh scaler, as a run does.
        if self.parts.scaler.is_enabled() and metadata.get("grad_scaler"):
            self.parts.scaler.load_state_dict(metadata["grad_scaler"])
        own = rank_states(tensors, self.distributed.rank)  # this rank's RNG states and sums
        restore_rng(own, metadata["rng"])
        # Inside a stage, its RNG states go back again when it continues (StepLoop.begin_steps); only what that
        # needs is kept, not the weights.
        return TrainingState.from_checkpoint(metadata, {name: tensor for name, tensor in own.items()
                                                        if name.startswith(("position.", "rng.")) and ".rank" not in name},
                                             device)
