"""The training loop of MultitaskBERT: stages, optimisation steps with gradient accumulation, SMART,
LNSR, gradient surgery, evaluation after every stage and logging.

    trainer = Trainer(args, model, tokenizer, data, triplets, device)   # args: a TrainingArguments
    trainer.train(stages)                                                # schedules.build_schedule(...)

The training state saved after every stage, and --resume, are in training_state.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import time
from contextlib import nullcontext
from functools import cached_property, partial
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from datasets import (TaskData, TokenizationCache, TokenizedExamples, predict_in_file_order, subsample,
                      subsample_indices, tokenized_dataloader)
from distributed import SINGLE_PROCESS, Distributed, global_batch_count
from evaluation import kept_model_score, overall_score, summarize_line, task_metrics
from gradient_surgery import combine_task_gradients
from lnsr import LnsrConfig, encode_with_noise_stability
from mlm import IGNORED_LABEL, MaskedLanguageModelHead, mlm_batches, mlm_loss, task_sentences
from multitask_bert import MultitaskBERT, save_multitask_model
from optimizer import AdamW, weight_decay_groups
from runtime import autocast, float32_exact, resolve_precision, scaled_step, to_device, use_tf32
from schedules import Stage, learning_rate_factor, multitask_order, trained_heads
from simcse import pairwise_contrastive_loss, supervised_simcse_loss, triplet_batches
from smart import BregmanTeacher, SmartRegularizer, bregman_momentum
from squad import Answer, QAExample, QAWindows, best_threshold, decode_answers, qa_metrics
from tasks import TASKS
from training_args import TrainingArguments, lnsr_config, lnsr_tasks, regularized_tasks, smart_configs
from training_state import save_training_state

SUMMARY_KEYS = ("index", "stage", "train_loss", "seconds", "sst_acc", "qqp_acc", "sts_pearson", "overall", "qa_f1")


def compute_task_loss(model: MultitaskBERT, task: str, batch: dict, regularizer: SmartRegularizer | None = None,
                      lnsr: LnsrConfig | None = None) -> torch.Tensor:
    """The task's loss on one batch, plus SMART's and LNSR's penalties when they are given.

    With SMART the whole step runs in exact float32 whatever the run's autocast (smart.py says why)."""
    with float32_exact() if regularizer is not None else nullcontext():
        return _task_loss(model, task, batch, regularizer, lnsr)


def _task_loss(model: MultitaskBERT, task: str, batch: dict, regularizer: SmartRegularizer | None,
               lnsr: LnsrConfig | None) -> torch.Tensor:
    inputs = model.encoder_inputs(task, batch)
    embeddings = model.embed(inputs)

    def forward_fn(e):
        return model.outputs_from_embeddings(task, e, inputs)
    objective = model.objectives[task]
    if lnsr is None:
        outputs = forward_fn(embeddings)
        loss = objective.loss(outputs, batch["labels"])
    else:  # the clean pass of LNSR is the task's forward
        hidden, penalty = encode_with_noise_stability(model.bert.encoder, embeddings[0], inputs.attention_mask, lnsr)
        outputs = model.outputs_from_hidden(task, hidden, inputs)
        loss = objective.loss(outputs, batch["labels"]) + penalty
    if regularizer is not None:
        loss = loss + regularizer.penalty(forward_fn, embeddings, outputs, objective.divergence,
                                          teacher_args=(task, batch))
    return loss


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
        loader = tokenized_dataloader(shard, batch_size, shuffle=False, pin_memory=device.type == "cuda")
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
def predict_answers(model: MultitaskBERT, windows: QAWindows, device: torch.device, batch_size: int,
                    precision: str = "fp32", quiet: bool = True, distributed: Distributed = SINGLE_PROCESS,
                    n_best: int = 20, max_answer_tokens: int = 30) -> dict[str, Answer]:
    """Every SQuAD question's best span and no-answer margin (squad.decode_answers) from the logits of all
    of its windows; under torchrun each rank reads every world_size-th window and all ranks get every answer."""
    model.eval()

    def predict_shard(shard: QAWindows) -> tuple[list[str], np.ndarray]:
        loader = tokenized_dataloader(shard, batch_size, shuffle=False, pin_memory=device.type == "cuda")
        ids, logits = [], []
        for batch in tqdm(loader, desc="predict qa", leave=False, disable=quiet):
            batch = to_device(batch, device)
            with autocast(device, precision):
                values = model.score("qa", batch).float().cpu().numpy()  # (B, T, 2)
            logits.append(np.pad(values, ((0, 0), (0, windows.max_length - values.shape[1]), (0, 0))))
            ids += batch["ids"]
        return ids, np.concatenate(logits)  # (B, max_length, 2)
    _, logits = predict_in_file_order(windows, predict_shard, distributed)
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


