"""What a run does between two stages, decided from its history alone so that a resumed run decides as an
uninterrupted one: early stopping of a multi-epoch stage (--patience), the weights the stage after a block of
repeated stages starts from (--stage_start best, --simcse_keep best), EWC's consolidation when a block of task
stages gives way to the next, and SMART's anchor reset before every stage (--smart_anchor stage_start).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable

import torch

from base_bert import CheckpointError
from minbert.distributed import SINGLE_PROCESS, Distributed
from minbert.model.multitask_bert import MultitaskBERT, load_trained_tensors, trained_tensors
from minbert.prediction.leaderboard import kept_model_score
from minbert.tasks import RUN_TASKS, SIMCSE_TASKS
from minbert.training.objective import FinishedBlock, Penalty
from minbert.training.schedules import (Stage, StageKind, block_length, multi_epoch_stages, patience_exhausted,
                                        tasks_trained_by, trained_heads)
from minbert.training.training_state import TrainingState

BLOCK_BEST_KEY = "block_best."  # the best stage's tensors in a checkpoint


@dataclass
class BlockBest:
    """The best stage so far of a block of repeated stages that --stage_start best (--simcse_keep best) resolves:
    its number (its history record's index), its dev score and its trained tensors, on the CPU."""
    index: int
    score: float
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class TransitionSettings:
    """`patience`: a multi-epoch stage (schedules.multi_epoch_stages) stops repeating after this many epochs that do
    not beat its task's best dev score since it began (None: every epoch runs). `stage_start`, `simcse_keep`: what
    the stage after a block of repeated task stages (schedules.block_length), or of SimCSE stages, starts from
    (schedules.STAGE_STARTS): the block's last weights, or those of its stage with the best dev score of the
    block's task (SimCSE: STS's Pearson), as the thesis' sequential runs and its SimCSE stage do."""
    patience: int | None = None
    stage_start: str = "last"
    simcse_keep: str = "last"


class StageTransitions:
    """Between the stages of a run of `tasks`, and the penalties' hooks there. `finished_block(stage, index)`: the
    block of task stages that ends with stage `index`, as the penalties see it (the trainer's, which batches and
    computes its loss)."""

    def __init__(self, model: MultitaskBERT, device: torch.device, tasks: tuple[str, ...],
                 settings: TransitionSettings, penalties: list[Penalty],
                 finished_block: Callable[[Stage, int], FinishedBlock], distributed: Distributed = SINGLE_PROCESS):
        self.model, self.device, self.tasks, self.settings = model, device, tasks, settings
        self.penalties, self.finished_block, self.distributed = penalties, finished_block, distributed
        self.block_best: BlockBest | None = None  # the best stage of the block under way (stage_start, simcse_keep)
        self.saved_schedule_length: int | None = None  # the stages of the schedule a resumed checkpoint was saved in

    def stop_early(self, stages: list[Stage], index: int, state: TrainingState) -> None:
        """After stage `index`: when it belongs to a multi-epoch stage whose task's dev score (kept_model_score of
        the heads it trains) has not beaten its best since the stage began for `patience` epochs, skip the rest of
        it. The decision reads only the history, so a resumed run decides as an uninterrupted one."""
        patience = self.settings.patience
        if patience is None:
            return
        group = multi_epoch_stages(stages)[index]
        if group is None or index + 1 == group.stop:
            return
        heads = trained_heads([stages[index]], self.tasks)
        # the record before the multi-epoch stage (the model it started from), then one per epoch of it so far
        records = state.history[-(index - group.start + 2):]
        scores = [kept_model_score(record, heads) for record in records]
        if not patience_exhausted(scores, patience):
            return
        state.skipped_stages += list(range(index + 1, group.stop))
        state.next_stage = group.stop
        if self.distributed.is_main:
            best = records[scores.index(max(scores))]
            print(f"early stopping: {index - group.start + 1} epochs of {stages[index].label}, the last "
                  f"{patience} without a better dev score than {best['stage']} (stage {best['index']}): "
                  f"skipping stages {index + 2}-{group.stop}")

    def block_policy(self, stage: Stage) -> str:
        """--stage_start's setting for a block of task stages, --simcse_keep's for SimCSE's, "last" for the rest."""
        if stage.kind is StageKind.TASK:
            return self.settings.stage_start
        return self.settings.simcse_keep if stage.kind is StageKind.SIMCSE else "last"

    def prepare_next_stage(self, stages: list[Stage], index: int, record: dict, following: int) -> None:
        """After stage `index` (and early stopping), before its checkpoint, so that a resume starts the next stage
        (`following`) as an uninterrupted run does: keep the block's best stage so far (block_policy "best"); when
        the next stage begins another block, go on from that best stage's weights (only the model's: the
        optimizer's moments go on) and end the finished block of a task for the penalties (EWC consolidates); then
        start the next stage for them (SMART's anchor "stage_start" resets)."""
        stage = stages[index]
        if self.block_policy(stage) == "best" and block_length(stages, index) > 1:
            score = kept_model_score(record, {stage.task} if stage.task else set(SIMCSE_TASKS))  # SimCSE's: STS's r
            if self.block_best is None or score > self.block_best.score:
                self.block_best = BlockBest(index + 1, score, {k: v.to("cpu", copy=True)
                                                               for k, v in trained_tensors(self.model).items()})
        if following == len(stages):
            # Nothing follows: the block's best stays in the checkpoint, for a resume with more --cycles (extend).
            return
        if stages[following] != stage:
            best, self.block_best = self.block_best, None
            if best is not None and best.index != index + 1:
                load_trained_tensors(self.model, {k: v.to(self.device) for k, v in best.tensors.items()})
                if self.distributed.is_main:
                    print(f"stage {following + 1} starts from stage {best.index}, the best of its block on dev "
                          f"({best.score:.4f}; --{'simcse_keep' if stage.kind is StageKind.SIMCSE else 'stage_start'} "
                          "best)")
            if stage.kind is StageKind.TASK:
                block = self.finished_block(stage, index)
                for penalty in self.penalties:
                    penalty.end_block(self.model, block)
        for penalty in self.penalties:
            penalty.start_stage(self.model)

    def extend(self, stages: list[Stage], state: TrainingState) -> None:
        """A checkpoint saved at the end of a shorter schedule (load_state's saved_schedule_length), resumed with more
        stages (more --cycles): decide again, as a run of `stages` never stopped does, what follows its last stage
        done, which the end of the shorter schedule had left undecided: early stopping over the stages now after it,
        the next block's start and EWC's consolidation, SMART's anchor."""
        saved_length, self.saved_schedule_length = self.saved_schedule_length, None
        if saved_length is None or not state.next_stage == saved_length < len(stages):
            return
        done = state.history[-1]["index"] - 1
        if self.block_policy(stages[done]) == "best" and block_length(stages[:saved_length], done) > 1 and \
                self.block_best is None:  # saved by the code before the block's best was kept at a run's end
            raise CheckpointError(f"cannot resume with more stages: the checkpoint lacks the best stage of the block "
                                  f"that ended the run ({stages[done].label}); resume with the run's own --cycles")
        state.next_stage = done + 1
        state.skipped_stages = [position for position in state.skipped_stages if position <= done]
        self.stop_early(stages, done, state)
        self.prepare_next_stage(stages, done, state.history[-1], state.next_stage)

    def state(self) -> tuple[dict[str, torch.Tensor], dict | None]:
        """The block's best stage so far, for a checkpoint: its tensors by their keys, and its index and score
        (None outside a block)."""
        best = self.block_best
        if best is None:
            return {}, None
        return {f"{BLOCK_BEST_KEY}{k}": v for k, v in best.tensors.items()}, {"index": best.index, "score": best.score}

    def load_state(self, tensors: dict[str, torch.Tensor], saved: dict | None,
                   saved_schedule_length: int | None = None) -> None:
        """state()'s block best of a checkpoint (`saved`: its index and score), put back; the checkpoint was saved in a
        schedule of `saved_schedule_length` stages (None: the run's own), which extend() continues."""
        self.saved_schedule_length = saved_schedule_length
        kept = {k[len(BLOCK_BEST_KEY):]: v for k, v in tensors.items() if k.startswith(BLOCK_BEST_KEY)}
        if saved is not None and kept.keys() != trained_tensors(self.model).keys():
            raise ValueError(f"block_best names stage {saved['index']}, but the tensors kept of it "
                             f"({len(kept)}) are not the model's trained ones")
        self.block_best = None if saved is None else BlockBest(saved["index"], saved["score"], kept)


def stage_starts(history: Sequence[Mapping], stage_start: str = "last", simcse_keep: str = "last") -> list[int | None]:
    """For each record of a run's history (record 0: the model before training), the position of the record whose
    weights its stage began from (None for record 0): the record before it, except for the first stage after a block
    of two or more equal stages that --stage_start best (--simcse_keep best for SimCSE) resolves, which began from
    the block's stage with the best dev score (the first of equal ones), as prepare_next_stage decides. Blocks are
    runs of equal stage labels; the history alone decides, since the trainer records no start."""
    starts: list[int | None] = [None]
    block = 1  # the position of the first record of the block under way
    for position in range(1, len(history)):
        if position > 1 and history[position]["stage"] != history[position - 1]["stage"]:
            starts.append(_block_best(history, range(block, position), stage_start, simcse_keep))
            block = position
        else:
            starts.append(position - 1)
    return starts


def _block_best(history: Sequence[Mapping], block: range, stage_start: str, simcse_keep: str) -> int:
    """What the stage after `block` (positions of its records) began from: stage_starts' rule."""
    label = history[block[-1]]["stage"]
    simcse = label == StageKind.SIMCSE.value
    tasks = set(SIMCSE_TASKS) if simcse else tasks_trained_by(label, RUN_TASKS)  # mlm: none
    policy = simcse_keep if simcse else stage_start if tasks else "last"
    if policy != "best" or len(block) < 2:
        return block[-1]
    scores = [kept_model_score(history[position], tasks) for position in block]
    return block[scores.index(max(scores))]
