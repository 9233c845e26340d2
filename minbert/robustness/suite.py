"""The robustness suite's four families on one model or an ensemble, each giving report.Rows: the noisy sets (char,
word) scored whole, and the two attacks (embedding, greedy) on the first examples of the clean set.

    rows = noise_rows(predictor, sets, "sst", "char", replicates=1000, seed=0)
    rows = embedding_rows(predictor, "sst", sets.clean["sst"][:100], EmbeddingAttack((1e-3, 1e-2)), 1000, 0)
    rows, outcomes = greedy_rows(predictor, "sst", sets.clean["sst"][:100], neighbours, GreedyAttack(50), 1000, 0)

`predictor`: what is scored, one run's model or several runs' ensemble (ensemble_predictor.py: RunPredictor of the
run's kept_predictor, or EnsemblePredictor), whose predict, query and attack_embeddings the families call alike.

The families are registered (FAMILIES, in scripts/robustness.py's --families order): a new family is a Family, a
function of a FamilyRun (one task's inputs) giving its rows, registered with register_family; run_families runs
those asked for on every task.

    rows, seconds, outcomes = run_families(["char", "greedy"], ["sst"], FamilyRun(predictor, sets, neighbours, settings))
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from minbert.robustness.embedding_attack import EmbeddingAttack
from minbert.robustness.ensemble_predictor import EnsemblePredictor, RunPredictor
from minbert.robustness.greedy_attack import GreedyAttack, Outcome, attack_all
from minbert.robustness.perturbed_sets import PerturbedSets
from minbert.robustness.report import Row, score_rows
from minbert.files import atomic_write_text
from minbert.robustness.text_noise import Neighbours
from minbert.tasks import TASKS, course_file_name
from minbert.tasks.base import decided
from minbert.tasks.course_files import write_examples

Progress = Callable[[str], None]
Scored = RunPredictor | EnsemblePredictor


def _quiet(message: str) -> None:
    """No progress lines."""


def predictions_of(task: str, scores: np.ndarray) -> np.ndarray:
    """The predictions a run decides from these scores (as its leaderboard files are decided)."""
    return decided(TASKS[task], scores)[1]


def noise_rows(predictor: Scored, sets: PerturbedSets, task: str, family: str, replicates: int, seed: int,
               progress: Progress = _quiet) -> list[Row]:
    """The clean set and each of the family's variants scored whole, with the share of words each changed."""
    clean = predictions_of(task, predictor.predict(task, sets.clean[task], scores=True)[1])
    perturbed, details = {}, {}
    for name, variant in sets.manifest["variants"].items():
        if variant["family"] != family:
            continue
        perturbed[name] = predictions_of(task, predictor.predict(task, sets.variants[name][task], scores=True)[1])
        details[name] = {"words changed": variant["words_changed"][task]["share"]}
        progress(f"{task} {name}: {len(perturbed[name])} examples scored")
    if not perturbed:
        return []
    return score_rows(task, family, sets.clean[task], clean, perturbed, details, replicates, seed)


def embedding_rows(predictor: Scored, task: str, examples: Sequence, attack: EmbeddingAttack, replicates: int,
                   seed: int, progress: Progress = _quiet) -> list[Row]:
    """The embedding attack's sweep; each row also gives the mean gold loss (an ensemble's: its members' mean), clean
    and under attack."""
    result = predictor.attack_embeddings(task, examples, attack)
    perturbed = {f"eps={epsilon:g}": predictions_of(task, scores) for epsilon, scores in result.scores.items()}
    details = {f"eps={epsilon:g}": {"clean loss": result.losses[0], "loss": result.losses[i + 1]}
               for i, epsilon in enumerate(attack.epsilons)}
    progress(f"{task} embedding attack: mean loss {' -> '.join(f'{loss:.4g}' for loss in result.losses)}")
    return score_rows(task, "embedding", examples, predictions_of(task, result.clean_scores), perturbed,
                      details, replicates, seed)


