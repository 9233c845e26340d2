"""Building a run of multitask_classifier.py from its settings (training_args.TrainingArguments, validated when
they were made), for the command line and for whatever else trains as it does (scripts/benchmark.py's step_audit
and qqp_epoch):

    stages, data, dropped, triplets, inputs = load_inputs(args)    # every input read and checked, no model yet
    tokenizer = check_pretrained(args, data)                        # the flags that depend on the model's config
    trainer = build_run(args, stages, data, tokenizer, triplets, inputs, device)    # model, placement, Trainer

Bad input raises training_args.UsageError (one line for the command line to print).
"""
from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path

import torch

from base_bert import pretrained_config
from bert import BertModel
from minbert.data.batches import DataWarning, TaskData, load_task_data, subsample
from minbert.data.nli import load_nli_triplets
from minbert.data.scores import ScoresFileError
from minbert.files import forbidden_output
from minbert.distributed import SINGLE_PROCESS, Distributed
from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder
from minbert.run.run_settings import resolve_run_settings
from minbert.run.training_args import (TrainingArguments, UsageError, adapter_config, check_max_length, check_writable,
                                       data_paths, prediction_paths, run_schedule, run_task_settings, run_tasks)
from minbert.runtime import place_encoder, seed_everything
from minbert.tasks import TASKS, data_flag, head_options, output_flag
from minbert.training.checkpoint_files import LAST, NUMBERED, finished_stages, numbered_checkpoints
from minbert.training.gradient_surgery import GradientSurgery
from minbert.training.mlm import MaskedLanguageModelHead, load_mlm_head
from minbert.training.optimization import build_optimizer
from minbert.training.penalties import PENALTY_KINDS, build_penalties
from minbert.training.schedules import Stage, StageKind, train_tasks
from minbert.training.simcse import SIMCSE_OBJECTIVES
from minbert.training.trainer import SimcseStage, Trainer
from tokenizer import BertTokenizer


def load_inputs(args: TrainingArguments) -> tuple[list[Stage], dict, list[str], list, dict[str, object]]:
    """The schedule, every data file (and what was dropped from them), the NLI triplets and what the penalties read
    (--distill's teacher scores: load_penalty_inputs), all validated before any model is loaded."""
    check_outputs(args)
    stages = run_schedule(args)
    try:
        data, dropped = load_data(args, stages)
        triplets = load_triplets(args)
        penalty_inputs = load_penalty_inputs(args, stages, data)
    except ValueError as err:  # DataError and ScoresFileError too: their messages name the file
        raise UsageError(str(err)) from None
    return stages, data, dropped, triplets, penalty_inputs


def check_outputs(args: TrainingArguments) -> None:
    """The output folders can be written, no leaderboard file replaces a data file, another run's file or another
    leaderboard file of this run, and --resume has a checkpoint to continue."""
    outputs = prediction_paths(args.prediction_files, args.output_dir, run_tasks(args))
    check_writable([args.output_dir, *(path.parent for path in outputs.values())])
    inputs = data_paths(args.data_dir, args.data_files, run_tasks(args)).values()
    flag_of: dict[Path, str] = {}
    for (task, split), path in outputs.items():
        flag = f"--{output_flag(task, split)}"
        problem = forbidden_output(flag, path, inputs, [args.output_dir])
        if path.resolve() in flag_of:  # the second file written would replace the first's rows
            problem = f"{flag} {path}: also the file of {flag_of[path.resolve()]}; give each its own file"
        if problem:
            raise UsageError(problem)
        flag_of[path.resolve()] = flag
    output_dir = Path(args.output_dir)
    if args.resume_from:
        resume_prefix(args)
    elif args.resume and finished_stages(output_dir) is None and \
            not any((output_dir / name).exists() for name in ("last.json", "last.safetensors")):
        raise UsageError(f"{output_dir}: nothing to resume yet (no checkpoint saved); start without --resume")


def resuming(args: TrainingArguments) -> bool:
    """Whether the run continues the stopped one in its folder (--resume, or --resume_from, which implies it)."""
    return args.resume or args.resume_from is not None


def resume_prefix(args: TrainingArguments) -> Path:
    """The checkpoint a resume continues: OUTPUT_DIR/last, or --resume_from's, which must be one of the run's own
    (OUTPUT_DIR/last or a checkpoint-U kept by --save_total_limit; .json or .safetensors may be named)."""
    output_dir = Path(args.output_dir)
    if args.resume_from is None:
        return output_dir / LAST
    chosen = Path(args.resume_from)
    prefix = chosen.with_suffix("") if chosen.suffix in (".json", ".safetensors") else chosen
    if prefix.parent.resolve() != output_dir.resolve() or not (
            prefix.name == LAST or NUMBERED.fullmatch(prefix.name + ".json")):
        kept = ", ".join(str(path) for path in numbered_checkpoints(output_dir).values()) or "none kept"
        raise UsageError(f"--resume_from {chosen}: not a checkpoint of the run in {output_dir} (its last or a "
                         f"checkpoint-U there: {kept})")
    missing = [str(prefix.with_suffix(suffix)) for suffix in (".json", ".safetensors")
               if not prefix.with_suffix(suffix).is_file()]
    if missing:
        raise UsageError(f"--resume_from {chosen}: no {' nor '.join(missing)}")
    return prefix


