"""The robustness suite's four families on one model or an ensemble, each giving report.Rows: the noisy sets (char,
word) scored whole, and the two attacks (embedding, greedy) on the first examples of the clean set.

    rows = noise_rows(predictor, sets, "sst", "char", replicates=1000, seed=0)
    rows = embedding_rows(predictor, "sst", sets.clean["sst"][:100], EmbeddingAttack((1e-3, 1e-2)), 1000, 0)
    rows, outcomes = greedy_rows(predictor, "sst", sets.clean["sst"][:100], neighbours, GreedyAttack(50), 1000, 0)

`predictor`: what is scored, one run's model or several runs' ensemble (ensemble_predictor.py: RunPredictor of the
run's kept_predictor, or EnsemblePredictor), whose predict, query and attack_embeddings the families call alike.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from minbert.robustness.embedding_attack import EmbeddingAttack
from minbert.robustness.ensemble_predictor import EnsemblePredictor, RunPredictor
from minbert.robustness.greedy_attack import GreedyAttack, Outcome, attack_all
from minbert.robustness.perturbed_sets import PerturbedSets
from minbert.robustness.report import Row, score_rows
from minbert.robustness.text_noise import Neighbours
from minbert.tasks import TASKS
from minbert.tasks.base import decided

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
