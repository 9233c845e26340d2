"""The settings of both command lines, each defined once as a dataclass field: the flag schema.

`--help`, the argparse groups, validation, the resume check (`resume_free` fields may change between a
stopped run and its --resume) and the `args` saved in checkpoints all read these definitions:

    args = parse_training_args(argv, description)    # multitask_classifier.py's, --demo's and --config's too
    parser = build_parser(TrainingArguments, description)
    args = from_namespace(TrainingArguments, parser.parse_args(argv))   # validated in __post_init__ (validate)

Every flag is validated in one pass (validate) when the settings are made, before anything is read, and the flags
that name tasks are rewritten in the internal names (name_tasks). What several flags say together (the run's tasks, its
schedule, the adapters: run_tasks, run_schedule, adapter_config) is here too, as validation reads it; the settings
the flags resolve to are run_settings.py's, and building a run from them is run_setup.py's. The course's
per-file flags (--sst_train ... --sts_test_out) are generated from the task table, and each task's own options
(--similarity_objective, --qa_max_length, ...) from its declaration (Task.options), which the task checks
(Task.check_settings) and reads (tasks.task_settings). Each penalty's flags (SMART's, LNSR's, distillation's,
EWC's, ...) are its file's in minbert/training/penalties/ (with_penalty_flags), which checks them, resolves them
and builds the penalty.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from base_bert import CheckpointError
from minbert.arguments import OneLineErrorParser, flags_given
from minbert.data.batches import standard_paths
from minbert.data.nli import PAIRINGS
from minbert.files import DataError, read_input_bytes, unwritable_folder
from minbert.model.adapters import ADAPTERS as ADAPTER_KINDS
from minbert.model.adapters import SHARINGS, TARGETS, AdapterConfig
from minbert.model.checkpoint import check_resume_settings
from minbert.model.multitask_bert import HEAD_ACTIVATIONS, parse_pair_encoders
from minbert.model.readout import POOLINGS
from minbert.run.run_record import RECORD_FILE, RECORD_KEYS
from minbert.runtime import COMPILE_MODES, PRECISIONS, import_problem, requested_precision
from minbert.step_log import REPORT_TO
from minbert.tasks import (MULTITASK, PART1_TASKS, RUN_TASKS, SIMCSE_TASKS, SPLITS, TASK_FILES, TASKS, course_file_name,
                           data_flag, default_output, output_flag, task_name, task_settings)
from minbert.tasks.base import HEADS_GROUP
from minbert.training.gradient_surgery import GRADIENT_SURGERIES, GradientSurgery
from minbert.training.objective import PenaltyKind
from minbert.training.penalties import PENALTY_FILES, PENALTY_KINDS
from minbert.training.schedules import (LR_SCHEDULES, SCHEDULES, STAGE_STARTS, Stage, StageKind, build_schedule,
                                        trained_heads)
from minbert.training.simcse import SIMCSE_OBJECTIVES
from tokenizer import shortest_max_length

COMMON = "common: what most runs set (--help lists the rest by purpose, the course's per-file paths last)"
COURSE = "course options (defaults unchanged)"
COURSE_PATHS = "the course's per-file paths (default: the course's file names in DATA_DIR and OUTPUT_DIR/predictions)"
RUN = "data, model and run"
HEADS = HEADS_GROUP
OPTIMISATION = "optimisation"
SCHEDULE = "schedule"
SIMCSE = "SimCSE stage (before the tasks)"
ADAPTERS = "adapters (parameter-efficient; with --option pretrain only adapters and heads train)"
OPTIONS = ("pretrain", "finetune")  # --option: BERT frozen or trained
THREE_TASK_STAGES = ("qqp", "sts,sst,qqp:0.03")  # --first_stages, --cycle of the three tasks: the thesis's order
CUDA_SAVE_MINUTES = 20.0  # --save_every_minutes' default on a GPU: what a Colab disconnect can lose at most
DEMO_STAGES = ("qqp", "sts,sst,qqp:0.25")  # --demo's shorter schedule; 3% of its 160 QQP pairs is under a batch


class UsageError(ValueError):
    """Settings or inputs that cannot work; the command lines print it as one line and exit with code 2."""


def check_max_length(max_length: int, max_positions: int, pretrained: str, flag: str = "--max_length") -> None:
    """A text longer than the model's position table would crash mid-run: refuse it before training."""
    if max_length > max_positions:
        raise UsageError(f"{flag} {max_length} is longer than the {max_positions} positions of {pretrained}")


def check_writable(directories) -> None:
    """Output folders must be creatable and writable before any work: a file in the way or a read-only
    parent would otherwise surface only after training."""
    for directory in directories:
        problem = unwritable_folder(directory)
        if problem:
            raise UsageError(problem)


# A feature's group of flags and its switch: the others act only while it is on (check_switched_flags).
def penalty_group(kind: PenaltyKind) -> str:
    """The --help group of a penalty's flags."""
    return kind.title or f"penalty {kind.name} (minbert/training/penalties/)"


# A penalty's switch is its file's (PenaltyKind.switch): --smart for SMART's group, --lnsr for LNSR's.
SWITCHES = {SIMCSE: ("simcse_data", "--simcse_data FILES"),
            ADAPTERS: ("adapter", "--adapter " + " / ".join(kind for kind in ADAPTER_KINDS if kind != "none")),
            **{penalty_group(kind): (kind.switch, f"--{kind.switch}") for kind in PENALTY_KINDS.values()
               if kind.switch}}
SWITCHED_OFF = (False, [], "none")  # the values of a switch that leave its feature off
# A flag that tunes what another flag's value turns on: {flag: (that flag, whether its value turns it on, in words)}.
TUNES = {"compile_mode": ("compile", lambda args: args.compile, "--compile"),
         "warmup_ratio": ("lr_schedule", lambda args: args.lr_schedule == "linear", "--lr_schedule linear"),
         "cagrad_c": ("gradient_surgery", lambda args: args.gradient_surgery == "cagrad", "--gradient_surgery cagrad"),
         "head_activation": ("head_hidden", lambda args: args.head_hidden > 0, "--head_hidden N"),
         "ordinal_weight": ("sst_objective", lambda args: args.sst_objective == "ordinal", "--sst_objective ordinal")}


def flag(default=None, help: str | None = None, group: str = RUN, resume_free: bool = False, task: str | None = None,
         **argparse_kwargs):
    """A dataclass field that is also a command-line flag --NAME (argparse_kwargs: type, choices, action...);
    `task`: the task whose option it is (with_task_options)."""
    metadata = {"group": group, "help": help, "resume_free": resume_free, "argparse": argparse_kwargs}
    if task is not None:
        metadata["task"] = task
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def per_file_options(kind: str, tasks: tuple[str, ...], group: str = COURSE_PATHS, resume_free: bool = False):
    """A dict field {flag name: path} whose flags are the course's per-file flags of `tasks`:
    kind "data" -> --sst_train ... (default: DATA_DIR/<course file name>), "predictions" -> --sst_dev_out ..."""
    metadata = {"group": group, "resume_free": resume_free, "per_file": kind, "tasks": tasks}
    return field(default_factory=dict, metadata=metadata)


def with_task_options(after: str):
    """A class decorator, applied before @dataclass: a field (and so a flag, a --config and args.json key) for each
    option the tasks declare (Task.options), placed after the field `after`. An option named as one of the class's
    own fields is not added: build_parser refuses it in one line."""
    def add_options(cls):
        own = cls.__annotations__
        if after not in own:  # the options would vanish from the command line
            raise TypeError(f"with_task_options: {cls.__name__} has no field {after!r} to place the tasks' options "
                            "after")
        options = {option.name: flag(option.default, option.help, option.group, task=task.name, **option.argparse)
                   for task in TASKS.values() for option in task.options if option.name not in own}
        names = list(own)
        place = names.index(after) + 1
        cls.__annotations__ = {name: own.get(name, "object") for name in [*names[:place], *options, *names[place:]]}
        for name, option_field in options.items():
            setattr(cls, name, option_field)
        return cls
    return add_options


