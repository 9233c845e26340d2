"""The run's progress (TrainingState: what the step loop advances, the checkpoint saves and --resume restores) and
the files it is saved in after every stage, and inside one (--save_steps, --save_every_minutes), as OUTPUT_DIR/last.*,
with the checks that a checkpoint fits the run that wants to continue it. What else a checkpoint holds (the weights,
the optimizer, the penalties) is loop.RunCheckpoint's.

    save_training_state(output_dir / "last", *checkpoint.state_dict(state))
    tensors, metadata = read_training_state(output_dir / "last")
    check_resumable(metadata, world_size, stage_labels, data_sha256, info, tasks)  # refused, with the reason
    state = checkpoint.load(tensors, metadata)
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from base_bert import CheckpointError
from minbert.data.batches import TaskData
from minbert.model.checkpoint import (atomic_save, check_fields, python_generator_state, read_checkpoint,
                                      rng_info_problem)
from minbert.step_log import DeviceSums, StageLosses

TRAINING_STATE_FIELDS = {"args": dict, "data_sha256": dict, "next_stage": int, "history": list, "best_score": (int, float),
                         "updates": int, "optimizer": dict, "rng": dict}
# "position": where a stage stood when the checkpoint was saved inside it (StageProgress.position).
# "smart_skipped_steps": SMART's (a penalty's checkpoint value: a run without SMART saves none; earlier code always did).
OPTIONAL_FIELDS = {"grad_scaler": dict, "skipped_updates": int, "skipped_stages": list,
                   "block_best": (dict, type(None)), "position": dict, "smart_skipped_steps": dict}
# The sums a stage's position keeps as tensors (position.losses.total, ...), beside their counts in last.json.
STAGE_LOSSES = ("total", "recent", "first_nonfinite")
LOGGED_SUMS = ("task_losses", "penalties")


@dataclass
class StageProgress:
    """Where the stage under way stands: what a checkpoint inside it saves ("position" in last.json, its sums as
    position.* tensors) and --resume restores, to continue at its next batch as if the run had never stopped."""
    index: int | None  # its place in the schedule (0-based); None: steps trained outside one, never saved inside
    label: str
    steps: int  # its steps: a batch each, or gradient surgery's batch of every task
    updates: int  # its optimizer updates: SMART's momentum schedule "stage" follows update / updates
    losses: StageLosses  # its losses so far, on the device
    lr: float = 0.0  # its base learning rate (each parameter group scales it)
    steps_done: int = 0
    update: int = 0  # the update under way within it (0-based)
    seconds_before: float = 0.0  # trained before the checkpoint a resumed stage continues from
    started: float = field(default_factory=time.time)
    # What else says where it stands, for a checkpoint (a multi-task epoch: its loaders and gradient surgery's draws).
    where: Callable[[], dict] = dict
    # Resumed: the position saved (a multi-task epoch's loaders and draws) and the RNG states (tensors, plain
    # values) to put back once the stage's loaders exist, as the saving run's had drawn from them before it saved.
    saved: dict = field(default_factory=dict)
    rng: tuple[dict[str, torch.Tensor], dict] | None = None

    @property
    def seconds(self) -> float:
        """Seconds trained in this stage, a resumed one's before its checkpoint included."""
        return self.seconds_before + time.time() - self.started

    def position(self, accumulation: int, state: TrainingState) -> tuple[dict, dict[str, torch.Tensor]]:
        """What a checkpoint inside the stage saves: its place (last.json's "position") and its sums (this rank's
        position.* tensors), with the sums steps.jsonl reports since its last line (`state`'s)."""
        loss_tensors, loss_counts = self.losses.state()
        local = {f"position.losses.{name}": tensor for name, tensor in loss_tensors.items()}
        local |= {f"position.task_losses.{name}": tensor for name, tensor in state.task_losses.sums.items()}
        local |= {f"position.penalties.{name}": tensor for name, tensor in state.penalty_terms.sums.items()}
        position = {"stage": self.index, "label": self.label, "steps_done": self.steps_done, "steps": self.steps,
                    "updates": math.ceil(self.steps_done / accumulation), "stage_updates": self.updates,
                    "seconds": self.seconds, "losses": loss_counts, "task_losses": dict(state.task_losses.counts),
                    "penalties": dict(state.penalty_terms.counts), **self.where()}
        return position, local

    @classmethod
    def resumed(cls, position: dict, tensors: dict[str, torch.Tensor], rng: dict,
                device: torch.device) -> StageProgress:
        """The stage a checkpoint inside it saved (`tensors`: this rank's, without rank suffix), its losses back on
        `device`."""
        losses = StageLosses(device)
        losses.load_state({name: tensors[f"position.losses.{name}"] for name in STAGE_LOSSES}, position["losses"])
        kept = {name: tensor for name, tensor in tensors.items() if name.startswith("rng.")}
        return cls(position["stage"], position["label"], position["steps"], position["stage_updates"], losses,
                   steps_done=position["steps_done"], seconds_before=position["seconds"], saved=position,
                   rng=(kept, rng))


