"""Markdown rows for RESULTS.md from finished runs: the model kept (best overall dev score) of each run,
and mean ± sample std over the runs when more than one is given (e.g. the seeds of one configuration).
Runs with SQuAD (--tasks ...,qa) get its columns too; a SQuAD-only run gets only them, and a run of one task
(scripts/cpu_best_one_task.sh) that task's. Sequential runs also get the continual-learning figures of their
stages (evaluation.ForgettingMeasures): the average task score after the last stage, backward transfer and the
mean forgetting, with each earlier task's forgetting on a line of its own under the table.

    python scripts/summarize_runs.py results/cpu_sbert results/cpu_sbert_seeds/cpu_sbert_s1 results/cpu_sbert_seeds/cpu_sbert_s2

--each_task_best adds, per run, each task's best dev score over the stages and the overall score of the three:
what a run would keep if it kept each task at its own best stage, which only a model whose trained parts are
all per task (per-task adapters over a frozen encoder) could do.

Each run is given once (the same folder twice, however spelled, would weigh it double in the mean), and the runs of
a mean trained the same tasks (those whose scores their kept models record): a mean of overall scores over different
task sets mixes figures that measure different things. A run's history.json must hold its best.json's record of the
kept model (another run's history would give the row that run's final score, minutes and forgetting), and a damaged
record (a score that is not a finite number) is refused, not printed or averaged.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import NoReturn

from evaluation import history_forgetting_measures, overall_of
from minbert.arguments import OneLineErrorParser
from minbert.files import repeated_run
from minbert.prediction.run_evaluation import kept_record_mismatch
from minbert.tasks import MULTITASK, RUN_TASKS, TASKS

COLUMNS = [("SST acc", "sst_acc"), ("SST F1 (w)", "sst_f1_weighted"), ("QQP acc", "qqp_acc"),
           ("QQP F1", "qqp_f1"), ("QQP F1 (w)", "qqp_f1_weighted"), ("STS r", "sts_pearson"),
           ("STS rho", "sts_spearman"), ("overall", "overall")]
# The continual-learning figures' columns, after the training minutes; a run whose schedule has none (a
# multi-task or one-task run) leaves them out of the table.
FORGETTING_COLUMNS = [("avg score after last stage", "average_score"), ("BWT", "backward_transfer"),
                      ("mean forgetting", "average_forgetting")]
QA_COLUMNS = [("SQuAD EM", "qa_em"), ("SQuAD F1", "qa_f1"), ("has-answer F1", "qa_has_answer_f1"),
              ("no-answer F1", "qa_no_answer_f1"), ("F1 at τ = 0", "qa_f1_at_0")]
# The score of the "final" column: the first of these a run's records have.
FINAL = [("overall", "overall"), ("SQuAD F1", "qa_f1"), ("SST acc", "sst_acc"), ("QQP acc", "qqp_acc"),
         ("STS r", "sts_pearson")]
# What the table reads of a record as a number (the forgetting figures read its task scores): a damaged record's
# string or NaN there would be printed, or averaged, as a score.
NUMBERS = [key for _, key in COLUMNS + QA_COLUMNS] + ["seconds"]


def read_run(run: Path) -> dict:
    """The kept model's dev metrics, the stage it came from, the run's training minutes and, for a sequential run,
    the continual-learning figures of its stages."""
    try:
        history = read_json(run / "history.json")
        kept = read_json(run / "best.json") if (run / "best.json").exists() else None
    except ValueError as err:
        refuse(run, f"not a finished run ({err})")
    problem = records_problem(history, kept)
    if problem:
        refuse(run, problem)
    try:
        # Folders published without best.json hold runs made before runs kept the best score over the tasks
        # they train (evaluation.kept_model_score): those kept the first stage with the highest overall dev
        # score (never the pretrained row), which is what this reproduces.
        best = kept["metrics"] if kept is not None else max(history[1:], key=lambda record: record["overall"])
        three_tasks = "overall" in history[-1]
        each_task = each_task_best(history[1:]) if three_tasks else "(not a three-task run)"
        values = {key: best[key] for _, key in run_columns(best)}
        final = history[-1][final_metric(best)[1]]
    except KeyError as err:
        refuse(run, f"not a finished run (its records lack {err})")
    measures = history_forgetting_measures(history)
    forgetting = {} if measures is None else {key: getattr(measures, key) for _, key in FORGETTING_COLUMNS}
    tasks = tuple(task for task in RUN_TASKS if TASKS[task].model.score_key in best)
    return {**values, "tasks": tasks, "best_after": f"stage {best['index']} ({best['stage']})", "final": final,
            "train_minutes": sum(record.get("seconds", 0.0) for record in history[1:]) / 60,
            "each_task_best": each_task, **forgetting,
            "forgetting": {} if measures is None else measures.forgetting}


def refuse(run: Path, problem: str) -> NoReturn:
    print(f"error: {run}: {problem}", file=sys.stderr)
    raise SystemExit(2) from None


def records_problem(history, kept) -> str | None:
    """Why a run's history.json (`history`) and best.json (`kept`, None when the folder has none) cannot be
    summarised, or None: a damaged record (the numbers the table shows, finite ones), or a history.json that is
    not the history of best.json's kept model (another run's: its rows would mix the two runs)."""
    if not (isinstance(history, list) and all(isinstance(record, dict) for record in history)):
        return "history.json is not a list of stage records"
    if len(history) < 2:
        return "not a finished run (history.json has no trained stage)"
    if kept is not None and not (isinstance(kept, dict) and isinstance(kept.get("metrics"), dict)):
        return "best.json holds no metrics of a kept model"
    records = [(f"history.json's record {position}", record) for position, record in enumerate(history)]
    records += [("best.json's metrics", kept["metrics"])] if kept is not None else []
    for name, record in records:
        if not (isinstance(record.get("stage"), str) and type(record.get("index")) is int):
            return f"{name}: no stage label and index"
        damaged = next((key for key in NUMBERS if key in record and not finite_number(record[key])), None)
        if damaged:
            return f"{name}: {damaged} is {record[damaged]!r}, not a finite number (a damaged record)"
    if kept is None:
        return None
    if not any(key in kept["metrics"] for _, key in FINAL):
        return "best.json's metrics hold no task's score"
    mismatch = kept_record_mismatch(kept["metrics"], history)
    return None if mismatch is None else f"history.json is not the history of best.json's kept model ({mismatch})"


def finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_rows(runs: list[Path]) -> dict[str, dict]:
    """Each run's row by its folder's name (its path where two folders share a name: each keeps its row)."""
    rows: dict[str, dict] = {}
    for run in runs:
        rows[run.name if run.name not in rows else str(run)] = read_run(run)
    return rows


def mixed_tasks(rows: dict[str, dict]) -> str | None:
    """Why the rows' mean would average runs of different tasks, or None."""
    (first, row), *others = rows.items()
    other = next((name for name, found in others if found["tasks"] != row["tasks"]), None)
    if other is None:
        return None
    return (f"{other} trained {','.join(rows[other]['tasks'])}, {first} {','.join(row['tasks'])}: a mean over runs "
            "of different tasks mixes their overall scores; summarize them apart")