def _per_file_flags(kind: str, tasks: tuple[str, ...]) -> dict[str, tuple[str | None, str]]:
    """{flag: (default, help)} of a per_file_options field."""
    if kind == "data":
        return {data_flag(task, split): (None, f"default: DATA_DIR/{course_file_name(task, split)}")
                for task in tasks for split in SPLITS}
    return {output_flag(task, split): (None, f"default: OUTPUT_DIR/{default_output(task, split)}")
            for task in tasks for split in ("dev", "test")}


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_common(args, texts_per_input: int) -> None:
    """Checks shared by both command lines' settings; `texts_per_input`: 2 where a pair is encoded jointly."""
    for name in ("epochs", "batch_size", "eval_batch_size"):
        _check(getattr(args, name) >= 1, f"--{name} must be >= 1, got {getattr(args, name)}")
    shortest = shortest_max_length(texts_per_input)
    _check(args.max_length >= shortest, f"--max_length must be >= {shortest}, got {args.max_length}: the tokenizer "
           "cannot cut a text below its special tokens and a token of each " + ("sentence of a pair" if
                                                                                texts_per_input == 2 else "text"))
    _check(args.max_train_examples is None or args.max_train_examples >= 1, "--max_train_examples must be >= 1")
    _check(_finite(args.lr) and args.lr > 0, f"--lr must be a finite number > 0, got {args.lr}")
    _check(_finite(args.hidden_dropout_prob) and 0 <= args.hidden_dropout_prob < 1,
           f"--hidden_dropout_prob must be in [0, 1), got {args.hidden_dropout_prob}")
    _check(0 <= args.seed < 2**32, f"--seed must be in [0, 2**32), got {args.seed}")


def with_penalty_flags(cls):
    """A class decorator, applied before @dataclass: a field (and so a flag, a --config and args.json key) for each
    flag of the penalties in minbert/training/penalties/, each penalty's after the flag it names
    (PenaltyKind.after: SMART's after the schedule's), the others' after all the class's own, so that a new
    penalty's file brings its flags and a run without one saves the settings it saved before. A penalty flag spelled
    as one of the command line's own, or placed after no flag, stops it in one line naming the penalty's file."""
    own = cls.__annotations__
    fields, following, files = {}, {}, {}
    for kind in PENALTY_KINDS.values():
        group = penalty_group(kind)
        for name, spec in kind.flags.items():
            if name in own:
                _refuse_penalty_file(kind.name, f"its flag --{name} is already the command line's own")
            fields[name] = flag(spec.default, spec.help, group, spec.resume_free, **spec.argparse_kwargs())
        following.setdefault(kind.after, []).extend(kind.flags)
        files[kind.after] = kind.name
    order = _in_place(list(own), following) + _in_place(following.pop(None, []), following)
    for after in following:  # placed after a flag that none of the others is
        _refuse_penalty_file(files[after], f"its flags follow --{after}, which is no flag of the command line")
    cls.__annotations__ = {name: own.get(name, "object") for name in order}
    for name, penalty_field in fields.items():
        setattr(cls, name, penalty_field)
    return cls


def _in_place(names: list[str], following: dict[str | None, list[str]]) -> list[str]:
    """`names`, each followed by the names that `following` places after it (taken from it), and theirs."""
    order = []
    for name in names:
        order += [name, *_in_place(following.pop(name, []), following)]
    return order


def _refuse_penalty_file(kind: str, problem: str) -> None:
    print(f"error: {PENALTY_FILES[kind]}: {problem}", file=sys.stderr)
    raise SystemExit(2)


