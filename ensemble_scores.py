"""The ensemble library behind ensemble.py (the command, whose help describes the methods): finished runs' saved
scores (RUN/scores/, scores.py) read as members, combined per task into the ensemble's predictions, greedy forward
selection of members on dev (Caruana et al. 2004) and the held-out figure that keeps its dev score honest.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from datasets import DataError, load_split
from evaluation import overall_score, task_metrics
from losses import decision
from scores import ScoresFileError, read_scores, scores_path
from tasks import MULTITASK

SPLITS = ("dev", "test")
METHODS = {"sst": ("vote", "mean"), "qqp": ("vote", "mean"), "sts": ("mean", "weighted")}
PRIMARY_METRIC = {"sst": "sst_acc", "qqp": "qqp_acc", "sts": "sts_pearson"}  # what selection maximises
HELD_OUT_REPEATS = 5  # random halvings of dev averaged into the held-out figure


class EnsembleError(ValueError):
    """Members that cannot be combined the way asked; the message says why and what to do, in one line."""


@dataclass
class Member:
    """One run's scores: (task, split) -> (ids, scores)."""
    run_dir: Path
    scores: dict[tuple[str, str], tuple[list[str], np.ndarray]]


def load_members(run_dirs: list[str | Path]) -> list[Member]:
    """Every run's six scores files; all members must answer the same ids in the same order, and each run is given
    once: the same folder twice (however spelled), or two folders of the same scores, would weigh one run double
    without saying so (--select may still choose a member several times, and says so)."""
    folders: dict[Path, Path] = {}
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            raise ScoresFileError(f"{run_dir}: not a run's folder")
        if run_dir.resolve() in folders:
            raise ScoresFileError(f"{run_dir}: the same run as {folders[run_dir.resolve()]}; give each member once")
        folders[run_dir.resolve()] = run_dir
    members = [Member(Path(d), {(t, s): read_scores(scores_path(d, t, s), t) for t in MULTITASK for s in SPLITS})
               for d in run_dirs]
    for index, member in enumerate(members[1:], start=1):
        for key, (ids, _) in member.scores.items():
            if ids != members[0].scores[key][0]:
                raise ScoresFileError(f"{scores_path(member.run_dir, *key)}: its ids differ from those of "
                                      f"{scores_path(members[0].run_dir, *key)}; members must answer the same data")
        for earlier in members[:index]:
            if all(np.array_equal(member.scores[key][1], earlier.scores[key][1]) for key in member.scores):
                raise ScoresFileError(f"{member.run_dir}: its scores are {earlier.run_dir}'s, all six files; the "
                                      "same run twice (a copy) would count double, give it once")
    return members


# ---------------------------------------------------------------------------------------------------
# Combining scores (arrays in, arrays out)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exponentials = np.exp(shifted)
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def class_probabilities(task: str, scores: np.ndarray) -> np.ndarray:
    """(N, C) class probabilities of one member's SST logits (N, 5) or QQP logits (N,)."""
    if task == "sst":
        return _softmax(scores)
    duplicate = 1 / (1 + np.exp(-scores))
    return np.stack([1 - duplicate, duplicate], axis=-1)


def member_predictions(task: str, scores: np.ndarray) -> np.ndarray:
    """One member's predictions, exactly as its own CSV has them: the run's own rule (losses.decision)."""
    return decision(task, torch.from_numpy(scores)).numpy()


def check_sts_weights(weights: list[float] | None, members: int) -> None:
    """Dev-weighted STS needs one non-negative weight per member, and not all of them zero."""
    if weights is None or len(weights) != members or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError("weighted STS needs one non-negative weight per member, not all zero")


class _RunningCombination:
    """combine's sums over the members added so far, so that adding one more member, or trying one on top, costs
    O(N) however many are in: greedy selection tries every candidate in every round."""

    def __init__(self, task: str, method: str):
        if method not in METHODS[task]:
            raise ValueError(f"{task}: method must be one of {METHODS[task]}, got {method!r}")
        self.task, self.method = task, method
        self.total: np.ndarray | None = None  # the sum of the added members' terms, in the order they were added
        self.weights: list[float] = []  # one per added member

    def terms(self, scores: np.ndarray, weight: float = 1.0) -> np.ndarray:
        """What one member adds to the sum: its STS scores (times its weight, in float64 as np.average has it), or
        its SST / QQP class probabilities (N, C) followed, for a vote, by one vote for its own class (N, 2C)."""
        if self.task == "sts":
            return scores * np.float64(weight) if self.method == "weighted" else scores
        probabilities = class_probabilities(self.task, scores)
        if self.method == "mean":
            return probabilities
        votes = np.zeros_like(probabilities)
        votes[np.arange(len(scores)), member_predictions(self.task, scores)] = 1
        return np.concatenate([probabilities, votes], axis=-1)

    def add(self, terms: np.ndarray, weight: float = 1.0) -> None:
        self.total = terms if self.total is None else self.total + terms
        self.weights.append(weight)

    def predictions(self, terms: np.ndarray | None = None, weight: float = 1.0) -> np.ndarray:
        """The ensemble's predictions; with `terms`, those it would make with that member added (the sums stay).

        Members are summed one after the other, in the order added, as np.mean and np.average sum a stack of them
        along its first axis; combine is these sums too, so selection scores exactly what combine returns."""
        total, weights = self.total, self.weights
        if terms is not None:
            total, weights = (terms if total is None else total + terms), weights + [weight]
        if self.task == "sts":
            if self.method == "mean":
                return total / len(weights)
            check_sts_weights(weights, len(weights))
            return total / np.sum(weights)  # summed afresh, pairwise as np.average sums them: the same bits
        if self.method == "mean":
            return (total / len(weights)).argmax(axis=-1)
        classes = total.shape[-1] // 2
        probabilities, votes = total[:, :classes] / len(weights), total[:, classes:]
        # Most votes first; among tied classes, the one with the higher mean probability.
        leading = votes == votes.max(axis=-1, keepdims=True)
        return np.where(leading, probabilities, -np.inf).argmax(axis=-1)


