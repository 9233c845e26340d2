"""MultitaskBERT: one shared minBERT for SST-5 sentiment, Quora paraphrase (QQP) and STS-B similarity.

The default schedule follows the SMART-SBERT thesis: an optional SimCSE stage on NLI, one full QQP
epoch, then R cycles of [one STS epoch, one SST epoch, a small QQP rehearsal], evaluating all three
dev sets after every stage and keeping the model with the best overall dev score. It ends by writing
the six leaderboard CSVs.

    python multitask_classifier.py --demo                                   # offline, 2 CPU cores, < 3 min
    python multitask_classifier.py --demo --tasks qa                        # SQuAD 2.0 question answering
    python multitask_classifier.py --use_gpu --option finetune --data_dir data --smart   # the real run
    python multitask_classifier.py --help                                   # every flag, by feature
"""
from __future__ import annotations

import dataclasses
import re
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path

from base_bert import CheckpointError, pretrained_config
from bert import BertModel
from datasets import DataError, DataWarning, load_task_data, show_data_warnings_on_one_line, subsample
from distillation import DISTILLED_TASKS, SOFTENED_TASKS, load_teacher
from distributed import Distributed, data_parallel
from embedding_analysis import MIN_TSNE_POINTS, plot_tsne, sentence_embeddings
from evaluation import summarize_line, write_predictions
from files import describe_os_error, locked_folder, remove_files
from mlm import load_mlm_head
from multitask_bert import MultitaskBERT, freeze_encoder
from nli import load_nli_triplets
from plots import write_run_reports
from run_record import RECORD_FILE, run_record, write_run_record
from runtime import place_encoder, precision_notice, seed_everything
from schedules import Stage, StageKind, build_schedule, train_tasks
from scores import (ScoresFileError, as_saved, scores_path, span_logits_path, write_qa_scores, write_scores,
                    write_span_logits)
from squad import check_window_room, predictions, write_squad_predictions
from step_log import STEPS_FILE, TENSORBOARD_DIR
from tasks import MULTITASK, RUN_TASKS, SPLITS, TASKS, default_output
from tokenizer import BertTokenizer
from trainer import Trainer, TrainingDiverged, decide
from training_state import check_resumable, kept_inside_stage, read_training_state, saved_position
from training_args import (TrainingArguments, UsageError, adapter_config, build_parser, build_trainer,
                           check_max_length, check_resume_arguments, check_writable, data_paths, distill_settings,
                           distill_teachers, follow_output_dir, from_namespace, lnsr_config, parse_tasks,
                           prediction_paths, read_config, run_tasks)

ROOT = Path(__file__).resolve().parent
DEMO_SETTINGS = dict(data_dir=str(ROOT / "data" / "demo"), pretrained="minilm-l6", option="finetune",
                     batch_size=16, lr=5e-5, hidden_dropout_prob=0.1, first_stages="qqp", cycle="sts,sst,qqp:0.25",
                     cycles=2, smart=True, max_length=64, qa_max_length=128, qa_doc_stride=32, output_dir="runs/demo")


def parse_args(argv=None) -> TrainingArguments:
    parser = build_parser(TrainingArguments, __doc__)
    parser.add_argument("--config", metavar="FILE", help="settings from a JSON file: a run's OUTPUT_DIR/args.json "
                        "(its \"args\") or an object of settings named as the flags; flags given here win "
                        "(docs/command_line.md, 'A run is its own recipe')")
    namespace = parser.parse_args(argv)
    settings = {}
    if namespace.demo:
        # The demo's settings become the defaults, so every flag given (abbreviated too) still wins.
        settings = dict(DEMO_SETTINGS)
        try:
            three_tasks = parse_tasks(namespace.tasks) == MULTITASK
        except ValueError as err:
            parser.error(f"--tasks: {err}")
        if not three_tasks:  # its stages are the three tasks'; other tasks get their own default stages
            del settings["first_stages"], settings["cycle"]
    config = {}
    if namespace.config is not None:
        try:
            config = read_config(TrainingArguments, namespace.config)
        except ValueError as err:
            parser.error(str(err))
        settings |= config  # a recipe holds the demo's settings already; its own values win over them
    if settings:
        parser.set_defaults(**settings)
        namespace = parser.parse_args(argv)
    try:
        args = from_namespace(TrainingArguments, namespace)
    except ValueError as err:
        parser.error(str(err))
    if "output_dir" in config:
        args.prediction_files = follow_output_dir(args.prediction_files, config, config["output_dir"], args.output_dir)
    return args


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