@dataclass
@with_penalty_flags
@with_task_options(after="encoder_dropout")
class TrainingArguments:
    """Every setting of multitask_classifier.py; the tasks' own options follow the model heads' (with_task_options)."""

    # The course's flags, defaults unchanged.
    # Data paths may be spelled differently or moved on --resume: the trainer compares the data's content.
    data_files: dict = per_file_options("data", RUN_TASKS, resume_free=True)
    prediction_files: dict = per_file_options("predictions", RUN_TASKS, resume_free=True)
    seed: int = flag(11711, group=COURSE, type=int)
    epochs: int = flag(10, "epochs of the annealed / round_robin schedules", COURSE, type=int)
    option: str = flag("pretrain", "pretrain: BERT frozen, heads trained; finetune: everything trained", COURSE,
                         choices=OPTIONS)
    # Not resume-free (nor is --precision): another device or precision computes other numbers.
    use_gpu: bool = flag(False, group=COMMON, action="store_true")
    batch_size: int = flag(8, group=COURSE, type=int)
    hidden_dropout_prob: float = flag(0.3, "dropout before the task heads (BERT keeps its own, see "
                                        "--encoder_dropout), as in the course", COURSE, type=float)
    lr: float = flag(1e-5, group=COURSE, type=float)

    # Data, model and run.
    data_dir: str = flag("data", "folder with the course's file names (and SQuAD's official train-v2.0.json, "
                           "dev-v2.0.json, test-v2.0.json)", COMMON, resume_free=True)
    tasks: str = flag(",".join(MULTITASK), f"the run's tasks, some of {', '.join(RUN_TASKS)}; its heads, data, dev "
                      "metrics and predictions; annealed and round_robin epochs train all of them", COMMON)
    pretrained: str = flag("bert-base-uncased", "hub id, local directory, or minilm-l6 (bundled, offline)", COMMON)
    max_train_examples: int | None = flag(None, "subsample each train set (quick runs)", type=int)
    max_length: int = flag(128, "tokens per sentence (or per pair)", type=int)
    output_dir: str = flag("runs/multitask", "checkpoints, metrics.jsonl, plots", COMMON, resume_free=True)
    resume: bool = flag(False, "continue from OUTPUT_DIR/last.*", resume_free=True, action="store_true")
    resume_from: str | None = flag(None, "continue from this checkpoint of the run in OUTPUT_DIR (OUTPUT_DIR/last or "
                                         "a checkpoint-U that --save_total_limit kept; implies --resume): it becomes "
                                         "last.*, the checkpoints saved after it are removed", resume_free=True,
                                   metavar="PATH")
    keep_resume_state: bool = flag(False, "keep the training state (last.*, checkpoint-U.*: model and optimizer "
                                          "moments, about 4x the model) once the run has finished, which --resume "
                                          "needs to extend it with more --cycles; by default a finished run keeps "
                                          "only its kept model, reports and predictions", resume_free=True,
                                   action="store_true")
    stop_after_stages: int | None = flag(None, "stop (resumably) after N stages", resume_free=True, type=int)
    demo: bool = flag(False, "offline demo: data/demo, minilm-l6, a short SMART schedule, all six CSVs",
                        COMMON, resume_free=True, action="store_true")
    keep_stage_models: bool = flag(False, "also save the model after every stage as OUTPUT_DIR/stage_N.* (compare "
                                          "stages, e.g. scripts/plot_embeddings.py)", resume_free=True,
                                   action="store_true")
    # Not resume-free: a batch pads to its longest text, so other sizes round the dev scores (the model kept) apart.
    eval_batch_size: int = flag(64, type=int)
    eval_train_examples: int = flag(0, "also score this many train examples per task after each stage "
                                      "(train curves)", type=int)
    # Not resume-free: the subset picks the model kept.
    max_eval_examples: int | None = flag(None, "after each stage score a fixed subset of N dev examples per task "
                                               "(drawn once from --seed) to pick the kept model; its final dev CSVs "
                                               "and best.json's metrics still cover every dev example", type=int,
                                         metavar="N")
    num_workers: int = flag(0, resume_free=True, type=int)
    departures: str = flag("", "a note kept in args.json and nothing else: the settings in which the run departs "
                               "from the setting it stands for (a study's arm names where it is not the thesis')",
                           resume_free=True, metavar="TEXT")
    quiet: bool = flag(False, "no progress bars", resume_free=True, action=argparse.BooleanOptionalAction)
    logging_steps: int = flag(50, "every N updates read the losses back from the device (progress bar, divergence "
                                "check) and write a line of OUTPUT_DIR/steps.jsonl; the steps between never wait "
                                "for the device", resume_free=True, type=int)
    report_to: str = flag("none", "tensorboard: also write steps.jsonl's values and each stage's dev metrics as "
                                  "TensorBoard events in OUTPUT_DIR/tensorboard (needs pip install tensorboard)",
                          resume_free=True, choices=REPORT_TO)
    save_steps: int = flag(0, "also save OUTPUT_DIR/last.* inside a stage every N updates, which --resume continues "
                              "at the next batch (0: off)", resume_free=True, type=int, metavar="N")
    save_every_minutes: float | None = flag(None, "also save OUTPUT_DIR/last.* inside a stage every M minutes (under "
                                                  "torchrun: at the first line of steps.jsonl after them); default "
                                                  f"{CUDA_SAVE_MINUTES:g} on CUDA, off on the CPU; 0: off",
                                            resume_free=True, type=float, metavar="M")
    save_total_limit: int = flag(1, "how many checkpoints to keep: last.* and the N-1 before it as checkpoint-U.* "
                                    "(U: the updates done), which --resume_from can continue", resume_free=True,
                                 type=int, metavar="N")

    # Model heads.
    pooling: str = flag("mean", group=HEADS, choices=POOLINGS)
    pair_encoder: str = flag("sbert", "how qqp and sts read a pair: sbert (sentences encoded apart), cross (one "
                               "joint encoding, segment ids 0/1, a linear head) or hybrid (the joint encoding, each "
                               "sentence mean-pooled apart; AllBERT's STS); one for both or per task, e.g. "
                               "qqp:cross,sts:hybrid", HEADS)
    head_hidden: int = flag(0, "a dense layer of this width (linear, activation, dropout) in each task's head "
                              "before its output (0: none)", HEADS, type=int)
    head_activation: str = flag("tanh", "activation of --head_hidden (tanh: BERT's pooler's)", HEADS,
                                  choices=tuple(HEAD_ACTIVATIONS))
    encoder_dropout: float | None = flag(None, "dropout inside BERT (default: the checkpoint's own, 0.1 "
                                           "for BERT)", HEADS, type=float)

    # Adapters.
    adapter: str = flag("none", "lora, dora (on --adapter_targets) or pals (beside every layer)", ADAPTERS,
                          choices=ADAPTER_KINDS)
    adapter_sharing: str = flag("per_task", "per_task: each task trains and runs its own adapters (training one "
                                  "task cannot change another's outputs over a frozen BERT); shared: one set",
                                  ADAPTERS, choices=SHARINGS)
    adapter_rank: int = flag(8, "r of LoRA / DoRA", ADAPTERS, type=int)
    adapter_alpha: float = flag(8.0, "alpha of LoRA / DoRA (the update is scaled by alpha / r)", ADAPTERS, type=float)
    adapter_dropout: float = flag(0.0, "dropout on the LoRA / DoRA input", ADAPTERS, type=float)
    adapter_targets: str = flag("query,value", f"LoRA / DoRA targets, some of {','.join(TARGETS)}", ADAPTERS)
    pal_size: int | None = flag(None, "PALs' hidden size (default: 204/768 of BERT's, a multiple of its heads)",
                                  ADAPTERS, type=int)

    # Optimisation.
    weight_decay: float = flag(0.0, "AdamW decoupled decay (not on biases and LayerNorm weights)",
                                 OPTIMISATION, type=float)
    grad_accumulation_steps: int = flag(1, group=OPTIMISATION, type=int)
    max_grad_norm: float = flag(0.0, "clip gradients to this norm (0: off; the SMART paper: 1)",
                                  OPTIMISATION, type=float)
    lr_schedule: str = flag("constant", "constant (the course's) or linear: warm-up over --warmup_ratio of the "
                              "updates, then linear decay to 0 (the SMART paper's)", OPTIMISATION,
                              choices=LR_SCHEDULES)
    warmup_ratio: float = flag(0.1, "share of the updates spent warming up (--lr_schedule linear)",
                                 OPTIMISATION, type=float)
    layerwise_lr_decay: float = flag(1.0, "layer l of L trains at lr x decay^(L - l), the embeddings at "
                                       "lr x decay^L, pooler and heads at lr (1: off; e.g. 0.95)", OPTIMISATION,
                                       type=float)
    gradient_checkpointing: bool = flag(False, "recompute each BERT layer in the backward pass: less memory "
                                          "(bert-large, long sequences), about one more forward of time",
                                          OPTIMISATION, resume_free=True, action="store_true")
    # Not resume-free: on the CPU it pads batches to buckets of 8 tokens, which changes the dropout masks drawn.
    compile: bool = flag(False, "torch.compile BERT's layers (forward and backward, one graph) and AdamW's "
                           "update; batches are padded to multiples of 8 tokens so that shapes repeat. For CUDA: on "
                           "a CPU the compiling costs more than it saves (a warning says so)", OPTIMISATION,
                         action="store_true")
    # Not resume-free: each mode compiles other kernels (max-autotune picks them by timing them).
    compile_mode: str = flag("default", "torch.compile's mode: default, reduce-overhead (CUDA graphs) or "
                               "max-autotune", OPTIMISATION, choices=COMPILE_MODES)
    # Not resume-free: on the CPU it pads batches to buckets of 8 tokens and runs the padded layout (other rounding).
    capture_step: bool = flag(False, "each task batch's whole step (forward, loss, backward, clipping, AdamW's update) "
                              "as one graph, compiled once per task and length bucket: CUDA graphs on CUDA, inductor "
                              "on a CPU; batches padded to multiples of 8 tokens. Refused where it cannot capture "
                              "the step (fp16, accumulation, gradient surgery, penalties, SimCSE and mlm stages...)",
                              OPTIMISATION, action="store_true")
    # --precision auto resumes on another GPU kind (a Colab run started on an L4 in bf16 continues on a T4 in fp16),
    # but a changed flag is refused: it would change the result.
    precision: str = flag("auto", "auto: bf16 autocast where the device computes bf16 natively (L4, A100, H100; "
                            "CPUs with AVX512-BF16 or AMX), fp16 autocast with a gradient scaler on older GPUs (T4, "
                            "V100), float32 elsewhere; SMART's passes follow --smart_precision (by default the "
                            "run's precision; float32 under fp16)", OPTIMISATION,
                          choices=PRECISIONS)
    bf16: bool | None = flag(None, "alias: --bf16 is --precision bf16, --no-bf16 is --precision fp32", OPTIMISATION,
                             resume_free=True, action=argparse.BooleanOptionalAction)
    bf16_weights: bool = flag(False, "with --precision bf16: matmuls read bf16 copies of the weights that AdamW's "
                              "update rewrites, not a cast of every weight per step", OPTIMISATION, action="store_true")

    # Schedule.
    schedule: str = flag("sequential", group=SCHEDULE, choices=SCHEDULES)
    first_stages: str | None = flag(None, "stages before the cycles, e.g. 'qqp' or 'sts*3' (task[:fraction][*repeats]; "
                                    f"default: {THREE_TASK_STAGES[0]!r} for the three tasks, else one epoch of each "
                                    "of --tasks)", SCHEDULE)
    cycle: str | None = flag(None, "one cycle of stages (rehearsal as :fraction; default: "
                             f"{THREE_TASK_STAGES[1]!r} for the three tasks, else none)", SCHEDULE)
    # --cycles may change on --resume (to shorten or extend a sequential run) as long as the stages
    # already done begin the new schedule: stage i's data order depends on i alone.
    cycles: int = flag(10, group=SCHEDULE, resume_free=True, type=int)
    mlm_epochs: int = flag(0, "masked-LM epochs on the tasks' training sentences before everything else, with "
                             "any --schedule (sequential ones can also place mlm stages in --first_stages)",
                           SCHEDULE, type=int)
    gradient_surgery: str = flag("none", "annealed / round_robin: each step takes three batches (round_robin: one "
                                   "per task) and combines the tasks' shared-encoder gradients by pcgrad or cagrad; "
                                   "heads keep their own", SCHEDULE, choices=GRADIENT_SURGERIES)
    cagrad_c: float = flag(GradientSurgery.cagrad_c, "c of CAGrad, the radius around the mean gradient (the authors' default)",
                             SCHEDULE, type=float)
    patience: int | None = flag(None, "early stopping of multi-epoch stages (consecutive equal stages, e.g. 'sts*10', "
                                "or the epochs of annealed / round_robin): stop repeating one after K epochs that do "
                                "not beat its task's best dev score since it began (the kept-model score of every "
                                "task for multi-task epochs); default: every epoch runs", SCHEDULE, type=int,
                                metavar="K")
    stage_start: str = flag("last", "what the stage after a block of repeated stages of one task (e.g. 'sts*10', "
                            "however short --patience cuts it) starts from: last, the block's last weights, or best, "
                            "those of its epoch with the best dev score of that task (kept in memory; only the "
                            "model's weights: the optimizer goes on), as the thesis' sequential runs (its tables "
                            "4.3-4.9)", SCHEDULE, choices=STAGE_STARTS)

    # The penalties' flags (SMART, LNSR, distillation) follow here: their files' (with_penalty_flags).

    # SimCSE.
    simcse_data: list = flag([], "NLI files (.jsonl, SentEval s1.*, SICK.txt, premise,positive,negative .csv)",
                             SIMCSE, resume_free=True, nargs="*")
    simcse_epochs: int = flag(1, group=SIMCSE, type=int)
    simcse_objective: str = flag("supervised", "supervised: in-batch negatives (Gao et al.'s eq. 5); pairwise: each "
                                 "anchor against its own positive and negative only (the thesis' section 3.2.4.3)",
                                 SIMCSE, choices=tuple(SIMCSE_OBJECTIVES))
    simcse_pairing: str = flag("zip", "how a premise's hypotheses become triplets: zip (its i-th entailment with its "
                               "i-th contradiction) or product (every entailment with every contradiction, the "
                               "thesis' listing B.1)", SIMCSE, choices=PAIRINGS)
    simcse_temperature: float = flag(0.05, "tau; logits scale = 1/tau", SIMCSE, type=float)
    simcse_lr: float = flag(2e-5, group=SIMCSE, type=float)
    simcse_max_examples: int | None = flag(None, group=SIMCSE, type=int)
    simcse_keep: str = flag("last", "what follows the SimCSE epochs starts from: last, the last epoch's weights, or "
                            "best, those of the epoch with the best STS dev Pearson (the thesis' 3 SNLI epochs)",
                            SIMCSE, choices=STAGE_STARTS)

    def __post_init__(self):
        self.precision = requested_precision(self.precision, self.bf16)
        try:
            self.tasks = ",".join(parse_tasks(self.tasks))
        except ValueError as err:
            raise ValueError(f"--tasks: {err}") from None
        for name, value in task_derived_settings(run_tasks(self)).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        name_tasks(self)
        validate(self)