def combine(task: str, members: list[np.ndarray], method: str, weights: list[float] | None = None) -> np.ndarray:
    """The ensemble's predictions from its members' scores (one array per member, repeats allowed)."""
    ensemble = _RunningCombination(task, method)
    if method == "weighted":
        check_sts_weights(weights, len(members))
    for scores, weight in zip(members, weights or [1.0] * len(members)):
        ensemble.add(ensemble.terms(scores, weight), weight)
    return ensemble.predictions()


def metric(task: str, predictions: np.ndarray, gold: np.ndarray) -> float:
    return task_metrics(task, predictions, gold)[PRIMARY_METRIC[task]]


def greedy_selection(task: str, members: list[np.ndarray], gold: np.ndarray, method: str,
                     rounds: int | None = None) -> list[int]:
    """Caruana et al.'s forward selection with replacement on dev: indices of the chosen members (a member
    may appear more than once, which weights it). Starts from the best single member; each round adds the
    member that scores best together with those chosen (the first such member on a tie); returns the
    best-scoring prefix (the shortest on a tie). The chosen members' sums are kept, so a round costs O(M·N)."""
    rounds = rounds or 2 * len(members)
    single = member_metrics(task, members, gold)
    weights = member_weights(method, list(range(len(members))), single) or [1.0] * len(members)
    ensemble = _RunningCombination(task, method)
    terms = [ensemble.terms(scores, weight) for scores, weight in zip(members, weights)]
    chosen = [int(np.argmax(single))]
    ensemble.add(terms[chosen[0]], weights[chosen[0]])
    best, best_size = single[chosen[0]], 1
    for _ in range(rounds - 1):
        trials = [metric(task, ensemble.predictions(terms[j], weights[j]), gold) for j in range(len(members))]
        chosen.append(int(np.argmax(trials)))
        ensemble.add(terms[chosen[-1]], weights[chosen[-1]])
        if max(trials) > best:
            best, best_size = max(trials), len(chosen)
    return chosen[:best_size]


