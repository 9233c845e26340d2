"""The perturbed dev sets on disk: made once from a seed, then read back by every run scored on them, so that runs
are compared on exactly the same inputs.

    manifest = make_sets(folder, dev, noises, SetOptions(seed=0, max_examples=1000), neighbours, source)
    sets = read_sets(folder, ["sst", "qqp"])          # PerturbedSets: the clean subset and every variant's

The folder holds manifest.json (the seed, the subset's size, each variant's kind, rate and the share of words it
changed per task, what made it) and one folder per variant (clean/, char_swap-0.1/, ...) holding each task's dev
file under the course's name, in the course's format (course_files.write_examples): a variant's folder is a
--data_dir that multitask_classifier.py's loaders and predict.py read as they read the course's. Every variant holds
the same examples as clean/, in the same order, with the same ids and labels.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from minbert.data.batches import subsample
from minbert.files import DataError, atomic_write_text
from minbert.robustness.text_noise import Neighbours, Noise, perturb_examples
from minbert.tasks import TASKS, course_file_name
from minbert.tasks.course_files import write_examples

MANIFEST = "manifest.json"
CLEAN = "clean"
FORMAT = 1  # manifest.json's layout


@dataclass(frozen=True)
class SetOptions:
    """How the sets are drawn: the seed of the subset and of every variant's noise, and how many dev examples of each
    task they hold (None: all)."""
    seed: int
    max_examples: int | None


@dataclass(frozen=True)
class PerturbedSets:
    """The sets read back: the manifest, the clean examples per task and each variant's (variant -> task ->
    examples, the clean ones' order)."""
    manifest: dict
    clean: dict[str, list]
    variants: dict[str, dict[str, list]]


def make_sets(folder: Path, dev: Mapping[str, list], noises: Sequence[Noise], options: SetOptions,
              neighbours: Neighbours | None, source: Mapping[str, object]) -> dict:
    """Write the clean subset of each task's `dev` examples and every noise's variant of it in `folder`, then the
    manifest (last: a folder without one is unfinished); `source` says what made them (the run whose embeddings gave
    the neighbours, the data folder). Returns the manifest."""
    variants = {noise.name: {"kind": noise.kind, "family": noise.family, "rate": noise.rate, "words_changed": {}}
                for noise in noises}
    tasks = {}
    for task, examples in dev.items():
        clean = subsample(examples, options.max_examples, options.seed)
        name = course_file_name(task, "dev")
        _write(folder / CLEAN / name, task, clean)
        tasks[task] = {"file": name, "examples": len(clean), "of": len(examples)}
        for noise in noises:
            perturbed, changed, eligible = perturb_examples(clean, TASKS[task].text_columns, noise, options.seed,
                                                            neighbours)
            _write(folder / noise.name / name, task, perturbed)
            variants[noise.name]["words_changed"][task] = {"changed": changed, "eligible": eligible,
                                                           "share": changed / eligible if eligible else 0.0}
    manifest = {"format": FORMAT, "seed": options.seed, "max_examples": options.max_examples, "tasks": tasks,
                "variants": variants, "source": dict(source)}
    atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write(path: Path, task: str, examples: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_examples(path, examples, TASKS[task].text_columns, TASKS[task].label_column)


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, None when it has none (the sets are to be made there); DataError when unreadable."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DataError(path, f"not a manifest of perturbed sets ({type(err).__name__}: {err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not all(
            isinstance(manifest.get(key), dict) for key in ("tasks", "variants")):
        raise DataError(path, f"not a manifest of perturbed sets (format {FORMAT} with 'tasks' and 'variants')")
    return manifest


def read_sets(folder: Path, tasks: Sequence[str]) -> PerturbedSets:
    """The clean and perturbed examples of `tasks` in `folder` (make_sets'), checked: DataError naming the file for a
    task the sets lack, a missing or malformed file, or a variant whose ids or labels differ from the clean set's."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise DataError(folder / MANIFEST, "no manifest: not a folder of perturbed sets")
    lacking = [task for task in tasks if task not in manifest["tasks"]]
    if lacking:
        raise DataError(folder / MANIFEST, f"holds no {', '.join(lacking)} sets (it has "
                                           f"{', '.join(manifest['tasks']) or 'none'}); make them in another folder")
    name = {task: course_file_name(task, "dev") for task in tasks}
    clean = {task: TASKS[task].data.load(folder / CLEAN / name[task], "dev") for task in tasks}
    variants = {}
    for variant in manifest["variants"]:
        variants[variant] = {}
        for task in tasks:
            path = folder / variant / name[task]
            examples = TASKS[task].data.load(path, "dev")
            if [(e.id, e.label) for e in examples] != [(e.id, e.label) for e in clean[task]]:
                raise DataError(path, f"its ids or labels differ from {folder / CLEAN / name[task]}'s")
            variants[variant][task] = examples
    return PerturbedSets(manifest, clean, variants)