def task_derived_settings(tasks: tuple[str, ...], demo: bool = False) -> dict:
    """The settings whose defaults follow --tasks (and --demo): the three tasks' stages (the demo's shorter cycle),
    else one epoch of each task and no cycle; the penalty flags whose default is every task (PenaltyFlag.every_task:
    --smart_tasks) every task. A --config recorded for other tasks holds them too (config_under_command_line)."""
    if tasks == MULTITASK:
        first_stages, cycle = DEMO_STAGES if demo else THREE_TASK_STAGES
    else:
        first_stages, cycle = ",".join(tasks), ""
    every_task = {name: ",".join(tasks) for kind in PENALTY_KINDS.values() for name, spec in kind.flags.items()
                  if spec.every_task}
    return {"first_stages": first_stages, "cycle": cycle, **every_task}


def name_tasks(args: TrainingArguments) -> None:
    """The flags that name tasks (a penalty flag's `tasks`) rewritten in the internal names and the run's order, each
    name one of the run's --tasks (course aliases, case and spaces aside: `--smart_tasks "para, SST"` -> "sst,qqp"),
    so that what is derived from them (the penalties' settings) reads them as they are, the same in every process. A
    penalty's flags only where its switch turns it on: --smart_tasks and --smart_override with --smart, --lnsr_tasks
    with --lnsr (--distill_override, which may name a task's teacher itself, always)."""
    tasks = run_tasks(args)
    for kind in PENALTY_KINDS.values():
        if kind.switch and not kind.is_on(args):  # its flags are read only when its switch is on
            continue
        for name, spec in kind.flags.items():
            if spec.tasks == "list":
                setattr(args, name, ",".join(_task_list(getattr(args, name), name, tasks)))
            elif spec.tasks == "overrides":
                setattr(args, name, [_named_override(name, override, tasks) for override in getattr(args, name)])


def _task_list(text: str, flag: str, tasks: tuple[str, ...]) -> tuple[str, ...]:
    """The tasks named in a comma-separated flag, each among the run's, in their order: what is built from them
    (SMART's skipped steps in a checkpoint) comes out the same in every process."""
    try:
        named = {task_name(t, tasks) for t in text.split(",") if t.strip()}
    except ValueError as err:
        raise ValueError(f"--{flag}: {err} (the run's --tasks)") from None
    return tuple(task for task in tasks if task in named)


def _named_override(flag: str, override: str, tasks: tuple[str, ...]) -> str:
    """A --FLAG TASK:key=value[,key=value] with TASK's internal name."""
    name, _, settings = override.partition(":")
    try:
        task = task_name(name, tasks)
    except ValueError:
        task = None
    if task is None or not settings:
        raise ValueError(f"--{flag} {override!r}: expected TASK:key=value[,key=value]")
    return f"{task}:{settings}"


# -- validation: every flag, alone and against the others, in one pass before anything is read ------------------

def run_tasks(args: TrainingArguments) -> tuple[str, ...]:
    """The run's tasks (--tasks), in RUN_TASKS' order."""
    return tuple(args.tasks.split(","))


def run_task_settings(args: TrainingArguments) -> dict[str, object]:
    """The tasks' own options as the run sets them (tasks.task_settings): what each task reads its own from."""
    return task_settings(vars(args))


def run_schedule(args: TrainingArguments) -> list[Stage]:
    """The run's stages: schedules.build_schedule of --schedule, --first_stages, --cycle, --cycles, --epochs and the
    SimCSE and mlm epochs."""
    return build_schedule(args.schedule, args.first_stages, args.cycle, args.cycles, args.epochs,
                          args.simcse_epochs if args.simcse_data else 0, args.mlm_epochs, run_tasks(args))


def adapter_config(args: TrainingArguments) -> AdapterConfig | None:
    """The adapters of --adapter (None for none)."""
    if args.adapter == "none":
        return None
    targets = tuple(t.strip() for t in args.adapter_targets.split(",") if t.strip())
    try:
        return AdapterConfig(args.adapter, args.adapter_rank, args.adapter_alpha, args.adapter_dropout, targets,
                             args.adapter_sharing, args.pal_size)
    except ValueError as err:
        raise ValueError(f"--adapter {args.adapter}: {err}") from None


def validate(args: TrainingArguments) -> None:
    """Every setting of multitask_classifier.py checked: each feature's flags, then the schedule they make against
    the flags that depend on it. ValueError naming the flag. What needs the files or the model's config is checked
    once they are read, still before the model loads (run_setup.load_inputs, check_pretrained)."""
    _check_common(args, texts_per_input=2)  # QQP and STS may be encoded jointly (--pair_encoder cross, hybrid)
    for check in (_check_run, _check_optimisation, _check_schedule_flags, _check_heads, _check_task_options,
                  _check_adapters, _check_simcse,
                  *(kind.check for kind in PENALTY_KINDS.values())):
        check(args)
    _check_stages(args, run_schedule(args))


def _check_run(args: TrainingArguments) -> None:
    _check(args.logging_steps >= 1, f"--logging_steps must be >= 1, got {args.logging_steps}")
    _check(args.save_steps >= 0, f"--save_steps must be >= 0, got {args.save_steps}")
    _check(args.save_total_limit >= 1, f"--save_total_limit must be >= 1, got {args.save_total_limit}")
    _check(args.save_every_minutes is None or (_finite(args.save_every_minutes) and args.save_every_minutes >= 0),
           f"--save_every_minutes must be a number >= 0, got {args.save_every_minutes}")
    if args.report_to == "tensorboard":  # the module step_log.RunLog's writer comes from
        problem = import_problem("torch.utils.tensorboard", "--report_to tensorboard", "tensorboard")
        _check(problem is None, problem)
    _check(args.max_eval_examples is None or args.max_eval_examples >= 1,
           f"--max_eval_examples must be >= 1, got {args.max_eval_examples}")
    for name in ("eval_train_examples", "num_workers"):
        _check(getattr(args, name) >= 0, f"--{name} must be >= 0, got {getattr(args, name)}")
    # 0 would stop before the first checkpoint, leaving nothing that --resume could continue
    _check(args.stop_after_stages is None or args.stop_after_stages >= 1,
           f"--stop_after_stages must be >= 1, got {args.stop_after_stages}")