class RestartingLoaders:
    """Batches from each task's loader; a loader that runs out starts over in a new order, as in
    round-robin and annealed sampling, where the smaller tasks are seen more than once per epoch."""

    def __init__(self, loaders: dict):
        self.loaders = loaders
        self.iterators = {task: iter(loader) for task, loader in loaders.items()}
        self.restarts = dict.fromkeys(loaders, 0)

    def next(self, task: str) -> dict:
        try:
            return next(self.iterators[task])
        except StopIteration:
            self.restarts[task] += 1
            self.loaders[task].batch_sampler.set_epoch(self.restarts[task])
            self.iterators[task] = iter(self.loaders[task])
            return next(self.iterators[task])


class Trainer:
    """Runs a schedule of stages; owns the model, optimizer, SMART state and checkpoints."""

    def __init__(self, args: TrainingArguments, model: MultitaskBERT, tokenizer, data: dict[str, TaskData],
                 triplets: list, device: torch.device, mlm_head: MaskedLanguageModelHead | None = None,
                 distributed: Distributed = SINGLE_PROCESS):
        """`mlm_head`: given when the schedule has an mlm stage; it trains with the model, and only
        the training state (for --resume) keeps it. `distributed`: this process's place under torchrun;
        each rank trains on its slice of every batch and only rank 0 writes."""
        self.args, self.model, self.tokenizer, self.data, self.triplets = args, model, tokenizer, data, triplets
        self.data_sha256 = data_fingerprints(data, triplets)  # the data never changes during a run
        self.device = device
        self.distributed = distributed
        self.quiet = args.quiet or not distributed.is_main
        self.output_dir = Path(args.output_dir)
        self.mlm_head = mlm_head
        named = list(model.named_parameters())
        if mlm_head is not None:
            named += [(f"mlm_head.{name}", p) for name, p in mlm_head.named_parameters()]
        num_layers = model.bert.config.num_hidden_layers
        self.optimizer = AdamW(weight_decay_groups(named, args.weight_decay, args.layerwise_lr_decay, num_layers),
                               lr=args.lr)
        self.lnsr = {task: lnsr_config(args, num_layers) for task in lnsr_tasks(args)}
        smart_tasks = regularized_tasks(args)
        configs = smart_configs(args) if smart_tasks else {}
        self.teacher = None
        if any(configs[task].bregman_weight > 0 for task in smart_tasks):
            self.teacher = BregmanTeacher(model, bregman_momentum(0, 1, args.smart_momentum))
        self.regularizers = {task: SmartRegularizer(model, configs[task], self.teacher) for task in smart_tasks}
        self.precision = resolve_precision(device, args.precision)
        use_tf32(device)
        self.amp = autocast(device, self.precision)
        # fp16 (GPUs without bf16: T4, V100) underflows small gradients: the loss is scaled up before backward
        # and the gradients unscaled before clipping and the step; a step with inf / NaN gradients is skipped.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.skipped_updates = 0  # fp16 steps skipped for inf / NaN gradients
        self.history: list[dict] = []
        self.best_score = -math.inf
        self.next_stage = 0
        self.updates = 0  # optimizer steps taken; the learning rate and SMART's momentum follow it
        self.total_updates = 1
        self.stage_lr = args.lr
        self.tokenized = TokenizationCache(tokenizer)  # each split tokenised once per run
        self.tasks = tuple(data)  # the run's tasks, in tasks.RUN_TASKS' order
        self.qa_threshold = 0.0  # SQuAD's no-answer threshold, chosen on dev at every dev evaluation

    # -- one optimisation step --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, count: int, group_size: int) -> None:
        """Backward of a mean loss over `count` local items (examples, masked tokens), divided by its
        accumulation group's size; under torchrun weighted by this rank's share of the global batch."""
        if self.distributed.enabled:
            loss = loss * self.distributed.share(count, self.device)
        self.scaler.scale(loss / group_size).backward()

    def task_step(self, task: str, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            loss = compute_task_loss(self.model, task, batch, self.regularizers.get(task), self.lnsr.get(task))
        if loss.requires_grad:  # not so for the SBERT cosine with --option pretrain: it has no trainable weight
            self.backward(loss, len(batch["labels"]), group_size)
        return loss.item()

    def simcse_step(self, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            embeddings = self.model.encode_sentences(batch["input_ids"], batch["attention_mask"])
            # Under torchrun every rank's triplets are in-batch negatives (gradients reach the local slice).
            anchor, positive, negative = (self.distributed.gather_with_grad(e) for e in embeddings.chunk(3))
            if self.args.simcse_objective == "pairwise":
                loss = pairwise_contrastive_loss(anchor, positive, negative, self.args.simcse_temperature)
            else:
                loss = supervised_simcse_loss(anchor, positive, negative, self.args.simcse_temperature)
        # The loss is already the global batch's; the gradient average over ranks would divide it.
        self.scaler.scale(loss * self.distributed.world_size / group_size).backward()
        return loss.item()

    def mlm_step(self, batch: dict, group_size: int) -> float:
        batch = to_device(batch, self.device)
        with self.amp:
            loss = mlm_loss(self.model.bert, self.mlm_head, batch)
        self.backward(loss, int((batch["labels"] != IGNORED_LABEL).sum()), group_size)
        return loss.item()

    def surgery_step(self, batches: list[tuple[str, dict]], group_size: int, rng: random.Random) -> float:
        """One backward per task (a task's batches summed), then the tasks' gradients combined by
        --gradient_surgery into .grad."""
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
        combined = combine_task_gradients(self.args.gradient_surgery, task_gradients,
                                          [self.model.is_shared(name) for name, _ in named], rng, self.args.cagrad_c)
        for p, previous, gradient in zip(params, accumulated, combined):
            p.grad = gradient if previous is None else previous + gradient
        return float(np.mean(losses))

    def optimizer_step(self, gradients_reduced: bool = False) -> None:
        if not gradients_reduced:
            self.distributed.average_gradients(self.model.parameters())
            if self.mlm_head is not None:
                self.distributed.average_gradients(self.mlm_head.parameters())
        self.scaler.unscale_(self.optimizer)  # clipping and the step see the true gradients
        if self.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]],
                                           self.args.max_grad_norm)
        factor = learning_rate_factor(self.updates, self.total_updates, self.args.lr_schedule, self.args.warmup_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = self.stage_lr * factor * group["lr_scale"]
        stepped = scaled_step(self.scaler, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        if not stepped:
            # Nothing moved: neither the teacher nor the schedules (learning rate, SMART's momentum) advance.
            self.skipped_updates += 1
            return
        if self.teacher is not None:
            self.teacher.momentum = bregman_momentum(self.updates, self.total_updates, self.args.smart_momentum)
            self.teacher.update(self.model)
        self.updates += 1

    def run_steps(self, steps, total: int, description: str, gradients_reduced: bool = False) -> float:
        """Drive (step_fn, batch) pairs with gradient accumulation; returns the mean loss. Each loss is
        divided by the size of its accumulation group, the last (possibly shorter) one included.
        Under torchrun gradients are averaged over ranks once per optimizer step, unless the step
        functions did it themselves (`gradients_reduced`: gradient surgery)."""
        self.model.train()
        accumulation = self.args.grad_accumulation_steps
        losses = []
        bar = tqdm(steps, total=total, desc=description, leave=False, disable=self.quiet)
        for index, (step_fn, batch) in enumerate(bar):
            group_size = min(accumulation, total - (index - index % accumulation))
            losses.append(step_fn(batch, group_size))
            if (index + 1) % accumulation == 0 or index + 1 == total:
                self.optimizer_step(gradients_reduced)
            if (index + 1) % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
        return float(np.mean(losses)) if losses else float("nan")

    # -- stages -----------------------------------------------------------------------------------
    def tokenized_split(self, task: str, examples: list) -> TokenizedExamples | QAWindows:
        """A split ready to batch, made on its first use only: tokenised examples, or SQuAD's windows."""
        if TASKS[task].is_extractive:
            return self.tokenized.windows(examples, self.args.qa_max_length, self.args.qa_doc_stride)
        return self.tokenized.get(examples, self.args.max_length, self.model.reads_pairs_jointly(task))

    def train_items(self, task: str) -> int:
        """What one epoch of the task trains on: its training examples, or for SQuAD its windows."""
        return len(self.tokenized_split(task, self.data[task].train))

    def train_loader(self, task: str, seed: int, size: int | None = None):
        """A loader over the task's training split, or over `size` of its examples (SQuAD: windows) drawn
        with `seed` (datasets.subsample's)."""
        train = self.tokenized_split(task, self.data[task].train)
        if size is not None:
            train = train.subset(subsample_indices(len(train), size, seed))
        return tokenized_dataloader(train, self.args.batch_size, shuffle=True, seed=seed,
                                    num_workers=self.args.num_workers, world_size=self.distributed.world_size,
                                    rank=self.distributed.rank, pin_memory=self.device.type == "cuda")

    def batch_count(self, num_examples: int) -> int:
        """Steps over num_examples: global batches of batch_size per rank."""
        return global_batch_count(num_examples, self.args.batch_size, self.distributed.world_size)

    def stage_batches(self, stage: Stage) -> int:
        """How many batches the stage trains on."""
        if stage.kind in ("task", "mlm"):
            return self.batch_count(self.stage_size(stage))
        if stage.kind == "simcse":
            return self.batch_count(len(self.triplets))
        total = sum(self.batch_count(self.train_items(t)) for t in self.tasks)
        return math.ceil(total / len(self.tasks)) if self.args.gradient_surgery != "none" else total

    def stage_size(self, stage: Stage) -> int:
        """Examples (sentences for mlm, windows for qa) the stage trains on."""
        available = len(self.sentences) if stage.kind == "mlm" else self.train_items(stage.task)
        return max(1, round(stage.fraction * available))

    @cached_property
    def sentences(self) -> list[str]:
        """The three tasks' distinct training sentences, the mlm stage's text."""
        return task_sentences(self.data)

    def run_stage(self, index: int, stage: Stage) -> float:
        seed = self.args.seed + 1000 * index  # data order depends on the stage only: resumable
        self.stage_lr = self.args.simcse_lr if stage.kind == "simcse" else self.args.lr
        description = f"stage {index + 1} {stage.label}"
        if stage.kind == "task":
            loader = self.train_loader(stage.task, seed, self.stage_size(stage))
            return self.run_steps(((partial(self.task_step, stage.task), b) for b in loader), len(loader), description)
        if stage.kind == "simcse":
            batches = triplet_batches(self.triplets, self.tokenizer, self.args.batch_size, seed, self.args.max_length,
                                      self.distributed.world_size, self.distributed.rank)
            return self.run_steps(((self.simcse_step, b) for b in batches), self.stage_batches(stage), description)
        if stage.kind == "mlm":
            sentences = subsample(self.sentences, self.stage_size(stage), seed)
            batches = mlm_batches(sentences, self.tokenizer, self.args.batch_size, seed, self.args.max_length,
                                  self.distributed.world_size, self.distributed.rank)
            return self.run_steps(((self.mlm_step, b) for b in batches), self.stage_batches(stage), description)
        return self.run_multitask_epoch(stage, seed, description)

    def run_multitask_epoch(self, stage: Stage, seed: int, description: str) -> float:
        loaders = {t: self.train_loader(t, seed + i) for i, t in enumerate(self.tasks)}
        batches = RestartingLoaders(loaders)
        rng = random.Random(seed)
        steps = self.stage_batches(stage)
        sizes = {t: self.train_items(t) for t in self.tasks}
        surgery = self.args.gradient_surgery != "none"
        per_step = len(self.tasks) if surgery else 1  # surgery: a batch of every task a step (round_robin: in turn)
        order = multitask_order(self.args.schedule, sizes, stage.epoch, self.args.epochs, steps * per_step, rng)
        if surgery:
            step = partial(self.surgery_step, rng=rng)
            groups = (order[i * per_step:(i + 1) * per_step] for i in range(steps))
            pairs = ((step, [(t, batches.next(t)) for t in group]) for group in groups)
            return self.run_steps(pairs, steps, f"{description} {self.args.gradient_surgery}", gradients_reduced=True)
        return self.run_steps(((partial(self.task_step, t), batches.next(t)) for t in order), steps, description)

    # -- evaluation -------------------------------------------------------------------------------
    def predict(self, task: str, examples, scores: bool = False) -> tuple[list[str], np.ndarray]:
        examples = self.tokenized_split(task, examples)
        return predict_examples(self.model, task, examples, self.tokenizer, self.device, self.args.eval_batch_size,
                                self.args.max_length, self.precision, self.quiet, self.distributed, scores)

    def answer(self, questions: list[QAExample]) -> dict[str, Answer]:
        """SQuAD questions' best spans and no-answer margins (predict_answers)."""
        return predict_answers(self.model, self.tokenized_split("qa", questions), self.device,
                               self.args.eval_batch_size, self.precision, self.quiet, self.distributed,
                               self.args.qa_n_best, self.args.qa_max_answer_tokens)

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
            examples = subsample(examples, limit, self.args.seed)
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
        self.total_updates = sum(math.ceil(self.stage_batches(s) / self.args.grad_accumulation_steps) for s in stages)
        kept_on = trained_heads(stages, self.tasks)  # the tasks whose dev scores pick the model kept as best
        if self.next_stage == 0 and not self.history:
            start = time.time()
            dev, _ = self.evaluate("dev")
            self.log({"stage": "pretrained", "index": 0, "seconds": time.time() - start, **dev})
        for index in range(self.next_stage, len(stages)):
            if self.args.stop_after_stages is not None and index >= self.args.stop_after_stages:
                print(f"stopping after {index} stages (--stop_after_stages); continue with --resume")
                return
            start = time.time()
            train_loss = self.run_stage(index, stages[index])
            record = {"stage": stages[index].label, "index": index + 1, "train_loss": train_loss,
                      "seconds": time.time() - start, **self.evaluate("dev")[0]}
            if self.scaler.is_enabled():
                record["fp16_skipped_updates"] = self.skipped_updates  # so far in the run
            if self.args.eval_train_examples:
                train_metrics, _ = self.evaluate("train", self.args.eval_train_examples)
                record.update({f"train_{k}": v for k, v in train_metrics.items()})
            self.log(record)
            saved = {"metrics": record, "args": dataclasses.asdict(self.args)}
            score = kept_model_score(record, kept_on)
            if score > self.best_score:  # every rank holds the same gathered metrics
                self.best_score = score
                if self.distributed.is_main:
                    save_multitask_model(self.model, self.output_dir / "best", saved)
            if self.args.keep_stage_models and self.distributed.is_main:
                save_multitask_model(self.model, self.output_dir / f"stage_{index + 1}", saved)
            self.next_stage = index + 1
            save_training_state(self, self.output_dir / "last")
        self.distributed.barrier()  # rank 0's files are complete before any rank reads them

    def log(self, record: dict) -> None:
        self.history.append(record)
        if not self.distributed.is_main:
            return
        print(summarize_line({k: record[k] for k in SUMMARY_KEYS if k in record}))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