@dataclass
class TrainingState:
    """The run's progress, in one place: the step loop (loop.StepLoop) advances it, the trainer records its stages
    in it, and the checkpoint saves it (saved_values, StageProgress.position) and --resume restores it
    (from_checkpoint). Like transformers' TrainerState."""
    next_stage: int = 0
    updates: int = 0  # optimizer steps taken; the learning rate and SMART's momentum follow it
    best_score: float = -math.inf  # kept_model_score of the model kept so far
    history: list[dict] = field(default_factory=list)  # one record per evaluation (index 0: the pretrained model)
    skipped_updates: int = 0  # fp16 steps skipped for inf / NaN gradients
    skipped_stages: list[int] = field(default_factory=list)  # schedule positions early stopping skipped (0-based)
    # Below, what two states equal by (==) leaves out: their progress between stages is the fields above.
    # Not saved: what a run computes again, or restarts, when it resumes.
    total_updates: int = field(default=1, compare=False)  # the updates of the whole schedule: the rate's horizon
    learning_rate: float = field(default=0.0, compare=False)  # the base rate of the last update
    last_save: float = field(default_factory=time.monotonic, compare=False)  # save_every_minutes counts from it
    # Since the last line of steps.jsonl, on the device: each task's losses (simcse and mlm stages: theirs), and the
    # penalties' terms (by the names their objective gives them). A checkpoint inside a stage saves them.
    task_losses: DeviceSums = field(default_factory=DeviceSums, compare=False)
    penalty_terms: DeviceSums = field(default_factory=DeviceSums, compare=False)
    # The stage under way (or resumed inside); None between stages.
    stage: StageProgress | None = field(default=None, compare=False)

    def saved_values(self) -> dict:
        """The fields of last.json that are the run's progress between stages."""
        return {"next_stage": self.next_stage, "history": [dict(record) for record in self.history],
                "best_score": self.best_score, "updates": self.updates}

    @classmethod
    def from_checkpoint(cls, metadata: dict, tensors: dict[str, torch.Tensor], device: torch.device) -> TrainingState:
        """The progress a checkpoint holds (`tensors`: this rank's, without rank suffix); fields added later read as
        a run saved before them did. Inside a stage, also its sums since the last line of steps.jsonl."""
        state = cls(metadata["next_stage"], metadata["updates"], metadata["best_score"], metadata["history"],
                    metadata.get("skipped_updates", 0), metadata.get("skipped_stages", []))
        position = metadata.get("position")
        if position is not None:
            state.stage = StageProgress.resumed(position, tensors, metadata["rng"], device)
            for name, sums in zip(LOGGED_SUMS, (state.task_losses, state.penalty_terms)):
                sums.load_state({key: tensors[f"position.{name}.{key}"].to(device) for key in position[name]},
                                position[name])
        return state


