"""What each stage of a run trains on, batched for this process: a task's training examples (SQuAD: its windows),
all of them or the stage's seeded fraction; the SimCSE triplets; the mlm stage's sentences; and for a multi-task
epoch every task's loader, restarted when it runs out. How many batches each stage takes follows from them.

Every order is drawn from the stage's seed alone, so a resumed stage batches as an uninterrupted one; `done`
batches of a resumed stage are skipped without being collated.
"""
from __future__ import annotations

import math
from functools import cached_property

import torch

from minbert.data.batches import TaskData, TokenizedSplits, subsample, subsample_indices, tokenized_dataloader
from minbert.distributed import SINGLE_PROCESS, Distributed, global_batch_count
from minbert.training.mlm import mlm_batches, task_sentences
from minbert.training.schedules import Stage, StageKind
from minbert.training.simcse import triplet_batches


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


class StageData:
    """The batches of a run's stages on this process (its slice of every global batch under torchrun).
    `combines_tasks`: a multi-task step takes a batch of every task (gradient surgery), so an epoch has as many
    steps as its tasks' batches divided by their number."""

    def __init__(self, data: dict[str, TaskData], splits: TokenizedSplits, triplets: list, batch_size: int,
                 num_workers: int, pad_to_multiple_of: int | None, device: torch.device,
                 distributed: Distributed = SINGLE_PROCESS, combines_tasks: bool = False):
        self.data, self.splits, self.triplets = data, splits, triplets
        self.batch_size, self.num_workers, self.pad_to_multiple_of = batch_size, num_workers, pad_to_multiple_of
        self.device, self.distributed, self.combines_tasks = device, distributed, combines_tasks
        self.tasks = tuple(data)  # the run's tasks, in tasks.RUN_TASKS' order

    def train_items(self, task: str) -> int:
        """What one epoch of the task trains on: its training examples, or for SQuAD its windows."""
        return len(self.splits.get(task, self.data[task].train))

    def train_loader(self, task: str, seed: int, size: int | None = None):
        """A loader over the task's training split, or over `size` of its examples (SQuAD: windows) drawn
        with `seed` (datasets.subsample's)."""
        train = self.splits.get(task, self.data[task].train)
        if size is not None:
            train = train.subset(subsample_indices(len(train), size, seed))
        return tokenized_dataloader(train, self.batch_size, shuffle=True, seed=seed, num_workers=self.num_workers,
                                    world_size=self.distributed.world_size, rank=self.distributed.rank,
                                    pin_memory=self.device.type == "cuda", pad_to_multiple_of=self.pad_to_multiple_of)

    def task_batches(self, stage: Stage, seed: int, done: int = 0):
        """The loader of a task stage (its fraction of the task's examples), past its first `done` batches."""
        loader = self.train_loader(stage.task, seed, self.stage_size(stage))
        loader.batch_sampler.set_epoch(0, done)
        return loader

    def simcse_batches(self, seed: int, done: int = 0):
        return triplet_batches(self.triplets, self.splits.tokenizer, self.batch_size, seed, self.splits.max_length,
                               self.distributed.world_size, self.distributed.rank, done)

    def mlm_batches(self, stage: Stage, seed: int, done: int = 0):
        sentences = subsample(self.sentences, self.stage_size(stage), seed)
        return mlm_batches(sentences, self.splits.tokenizer, self.batch_size, seed, self.splits.max_length,
                           self.distributed.world_size, self.distributed.rank, done)

    def multitask_loaders(self, seed: int, start: dict[str, list[int]] | None = None) -> RestartingLoaders:
        """Every task's loader for a multi-task epoch, each with its own seed; `start`: a resumed epoch's."""
        return RestartingLoaders({t: self.train_loader(t, seed + i) for i, t in enumerate(self.tasks)}, start)

    def batch_count(self, num_examples: int) -> int:
        """Steps over num_examples: global batches of batch_size per rank."""
        return global_batch_count(num_examples, self.batch_size, self.distributed.world_size)

    def stage_batches(self, stage: Stage) -> int:
        """How many batches the stage trains on."""
        if stage.kind in (StageKind.TASK, StageKind.MLM):
            return self.batch_count(self.stage_size(stage))
        if stage.kind is StageKind.SIMCSE:
            return self.batch_count(len(self.triplets))
        total = sum(self.batch_count(self.train_items(t)) for t in self.tasks)
        return math.ceil(total / len(self.tasks)) if self.combines_tasks else total

    def stage_size(self, stage: Stage) -> int:
        """Examples (sentences for mlm, windows for qa) the stage trains on."""
        available = len(self.sentences) if stage.kind is StageKind.MLM else self.train_items(stage.task)
        return max(1, round(stage.fraction * available))

    @cached_property
    def sentences(self) -> list[str]:
        """The three tasks' distinct training sentences, the mlm stage's text."""
        return task_sentences(self.data)