def _check_optimisation(args: TrainingArguments) -> None:
    _check(args.grad_accumulation_steps >= 1, "--grad_accumulation_steps must be >= 1")
    for name in ("weight_decay", "max_grad_norm"):
        _check(_finite(getattr(args, name)) and getattr(args, name) >= 0, f"--{name} must be finite and >= 0")
    _check(_finite(args.warmup_ratio) and 0 <= args.warmup_ratio < 1, "--warmup_ratio must be in [0, 1)")
    _check(_finite(args.layerwise_lr_decay) and 0 < args.layerwise_lr_decay <= 1,
           f"--layerwise_lr_decay must be in (0, 1], got {args.layerwise_lr_decay}")
    _check(not args.bf16_weights or args.precision == "bf16",
           f"--bf16_weights needs --precision bf16 (it keeps the weights bf16 autocast reads), got {args.precision}")
    # The copies' forward checks each parameter's version counter, which torch.compile's traced layers do not
    # see: a copy could go stale inside a compiled graph.
    _check(not (args.bf16_weights and args.compile), "--bf16_weights does not combine with --compile")
    if args.capture_step:
        _check_capture_step(args)


def _check_capture_step(args: TrainingArguments) -> None:
    """What --capture_step cannot serve as the eager step would: one line for the first such flag. The captured
    graph is one batch and its update, which no value read back on the host may steer (captured_step.py); what
    was never checked inside it is refused too."""
    refused = (
        (args.precision == "fp16", "--precision fp16: its gradient scaler reads the gradients' finiteness back to "
                                   "decide each step"),
        (args.grad_accumulation_steps > 1, "--grad_accumulation_steps > 1: an update of several batches"),
        (args.gradient_surgery != "none", "--gradient_surgery: an update of every task's batch"),
        # every penalty file's that has not been checked inside the graph (PenaltyKind.captured)
        *((kind.is_on(args) and not kind.captured, f"{penalty_flags(kind, args)}: the {kind.name} penalty is not "
                                                   "captured")
          for kind in PENALTY_KINDS.values()),
        (bool(args.simcse_data) or args.mlm_epochs > 0, "--simcse_data, --mlm_epochs: their stages' steps are not "
                                                         "captured"),
        (args.compile, "--compile: the captured step compiles the layers itself"),
        (args.bf16_weights, "--bf16_weights: its copies' forward checks version counters a graph does not see"),
        (args.gradient_checkpointing, "--gradient_checkpointing: not checked inside the captured graph"),
        (args.adapter != "none", "--adapter: adapters are not checked inside the captured graph"),
    )
    for condition, reason in refused:
        _check(not condition, f"--capture_step does not combine with {reason}")


def penalty_flags(kind, args: TrainingArguments) -> str:
    """The flags of the penalty `kind` that the run sets away from their defaults, as a command line names them
    (its switch alone where it has one)."""
    if kind.switch is not None:
        return f"--{kind.switch}"
    return ", ".join(f"--{name}" for name in kind.flags_set(args))


def _check_schedule_flags(args: TrainingArguments) -> None:
    for name in ("cycles", "mlm_epochs", "simcse_epochs"):
        _check(getattr(args, name) >= 0, f"--{name} must be >= 0, got {getattr(args, name)}")
    _check(args.patience is None or args.patience >= 1, f"--patience must be >= 1, got {args.patience}")
    _check(args.gradient_surgery == "none" or args.schedule != "sequential",
           "--gradient_surgery needs --schedule annealed or round_robin (each step trains several tasks)")
    _check(_finite(args.cagrad_c) and args.cagrad_c >= 0, f"--cagrad_c must be finite and >= 0, got {args.cagrad_c}")
    _check(args.stage_start == "last" or args.schedule == "sequential",
           "--stage_start best needs --schedule sequential: annealed and round_robin epochs train every task at "
           "once, with no block of one task's stages to go on from")
    _check(args.simcse_keep == "last" or set(SIMCSE_TASKS) <= set(run_tasks(args)),
           "--simcse_keep best picks the SimCSE epoch by "
           + " and ".join(f"{TASKS[task].title}'s {TASKS[task].simcse_score}" for task in SIMCSE_TASKS)
           + f": add {','.join(SIMCSE_TASKS)} to --tasks")


def _check_heads(args: TrainingArguments) -> None:
    _check(args.encoder_dropout is None or (_finite(args.encoder_dropout) and 0 <= args.encoder_dropout < 1),
           f"--encoder_dropout must be in [0, 1), got {args.encoder_dropout}")
    _check(args.head_hidden >= 0, f"--head_hidden must be >= 0, got {args.head_hidden}")
    try:
        parse_pair_encoders(args.pair_encoder)
    except ValueError as err:
        raise ValueError(f"--pair_encoder: {err}") from None


def _check_task_options(args: TrainingArguments) -> None:
    """Each task's options, as the task checks them (with the pairs' encoders, which _check_heads has checked)."""
    settings, encoders = run_task_settings(args), parse_pair_encoders(args.pair_encoder)
    for task in TASKS.values():
        task.check_settings(settings, encoders)


def _check_adapters(args: TrainingArguments) -> None:
    _check(args.pal_size is None or args.pal_size >= 1, f"--pal_size must be >= 1, got {args.pal_size}")
    adapter_config(args)  # AdapterConfig checks the kind, rank, alpha, dropout and targets


def _check_simcse(args: TrainingArguments) -> None:
    _check(args.simcse_max_examples is None or args.simcse_max_examples >= 1, "--simcse_max_examples must be >= 1")
    _check(_finite(args.simcse_lr) and args.simcse_lr > 0, f"--simcse_lr must be > 0, got {args.simcse_lr}")
    _check(_finite(args.simcse_temperature) and args.simcse_temperature > 0,
           f"--simcse_temperature must be a finite number > 0, got {args.simcse_temperature}")


def _check_stages(args: TrainingArguments, stages: list[Stage]) -> None:
    """The flags that depend on the schedule's stages. SimCSE's and mlm's stages train the one encoder every task
    shares, so it must train, and per-task adapters would leave no encoder for them (an mlm stage may train shared
    adapters over a frozen BERT; SimCSE's never runs over one)."""
    mlm = any(stage.kind is StageKind.MLM for stage in stages)
    _check(not mlm or set(MULTITASK) & set(run_tasks(args)),
           "the mlm stage reads the training sentences of sst, qqp and sts; none of them is among --tasks")
    frozen = args.option == "pretrain"
    per_task_adapters = args.adapter != "none" and args.adapter_sharing == "per_task"
    for stage, present, trains_nothing in (("SimCSE", bool(args.simcse_data), frozen),
                                           ("mlm", mlm, frozen and args.adapter == "none")):
        _check(not (present and per_task_adapters),
               f"the {stage} stage trains one encoder for every task: with an adapter use --adapter_sharing shared")
        _check(not (present and trains_nothing),
               f"the {stage} stage trains the encoder, which --option pretrain freezes; use --option finetune")
    for kind in PENALTY_KINDS.values():
        kind.check_stages(args, stages)