# What a run writes in its folder besides checkpoints and scores (trainer.py, plots.write_run_reports, write_sst_tsne).
RUN_REPORTS = (RECORD_FILE, "metrics.jsonl", STEPS_FILE, "history.json", "forgetting.md", "forgetting_matrix.png",
               "training_curves.png", "sst_error_histogram.png", "qqp_confusion_matrix.png", "sts_scatter.png",
               "sst_tsne.png")
CHECKPOINT = re.compile(r"(last|best|stage_\d+)\.(json|safetensors)(\.tmp)?")


def earlier_run_files(output_dir: Path, predictions: list[Path]) -> list[Path]:
    """The files an earlier run may have left in OUTPUT_DIR: its checkpoints, reports, plots and scores/, and the
    leaderboard files of any task in its predictions folders inside OUTPUT_DIR (a run of other tasks leaves some)."""
    files = [output_dir / name for name in RUN_REPORTS]
    files += (output_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*")  # --report_to tensorboard's
    files += [path for path in output_dir.glob("*") if CHECKPOINT.fullmatch(path.name)]
    files += [scores_path(output_dir, task, split) for task in RUN_TASKS for split in SPLITS]
    files.append(span_logits_path(output_dir))
    folders = {output_dir / "predictions"} | {path.parent for path in predictions
                                              if path.resolve().is_relative_to(output_dir.resolve())}
    files += [folder / Path(default_output(task, split)).name for folder in folders
              for task in RUN_TASKS for split in ("dev", "test")]
    return files


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


def write_leaderboard_files(trainer: Trainer, paths: dict, dev_scores: dict, run_dir: Path) -> None:
    """The six CSVs (and SQuAD's two prediction JSONs) and, for ensembles, the scores they were decided from
    (run_dir/scores/): dev from the scores already computed, test predicted now (by every rank, written by
    rank 0); SQuAD's answers use the no-answer threshold trainer.qa_threshold."""
    for split in ("dev", "test"):
        for task in trainer.tasks:
            if TASKS[task].is_extractive:
                if split == "test" and trainer.data[task].test is None:
                    continue  # no SQuAD test file (load_inputs said so)
                answers = dev_scores[task] if split == "dev" else trainer.answer(trainer.data[task].test)
                if trainer.distributed.is_main:
                    write_squad_predictions(paths[(task, split)], predictions(answers, trainer.qa_threshold))
                    write_qa_scores(scores_path(run_dir, task, split), answers)
                    print(f"wrote {paths[(task, split)]} ({len(answers)} questions, no-answer threshold "
                          f"{trainer.qa_threshold:.4f})")
                continue
            if split == "dev":
                ids, scores = dev_scores[task]
            else:
                ids, scores = trainer.predict(task, trainer.data[task].test, scores=True)
            if trainer.distributed.is_main:
                scores = as_saved(scores)  # what an ensemble reads back, so that it decides the same CSVs
                predicted = decide(trainer.model, task, scores)
                write_predictions(paths[(task, split)], ids, predicted.tolist(), task)
                write_scores(scores_path(run_dir, task, split), ids, scores, task)
                print(f"wrote {paths[(task, split)]} ({len(ids)} rows)")


def write_train_scores(trainer: Trainer, run_dir: Path) -> None:
    """--score_train: the kept model's scores of every train split the run read (run_dir/scores/TASK-train.csv),
    what --distill reads from a teacher."""
    for task in trainer.tasks:
        train = trainer.data[task].train
        if task not in DISTILLED_TASKS or train is None:
            continue
        if task == "qa":
            ids, logits = trainer.span_logits(train)
            if trainer.distributed.is_main:
                write_span_logits(span_logits_path(run_dir), ids, logits, trainer.qa.max_length, trainer.qa.doc_stride)
                print(f"wrote {span_logits_path(run_dir)} ({len(ids)} windows)")
            continue
        ids, scores = trainer.predict(task, train, scores=True)
        if trainer.distributed.is_main:
            write_scores(scores_path(run_dir, task, "train"), ids, scores, task)
            print(f"wrote {scores_path(run_dir, task, 'train')} ({len(ids)} rows)")


def write_sst_tsne(trainer: Trainer, path: Path) -> None:
    """The best model's SST dev embeddings in 2-D, coloured by gold label, beside the run's other plots."""
    if "sst" not in trainer.data:
        return
    examples = trainer.data["sst"].dev
    if len(examples) < MIN_TSNE_POINTS:
        print(f"note: no {path.name}: t-SNE needs at least {MIN_TSNE_POINTS} SST dev sentences")
        return
    config = trainer.config
    embeddings = sentence_embeddings(trainer.model, "sst", examples, trainer.tokenizer, trainer.device,
                                     config.eval_batch_size, config.max_length, trainer.precision)
    plot_tsne({"SST dev, best model": embeddings}, [e.label for e in examples], path, config.seed)


def resume(trainer: Trainer, args: TrainingArguments, prefix: Path, stage_labels: list[str]) -> None:
    """Continue from a stopped run's training state: refused, with the reason, when a setting that changes the
    result differs or the saved state does not fit this run's processes, schedule or data."""
    tensors, metadata = read_training_state(prefix)
    check_resume_arguments(metadata["args"], args)
    check_resumable(metadata, trainer.distributed.world_size, stage_labels, trainer.data_sha256,
                    prefix.with_suffix(".json"))
    try:
        trainer.load_state_dict(tensors, metadata)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{prefix}: cannot resume with these flags; the checkpoint was saved by a "
                              f"different model, optimizer or SMART setup ({type(err).__name__}: {err})") from None


