"""The training loop of MultitaskBERT over a schedule of stages: each stage's steps (the inner loop,
training_steps.StepLoop: gradient accumulation, SMART, LNSR, gradient surgery, steps.jsonl), a dev evaluation after
every stage (run_evaluation.py: metrics.jsonl), the model kept as best, what happens between stages (early stopping,
a block's best stage, EWC: stage_transitions.py) and the training state.

    trainer = Trainer(model, tokenizer, data, device, LoopConfig(...), build_optimizer(model, lr), ...)
    trainer.train(stages)                                   # schedules.build_schedule(...)
    metrics, predictions, scores = trainer.use_kept_model()
    ids, scores = trainer.predictor.predict("sst", test_examples, scores=True)

run_setup.build_trainer builds one from the command line's settings; the trainer never reads them.
Trainer.state_dict / load_state_dict are the checkpoint --resume continues from (training_state.py writes
and reads the files).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from minbert.data.batches import TaskData
from minbert.distributed import SINGLE_PROCESS, Distributed
from minbert.model.checkpoint import (gather_rank_states, optimizer_state, rank_states, read_checkpoint,
                                      restore_optimizer, restore_rng)
from minbert.model.multitask_bert import (MultitaskBERT, load_trained_tensors, model_metadata, save_multitask_model,
                                          trained_tensors)
from minbert.prediction.inference import PredictionSettings, Predictor, TokenizedSplits
from minbert.prediction.leaderboard import kept_model_score
from minbert.prediction.run_evaluation import Evaluator, MetricsLog, stage_record
from minbert.runtime import to_device, use_tf32
from minbert.step_log import RunLog
from minbert.training.gradient_surgery import GradientSurgery
from minbert.training.mlm import MaskedLanguageModelHead
from minbert.training.objective import FinishedBlock, Penalty, compute_task_loss, penalties_state
from minbert.training.schedules import Stage, StageKind, multitask_order, trained_heads
from minbert.training.stage_data import StageData
from minbert.training.stage_transitions import StageTransitions
from minbert.training.training_state import TrainingState, data_fingerprints, save_training_state
from minbert.training.training_steps import LoopConfig, ResumedStage, StagePlace, StepLoop
from optimizer import AdamW


@dataclass
class SimcseStage:
    """What a SimCSE stage trains on and how: NLI triplets, a loss of (anchor, positive, negative) embeddings
    (simcse.py) and its own learning rate."""
    triplets: list
    loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    lr: float


@dataclass
class KeptModel:
    """The model kept as best, in memory: its trained tensors (on the CPU) and its dev evaluation, so the run's
    final predictions need neither a reload nor another dev pass."""
    tensors: dict[str, torch.Tensor]
    metrics: dict
    predictions: dict
    scores: dict


class Trainer:
    """Runs a schedule of stages: each stage's steps with gradient accumulation and the optimizer's updates, a dev
    evaluation after it, the model kept as best and the checkpoints --resume continues from. It owns the model, the
    optimizer, SMART's state and the run's files; `predictor` and `evaluator` predict and evaluate its splits."""

    def __init__(self, model: MultitaskBERT, tokenizer, data: dict[str, TaskData], device: torch.device,
                 config: LoopConfig, optimizer: AdamW, penalties: list[Penalty] | None = None,
                 simcse: SimcseStage | None = None, gradient_surgery: GradientSurgery | None = None,
                 task_settings: dict | None = None, mlm_head: MaskedLanguageModelHead | None = None,
                 distributed: Distributed = SINGLE_PROCESS, settings: dict | None = None):
        """`optimizer`: over the model's (and the mlm head's) parameters (optimization.build_optimizer).
        `gradient_surgery`: how multi-task epochs combine the tasks' gradients (None: one task per step). `mlm_head`:
        given when the schedule has an mlm stage; it trains with the model, and only the training state keeps it.
        `distributed`: this process's place under torchrun; each rank trains on its slice of every batch and
        only rank 0 writes. `settings`: the run's settings as plain values, saved in every checkpoint; `task_settings`:
        the tasks' own options (tasks.task_settings). `penalties`: what each task's objective adds to its loss, in
        order (run_setup.build_penalties)."""
        self.model, self.tokenizer, self.data, self.device, self.config = model, tokenizer, data, device, config
        self.optimizer, self.penalties = optimizer, penalties or []
        self.simcse, self.task_settings = simcse, task_settings or {}
        self.distributed, self.settings = distributed, settings or {}
        triplets = simcse.triplets if simcse is not None else []
        # the data and the penalties' inputs (a teacher's scores) never change in a run, nor between a stop and --resume
        self.data_sha256 = data_fingerprints(data, triplets) | {
            name: sha for penalty in self.penalties for name, sha in penalty.fingerprints().items()}
        self.output_dir, self.precision = Path(config.output_dir), config.precision
        use_tf32(device)
        self.tasks = tuple(data)  # the run's tasks, in tasks.RUN_TASKS' order
        self.state = TrainingState()
        self.run_log = RunLog(self.output_dir, config.report_to, distributed.is_main)
        self.metrics_log = MetricsLog(self.output_dir, self.run_log, distributed.is_main)
        self.steps = StepLoop(model, device, config, optimizer, self.state, self.run_log, self.save_checkpoint,
                              self.penalties, simcse.loss if simcse is not None else None, gradient_surgery,
                              mlm_head, distributed)
        splits = TokenizedSplits(tokenizer, model, config.max_length, self.task_settings)  # training and predictions
        self.predictor = Predictor(model, splits, device, PredictionSettings(
            config.eval_batch_size, config.max_length, self.precision, self.steps.quiet), distributed)
        self.evaluator = Evaluator(self.predictor, data, config.seed)
        self.stage_data = StageData(data, splits, triplets, config.batch_size, config.num_workers,
                                    config.pad_to_multiple_of, device, distributed, gradient_surgery is not None)
        self.transitions = StageTransitions(model, device, self.tasks, config.transitions, self.penalties,
                                            self.finished_block, distributed)
        self.kept: KeptModel | None = None  # the best model of this process's stages (a resumed run may have none)
        self.resumed: ResumedStage | None = None  # a checkpoint inside a stage, until run_stage continues it

    # -- stages -----------------------------------------------------------------------------------
    def run_stage(self, index: int, stage: Stage) -> float:
        seed = self.config.seed + 1000 * index  # data order depends on the stage only: resumable
        self.steps.stage_lr = self.simcse.lr if stage.kind is StageKind.SIMCSE else self.config.lr
        description = f"stage {index + 1} {stage.label}"
        place = StagePlace(index, stage.label)
        resumed, self.resumed = self.resumed, None  # load_state_dict's checkpoint inside this stage, if any
        done = 0 if resumed is None else resumed.position["steps_done"]  # skipped below without a forward pass
        if stage.kind is StageKind.TASK:
            batches = self.stage_data.task_batches(stage, seed, done)
            step, total = partial(self.steps.task_step, stage.task), len(batches)
        elif stage.kind is StageKind.SIMCSE:
            batches, step = self.stage_data.simcse_batches(seed, done), self.steps.simcse_step
            total = self.stage_data.stage_batches(stage)
        elif stage.kind is StageKind.MLM:
            batches, step = self.stage_data.mlm_batches(stage, seed, done), self.steps.mlm_step
            total = self.stage_data.stage_batches(stage)
        else:
            return self.run_multitask_epoch(stage, seed, description, place, resumed)
        return self.steps.run_steps(((step, b) for b in batches), total, description, place=place, resumed=resumed)

    def run_multitask_epoch(self, stage: Stage, seed: int, description: str, place: StagePlace | None = None,
                            resumed: ResumedStage | None = None) -> float:
        batches = self.stage_data.multitask_loaders(seed, None if resumed is None else resumed.position["loaders"])
        rng = random.Random(seed)
        steps = self.stage_data.stage_batches(stage)
        sizes = {t: self.stage_data.train_items(t) for t in self.tasks}
        surgery = self.steps.gradient_surgery
        per_step = len(self.tasks) if surgery else 1  # surgery: a batch of every task a step (round_robin: in turn)
        order = multitask_order(self.config.schedule, sizes, stage.epoch, self.config.epochs, steps * per_step, rng)
        done = 0
        if resumed is not None:
            done = resumed.position["steps_done"]
            version, state, gauss = resumed.position["rng"]  # where gradient surgery's draws stood
            rng.setstate((version, tuple(state), gauss))
        if place is not None:
            def where() -> dict:
                version, state, gauss = rng.getstate()
                return {"loaders": batches.position(), "rng": [version, list(state), gauss]}
            place.extras = where
        if surgery:
            step = partial(self.steps.surgery_step, rng=rng)
            groups = (order[i * per_step:(i + 1) * per_step] for i in range(done, steps))
            pairs = ((step, [(t, batches.next(t)) for t in group]) for group in groups)
            return self.steps.run_steps(pairs, steps, f"{description} {surgery.method}", gradients_reduced=True,
                                        batches_per_step=per_step, place=place, resumed=resumed)
        step = self.steps.task_step
        return self.steps.run_steps(((partial(step, t), batches.next(t)) for t in order[done:]), steps, description,
                                    place=place, resumed=resumed)

    def finished_block(self, stage: Stage, index: int) -> FinishedBlock:
        """Task stage `index`, the last of its block, for the penalties (EWC's Fisher): its task's loss alone on the
        first batches of the stage's own order (its seed); averaged over torchrun's ranks, so that all hold the same."""
        def losses(count: int):
            loader = self.stage_data.train_loader(stage.task, self.config.seed + 1000 * index,
                                                  self.stage_data.stage_size(stage))
            for batch in itertools.islice(loader, count):
                with self.steps.amp:  # the loss only: what consumes it runs outside the autocast
                    loss, _ = compute_task_loss(self.model, stage.task, to_device(batch, self.device))
                yield loss
        distributed = self.distributed
        return FinishedBlock(stage.task, losses, distributed.average_tensors if distributed.enabled else list)

    # -- the whole run ----------------------------------------------------------------------------
    def train(self, stages: list[Stage]) -> None:
        try:
            self._train(stages)
        finally:
            self.run_log.close()  # TensorBoard's events written so far are on disk, even after an interrupt

    def _train(self, stages: list[Stage]) -> None:
        state, config = self.state, self.config
        self.steps.total_updates = sum(math.ceil(self.stage_data.stage_batches(s) / config.grad_accumulation_steps)
                                       for s in stages)
        kept_on = trained_heads(stages, self.tasks)  # the tasks whose dev scores pick the model kept as best
        self.transitions.extend(stages, state)  # a finished run resumed with more --cycles
        if state.next_stage == 0 and not state.history:
            start = time.time()
            dev, _ = self.evaluator.evaluate("dev")
            self.log({"stage": "pretrained", "index": 0, "seconds": time.time() - start, **dev})
        for index in range(state.next_stage, len(stages)):
            if index < state.next_stage:  # early stopping skipped the rest of a multi-epoch stage
                continue
            if config.stop_after_stages is not None and index >= config.stop_after_stages:
                print(f"stopping after {index} stages (--stop_after_stages); continue with --resume")
                return
            # A stage resumed from a checkpoint inside it counts the seconds trained before that too.
            self.steps.stage_start = time.time() - (self.resumed.position["seconds"] if self.resumed else 0)
            train_loss = self.run_stage(index, stages[index])
            seconds = time.time() - self.steps.stage_start  # training only: the dev pass below is not train time
            dev = self.evaluator.evaluate_with_scores("dev")
            train = (self.evaluator.evaluate("train", config.eval_train_examples)[0] if config.eval_train_examples
                     else None)  # --eval_train_examples' train curves
            record = stage_record(stages[index].label, index + 1, train_loss, seconds, dev[0],
                                  state.skipped_updates if self.steps.scaler.is_enabled() else None, train)
            self.log(record)
            self.keep(record, dev, kept_on, index)
            state.next_stage = index + 1
            self.transitions.stop_early(stages, index, state)
            self.transitions.prepare_next_stage(stages, index, record, state.next_stage)
            self.save_checkpoint()
        self.distributed.barrier()  # rank 0's files are complete before any rank reads them

    def keep(self, record: dict, dev: tuple[dict, dict, dict], kept_on: set[str], index: int) -> None:
        """After stage `index`: keep the model as best when its score (kept_model_score of the `kept_on` heads)
        beats the best so far, and save it as OUTPUT_DIR/best.* (and stage_N.* with keep_stage_models)."""
        saved = {"metrics": record, "args": self.settings}
        score = kept_model_score(record, kept_on)
        if score > self.state.best_score:  # every rank holds the same gathered metrics
            self.state.best_score = score
            self.kept = KeptModel({k: v.to("cpu", copy=True) for k, v in trained_tensors(self.model).items()}, *dev)
            if self.distributed.is_main:
                save_multitask_model(self.model, self.output_dir / "best", saved)
        if self.config.keep_stage_models and self.distributed.is_main:
            save_multitask_model(self.model, self.output_dir / f"stage_{index + 1}", saved)

    def use_kept_model(self) -> tuple[dict, dict, dict]:
        """Put the kept model's weights back into the model (the one the optimizer and SMART's anchor hold) and
        return its dev metrics, predictions and scores, with the decision settings chosen then (SQuAD's no-answer
        threshold, among its metrics). A run resumed after its best stage has no copy in memory: it reads
        OUTPUT_DIR/best.* and evaluates dev again under the settings its metrics hold."""
        if self.kept is None:
            tensors, metadata = read_checkpoint(self.output_dir / "best")
            load_trained_tensors(self.model, {k: v.to(self.device) for k, v in tensors.items()})
            return self.evaluator.evaluate_with_scores("dev", chosen=metadata["metrics"])
        load_trained_tensors(self.model, {k: v.to(self.device) for k, v in self.kept.tensors.items()})
        self.evaluator.chosen = self.kept.metrics
        return self.kept.metrics, self.kept.predictions, self.kept.scores

    def penalty(self, name: str) -> Penalty | None:  # the run's penalty of that name (Penalty.name), or None
        return next((penalty for penalty in self.penalties if penalty.name == name), None)

    def log(self, record: dict) -> None:
        """A record of the history (run_evaluation.stage_record), also written where the metrics go."""
        self.state.history.append(record)
        self.metrics_log.write(record, self.state.updates)

    # -- the training state (--resume) ------------------------------------------------------------
    def save_checkpoint(self, position: dict | None = None, local: dict[str, torch.Tensor] | None = None) -> None:
        """OUTPUT_DIR/last.*, the state_dict (a collective: every rank calls it) that --resume continues from."""
        checkpoint = self.state_dict(position, local)
        if checkpoint is not None:
            save_training_state(self.output_dir / "last", *checkpoint)
        self.steps.last_save = time.monotonic()  # save_every_minutes counts from here

    def state_dict(self, position: dict | None = None, local: dict[str, torch.Tensor] | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The checkpoint --resume continues from, as (tensors, plain values), on rank 0; None on the others. A
        collective under torchrun: every rank must call it (each one's dropout generator is kept).

        It holds the model (or what of it trains), optimizer, SMART's anchor, MLM head, every rank's RNG states,
        the TrainingState, the data's fingerprints and the run's settings. Inside a stage (save_inside_stage) also
        `position`, where the stage stands, and every rank's `local` tensors (its sums of the stage's losses)."""
        gathered = gather_rank_states(self.distributed, local)
        if gathered is None:
            return None
        rank_tensors, rng_info = gathered
        tensors = {f"model.{k}": v for k, v in trained_tensors(self.model).items()}
        optimizer_tensors, optimizer_info = optimizer_state(self.optimizer)
        block_tensors, block_best = self.transitions.state()
        penalty_tensors, penalty_values = penalties_state(self.penalties)
        tensors |= optimizer_tensors | rank_tensors | penalty_tensors | block_tensors
        if self.steps.mlm_head is not None:
            tensors |= {f"mlm_head.{k}": v.detach().contiguous() for k, v in self.steps.mlm_head.state_dict().items()}
        state = dataclasses.asdict(self.state)
        return tensors, {
            **model_metadata(self.model), "args": self.settings, "next_stage": state["next_stage"],
            "history": state["history"], "best_score": state["best_score"], "updates": state["updates"],
            "data_sha256": self.data_sha256, "world_size": self.distributed.world_size,
            "optimizer": optimizer_info, "rng": rng_info, **penalty_values,
            # The fp16 gradient scaler's scale and growth counter (plain numbers; {} without fp16).
            "grad_scaler": self.steps.scaler.state_dict(), "skipped_updates": state["skipped_updates"],
            # The block's best stage so far (stage_transitions), its tensors under block_best.; None outside a block.
            "block_best": block_best, "skipped_stages": state["skipped_stages"],
            **({"position": position} if position is not None else {})}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], metadata: dict,
                        saved_schedule_length: int | None = None) -> None:
        """Continue from state_dict's checkpoint (training_state.read_training_state reads and checks it), saved in a
        schedule of `saved_schedule_length` stages (None: this run's); train() extends a finished shorter one."""
        load_trained_tensors(self.model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        restore_optimizer(self.optimizer, tensors, metadata["optimizer"])
        for penalty in self.penalties:
            penalty.load_state(tensors, metadata, self.device)
        if self.steps.mlm_head is not None:
            self.steps.mlm_head.load_state_dict({k[9:]: v for k, v in tensors.items() if k.startswith("mlm_head.")})
        self.transitions.load_state(tensors, metadata.get("block_best"), saved_schedule_length)
        # A run saved before these fields existed, or in another precision (a resume on another GPU kind),
        # starts a fresh scaler, as a run does.
        if self.steps.scaler.is_enabled() and metadata.get("grad_scaler"):
            self.steps.scaler.load_state_dict(metadata["grad_scaler"])
        own = rank_states(tensors, self.distributed.rank)  # this rank's RNG states and sums
        restore_rng(own, metadata["rng"])
        # A checkpoint inside a stage: run_stage continues it (its RNG states are restored again there). Only what
        # that needs is kept, not the weights.
        self.resumed = None
        if "position" in metadata:
            kept = {name: tensor for name, tensor in own.items()
                    if name.startswith(("position.", "rng.")) and ".rank" not in name}
            self.resumed = ResumedStage(metadata["position"], kept, metadata["rng"])
        self.state.restore(metadata)  # in place: the step loop shares it
        # A kill between a stage's log line and its checkpoint leaves a record the checkpoint does not
        # have: the checkpoint's history is the truth. So do steps.jsonl's lines and TensorBoard's steps.
        self.metrics_log.rewrite(self.state.history)
        self.run_log.resume(self.state.updates)