def finished_run(args: TrainingArguments) -> str | None:
    """What --resume says of a run that finished and removed its training state (finished.json, no last.*): that
    it is done, when this schedule is the finished one's; a longer one cannot continue it without that state
    (UsageError). None for any other run."""
    output_dir = Path(args.output_dir)
    done = finished_stages(output_dir)
    if not args.resume or args.resume_from or done is None or (output_dir / f"{LAST}.json").exists():
        return None
    if [stage.label for stage in run_schedule(args)] != done:
        raise UsageError(f"{output_dir}: the run finished its {len(done)} stages and removed its training state "
                         "(last.*) then, which a longer schedule would continue from; start a new run (runs keep "
                         "that state with --keep_resume_state)")
    return (f"{output_dir}: the run has finished all its {len(done)} stages; nothing to resume (its kept model is "
            f"{output_dir / 'best.safetensors'}, its predictions are written)")


def load_data(args: TrainingArguments, stages: list[Stage]) -> tuple[dict[str, TaskData], list[str]]:
    """Every split of the run's tasks that the schedule reads, and what was dropped from the files (the rows a
    data warning names: shown now, and again beside the CSVs they are missing from)."""
    tasks = run_tasks(args)
    with warnings.catch_warnings(record=True) as dropped:
        warnings.simplefilter("always", DataWarning)
        paths = data_paths(args.data_dir, args.data_files, tasks)
        # A task whose official test set is hidden (SQuAD's) may come without a test file: dev only.
        without_test = [task for task in tasks if TASKS[task].test_file_optional
                        and not args.data_files.get(data_flag(task, "test")) and not paths[(task, "test")].exists()]
        for task in without_test:
            print(f"note: no {paths[(task, 'test')]}: {TASKS[task].title}'s test set is not predicted "
                  f"(--{data_flag(task, 'test')} FILE)")
        data = load_task_data(paths, tasks, train_tasks(stages, tasks), args.max_train_examples, args.seed,
                              set(without_test))
    for warning in dropped:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return data, [str(warning.message) for warning in dropped]


def load_triplets(args: TrainingArguments) -> list:
    """--simcse_data's NLI triplets (--simcse_max_examples of them), or none without a SimCSE stage."""
    if not args.simcse_data:
        return []
    triplets, _ = load_nli_triplets(args.simcse_data, pairing=args.simcse_pairing)
    if not triplets:
        raise ValueError(f"--simcse_data {' '.join(args.simcse_data)}: no (premise, entailed, contradicted) "
                         "triplets in these files")
    triplets = subsample(triplets, args.simcse_max_examples, args.seed)
    print(f"SimCSE: {len(triplets)} NLI triplets")
    return triplets


def load_penalty_inputs(args: TrainingArguments, stages: list[Stage], data: dict[str, TaskData]) -> dict[str, object]:
    """What each penalty reads before the model loads (PenaltyKind.load: --distill's teacher scores of the train
    examples of every task that learns from one), by the penalty's name; those that read nothing are absent."""
    inputs = {name: kind.load(args, stages, data, run_task_settings(args)) for name, kind in PENALTY_KINDS.items()}
    return {name: read for name, read in inputs.items() if read is not None}


def check_pretrained(args: TrainingArguments, data: dict) -> BertTokenizer:
    """The pretrained model's tokenizer, and the flags and data that depend on the model checked against its
    config.json before its weights load: the tokenizer against its embedding table, the text lengths against
    its positions, SQuAD's windows against the longest question, LNSR's layer and the PALs' size against its
    layers and heads."""
    config = pretrained_config(args.pretrained)
    tokenizer = BertTokenizer.from_pretrained(args.pretrained)
    tokenizer.check_fits(config.vocab_size, args.pretrained)
    check_max_length(args.max_length, config.max_position_embeddings, args.pretrained)

    def check_length(length: int, flag: str) -> None:
        check_max_length(length, config.max_position_embeddings, args.pretrained, flag)
    try:
        for task, task_data in data.items():
            TASKS[task].data.check_inputs(task_data, tokenizer, run_task_settings(args), check_length)
        for kind in PENALTY_KINDS.values():
            kind.check_model(args, config)
        if args.adapter == "pals" and args.pal_size and args.pal_size % config.num_attention_heads:
            raise ValueError(f"--pal_size {args.pal_size} is not a multiple of the {config.num_attention_heads} "
                             f"attention heads of {args.pretrained}")
    except ValueError as err:
        raise UsageError(str(err)) from None
    return tokenizer