@dataclass
class ClassifierArguments:
    """Every setting of classifier.py (part 1 of the handout: SST and CFIMDB sentiment)."""

    seed: int = flag(11711, group=COURSE, type=int)
    epochs: int = flag(10, group=COURSE, type=int)
    option: str = flag("pretrain", "pretrain: BERT frozen, only the linear head trained; finetune: everything "
                         "trained", COURSE, choices=OPTIONS)
    use_gpu: bool = flag(False, group=COURSE, action="store_true")
    batch_size: int = flag(8, "sst: 64, cfimdb: 8 can fit a 12GB GPU", COURSE, type=int)
    hidden_dropout_prob: float = flag(0.3, "dropout before the linear head (BERT keeps its own 0.1, as in the "
                                        "course)", COURSE, type=float)
    lr: float = flag(1e-5, "learning rate; the course suggests 1e-3 for pretrain and 1e-5 for finetune",
                       COURSE, type=float)
    data_dir: str = flag("data", "folder with the course's file names (ids-sst-*.csv, ...)", "data and outputs")
    data_files: dict = per_file_options("data", PART1_TASKS, "data and outputs")
    predictions_dir: str = flag("predictions", "where the {option}-{dataset}-{dev,test}-out.csv files go",
                                  "data and outputs")
    output_dir: str = flag("runs/classifier", "best-dev checkpoints", "data and outputs")
    pretrained: str = flag("bert-base-uncased", "hub id, local directory, or minilm-l6 (bundled, offline)",
                             "model and run")
    max_train_examples: int | None = flag(None, "subsample each train set", "model and run", type=int)
    max_length: int = flag(512, "tokens per text; 512 keeps CFIMDB reviews whole, as the course does",
                             "model and run", type=int)
    eval_batch_size: int = flag(64, group="model and run", type=int)
    quiet: bool = flag(False, "no progress bars", "model and run", action="store_true")

    def __post_init__(self):
        _check_common(self, texts_per_input=1)


def _refuse_task_flags_taking_own_flags(parser: argparse.ArgumentParser, cls) -> None:
    """A task's per-file flag or option spelled as one of the command line's own (a task with flag_prefix "score" would
    claim --score_train, an option named lr --lr) stops it in one line naming the task's module, not in argparse's
    traceback or by taking the flag's value. The tasks' flags among themselves are minbert/tasks/registry.py's
    check."""
    own = {f.name for f in dataclasses.fields(cls) if "per_file" not in f.metadata and "task" not in f.metadata}
    if any("task" in f.metadata for f in dataclasses.fields(cls)):  # a class with_task_options
        for task in TASKS.values():
            taken = sorted(own & {option.name for option in task.options})
            if taken:
                parser.exit(2, f"{parser.prog}: error: {TASK_FILES[task.name]}: its flag --{taken[0]} is already "
                               f"{parser.prog}'s own\n")
    for f in dataclasses.fields(cls):
        for task in f.metadata.get("tasks", ()):
            taken = own & set(_per_file_flags(f.metadata["per_file"], (task,)))
            if taken:
                parser.exit(2, f"{parser.prog}: error: {TASK_FILES[task]}: its flag --{min(taken)} is already "
                               f"{parser.prog}'s own\n")


# --help's order of groups: the common flags first, the course's twenty per-file paths last, the rest as declared.
FIRST_GROUPS, LAST_GROUPS = (COMMON,), (COURSE_PATHS,)


def build_parser(cls, description: str | None = None) -> argparse.ArgumentParser:
    """An argparse parser with one flag per field of `cls`, grouped as the fields' metadata says (FIRST_GROUPS and
    LAST_GROUPS placing groups in --help; a group with no flag is not shown)."""
    parser = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    _refuse_task_flags_taking_own_flags(parser, cls)
    groups = {name: parser.add_argument_group(name) for name in FIRST_GROUPS}
    fields = dataclasses.fields(cls)
    for f in sorted(fields, key=lambda f: f.metadata["group"] in LAST_GROUPS):  # stable: declared order kept
        meta = f.metadata
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        group = groups[meta["group"]]
        if "per_file" in meta:
            for flag, (default, help_text) in _per_file_flags(meta["per_file"], meta["tasks"]).items():
                group.add_argument(f"--{flag}", default=default, help=help_text)
            continue
        group.add_argument(f"--{f.name}", default=f.default if f.default is not dataclasses.MISSING else [],
                           help=meta["help"], **meta["argparse"])
    return parser


def from_namespace(cls, namespace: argparse.Namespace):
    """The dataclass from parsed flags; the per-file flags are gathered into their dict fields."""
    values = {}
    for f in dataclasses.fields(cls):
        if "per_file" in f.metadata:
            flags = _per_file_flags(f.metadata["per_file"], f.metadata["tasks"])
            values[f.name] = {flag: getattr(namespace, flag) for flag in flags}
        else:
            values[f.name] = getattr(namespace, f.name)
    return cls(**values)


# Settings a --config file never sets: resuming is a choice of the command line (--resume), not of a recipe,
# so that a resumed run's args.json still trains the run again from its start.
NOT_FROM_CONFIG = ("resume", "resume_from")
# Names of one setting: the command line giving either decides both, so that a config's alias never overrides the
# canonical flag given on the command line, nor the reverse.
ALIASES = (("precision", "bf16"),)


@dataclass
class ConfigFile:
    """A --config FILE read: its settings as parser defaults (each flag's destination -> value); for a run's
    args.json (`record`), the segments it ran in (run_record.py; None where the record predates them)."""
    path: str
    settings: dict
    record: bool = False
    segments: list | None = None


def read_config(cls, path: str) -> ConfigFile:
    """The settings of a --config FILE, checked as the command line checks them: a JSON object of settings by field
    name (a per-file flag such as sst_train alone or in its dict field), or a run's args.json (run_record.py), whose
    "args" are its settings. Fields it lacks keep their defaults (an older run's record predates them). ValueError
    naming the file and the key for an unknown key or a value of the wrong type or choice."""
    try:
        content = json.loads(read_input_bytes(path))
    except DataError as err:  # no such file, a folder: the message names the file
        raise ValueError(f"--config {err}") from None
    except (ValueError, RecursionError) as err:  # not JSON (nor UTF-8), or nested too deeply for the parser
        raise ValueError(f"--config {path}: not a JSON file ({err})") from None
    record = isinstance(content, dict) and "args" in content
    segments = None
    if record:
        unknown = sorted(set(content) - set(RECORD_KEYS))
        if unknown:
            raise ValueError(f"--config {path}: unknown key {unknown[0]!r} in a run record (expected "
                             f"{', '.join(RECORD_KEYS)})")
        segments = _record_segments(path, content.get("segments"))
        content = content["args"]
    if not isinstance(content, dict):
        raise ValueError(f"--config {path}: expected a JSON object of settings by name, found "
                         f"{type(content).__name__}")
    return ConfigFile(path, _config_settings(cls, path, content), record, segments)


def settings_as_config(cls, path: str, content: dict):
    """The `cls` that a --config FILE holding the settings `content` makes with no flag given, checked as read_config
    and the command line check it (scripts/write_args_json.py: an args.json it writes must train the run again);
    ValueError naming `path` and the setting, or the flag validation refuses."""
    parser = build_parser(cls)
    parser.set_defaults(**_config_settings(cls, path, content))
    return from_namespace(cls, parser.parse_args([]))