def data_fingerprints(data: dict[str, TaskData], triplets: list) -> dict[str, str]:
    """SHA-256 of the examples (ids, texts, labels) of every split a run reads, by 'task/split': --resume
    compares the data itself, so a moved or renamed data folder resumes and a changed file does not."""
    parts = {f"{task}/{split}": getattr(task_data, split) for task, task_data in data.items()
             for split in ("train", "dev", "test") if getattr(task_data, split) is not None}
    if triplets:
        parts["simcse/train"] = triplets
    return {name: hashlib.sha256("".join(map(repr, examples)).encode()).hexdigest()
            for name, examples in parts.items()}


def save_training_state(prefix: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    """PREFIX.safetensors (tensors) and PREFIX.json (plain values), each replaced whole."""
    atomic_save(prefix, tensors, metadata)


def read_training_state(prefix: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """A saved training state, its fields checked (CheckpointError names the file and the field)."""
    tensors, metadata = read_checkpoint(prefix)
    check_fields(prefix.with_suffix(".json"), metadata, TRAINING_STATE_FIELDS)
    check_fields(prefix.with_suffix(".json"), metadata,  # added later: runs saved before lack them
                 {name: kind for name, kind in OPTIONAL_FIELDS.items() if name in metadata})
    return tensors, metadata


def check_resumable(metadata: dict, world_size: int, stage_labels: list[str], data_sha256: dict[str, str],
                    info: Path, tasks: tuple[str, ...]) -> None:
    """Refuse a resume the saved state cannot continue: a state its own fields contradict (a hand-edited `info`,
    check_consistent), another number of processes, a schedule that the stages already done do not begin, or data
    whose content changed (a --distill teacher's scores included: "distill/TASK")."""
    check_consistent(metadata, info)
    saved_world = metadata.get("world_size", 1)
    if saved_world != world_size:  # each rank's data slice and dropout stream would differ
        raise CheckpointError(f"cannot resume: the run was trained by {saved_world} process(es), this one has "
                              f"{world_size}; resume with the same torchrun --nproc_per_node")
    done = [(record["index"] - 1, record["stage"]) for record in metadata["history"] if record["index"] > 0]
    if any(position >= len(stage_labels) or stage_labels[position] != label for position, label in done) or \
            any(position >= len(stage_labels) for position in metadata.get("skipped_stages", [])):
        raise CheckpointError(f"cannot resume: the stages already done ({', '.join(label for _, label in done)}) "
                              "do not begin this run's schedule")
    position, next_stage = metadata.get("position"), metadata["next_stage"]
    if position is not None and stage_labels[next_stage:next_stage + 1] != [position["label"]]:
        raise CheckpointError(f"cannot resume: the run stopped inside stage {next_stage + 1} {position['label']}, "
                              "which is not that stage of this run's schedule")
    unknown = sorted(set((position or {}).get("loaders", {})) - set(tasks))  # a multi-task epoch's, of the run's tasks
    if unknown:
        raise CheckpointError(f"{info}: the position's loaders name tasks this run does not have "
                              f"({', '.join(unknown)}); the file was edited or damaged: resume from an intact copy or "
                              "start again without --resume")
    changed = sorted(name for name in data_sha256.keys() & metadata["data_sha256"].keys()
                     if data_sha256[name] != metadata["data_sha256"][name])
    if changed:  # a split only one of the two runs reads cannot have changed what was trained
        raise CheckpointError(f"cannot resume: the data files' content differs from the stopped run's "
                              f"({', '.join(changed)})")


def check_consistent(metadata: dict, info: Path) -> None:
    """Every field a resume reads, against the others (read_training_state has checked their types): the history's
    records (the pretrained model's, then one per stage done, each with the first one's metrics, as numbers),
    next_stage (the number of stages done or skipped by early stopping), the best score (a score, or -inf) and the
    counters. A hand-edited last.json would otherwise resume into stages rerun or skipped, or a kept model that no
    stage can beat."""
    def refuse(problem: str):
        raise CheckpointError(f"{info}: {problem}; the file was edited or damaged: resume from an intact copy or "
                              "start again without --resume")
    history, next_stage, skipped = metadata["history"], metadata["next_stage"], metadata.get("skipped_stages", [])
    check_history(history, next_stage, skipped, refuse)
    done = len(history) - 1
    position = metadata.get("position")
    # A checkpoint follows a stage, or is inside one (the first too); more stages done than the schedule has is
    # check_resumable's own refusal.
    if next_stage != done + len(skipped) or (done < 1 and position is None):
        refuse(f"next_stage {next_stage!r} does not follow the history's {done} stage(s) done"
               + (f" and the {len(skipped)} early stopping skipped" if skipped else ""))
    if position is not None:
        check_position(position, next_stage, refuse)
    check_values(metadata, refuse)
    check_restored_states(metadata, refuse)


def check_history(history: list, next_stage: int, skipped: list, refuse: Callable[[str], None]) -> None:
    """The history's records number the stages done, those before next_stage that early stopping did not skip
    (`skipped`), each with the first record's metrics, as numbers; the first is the pretrained model's."""
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < next_stage for s in skipped) or \
            skipped != sorted(set(skipped)):
        refuse(f"skipped_stages {skipped!r} must be distinct stage positions below next_stage, in order")
    # A record's index is its stage's position in the schedule (1-based; 0: the pretrained model's).
    skipped_positions = set(skipped)
    done_positions = (position for position in itertools.count() if position not in skipped_positions)
    indices = [0] + [position + 1 for position in itertools.islice(done_positions, len(history))]
    for position, record in enumerate(history):
        expected = indices[position]
        if not isinstance(record, dict) or not isinstance(record.get("stage"), str) or record.get("index") != expected:
            refuse(f"history record {position} must be an object with a 'stage' name and 'index' {expected}")
        metrics = {k: v for k, v in record.items() if k not in ("stage", "index")}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()):
            refuse(f"history record {position} ({record['stage']}) holds a value that is not a number")
        if position and not set(history[0]) <= set(record):
            refuse(f"history record {position} ({record['stage']}) lacks metrics of the first record "
                   f"({', '.join(sorted(set(history[0]) - set(record)))})")
    if not history or history[0]["stage"] != "pretrained":
        refuse("the history must begin with the pretrained model's record")


