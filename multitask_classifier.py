"""MultitaskBERT: one shared minBERT for SST-5 sentiment, Quora paraphrase and STS-B similarity.

The default schedule follows the SMART-SBERT thesis: an optional SimCSE stage on NLI, one full QQP
epoch, then R cycles of [one STS epoch, one SST epoch, a small QQP rehearsal], evaluating all three
dev sets after every stage and keeping the model with the best overall dev score. It ends by writing
the six leaderboard CSVs.

    python multitask_classifier.py --demo                                   # offline, 2 CPU cores, < 3 min
    python multitask_classifier.py --use_gpu --option finetune --data_dir data --smart   # the real run
    python multitask_classifier.py --help                                   # every flag, by feature
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import uuid
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from base_bert import BertConfig, CheckpointError
from bert import BertModel
from datasets import (DataError, in_file_order, load_examples, make_dataloader, show_data_warnings_on_one_line,
                      standard_paths, subsample)
from evaluation import (DEFAULT_OUTPUTS, forgetting_table_markdown, overall_score, paraphrase_metrics,
                        plot_error_analysis, plot_forgetting_matrix, plot_training_curves, sst_metrics,
                        sts_metrics, summarize_line, write_predictions)
from optimizer import AdamW
from simcse import load_nli_triplets, pairwise_contrastive_loss, supervised_simcse_loss
from smart import BregmanTeacher, SmartConfig, SmartRegularizer
from tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parent
TASKS = ("sst", "quora", "sts")
TASK_ALIASES = {"sst": "sst", "qqp": "quora", "quora": "quora", "para": "quora", "sts": "sts"}
DIVERGENCES = {"sst": "categorical", "quora": "bernoulli", "sts": "squared"}
N_SENTIMENT_CLASSES = 5
FILE_FLAGS = {("sst", s): f"sst_{s}" for s in ("train", "dev", "test")}
FILE_FLAGS.update({("quora", s): f"para_{s}" for s in ("train", "dev", "test")})
FILE_FLAGS.update({("sts", s): f"sts_{s}" for s in ("train", "dev", "test")})
OUT_FLAGS = {("sst", "dev"): "sst_dev_out", ("sst", "test"): "sst_test_out",
             ("quora", "dev"): "para_dev_out", ("quora", "test"): "para_test_out",
             ("sts", "dev"): "sts_dev_out", ("sts", "test"): "sts_test_out"}


class UsageError(ValueError):
    """A flag combination that cannot work; printed as one line."""


# ---------------------------------------------------------------------------------------------------
# The model


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the non-padding token states."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H)


def pad_to(ids: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(ids, (0, length - ids.shape[1]))  # pad id, mask and segment are all 0


class MultitaskBERT(nn.Module):
    """Shared minBERT with Sentence-BERT heads.

    sst:   dropout + linear on the pooled sentence -> 5 logits (cross entropy)
    quora: u, v pooled separately, [u, v, |u - v|] -> 1 logit (binary cross entropy)
    sts:   cosine(u, v), trained against the label by `similarity_objective`, reported on 0-5
    With pair_encoder="cross" the pair tasks read one joint [CLS] s1 [SEP] s2 [SEP] encoding instead.

    SMART perturbs the embedding output, so the forward pass is split in two:
    `embed(task, batch)` -> tuple of (B, T, H) and `outputs_from_embeddings(task, embeddings, batch)`.
    """

    SIMILARITY_OBJECTIVES = ("cosine", "shifted", "cosent")

    def __init__(self, bert: BertModel, pooling: str = "mean", dropout: float = 0.1,
                 pair_encoder: str = "sbert", similarity_objective: str = "cosine"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise UsageError(f"--pooling must be 'mean' or 'cls', got {pooling!r}")
        if pair_encoder not in ("sbert", "cross"):
            raise UsageError(f"--pair_encoder must be 'sbert' or 'cross', got {pair_encoder!r}")
        if similarity_objective not in self.SIMILARITY_OBJECTIVES:
            raise UsageError(f"--similarity_objective must be one of {self.SIMILARITY_OBJECTIVES}")
        hidden = bert.config.hidden_size
        self.bert = bert
        self.pooling = pooling
        self.pair_encoder = pair_encoder
        self.similarity_objective = similarity_objective
        self.dropout = nn.Dropout(dropout)
        self.sentiment_head = nn.Linear(hidden, N_SENTIMENT_CLASSES)
        if pair_encoder == "sbert":
            self.paraphrase_head = nn.Linear(3 * hidden, 1)
        else:
            self.paraphrase_head = nn.Linear(hidden, 1)
            self.similarity_head = nn.Linear(hidden, 1)

    def head_options(self) -> dict:
        return {"pooling": self.pooling, "dropout": self.dropout.p, "pair_encoder": self.pair_encoder,
                "similarity_objective": self.similarity_objective}

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return mean_pool(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]  # (B, H)

    def encode_sentences(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        hidden = self.bert.encode(self.bert.embed(input_ids, token_type_ids), attention_mask)
        return self.pool(hidden, attention_mask)  # (B, H)

    def _pair_as_one_batch(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Both sides of B pairs as one (2B, T) batch: one encoder pass instead of two."""
        length = max(batch["input_ids_1"].shape[1], batch["input_ids_2"].shape[1])
        ids = torch.cat([pad_to(batch["input_ids_1"], length), pad_to(batch["input_ids_2"], length)])
        mask = torch.cat([pad_to(batch["attention_mask_1"], length), pad_to(batch["attention_mask_2"], length)])
        return ids, mask  # (2B, T) each

    def _mask(self, task: str, batch: dict) -> torch.Tensor:
        if task != "sst" and self.pair_encoder == "sbert":
            return self._pair_as_one_batch(batch)[1]
        return batch["attention_mask"]

    def embed(self, task: str, batch: dict) -> tuple[torch.Tensor, ...]:
        if task != "sst" and self.pair_encoder == "sbert":
            ids, _ = self._pair_as_one_batch(batch)
            return (self.bert.embed(ids),)  # (2B, T, H)
        return (self.bert.embed(batch["input_ids"], batch.get("token_type_ids")),)  # (B, T, H)

    def outputs_from_embeddings(self, task: str, embeddings: tuple[torch.Tensor, ...], batch: dict) -> torch.Tensor:
        mask = self._mask(task, batch)
        pooled = self.pool(self.bert.encode(embeddings[0], mask), mask)  # (B, H) or (2B, H)
        if task == "sst":
            return self.sentiment_head(self.dropout(pooled))  # (B, 5)
        if self.pair_encoder == "cross":
            head = self.paraphrase_head if task == "quora" else self.similarity_head
            return head(self.dropout(pooled)).squeeze(-1)  # (B,)
        u, v = pooled.chunk(2)  # (B, H) each
        if task == "quora":
            features = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3H)
            return self.paraphrase_head(self.dropout(features)).squeeze(-1)  # (B,)
        return F.cosine_similarity(u.float(), v.float(), dim=-1)  # (B,)

    def forward(self, task: str, batch: dict) -> torch.Tensor:
        return self.outputs_from_embeddings(task, self.embed(task, batch), batch)

    def similarity_score(self, outputs: torch.Tensor) -> torch.Tensor:
        """The 0-5 similarity that predictions report, from the sts outputs."""
        if self.pair_encoder == "cross":
            return 5 * torch.sigmoid(outputs.float())
        if self.similarity_objective == "cosine":  # trained towards label / 5, so only [0, 1] is meaningful
            return (5 * outputs).clamp(0, 5)
        # shifted is trained on 2.5 cos + 2.5; cosent ranks cosines anywhere in [-1, 1], and a clamp
        # would tie every negative cosine at 0, so both use the same monotone map onto [0, 5].
        return 2.5 * outputs + 2.5

    # The course's prediction API.
    def predict_sentiment(self, input_ids, attention_mask):
        return self("sst", {"input_ids": input_ids, "attention_mask": attention_mask})

    def predict_paraphrase(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        return self("quora", {"input_ids_1": input_ids_1, "attention_mask_1": attention_mask_1,
                              "input_ids_2": input_ids_2, "attention_mask_2": attention_mask_2})

    def predict_similarity(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        return self.similarity_score(self("sts", {"input_ids_1": input_ids_1, "attention_mask_1": attention_mask_1,
                                                  "input_ids_2": input_ids_2, "attention_mask_2": attention_mask_2}))


def cosent_loss(cosine: torch.Tensor, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """CoSENT (Su 2022): log(1 + sum over pairs with label_i > label_j of exp(scale * (cos_j - cos_i)))."""
    differences = scale * (cosine[None, :] - cosine[:, None])  # (B, B): entry (i, j) = s*(cos_j - cos_i)
    ordered = labels[:, None] > labels[None, :]  # (B, B): pairs where i should score higher than j
    differences = differences.masked_fill(~ordered, float("-inf")).flatten()
    return torch.logsumexp(torch.cat([differences.new_zeros(1), differences]), dim=0)


def task_loss(model: MultitaskBERT, task: str, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    outputs = outputs.float()
    if task == "sst":
        return F.cross_entropy(outputs, labels)
    if task == "quora":
        return F.binary_cross_entropy_with_logits(outputs, labels.float())
    labels = labels.float()
    if model.pair_encoder == "cross":
        return F.mse_loss(torch.sigmoid(outputs), labels / 5)
    if model.similarity_objective == "cosine":
        return F.mse_loss(outputs, labels / 5)
    if model.similarity_objective == "shifted":
        return F.mse_loss(outputs, (labels - 2.5) / 2.5)
    return cosent_loss(outputs, labels)


# ---------------------------------------------------------------------------------------------------
# Data


@dataclass
class TaskData:
    train: list | None
    dev: list
    test: list


def data_path(args, task: str, split: str) -> Path:
    explicit = getattr(args, FILE_FLAGS[(task, split)])
    return Path(explicit) if explicit else standard_paths(args.data_dir)[(task, split)]


def load_task_data(args, train_tasks: set[str]) -> dict[str, TaskData]:
    """Every file the run needs, validated before any model is loaded."""
    data = {}
    for task in TASKS:
        train = None
        if task in train_tasks:
            train = subsample(load_examples(data_path(args, task, "train"), task, "train"),
                              args.max_train_examples, args.seed)
        data[task] = TaskData(train, load_examples(data_path(args, task, "dev"), task, "dev"),
                              load_examples(data_path(args, task, "test"), task, "test"))
    return data


def triplet_loader(triplets, tokenizer, batch_size: int, seed: int, max_length: int):
    """Batches of (anchor, positive, negative) texts, tokenized as one (3B, T) batch."""
    order = list(range(len(triplets)))
    random.Random(seed).shuffle(order)
    for start in range(0, len(order), batch_size):
        chosen = [triplets[i] for i in order[start:start + batch_size]]
        texts = [t.anchor for t in chosen] + [t.positive for t in chosen] + [t.negative for t in chosen]
        yield tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")


# ---------------------------------------------------------------------------------------------------
# Schedules


@dataclass(frozen=True)
class Stage:
    kind: str  # "task", "simcse" or "multitask"
    task: str | None = None
    fraction: float = 1.0
    epoch: int = 1  # 1-based epoch within a multitask schedule (annealing needs it)

    @property
    def label(self) -> str:
        if self.kind == "task":
            name = {"quora": "qqp"}.get(self.task, self.task)
            return name if self.fraction == 1.0 else f"{name}@{self.fraction:g}"
        return self.kind if self.kind == "simcse" else f"multitask-{self.epoch}"


def parse_stage_list(text: str) -> list[Stage]:
    """'qqp,sts*2,qqp:0.03' -> stages; ':f' trains on a fraction f of the task, '*n' repeats it n times."""
    stages = []
    for token in filter(None, (t.strip() for t in text.split(","))):
        stage_text, _, count = token.partition("*")
        name, _, fraction = (part.strip() for part in stage_text.partition(":"))
        if name not in TASK_ALIASES:
            raise UsageError(f"unknown stage {name!r} in {text!r}; use sst, sts, qqp (optionally :fraction, *repeats)")
        try:
            repeat = int(count) if count else 1
            value = float(fraction) if fraction else 1.0
        except ValueError:
            raise UsageError(f"stage {token!r} in {text!r}: write task[:fraction][*repeats], "
                             "e.g. qqp:0.03 or sts*2") from None
        if repeat < 1:
            raise UsageError(f"stage {token!r}: the repeat count must be >= 1")
        if not 0 < value <= 1:
            raise UsageError(f"stage {token!r}: the fraction must be in (0, 1]")
        stages += [Stage("task", TASK_ALIASES[name], value)] * repeat
    return stages


def build_schedule(args) -> list[Stage]:
    if args.pcgrad and args.schedule != "round_robin":
        raise UsageError("--pcgrad needs --schedule round_robin (each step takes one batch of every task)")
    stages = [Stage("simcse")] * args.simcse_epochs if args.simcse_data else []
    if args.schedule == "sequential":
        stages += parse_stage_list(args.first_stages) + parse_stage_list(args.cycle) * args.cycles
    else:
        stages += [Stage("multitask", epoch=e) for e in range(1, args.epochs + 1)]
    if not stages:
        raise UsageError("the schedule is empty: give --first_stages, --cycle with --cycles >= 1, or --epochs")
    return stages


def pcgrad_combine(task_gradients: list[list[torch.Tensor]], rng: random.Random) -> list[torch.Tensor]:
    """PCGrad (Yu et al. 2020): each task's gradient drops its component along every other task's
    gradient that it conflicts with (negative dot product), the others taken in random order; the
    projected gradients are then summed. Dot products run over all parameters at once."""
    def dot(a, b):
        return sum((x.double() * y.double()).sum() for x, y in zip(a, b))

    projected = []
    for i, gradient in enumerate(task_gradients):
        others = [j for j in range(len(task_gradients)) if j != i]
        rng.shuffle(others)
        for j in others:
            conflict = dot(gradient, task_gradients[j])
            if conflict < 0:
                scale = (conflict / dot(task_gradients[j], task_gradients[j]).clamp_min(1e-30)).to(gradient[0].dtype)
                gradient = [g - scale * h for g, h in zip(gradient, task_gradients[j])]
        projected.append(gradient)
    return [sum(parts) for parts in zip(*projected)]


def annealed_probabilities(sizes: dict[str, int], epoch: int, epochs: int) -> dict[str, float]:
    """p_i proportional to N_i^alpha, alpha = 1 - 0.8 (e - 1) / (E - 1): from size-proportional to near-uniform."""
    alpha = 1.0 if epochs == 1 else 1 - 0.8 * (epoch - 1) / (epochs - 1)
    weights = {task: n ** alpha for task, n in sizes.items()}
    total = sum(weights.values())
    return {task: w / total for task, w in weights.items()}


# ---------------------------------------------------------------------------------------------------
# Training


def smart_configs(args) -> dict[str, SmartConfig]:
    """SMART settings per task: the global flags, then any --smart_override TASK:key=value,..."""
    base = dict(adv_weight=args.smart_adv_weight, bregman_weight=args.smart_bregman_weight,
                teacher_momentum=args.smart_momentum, noise_std=args.smart_noise_std,
                epsilon=args.smart_epsilon, step_size=args.smart_step_size,
                ascent_steps=args.smart_ascent_steps, norm=args.smart_norm, norm_level=args.smart_norm_level)
    per_task = {task: dict(base) for task in TASKS}
    for override in args.smart_override:
        task_name, _, settings = override.partition(":")
        if task_name not in TASK_ALIASES or not settings:
            raise UsageError(f"--smart_override {override!r}: expected TASK:key=value[,key=value]")
        for setting in settings.split(","):
            key, _, value = setting.partition("=")
            if key not in base or key == "teacher_momentum":
                raise UsageError(f"--smart_override {override!r}: unknown or shared setting {key!r}")
            try:
                per_task[TASK_ALIASES[task_name]][key] = type(base[key])(value)
            except ValueError:
                raise UsageError(f"--smart_override {override!r}: {key} must be a "
                                 f"{type(base[key]).__name__}, got {value!r}") from None
    try:
        return {task: SmartConfig(**values) for task, values in per_task.items()}
    except ValueError as err:
        raise UsageError(str(err)) from None


def regularized_tasks(args) -> set[str]:
    """The tasks --smart regularises (none without --smart)."""
    if not args.smart:
        return set()
    names = [t.strip() for t in args.smart_tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASK_ALIASES]
    if unknown:
        raise UsageError(f"--smart_tasks: unknown task {unknown[0]!r}; use sst, qqp, sts")
    return {TASK_ALIASES[t] for t in names}


def bf16_enabled(device: torch.device, bf16: bool | None) -> bool:
    """--bf16 / --no-bf16; None (the default) means on for CUDA, off for CPU, because CPUs without native
    bf16 instructions emulate it slowly."""
    return device.type == "cuda" if bf16 is None else bf16


def bf16_autocast(device: torch.device, bf16: bool | None):
    """The autocast context that --bf16 / --no-bf16 (see bf16_enabled) asks for on this device."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16_enabled(device, bf16) else nullcontext()


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


class Trainer:
    """Runs a schedule of stages; owns the model, optimizer, SMART state and checkpoints."""

    def __init__(self, args, model: MultitaskBERT, tokenizer: BertTokenizer, data: dict[str, TaskData],
                 triplets: list, device: torch.device):
        self.args, self.model, self.tokenizer, self.data, self.triplets = args, model, tokenizer, data, triplets
        self.device = device
        self.output_dir = Path(args.output_dir)
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay)
        self.smart_tasks = regularized_tasks(args)
        self.regularizers: dict[str, SmartRegularizer] = {}
        self.teacher = None
        if self.smart_tasks:
            configs = smart_configs(args)
            if any(configs[t].bregman_weight > 0 for t in self.smart_tasks):
                self.teacher = BregmanTeacher(model, args.smart_momentum)
            for task in self.smart_tasks:
                self.regularizers[task] = SmartRegularizer(model, configs[task], self.teacher)
        self.history: list[dict] = []
        self.best_score = -math.inf
        self.next_stage = 0
        self.amp = bf16_autocast(device, args.bf16)

    # -- one optimisation step --------------------------------------------------------------------
    def task_step(self, task: str, batch: dict) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            embeddings = self.model.embed(task, batch)
            outputs = self.model.outputs_from_embeddings(task, embeddings, batch)
            loss = task_loss(self.model, task, outputs, batch["labels"])
            if task in self.regularizers:
                forward_fn = lambda e: self.model.outputs_from_embeddings(task, e, batch)  # noqa: E731
                loss = loss + self.regularizers[task].penalty(forward_fn, embeddings, outputs, DIVERGENCES[task],
                                                              teacher_args=(task, batch))
        if loss.requires_grad:  # not so for the SBERT cosine with --option pretrain: it has no trainable weight
            (loss / self.args.grad_accumulation_steps).backward()
        return loss.item()

    def simcse_step(self, batch: dict) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            embeddings = self.model.encode_sentences(batch["input_ids"], batch["attention_mask"])
            anchor, positive, negative = embeddings.chunk(3)
            if self.args.simcse_objective == "pairwise":
                loss = pairwise_contrastive_loss(anchor, positive, negative, self.args.simcse_temperature)
            else:
                loss = supervised_simcse_loss(anchor, positive, negative, self.args.simcse_temperature)
        (loss / self.args.grad_accumulation_steps).backward()
        return loss.item()

    def optimizer_step(self) -> None:
        if self.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.teacher is not None:
            self.teacher.update(self.model)

    def run_steps(self, steps, total: int, description: str, *step_args) -> float:
        """Drive (step_fn, batch) pairs with gradient accumulation; returns the mean loss."""
        self.model.train()
        losses = []
        bar = tqdm(steps, total=total, desc=description, leave=False, disable=self.args.quiet)
        for index, (step_fn, batch) in enumerate(bar, start=1):
            losses.append(step_fn(batch, *step_args))
            if index % self.args.grad_accumulation_steps == 0 or index == total:
                self.optimizer_step()
            if index % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
        return float(np.mean(losses)) if losses else float("nan")

    # -- stages -----------------------------------------------------------------------------------
    def train_loader(self, task: str, examples, seed: int):
        return make_dataloader(examples, self.tokenizer, self.args.batch_size, shuffle=True, seed=seed,
                               max_length=self.args.max_length, cross_encoder=self.model.pair_encoder == "cross"
                               and task != "sst", num_workers=self.args.num_workers)

    def run_stage(self, index: int, stage: Stage) -> float:
        seed = self.args.seed + 1000 * index  # data order depends on the stage only: resumable
        if stage.kind == "task":
            examples = self.data[stage.task].train
            if stage.fraction < 1.0:
                examples = subsample(examples, max(1, round(stage.fraction * len(examples))), seed)
            loader = self.train_loader(stage.task, examples, seed)
            steps = ((lambda b, t=stage.task: self.task_step(t, b), batch) for batch in loader)
            return self.run_steps(steps, len(loader), f"stage {index + 1} {stage.label}")
        if stage.kind == "simcse":
            batches = triplet_loader(self.triplets, self.tokenizer, self.args.batch_size, seed, self.args.max_length)
            return self.run_steps(((self.simcse_step, b) for b in batches),
                                  math.ceil(len(self.triplets) / self.args.batch_size), f"stage {index + 1} simcse")
        return self.run_multitask_epoch(index, stage, seed)

    def run_multitask_epoch(self, index: int, stage: Stage, seed: int) -> float:
        loaders = {t: self.train_loader(t, self.data[t].train, seed + i) for i, t in enumerate(TASKS)}
        total = sum(len(loader) for loader in loaders.values())
        iterators = {t: iter(loader) for t, loader in loaders.items()}
        rng = random.Random(seed)
        if self.args.schedule == "annealed":
            probabilities = annealed_probabilities({t: len(self.data[t].train) for t in TASKS},
                                                   stage.epoch, self.args.epochs)
            order = rng.choices(list(TASKS), weights=[probabilities[t] for t in TASKS], k=total)
        else:
            order = [TASKS[i % len(TASKS)] for i in range(total)]

        def next_batch(task):
            try:
                return next(iterators[task])
            except StopIteration:  # a smaller task starts over, as in round-robin sampling
                iterators[task] = iter(loaders[task])
                return next(iterators[task])
        if self.args.pcgrad:  # every step sees one batch of each task
            count = math.ceil(total / len(TASKS))
            steps = ((self.pcgrad_step, {t: next_batch(t) for t in TASKS}) for _ in range(count))
            return self.run_steps(steps, count, f"stage {index + 1} {stage.label} pcgrad", rng.random)
        steps = ((lambda b, t=t: self.task_step(t, b), next_batch(t)) for t in order)
        return self.run_steps(steps, total, f"stage {index + 1} {stage.label}")

    def pcgrad_step(self, batches: dict, random_number) -> float:
        """One backward per task, then the tasks' gradients combined by PCGrad into .grad."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        accumulated = [p.grad for p in params]
        task_gradients, losses = [], []
        for task, batch in batches.items():
            for p in params:
                p.grad = None
            losses.append(self.task_step(task, batch))
            task_gradients.append([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        combined = pcgrad_combine(task_gradients, random.Random(random_number()))
        for p, previous, gradient in zip(params, accumulated, combined):
            p.grad = gradient if previous is None else previous + gradient
        return float(np.mean(losses))

    # -- evaluation -------------------------------------------------------------------------------
    @torch.inference_mode()
    def predict(self, task: str, examples) -> tuple[list[str], np.ndarray]:
        self.model.eval()
        loader = make_dataloader(examples, self.tokenizer, self.args.eval_batch_size, shuffle=False,
                                 max_length=self.args.max_length,
                                 cross_encoder=self.model.pair_encoder == "cross" and task != "sst")
        ids, predictions = [], []
        for batch in tqdm(loader, desc=f"predict {task}", leave=False, disable=self.args.quiet):
            batch = to_device(batch, self.device)
            with self.amp:
                outputs = self.model(task, batch).float()
            if task == "sst":
                predictions.append(outputs.argmax(dim=-1).cpu().numpy())
            elif task == "quora":
                predictions.append((outputs > 0).long().cpu().numpy())
            else:
                predictions.append(self.model.similarity_score(outputs).float().cpu().numpy())
            ids += batch["ids"]
        return in_file_order(examples, ids, np.concatenate(predictions))

    def evaluate(self, split: str = "dev", limit: int | None = None) -> tuple[dict, dict]:
        metrics, predictions = {}, {}
        for task in TASKS:
            examples = getattr(self.data[task], split)
            if examples is None:
                continue
            examples = subsample(examples, limit, self.args.seed)
            ids, predicted = self.predict(task, examples)
            gold = np.array([e.label for e in examples])
            predictions[task] = (ids, predicted, gold)
            if task == "sst":
                m = sst_metrics(predicted, gold)
                metrics.update(sst_acc=m["acc"], sst_f1_macro=m["f1_macro"], sst_f1_weighted=m["f1_weighted"])
            elif task == "quora":
                m = paraphrase_metrics(predicted, gold)
                metrics.update(para_acc=m["acc"], para_f1=m["f1"])
            else:
                metrics.update(sts_pearson=sts_metrics(predicted, gold)["pearson"])
        if {"sst_acc", "para_acc", "sts_pearson"} <= metrics.keys():
            metrics["overall"] = overall_score(metrics["sst_acc"], metrics["para_acc"], metrics["sts_pearson"])
        return metrics, predictions

    # -- the whole run ----------------------------------------------------------------------------
    def train(self, stages: list[Stage]) -> None:
        if self.next_stage == 0 and not self.history:
            start = time.time()
            dev, _ = self.evaluate("dev")
            self.log({"stage": "pretrained", "index": 0, "seconds": time.time() - start, **dev})
        for index in range(self.next_stage, len(stages)):
            if self.args.stop_after_stages is not None and index >= self.args.stop_after_stages:
                print(f"stopping after {index} stages (--stop_after_stages); continue with --resume")
                return
            stage = stages[index]
            if stage.kind == "simcse":
                self.set_lr(self.args.simcse_lr)
            else:
                self.set_lr(self.args.lr)
            start = time.time()
            train_loss = self.run_stage(index, stage)
            seconds = time.time() - start
            dev, _ = self.evaluate("dev")
            record = {"stage": stage.label, "index": index + 1, "train_loss": train_loss, "seconds": seconds, **dev}
            if self.args.eval_train_examples:
                train_metrics, _ = self.evaluate("train", self.args.eval_train_examples)
                record.update({f"train_{k}": v for k, v in train_metrics.items()})
            self.log(record)
            if dev["overall"] > self.best_score:
                self.best_score = dev["overall"]
                self.save_model(self.output_dir / "best", record)
            self.next_stage = index + 1
            self.save_training_state(self.output_dir / "last")

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def log(self, record: dict) -> None:
        self.history.append(record)
        print(summarize_line({k: record[k] for k in ("index", "stage", "train_loss", "seconds", "sst_acc",
                                                     "para_acc", "sts_pearson", "overall") if k in record}))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    # -- checkpoints: safetensors for tensors, JSON for everything else; nothing is ever unpickled --
    def model_metadata(self) -> dict:
        return {"bert_config": self.model.bert.config.to_dict(), "heads": self.model.head_options()}

    def save_model(self, prefix: Path, metrics: dict) -> None:
        tensors = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        atomic_save(prefix, tensors, {**self.model_metadata(), "metrics": metrics, "args": vars(self.args)})

    def save_training_state(self, prefix: Path) -> None:
        tensors = {f"model.{k}": v.detach().contiguous() for k, v in self.model.state_dict().items()}
        optimizer_state = self.optimizer.state_dict()
        steps = {}
        for index, state in optimizer_state["state"].items():
            tensors[f"optimizer.{index}.exp_avg"] = state["exp_avg"].contiguous()
            tensors[f"optimizer.{index}.exp_avg_sq"] = state["exp_avg_sq"].contiguous()
            steps[str(index)] = int(state["step"])
        if self.teacher is not None:
            tensors.update({f"teacher.{k}": v.contiguous() for k, v in self.teacher.state_dict().items()})
        tensors["rng.torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            tensors["rng.cuda"] = torch.cuda.get_rng_state()
        python_state = random.getstate()
        numpy_state = np.random.get_state()
        metadata = {
            **self.model_metadata(), "args": vars(self.args), "next_stage": self.next_stage,
            "history": self.history, "best_score": self.best_score,
            "optimizer": {"steps": steps, "param_groups": optimizer_state["param_groups"]},
            "smart_skipped_steps": {t: r.skipped_steps for t, r in self.regularizers.items()},
            "rng": {"python": [python_state[0], list(python_state[1]), python_state[2]],
                    "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]]},
        }
        atomic_save(prefix, tensors, metadata)

    def load_training_state(self, prefix: Path) -> None:
        tensors, metadata = read_checkpoint(prefix)
        check_resume_flags(metadata["args"], json.loads(json.dumps(vars(self.args), default=str)))
        try:
            self._restore(tensors, metadata)
        except (KeyError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{prefix}: cannot resume with these flags; the checkpoint was saved by a "
                                  f"different model, optimizer or SMART setup ({type(err).__name__}: {err})") from None

    def _restore(self, tensors: dict, metadata: dict) -> None:
        self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        state = {}
        for index, step in metadata["optimizer"]["steps"].items():
            state[int(index)] = {"step": step, "exp_avg": tensors[f"optimizer.{index}.exp_avg"],
                                 "exp_avg_sq": tensors[f"optimizer.{index}.exp_avg_sq"]}
        self.optimizer.load_state_dict({"state": state, "param_groups": metadata["optimizer"]["param_groups"]})
        if self.teacher is not None:
            self.teacher.load_state_dict({k[8:]: v.to(self.device) for k, v in tensors.items()
                                          if k.startswith("teacher.")})
        for task, skipped in metadata["smart_skipped_steps"].items():
            if task in self.regularizers:
                self.regularizers[task].skipped_steps = skipped
        torch.set_rng_state(tensors["rng.torch"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
        python_state = metadata["rng"]["python"]
        random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
        numpy_state = metadata["rng"]["numpy"]
        np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))
        self.history, self.best_score, self.next_stage = metadata["history"], metadata["best_score"], metadata["next_stage"]


def atomic_save(prefix: Path, tensors: dict, metadata: dict) -> None:
    """Write PREFIX.safetensors then PREFIX.json, each via a temporary file and os.replace.

    Both carry the same random checkpoint id, so a crash between the two replaces is detected on
    reading instead of pairing new weights with old metadata.
    """
    prefix.parent.mkdir(parents=True, exist_ok=True)
    weights, info = prefix.with_suffix(".safetensors"), prefix.with_suffix(".json")
    checkpoint_id = uuid.uuid4().hex
    save_file({k: v.cpu() for k, v in tensors.items()}, str(weights) + ".tmp", metadata={"checkpoint_id": checkpoint_id})
    os.replace(str(weights) + ".tmp", weights)
    info.with_suffix(".json.tmp").write_text(json.dumps({**metadata, "checkpoint_id": checkpoint_id}, indent=1,
                                                        default=str), encoding="utf-8")
    os.replace(info.with_suffix(".json.tmp"), info)


def read_checkpoint(prefix: Path) -> tuple[dict, dict]:
    weights, info = prefix.with_suffix(".safetensors"), prefix.with_suffix(".json")
    if not weights.is_file() or not info.is_file():
        raise CheckpointError(f"{prefix}: checkpoint needs both {weights.name} and {info.name}")
    try:
        with safe_open(str(weights), "pt") as handle:  # one read: the save id and the tensors
            weights_id = (handle.metadata() or {}).get("checkpoint_id")
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = json.loads(info.read_text(encoding="utf-8"))
    except Exception as err:
        raise CheckpointError(f"{prefix}: cannot read checkpoint ({type(err).__name__}: {err})") from None
    if weights_id != metadata.get("checkpoint_id"):
        raise CheckpointError(f"{prefix}: {weights.name} and {info.name} come from different saves "
                              "(a write was interrupted); use the other checkpoint or start again")
    return tensors, metadata


# Flags that may differ between a stopped run and its --resume: none of them changes the result.
# --cycles may change too (to shorten or extend a sequential run) as long as the stages already done
# are the new schedule's first stages: stage i's data order depends on i alone, so the result equals an
# uninterrupted run with the new value.
RESUME_FREE_FLAGS = {"resume", "stop_after_stages", "quiet", "num_workers", "eval_batch_size", "use_gpu", "demo",
                     "cycles", *OUT_FLAGS.values()}


def check_resume_flags(saved: dict, current: dict) -> None:
    changed = sorted(k for k in saved.keys() | current.keys()
                     if k not in RESUME_FREE_FLAGS and saved.get(k) != current.get(k))
    if changed:
        details = ", ".join(f"--{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in changed[:4])
        raise CheckpointError(f"cannot resume: {len(changed)} flag(s) differ from the stopped run ({details}); "
                              "rerun with the original flags plus --resume")


def load_multitask_model(prefix: str | Path, device: torch.device | str = "cpu") -> MultitaskBERT:
    """Rebuild a MultitaskBERT from PREFIX.safetensors + PREFIX.json (no pretrained download needed)."""
    tensors, metadata = read_checkpoint(Path(prefix))
    model = MultitaskBERT(BertModel(BertConfig.from_dict(metadata["bert_config"])), **metadata["heads"])
    try:
        model.load_state_dict(tensors)
    except RuntimeError as err:
        raise CheckpointError(f"{prefix}: weights do not fit the model ({err})") from None
    return model.to(device)


# ---------------------------------------------------------------------------------------------------
# Command line


def write_leaderboard_files(trainer: Trainer, args, dev_predictions: dict) -> None:
    """The six CSVs: dev from the predictions already scored, test predicted now."""
    for split in ("dev", "test"):
        for task in TASKS:
            if split == "dev":
                ids, predicted, _ = dev_predictions[task]
            else:
                ids, predicted = trainer.predict(task, trainer.data[task].test)
            path = getattr(args, OUT_FLAGS[(task, split)])
            write_predictions(path, ids, predicted.tolist(), task)
            print(f"wrote {path} ({len(ids)} rows)")


def write_reports(trainer: Trainer, dev_predictions: dict) -> None:
    history = [r for r in trainer.history if "overall" in r]
    out = trainer.output_dir
    (out / "history.json").write_text(json.dumps(trainer.history, indent=1), encoding="utf-8")
    (out / "forgetting.md").write_text(forgetting_table_markdown(history), encoding="utf-8")
    plot_forgetting_matrix(history, out / "forgetting_matrix.png")
    plot_training_curves(history, out / "training_curves.png")
    plot_error_analysis(*dev_predictions["sst"][1:], *dev_predictions["quora"][1:], *dev_predictions["sts"][1:], out)
    print(forgetting_table_markdown(history))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    course = parser.add_argument_group("course options (defaults unchanged)")
    for (task, split), flag in FILE_FLAGS.items():
        course.add_argument(f"--{flag}", default=None,
                            help=f"default: DATA_DIR/{standard_paths('')[(task, split)].name}")
    for key, flag in OUT_FLAGS.items():
        course.add_argument(f"--{flag}", default=DEFAULT_OUTPUTS[key])
    course.add_argument("--seed", type=int, default=11711)
    course.add_argument("--epochs", type=int, default=10, help="epochs of the annealed / round_robin schedules")
    course.add_argument("--option", choices=("pretrain", "finetune"), default="pretrain",
                        help="pretrain: BERT frozen, heads trained; finetune: everything trained")
    course.add_argument("--use_gpu", action="store_true")
    course.add_argument("--batch_size", type=int, default=8)
    course.add_argument("--hidden_dropout_prob", type=float, default=0.3)
    course.add_argument("--lr", type=float, default=1e-5)

    run = parser.add_argument_group("data, model and run")
    run.add_argument("--data_dir", default="data", help="folder with the course's file names")
    run.add_argument("--pretrained", default="bert-base-uncased",
                     help="hub id, local directory, or minilm-l6 (bundled, offline)")
    run.add_argument("--max_train_examples", type=int, default=None, help="subsample each train set (quick runs)")
    run.add_argument("--max_length", type=int, default=128, help="tokens per sentence (or per pair)")
    run.add_argument("--output_dir", default="runs/multitask", help="checkpoints, metrics.jsonl, plots")
    run.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/last.*")
    run.add_argument("--stop_after_stages", type=int, default=None, help="stop (resumably) after N stages")
    run.add_argument("--demo", action="store_true",
                     help="offline demo: data/demo, minilm-l6, a short SMART schedule, all six CSVs")
    run.add_argument("--eval_batch_size", type=int, default=64)
    run.add_argument("--eval_train_examples", type=int, default=0,
                     help="also score this many train examples per task after each stage (train curves)")
    run.add_argument("--num_workers", type=int, default=0)
    run.add_argument("--quiet", action="store_true", help="no progress bars")

    model = parser.add_argument_group("model heads")
    model.add_argument("--pooling", choices=("mean", "cls"), default="mean")
    model.add_argument("--pair_encoder", choices=("sbert", "cross"), default="sbert",
                       help="sbert: sentences encoded apart; cross: one joint pair encoding (baseline)")
    model.add_argument("--similarity_objective", choices=MultitaskBERT.SIMILARITY_OBJECTIVES, default="cosine",
                       help="cosine: MSE(cos, label/5) (measured best); shifted: the handout's 2.5cos+2.5; cosent")

    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--weight_decay", type=float, default=0.0)
    optim.add_argument("--grad_accumulation_steps", type=int, default=1)
    optim.add_argument("--max_grad_norm", type=float, default=0.0, help="clip gradients (0: off)")
    optim.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                       help="bf16 autocast (default: on for CUDA, off for CPU; on a CPU with native bf16, "
                            "e.g. AVX512-BF16 or AMX, --bf16 measured 1.2-1.6x faster, see BENCHMARKS.md)")

    schedule = parser.add_argument_group("schedule")
    schedule.add_argument("--schedule", choices=("sequential", "annealed", "round_robin"), default="sequential")
    schedule.add_argument("--first_stages", default="qqp",
                          help="stages before the cycles, e.g. 'qqp' or 'sts*3' (task[:fraction][*repeats])")
    schedule.add_argument("--cycle", default="sts,sst,qqp:0.03", help="one cycle of stages (rehearsal as :fraction)")
    schedule.add_argument("--cycles", type=int, default=10)
    schedule.add_argument("--pcgrad", action="store_true",
                          help="round_robin only: one batch per task each step, gradients combined by PCGrad")

    smart = parser.add_argument_group("SMART (Jiang et al. 2020); defaults are the paper's")
    smart.add_argument("--smart", action="store_true", help="regularise the tasks in --smart_tasks")
    smart.add_argument("--smart_tasks", default="sst,qqp,sts")
    smart.add_argument("--smart_adv_weight", type=float, default=1.0, help="lambda_s")
    smart.add_argument("--smart_bregman_weight", type=float, default=1.0, help="mu")
    smart.add_argument("--smart_momentum", type=float, default=0.99, help="beta of the Bregman teacher (0: vanilla)")
    smart.add_argument("--smart_noise_std", type=float, default=1e-5, help="sigma")
    smart.add_argument("--smart_epsilon", type=float, default=1e-5, help="epsilon, radius of the ball")
    smart.add_argument("--smart_step_size", type=float, default=1e-3, help="eta")
    smart.add_argument("--smart_ascent_steps", type=int, default=1, help="K")
    smart.add_argument("--smart_norm", choices=("inf", "l2"), default="inf")
    smart.add_argument("--smart_norm_level", choices=("token", "sentence"), default="token")
    smart.add_argument("--smart_override", action="append", default=[], metavar="TASK:key=value,...",
                       help="per-task setting, e.g. sst:adv_weight=10 (repeatable)")

    simcse = parser.add_argument_group("SimCSE stage (before the tasks)")
    simcse.add_argument("--simcse_data", nargs="*", default=[],
                        help="NLI files (.jsonl, SentEval s1.*, SICK.txt, premise,positive,negative .csv)")
    simcse.add_argument("--simcse_epochs", type=int, default=1)
    simcse.add_argument("--simcse_objective", choices=("supervised", "pairwise"), default="supervised")
    simcse.add_argument("--simcse_temperature", type=float, default=0.05, help="tau; logits scale = 1/tau")
    simcse.add_argument("--simcse_lr", type=float, default=2e-5)
    simcse.add_argument("--simcse_max_examples", type=int, default=None)
    return parser


DEMO_SETTINGS = dict(data_dir=str(ROOT / "data" / "demo"), pretrained="minilm-l6", option="finetune",
                     batch_size=16, lr=5e-5, hidden_dropout_prob=0.1, first_stages="qqp", cycle="sts,sst,qqp:0.25",
                     cycles=2, smart=True, max_length=64, output_dir="runs/demo")


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.demo:
        # The demo's settings become the defaults, so every flag given (abbreviated too) still wins.
        parser.set_defaults(**DEMO_SETTINGS)
        args = parser.parse_args(argv)
    for flag in ("batch_size", "eval_batch_size", "grad_accumulation_steps", "max_length"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1")
    for flag in ("max_train_examples", "simcse_max_examples"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1")
    return args


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(args) -> Trainer:
    device = torch.device("cuda" if args.use_gpu and torch.cuda.is_available() else "cpu")
    if args.use_gpu and device.type == "cpu":
        warnings.warn("--use_gpu given but CUDA is not available; training on the CPU")
    stages = build_schedule(args)
    if regularized_tasks(args):
        smart_configs(args)  # bad SMART flags fail here, before any data or model is loaded
    if args.simcse_data and args.option == "pretrain":
        raise UsageError("the SimCSE stage trains the encoder, which --option pretrain freezes; "
                         "use --option finetune")
    train_tasks = {s.task for s in stages if s.kind == "task"} | (set(TASKS) if args.schedule != "sequential" else set())
    data = load_task_data(args, train_tasks)  # every data file validated before the model loads
    triplets = []
    if args.simcse_data:
        triplets, _ = load_nli_triplets(args.simcse_data)
        if not triplets:
            raise UsageError(f"--simcse_data {' '.join(args.simcse_data)}: no (premise, entailed, contradicted) "
                             "triplets in these files")
        triplets = subsample(triplets, args.simcse_max_examples, args.seed)
        print(f"SimCSE: {len(triplets)} NLI triplets")
    seed_everything(args.seed)
    bert = BertModel.from_pretrained(args.pretrained, hidden_dropout_prob=args.hidden_dropout_prob)
    tokenizer = BertTokenizer.from_pretrained(args.pretrained)
    model = MultitaskBERT(bert, args.pooling, args.hidden_dropout_prob, args.pair_encoder, args.similarity_objective)
    if args.option == "pretrain":
        for parameter in model.bert.parameters():
            parameter.requires_grad = False
        if args.pair_encoder == "sbert" and "sts" in train_tasks:
            print("note: with --option pretrain the SBERT similarity (a cosine) has no trainable weights; "
                  "STS training steps change nothing")
    model.to(device)
    trainer = Trainer(args, model, tokenizer, data, triplets, device)
    last = Path(args.output_dir) / "last"
    if args.resume:
        trainer.load_training_state(last)
        done = [record["stage"] for record in trainer.history if record["index"] > 0]
        if done != [stage.label for stage in stages[:len(done)]]:
            raise CheckpointError(f"cannot resume: the stages already done ({', '.join(done)}) do not begin "
                                  "this run's schedule")
        print(f"resuming after stage {trainer.next_stage} of {len(stages)}")
    elif (Path(args.output_dir) / "metrics.jsonl").exists():
        print(f"note: starting a fresh run in {args.output_dir}; its previous metrics.jsonl is replaced "
              "(use --resume to continue instead)")
        (Path(args.output_dir) / "metrics.jsonl").unlink()
    trainer.train(stages)
    if trainer.next_stage < len(stages):
        return trainer
    best = load_multitask_model(Path(args.output_dir) / "best", device)
    trainer.model = best
    best_metrics, dev_predictions = trainer.evaluate("dev")
    print("best model on dev: " + summarize_line(best_metrics))
    write_leaderboard_files(trainer, args, dev_predictions)
    write_reports(trainer, dev_predictions)
    return trainer


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    try:
        run(args)
    except (DataError, CheckpointError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
