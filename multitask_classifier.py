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
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from base_bert import CheckpointError
from evaluation import summarize_line
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.data.scores import scores_path
from minbert.distributed import Distributed, data_parallel
from minbert.files import describe_os_error, remove_files
from minbert.model.checkpoint import checkpoint_folder
from minbert.reports.calibration import calibration_lines, write_calibration
from minbert.reports.embedding_analysis import MIN_TSNE_POINTS, plot_tsne, sentence_embeddings
from minbert.reports.plots import figure_problem, write_run_reports
from minbert.prediction.leaderboard import PredictionsFileError
from minbert.prediction.run_evaluation import kept_record_mismatch
from minbert.run.run_files import earlier_run_files, tsne_file
from minbert.run import run_outputs
from minbert.run.run_record import run_record, run_segments, write_run_record
from minbert.run.run_setup import build_run, check_pretrained, finished_run, load_inputs, resume_prefix, resuming
from minbert.run.training_args import (TrainingArguments, UsageError, check_resume_arguments, parse_training_args,
                                       prediction_paths, saved_schedule_length)
from minbert.runtime import compile_notice, precision_notice
from minbert.step_log import TrainingDiverged
from minbert.tasks import RUN_TASKS, TASKS
from minbert.tasks.score_files import as_saved, write_train_record
from minbert.training.distillation import DISTILLED_TASKS
from minbert.training.checkpoint_files import (FINISHED_FILE, folder_size, human_size, make_last, remove_resume_state,
                                               resume_state_files)
from minbert.training.trainer import Trainer
from minbert.training.training_state import check_resumable, kept_inside_stage, read_training_state, saved_position

ROOT = Path(__file__).resolve().parent


def parse_args(argv=None) -> TrainingArguments:
    return parse_training_args(argv, __doc__)


def write_leaderboard_files(trainer: Trainer, paths: dict, dev_scores: dict, run_dir: Path) -> None:
    """Each task's leaderboard file (the six CSVs, SQuAD's prediction JSONs) and, for ensembles, the scores it was
    decided from (run_dir/scores/): dev from the scores already computed, test predicted now (by every rank,
    written by rank 0), decided under the settings chosen on dev (trainer.evaluator.chosen: SQuAD's no-answer
    threshold)."""
    for split in ("dev", "test"):
        for task in trainer.tasks:
            if split == "test" and trainer.data[task].test is None:
                continue  # no test file where the task's is optional (SQuAD's: load_inputs said so)
            scores = (dev_scores[task] if split == "dev"
                      else TASKS[task].outputs.predict_scores(trainer.predictor, trainer.data[task].test))
            if trainer.distributed.is_main:
                written = TASKS[task].outputs.write_outputs(scores, paths[(task, split)], scores_path(run_dir, task, split),
                                                    trainer.evaluator.chosen)
                print(f"wrote {paths[(task, split)]} ({written})")


def write_train_scores(trainer: Trainer, run_dir: Path) -> None:
    """--score_train: the kept model's scores of every train split the run read (run_dir/scores/TASK-train.csv;
    SQuAD's windows' logits), what --distill reads from a teacher; then run_dir/scores/train.json, their SHA-256 and
    that of the kept model's weights (best.json's), which ties them to this run."""
    written = []
    for task in trainer.tasks:
        train = trainer.data[task].train
        if task not in DISTILLED_TASKS or train is None:
            continue
        scores = TASKS[task].outputs.train_scores(trainer.predictor, train)
        if trainer.distributed.is_main:
            print(f"wrote {TASKS[task].outputs.write_train_scores(run_dir, scores, trainer.task_settings)}")
            written.append(TASKS[task].outputs.train_scores_file(run_dir))
    if trainer.distributed.is_main and written:
        print(f"wrote {write_train_record(run_dir, written)}")


def write_run_calibration(dev_predictions: dict, dev_scores: dict, output_dir: Path) -> None:
    """calibration.json and the reliability diagrams of the run's calibrated tasks (SST's, QQP's), from the kept
    model's dev scores as its scores files hold them, so that scripts/calibrate.py on the finished run writes the
    same; what they say, a line per task."""
    dev = {task: (as_saved(dev_scores[task][1]), dev_predictions[task][2]) for task in dev_scores
           if TASKS[task].calibrated}
    for line in calibration_lines(write_calibration(output_dir, dev)):
        print(f"calibration: {line}")


def write_tsne(trainer: Trainer, output_dir: Path) -> None:
    """The best model's dev embeddings in 2-D, coloured by gold label, of each task that plots them (SST's), beside
    the run's other plots."""
    for task in trainer.tasks:
        if TASKS[task].plots_embeddings:
            plot_embeddings(trainer, task, output_dir / tsne_file(task))


