"""The files a run writes in its folder (multitask_classifier.py's), for the tools that write beside runs: a fresh run
removes an earlier run's (earlier_run_files), and no other tool may replace one (replaces_run_file, docs/runs.md)."""
from __future__ import annotations

import re
from pathlib import Path

from minbert.data.scores import scores_path, span_logits_path
from minbert.files import RUN_MARKERS, DataError, run_folder_of
from minbert.reports.calibration import reliability_file
from minbert.robustness.perturbed_sets import MANIFEST
from minbert.run.run_outputs import leaderboard_files
from minbert.run.run_record import RECORD_FILE
from minbert.step_log import STEPS_FILE, TENSORBOARD_DIR
from minbert.tasks import RUN_TASKS, SPLITS, TASKS, TEXT_TASKS, course_file_name, default_output
from minbert.tasks.calibration import CALIBRATION_FILE
from minbert.tasks.score_files import train_record_path
from minbert.training.checkpoint_files import FINISHED_FILE


def tsne_file(task: str) -> str:
    """The plot of a task's dev embeddings in a run's folder (write_tsne): sst_tsne.png."""
    return f"{task}_tsne.png"


# What a run writes in its folder besides checkpoints and scores (minbert/training/trainer.py, plots.write_run_reports,
# write_tsne, write_run_calibration).
RUN_REPORTS = (RECORD_FILE, "metrics.jsonl", STEPS_FILE, "history.json", "forgetting.md", "forgetting_matrix.png",
               "training_curves.png", "sst_error_histogram.png", "qqp_confusion_matrix.png", "sts_scatter.png",
               *(tsne_file(name) for name, task in TASKS.items() if task.plots_embeddings), CALIBRATION_FILE,
               *(reliability_file(name) for name, task in TASKS.items() if task.calibrated), FINISHED_FILE)
CHECKPOINT = re.compile(r"(last|best|stage_\d+|checkpoint-\d+)\.(json|safetensors)(\.tmp)?")
ROBUSTNESS_DIR = "robustness"  # scripts/robustness.py RUN's default --output_dir, its sets in perturbed/ there
ROBUSTNESS_REPORTS = ("robustness.md", "robustness.json", "robustness_predictions.json")


def robustness_files(output_dir: Path) -> list[Path]:
    """What scripts/robustness.py RUN wrote in RUN/robustness (its default --output_dir): the reports, greedy-TASK.jsonl
    and greedy/'s dev files, and the perturbed sets of perturbed/ (their manifest, clean/ and every variant's dev
    files). They belong to the run whose model they scored: the sets' word_neighbour texts came from its embeddings,
    so a fresh run there removes them (robustness.py then makes the new model's own). Only these names go: anything
    else a user keeps there stays. Sets made elsewhere (--perturbed_dir, which other runs share on purpose) are not
    the run's, and robustness.py checks them (robustness.py: sets_made_by_another_model)."""
    folder = Path(output_dir) / ROBUSTNESS_DIR
    sets = folder / "perturbed"
    dev_files = [course_file_name(task, "dev") for task in TEXT_TASKS]
    files = [folder / name for name in ROBUSTNESS_REPORTS] + sorted(folder.glob("greedy-*.jsonl"))
    variants = sorted(path.name for path in sets.glob("*") if path.is_dir())  # clean/ and each variant's
    files += [folder / "greedy" / name for name in dev_files] + [sets / MANIFEST]
    return files + [sets / variant / name for variant in variants for name in dev_files]


def earlier_run_files(output_dir: Path, predictions: list[Path]) -> list[Path]:
    """The files an earlier run may have left in OUTPUT_DIR: its checkpoints, reports, plots and scores/, the
    leaderboard files of any task in its predictions folders inside OUTPUT_DIR (a run of other tasks leaves some), and
    what scripts/robustness.py wrote in OUTPUT_DIR/robustness (robustness_files)."""
    files = [output_dir / name for name in RUN_REPORTS] + robustness_files(output_dir)
    files += (output_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*")  # --report_to tensorboard's
    files += [path for path in output_dir.glob("*") if CHECKPOINT.fullmatch(path.name)]
    files += [scores_path(output_dir, task, split) for task in RUN_TASKS for split in SPLITS]
    files += [span_logits_path(output_dir), train_record_path(output_dir)]
    folders = {output_dir / "predictions"} | {path.parent for path in predictions
                                              if path.resolve().is_relative_to(output_dir.resolve())}
    files += [folder / Path(default_output(task, split)).name for folder in folders
              for task in RUN_TASKS for split in ("dev", "test")]
    return files


def replaces_run_file(flag: str, path: str | Path) -> str | None:
    """Why the tool must not write `path`, one line naming both, or None: it is one of the files of the run whose
    folder it lies in (that run's checkpoints, record, reports, plots and scores, its leaderboard files wherever its
    best.json sends them). forbidden_output lets a tool write in the runs it writes for; their own files are not its
    to replace (plot_embeddings.py --output RUN/sst_tsne.png, stage_cka.py --names best)."""
    target = Path(path).resolve()
    owner = run_folder_of(target)
    if owner is None:
        return None
    try:
        recorded = leaderboard_files(owner)
    except DataError as err:  # a damaged best.json: where its CSVs went is not known, so nothing there is writable
        return f"{flag} {path}: inside the run folder {owner}, whose record cannot be read ({err}); write elsewhere"
    files = [*earlier_run_files(owner, recorded), *(owner / marker for marker in RUN_MARKERS)]
    if target in {file.resolve() for file in files} or CHECKPOINT.fullmatch(target.name) and target.parent == owner:
        return f"{flag} {path}: would replace a file of the run {owner}; write elsewhere or under another name"
    return None