def greedy_rows(predictor: Scored, task: str, examples: Sequence, neighbours: Neighbours, attack: GreedyAttack,
                replicates: int, seed: int, progress: Progress = _quiet) -> tuple[list[Row], list[Outcome]]:
    """The greedy attack on each example: its row (with the success rate among the examples attacked, the words
    changed per success and the queries spent: an ensemble's queries, each one evaluation of every member) and each
    example's outcome."""
    def each(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            progress(f"{task} greedy attack: {done}/{total} examples")
    outcomes = attack_all(examples, TASKS[task], predictor.query(task), neighbours, attack, each)
    clean = predictions_of(task, predictor.predict(task, list(examples), scores=True)[1])
    attacked = predictions_of(task, np.stack([outcome.scores for outcome in outcomes]))
    tried = [outcome for outcome in outcomes if outcome.attacked]
    successes = [outcome for outcome in tried if outcome.success]
    name = f"budget={attack.budget}"
    details = {name: {"attacked": len(tried), "success rate": len(successes) / len(tried) if tried else 0.0,
                      "words per success": float(np.mean([o.words_changed for o in successes])) if successes else 0.0,
                      "mean queries": float(np.mean([o.queries for o in outcomes])),
                      "most queries": max(o.queries for o in outcomes)}}
    rows = score_rows(task, "greedy", examples, clean, {name: attacked}, details, replicates, seed)
    return rows, outcomes


# ---------------------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True)
class SuiteSettings:
    """What the families share: the attacks' examples (the first of the clean subset) and settings, and the
    intervals' bootstrap."""
    attack_examples: int
    embedding: EmbeddingAttack
    greedy: GreedyAttack
    replicates: int
    seed: int


@dataclass(frozen=True)
class FamilyRun:
    """A family's inputs: what is scored, the sets, the model's word neighbours, the settings, progress lines, and
    the task (run_families sets it for each task in turn)."""
    predictor: Scored
    sets: PerturbedSets
    neighbours: Neighbours
    settings: SuiteSettings
    progress: Progress = _quiet
    task: str = ""

    @property
    def attacked(self) -> list:
        """The examples an attack runs on: the first attack_examples of the task's clean subset."""
        return self.sets.clean[self.task][:self.settings.attack_examples]


@dataclass(frozen=True)
class Family:
    """A family of the suite. `rows`: its report rows on a FamilyRun's task, and the per-example outcomes it keeps
    (None: none); `write_outcomes(output_dir, task, outcomes)` writes those; `attacks_embeddings`: it takes the
    gradient of the gold loss in the input embeddings, so the models' pair reading is checked for it first
    (kept_ensemble.load_scored); `flags`: the settings of scripts/robustness.py it reads (their flags' names without
    the dashes), so that one typed while no family asked for reads it, which would do nothing, is refused."""
    name: str
    rows: Callable[[FamilyRun], tuple[list[Row], list | None]]
    write_outcomes: Callable[[Path, str, list], None] | None = None
    attacks_embeddings: bool = False
    flags: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Adds a family to the suite, after those registered before it; ValueError for a name taken."""
    if family.name in FAMILIES:
        raise ValueError(f"a robustness family named {family.name!r} is registered already")
    FAMILIES[family.name] = family
    return family


def run_families(families: Sequence[str], tasks: Sequence[str], inputs: FamilyRun) -> tuple[list, dict, dict]:
    """Every family of `families` (registered names) on every task: the rows, each family's seconds per task, and
    the outcomes a family keeps, by family and task."""
    rows, seconds, outcomes = [], {}, {}
    for task in tasks:
        run = replace(inputs, task=task)
        for name in families:
            start = time.perf_counter()
            found, kept = FAMILIES[name].rows(run)
            rows += found
            if kept is not None:
                outcomes.setdefault(name, {})[task] = kept
            seconds.setdefault(name, {})[task] = round(time.perf_counter() - start, 1)
            inputs.progress(f"{task} {name}: {seconds[name][task]} s")
    return rows, seconds, outcomes


def write_greedy(output_dir: Path, task: str, outcomes: list[Outcome]) -> None:
    """greedy-TASK.jsonl (each example's attack) and greedy/ (the texts the attack ended with, in the course's
    format)."""
    records = [{"id": o.example.id, "attacked": o.attacked, "success": o.success, "queries": o.queries,
                "words_changed": o.words_changed, **{c: getattr(o.example, c) for c in TASKS[task].text_columns}}
               for o in outcomes]
    atomic_write_text(output_dir / f"greedy-{task}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    (output_dir / "greedy").mkdir(exist_ok=True)
    write_examples(output_dir / "greedy" / course_file_name(task, "dev"), [o.example for o in outcomes],
                   TASKS[task].text_columns, TASKS[task].label_column)


def _noise(family: str, flags: tuple[str, ...] = ()) -> Family:
    def rows(run: FamilyRun) -> tuple[list[Row], None]:
        return noise_rows(run.predictor, run.sets, run.task, family, run.settings.replicates, run.settings.seed,
                          run.progress), None
    return Family(family, rows, flags=flags)


def _embedding(run: FamilyRun) -> tuple[list[Row], None]:
    return embedding_rows(run.predictor, run.task, run.attacked, run.settings.embedding, run.settings.replicates,
                          run.settings.seed, run.progress), None


def _greedy(run: FamilyRun) -> tuple[list[Row], list[Outcome]]:
    return greedy_rows(run.predictor, run.task, run.attacked, run.neighbours, run.settings.greedy,
                       run.settings.replicates, run.settings.seed, run.progress)


register_family(_noise("char"))
register_family(_noise("word", ("neighbours",)))  # word_neighbour's nearest words
register_family(Family("embedding", _embedding, attacks_embeddings=True,
                       flags=("attack_examples", "epsilons", "attack_steps")))
register_family(Family("greedy", _greedy, write_outcomes=write_greedy,
                       flags=("attack_examples", "budget", "neighbours", "regression_margin")))