def plot_embeddings(trainer: Trainer, task: str, path: Path) -> None:
    examples, title = trainer.data[task].dev, TASKS[task].title
    if len(examples) < MIN_TSNE_POINTS:
        print(f"note: no {path.name}: t-SNE needs at least {MIN_TSNE_POINTS} {title} dev sentences")
        return
    config = trainer.config
    embeddings = sentence_embeddings(trainer.model, task, examples, trainer.tokenizer, trainer.device,
                                     config.eval_batch_size, config.max_length, trainer.precision)
    plot_tsne({f"{title} dev, best model": embeddings}, [e.label for e in examples], path, config.seed)


def check_figure_libraries(tasks: list[str]) -> None:
    """The figures a run draws at its end (write_run_reports, write_tsne) can be drawn: a broken matplotlib or
    scikit-learn stops it now, in one line, not with a traceback once it has trained."""
    problem = figure_problem(embeddings=any(TASKS[task].plots_embeddings for task in tasks))
    if problem:
        raise UsageError(problem)


def resume(trainer: Trainer, args: TrainingArguments, prefix: Path, stage_labels: list[str]) -> None:
    """Continue from a stopped run's training state: refused, with the reason, when a setting that changes the
    result differs or the saved state does not fit this run's processes, schedule or data."""
    tensors, metadata = read_training_state(prefix)
    check_resume_arguments(metadata["args"], args)
    check_resumable(metadata, trainer.distributed.world_size, stage_labels, trainer.data_sha256,
                    prefix.with_suffix(".json"), trainer.tasks)
    if not args.resume_from:  # a rewound run's best.* may be a later stage's, which the rewind keeps on purpose
        check_kept_model(Path(args.output_dir) / "best.json", metadata["history"], prefix.with_suffix(".json"))
    schedule_length = saved_schedule_length(metadata["args"], args)
    try:
        trainer.load_state_dict(tensors, metadata, schedule_length)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        # The flags that shape the model, optimizer and SMART are those of the stopped run (checked above): what does
        # not fit them is the checkpoint's own content.
        raise CheckpointError(f"{prefix.with_suffix('.json')}, {prefix.name}.safetensors: the training state does "
                              "not fit the model, optimizer or SMART setup of its own flags "
                              f"({type(err).__name__}: {err}); the checkpoint was damaged, edited or saved by another "
                              "version of the code: resume from an intact copy or start again without --resume") from None


def check_kept_model(best: Path, history: list[dict], info: Path) -> None:
    """The kept model a resumed run would finish with (OUTPUT_DIR/best.*, read back when the run ends) is the one its
    training state's history kept: another run's best.* copied beside the state would be finished, scored and
    written out as this run's."""
    try:
        record = run_outputs.run_record(best.parent)  # best.json as every reader of runs reads it; None: none
    except PredictionsFileError as err:
        mismatch = str(err)
    else:
        mismatch = record and kept_record_mismatch(record.metrics, history)
    if mismatch:
        raise CheckpointError(f"cannot resume: {best} is not the kept model of the training state in {info} "
                              f"({mismatch}); restore the run's own best.* or start again without --resume")


def write_record(args: TrainingArguments, trainer: Trainer, output_dir: Path, device) -> None:
    """OUTPUT_DIR/args.json as the run starts or resumes (run_record.py), with the segment it begins now."""
    resolved = {"precision": trainer.precision, "device": str(device), "world_size": trainer.distributed.world_size,
                "working_dir": str(Path.cwd())}  # what the flags' relative paths are relative to
    segments = run_segments(output_dir, resuming(args), trainer.state.next_stage + 1, resolved)
    write_run_record(output_dir, run_record(dataclasses.asdict(args), resolved, ROOT, device, segments))


def run(args: TrainingArguments) -> Trainer:
    """Train, keep the best model, write the six CSVs. Under torchrun: one rank of the data-parallel run
    (distributed.py), only rank 0 printing and writing."""
    with data_parallel(args.use_gpu) as (distributed, device):
        return _run(args, distributed, device)


def _run(args: TrainingArguments, distributed: Distributed, device) -> Trainer | None:
    began = time.time()
    finished = finished_run(args)
    if finished and not args.score_train:  # --resume of a run that finished and dropped its training state
        print(finished)
        return None
    stages, data, dropped_rows, triplets, penalty_inputs = load_inputs(args)
    check_figure_libraries(list(data))
    output_dir = Path(args.output_dir)
    tokenizer = check_pretrained(args, data)
    # One run at a time in a folder: a second would interleave its metrics and checkpoints with this one's.
    with checkpoint_folder(output_dir) if distributed.is_main else nullcontext():
        if distributed.is_main and compile_notice(device, args.compile):
            print(compile_notice(device, args.compile), file=sys.stderr)
        trainer = build_run(args, stages, data, tokenizer, triplets, penalty_inputs, device, distributed)
        if distributed.is_main:
            print(precision_notice(device, args.precision, args.smart, args.smart_precision))
        if finished:  # --score_train added on --resume of a finished run: its kept model scores the train splits
            trainer.use_kept_model()
            write_train_scores(trainer, output_dir)
            return trainer
        start_or_resume(trainer, args, stages)
        trainer.train(stages)
        if trainer.state.next_stage == len(stages):
            finish_run(trainer, args, dev_outputs(trainer), stages)
            for message in dropped_rows:
                print(f"note: not in the predictions: {message}")
        if distributed.is_main:
            print(time_summary(trainer, time.time() - began))
        return trainer