def _config_settings(cls, path: str, content: dict) -> dict:
    """{flag destination: value} of a --config's settings (read_config)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    per_file = {flag: f for f in fields.values() if "per_file" in f.metadata
                for flag in _per_file_flags(f.metadata["per_file"], f.metadata["tasks"])}
    defaults = {}
    for key, value in content.items():
        if key not in fields and key not in per_file:
            raise ValueError(f"--config {path}: unknown setting {key!r} (settings are named as the flags without the "
                             "dashes, the per-file flags too, alone (\"sst_train\": PATH) or by field (\"data_files\": "
                             "{\"sst_train\": PATH}, \"prediction_files\"); see --help)")
        if key in NOT_FROM_CONFIG:
            continue
        try:
            if key in per_file:  # a per-file flag named alone, as on the command line
                _check(value is None or isinstance(value, str), "must be a path (a string) or null")
                values = {key: value}
            else:
                values = _config_value(fields[key], value)
        except ValueError as err:
            raise ValueError(f"--config {path}: {key!r} {err}, found {json.dumps(value)}") from None
        twice = sorted(values.keys() & defaults.keys())
        if twice:
            raise ValueError(f"--config {path}: {twice[0]!r} is set twice, alone and in "
                             f"{per_file[twice[0]].name!r}")
        defaults |= values
    return defaults


def _record_segments(path: str, segments) -> list | None:
    """A run record's "segments" (run_record.py), checked: a list of objects whose "resolved" is an object (or null
    where a segment is not described)."""
    if segments is None:
        return None
    if not isinstance(segments, list) or not all(
            isinstance(part, dict) and isinstance(part.get("resolved"), (dict, type(None))) for part in segments):
        raise ValueError(f"--config {path}: 'segments' must be a list of objects with \"resolved\" (run_record.py)")
    return segments


def _config_value(f: dataclasses.Field, value) -> dict:
    """{flag destination: value} of one field's value in a --config file; ValueError saying what it must be."""
    meta = f.metadata
    if "per_file" in meta:
        flags = _per_file_flags(meta["per_file"], meta["tasks"])
        if not isinstance(value, dict) or not all(k in flags and (v is None or isinstance(v, str))
                                                  for k, v in value.items()):
            raise ValueError(f"must be an object of paths (or null) by flag name, some of {', '.join(flags)}")
        return dict(value)
    kwargs = meta["argparse"]
    nullable = f.default is None
    if value is None and nullable:
        return {f.name: None}
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kwargs.get("action") in ("store_true", argparse.BooleanOptionalAction):
        ok, kind = isinstance(value, bool), "true or false"
    elif kwargs.get("action") == "append" or "nargs" in kwargs:
        ok, kind = isinstance(value, list) and all(isinstance(v, str) for v in value), "a list of strings"
    elif kwargs.get("type") is int:
        ok, kind = number and float(value).is_integer(), "a whole number"
        value = int(value) if ok else value
    elif kwargs.get("type") is float:
        ok, kind = number, "a number"
        value = float(value) if ok else value
    else:
        ok, kind = isinstance(value, str), "a string"
    if ok and "choices" in kwargs and value not in kwargs["choices"]:
        ok, kind = False, f"one of {', '.join(map(str, kwargs['choices']))}"
    if not ok:
        raise ValueError(f"must be {kind}" + (" or null" if nullable else ""))
    return {f.name: value}


def field_defaults(cls) -> dict:
    """Each field's default, as its flags give it (a per-file dict field: each flag's default) and the
    settings resolve it (a default that depends on other flags, such as --first_stages on --tasks)."""
    defaults = {}
    for f in dataclasses.fields(cls):
        if "per_file" in f.metadata:
            flags = _per_file_flags(f.metadata["per_file"], f.metadata["tasks"])
            defaults[f.name] = {flag: default for flag, (default, _) in flags.items()}
        elif f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return dataclasses.asdict(cls(**defaults))


def resume_free_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("resume_free")}


def data_paths(data_dir: str, data_files: dict, tasks: tuple[str, ...]) -> dict[tuple[str, str], Path]:
    """(task, split) -> the file to read: its per-file flag if given, else the course's name in data_dir."""
    standard = standard_paths(data_dir)
    return {(task, split): Path(data_files.get(data_flag(task, split)) or standard[(task, split)])
            for task in tasks for split in SPLITS}


def prediction_paths(prediction_files: dict, output_dir: str | Path,
                     tasks: tuple[str, ...] = MULTITASK) -> dict[tuple[str, str], Path]:
    """(task, split) -> where its leaderboard CSV (SQuAD: predictions JSON) goes, for the run's tasks: its flag's
    path, else its course name in the run's own folder (OUTPUT_DIR/predictions/), where no other run's file is."""
    return {(task, split): Path(prediction_files.get(output_flag(task, split)) or
                                Path(output_dir) / default_output(task, split))
            for task in tasks for split in ("dev", "test")}


def parse_tasks(text: str) -> tuple[str, ...]:
    """'qa,sst' (or course aliases) -> the tasks in RUN_TASKS' order, each once: ('sst', 'qa')."""
    named = {task_name(t, RUN_TASKS) for t in text.split(",") if t.strip()}
    if not named:
        raise ValueError(f"name at least one of {', '.join(RUN_TASKS)}")
    return tuple(task for task in RUN_TASKS if task in named)


def check_resume_arguments(saved: dict, args: TrainingArguments) -> None:
    """Refuse to resume a stopped run whose saved settings (`saved`, its checkpoint's args) differ from these in
    a flag that changes the result (checkpoint.check_resume_settings), or in --cycles when the learning rate follows
    the total number of updates, or in what a penalty's own check refuses (PenaltyKind.check_resume: SMART's
    momentum follows the total number of updates too)."""
    if args.lr_schedule != "constant" and saved.get("cycles") != args.cycles:
        raise CheckpointError(f"cannot resume: --cycles {saved.get('cycles')!r} -> {args.cycles!r} changes the total "
                              "number of updates, which the learning rate follows; resume with --cycles "
                              f"{saved.get('cycles')}")
    for kind in PENALTY_KINDS.values():
        try:
            kind.check_resume(saved, args)
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    check_resume_settings(saved, dataclasses.asdict(args), resume_free_fields(TrainingArguments),
                          field_defaults(TrainingArguments))


def saved_schedule_length(saved: dict, args: TrainingArguments) -> int:
    """How many stages the stopped run's schedule had (`saved`: its checkpoint's args): this run's schedule with the
    stopped run's --cycles, the one flag of the schedule a resume may change (check_resume_arguments)."""
    cycles = saved.get("cycles", args.cycles)
    if cycles == args.cycles:
        return len(run_schedule(args))
    try:
        return len(run_schedule(dataclasses.replace(args, cycles=cycles)))
    except (ValueError, TypeError):
        raise CheckpointError(f"cannot resume: the stopped run's --cycles {cycles!r} is not a number of cycles; the "
                              "checkpoint was edited or damaged") from None


# --demo: these become the defaults, so that every flag given still wins.
DEMO_SETTINGS = dict(data_dir=str(Path(__file__).resolve().parents[2] / "data" / "demo"), pretrained="minilm-l6",
                     option="finetune", batch_size=16, lr=5e-5, hidden_dropout_prob=0.1,
                     cycles=2, smart=True, max_length=64, qa_max_length=128,
                     qa_doc_stride=32, output_dir="runs/demo")


def parse_training_args(argv, description: str) -> TrainingArguments:
    """multitask_classifier.py's command line, checked: --demo's and --config's settings under the flags given
    (an error is one line and exit 2, parser.error's)."""
    parser = build_parser(TrainingArguments, description)
    parser.add_argument("--config", metavar="FILE", help="settings from a JSON file: a run's OUTPUT_DIR/args.json "
                        "(its \"args\") or an object of settings named as the flags; flags given here win "
                        "(docs/command_line.md, 'A run is its own recipe')")
    parser.add_argument("--print_config", action="store_true", help="print the settings this command line resolves "
                        "to (--demo's and --config's included) as the JSON --config reads, and exit without training")
    namespace = parser.parse_args(argv)
    given = flags_given(parser, argv)
    config = None
    try:
        if namespace.config is not None:
            config = config_under_command_line(read_config(TrainingArguments, namespace.config), given,
                                               namespace.tasks)
        settings = config.settings if config else {}
        if namespace.demo or settings.get("demo"):
            # The demo's settings become the defaults, so every flag given (abbreviated too) still wins; a recipe
            # holds the demo's settings already, and its own values win over them.
            tasks = namespace.tasks if "tasks" in given else settings.get("tasks", namespace.tasks)
            settings = demo_settings(parse_tasks(tasks)) | settings
    except ValueError as err:
        parser.error(attributed(str(err), config, given))
    if settings:
        parser.set_defaults(**settings)
        namespace = parser.parse_args(argv)
    try:
        args = from_namespace(TrainingArguments, namespace)
        check_switched_flags(args, given | set(config.settings if config else ()))
        if config is not None:
            moved = check_rerun(args, config, given)
    except ValueError as err:
        parser.error(attributed(str(err), config, given))
    if config is not None and moved:
        print(f"note: --config {config.path}: the recorded run's prediction paths outside its folder are its own; "
              f"this run writes them in {Path(args.output_dir) / 'predictions'} (set {', '.join(moved)} to choose)",
              file=sys.stderr if namespace.print_config else sys.stdout)  # --print_config's stdout is the JSON alone
    if namespace.print_config:  # like --help: the parser's answer, then exit
        print(json.dumps(dataclasses.asdict(args), indent=2))
        parser.exit(0)
    return args


