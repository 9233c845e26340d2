"""The ensemble library behind scripts/ensemble.py (the command, whose help describes the methods): finished runs' saved
scores (RUN/scores/, minbert/data/scores.py) read as members, combined per task into the ensemble's predictions,
greedy forward selection of members on dev (Caruana et al. 2004) and the held-out figure that keeps its dev score
honest. Each task says how its members combine (minbert/tasks/: ensemble_methods, ensemble_terms, ensemble_predictions,
teacher_scores); this module keeps the running sums, the selection and the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from minbert.data.batches import DataError, load_split
from minbert.data.scores import ScoresFileError, read_scores, scores_path
from minbert.prediction.leaderboard import kept_model_score, overall_of, task_metrics
from minbert.tasks import MULTITASK, RUN_TASKS, TASKS
from minbert.tasks.base import check_weights
from minbert.tasks.calibration import calibration_path, read_calibration
from minbert.tasks.score_files import check_train_scores

SPLITS = ("dev", "test")
# The tasks a run saves scores of that ensembles combine, and how (each task's first method is the default).
METHODS = {task: TASKS[task].ensemble_methods for task in RUN_TASKS if TASKS[task].ensemble_methods}
PRIMARY_METRIC = {task: TASKS[task].model.score_key for task in METHODS}  # what selection maximises
HELD_OUT_REPEATS = 5  # random halvings of dev averaged into the held-out figure


class EnsembleError(ValueError):
    """Members that cannot be combined the way asked; the message says why and what to do, in one line."""


@dataclass
class Member:
    """One run's scores: (task, split) -> (ids, scores); calibrated (`temperatures`: by task), the logits of each
    calibrated task divided by the temperature fitted on the run's dev set."""
    run_dir: Path
    scores: dict[tuple[str, str], tuple[list[str], np.ndarray]]
    temperatures: dict[str, float] = field(default_factory=dict)


def calibrate(member: Member) -> None:
    """The member's logits of each calibrated task divided by the temperature fitted on its dev set (its
    calibration.json), so that its class probabilities are calibrated ones; ScoresFileError when it has none."""
    fitted = read_calibration(member.run_dir)
    for (task, split), (ids, scores) in member.scores.items():
        if not TASKS[task].calibrated:
            continue
        if task not in fitted:
            raise ScoresFileError(f"{calibration_path(member.run_dir)}: no {task} temperature; rewrite it with "
                                  f"scripts/calibrate.py {member.run_dir} --data_dir DIR")
        member.temperatures[task] = fitted[task]["temperature"]
        member.scores[(task, split)] = (ids, scores / member.temperatures[task])


def load_members(run_dirs: list[str | Path], calibrated: bool = False) -> list[Member]:
    """Every run's dev and test scores of the tasks any member has scores of, `calibrated` ones if asked (calibrate);
    all members must have them all and answer the same ids in the same order, and each run is given once: the same
    folder twice (however spelled), or two folders of the same scores, would weigh one run double without saying so
    (--select may still choose a member several times, and says so)."""
    folders: dict[Path, Path] = {}
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            raise ScoresFileError(f"{run_dir}: not a run's folder")
        if run_dir.resolve() in folders:
            raise ScoresFileError(f"{run_dir}: the same run as {folders[run_dir.resolve()]}; give each member once")
        folders[run_dir.resolve()] = run_dir
    tasks = [task for task in METHODS
             if any(scores_path(d, task, s).is_file() for d in run_dirs for s in SPLITS)]
    if not tasks:
        raise ScoresFileError(f"{scores_path(run_dirs[0], next(iter(METHODS)), 'dev').parent}: no scores of any task "
                              f"an ensemble combines ({', '.join(METHODS)}); a run writes them when it finishes")
    for run_dir in run_dirs:
        refuse_a_task_not_trained(Path(run_dir), tasks)
    members = [Member(Path(d), {(t, s): read_scores(scores_path(d, t, s), t) for t in tasks for s in SPLITS})
               for d in run_dirs]
    for index, member in enumerate(members[1:], start=1):
        for key, (ids, _) in member.scores.items():
            if ids != members[0].scores[key][0]:
                raise ScoresFileError(f"{scores_path(member.run_dir, *key)}: its ids differ from those of "
                                      f"{scores_path(members[0].run_dir, *key)}; members must answer the same data")
        for earlier in members[:index]:
            if all(np.array_equal(member.scores[key][1], earlier.scores[key][1]) for key in member.scores):
                raise ScoresFileError(f"{member.run_dir}: its scores are {earlier.run_dir}'s, all "
                                      f"{len(member.scores)} files; the same run twice (a copy) would count double, "
                                      "give it once")
    for member in members if calibrated else ():
        calibrate(member)
    return members