def start_or_resume(trainer: Trainer, args: TrainingArguments, stages: list) -> None:
    """Continue the stopped run in OUTPUT_DIR (--resume, --resume_from), or start a fresh one there, removing what an
    earlier run left; then OUTPUT_DIR/args.json."""
    output_dir, distributed = Path(args.output_dir), trainer.distributed
    if resuming(args):
        prefix = resume_prefix(args)
        resume(trainer, args, prefix, [stage.label for stage in stages])
        if distributed.is_main:  # it will say again whether it finishes
            remove_files([output_dir / FINISHED_FILE])
        if distributed.is_main and args.resume_from:
            later = make_last(prefix)
            count = len({path.with_suffix("") for path in later})
            print(f"resuming from {prefix}" + (f"; the {count} checkpoint(s) saved after it are removed" if later
                                               else ""))
        if trainer.state.stage is not None:
            print(f"resuming inside stage {trainer.state.next_stage + 1} of {len(stages)}: the checkpoint "
                  f"{kept_inside_stage(trainer.state.stage.saved)}")
        else:
            print(f"resuming after stage {trainer.state.next_stage} of {len(stages)}")
    elif distributed.is_main:
        predictions = prediction_paths(args.prediction_files, output_dir, RUN_TASKS)
        earlier = earlier_run_files(output_dir, list(predictions.values()))
        removed = remove_files(earlier)
        if removed:
            print(f"note: starting a fresh run in {output_dir}; the earlier run's {len(removed)} files there "
                  "(checkpoints, metrics, scores, plots, predictions, robustness/'s results and perturbed sets) are "
                  "removed (use --resume to continue instead)")
    if distributed.is_main:  # a resumed run's record holds the settings it continues with, and its segments
        write_record(args, trainer, output_dir, device=trainer.device)


def dev_outputs(trainer: Trainer) -> tuple[dict, dict, dict]:
    """The kept model back in place, and its dev metrics, predictions and scores (SQuAD's no-answer threshold is
    the one chosen on dev when it was evaluated)."""
    best_metrics, dev_predictions, dev_scores = trainer.use_kept_model()
    print("best model on dev: " + summarize_line(best_metrics))
    return best_metrics, dev_predictions, dev_scores


def finish_run(trainer: Trainer, args: TrainingArguments, dev: tuple[dict, dict, dict], stages: list) -> None:
    """The finished run's files: the leaderboard files, --score_train's scores, the reports and plots; then its
    training state goes (unless --keep_resume_state) and its folder's size is said."""
    _, dev_predictions, dev_scores = dev
    output_dir = Path(args.output_dir)
    write_leaderboard_files(trainer, prediction_paths(args.prediction_files, output_dir, trainer.tasks), dev_scores,
                            output_dir)
    if args.score_train:
        write_train_scores(trainer, output_dir)
    if not trainer.distributed.is_main:
        return
    table = write_run_reports(trainer.state.history, dev_predictions, output_dir)
    if table:
        print(table)
    write_run_calibration(dev_predictions, dev_scores, output_dir)
    write_tsne(trainer, output_dir)
    state_size = sum(path.stat().st_size for path in resume_state_files(output_dir))
    removed = remove_resume_state(output_dir, [stage.label for stage in stages], args.keep_resume_state)
    print(f"run folder {output_dir}: {human_size(folder_size(output_dir))}"
          + (f" (its training state, {human_size(state_size)}, removed: --keep_resume_state keeps it)" if removed
             else f" (with its training state, {human_size(state_size)}: --keep_resume_state)"))


def time_summary(trainer: Trainer, seconds: float) -> str:
    """Where this process's time went: training, evaluation, checkpoints, and the rest (loading the data and the
    model, the test predictions, the reports and plots)."""
    spent = trainer.spent
    parts = {"training": spent.training, "evaluation": spent.evaluation, "checkpoints": trainer.seconds_saving}
    other = seconds - sum(parts.values())
    # Two decimals: a tiny run's checkpoints take a few hundredths of a second, which one decimal shows as 0.0.
    return (f"time: {seconds:.2f} s, " + ", ".join(f"{name} {value:.2f} s" for name, value in parts.items())
            + f", other {other:.2f} s (loading, predictions, reports)")


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