def held_out_metric(task: str, members: list[np.ndarray], gold: np.ndarray, method: str,
                    repeats: int = HELD_OUT_REPEATS) -> float:
    """An honest dev figure for greedy selection: dev split at random into two halves, members chosen on one
    half and the ensemble scored on the other, both ways; the mean over `repeats` random halvings, because one
    halving of a dev set as small as SST's (1,101 sentences) gives a noisy figure."""
    held_out = []
    for seed in range(repeats):
        order = np.random.default_rng(seed).permutation(len(gold))
        halves = (order[: len(order) // 2], order[len(order) // 2:])
        for choose_on, score_on in (halves, halves[::-1]):
            chosen = greedy_selection(task, [m[choose_on] for m in members], gold[choose_on], method)
            single = member_metrics(task, [m[choose_on] for m in members], gold[choose_on])
            predicted = combine(task, [members[i][score_on] for i in chosen], method,
                                member_weights(method, chosen, single))
            held_out.append(metric(task, predicted, gold[score_on]))
    return float(np.mean(held_out))


def member_metrics(task: str, members: list[np.ndarray], gold: np.ndarray) -> list[float]:
    """Each member's own dev metric (accuracy; Pearson r for STS)."""
    return [metric(task, member_predictions(task, m), gold) for m in members]


def member_weights(method: str, chosen: list[int], metrics: list[float]) -> list[float] | None:
    """Dev-weighted STS: each chosen member's dev Pearson r (0 if negative); None for the other methods."""
    return [max(metrics[i], 0.0) for i in chosen] if method == "weighted" else None


# ---------------------------------------------------------------------------------------------------
# The ensemble of finished runs


def dev_labels(data_dir: str | Path, ids: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Gold dev labels per task in the order of the members' ids."""
    labels = {}
    for task in MULTITASK:
        by_id = {e.id: e.label for e in load_split(data_dir, task, "dev")}
        missing = [i for i in ids[task] if i not in by_id]
        if missing:
            raise DataError(f"{data_dir}",
                            f"{task} dev has no example with id {missing[0]!r}, which the members answered")
        labels[task] = np.array([by_id[i] for i in ids[task]])
    return labels


def build_ensemble(members: list[Member], gold: dict[str, np.ndarray], methods: dict[str, str],
                   select: bool) -> tuple[dict, dict]:
    """Predictions per (task, split) and a report: members chosen per task, weights, dev metrics."""
    predictions, report = {}, {"members": [str(m.run_dir) for m in members], "methods": methods,
                               "selected_on_dev": select, "tasks": {}}
    for task in MULTITASK:
        dev = [m.scores[(task, "dev")][1] for m in members]
        single = member_metrics(task, dev, gold[task])
        if methods[task] == "weighted" and not any(r > 0 for r in single):
            raise EnsembleError(f"--{task} weighted: every member's dev Pearson r is <= 0 "
                                f"({', '.join(f'{r:.4f}' for r in single)}), so none has a weight; use --{task} mean")
        chosen = greedy_selection(task, dev, gold[task], methods[task]) if select else list(range(len(members)))
        weights = member_weights(methods[task], chosen, single)
        for split in SPLITS:
            scores = [members[i].scores[(task, split)][1] for i in chosen]
            predictions[(task, split)] = combine(task, scores, methods[task], weights)
        report["tasks"][task] = {
            "chosen": [str(members[i].run_dir) for i in chosen], "weights": weights,
            "members_dev": single,
            "ensemble_dev": metric(task, predictions[(task, "dev")], gold[task])}
        if select:
            report["tasks"][task]["held_out_dev"] = held_out_metric(task, dev, gold[task], methods[task])
    dev_metrics = {}
    for task in MULTITASK:
        dev_metrics.update(task_metrics(task, predictions[(task, "dev")], gold[task]))
    dev_metrics["overall"] = overall_score(dev_metrics["sst_acc"], dev_metrics["qqp_acc"], dev_metrics["sts_pearson"])
    report["dev"] = dev_metrics
    member_overall = [overall_score(*(report["tasks"][t]["members_dev"][i] for t in ("sst", "qqp", "sts")))
                      for i in range(len(members))]
    best = int(np.argmax(member_overall))
    report["best_member"] = {"run": str(members[best].run_dir), "overall_dev": member_overall[best]}
    if select:
        report["held_out_overall"] = overall_score(*(report["tasks"][t]["held_out_dev"] for t in ("sst", "qqp", "sts")))
    return predictions, report


# ---------------------------------------------------------------------------------------------------
# The ensemble as a teacher (--score_train, read by distillation.py)


def teacher_scores(task: str, members: list[np.ndarray], weights: list[float] | None = None) -> np.ndarray:
    """The ensemble's soft scores, in the runs' score space: SST the log of the members' mean class probabilities
    (their softmax is that mean), QQP the logit of the mean duplicate probability, STS the (weighted) mean score.
    A teacher gives its mean probabilities whichever way the ensemble decides (a vote has no probability)."""
    if weights is not None:
        check_sts_weights(weights, len(members))
    share = np.asarray(weights if weights is not None else [1.0] * len(members), dtype=np.float64)
    share = share / share.sum()
    if task == "sts":
        return sum(w * scores for w, scores in zip(share, members))
    mean = sum(w * class_probabilities(task, scores) for w, scores in zip(share, members))
    mean = np.clip(mean, 1e-12, 1.0)  # a logit of a probability of 0 or 1 would be infinite
    if task == "sst":
        return np.log(mean)  # (N, 5)
    return np.log(mean[:, 1]) - np.log(mean[:, 0])  # (N,)


def ensemble_train_scores(report: dict) -> dict[str, tuple[list[str], np.ndarray]]:
    """Per task, the train scores of the members build_ensemble chose, combined by teacher_scores: what a student
    distils from. Every chosen member must have written them (--score_train) for the same examples; a task none
    of them trained (and so scored: specialists of another task) is left out, the others are the teacher."""
    combined = {}
    for task, info in report["tasks"].items():
        paths = [scores_path(run, task, "train") for run in info["chosen"]]
        missing = [path for path in paths if not path.is_file()]
        if len(missing) == len(paths):
            continue
        if missing:
            raise ScoresFileError(f"{missing[0]}: no train scores; rerun that member with --score_train")
        loaded = [read_scores(path, task) for path in paths]
        for path, (ids, _) in zip(paths[1:], loaded[1:]):
            if ids != loaded[0][0]:
                raise ScoresFileError(f"{path}: its ids differ from those of {paths[0]}; members must have scored "
                                      "the same training examples")
        combined[task] = (loaded[0][0], teacher_scores(task, [s for _, s in loaded], info["weights"]))
    if not combined:
        first_member = next(iter(report["tasks"].values()))["chosen"][0]
        raise ScoresFileError(f"{scores_path(first_member, 'sst', 'train').parent}: no train scores of any task; "
                              "rerun the members with --score_train")
    return combined
