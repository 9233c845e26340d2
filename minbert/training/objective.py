"""A task's training objective: its base loss on a batch plus the penalties the run adds to it, composed through
one interface (Penalty), whatever the penalty: SMART's adversarial and Bregman terms, LNSR, EWC, L2-SP,
distillation, or a new one in a file of minbert/training/penalties/.

    objective = TaskObjective("sst", penalties)           # built once per task: the penalties that apply to it
    loss, terms = objective(model, batch)                 # terms: each penalty's, detached, for steps.jsonl
    loss, terms = compute_task_loss(model, "sst", batch)  # the same, for a task and any penalties, in one call

A penalty wraps the loss as a sentence-transformers loss wraps another: it receives the loss so far and the
batch's forward (TaskForward) and returns the loss it makes, so that it may add terms (the default: `terms`, added
in order) or mix the loss (distillation). Besides the loss it owns what it does after an optimizer update, when a
stage starts and a block of stages ends, its checkpoint tensors and values, and the inputs a resume must find
unchanged; the settings a resume must match are its flags (training_args' resume check, as for every flag).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minbert.model.multitask_bert import MultitaskBERT
from minbert.runtime import float32_exact


@dataclass
class TaskForward:
    """One task batch's forward, as the penalties see it: the inputs, the embeddings the encoder starts from, the
    task's outputs and its objective (losses.Objective: its loss and divergence)."""
    model: MultitaskBERT
    task: str
    batch: dict
    inputs: object  # MultitaskBERT.encoder_inputs' result: ids, mask, token layout
    embeddings: Tensor
    objective: object
    outputs: Tensor | None = None
    # Terms a penalty computed while it ran the encoder (Penalty.encode), added when its turn comes.
    pending: dict[str, Tensor] = field(default_factory=dict)

    def outputs_from_embeddings(self, embeddings: Tensor) -> Tensor:
        """The task's outputs from (perturbed) embeddings: SMART's adversarial and anchor passes."""
        return self.model.outputs_from_embeddings(self.task, embeddings, self.inputs)


@dataclass(frozen=True)
class UpdatePlace:
    """An optimizer update's place (0-based): `stage_update` of its stage's `stage_updates`, `run_update` of the
    run's `run_updates`."""
    stage_update: int
    stage_updates: int
    run_update: int
    run_updates: int


@dataclass(frozen=True)
class FinishedBlock:
    """A block of task stages that has just given way to the next: its task, `losses(count)` the task's loss alone
    on the first `count` batches of its last stage, in that stage's order, and `average` (over torchrun's ranks, so
    that every rank and a resume hold the same)."""
    task: str
    losses: Callable[[int], Iterable[Tensor]]
    average: Callable[[list[Tensor]], list[Tensor]]