def read_json(path: Path):
    """A run's JSON file; ValueError saying in words what is wrong with it (no errno text)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {path.name}") from None
    except OSError as err:
        raise ValueError(f"{path.name} cannot be read: {err.strerror or err}") from None
    except ValueError as err:  # not UTF-8, not JSON
        raise ValueError(f"{path.name} is not JSON: {err}") from None


def run_columns(record: dict) -> list[tuple[str, str]]:
    """The columns a run's records have: the three tasks' (with the overall score) or one task's, and SQuAD's."""
    return [(name, key) for name, key in COLUMNS + QA_COLUMNS if key in record]


def final_metric(record: dict) -> tuple[str, str]:
    return next((name, key) for name, key in FINAL if key in record)


def each_task_best(stages: list[dict]) -> str:
    """'SST 0.471 (stage 4), QQP 0.832 (stage 8), STS 0.879 (stage 6): overall 0.7475' over a run's stage records."""
    keys = {TASKS[task].title: TASKS[task].model.score_key for task in MULTITASK}
    best = {key: max(stages, key=lambda record: record[key]) for key in keys.values()}
    overall = overall_of({key: record[key] for key, record in best.items()})
    parts = [f"{name} {best[key][key]:.3f} (stage {best[key]['index']})" for name, key in keys.items()]
    return ", ".join(parts) + f": overall {overall:.4f}"


def digits(key: str) -> int:
    return 1 if key == "train_minutes" else 3


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (--output_dir of multitask_classifier.py)")
    parser.add_argument("--each_task_best", action="store_true",
                        help="also print each task's best stage and their overall score, per run")
    args = parser.parse_args(argv)
    problem = repeated_run(args.runs)
    rows = {} if problem else read_rows(args.runs)
    problem = problem or mixed_tasks(rows)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    columns = [(name, key) for name, key in COLUMNS + QA_COLUMNS if all(key in row for row in rows.values())]
    after = [("train min", "train_minutes")] + [(name, key) for name, key in FORGETTING_COLUMNS
                                                 if all(key in row for row in rows.values())]
    final = "final " + final_metric(dict.fromkeys(key for _, key in columns))[0]
    print("| run | " + " | ".join(name for name, _ in columns) + f" | best after | {final} | "
          + " | ".join(name for name, _ in after) + " |")
    print("|---" * (len(columns) + len(after) + 3) + "|")
    for name, row in rows.items():
        cells = [f"{row[key]:.3f}" for _, key in columns]
        print(f"| {name} | " + " | ".join(cells) + f" | {row['best_after']} | {row['final']:.3f} | "
              + " | ".join(f"{row[key]:.{digits(key)}f}" for _, key in after) + " |")
    if len(rows) > 1:
        cells = []
        for key in [key for _, key in columns] + ["final"] + [key for _, key in after]:
            values = [row[key] for row in rows.values()]
            cells.append(f"{statistics.mean(values):.{digits(key)}f} ± {statistics.stdev(values):.{digits(key)}f}")
        print(f"| mean ± std ({len(rows)} runs) | " + " | ".join(cells[:len(columns)]) + " | — | "
              + " | ".join(cells[len(columns):]) + " |")
    for name, row in rows.items():
        if row["forgetting"]:
            print(f"{name}, forgetting per earlier task (Chaudhry et al. 2018): "
                  + ", ".join(f"{task} {value:.4f}" for task, value in row["forgetting"].items()))
    if args.each_task_best:
        for name, row in rows.items():
            print(f"{name}, each task at its best stage: {row['each_task_best']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
