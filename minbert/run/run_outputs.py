"""A finished run's outputs as the scripts that read them back find them (scripts/error_analysis.py,
scripts/compare_runs.py): the settings its best.json records and its dev CSVs with the gold labels they predict.

A run's dev CSVs are where its flags sent them (best.json records them, a relative path against the folder the run
was started in: `--demo` writes predictions/ beside the repository, not in runs/demo/), else the course's file names
in the folder's predictions/ or directly in it, as the recipes' and scripts/ensemble.py's folders hold them.
"""
from __future__ import annotations

import json
from pathlib import Path

from minbert.data.batches import load_split
from minbert.prediction.leaderboard import check_predictions_file
from minbert.run.run_record import recorded_path, working_dir_of
from minbert.tasks import MULTITASK, default_output, output_flag


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


def predictions_and_gold(run: Path, data_dir: Path) -> dict[str, tuple[list, list]]:
    """(predictions, gold) per task in the order of the dev file."""
    pairs = {}
    for task in MULTITASK:
        gold = {example.id: example.label for example in load_split(data_dir, task, "dev")}
        predicted = check_predictions_file(dev_csv(run, task), gold.keys(), task)
        pairs[task] = ([predicted[i] for i in gold], list(gold.values()))
    return pairs
