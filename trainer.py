"""The training loop of MultitaskBERT: stages, optimisation steps with gradient accumulation, SMART,
LNSR, gradient surgery, evaluation after every stage, logging (metrics.jsonl per stage, steps.jsonl every
logging_steps updates: step_log.py), the model kept as best and the training state.

    trainer = Trainer(model, tokenizer, data, device, LoopConfig(...), build_optimizer(model, lr), ...)
    trainer.train(stages)                                   # schedules.build_schedule(...)
    metrics, predictions, scores = trainer.use_kept_model()

training_args.build_trainer builds one from the command line's settings; the trainer never reads them.
Trainer.state_dict / load_state_dict are the checkpoint --resume continues from (training_state.py writes
and reads the files).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from checkpoint import optimizer_state, read_checkpoint, restore_optimizer, restore_rng, rng_state
from continual import L2SP, ElasticWeightConsolidation
from datasets import (TaskData, TokenizationCache, TokenizedExamples, predict_in_file_order, subsample,
                      subsample_indices, tokenized_dataloader)
from distillation import Distillation
from distributed import SINGLE_PROCESS, Distributed, global_batch_count
from evaluation import kept_model_score, overall_score, summarize_line, task_metrics
from gradient_surgery import GradientSurgery
from lnsr import LnsrConfig, encode_with_noise_stability
from mlm import MaskedLanguageModelHead, mlm_batches, mlm_loss, task_sentences
from multitask_bert import (MultitaskBERT, load_trained_tensors, model_metadata, save_multitask_model,
                            trained_tensors)
from optimizer import AdamW, weight_decay_groups
from runtime import autocast, float32_exact, pad_to_multiple_of, scaled_step, to_device, use_tf32
from schedules import (Stage, StageKind, block_length, learning_rate_factor, multi_epoch_stages, multitask_order,
                       patience_exhausted, trained_heads)
from simcse import triplet_batches
from smart import BregmanTeacher, SmartRegularizer, bregman_momentum, computes_exactly
from squad import Answer, QAExample, QASettings, QAWindows, best_threshold, decode_answers, qa_metrics
from step_log import DeviceSums, RunLog, read_back
from tasks import TASKS
from training_state import save_training_state

SUMMARY_KEYS = ("index", "stage", "train_loss", "seconds", "sst_acc", "sst_f1_weighted", "qqp_acc", "qqp_f1_weighted",
                "sts_pearson", "sts_spearman", "overall", "qa_f1")
STAGE_FIELDS = ("seconds", "fp16_skipped_updates")  # in a stage's record, with train_loss: what is not a dev metric


def compute_task_loss(model: MultitaskBERT, task: str, batch: dict, regularizer: SmartRegularizer | None = None,
                      lnsr: LnsrConfig | None = None, distillation: Distillation | None = None,
                      defences: dict[str, ElasticWeightConsolidation | L2SP] | None = None) -> torch.Tensor:
    """The task's loss on one batch (mixed with the teacher's scores under distillation), plus SMART's and
    LNSR's penalties and the defences against forgetting (EWC's, L2-SP's: continual.py) when they are given.

    With SMART at precision "exact", or under fp16 autocast, the whole step runs in exact float32 whatever the
    run's autocast (smart.computes_exactly says why)."""
    return task_loss_and_penalties(model, task, batch, regularizer, lnsr, distillation, defences)[0]


