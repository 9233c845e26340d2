"""Ensembles of finished runs: their saved scores (RUN/scores/, minbert/data/scores.py) combined into the leaderboard
CSVs (the six of the course's three tasks, or those of the tasks the runs trained), without running any model again.

    python scripts/ensemble.py runs/a runs/b runs/c --output_dir runs/ensemble --data_dir data
    python scripts/ensemble.py runs/* --output_dir runs/ensemble --data_dir data --select      # greedy, on dev

SST and QQP (and any classification task): majority vote of the members' predictions (ties go to the class with
the higher mean probability) or the class of the mean probability (`mean`). STS: the mean of the members' 0-5
scores or their mean weighted by each member's dev Pearson r (`weighted`). Each task has a flag of its own
(--sst, --qqp, --sts, ...) naming its method. Members may differ in anything
(pooling, pair encoder, adapters, model size) as long as they answered the same examples.

--select picks each task's members by greedy forward selection with replacement on dev (Caruana et
al. 2004): start from the best member, add whichever member (again, if it helps) most improves the
dev metric, keep the best prefix. Its dev scores are then optimistic (the dev set chose the members),
and so are `weighted`'s, slightly; quote test scores for a dev-selected ensemble. Without test labels,
the held-out figure that --select also prints is the honest one: members chosen on a random half of
dev and the ensemble scored on the other half, both ways, averaged over five random halvings.

The dev metrics printed and written to OUTPUT_DIR/ensemble.json need the dev labels: --data_dir
holds the course files (as for training). A member's files must be its own: decided as the run decided its CSVs,
its dev scores score the dev metric its best.json records, and its calibration.json (--calibrated) records those
accuracies; a file copied from another run is refused in one line naming it, before anything is written.

--calibrated combines each member's calibrated probabilities of the calibrated tasks (SST, QQP): its logits divided
by the temperature fitted on its own dev set (RUN/calibration.json, which a run writes at its end and
scripts/calibrate.py writes for an older run). A mean then averages calibrated probabilities, and a vote's ties go to
the higher mean calibrated probability; each member's own predictions do not change.

--score_train makes the ensemble a teacher: the chosen members' train scores (each run written with
--score_train) combined into OUTPUT_DIR/scores/TASK-train.csv, which `multitask_classifier.py --distill
OUTPUT_DIR` learns from (distillation.py), with OUTPUT_DIR/scores/train.json tying them to this ensemble (each
member's own scores/train.json is checked the same way before they are read). A run scores the train splits of the
tasks it trained, so an ensemble of one task's specialists teaches that task alone (`--distill_override
qqp:teacher=OUTPUT_DIR`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation import summarize_line, write_predictions
from minbert.arguments import OneLineErrorParser
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.data.scores import ScoresFileError, scores_path, write_scores
from minbert.files import (atomic_write_text, describe_os_error, forbidden_output, locked_folder, remove_files,
                           unwritable_folder)
from minbert.prediction.ensemble_scores import (HELD_OUT_REPEATS, METHODS, EnsembleError, build_ensemble, calibrate,
                                                dev_labels, ensemble_train_scores, load_members, member_tasks)
from minbert.run.run_outputs import check_run_dev, leaderboard_files
from minbert.tasks import TASKS, default_output
from minbert.tasks.calibration import read_calibration
from minbert.tasks.score_files import train_record_path, write_train_record


def output_files(output_dir: Path) -> list[Path]:
    """Every file an ensemble may write in OUTPUT_DIR: each task's leaderboard files, ensemble.json, teacher scores."""
    return [*(output_dir / Path(default_output(task, split)).name for task in METHODS for split in ("dev", "test")),
            output_dir / "ensemble.json", *(scores_path(output_dir, task, "train") for task in METHODS)]


def replaces_member_file(output_dir: Path, runs: list[str]) -> str | None:
    """Why OUTPUT_DIR must not be written, or None: an output would replace a member's leaderboard file (where its
    best.json records it, often a folder beside the run's: the audit's R/B held B's sst-dev-out.csv) or a file the
    ensemble reads (a member's scores/, its calibration.json)."""
    for run in map(Path, runs):
        try:
            owned = {path.resolve() for path in leaderboard_files(run)}
        except DataError as err:  # a member whose record is damaged cannot say which files are its own
            return str(err)
        for path in output_files(output_dir):
            if path.resolve() in owned:
                return f"--output_dir {output_dir}: its {path.name} would replace the member {run}'s own " \
                       f"({path}); write elsewhere"
            problem = forbidden_output("--output_dir", path, reads=[run / "scores", run / "calibration.json"])
            if problem:
                return problem
    return None


