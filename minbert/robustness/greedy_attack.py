"""A greedy word-substitution attack against a model, with a budget of queries (inputs the model scores) per example.

    attack = GreedyAttack(budget=50, regression_margin=1.0)
    outcome = attack_example(example, task, query, neighbours, attack)   # query(examples) -> their scores
    outcome.success, outcome.queries, outcome.words_changed, outcome.example

For one example: the model scores it (one query); a classification example it already gets wrong is not attacked.
Each word with neighbours (text_noise.neighbour_forms: a whole word of the vocabulary, replaced by its nearest words
in the model's input-embedding space) is ranked by how much deleting it harms the prediction (one query a word);
then, most harmful first, every neighbour is tried in its place (one query each) and the most harmful kept if it
harms more than the text so far, until the attack succeeds, the words run out or the budget does. A pair task's
words of both sentences are candidates. Harm: for a classification task one minus the gold class's probability;
for a regression task (STS's 0-5 score) the absolute error. Success: a classification changes from the gold class;
a regression's absolute error grows by `regression_margin` or more. The model is never asked more than `budget`
times for an example: a set of queries that would pass it is cut to what is left.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from minbert.robustness.text_noise import Neighbours, Words, neighbour_forms
from minbert.tasks.base import Task
from minbert.tasks.classification import Classification

Query = Callable[[list], np.ndarray]  # examples -> the model's scores of them, as a run saves them


@dataclass(frozen=True)
class GreedyAttack:
    """The budget of queries per example and what counts as success for a regression task."""
    budget: int
    regression_margin: float = 1.0

    def __post_init__(self):
        if self.budget < 1:
            raise ValueError(f"the query budget must be >= 1, got {self.budget}")
        if not self.regression_margin > 0:
            raise ValueError(f"the regression margin must be > 0, got {self.regression_margin}")


@dataclass(frozen=True)
class Outcome:
    """One example's attack: the text it ended with, whether it was attacked (a classification already wrong is
    not), whether it succeeded, the queries spent, the words substituted and the final scores."""
    example: object
    attacked: bool
    success: bool
    queries: int
    words_changed: int
    scores: np.ndarray


class Budget:
    """A query function that counts its queries and never passes `limit`: a request for more is cut short."""

    def __init__(self, query: Query, limit: int):
        self.query, self.limit, self.used = query, limit, 0

    @property
    def left(self) -> int:
        return self.limit - self.used

    def __call__(self, examples: list) -> np.ndarray:
        asked = examples[:self.left]
        self.used += len(asked)
        return self.query(asked) if asked else np.zeros((0,))


def harm(task: Task, scores: np.ndarray, gold: float) -> np.ndarray:
    """How wrong each of the scores is: one minus the gold class's probability, or a regression's absolute error."""
    if isinstance(task, Classification):
        return 1 - task.outputs.probabilities(np.asarray(scores))[:, int(gold)]
    return np.abs(np.asarray(scores, dtype=np.float64).reshape(len(scores)) - gold)


def wrong(task: Task, scores: np.ndarray, gold: float) -> bool:
    """Whether a classification's decided class is not the gold one (a regression: never wrong by itself)."""
    if not isinstance(task, Classification):
        return False
    return int(task.model.decide(torch.from_numpy(np.asarray(scores)[None])).item()) != int(gold)


def _variant(example, column: str, words: Words, index: int, replacement: str | None, number: int):
    """The example with the word at `index` of `column` replaced (or deleted: None), under an id of its own so that a
    batch of candidates holds no id twice."""
    changed = words.without({index}) if replacement is None else words.replaced({index: replacement})
    return dataclasses.replace(example, id=f"{example.id}#{number}", **{column: changed.text})


def _ranked_places(example, task: Task, query: Budget, neighbours: Neighbours, clean_harm: float) -> list:
    """(column, word place) of every word with neighbours, the most harmful to delete first (places the budget left
    unranked come last, in text order)."""
    places = [(column, place) for column in task.text_columns
              for place in Words.of(getattr(example, column)).words()
              if neighbour_forms(Words.of(getattr(example, column)).parts[place], neighbours)]
    deleted = [_variant(example, column, Words.of(getattr(example, column)), place, None, i)
               for i, (column, place) in enumerate(places)]
    scores = query(deleted)
    harms = harm(task, scores, example.label) if len(scores) else np.zeros(0)  # an empty budget scores nothing
    order = np.full(len(places), clean_harm)
    order[:len(harms)] = harms
    return [places[i] for i in np.argsort(-order, kind="stable")]


def attack_example(example, task: Task, query: Query, neighbours: Neighbours, attack: GreedyAttack) -> Outcome:
    """The greedy attack on one labelled example (module docstring)."""
    budget = Budget(query, attack.budget)
    clean = budget([example])[0]
    if wrong(task, clean, example.label):
        return Outcome(example, False, False, budget.used, 0, clean)
    clean_harm = current_harm = float(harm(task, clean[None], example.label)[0])
    current, scores, changed = example, clean, 0
    for column, place in _ranked_places(example, task, budget, neighbours, clean_harm):
        if not budget.left:
            break
        words = Words.of(getattr(current, column))
        candidates = [_variant(current, column, words, place, form, i)
                      for i, form in enumerate(neighbour_forms(words.parts[place], neighbours))]
        candidate_scores = budget(candidates)
        harms = harm(task, candidate_scores, example.label)
        best = int(np.argmax(harms))
        if harms[best] <= current_harm:
            continue
        current = dataclasses.replace(candidates[best], id=example.id)
        scores, current_harm, changed = candidate_scores[best], float(harms[best]), changed + 1
        succeeded = (wrong(task, scores, example.label) if isinstance(task, Classification)
                     else current_harm - clean_harm >= attack.regression_margin)
        if succeeded:
            return Outcome(current, True, True, budget.used, changed, scores)
    return Outcome(current, True, False, budget.used, changed, scores)


def attack_all(examples: Sequence, task: Task, query: Query, neighbours: Neighbours, attack: GreedyAttack,
               progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """attack_example on each example; `progress(done, total)` after each."""
    outcomes = []
    for done, example in enumerate(examples, start=1):
        outcomes.append(attack_example(example, task, query, neighbours, attack))
        if progress is not None:
            progress(done, len(examples))
    return outcomes
