"""A finished run's outputs as the scripts that read them back find them (scripts/error_analysis.py,
scripts/compare_runs.py): the settings its best.json records and its dev CSVs with the gold labels they predict.

A run's dev CSVs are where its flags sent them (best.json records them, a relative path against the folder the run
was started in: a run told --sst_dev_out predictions/sst-dev-out.csv, as runs were by default before, wrote them
there, not in its folder), else the course's file names in the folder's predictions/ or directly in it, as the
recipes' and scripts/ensemble.py's folders hold them.

checked_predictions_and_gold reads them as scripts/compare_runs.py must: only what belongs to the run. A recorded
path may hold another run's CSV by now (two runs told the same --*_dev_out), so each CSV must score what the run
recorded of the predictions it wrote (best.json's metrics of its kept model, an ensemble's ensemble.json), and a
task the run did not train is no score of its own. check_run_dev does the same for what scripts/ensemble.py,
scripts/calibrate.py and load_run's calibrated=True read of a run: its dev scores (scores/TASK-dev.csv) and its
calibration.json.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minbert.data.batches import load_split
from minbert.files import DataError
from minbert.prediction.ensemble_scores import member_predictions
from minbert.prediction.leaderboard import PredictionsFileError, check_predictions_file
from minbert.run.run_record import recorded_path, working_dir_of
from minbert.tasks import MULTITASK, PART1_TASKS, RUN_TASKS, TASKS, default_output, output_flag, task_name
from minbert.tasks.calibration import calibration_path
from minbert.tasks.score_files import ScoresFileError, scores_path

# How far a CSV's score may be from the recorded one beyond what the CSV's rounding explains (TaskOutputs.
# rounding_effect: STS's 6 significant digits): one changed prediction of 40,000 QQP pairs moves the accuracy by 2.5e-5.
METRIC_TOLERANCE = 1e-6
DEFAULT_TASKS = "sst,qqp,sts"  # what a run recorded before --tasks existed trained


def run_settings(run: Path) -> dict:
    """The flags a run was trained with, as its best.json records them ({} for a folder without one: an ensemble's).
    A best.json that is there but unreadable is a DataError naming it, never {}: read as no record, the run's CSVs
    recorded elsewhere would go unguarded (calibrate.py's --threshold_out) and its folder's stale ones read as its."""
    source = run / "best.json"
    if not source.exists():
        return {}
    try:
        record = json.loads(source.read_text(encoding="utf-8"))
    except OSError as err:
        raise DataError(source, f"cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise DataError(source, "not UTF-8 text: a damaged run record") from None
    except ValueError as err:
        raise DataError(source, f"not JSON ({err}): a damaged run record") from None
    settings = record.get("args", {}) if isinstance(record, dict) else None
    if not isinstance(settings, dict):
        raise DataError(source, "not a run record (a JSON object whose args are an object): a damaged run record")
    return settings


def damaged_record(run: Path) -> str | None:
    """Why the run's best.json cannot be read (run_settings's DataError), or None: for a command line to refuse the
    run in one line before it reads or writes anything of it."""
    try:
        run_settings(run)
    except DataError as err:
        return str(err)
    return None


def dev_csv(run: Path, task: str) -> Path:
    name = Path(default_output(task, "dev")).name
    settings = run_settings(run)
    written = settings.get("prediction_files", {})
    recorded = written.get(output_flag(task, "dev")) if isinstance(written, dict) else None
    candidates = [recorded_path(recorded, working_dir_of(run, settings))] if isinstance(recorded, str) else []
    candidates += [run / "predictions" / name, run / name]
    return next((path for path in candidates if path.is_file()), candidates[-1])


@dataclass(frozen=True)
class RunRecord:
    """What a folder recorded of the dev predictions it wrote: the file, its dev metrics and the tasks trained."""
    source: Path
    metrics: dict
    tasks: tuple[str, ...]


def run_record(run: Path) -> RunRecord | None:
    """best.json's record (a run's kept model) or ensemble.json's (scripts/ensemble.py's), or None for a folder with
    neither, whose CSVs are its own (nothing recorded sends them elsewhere); PredictionsFileError for one unreadable."""
    for name in ("best.json", "ensemble.json"):
        source = run / name
        if not source.is_file():
            continue
        try:
            record = json.loads(source.read_text(encoding="utf-8"))
            ensemble = name == "ensemble.json"
            named = record["tasks"] if ensemble else (record.get("args", {}).get("tasks") or DEFAULT_TASKS).split(",")
            trained = {task_name(task, RUN_TASKS) for task in named}
            return RunRecord(source, dict(record["dev" if ensemble else "metrics"]),
                             tuple(task for task in RUN_TASKS if task in trained))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise PredictionsFileError(f"{source}: no dev metrics and tasks to check CSVs against ({err})") from None
    return None


def checked_predictions_and_gold(run: Path, data_dir: Path) -> dict[str, tuple[list, list]]:
    """predictions_and_gold of a run that trained the three tasks, each CSV scoring the dev metric the run recorded
    (within METRIC_TOLERANCE); PredictionsFileError naming the run or the CSV otherwise."""
    record = run_record(run)
    untrained = [task for task in MULTITASK if record is not None and task not in record.tasks]
    if untrained:
        raise PredictionsFileError(f"{run}: trained {','.join(record.tasks)} ({record.source.name}), not "
                                   f"{untrained[0]}: no {untrained[0]} predictions of its own to compare")
    pairs = predictions_and_gold(run, data_dir)
    if record is not None:
        for task, (predictions, gold) in pairs.items():
            _check_score(dev_csv(run, task), task, predictions, gold, record)
    return pairs


def _check_score(csv: Path, task: str, predictions: list, gold: list, record: RunRecord) -> None:
    tolerance = METRIC_TOLERANCE + TASKS[task].outputs.rounding_effect(np.asarray(predictions, dtype=np.float64))
    problem = _score_problem(csv, task, predictions, gold, record, tolerance)
    if problem:
        raise PredictionsFileError(problem + ": not this run's predictions")


def _score_problem(path: Path, task: str, predictions, gold, record: RunRecord, tolerance: float) -> str | None:
    """Why `path`'s predictions are not those whose dev metric `record` holds (their score_key's metric further than
    `tolerance` from the recorded one, or none recorded), or None."""
    key = TASKS[task].model.score_key
    recorded = record.metrics.get(key)
    if not isinstance(recorded, (int, float)):
        return f"{record.source}: records no {key} to check {path} against"
    scored = float(TASKS[task].model.resampled_scores(np.asarray(predictions, dtype=np.float64)[None, :],
                                                      np.asarray(gold, dtype=np.float64)[None, :])[0])
    if not abs(scored - recorded) <= tolerance:  # a NaN recorded or scored is no match either
        return f"{path}: its {key} is {scored:.6f}, not the {recorded:.6f} that {record.source} records"
    return None


def check_run_dev(run: Path, dev: Mapping[str, tuple[np.ndarray, np.ndarray]],
                  calibration: Mapping[str, dict] | None = None) -> None:
    """What a tool read of a run's folder is the run's own, else a ScoresFileError naming the file in one line: each
    task's dev scores of `dev` (task -> (scores as its scores file holds them, gold)), decided into predictions as
    the run decided its CSVs (the task's decide: QQP at logit 0, the threshold chosen on dev is calibrate.py's, never
    the run's), score the dev metric its best.json records (within METRIC_TOLERANCE: a scores file's 9 digits read
    float32 back exactly), and `calibration` (its calibration.json's tasks, read_calibration's) records that same
    accuracy of each task, the accuracy of the dev scores it was fitted on. A copy of another run's scores/ file or
    calibration.json scores that run's metric, not this one's. A folder with no best.json has no record to check
    against (nothing recorded ties its files to anything), nor has an ensemble's (ensemble.json: scripts/ensemble.py
    writes no dev scores or calibration; its record holds its combined predictions' metrics)."""
    try:
        record = run_record(run)
    except PredictionsFileError as err:
        raise ScoresFileError(str(err)) from None
    if record is None or record.source.name != "best.json":
        return
    for task, (scores, gold) in dev.items():
        problem = _score_problem(scores_path(run, task, "dev"), task, member_predictions(task, scores), gold, record,
                                 METRIC_TOLERANCE)
        if problem:
            raise ScoresFileError(problem + ": not this run's dev scores")
    for task, entry in (calibration or {}).items():
        source, key = calibration_path(run), TASKS[task].model.score_key
        fitted_on, recorded = entry.get("accuracy"), record.metrics.get(key)
        if not isinstance(fitted_on, (int, float)):
            raise ScoresFileError(f"{source}: records no {task} accuracy to tie it to the run's dev scores; rewrite it "
                                  f"with scripts/calibrate.py {run} --data_dir DIR")
        if not isinstance(recorded, (int, float)):
            raise ScoresFileError(f"{record.source}: records no {key} to check {source} against")
        if not abs(fitted_on - recorded) <= METRIC_TOLERANCE:
            raise ScoresFileError(f"{source}: fitted on dev scores of {task} accuracy {fitted_on:.6f}, not the "
                                  f"{recorded:.6f} that {record.source} records: not this run's calibration")