def checked_members(runs: list[str], data_dir: str, calibrated: bool) -> tuple[list, dict]:
    """The members (load_members; `calibrated` ones if asked) and the gold dev labels per task, each member's dev
    scores and calibration.json checked to be its own (check_run_dev: a copy of another run's scores its metric, not
    the one the member's best.json records) before its logits are divided by the temperature."""
    members = load_members(runs)
    tasks = member_tasks(members)
    gold = dev_labels(data_dir, {task: members[0].scores[(task, "dev")][0] for task in tasks})
    for member in members:
        check_run_dev(member.run_dir, {task: (member.scores[(task, "dev")][1], gold[task]) for task in tasks},
                      read_calibration(member.run_dir) if calibrated else None)
        if calibrated:
            calibrate(member)
    return members, gold


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="finished runs' output folders (each with scores/)")
    parser.add_argument("--output_dir", required=True, help="where the CSVs and ensemble.json go")
    parser.add_argument("--data_dir", default="data", help="the course files, for the dev labels")
    for task, methods in METHODS.items():
        parser.add_argument(f"--{task}", choices=methods, default=methods[0])
    parser.add_argument("--select", action="store_true", help="greedy forward selection of members per task on dev")
    parser.add_argument("--calibrated", action="store_true", help="combine calibrated probabilities: each member's "
                        "logits divided by the temperature fitted on its dev set (RUN/calibration.json)")
    parser.add_argument("--score_train", action="store_true",
                        help="also write the chosen members' combined train scores (OUTPUT_DIR/scores/TASK-train.csv; "
                             "each member written with --score_train): a teacher for --distill")
    args = parser.parse_args(argv)
    show_data_warnings_on_one_line()
    output_dir = Path(args.output_dir)
    problem = unwritable_folder(output_dir) or forbidden_output("--output_dir", output_dir)  # a run's CSVs
    if any(output_dir.resolve() == Path(run).resolve() for run in args.runs):
        problem = f"{output_dir}: a member's own folder; the ensemble's files would replace its (its train scores too)"
    problem = problem or replaces_member_file(output_dir, args.runs)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        members, gold = checked_members(args.runs, args.data_dir, args.calibrated)
        tasks = member_tasks(members)
        predictions, report = build_ensemble(members, gold, {t: getattr(args, t) for t in tasks}, args.select)
        train_scores = ensemble_train_scores(report) if args.score_train else {}
    except (ScoresFileError, DataError, EnsembleError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        with locked_folder(output_dir):
            for (task, split), predicted in predictions.items():
                path = output_dir / Path(default_output(task, split)).name
                write_predictions(path, members[0].scores[(task, split)][0], predicted.tolist(), task)
            atomic_write_text(output_dir / "ensemble.json", json.dumps(report, indent=2) + "\n")
            write_teacher(output_dir, train_scores)
    except DataError as err:  # the folder's lock: another ensemble writing there now
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    print_report(report, args.select, len(predictions), train_scores, output_dir)
    return 0


def write_teacher(output_dir: Path, train_scores: dict) -> None:
    """--score_train's combined train scores and scores/train.json, which ties them to this ensemble (ensemble.json's
    SHA-256 stands for a run's weights); an earlier ensemble's teacher scores of a task this one does not teach (or
    their record) would still teach --distill, so they go."""
    for task, (ids, scores) in train_scores.items():
        write_scores(scores_path(output_dir, task, "train"), ids, scores, task)
    remove_files(scores_path(output_dir, task, "train") for task in METHODS if task not in train_scores)
    if train_scores:
        write_train_record(output_dir, [scores_path(output_dir, task, "train") for task in train_scores],
                           "ensemble.json")
    else:
        remove_files([train_record_path(output_dir)])


def print_report(report: dict, selected: bool, csvs: int, train_scores: dict, output_dir: Path) -> None:
    """The members' and the ensemble's dev figures (held out too, after --select) and what was written."""
    for task, info in report["tasks"].items():
        print(f"{task}: members on dev {', '.join(f'{v:.4f}' for v in info['members_dev'])} -> ensemble "
              f"{info['ensemble_dev']:.4f} ({len(info['chosen'])} chosen)")
    print("ensemble on dev: " + summarize_line(report["dev"]))
    print(f"best member on dev: {report['best_member']['run']} (overall {report['best_member']['overall_dev']:.4f})")
    if selected or any(TASKS[t].outputs.weighs_members(report["methods"][t]) for t in report["methods"]):
        print("note: the dev set chose the members or weights, so these dev scores are optimistic; quote test scores")
    if selected:
        held_out = ", ".join(f"{t} {info['held_out_dev']:.4f}" for t, info in report["tasks"].items())
        print(f"held out (chosen on half of dev, scored on the other half, both ways, {HELD_OUT_REPEATS} random "
              f"halvings): {held_out}, "
              f"overall {report['held_out_overall']:.4f}")
    taught = f" and the train scores of {', '.join(train_scores)}" if train_scores else ""
    print(f"wrote the {csvs} CSVs and ensemble.json{taught} to {output_dir}")


if __name__ == "__main__":
    sys.exit(main())
