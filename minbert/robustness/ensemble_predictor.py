"""What the robustness suite (suite.py) scores: one run's model (RunPredictor) or the ensemble of several runs' models
(EnsemblePredictor), behind the same three methods, so that the suite's families never ask which.

    model = RunPredictor(kept_predictor(...))            # or EnsemblePredictor([kept_predictor(...), ...])
    ids, scores = model.predict("sst", examples, scores=True)
    scores = model.query("sst")(candidates)              # the greedy attack's query: each call tokenises afresh
    result = model.attack_embeddings("sst", examples, EmbeddingAttack((1e-2,)))

An ensemble's scores are its members' mean, scripts/ensemble.py's `mean` method: SST's and QQP's the scores whose
class probabilities are the mean of the members' (the log of the mean probabilities, the logit of the mean duplicate
probability: prediction/ensemble_scores.teacher_scores), so that each task decides and measures harm from them as it
does from one run's scores; STS's the mean 0-5 score. Each member predicts with its own run's settings (batch size,
precision). The embedding attack perturbs every member's input embeddings by one shared perturbation and ascends the
members' mean gold loss (embedding_attack.py); its scores are the ensemble's at the best perturbation found. The
members must read the same tokens alike (run/kept_ensemble.py checks their runs before their weights load).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from minbert.prediction.ensemble_scores import combine, teacher_scores
from minbert.prediction.inference import Predictor, predict_examples
from minbert.robustness.embedding_attack import AttackResult, EmbeddingAttack, attack_examples
from minbert.robustness.greedy_attack import Query


def fresh_scores(predictor: Predictor, task: str, examples: list) -> np.ndarray:
    """The model's scores of `examples`, tokenised afresh rather than kept (an attack's candidates are never asked
    twice), at the run's batch size, max_length and precision."""
    settings = predictor.settings
    return predict_examples(predictor.model, task, examples, predictor.splits.tokenizer, predictor.device,
                            settings.batch_size, settings.max_length, settings.precision, scores=True)[1]


class RunPredictor:
    """One run's model, as the suite scores it."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def predict(self, task: str, examples, scores: bool = False) -> tuple[list[str], np.ndarray]:
        return self.predictor.predict(task, examples, scores)

    def query(self, task: str) -> Query:
        return partial(fresh_scores, self.predictor, task)

    def attack_embeddings(self, task: str, examples: Sequence, attack: EmbeddingAttack) -> AttackResult:
        """embedding_attack.attack_examples on the model, at the run's batch size and max_length."""
        predictor, settings = self.predictor, self.predictor.settings
        return attack_examples([predictor.model], task, examples, predictor.splits.tokenizer, predictor.device,
                               settings.batch_size, settings.max_length, attack)


class EnsemblePredictor:
    """Several runs' models as one: the mean of their probabilities (SST, QQP) or scores (STS)."""

    def __init__(self, members: Sequence[Predictor]):
        if not members:
            raise ValueError("an ensemble needs at least one member")
        lengths = {member.settings.max_length for member in members}
        if len(lengths) > 1:
            raise ValueError(f"the members read different max_lengths ({sorted(lengths)}); one perturbation, one text")
        self.members = list(members)

    def predict(self, task: str, examples, scores: bool = False) -> tuple[list[str], np.ndarray]:
        """(ids, the ensemble's predictions: the class of the mean probability, the mean STS score), or with `scores`
        the ensemble's scores (the module's docstring)."""
        answers = [member.predict(task, examples, scores=True) for member in self.members]
        member_scores = [values for _, values in answers]
        return answers[0][0], teacher_scores(task, member_scores) if scores else combine(task, member_scores, "mean")

    def query(self, task: str) -> Query:
        """One ensemble evaluation per call: every member scores the examples, and their scores are combined."""
        def query(examples: list) -> np.ndarray:
            return teacher_scores(task, [fresh_scores(member, task, examples) for member in self.members])
        return query

    def attack_embeddings(self, task: str, examples: Sequence, attack: EmbeddingAttack) -> AttackResult:
        """The attack on every member at once (one perturbation, their mean loss), at the first member's batch size."""
        first = self.members[0]
        return attack_examples([member.model for member in self.members], task, examples, first.splits.tokenizer,
                               first.device, first.settings.batch_size, first.settings.max_length, attack,
                               partial(teacher_scores, task))