def check_values(metadata: dict, refuse: Callable[[str], None]) -> None:
    """The best score (a score, or -inf), the counters, the data's hashes and the block's best stage."""
    best = metadata["best_score"]
    if not (best == -math.inf or 0 <= best <= 1):  # -inf before any stage is kept; scores are means of [0, 1] metrics
        refuse(f"best_score {best!r} is not a score in [0, 1]")
    counters = [("updates", metadata["updates"], 0), ("skipped_updates", metadata.get("skipped_updates", 0), 0),
                ("world_size", metadata.get("world_size", 1), 1)]
    counters += [(f"smart_skipped_steps[{task!r}]", n, 0) for task, n in metadata.get("smart_skipped_steps", {}).items()]
    for name, count, least in counters:
        if not isinstance(count, int) or isinstance(count, bool) or count < least:
            refuse(f"{name} must be a whole number >= {least}, found {count!r}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata["data_sha256"].items()):
        refuse("data_sha256 must map names to hashes")
    block_best = metadata.get("block_best")  # the best stage so far of a block that --stage_start best resolves
    if block_best is not None and not (
            set(block_best) == {"index", "score"} and any(r["index"] == block_best["index"]
                                                         for r in metadata["history"][1:])
            and isinstance(block_best["score"], (int, float)) and 0 <= block_best["score"] <= 1):
        refuse(f"block_best {block_best!r} must name a stage done (its 'index') and its 'score' in [0, 1]")


def _whole(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_restored_states(metadata: dict, refuse: Callable[[str], None]) -> None:
    """What a resume puts back as it was saved: the generators' states (rng), AdamW's step counts (each parameter's,
    from 1 to the run's updates) and fp16's gradient scaler (numbers, a scale > 0). A damaged one would otherwise fail
    halfway through the restore, or train on with other numbers."""
    problem = rng_info_problem(metadata["rng"])
    if problem:
        refuse(problem)
    optimizer = metadata["optimizer"]
    steps, groups = optimizer.get("steps"), optimizer.get("param_groups")
    if not isinstance(steps, dict) or not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        refuse("optimizer must hold 'steps' (an object) and 'param_groups' (a list of objects)")
    for index, step in steps.items():
        if not index.isdigit() or not _whole(step, 1) or step > metadata["updates"]:
            refuse(f"optimizer.steps[{index!r}] must be a parameter's number and a whole number of steps from 1 to "
                   f"the {metadata['updates']} updates, found {step!r}")
    scaler = metadata.get("grad_scaler", {})
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scaler.values()) \
            or not scaler.get("scale", 1) > 0:
        refuse(f"grad_scaler {scaler!r} must hold finite numbers, its scale > 0")


def check_position(position: dict, stage: int, refuse) -> None:
    """A checkpoint saved inside stage `stage` (0-based): its place among the stage's steps and updates, and the
    counts of its sums, which say what the resumed stage skips and adds to."""
    if position.get("stage") != stage or not isinstance(position.get("label"), str):
        refuse(f"the position inside a stage must name stage {stage} (next_stage) and its label")
    if not (_whole(position.get("steps"), 2) and _whole(position.get("steps_done"), 1)
            and position["steps_done"] < position["steps"]):
        refuse("the position's steps_done must be a whole number from 1 to below its steps")
    if not (_whole(position.get("stage_updates"), 1) and _whole(position.get("updates"), 1)
            and position["updates"] <= position["stage_updates"]):
        refuse("the position's updates must be a whole number from 1 to its stage_updates")
    if not isinstance(position.get("seconds"), (int, float)) or isinstance(position["seconds"], bool):
        refuse("the position's seconds must be a number")
    counts = []
    for name, keys in (("losses", ("count", "recent_count")), ("task_losses", None), ("penalties", None)):
        sums = position.get(name)
        counts += [None] if not isinstance(sums, dict) else [sums.get(key) for key in keys or sums]
    if not all(_whole(count, 0) for count in counts):
        refuse("the position's counts of losses must be whole numbers")
    check_epoch_position(position, refuse)


def check_epoch_position(position: dict, refuse) -> None:
    """A multi-task epoch's place: each task's loader's [passes restarted, batches taken] and the Python generator
    of its task order."""
    loaders = position.get("loaders", {})
    if not isinstance(loaders, dict) or not all(isinstance(place, list) and len(place) == 2 and
                                                all(_whole(n, 0) for n in place) for place in loaders.values()):
        refuse("the position's loaders must give each task two whole numbers (passes restarted, batches taken)")
    if "rng" in position:
        try:
            random.Random().setstate(python_generator_state(position["rng"]))
        except (IndexError, TypeError, ValueError, OverflowError) as err:
            refuse(f"the position's rng is not a Python generator state ({type(err).__name__}: {err})")


def saved_position(prefix: Path) -> dict | None:
    """The position of the checkpoint PREFIX.json when it was saved inside a stage; None after a stage, or when there
    is no readable checkpoint (for a message: nothing is checked)."""
    try:
        position = json.loads(prefix.with_suffix(".json").read_text(encoding="utf-8")).get("position")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return position if isinstance(position, dict) else None


def kept_inside_stage(position: dict) -> str:
    """What a checkpoint inside a stage keeps of it, e.g. 'kept 37 of 120 updates of stage 2 sts'."""
    return (f"kept {position['updates']} of {position['stage_updates']} updates of stage {position['stage'] + 1} "
            f"{position['label']}")
