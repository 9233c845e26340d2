"""Assembling a run of multitask_classifier.py from its settings, for the command line and for whatever else
trains as it does (scripts/benchmark.py's step_audit and qqp_epoch):

    stages, data, dropped, triplets, teacher = load_inputs(args)   # every input read and checked, no model yet
    tokenizer = check_pretrained(args, data)                        # the flags that depend on the model's config
    trainer = build_run(args, stages, data, tokenizer, triplets, teacher, device)   # model, placement, Trainer

Bad input raises training_args.UsageError (one line for the command line to print).
"""
from __future__ import annotations

import warnings

import torch

from base_bert import pretrained_config
from bert import BertModel
from datasets import DataWarning, load_task_data, subsample
from distillation import DISTILLED_TASKS, SOFTENED_TASKS, load_teacher
from distributed import SINGLE_PROCESS, Distributed
from mlm import load_mlm_head
from multitask_bert import MultitaskBERT, freeze_encoder
from nli import load_nli_triplets
from runtime import place_encoder, seed_everything
from schedules import Stage, StageKind, build_schedule, train_tasks
from scores import ScoresFileError
from squad import check_window_room
from tasks import MULTITASK
from tokenizer import BertTokenizer
from trainer import Trainer
from training_args import (TrainingArguments, UsageError, adapter_config, build_trainer, check_max_length,
                           check_writable, data_paths, distill_settings, distill_teachers, lnsr_config,
                           prediction_paths, run_tasks)


def load_inputs(args: TrainingArguments) -> tuple[list[Stage], dict, list[str], list, dict | None]:
    """The schedule, every data file (and what was dropped from them), the NLI triplets and --distill's teacher
    scores, all validated before any model is loaded."""
    tasks = run_tasks(args)
    outputs = prediction_paths(args.prediction_files, tasks).values()
    check_writable([args.output_dir, *(path.parent for path in outputs)])
    try:
        stages = build_schedule(args.schedule, args.first_stages, args.cycle, args.cycles, args.epochs,
                                args.simcse_epochs if args.simcse_data else 0, args.mlm_epochs, tasks)
        if any(stage.kind is StageKind.MLM for stage in stages):
            if not set(MULTITASK) & set(tasks):
                raise ValueError("the mlm stage reads the training sentences of sst, qqp and sts; "
                                 "none of them is among --tasks")
            if args.option == "pretrain" and args.adapter == "none":
                raise ValueError("the mlm stage trains the encoder, which --option pretrain freezes; "
                                 "use --option finetune")
            if args.adapter != "none" and args.adapter_sharing == "per_task":
                raise ValueError("the mlm stage trains one encoder for every task: with an adapter use "
                                 "--adapter_sharing shared")
        with warnings.catch_warnings(record=True) as dropped:
            warnings.simplefilter("always", DataWarning)
            paths = data_paths(args.data_dir, args.data_files, tasks)
            without_test = set()
            if "qa" in tasks and not args.data_files.get("squad_test") and not paths[("qa", "test")].exists():
                # The official SQuAD 2.0 download has no test file (its test set is hidden): dev only.
                print(f"note: no {paths[('qa', 'test')]}: SQuAD's test set is not predicted (--squad_test FILE)")
                without_test.add("qa")
            data = load_task_data(paths, tasks, train_tasks(stages, tasks), args.max_train_examples, args.seed,
                                  without_test)
        for warning in dropped:  # shown now, and again beside the CSVs they are missing from
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        triplets = []
        if args.simcse_data:
            triplets, _ = load_nli_triplets(args.simcse_data)
            if not triplets:
                raise ValueError(f"--simcse_data {' '.join(args.simcse_data)}: no (premise, entailed, contradicted) "
                                 "triplets in these files")
            triplets = subsample(triplets, args.simcse_max_examples, args.seed)
            print(f"SimCSE: {len(triplets)} NLI triplets")
        teacher = None
        teachers = distill_teachers(args)
        if teachers:
            train_ids = {task: [e.id for e in data[task].train] for task in DISTILLED_TASKS
                         if task in teachers and task in data and data[task].train is not None}
            if not train_ids:
                raise ValueError(f"--distill {' '.join(sorted(set(teachers.values())))}: the schedule trains none "
                                 f"of {', '.join(teachers)}")
            teacher = {}
            for folder in dict.fromkeys(teachers[task] for task in train_ids):  # each folder read once
                taught = {task: ids for task, ids in train_ids.items() if teachers[task] == folder}
                teacher |= load_teacher(folder, taught, (args.qa_max_length, args.qa_doc_stride))
            settings = distill_settings(args)
            print("distillation: the train scores of " + ", ".join(
                f"{task} from {settings[task]['teacher']} (weight {settings[task]['weight']}"
                + (f", temperature {settings[task]['temperature']})" if task in SOFTENED_TASKS else ")")
                for task in train_ids))
    except ValueError as err:  # DataError and ScoresFileError too: their messages name the file
        raise UsageError(str(err)) from None
    return stages, data, [str(w.message) for w in dropped], triplets, teacher