def refuse_a_task_not_trained(run_dir: Path, tasks: list[str]) -> None:
    """A finished run writes the scores of every task it trained at once: one with scores of some of `tasks` and no
    file of another did not train that one (ScoresFileError saying so, not that it is unfinished, which a run
    without any scores may be)."""
    scored = [task for task in tasks if any(scores_path(run_dir, task, split).is_file() for split in SPLITS)]
    untrained = [task for task in tasks if task not in scored]
    if scored and untrained:
        raise ScoresFileError(f"{run_dir}: no {', '.join(untrained)} scores: the run did not train "
                              f"{' or '.join(untrained)} (it has scores of {', '.join(scored)}); an ensemble combines "
                              "the tasks every member trained: give runs of the same tasks")


def member_tasks(members: list[Member]) -> list[str]:
    """The tasks the members have scores of, in the tasks' order."""
    return list(dict.fromkeys(task for task, _ in members[0].scores))


# ---------------------------------------------------------------------------------------------------
# Combining scores (arrays in, arrays out)


def member_predictions(task: str, scores: np.ndarray) -> np.ndarray:
    """One member's predictions, exactly as its own CSV has them: the run's own rule (the task's decide)."""
    return TASKS[task].model.decide(torch.from_numpy(scores)).numpy()


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
        """What one member adds to the sum (the task's ensemble_terms: e.g. its STS scores times its weight, or its
        SST / QQP class probabilities followed, for a vote, by one vote for its own class)."""
        return TASKS[self.task].outputs.ensemble_terms(scores, weight, self.method)

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
        return TASKS[self.task].outputs.ensemble_predictions(total, weights, self.method)


def combine(task: str, members: list[np.ndarray], method: str, weights: list[float] | None = None) -> np.ndarray:
    """The ensemble's predictions from its members' scores (one array per member, repeats allowed)."""
    ensemble = _RunningCombination(task, method)
    if TASKS[task].outputs.weighs_members(method):
        check_weights(TASKS[task].title, weights, len(members))
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
    weights = member_weights(task, method, list(range(len(members))), single) or [1.0] * len(members)
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
                                member_weights(task, method, chosen, single))
            held_out.append(metric(task, predicted, gold[score_on]))
    return float(np.mean(held_out))


def member_metrics(task: str, members: list[np.ndarray], gold: np.ndarray) -> list[float]:
    """Each member's own dev metric (accuracy; Pearson r for STS)."""
    return [metric(task, member_predictions(task, m), gold) for m in members]


def member_weights(task: str, method: str, chosen: list[int], metrics: list[float]) -> list[float] | None:
    """The weights of the chosen members (e.g. dev-weighted STS: each one's dev Pearson r, 0 if negative); None for
    methods of equal weights."""
    return TASKS[task].outputs.member_weights(method, chosen, metrics)


# ---------------------------------------------------------------------------------------------------
# The ensemble of finished runs


