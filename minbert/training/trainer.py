"""The run of MultitaskBERT over a schedule of stages, around its step loop (loop.StepLoop: a stage's steps, the
optimizer's updates, steps.jsonl and the checkpoints): a dev evaluation after every stage (run_evaluation.py:
metrics.jsonl), the model kept as best, what happens between stages (early stopping, a block's best stage, EWC:
stage_transitions.py) and the stage's checkpoint after its dev pass.

    trainer = Trainer(model, tokenizer, data, device, LoopConfig(...), build_optimizer(model, lr), ...)
    trainer.train(stages)                                   # schedules.build_schedule(...)
    metrics, predictions, scores = trainer.use_kept_model()
    ids, scores = trainer.predictor.predict("sst", test_examples, scores=True)

run_setup.build_trainer builds one from the command line's settings; the trainer never reads them.
Trainer.state_dict / load_state_dict are the checkpoint --resume continues from (loop.RunCheckpoint holds what it
saves, training_state.py writes and reads the files).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from minbert.data.batches import TaskData, TokenizedSplits
from minbert.distributed import SINGLE_PROCESS, Distributed
from minbert.model.checkpoint import read_checkpoint
from minbert.model.multitask_bert import MultitaskBERT, load_trained_tensors, save_multitask_model, trained_tensors
from minbert.prediction.inference import PredictionSettings, Predictor
from minbert.prediction.leaderboard import kept_model_score
from minbert.prediction.run_evaluation import SUBSET_KEY, Evaluator, MetricsLog, stage_record
from minbert.runtime import to_device, use_tf32
from minbert.step_log import RunLog
from minbert.training.gradient_surgery import GradientSurgery
from minbert.training.loop import LoopConfig, RunCheckpoint, StepLoop, StepParts
from minbert.training.mlm import MaskedLanguageModelHead
from minbert.training.objective import FinishedBlock, Penalty, compute_task_loss
from minbert.training.schedules import Stage, trained_heads
from minbert.training.stage_data import StageData
from minbert.training.stage_transitions import StageTransitions
from minbert.training.training_state import TrainingState, data_fingerprints
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
    record: dict  # its stage's record, which best.json holds


@dataclass
class TimeSpent:
    """Seconds of this process in the trainer: training (the stages' steps), evaluation (the dev passes, the train
    scores of --eval_train_examples) and saving the kept model (best.*, stage_N.*)."""
    training: float = 0.0
    evaluation: float = 0.0
    saving_models: float = 0.0


class Trainer:
    """Runs a schedule of stages around its step loop (loop.StepLoop, which trains a stage's steps and saves the
    checkpoints): a dev evaluation after each stage, the model kept as best, what happens between stages (early
    stopping, a block's best stage, EWC) and the stage's checkpoint after its dev pass. It owns the model, the
    optimizer, the penalties and the run's files; `predictor` and `evaluator` predict and evaluate its splits."""

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
        order (penalties.build_penalties)."""
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
        self.run_log = RunLog(self.output_dir, config.report_to, distributed.is_main)
        splits = TokenizedSplits(tokenizer, model, config.max_length, self.task_settings)  # training and predictions
        quiet = config.quiet or not distributed.is_main
        self.predictor = Predictor(model, splits, device, PredictionSettings(
            config.eval_batch_size, config.max_length, self.precision, quiet), distributed)
        self.metrics_log = MetricsLog(self.output_dir, self.run_log, distributed.is_main)
        self.evaluator = Evaluator(self.predictor, data, config.seed)
        self.stage_data = StageData(data, splits, triplets, config.batch_size, config.num_workers,
                                    config.pad_to_multiple_of, device, distributed, gradient_surgery is not None)
        self.transitions = StageTransitions(model, device, self.tasks, config.transitions, self.penalties,
                                            self.finished_block, distributed)
        self.parts = StepParts(model, device, config.precision, self.penalties,
                               simcse.loss if simcse is not None else None, gradient_surgery, mlm_head, distributed)
        checkpoint = RunCheckpoint(self.parts, optimizer, self.transitions, self.output_dir, self.settings,
                                   self.data_sha256, config.save_total_limit)
        self.loop = StepLoop(self.parts, self.stage_data, config, optimizer, checkpoint, self.run_log,
                             simcse.lr if simcse is not None else None)
        self.kept: KeptModel | None = None  # the best model of this process's stages (a resumed run may have none)
        self.spent = TimeSpent()  # where this process's time went, for the run's summary

    @property
    def seconds_saving(self) -> float:
        """Seconds this process spent saving checkpoints (the training state's and the kept model's)."""
        return self.loop.checkpoint.seconds + self.spent.saving_models

    @property
    def state(self) -> TrainingState:
        """The run's progress: the step loop's, which the trainer records its stages in."""
        return self.loop.state

    def run_stage(self, index: int, stage: Stage) -> float:
        """Stage `index` of the schedule, trained by the step loop; its mean loss."""
        return self.loop.run_stage(index, stage)

    def finished_block(self, stage: Stage, index: int) -> FinishedBlock:
        """Task stage `index`, the last of its block, for the penalties (EWC's Fisher): its task's loss alone on the
        first batches of the stage's own order (its seed); averaged over torchrun's ranks, so that all hold the same."""
        def losses(count: int):
            loader = self.stage_data.train_loader(stage.task, self.config.seed + 1000 * index,
                                                  self.stage_data.stage_size(stage))
            for batch in itertools.islice(loader, count):
                with self.parts.amp:  # the loss only: what consumes it runs outside the autocast
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
        state.total_updates = sum(math.ceil(self.stage_data.stage_batches(s) / config.grad_accumulation_steps)
                                  for s in stages)
        kept_on = trained_heads(stages, self.tasks)  # the tasks whose dev scores pick the model kept as best
        self.transitions.extend(stages, state)  # a finished run resumed with more --cycles
        if state.next_stage == 0 and not state.history:
            start = time.time()
            dev = self.score_dev()[0]
            evaluation = time.time() - start
            self.spent.evaluation += evaluation
            self.log({"stage": "pretrained", "index": 0, "seconds": evaluation, **dev})
        for index in range(state.next_stage, len(stages)):
            if index < state.next_stage:  # early stopping skipped the rest of a multi-epoch stage
                continue
            if self.loop.decide_stage(index).should_stop:
                print(f"stopping after {index} stages (--stop_after_stages); continue with --resume")
                return
            # A stage resumed from a checkpoint inside it counts the seconds trained before that too.
            began = time.time()
            start = began - (state.stage.seconds_before if state.stage is not None else 0)
            train_loss = self.run_stage(index, stages[index])
            trained = time.time()
            self.spent.training += trained - began
            dev = self.score_dev()
            train = (self.evaluator.evaluate("train", config.eval_train_examples)[0] if config.eval_train_examples
                     else None)  # --eval_train_examples' train curves
            evaluation = time.time() - trained
            self.spent.evaluation += evaluation
            record = stage_record(stages[index].label, index + 1, train_loss, trained - start, dev[0],
                                  state.skipped_updates if self.parts.scaler.is_enabled() else None, train,
                                  eval_seconds=evaluation)
            self.log(record)
            self.keep(record, dev, kept_on, index)
            state.next_stage = index + 1
            self.transitions.stop_early(stages, index, state)
            self.transitions.prepare_next_stage(stages, index, record, state.next_stage)
            self.loop.save()
        self.distributed.barrier()  # rank 0's files are complete before any rank reads them

    def score_dev(self) -> tuple[dict, dict, dict]:
        """The dev evaluation after a stage, which picks the kept model: every dev example, or with
        --max_eval_examples N each task's fixed subset of N (run_evaluation.Evaluator draws it from --seed, the same
        every stage), its metrics then labelled with SUBSET_KEY."""
        limit = self.config.max_eval_examples
        metrics, predictions, scores = self.evaluator.evaluate_with_scores("dev", limit)
        return (metrics if limit is None else {**metrics, SUBSET_KEY: limit}), predictions, scores

    def keep(self, record: dict, dev: tuple[dict, dict, dict], kept_on: set[str], index: int) -> None:
        """After stage `index`: keep the model as best when its score (kept_model_score of the `kept_on` heads)
        beats the best so far, and save it as OUTPUT_DIR/best.* (and stage_N.* with keep_stage_models)."""
        saved = {"metrics": record, "args": self.settings}
        score = kept_model_score(record, kept_on)
        start = time.time()
        if score > self.state.best_score:  # every rank holds the same gathered metrics
            self.state.best_score = score
            self.kept = KeptModel({k: v.to("cpu", copy=True) for k, v in trained_tensors(self.model).items()}, *dev,
                                  record)
            if self.distributed.is_main:
                save_multitask_model(self.model, self.output_dir / "best", saved)
        if self.config.keep_stage_models and self.distributed.is_main:
            save_multitask_model(self.model, self.output_dir / f"stage_{index + 1}", saved)
        self.spent.saving_models += time.time() - start

    def use_kept_model(self) -> tuple[dict, dict, dict]:
        """Put the kept model's weights back into the model (the one the optimizer and SMART's anchor hold) and
        return its dev metrics, predictions and scores, with the decision settings chosen then (SQuAD's no-answer
        threshold, among its metrics). A run resumed after its best stage has no copy in memory: it reads
        OUTPUT_DIR/best.* and evaluates dev again under the settings its metrics hold. Under --max_eval_examples the
        kept model is scored on every dev example now (the settings chosen afresh there), and best.json's metrics
        become those."""
        if self.kept is None:
            tensors, metadata = read_checkpoint(self.output_dir / "best")
            load_trained_tensors(self.model, {k: v.to(self.device) for k, v in tensors.items()})
            if self.config.max_eval_examples is None:
                return self.evaluator.evaluate_with_scores("dev", chosen=metadata["metrics"])
            return self.score_full_dev(metadata["metrics"])
        load_trained_tensors(self.model, {k: v.to(self.device) for k, v in self.kept.tensors.items()})
        if self.config.max_eval_examples is not None:
            return self.score_full_dev(self.kept.record)
        self.evaluator.chosen = self.kept.metrics
        return self.kept.metrics, self.kept.predictions, self.kept.scores

    def score_full_dev(self, record: dict) -> tuple[dict, dict, dict]:
        """The model in place (the kept one, picked on dev subsets: its stage's `record`) scored on every dev
        example; best.json saved again with these metrics, so that it describes the CSVs the run writes."""
        metrics, predictions, scores = self.evaluator.evaluate_with_scores("dev")
        if self.distributed.is_main:
            full = {**{k: v for k, v in record.items() if k != SUBSET_KEY}, **metrics}
            save_multitask_model(self.model, self.output_dir / "best", {"metrics": full, "args": self.settings})
        return metrics, predictions, scores

    def penalty(self, name: str) -> Penalty | None:  # the run's penalty of that name (Penalty.name), or None
        return next((penalty for penalty in self.penalties if penalty.name == name), None)

    def log(self, record: dict) -> None:
        """A record of the history (run_evaluation.stage_record), also written where the metrics go."""
        self.state.history.append(record)
        self.metrics_log.write(record, self.state.updates)

    # -- the training state (--resume) ------------------------------------------------------------
    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The checkpoint --resume continues from, as the step loop saves it after a stage (loop.RunCheckpoint)."""
        return self.loop.checkpoint.state_dict(self.state)

    def load_state_dict(self, tensors: dict[str, torch.Tensor], metadata: dict,
                        saved_schedule_length: int | None = None) -> None:
        """Continue from state_dict's checkpoint (training_state.read_training_state reads and checks it), saved in a
        schedule of `saved_schedule_length` stages (None: this run's); train() extends a finished shorter one."""
        self.loop.resume(tensors, metadata, saved_schedule_length)
        # A kill between a stage's log line and its checkpoint leaves a record the checkpoint does not
        # have: the checkpoint's history is the truth. So do steps.jsonl's lines and TensorBoard's steps.
        self.metrics_log.rewrite(self.state.history)
        self.run_log.resume(self.state.updates)