def check_pretrained(args: TrainingArguments, data: dict) -> BertTokenizer:
    """The pretrained model's tokenizer, and the flags and data that depend on the model checked against its
    config.json before its weights load: the tokenizer against its embedding table, the text lengths against
    its positions, SQuAD's windows against the longest question, LNSR's layer and the PALs' size against its
    layers and heads."""
    config = pretrained_config(args.pretrained)
    tokenizer = BertTokenizer.from_pretrained(args.pretrained)
    tokenizer.check_fits(config.vocab_size, args.pretrained)
    check_max_length(args.max_length, config.max_position_embeddings, args.pretrained)
    try:
        if "qa" in data:
            check_max_length(args.qa_max_length, config.max_position_embeddings, args.pretrained, "--qa_max_length")
            for split in (data["qa"].train, data["qa"].dev, data["qa"].test):
                if split is not None:
                    check_window_room(split, tokenizer, args.qa_max_length, args.qa_doc_stride)
        if args.lnsr:
            lnsr_config(args, config.num_hidden_layers)
        if args.adapter == "pals" and args.pal_size and args.pal_size % config.num_attention_heads:
            raise ValueError(f"--pal_size {args.pal_size} is not a multiple of the {config.num_attention_heads} "
                             f"attention heads of {args.pretrained}")
    except ValueError as err:
        raise UsageError(str(err)) from None
    return tokenizer


def build_model(args: TrainingArguments, trains_sts: bool) -> MultitaskBERT:
    """The pretrained encoder (its own dropout unless --encoder_dropout) with fresh task heads; check_pretrained
    has checked the flags that depend on it."""
    overrides = {} if args.encoder_dropout is None else {"hidden_dropout_prob": args.encoder_dropout}
    bert = BertModel.from_pretrained(args.pretrained, **overrides)
    bert.encoder.gradient_checkpointing = args.gradient_checkpointing
    ordinal_weight = args.ordinal_weight if args.sst_objective == "ordinal" else 0.0
    model = MultitaskBERT(bert, args.pooling, args.hidden_dropout_prob, args.pair_encoder, args.similarity_objective,
                          ordinal_weight, args.head_hidden, args.head_activation, adapter_config(args), run_tasks(args),
                          args.sts_cosine_dropout)
    if args.option == "pretrain":
        freeze_encoder(model)
        # STS outputs a cosine of the frozen encoder's embeddings unless a head or adapters give it weights.
        sts_trains = model.trains_with_frozen_encoder("sts")
        if trains_sts and not sts_trains:
            print("note: with --option pretrain the STS cosine has no trainable weights; "
                  "STS training steps change nothing")
    return model


def build_run(args: TrainingArguments, stages: list[Stage], data: dict, tokenizer: BertTokenizer, triplets: list,
              teacher: dict | None, device: torch.device, distributed: Distributed = SINGLE_PROCESS) -> Trainer:
    """The run's Trainer from load_inputs' and check_pretrained's results: the seeded model on its device (packed or
    padded tokens, compiled layers), the MLM head when a stage needs one, rank 0's weights on every rank, and the
    Trainer that training_args.build_trainer builds around them."""
    seed_everything(args.seed)
    model = build_model(args, "sts" in train_tasks(stages, run_tasks(args))).to(device)
    place_encoder(model.bert.encoder, device, args.compile, args.compile_mode)
    mlm_head = None
    if any(stage.kind is StageKind.MLM for stage in stages):
        mlm_head, found = load_mlm_head(args.pretrained, model.bert.config)
        mlm_head.to(device)
        print(f"mlm stage: the MLM head of {args.pretrained}" if found else
              f"mlm stage: {args.pretrained} has no MLM head; starting from a fresh one")
    distributed.start_from_one_model([model, mlm_head], args.seed)
    if distributed.enabled:
        print(f"data parallel: {distributed.world_size} processes x batch {args.batch_size} x accumulation "
              f"{args.grad_accumulation_steps} = {distributed.world_size * args.batch_size * args.grad_accumulation_steps}"
              f" examples per update; learning rate {args.lr} (not scaled with the batch)")
    trainer = build_trainer(args, model, tokenizer, data, triplets, device, mlm_head, distributed, teacher)
    if teacher is not None and "qa" in teacher:
        try:  # the teacher's SQuAD windows must be the student's: the same ids and token counts
            teacher["qa"].check_windows(trainer.tokenized_split("qa", data["qa"].train))
        except ScoresFileError as err:
            raise UsageError(str(err)) from None
    return trainer