def dev_labels(data_dir: str | Path, ids: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Gold dev labels per task in the order of the members' ids."""
    labels = {}
    for task, task_ids in ids.items():
        by_id = {e.id: e.label for e in load_split(data_dir, task, "dev")}
        missing = [i for i in task_ids if i not in by_id]
        if missing:
            raise DataError(f"{data_dir}",
                            f"{task} dev has no example with id {missing[0]!r}, which the members answered")
        labels[task] = np.array([by_id[i] for i in task_ids])
    return labels


def run_score(metrics: dict[str, float], tasks: list[str]) -> float:
    """What ranks runs on these tasks' dev metrics: the course's overall score when they are its three tasks, else
    the kept-model score of the tasks (each on [0, 1], averaged)."""
    return overall_of(metrics) if sorted(tasks) == sorted(MULTITASK) else kept_model_score(metrics, tasks)


def build_ensemble(members: list[Member], gold: dict[str, np.ndarray], methods: dict[str, str],
                   select: bool) -> tuple[dict, dict]:
    """Predictions per (task, split) and a report: members chosen per task, weights, dev metrics; `gold` and
    `methods` per task of the members'."""
    tasks = member_tasks(members)
    predictions, report = {}, {"members": [str(m.run_dir) for m in members], "methods": methods,
                               "selected_on_dev": select, "tasks": {}}
    if any(member.temperatures for member in members):  # calibrated: what ensemble_train_scores divides by too
        report["temperatures"] = {str(member.run_dir): member.temperatures for member in members}
    for task in tasks:
        dev = [m.scores[(task, "dev")][1] for m in members]
        single = member_metrics(task, dev, gold[task])
        problem = TASKS[task].outputs.ensemble_problem(methods[task], single)
        if problem:
            raise EnsembleError(problem)
        chosen = greedy_selection(task, dev, gold[task], methods[task]) if select else list(range(len(members)))
        weights = member_weights(task, methods[task], chosen, single)
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
    for task in tasks:
        dev_metrics.update(task_metrics(task, predictions[(task, "dev")], gold[task]))
    dev_metrics["overall"] = run_score(dev_metrics, tasks)
    report["dev"] = dev_metrics
    member_overall = [run_score({PRIMARY_METRIC[t]: report["tasks"][t]["members_dev"][i] for t in tasks}, tasks)
                      for i in range(len(members))]
    best = int(np.argmax(member_overall))
    report["best_member"] = {"run": str(members[best].run_dir), "overall_dev": member_overall[best]}
    if select:
        report["held_out_overall"] = run_score({PRIMARY_METRIC[t]: report["tasks"][t]["held_out_dev"] for t in tasks},
                                               tasks)
    return predictions, report


# ---------------------------------------------------------------------------------------------------
# The ensemble as a teacher (--score_train, read by distillation.py)


def teacher_scores(task: str, members: list[np.ndarray], weights: list[float] | None = None) -> np.ndarray:
    """The ensemble's soft scores, in the runs' score space (the task's teacher_scores): SST the log of the members'
    mean class probabilities (their softmax is that mean), QQP the logit of the mean duplicate probability, STS the
    (weighted) mean score. A teacher gives its mean probabilities whichever way the ensemble decides (a vote has no
    probability)."""
    if weights is not None:
        check_weights(TASKS[task].title, weights, len(members))
    share = np.asarray(weights if weights is not None else [1.0] * len(members), dtype=np.float64)
    return TASKS[task].outputs.teacher_scores(members, share / share.sum())


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
        for run, path in zip(info["chosen"], paths):  # each member's own (its scores/train.json), if it records them
            check_train_scores(run, [path])
        temperatures = [report.get("temperatures", {}).get(run, {}).get(task, 1.0) for run in info["chosen"]]
        loaded = [(ids, scores / t) for (ids, scores), t in zip((read_scores(path, task) for path in paths),
                                                                 temperatures)]
        for path, (ids, _) in zip(paths[1:], loaded[1:]):
            if ids != loaded[0][0]:
                raise ScoresFileError(f"{path}: its ids differ from those of {paths[0]}; members must have scored "
                                      "the same training examples")
        combined[task] = (loaded[0][0], teacher_scores(task, [s for _, s in loaded], info["weights"]))
    if not combined:
        first_member = next(iter(report["tasks"].values()))["chosen"][0]
        raise ScoresFileError(f"{Path(first_member) / 'scores'}: no train scores of any task; "
                              "rerun the members with --score_train")
    return combined