def task_loss_and_penalties(model: MultitaskBERT, task: str, batch: dict, regularizer: SmartRegularizer | None = None,
                            lnsr: LnsrConfig | None = None, distillation: Distillation | None = None,
                            defences: dict[str, ElasticWeightConsolidation | L2SP] | None = None
                            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """compute_task_loss's loss, and the penalties in it as they were added, detached on the device: SMART's
    "smart_adversarial" (lambda_s * R_s) and "smart_bregman" (mu * D_Breg), LNSR's "lnsr", and each defence's
    under its name in `defences` ("ewc", "l2sp")."""
    exact = regularizer is not None and computes_exactly(regularizer.config, next(model.parameters()).device.type)
    with float32_exact() if exact else nullcontext():
        return _task_loss(model, task, batch, regularizer, lnsr, distillation, defences)


def _task_loss(model: MultitaskBERT, task: str, batch: dict, regularizer: SmartRegularizer | None,
               lnsr: LnsrConfig | None, distillation: Distillation | None,
               defences: dict[str, ElasticWeightConsolidation | L2SP] | None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.set_adapter(task)  # the passes below run the encoder in parts, not through forward()
    inputs = model.encoder_inputs(task, batch)
    embeddings = model.embed(inputs)

    def forward_fn(e):
        return model.outputs_from_embeddings(task, e, inputs)
    objective = model.objectives[task]
    penalty = None
    penalties = {}
    if lnsr is None:
        outputs = forward_fn(embeddings)
    else:  # the clean pass of LNSR is the task's forward
        hidden, penalty = encode_with_noise_stability(model.bert.encoder, embeddings, inputs.attention_mask, lnsr,
                                                      inputs.layout)
        outputs = model.outputs_from_hidden(task, hidden, inputs)
    loss = objective.loss(outputs, batch["labels"])
    if distillation is not None:
        loss = distillation.mix(task, loss, objective, outputs, batch["ids"])
    if penalty is not None:
        loss = loss + penalty
        penalties["lnsr"] = penalty.detach()
    if regularizer is not None:
        loss = loss + regularizer.penalty(forward_fn, embeddings, outputs, objective.divergence,
                                          teacher_args=(task, batch), token_mask=inputs.attention_mask)
        penalties.update({f"smart_{name}": term for name, term in regularizer.terms.items()})
    for name, defence in (defences or {}).items():  # on the weights alone: computed on the device, nothing read back
        term = defence.penalty(model)
        loss = loss + term
        penalties[name] = term.detach()
    return loss, penalties


@torch.inference_mode()
def predict_examples(model: MultitaskBERT, task: str, examples: list | TokenizedExamples, tokenizer,
                     device: torch.device, batch_size: int, max_length: int, precision: str = "fp32",
                     quiet: bool = True, distributed: Distributed = SINGLE_PROCESS,
                     scores: bool = False) -> tuple[list[str], np.ndarray]:
    """The model's prediction for every example (SST class, QQP 0/1, STS 0-5), ids in the examples' order;
    with `scores` the score each prediction is decided from instead (losses.py: SST's 5 logits, QQP's logit).
    `precision`: a resolved one (runtime.resolve_precision), bf16 / fp16 autocast or fp32.
    Under torchrun each rank predicts every world_size-th example and all ranks get all predictions.
    `examples` may be tokenised already (Trainer.predict's cache), with max_length and the task's pair encoding."""
    model.eval()
    cross_encoder = model.reads_pairs_jointly(task)
    if not isinstance(examples, TokenizedExamples):
        examples = TokenizedExamples.tokenize(examples, tokenizer, max_length, cross_encoder)
    elif (examples.max_length, examples.cross_encoder) != (max_length, cross_encoder):
        raise ValueError(f"{task} examples tokenised with max_length {examples.max_length} and cross_encoder "
                         f"{examples.cross_encoder}, but predicting needs {max_length} and {cross_encoder}")

    def predict_shard(shard: TokenizedExamples) -> tuple[list[str], np.ndarray]:
        loader = tokenized_dataloader(shard, batch_size, shuffle=False, pin_memory=device.type == "cuda",
                                      pad_to_multiple_of=pad_to_multiple_of(device))
        ids, outputs = [], []
        for batch in tqdm(loader, desc=f"predict {task}", leave=False, disable=quiet):
            batch = to_device(batch, device)
            with autocast(device, precision):
                outputs.append(model.score(task, batch).float().cpu().numpy())
            ids += batch["ids"]
        return ids, np.concatenate(outputs)
    ids, values = predict_in_file_order(examples, predict_shard, distributed)
    return ids, values if scores else decide(model, task, values)


@torch.inference_mode()
def predict_span_logits(model: MultitaskBERT, windows: QAWindows, device: torch.device, batch_size: int,
                        precision: str = "fp32", quiet: bool = True,
                        distributed: Distributed = SINGLE_PROCESS) -> tuple[list[str], np.ndarray]:
    """The start and end logits of every SQuAD window, (window ids, (N, max_length, 2)) in the windows' order,
    zero beyond each window's tokens; under torchrun each rank reads every world_size-th window and all ranks
    get every window's."""
    model.eval()

    def predict_shard(shard: QAWindows) -> tuple[list[str], np.ndarray]:
        loader = tokenized_dataloader(shard, batch_size, shuffle=False, pin_memory=device.type == "cuda",
                                      pad_to_multiple_of=pad_to_multiple_of(device))
        ids, logits = [], []
        for batch in tqdm(loader, desc="predict qa", leave=False, disable=quiet):
            batch = to_device(batch, device)
            with autocast(device, precision):
                values = model.score("qa", batch).float().cpu().numpy()  # (B, T, 2)
            logits.append(np.pad(values, ((0, 0), (0, windows.max_length - values.shape[1]), (0, 0))))
            ids += batch["ids"]
        return ids, np.concatenate(logits)  # (B, max_length, 2)
    return predict_in_file_order(windows, predict_shard, distributed)


@torch.inference_mode()
def predict_answers(model: MultitaskBERT, windows: QAWindows, device: torch.device, batch_size: int,
                    precision: str = "fp32", quiet: bool = True, distributed: Distributed = SINGLE_PROCESS,
                    n_best: int = 20, max_answer_tokens: int = 30) -> dict[str, Answer]:
    """Every SQuAD question's best span and no-answer margin (squad.decode_answers) from the logits of all
    of its windows (predict_span_logits)."""
    _, logits = predict_span_logits(model, windows, device, batch_size, precision, quiet, distributed)
    return decode_answers(windows, logits, n_best, max_answer_tokens)


def decide(model: MultitaskBERT, task: str, scores: np.ndarray) -> np.ndarray:
    """The predictions of saved scores (losses.py's decide): SST classes, QQP 0/1, STS scores as they are."""
    return model.objectives[task].decide(torch.from_numpy(scores)).numpy()


def data_fingerprints(data: dict[str, TaskData], triplets: list) -> dict[str, str]:
    """SHA-256 of the examples (ids, texts, labels) of every split a run reads, by 'task/split': --resume
    compares the data itself, so a moved or renamed data folder resumes and a changed file does not."""
    parts = {f"{task}/{split}": getattr(task_data, split) for task, task_data in data.items()
             for split in ("train", "dev", "test") if getattr(task_data, split) is not None}
    if triplets:
        parts["simcse/train"] = triplets
    return {name: hashlib.sha256("".join(map(repr, examples)).encode()).hexdigest()
            for name, examples in parts.items()}


class TrainingDiverged(RuntimeError):
    """A loss that is not finite: the run stops there rather than train every later stage on NaN."""


class StageLosses:
    """A stage's losses, kept on the device: adding one reads nothing back, so the device runs ahead of the host.
    The host reads them (read_recent, read_mean) only every logging_steps updates and at the stage's end, and
    then also learns whether some loss was not finite, and at which update the first one was."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.recent = torch.zeros((), dtype=torch.float64, device=device)
        self.first_nonfinite = torch.full((), -1, dtype=torch.int64, device=device)  # an update, or -1
        self.count = self.recent_count = 0

    def add(self, loss: torch.Tensor, update: int) -> None:
        """One micro-step's loss (a 0-dim tensor on the device), taken during optimizer update `update` (0-based)."""
        loss = loss.to(torch.float64)
        self.total += loss
        self.recent += loss
        self.count += 1
        self.recent_count += 1
        self.first_nonfinite.masked_fill_((self.first_nonfinite < 0) & ~torch.isfinite(loss), update)

    def read_recent(self, where: str, also: dict | None = None) -> tuple[float, dict[object, float]]:
        """The mean loss since the last read_recent, and the 0-dim device tensors of `also` as host floats (by the
        same keys): all read back in one transfer, a host sync. TrainingDiverged if a loss was not finite."""
        also = also or {}
        recent, first_nonfinite, *values = read_back([self.recent, self.first_nonfinite, *also.values()])
        self.raise_if_diverged(int(first_nonfinite), where)
        self.recent.zero_()
        mean = recent / max(self.recent_count, 1)
        self.recent_count = 0
        return mean, dict(zip(also, values))

    def read_mean(self, where: str) -> float:
        """The mean loss of the stage (a host sync; NaN for a stage of no step); TrainingDiverged as read_recent."""
        if not self.count:
            return float("nan")
        self.check(where)
        return self.total.item() / self.count

    def check(self, where: str) -> None:
        self.raise_if_diverged(int(self.first_nonfinite), where)

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """The sums (device tensors) and counts so far, which a checkpoint inside the stage keeps (load_state)."""
        return ({"total": self.total, "recent": self.recent, "first_nonfinite": self.first_nonfinite},
                {"count": self.count, "recent_count": self.recent_count})

    def load_state(self, tensors: dict[str, torch.Tensor], counts: dict[str, int]) -> None:
        for name, tensor in tensors.items():
            getattr(self, name).copy_(tensor)
        self.count, self.recent_count = counts["count"], counts["recent_count"]

    @staticmethod
    def raise_if_diverged(update: int, where: str) -> None:
        if update >= 0:
            raise TrainingDiverged(f"training diverged in {where}: the loss of update {update + 1} of the run is not "
                                   "finite; nothing after the last checkpoint is saved. Lower --lr and rerun")


class RestartingLoaders:
    """Batches from each task's loader; a loader that runs out starts over in a new order, as in
    round-robin and annealed sampling, where the smaller tasks are seen more than once per epoch.
    `start`: where a resumed stage's loaders stood, by task (position())."""

    def __init__(self, loaders: dict, start: dict[str, list[int]] | None = None):
        self.loaders = loaders
        self.restarts = dict.fromkeys(loaders, 0)
        self.taken = dict.fromkeys(loaders, 0)  # batches of each loader's current pass
        for task, (restarts, taken) in (start or {}).items():
            self.restarts[task], self.taken[task] = restarts, taken
            loaders[task].batch_sampler.set_epoch(restarts, taken)  # the batches taken are never collated again
        self.iterators = {task: iter(loader) for task, loader in loaders.items()}

    def next(self, task: str) -> dict:
        try:
            batch = next(self.iterators[task])
        except StopIteration:
            self.restarts[task] += 1
            self.taken[task] = 0
            self.loaders[task].batch_sampler.set_epoch(self.restarts[task])
            self.iterators[task] = iter(self.loaders[task])
            batch = next(self.iterators[task])
        self.taken[task] += 1
        return batch

    def position(self) -> dict[str, list[int]]:
        """By task: [passes restarted, batches taken of the current pass]."""
        return {task: [self.restarts[task], self.taken[task]] for task in self.loaders}


@dataclass(frozen=True)
class LoopConfig:
    """The training loop's own settings. The run's objects (optimizer, SMART and LNSR, the SimCSE loss, gradient
    surgery) are built outside (training_args.build_trainer does it from the command line) and handed over."""
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
    # A multi-epoch stage (schedules.multi_epoch_stages) stops repeating after this many epochs that do not beat its
    # task's best dev score since it began (None: every epoch runs).
    patience: int | None = None
    # What the stage after a block of repeated task stages (schedules.block_length), or of SimCSE stages, starts
    # from (schedules.STAGE_STARTS): the block's last weights, or those of its stage with the best dev score of the
    # block's task (SimCSE: STS's Pearson), as the thesis' sequential runs and its SimCSE stage do.
    stage_start: str = "last"
    simcse_keep: str = "last"


@dataclass
class Regularization:
    """SMART (a regularizer per task, sharing one Bregman teacher), LNSR (a config per task) and the defences
    against forgetting of a sequential schedule: EWC and L2-SP (continual.py), added to every task step's loss."""
    smart: dict[str, SmartRegularizer] = field(default_factory=dict)
    teacher: BregmanTeacher | None = None
    teacher_momentum: float | None = None  # a fixed beta, or None for the SMART paper's schedule (bregman_momentum)
    # Whether that schedule's 10% is of the run's updates or of each stage's, restarting every stage
    # (smart.MOMENTUM_SCHEDULES).
    momentum_schedule: str = "run"
    # What D_Breg compares with (smart.ANCHORS): the moving average, or the weights the stage started from (the
    # teacher is reset before every stage and never updated).
    anchor: str = "moving_average"
    lnsr: dict[str, LnsrConfig] = field(default_factory=dict)
    ewc: ElasticWeightConsolidation | None = None  # consolidated when a block of task stages gives way to the next
    ewc_fisher_batches: int = 100  # the Fisher's batches: the first ones of the block's last stage
    l2sp: L2SP | None = None

    @property
    def defences(self) -> dict[str, ElasticWeightConsolidation | L2SP]:
        """The defences against forgetting by their penalties' names (task_loss_and_penalties)."""
        return {name: defence for name, defence in (("ewc", self.ewc), ("l2sp", self.l2sp)) if defence is not None}


@dataclass
class SimcseStage:
    """What a SimCSE stage trains on and how: NLI triplets, a loss of (anchor, positive, negative) embeddings
    (simcse.py) and its own learning rate."""
    triplets: list
    loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    lr: float


@dataclass
class TrainingState:
    """Where a run stands between stages; with the tensors, what Trainer.state_dict saves for --resume."""
    next_stage: int = 0
    updates: int = 0  # optimizer steps taken; the learning rate and SMART's momentum follow it
    best_score: float = -math.inf  # kept_model_score of the model kept so far
    history: list[dict] = field(default_factory=list)  # one record per evaluation (index 0: the pretrained model)
    skipped_updates: int = 0  # fp16 steps skipped for inf / NaN gradients
    skipped_stages: list[int] = field(default_factory=list)  # schedule positions early stopping skipped (0-based)


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


@dataclass
class BlockBest:
    """The best stage so far of a block of repeated stages that --stage_start best (--simcse_keep best) resolves:
    its number (its history record's index), its dev score and its trained tensors, on the CPU."""
    index: int
    score: float
    tensors: dict[str, torch.Tensor]


@dataclass
class KeptModel:
    """The model kept as best, in memory: its trained tensors (on the CPU) and its dev evaluation, so the run's
    final predictions need neither a reload nor another dev pass."""
    tensors: dict[str, torch.Tensor]
    metrics: dict
    predictions: dict
    scores: dict
    qa_threshold: float


class Trainer:
    """Runs a schedule of stages; owns the model, the optimizer, SMART's state and the run's checkpoints."""

    def __init__(self, model: MultitaskBERT, tokenizer, data: dict[str, TaskData], device: torch.device,
                 config: LoopConfig, optimizer: AdamW, regularization: Regularization | None = None,
                 simcse: SimcseStage | None = None, gradient_surgery: GradientSurgery | None = None,
                 qa: QASettings = QASettings(), mlm_head: MaskedLanguageModelHead | None = None,
                 distributed: Distributed = SINGLE_PROCESS, settings: dict | None = None,
                 distillation: Distillation | None = None):
        """`optimizer`: over the model's (and the mlm head's) parameters (build_optimizer). `gradient_surgery`:
        how multi-task epochs combine the tasks' gradients (None: one task per step). `mlm_head`: given when
        the schedule has an mlm stage; it trains with the model, and only the training state keeps it.
        `distributed`: this process's place under torchrun; each rank trains on its slice of every batch and
        only rank 0 writes. `settings`: the run's settings as plain values, saved in every checkpoint.
        `distillation`: a teacher's train scores that task steps mix into the gold loss."""
        self.model, self.tokenizer, self.data, self.device, self.config = model, tokenizer, data, device, config
        self.optimizer = optimizer
        self.regularization = regularization or Regularization()
        self.simcse, self.gradient_surgery, self.qa, self.mlm_head = simcse, gradient_surgery, qa, mlm_head
        self.distillation = distillation
        self.distributed = distributed
        self.settings = settings or {}
        self.triplets = simcse.triplets if simcse is not None else []
        # the data and a teacher's scores never change during a run, nor between a stop and its --resume
        self.data_sha256 = data_fingerprints(data, self.triplets) | (distillation.fingerprints() if distillation
                                                                     else {})
        self.quiet = config.quiet or not distributed.is_main
        self.output_dir = Path(config.output_dir)
        self.precision = config.precision
        use_tf32(device)
        self.amp = autocast(device, self.precision)
        # fp16 (GPUs without bf16: T4, V100) underflows small gradients: the loss is scaled up before backward
        # and the gradients unscaled before clipping and the step; a step with inf / NaN gradients is skipped.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.state = TrainingState()
        self.kept: KeptModel | None = None  # the best model of this process's stages (a resumed run may have none)
        self.block_best: BlockBest | None = None  # the best stage of the block under way (stage_start, simcse_keep)
        # The optimizer update under way within its stage, and the stage's updates: SMART's momentum schedule "stage".
        self.stage_update, self.stage_updates = 0, 1
        self.total_updates = 1
        self.stage_lr = config.lr
        self.tokenized = TokenizationCache(tokenizer)  # each split tokenised once per run
        self.tasks = tuple(data)  # the run's tasks, in tasks.RUN_TASKS' order
        self.qa_threshold = 0.0  # SQuAD's no-answer threshold, chosen on dev at every dev evaluation
        self.run_log = RunLog(self.output_dir, config.report_to, distributed.is_main)
        # Since the last line of steps.jsonl, on the device: each task's losses (simcse and mlm stages: theirs),
        # and the penalties (task_loss_and_penalties' names).
        self.task_losses, self.penalties = DeviceSums(), DeviceSums()
        self.learning_rate = config.lr  # the base rate of the last update (parameter groups scale it)
        self.resumed: ResumedStage | None = None  # a checkpoint inside a stage, until run_stage continues it
        self.last_save = time.monotonic()  # of the last checkpoint: save_every_minutes counts from it
        self.stage_start = time.time()  # when the stage being trained began (a resumed one: its earlier seconds too)

    # -- one optimisation step --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, count: int | torch.Tensor, group_size: int) -> None:
        """Backward of a mean loss over `count` local items (examples, masked tokens), divided by its
        accumulation group's size; under torchrun weighted by this rank's share of the global batch."""
        if self.distributed.enabled:
            loss = loss * self.distributed.share(count, self.device)
        self.scaler.scale(loss / group_size).backward()

    def task_step(self, task: str, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            loss, penalties = task_loss_and_penalties(self.model, task, batch, self.regularization.smart.get(task),
                                                      self.regularization.lnsr.get(task), self.distillation,
                                                      self.regularization.defences)
        if loss.requires_grad:  # not so for the SBERT cosine with --option pretrain: it has no trainable weight
            self.backward(loss, len(batch["labels"]), group_size)
        self.task_losses.add(task, loss)
        for name, value in penalties.items():
            self.penalties.add(name, value)
        return loss.detach()

    def simcse_step(self, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            embeddings = self.model.encode_sentences(batch["input_ids"], batch["attention_mask"])
            # Under torchrun every rank's triplets are in-batch negatives (gradients reach the local slice).
            anchor, positive, negative = (self.distributed.gather_with_grad(e) for e in embeddings.chunk(3))
            loss = self.simcse.loss(anchor, positive, negative)
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
        """Average the gradients over ranks (unless `gradients_reduced`), clip them and step. Returns the gradients'
        total norm before clipping, a 0-dim device tensor, when clipping computes it or `measure_norm` asks for
        it (a step that logs it); else None."""
        if not gradients_reduced:
            self.distributed.average_gradients(self.model.parameters())
            if self.mlm_head is not None:
                self.distributed.average_gradients(self.mlm_head.parameters())
        self.scaler.unscale_(self.optimizer)  # clipping and the step see the true gradients
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        norm = None
        if self.config.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        elif measure_norm:
            norm = gradient_norm(params, self.device)
        factor = learning_rate_factor(self.state.updates, self.total_updates, self.config.lr_schedule,
                                      self.config.warmup_ratio)
        self.learning_rate = self.stage_lr * factor
        for group in self.optimizer.param_groups:
            group["lr"].fill_(self.learning_rate * group["lr_scale"])  # in place: nothing waits, nothing recompiles
        stepped = scaled_step(self.scaler, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        if not stepped:
            # Nothing moved: neither the teacher nor the schedules (learning rate, SMART's momentum) advance.
            self.state.skipped_updates += 1
            return norm
        regularization = self.regularization
        teacher = regularization.teacher
        if teacher is not None and regularization.anchor == "moving_average":
            position, count = ((self.stage_update, self.stage_updates) if regularization.momentum_schedule == "stage"
                               else (self.state.updates, self.total_updates))
            teacher.momentum = bregman_momentum(position, count, regularization.teacher_momentum)
            teacher.update(self.model)
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
        self.penalties.clear()
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
        local |= {f"position.penalties.{name}": tensor for name, tensor in self.penalties.sums.items()}
        position = {"stage": place.index, "label": place.label, "steps_done": done, "steps": total,
                    "updates": math.ceil(done / accumulation), "stage_updates": math.ceil(total / accumulation),
                    "seconds": time.time() - self.stage_start, "losses": loss_counts,
                    "task_losses": dict(self.task_losses.counts), "penalties": dict(self.penalties.counts),
                    **place.extras()}
        self.save_checkpoint(position, local)

    def continue_stage(self, resumed: ResumedStage, losses: StageLosses) -> int:
        """Put back what a checkpoint inside the stage kept of its sums (the stage's losses, steps.jsonl's since its
        last line) and RNG states; returns the steps it had done."""
        position, tensors = resumed.position, resumed.tensors
        losses.load_state({name: tensors[f"position.losses.{name}"] for name in ("total", "recent", "first_nonfinite")},
                          position["losses"])
        for name, sums in (("task_losses", self.task_losses), ("penalties", self.penalties)):
            sums.load_state({key: tensors[f"position.{name}.{key}"].to(self.device) for key in position[name]},
                            position[name])
        # Only now that the stage's loaders exist: each iter(DataLoader) draws a seed from torch's generator, as the
        # saving run's had done before it saved.
        restore_rng(tensors, resumed.rng)
        return position["steps_done"]

    def log_steps(self, losses: StageLosses, description: str, grad_norm: torch.Tensor, seconds: float,
                  examples: int) -> float:
        """A line of steps.jsonl (and TensorBoard's train/ scalars) for the updates since the last one: what was
        summed on the device since then, read back in one transfer. Returns the loss; TrainingDiverged if one
        was not finite. `grad_norm`: the last update's (before clipping); the loss, the tasks' losses and the
        penalties are means over the micro-steps (rank 0's), the learning rate the base rate of the last update."""
        tasks, penalties = self.task_losses, self.penalties
        values = {("task", name): value for name, value in tasks.sums.items()}
        values |= {("penalty", name): value for name, value in penalties.sums.items()}
        values["grad_norm"] = grad_norm
        loss, read = losses.read_recent(description, values)
        line = {"update": self.state.updates, "stage": description, "task": ",".join(tasks.sums), "loss": loss}
        if len(tasks.sums) > 1:
            line["task_loss"] = {name: read["task", name] / tasks.counts[name] for name in tasks.sums}
        line |= {"lr": self.learning_rate, "grad_norm": read["grad_norm"]}
        line |= {name: read["penalty", name] / penalties.counts[name] for name in penalties.sums}
        if self.regularization.smart:  # adversarial terms dropped for a non-finite ascent, so far in the run
            line["smart_skipped_steps"] = sum(r.skipped_steps for r in self.regularization.smart.values())
        if self.scaler.is_enabled():
            line |= {"fp16_scale": self.scaler.get_scale(), "fp16_skipped_updates": self.state.skipped_updates}
        line |= {"seconds": seconds, "examples_per_second": examples / max(seconds, 1e-9)}
        self.run_log.step(line)
        tasks.clear()
        penalties.clear()
        return loss

    # -- stages -----------------------------------------------------------------------------------
    def tokenized_split(self, task: str, examples: list) -> TokenizedExamples | QAWindows:
        """A split ready to batch, made on its first use only: tokenised examples, or SQuAD's windows."""
        if TASKS[task].is_extractive:
            return self.tokenized.windows(examples, self.qa.max_length, self.qa.doc_stride)
        return self.tokenized.get(examples, self.config.max_length, self.model.reads_pairs_jointly(task))

    def train_items(self, task: str) -> int:
        """What one epoch of the task trains on: its training examples, or for SQuAD its windows."""
        return len(self.tokenized_split(task, self.data[task].train))

    def train_loader(self, task: str, seed: int, size: int | None = None):
        """A loader over the task's training split, or over `size` of its examples (SQuAD: windows) drawn
        with `seed` (datasets.subsample's)."""
        train = self.tokenized_split(task, self.data[task].train)
        if size is not None:
            train = train.subset(subsample_indices(len(train), size, seed))
        return tokenized_dataloader(train, self.config.batch_size, shuffle=True, seed=seed,
                                    num_workers=self.config.num_workers, world_size=self.distributed.world_size,
                                    rank=self.distributed.rank, pin_memory=self.device.type == "cuda",
                                    pad_to_multiple_of=self.config.pad_to_multiple_of)

    def batch_count(self, num_examples: int) -> int:
        """Steps over num_examples: global batches of batch_size per rank."""
        return global_batch_count(num_examples, self.config.batch_size, self.distributed.world_size)

    def stage_batches(self, stage: Stage) -> int:
        """How many batches the stage trains on."""
        if stage.kind in (StageKind.TASK, StageKind.MLM):
            return self.batch_count(self.stage_size(stage))
        if stage.kind is StageKind.SIMCSE:
            return self.batch_count(len(self.triplets))
        total = sum(self.batch_count(self.train_items(t)) for t in self.tasks)
        return math.ceil(total / len(self.tasks)) if self.gradient_surgery is not None else total

    def stage_size(self, stage: Stage) -> int:
        """Examples (sentences for mlm, windows for qa) the stage trains on."""
        available = len(self.sentences) if stage.kind is StageKind.MLM else self.train_items(stage.task)
        return max(1, round(stage.fraction * available))

    @cached_property
    def sentences(self) -> list[str]:
        """The three tasks' distinct training sentences, the mlm stage's text."""
        return task_sentences(self.data)

    def run_stage(self, index: int, stage: Stage) -> float:
        seed = self.config.seed + 1000 * index  # data order depends on the stage only: resumable
        self.stage_lr = self.simcse.lr if stage.kind is StageKind.SIMCSE else self.config.lr
        description = f"stage {index + 1} {stage.label}"
        batch_size, max_length = self.config.batch_size, self.config.max_length
        world_size, rank = self.distributed.world_size, self.distributed.rank
        place = StagePlace(index, stage.label)
        resumed, self.resumed = self.resumed, None  # load_state_dict's checkpoint inside this stage, if any
        done = 0 if resumed is None else resumed.position["steps_done"]  # skipped below without a forward pass
        if stage.kind is StageKind.TASK:
            loader = self.train_loader(stage.task, seed, self.stage_size(stage))
            loader.batch_sampler.set_epoch(0, done)
            return self.run_steps(((partial(self.task_step, stage.task), b) for b in loader), len(loader), description,
                                  place=place, resumed=resumed)
        if stage.kind is StageKind.SIMCSE:
            batches = triplet_batches(self.triplets, self.tokenizer, batch_size, seed, max_length, world_size, rank,
                                      done)
            return self.run_steps(((self.simcse_step, b) for b in batches), self.stage_batches(stage), description,
                                  place=place, resumed=resumed)
        if stage.kind is StageKind.MLM:
            sentences = subsample(self.sentences, self.stage_size(stage), seed)
            batches = mlm_batches(sentences, self.tokenizer, batch_size, seed, max_length, world_size, rank, done)
            return self.run_steps(((self.mlm_step, b) for b in batches), self.stage_batches(stage), description,
                                  place=place, resumed=resumed)
        return self.run_multitask_epoch(stage, seed, description, place, resumed)

    def run_multitask_epoch(self, stage: Stage, seed: int, description: str, place: StagePlace | None = None,
                            resumed: ResumedStage | None = None) -> float:
        loaders = {t: self.train_loader(t, seed + i) for i, t in enumerate(self.tasks)}
        batches = RestartingLoaders(loaders, None if resumed is None else resumed.position["loaders"])
        rng = random.Random(seed)
        steps = self.stage_batches(stage)
        sizes = {t: self.train_items(t) for t in self.tasks}
        surgery = self.gradient_surgery
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
            step = partial(self.surgery_step, rng=rng)
            groups = (order[i * per_step:(i + 1) * per_step] for i in range(done, steps))
            pairs = ((step, [(t, batches.next(t)) for t in group]) for group in groups)
            return self.run_steps(pairs, steps, f"{description} {surgery.method}", gradients_reduced=True,
                                  batches_per_step=per_step, place=place, resumed=resumed)
        return self.run_steps(((partial(self.task_step, t), batches.next(t)) for t in order[done:]), steps, description,
                              place=place, resumed=resumed)

    # -- evaluation -------------------------------------------------------------------------------
    def predict(self, task: str, examples, scores: bool = False) -> tuple[list[str], np.ndarray]:
        examples = self.tokenized_split(task, examples)
        return predict_examples(self.model, task, examples, self.tokenizer, self.device, self.config.eval_batch_size,
                                self.config.max_length, self.precision, self.quiet, self.distributed, scores)

    def answer(self, questions: list[QAExample]) -> dict[str, Answer]:
        """SQuAD questions' best spans and no-answer margins (predict_answers)."""
        return predict_answers(self.model, self.tokenized_split("qa", questions), self.device,
                               self.config.eval_batch_size, self.precision, self.quiet, self.distributed,
                               self.qa.n_best, self.qa.max_answer_tokens)

    def span_logits(self, questions: list[QAExample]) -> tuple[list[str], list[np.ndarray]]:
        """The window ids of SQuAD questions and each window's (length, 2) start and end logits
        (predict_span_logits): what --score_train saves for --distill."""
        windows = self.tokenized_split("qa", questions)
        ids, logits = predict_span_logits(self.model, windows, self.device, self.config.eval_batch_size,
                                          self.precision, self.quiet, self.distributed)
        return ids, [row[:length] for row, length in zip(logits, windows.lengths)]

    def evaluate(self, split: str = "dev", limit: int | None = None) -> tuple[dict, dict]:
        """Metrics of every task on a split, and (ids, predictions, gold labels) per task."""
        metrics, predictions, _ = self.evaluate_with_scores(split, limit)
        return metrics, predictions

    def evaluate_with_scores(self, split: str = "dev", limit: int | None = None,
                             qa_threshold: float | None = None) -> tuple[dict, dict, dict]:
        """evaluate's metrics and predictions, and (ids, scores) per task: the scores they were decided from.
        SQuAD's no-answer threshold is `qa_threshold` if given, else chosen on dev to maximise F1 (and kept
        for other splits); its predictions and scores are the questions' answers (squad.Answer by id)."""
        metrics, predictions, scores = {}, {}, {}
        for task, data in self.data.items():
            examples = getattr(data, split)
            if examples is None:
                continue
            examples = subsample(examples, limit, self.config.seed)
            if TASKS[task].is_extractive:
                answers = self.answer(examples)
                if qa_threshold is not None:
                    self.qa_threshold = qa_threshold
                elif split == "dev":
                    self.qa_threshold = best_threshold(answers, examples)
                metrics.update(qa_metrics(answers, examples, self.qa_threshold))
                predictions[task] = scores[task] = answers
                continue
            ids, task_scores = self.predict(task, examples, scores=True)
            predicted = decide(self.model, task, task_scores)
            gold = np.array([e.label for e in examples])
            predictions[task], scores[task] = (ids, predicted, gold), (ids, task_scores)
            metrics.update(task_metrics(task, predicted, gold))
        if {"sst_acc", "qqp_acc", "sts_pearson"} <= metrics.keys():
            metrics["overall"] = overall_score(metrics["sst_acc"], metrics["qqp_acc"], metrics["sts_pearson"])
        return metrics, predictions, scores

    # -- the whole run ----------------------------------------------------------------------------
    def train(self, stages: list[Stage]) -> None:
        try:
            self._train(stages)
        finally:
            self.run_log.close()  # TensorBoard's events written so far are on disk, even after an interrupt

    def _train(self, stages: list[Stage]) -> None:
        state, config = self.state, self.config
        self.total_updates = sum(math.ceil(self.stage_batches(s) / config.grad_accumulation_steps) for s in stages)
        kept_on = trained_heads(stages, self.tasks)  # the tasks whose dev scores pick the model kept as best
        if state.next_stage == 0 and not state.history:
            start = time.time()
            dev, _ = self.evaluate("dev")
            self.log({"stage": "pretrained", "index": 0, "seconds": time.time() - start, **dev})
        for index in range(state.next_stage, len(stages)):
            if index < state.next_stage:  # early stopping skipped the rest of a multi-epoch stage
                continue
            if config.stop_after_stages is not None and index >= config.stop_after_stages:
                print(f"stopping after {index} stages (--stop_after_stages); continue with --resume")
                return
            # A stage resumed from a checkpoint inside it counts the seconds trained before that too.
            self.stage_start = time.time() - (self.resumed.position["seconds"] if self.resumed else 0)
            train_loss = self.run_stage(index, stages[index])
            seconds = time.time() - self.stage_start  # training only: the dev pass below is not train time
            dev = self.evaluate_with_scores("dev")
            record = {"stage": stages[index].label, "index": index + 1, "train_loss": train_loss,
                      "seconds": seconds, **dev[0]}
            if self.scaler.is_enabled():
                record["fp16_skipped_updates"] = state.skipped_updates  # so far in the run
            if config.eval_train_examples:
                train_metrics, _ = self.evaluate("train", config.eval_train_examples)
                record.update({f"train_{k}": v for k, v in train_metrics.items()})
            self.log(record)
            saved = {"metrics": record, "args": self.settings}
            score = kept_model_score(record, kept_on)
            if score > state.best_score:  # every rank holds the same gathered metrics
                state.best_score = score
                self.kept = KeptModel({k: v.to("cpu", copy=True) for k, v in trained_tensors(self.model).items()},
                                      *dev, qa_threshold=self.qa_threshold)
                if self.distributed.is_main:
                    save_multitask_model(self.model, self.output_dir / "best", saved)
            if config.keep_stage_models and self.distributed.is_main:
                save_multitask_model(self.model, self.output_dir / f"stage_{index + 1}", saved)
            state.next_stage = index + 1
            if config.patience is not None:
                self.stop_early(stages, index)
            self.prepare_next_stage(stages, index, record)
            self.save_checkpoint()
        self.distributed.barrier()  # rank 0's files are complete before any rank reads them

    def save_checkpoint(self, position: dict | None = None, local: dict[str, torch.Tensor] | None = None) -> None:
        """OUTPUT_DIR/last.*, the state_dict (a collective: every rank calls it) that --resume continues from."""
        checkpoint = self.state_dict(position, local)
        if checkpoint is not None:
            save_training_state(self.output_dir / "last", *checkpoint)
        self.last_save = time.monotonic()

    def stop_early(self, stages: list[Stage], index: int) -> None:
        """After stage `index`: when it belongs to a multi-epoch stage whose task's dev score (kept_model_score of
        the heads it trains) has not beaten its best since the stage began for `patience` epochs, skip the rest of
        it. The decision reads only the history, so a resumed run decides as an uninterrupted one."""
        group = multi_epoch_stages(stages)[index]
        if group is None or index + 1 == group.stop:
            return
        heads = trained_heads([stages[index]], self.tasks)
        # the record before the multi-epoch stage (the model it started from), then one per epoch of it so far
        records = self.state.history[-(index - group.start + 2):]
        scores = [kept_model_score(record, heads) for record in records]
        if not patience_exhausted(scores, self.config.patience):
            return
        self.state.skipped_stages += list(range(index + 1, group.stop))
        self.state.next_stage = group.stop
        if self.distributed.is_main:
            best = records[scores.index(max(scores))]
            print(f"early stopping: {index - group.start + 1} epochs of {stages[index].label}, the last "
                  f"{self.config.patience} without a better dev score than {best['stage']} (stage {best['index']}): "
                  f"skipping stages {index + 2}-{group.stop}")

    def block_policy(self, stage: Stage) -> str:
        """--stage_start's setting for a block of task stages, --simcse_keep's for SimCSE's, "last" for the rest."""
        if stage.kind is StageKind.TASK:
            return self.config.stage_start
        return self.config.simcse_keep if stage.kind is StageKind.SIMCSE else "last"

    def prepare_next_stage(self, stages: list[Stage], index: int, record: dict) -> None:
        """After stage `index` (and early stopping), before its checkpoint, so that a resume starts the next stage
        as an uninterrupted run does: keep the block's best stage so far (block_policy "best"); when the next stage
        to run begins another block, go on from that best stage's weights (only the model's: the optimizer's moments
        go on) and consolidate EWC on the finished block's task; reset SMART's anchor "stage_start"."""
        stage, following = stages[index], self.state.next_stage
        if self.block_policy(stage) == "best" and block_length(stages, index) > 1:
            score = kept_model_score(record, {stage.task or "sts"})  # SimCSE's block: STS's dev Pearson
            if self.block_best is None or score > self.block_best.score:
                self.block_best = BlockBest(index + 1, score, {k: v.to("cpu", copy=True)
                                                               for k, v in trained_tensors(self.model).items()})
        if following == len(stages):
            self.block_best = None
            return
        if stages[following] != stage:
            best, self.block_best = self.block_best, None
            if best is not None and best.index != index + 1:
                load_trained_tensors(self.model, {k: v.to(self.device) for k, v in best.tensors.items()})
                if self.distributed.is_main:
                    print(f"stage {following + 1} starts from stage {best.index}, the best of its block on dev "
                          f"({best.score:.4f}; --{'simcse_keep' if stage.kind is StageKind.SIMCSE else 'stage_start'} "
                          "best)")
            if self.regularization.ewc is not None and stage.kind is StageKind.TASK:
                self.consolidate(stage, index)
        teacher = self.regularization.teacher
        if teacher is not None and self.regularization.anchor == "stage_start":
            teacher.reset(self.model)

    def consolidate(self, stage: Stage, index: int) -> None:
        """EWC's Fisher of a task stage's loss at the weights the next stage starts from, on the first
        ewc_fisher_batches batches of the stage's own order (its seed), by the task's loss alone: no SMART, LNSR nor
        distillation. Under torchrun each rank's Fisher (of its slices of the batches) is averaged over the ranks, so
        that every rank and a resume hold the same."""
        ewc = self.regularization.ewc
        loader = self.train_loader(stage.task, self.config.seed + 1000 * index, self.stage_size(stage))

        def batch_losses():
            for batch in itertools.islice(loader, self.regularization.ewc_fisher_batches):
                batch = to_device(batch, self.device)
                with self.amp:
                    loss = compute_task_loss(self.model, stage.task, batch)
                yield loss
        ewc.consolidate(self.model, batch_losses)
        if self.distributed.enabled:
            ewc.fisher = dict(zip(ewc.fisher, self.distributed.average_tensors(list(ewc.fisher.values()))))

    def use_kept_model(self) -> tuple[dict, dict, dict]:
        """Put the kept model's weights back into the model (the one the optimizer and teacher hold) and return
        its dev metrics, predictions and scores, with SQuAD's threshold as it was chosen then. A run resumed
        after its best stage has no copy in memory: it reads OUTPUT_DIR/best.* and evaluates dev again."""
        if self.kept is None:
            tensors, metadata = read_checkpoint(self.output_dir / "best")
            load_trained_tensors(self.model, {k: v.to(self.device) for k, v in tensors.items()})
            return self.evaluate_with_scores("dev", qa_threshold=metadata["metrics"].get("qa_threshold"))
        load_trained_tensors(self.model, {k: v.to(self.device) for k, v in self.kept.tensors.items()})
        self.qa_threshold = self.kept.qa_threshold
        return self.kept.metrics, self.kept.predictions, self.kept.scores

    def log(self, record: dict) -> None:
        self.state.history.append(record)
        if not self.distributed.is_main:
            return
        print(summarize_line({k: record[k] for k in SUMMARY_KEYS if k in record}))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        self.run_log.scalars(stage_scalars(record), self.state.updates)
        self.run_log.flush()

    # -- the training state (--resume) ------------------------------------------------------------
    def state_dict(self, position: dict | None = None, local: dict[str, torch.Tensor] | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The checkpoint --resume continues from, as (tensors, plain values), on rank 0; None on the others. A
        collective under torchrun: every rank must call it (each one's dropout generator is kept).

        It holds the model (or what of it trains), optimizer, SMART teacher, MLM head, every rank's RNG states,
        the TrainingState, the data's fingerprints and the run's settings. Inside a stage (save_inside_stage) also
        `position`, where the stage stands, and every rank's `local` tensors (its sums of the stage's losses)."""
        rng_tensors, rng_info = rng_state()
        own = rng_tensors | {name: tensor.cpu() for name, tensor in (local or {}).items()}
        ranks = self.distributed.gather_objects(own)
        if not self.distributed.is_main:
            return None
        for rank, rank_tensors in enumerate(ranks[1:], start=1):
            own.update({f"{name}.rank{rank}": tensor for name, tensor in rank_tensors.items()})
        tensors = {f"model.{k}": v for k, v in trained_tensors(self.model).items()}
        optimizer_tensors, optimizer_info = optimizer_state(self.optimizer)
        tensors.update(optimizer_tensors)
        tensors.update(own)
        teacher = self.regularization.teacher
        if teacher is not None:
            tensors.update({f"teacher.{k}": v.contiguous() for k, v in teacher.state_dict().items()})
        if self.mlm_head is not None:
            tensors.update({f"mlm_head.{k}": v.detach().contiguous() for k, v in self.mlm_head.state_dict().items()})
        if self.regularization.ewc is not None:
            tensors.update({f"ewc.{k}": v.contiguous() for k, v in self.regularization.ewc.state_dict().items()})
        if self.block_best is not None:
            tensors.update({f"block_best.{k}": v for k, v in self.block_best.tensors.items()})
        state = dataclasses.asdict(self.state)
        return tensors, {
            **model_metadata(self.model), "args": self.settings, "next_stage": state["next_stage"],
            "history": state["history"], "best_score": state["best_score"], "updates": state["updates"],
            "data_sha256": self.data_sha256, "world_size": self.distributed.world_size,
            "optimizer": optimizer_info, "rng": rng_info,
            "smart_skipped_steps": {t: r.skipped_steps for t, r in self.regularization.smart.items()},
            # The fp16 gradient scaler's scale and growth counter (plain numbers; {} without fp16).
            "grad_scaler": self.scaler.state_dict(), "skipped_updates": state["skipped_updates"],

            # The block's best stage so far (prepare_next_stage), its tensors under block_best.; None outside a block.
            "block_best": None if self.block_best is None else {"index": self.block_best.index,
                                                                "score": self.block_best.score},
            "skipped_stages": state["skipped_stages"], **({"position": position} if position is not None else {})}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
        """Continue from state_dict's checkpoint (training_state.read_training_state reads and checks it)."""
        load_trained_tensors(self.model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        restore_optimizer(self.optimizer, tensors, metadata["optimizer"])
        teacher = self.regularization.teacher
        if teacher is not None:
            teacher.load_state_dict({k[8:]: v.to(self.device) for k, v in tensors.items() if k.startswith("teacher.")})
        if self.mlm_head is not None:
            self.mlm_head.load_state_dict({k[9:]: v for k, v in tensors.items() if k.startswith("mlm_head.")})
        if self.regularization.ewc is not None:
            self.regularization.ewc.load_state_dict({k[4:]: v.to(self.device) for k, v in tensors.items()
                                                     if k.startswith("ewc.")})
        best = metadata.get("block_best")
        self.block_best = None if best is None else BlockBest(
            best["index"], best["score"], {k[11:]: v for k, v in tensors.items() if k.startswith("block_best.")})
        for task, skipped in metadata["smart_skipped_steps"].items():
            if task in self.regularization.smart:
                self.regularization.smart[task].skipped_steps = skipped
        # A run saved before these fields existed, or in another precision (a resume on another GPU kind),
        # starts a fresh scaler, as a run does.
        if self.scaler.is_enabled() and metadata.get("grad_scaler"):
            self.scaler.load_state_dict(metadata["grad_scaler"])
        restore_rng(tensors, metadata["rng"])
        own = tensors  # this rank's RNG states and sums, without a rank suffix
        if self.distributed.rank > 0:
            suffix = f".rank{self.distributed.rank}"
            own = {name[:-len(suffix)]: tensor for name, tensor in tensors.items() if name.endswith(suffix)}
            restore_rng(own, metadata["rng"])
        # A checkpoint inside a stage: run_stage continues it (its RNG states are restored again there). Only what
        # that needs is kept, not the weights.
        self.resumed = None
        if "position" in metadata:
            kept = {name: tensor for name, tensor in own.items()
                    if name.startswith(("position.", "rng.")) and ".rank" not in name}
            self.resumed = ResumedStage(metadata["position"], kept, metadata["rng"])
        self.state = TrainingState(metadata["next_stage"], metadata["updates"], metadata["best_score"],
                                   metadata["history"], metadata.get("skipped_updates", 0),
                                   metadata.get("skipped_stages", []))
        # A kill between a stage's log line and its checkpoint leaves a record the checkpoint does not
        # have: the checkpoint's history is the truth.
        if self.distributed.is_main:
            (self.output_dir / "metrics.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in self.state.history), encoding="utf-8")
        self.run_log.resume(self.state.updates)  # so do steps.jsonl's lines and TensorBoard's steps


def stage_scalars(record: dict) -> dict:
    """A stage record's values by TensorBoard tag: dev/NAME for the dev metrics, stage/NAME for the rest (the train
    loss, seconds, fp16's skipped updates and --eval_train_examples' train_ metrics)."""
    return {f"{'stage' if name in STAGE_FIELDS or name.startswith('train_') else 'dev'}/{name}": value
            for name, value in record.items() if name not in ("stage", "index")}


def gradient_norm(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The L2 norm of all the parameters' gradients together, a 0-dim tensor on the device (what clip_grad_norm_
    returns), without clipping."""
    norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32) for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros((), device=device)


def build_optimizer(model: MultitaskBERT, lr: float, weight_decay: float = 0.0, layerwise_lr_decay: float = 1.0,
                    mlm_head: MaskedLanguageModelHead | None = None, compiled: bool = False) -> AdamW:
    """AdamW over the model's parameters (and the mlm head's), grouped by weight decay and layer-wise rate. Each
    group's learning rate is a 0-dim tensor on the model's device that optimizer_step fills in place, so that
    setting it never waits for the device nor recompiles a compiled step (`compiled`: AdamW's compiled update)."""
    named = list(model.named_parameters())
    if mlm_head is not None:
        named += [(f"mlm_head.{name}", p) for name, p in mlm_head.named_parameters()]
    groups = weight_decay_groups(named, weight_decay, layerwise_lr_decay, model.bert.config.num_hidden_layers)
    device = next(model.parameters()).device
    for group in groups:  # one tensor per group: their lr_scale differs
        group["lr"] = torch.full((), lr * group["lr_scale"], dtype=torch.float64, device=device)
    return AdamW(groups, lr=lr, compiled=compiled)