def build_model(args: TrainingArguments, trained: set[str]) -> MultitaskBERT:
    """The pretrained encoder (its own dropout unless --encoder_dropout) with fresh task heads; check_pretrained
    has checked the flags that depend on it. `trained`: the tasks the schedule trains."""
    overrides = {} if args.encoder_dropout is None else {"hidden_dropout_prob": args.encoder_dropout}
    bert = BertModel.from_pretrained(args.pretrained, **overrides)
    bert.encoder.gradient_checkpointing = args.gradient_checkpointing
    model = MultitaskBERT(bert, args.pooling, args.hidden_dropout_prob, args.pair_encoder, head_hidden=args.head_hidden,
                          head_activation=args.head_activation, adapter=adapter_config(args), tasks=run_tasks(args),
                          **head_options(run_task_settings(args)))
    if args.option == "pretrain":
        freeze_encoder(model)
        # A task without a head (STS's cosine of the frozen encoder's embeddings) trains nothing unless adapters or
        # a dense layer give it weights.
        for task in run_tasks(args):
            if task in trained and not model.trains_with_frozen_encoder(task):
                title = TASKS[task].title
                print(f"note: with --option pretrain the {title} {TASKS[task].headless_output} has no trainable "
                      f"weights; {title} training steps change nothing")
    return model


def build_run(args: TrainingArguments, stages: list[Stage], data: dict, tokenizer: BertTokenizer, triplets: list,
              penalty_inputs: dict[str, object], device: torch.device,
              distributed: Distributed = SINGLE_PROCESS) -> Trainer:
    """The run's Trainer from load_inputs' and check_pretrained's results: the seeded model on its device (packed or
    padded tokens, compiled layers), the MLM head when a stage needs one, rank 0's weights on every rank, and the
    Trainer that build_trainer builds around them."""
    seed_everything(args.seed)
    model = build_model(args, train_tasks(stages, run_tasks(args))).to(device)
    place_encoder(model.bert.encoder, device, args.compile, args.compile_mode, padded=args.capture_step)
    mlm_head = None
    if any(stage.kind is StageKind.MLM for stage in stages):
        mlm_head, found = load_mlm_head(args.pretrained, model.bert.config)
        mlm_head.to(device)
        print(f"mlm stage: the MLM head of {args.pretrained}" if found else
              f"mlm stage: {args.pretrained} has no MLM head; starting from a fresh one")
    distributed.start_from_one_model([model, mlm_head], args.seed)
    if distributed.enabled:
        examples = distributed.world_size * args.batch_size * args.grad_accumulation_steps
        print(f"data parallel: {distributed.world_size} processes x batch {args.batch_size} x accumulation "
              f"{args.grad_accumulation_steps} = {examples} examples per update; learning rate {args.lr} (not scaled "
              "with the batch)")
    trainer = build_trainer(args, model, tokenizer, data, triplets, device, mlm_head, distributed, penalty_inputs)
    for task, scores in penalty_inputs.get("distillation", {}).items():
        try:  # a teacher's SQuAD windows must be the student's: the same ids and token counts
            scores.check_windows(trainer.predictor.splits.get(task, data[task].train))
        except ScoresFileError as err:
            raise UsageError(str(err)) from None
    return trainer


def build_trainer(args: TrainingArguments, model: MultitaskBERT, tokenizer, data: dict, triplets: list,
                  device: torch.device, mlm_head: MaskedLanguageModelHead | None = None,
                  distributed: Distributed = SINGLE_PROCESS,
                  penalty_inputs: dict[str, object] | None = None) -> Trainer:
    """The run's Trainer: its settings resolved for the model and the device in one pass (run_settings), then its
    objects built from them. Build it once the model is on its device and the same on every rank (SMART's anchor
    copies the model's weights). `penalty_inputs`: what the penalties read (load_penalty_inputs)."""
    settings = resolve_run_settings(args, model.bert.config.num_hidden_layers, device)
    if args.capture_step:  # what training_args could not know before the device and the ranks
        check_captured_step(settings.loop.precision, distributed)
    optimizer = build_optimizer(model, settings.optimizer.lr, settings.optimizer.weight_decay,
                                settings.optimizer.layerwise_lr_decay, mlm_head, settings.optimizer.compiled,
                                settings.optimizer.bf16_weights)
    penalties = build_penalties(settings.penalties, model, penalty_inputs)
    simcse = None
    if triplets:
        loss = partial(SIMCSE_OBJECTIVES[settings.simcse.objective], temperature=settings.simcse.temperature)
        simcse = SimcseStage(triplets, loss, settings.simcse.lr)
    surgery = None
    if settings.gradient_surgery != "none":
        surgery = GradientSurgery(settings.gradient_surgery, settings.cagrad_c)
    return Trainer(model, tokenizer, data, device, settings.loop, optimizer, penalties, simcse, surgery,
                   settings.task_settings, mlm_head, distributed, settings.record)


def check_captured_step(precision: str, distributed: Distributed) -> None:
    """--capture_step against the precision the device resolved (--precision auto is fp16 on a T4) and torchrun."""
    if precision == "fp16":
        raise UsageError("--capture_step does not combine with fp16 (--precision auto on this GPU): its gradient "
                         "scaler reads the gradients' finiteness back to decide each step; use --precision fp32")
    if distributed.enabled:
        raise UsageError("--capture_step does not combine with torchrun: the gradients' average over ranks is not "
                         "captured")