def run(args: TrainingArguments) -> Trainer:
    """Train, keep the best model, write the six CSVs. Under torchrun: one rank of the data-parallel run
    (distributed.py), only rank 0 printing and writing."""
    with data_parallel(args.use_gpu) as (distributed, device):
        return _run(args, distributed, device)


def _run(args: TrainingArguments, distributed: Distributed, device) -> Trainer:
    stages, data, dropped_rows, triplets, teacher = load_inputs(args)
    output_dir = Path(args.output_dir)
    if args.resume and not any((output_dir / name).exists() for name in ("last.json", "last.safetensors")):
        raise UsageError(f"{output_dir}: nothing to resume yet (no checkpoint saved); "
                         "start without --resume")
    tokenizer = check_pretrained(args, data)
    # One run at a time in a folder: a second would interleave its metrics and checkpoints with this one's.
    with locked_folder(output_dir) if distributed.is_main else nullcontext():
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
        trainer = build_trainer(args, model, tokenizer, data, triplets, device,
                                mlm_head, distributed, teacher)
        if teacher is not None and "qa" in teacher:
            try:  # the teacher's SQuAD windows must be the student's: the same ids and token counts
                teacher["qa"].check_windows(trainer.tokenized_split("qa", data["qa"].train))
            except ScoresFileError as err:
                raise UsageError(str(err)) from None
        if distributed.is_main:
            print(precision_notice(device, args.precision, args.smart, args.smart_precision))
        if args.resume:
            resume(trainer, args, output_dir / "last", [stage.label for stage in stages])
            if trainer.resumed is not None:
                print(f"resuming inside stage {trainer.state.next_stage + 1} of {len(stages)}: the checkpoint "
                      f"{kept_inside_stage(trainer.resumed.position)}")
            else:
                print(f"resuming after stage {trainer.state.next_stage} of {len(stages)}")
        elif distributed.is_main:
            earlier = earlier_run_files(output_dir, list(prediction_paths(args.prediction_files, RUN_TASKS).values()))
            removed = remove_files(earlier)
            if removed:
                print(f"note: starting a fresh run in {output_dir}; the earlier run's {len(removed)} files there "
                      "(checkpoints, metrics, scores, plots, predictions) are removed (use --resume to continue instead)")
        if distributed.is_main:  # a resumed run's record holds the settings it continues with
            resolved = {"precision": trainer.precision, "device": str(device), "world_size": distributed.world_size}
            write_run_record(output_dir, run_record(dataclasses.asdict(args), resolved, ROOT, device))
        trainer.train(stages)
        if trainer.state.next_stage == len(stages):
            # SQuAD's no-answer threshold is the one chosen on dev when the kept model was evaluated.
            best_metrics, dev_predictions, dev_scores = trainer.use_kept_model()
            print("best model on dev: " + summarize_line(best_metrics))
            write_leaderboard_files(trainer, prediction_paths(args.prediction_files, trainer.tasks), dev_scores, output_dir)
            if args.score_train:
                write_train_scores(trainer, output_dir)
            if distributed.is_main:
                table = write_run_reports(trainer.state.history, dev_predictions, output_dir)
                if table:
                    print(table)
                write_sst_tsne(trainer, output_dir / "sst_tsne.png")
            for message in dropped_rows:
                print(f"note: not in the predictions: {message}")
        return trainer


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    try:
        run(args)
    except (DataError, CheckpointError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk or a read-only folder while saving (files.OutputError)
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    except TrainingDiverged as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        last = Path(args.output_dir) / "last"
        position = saved_position(last)
        if position is not None:
            print(f"\ninterrupted: {last}.* {kept_inside_stage(position)} and every stage before it; rerun the same "
                  "command with --resume to continue there", file=sys.stderr)
        elif last.with_suffix(".json").is_file():
            print(f"\ninterrupted: every finished stage is saved in {last}.*; rerun the same command with --resume "
                  "to continue", file=sys.stderr)
        else:
            print("\ninterrupted before the first checkpoint was saved: there is nothing to resume; rerun the same "
                  "command (without --resume) to start again", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