def check_switched_flags(args: TrainingArguments, named: set[str]) -> None:
    """A feature's flag `named` (on the command line or in a --config) while its switch leaves the feature off does
    nothing: refused (ValueError naming both). So for a group's switch (SWITCHES), the flag another one's value
    turns on (TUNES), a penalty's tuning flags (PenaltyFlag.tunes) while its file says it is off, and a task's
    option (Task.options) while --tasks leaves the task out. A switch named off as well says so knowingly and is
    accepted: a recipe's --smart flags with --no-smart after them, a run record's "smart": false beside its SMART
    settings."""
    for f in dataclasses.fields(args):
        switch, turn_on = SWITCHES.get(f.metadata["group"], (None, None))
        if switch in (None, f.name) or f.name not in named or switch in named:
            continue
        _check(getattr(args, switch) not in SWITCHED_OFF, f"--{f.name} does nothing without {turn_on}")
    for name, (switch, turns_on, turn_on) in TUNES.items():
        if name in named and switch not in named:
            _check(turns_on(args), f"--{name} does nothing without {turn_on}")
    if "tasks" not in named:  # a task's option is its task's switch: --tasks named without it says so knowingly
        for f in dataclasses.fields(args):
            task = f.metadata.get("task")
            if task is not None and f.name in named:
                _check(task in run_tasks(args), f"--{f.name} does nothing without {task} in --tasks")
    for kind in PENALTY_KINDS.values():
        switches = [name for name, spec in kind.flags.items() if not spec.tunes and not spec.resume_free]
        if kind.is_on(args) or any(name in named for name in switches):
            continue
        tuned = [name for name, spec in kind.flags.items() if spec.tunes and name in named]
        if tuned:
            raise ValueError(f"--{tuned[0]} does nothing without {' or '.join(f'--{s}' for s in switches)} (the "
                             f"{kind.name} penalty is off)")


def demo_settings(tasks: tuple[str, ...]) -> dict:
    """--demo's settings for these tasks (its short schedule is the three tasks')."""
    stages = task_derived_settings(tasks, demo=True)
    return DEMO_SETTINGS | {"first_stages": stages["first_stages"], "cycle": stages["cycle"]}


def config_under_command_line(config: ConfigFile, given: set[str], command_line_tasks: str) -> ConfigFile:
    """The config without the values the command line decides although it names another flag: an alias and its
    canonical flag are one setting (ALIASES), and a record's settings derived from its own --tasks
    (task_derived_settings: its stages, --smart_tasks) follow the command line's other --tasks. A value the record
    set itself stays, and check_rerun or the settings' validation refuses it where it cannot fit."""
    settings = dict(config.settings)
    for names in ALIASES:
        if given & set(names):
            for name in names:
                settings.pop(name, None)
    recorded_tasks = _tasks_or_none(settings.get("tasks"))
    if "tasks" in given and recorded_tasks is not None and recorded_tasks != _tasks_or_none(command_line_tasks):
        derived = task_derived_settings(recorded_tasks, settings.get("demo", False))
        settings = {name: value for name, value in settings.items() if name not in derived or derived[name] != value}
    return dataclasses.replace(config, settings=settings)


def _tasks_or_none(text) -> tuple[str, ...] | None:
    try:
        return parse_tasks(text) if isinstance(text, str) else None
    except ValueError:
        return None


def attributed(message: str, config: ConfigFile | None, given: set[str]) -> str:
    """An error about settings, saying which of the flags it names took their value from the --config file."""
    if config is None:
        return message
    named = [name for name in dict.fromkeys(re.findall(r"--(?:no-)?(\w+)", message))
             if name in config.settings and name not in given]
    return f"{message} ({', '.join('--' + name for name in named)} from --config {config.path})" if named else message


def check_rerun(args: TrainingArguments, config: ConfigFile, given: set[str]) -> list[str]:
    """A run from a --config that cannot repeat what it says, or would write into another run's files, refused
    (ValueError); its prediction paths moved into its own folder (follow_output_dir). Returns the flags of the paths
    moved from outside the recorded run's folder."""
    if not args.resume:  # --resume continues the folder's run, which the checks below are about training again
        _check_record_kept(config, given)
        _check_segments(config, given)
    _check_tasks_trained(args, config, given)
    args.prediction_files, moved = follow_output_dir(args.prediction_files, config, given, args.output_dir)
    return moved


def _check_record_kept(config: ConfigFile, given: set[str]) -> None:
    """A record trained again in the folder it records would replace that run (a fresh run removes the files an
    earlier run left there): the command line names the folder, that one to replace the run."""
    recorded_dir = config.settings.get("output_dir")
    if config.record and "output_dir" not in given and recorded_dir and (Path(recorded_dir) / RECORD_FILE).is_file():
        raise ValueError(f"--config {config.path}: its output_dir {recorded_dir} holds a run ({RECORD_FILE}) that "
                         "training again there would replace; give --output_dir (that folder to replace it)")


# What a resolved value of a segment (run_record.py) follows: the flag that decides it.
RESOLVED_BY = {"precision": "precision", "device": "use_gpu"}


def _check_segments(config: ConfigFile, given: set[str]) -> None:
    """A record of a run whose settings resolved to another precision or device when it resumed (auto on another
    machine) cannot be trained again as it ran: a run trains every stage one way. Refused, naming the change, unless
    the command line decides that setting."""
    decided = given | {name for names in ALIASES if given & set(names) for name in names}
    segments = config.segments or []
    for earlier, later in zip(segments, segments[1:]):
        stage = later.get("first_stage")
        if earlier["resolved"] is None:
            raise ValueError(f"--config {config.path}: the run it records was resumed at stage {stage} without a "
                             "record of how its earlier stages ran; a rerun cannot repeat it")
        for key, flag in RESOLVED_BY.items():
            before, after = earlier["resolved"].get(key), (later["resolved"] or {}).get(key)
            if before != after and flag not in decided:
                raise ValueError(f"--config {config.path}: the run it records changed the {key} it resolved to when "
                                 f"it resumed at stage {stage} ({json.dumps(before)} before, {json.dumps(after)} from "
                                 f"then on); a rerun trains every stage one way and cannot repeat it: give --{flag} "
                                 "to choose")


def _check_tasks_trained(args: TrainingArguments, config: ConfigFile, given: set[str]) -> None:
    """Stages a config set itself, kept under the command line's other --tasks, must train every one of them: an
    untrained head would write its predictions from random weights."""
    if "tasks" not in given or _tasks_or_none(config.settings.get("tasks")) == run_tasks(args):
        return
    from_config = [f"--{name} {json.dumps(config.settings[name])}" for name in ("first_stages", "cycle")
                   if name in config.settings and name not in given]
    untrained = [task for task in run_tasks(args) if task not in trained_heads(run_schedule(args), run_tasks(args))]
    if from_config and untrained:
        raise ValueError(f"--tasks {args.tasks}: the stages from --config {config.path} ({', '.join(from_config)}) "
                         f"train no head of {', '.join(untrained)}; give --first_stages and --cycle for these tasks")


def follow_output_dir(prediction_files: dict, config: ConfigFile, given: set[str],
                      output_dir: str) -> tuple[dict, list[str]]:
    """A run from a config in another --output_dir than the config's writes its own leaderboard files, never the
    first run's: each of the config's prediction paths the command line does not set moves into this run's folder,
    one inside the config's output_dir to the same place in it, any other (the course's predictions/, where runs
    wrote by default before) to its course name under OUTPUT_DIR. Returns the paths, and the flags of those moved
    from outside."""
    recorded_dir = config.settings.get("output_dir")
    if not recorded_dir or Path(recorded_dir).resolve() == Path(output_dir).resolve():
        return prediction_files, []
    course_names = {output_flag(task, split): default_output(task, split)
                    for task in RUN_TASKS for split in ("dev", "test")}
    moved, outside = dict(prediction_files), []
    for flag, path in prediction_files.items():
        if flag in given or not path or path != config.settings.get(flag):
            continue
        if Path(path).resolve().is_relative_to(Path(recorded_dir).resolve()):
            moved[flag] = str(Path(output_dir) / Path(path).resolve().relative_to(Path(recorded_dir).resolve()))
        else:
            moved[flag] = str(Path(output_dir) / course_names[flag])
            outside.append(f"--{flag}")
    return moved, outside