class Penalty:
    """What a run adds to its tasks' losses, and the state that goes with it. Every method has a neutral default,
    so a penalty overrides only what it does; `name` prefixes its terms' names in steps.jsonl."""
    name = "penalty"

    def applies_to(self, task: str) -> bool:
        return True

    def computes_exactly(self, task: str, device_type: str) -> bool:
        """Whether the task's whole loss must run in exact float32 whatever the run's autocast (SMART's reason:
        smart.computes_exactly)."""
        return False

    def encode(self, forward: TaskForward) -> Tensor | None:
        """The encoder's output (B, T, H) for the batch, where this penalty runs the encoder itself (LNSR's clean
        pass); a term found on the way goes into forward.pending. None: the plain forward. At most one penalty of a
        task encodes."""
        return None

    def terms(self, forward: TaskForward) -> dict[str, Tensor]:
        """The terms added to the task's loss on this batch, by name (scalars on the device)."""
        return {}

    def add_to(self, loss: Tensor, forward: TaskForward) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss with this penalty, and its terms as steps.jsonl reports them (detached)."""
        terms = self.terms(forward)
        for term in terms.values():
            loss = loss + term
        return loss, {name: term.detach() for name, term in terms.items()}

    def after_update(self, model: torch.nn.Module, place: UpdatePlace) -> None:
        """After an optimizer update that moved the weights (fp16's skipped ones do not count)."""

    def start_stage(self, model: torch.nn.Module) -> None:
        """Before every stage after the first, at the weights the stage starts from (resumed: from the checkpoint)."""

    def end_block(self, model: torch.nn.Module, block: FinishedBlock) -> None:
        """When a block of task stages gives way to the next, at the weights the next one starts from."""

    def state_tensors(self) -> dict[str, Tensor]:
        """Tensors the checkpoint keeps, by keys that no other part of the checkpoint uses."""
        return {}

    def checkpoint_values(self) -> dict:
        """Plain values the checkpoint keeps, as top-level fields of its JSON."""
        return {}

    def load_state(self, tensors: dict[str, Tensor], metadata: dict, device: torch.device) -> None:
        """state_tensors' and checkpoint_values' of a checkpoint, put back (a checkpoint saved before the penalty
        existed lacks them: nothing to put back)."""

    def log_values(self) -> dict:
        """Values of a line of steps.jsonl (counters so far in the run)."""
        return {}

    def device_tensors(self) -> list[Tensor]:
        """The tensors the penalty reads or updates in place from one step to the next (a captured step keeps them
        where they are, as CUDA graphs need: --capture_step)."""
        return list(self.state_tensors().values())

    def fingerprints(self) -> dict[str, str]:
        """Hashes of inputs the penalty reads (a teacher's scores) that a resume must find unchanged."""
        return {}


class TaskObjective:
    """A task's training loss on a batch: the objective of the model's forward, wrapped by each penalty that applies
    to the task, in their order."""

    def __init__(self, task: str, penalties: Sequence[Penalty] = ()):
        self.task = self.name = task
        self.penalties = [penalty for penalty in penalties if penalty.applies_to(task)]
        encoders = [penalty.name for penalty in self.penalties if type(penalty).encode is not Penalty.encode]
        if len(encoders) > 1:
            raise ValueError(f"{task}: {' and '.join(encoders)} would each run the encoder; one penalty may")

    def __call__(self, model: MultitaskBERT, batch: dict, inputs=None) -> tuple[Tensor, dict[str, Tensor]]:
        """`inputs`: model.encoder_inputs(task, batch) made beforehand (the captured step builds the token layout
        on the host, outside the graph it captures), or None to make them here."""
        with float32_exact() if self.computes_exactly(next(model.parameters()).device.type) else nullcontext():
            return self.loss(model, batch, inputs)

    def computes_exactly(self, device_type: str) -> bool:
        """Whether the task's whole loss runs in exact float32 (runtime.float32_exact), as a penalty asks."""
        return any(penalty.computes_exactly(self.task, device_type) for penalty in self.penalties)

    def local_items(self, batch: dict) -> int:
        """What the loss is a mean over on this rank: the batch's examples."""
        return len(batch["labels"])

    def loss(self, model: MultitaskBERT, batch: dict, inputs=None) -> tuple[Tensor, dict[str, Tensor]]:
        model.set_adapter(self.task)  # the passes below run the encoder in parts, not through forward()
        inputs = model.encoder_inputs(self.task, batch) if inputs is None else inputs
        forward = TaskForward(model, self.task, batch, inputs, model.embed(inputs), model.objectives[self.task])
        hidden = None
        for penalty in self.penalties:
            hidden = penalty.encode(forward) if hidden is None else hidden
        forward.outputs = (forward.outputs_from_embeddings(forward.embeddings) if hidden is None
                           else model.outputs_from_hidden(self.task, hidden, inputs))
        loss = forward.objective.loss(forward.outputs, batch["labels"])
        terms = {}
        for penalty in self.penalties:
            loss, added = penalty.add_to(loss, forward)
            terms |= added
        return loss, terms


def compute_task_loss(model: MultitaskBERT, task: str, batch: dict, penalties: Sequence[Penalty] = ()
                      ) -> tuple[Tensor, dict[str, Tensor]]:
    """The task's loss on one batch with those of `penalties` that apply to it, and their terms (detached)."""
    return TaskObjective(task, penalties)(model, batch)


@dataclass(frozen=True)
class PenaltyFlag:
    """A command-line flag of a penalty kind: --NAME, its default and help, and argparse's type, choices, action and
    metavar (a flag with an action takes no type: type=None). A resume must match it unless `resume_free` (a setting
    that cannot change what is trained). `tasks` says the flag names tasks, which the command line rewrites in their
    internal names and the run's order (training_args.name_tasks): "list", comma-separated tasks, or "overrides",
    TASK:key=value[,key=value] per task (a repeatable flag); `every_task`: its default (None) becomes every task of
    --tasks. `tunes`: a setting of the penalty once its other flags turn it on (a flag named while it is off does
    nothing, and is refused)."""
    default: object
    help: str | None
    type: Callable | None = float
    resume_free: bool = False
    choices: Sequence | None = None
    action: object = None
    metavar: str | None = None
    tasks: str = ""
    every_task: bool = False
    tunes: bool = False

    def argparse_kwargs(self) -> dict:
        """argparse's keywords of the flag, those it sets."""
        kwargs = dict(type=self.type, choices=self.choices, action=self.action, metavar=self.metavar)
        return {key: value for key, value in kwargs.items() if value is not None}


@dataclass(frozen=True)
class PenaltyKind:
    """A penalty in a file of minbert/training/penalties/ (its PENALTY): its flags, each a field of the run's settings
    and a flag of multitask_classifier.py; `check(settings)` refuses bad values (ValueError, one line naming the
    flag) before anything is read; `build(settings, model)` makes the run's Penalty, or None where its flags leave it
    off. `settings` holds the flags' values under their names: check's are all the run's
    (run.training_args.TrainingArguments), build's the penalty's own (run_settings.penalty_settings) with the run's
    `tasks` (as --tasks names them, comma-separated), the model's `num_layers` and the `inputs` that `load` read.

    Optional: `switch`, the flag that turns the penalty on (its other flags given without it are refused: they would
    do nothing; their task names are rewritten only while it is on); `early`, applied before the penalties that are
    not, in every task's objective (the built-in distillation, LNSR and SMART come first); `after`, the flag its
    flags follow on the command line, in --help and in args.json (None: after every other); `check_model(settings,
    config)`, the flags against the pretrained model's config.json before its weights load (ValueError);
    `check_stages(settings, stages)`, the flags against the run's schedule, still before anything is read
    (ValueError); `load(settings, stages, data, task_settings)`, files the penalty reads before the model loads (a
    teacher's scores; None: none), checked there (ValueError naming the file); `check_resume(saved, settings)`, a
    resume's settings against the stopped run's saved args beyond each flag's own match (ValueError); `on(settings)`,
    whether the flags turn the penalty on, where its switch (or, without one, any flag away from its default) does
    not say it (is_on); `captured`, whether --capture_step captures its step (its terms traced inside the one graph,
    tests/test_captured_step.py), else a run with both is refused."""
    name: str
    flags: dict[str, PenaltyFlag]
    build: Callable[[object, MultitaskBERT], Penalty | None]
    check: Callable[[object], None] = lambda settings: None
    title: str = ""  # the flags' group in --help
    switch: str | None = None
    early: bool = False
    after: str | None = None
    check_model: Callable[[object, object], None] = lambda settings, config: None
    check_stages: Callable[[object, list], None] = lambda settings, stages: None
    load: Callable[..., object] = lambda settings, stages, data, task_settings: None
    check_resume: Callable[[dict, object], None] = lambda saved, settings: None
    on: Callable[[object], bool] | None = None
    captured: bool = False

    def is_on(self, settings) -> bool:
        """Whether the run's flags (`settings`: all the run's, as `check` reads them) turn the penalty on, known
        before the model is built: `on(settings)` where the file says, else its `switch`, else any of its flags set
        away from its default (the cautious answer for a file that says nothing: a flag it would ignore counts)."""
        if self.on is not None:
            return self.on(settings)
        if self.switch is not None:
            return getattr(settings, self.switch) not in (False, None)
        return bool(self.flags_set(settings))

    def flags_set(self, settings) -> list[str]:
        """Its flags whose values in `settings` are not their defaults."""
        return [name for name, flag in self.flags.items() if getattr(settings, name) != flag.default]


def penalties_state(penalties: Sequence[Penalty]) -> tuple[dict[str, Tensor], dict]:
    """The penalties' checkpoint tensors and values, together."""
    tensors, values = {}, {}
    for penalty in penalties:
        tensors |= penalty.state_tensors()
        values |= penalty.checkpoint_values()
    return tensors, values