def leaderboard_files(run: Path) -> list[Path]:
    """Every leaderboard file that belongs to a finished run: where its flags sent them (best.json records them), and
    the course's names in its predictions/ and directly in it (dev_csv's places)."""
    settings = run_settings(run)
    written = settings.get("prediction_files", {})
    recorded = [recorded_path(path, working_dir_of(run, settings)) for path in written.values()
                if isinstance(path, str)] if isinstance(written, dict) else []
    names = [Path(default_output(task, split)).name for task in MULTITASK for split in ("dev", "test")]
    return recorded + [folder / name for folder in (run / "predictions", run) for name in names]


def predictions_and_gold(run: Path, data_dir: Path) -> dict[str, tuple[list, list]]:
    """(predictions, gold) per task in the order of the dev file."""
    return {task: _paired(dev_csv(run, task), data_dir, task) for task in MULTITASK}


def part1_predictions_and_gold(run: Path, data_dir: Path) -> dict[str, tuple[list, list]]:
    """predictions_and_gold of classifier.py's dev CSVs (part 1: SST, CFIMDB), from a folder holding one --option's
    (its --predictions_dir: OPTION-TASK-dev-out.csv)."""
    pairs = {}
    for task in PART1_TASKS:
        found = sorted(run.glob(f"*-{task}-dev-out.csv"))
        if len(found) != 1:
            raise PredictionsFileError(f"{run}: expected one OPTION-{task}-dev-out.csv (classifier.py's), found "
                                       f"{len(found)}{': ' + ', '.join(p.name for p in found) if found else ''}")
        pairs[task] = _paired(found[0], data_dir, task)
    return pairs


def _paired(path: Path, data_dir: Path, task: str) -> tuple[list, list]:
    gold = {example.id: example.label for example in load_split(data_dir, task, "dev")}
    predicted = check_predictions_file(path, gold.keys(), task)
    return [predicted[i] for i in gold], list(gold.values())
