"""A finished run's outputs as the scripts that read them back find them (scripts/error_analysis.py,
scripts/compare_runs.py): the settings its best.json records and its dev CSVs with the gold labels they predict.

A run's dev CSVs are where its flags sent them (best.json records them, a relative path against the folder the run
was started in: a run told --sst_dev_out predictions/sst-dev-out.csv, as runs were by default before, wrote them
there, not in its folder), else the course's file names
in the folder's predictions/ or directly in it, as the recipes' and scripts/ensemble.py's folders hold them.
"""
from __future__ import annotations

import json
from pathlib import Path

from minbert.data.batches import load_split
from minbert.prediction.leaderboard import PredictionsFileError, check_predictions_file
from minbert.run.run_record import recorded_path, working_dir_of
from minbert.tasks import MULTITASK, PART1_TASKS, default_output, output_flag


def run_settings(run: Path) -> dict:
    """The flags a run was trained with, as its best.json records them ({} for a folder without one: an ensemble's)."""
    try:
        settings = json.loads((run / "best.json").read_text(encoding="utf-8")).get("args", {})
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def dev_csv(run: Path, task: str) -> Path:
    name = Path(default_output(task, "dev")).name
    settings = run_settings(run)
    written = settings.get("prediction_files", {})
    recorded = written.get(output_flag(task, "dev")) if isinstance(written, dict) else None
    candidates = [recorded_path(recorded, working_dir_of(run, settings))] if isinstance(recorded, str) else []
    candidates += [run / "predictions" / name, run / name]
    return next((path for path in candidates if path.is_file()), candidates[-1])


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
