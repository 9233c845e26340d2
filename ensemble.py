"""Ensembles of finished runs: their saved scores (RUN/scores/, scores.py) combined into the six
leaderboard CSVs, without running any model again.

    python ensemble.py runs/a runs/b runs/c --output_dir runs/ensemble --data_dir data
    python ensemble.py runs/* --output_dir runs/ensemble --data_dir data --select      # greedy, on dev

SST and QQP: majority vote of the members' predictions (ties go to the class with the higher mean
probability) or the class of the mean probability (`mean`). STS: the mean of the members' 0-5 scores
or their mean weighted by each member's dev Pearson r (`weighted`). Members may differ in anything
(pooling, pair encoder, adapters, model size) as long as they answered the same examples.

--select picks each task's members by greedy forward selection with replacement on dev (Caruana et
al. 2004): start from the best member, add whichever member (again, if it helps) most improves the
dev metric, keep the best prefix. Its dev scores are then optimistic (the dev set chose the members),
and so are `weighted`'s, slightly; quote test scores for a dev-selected ensemble. Without test labels,
the held-out figure that --select also prints is the honest one: members chosen on a random half of
dev and the ensemble scored on the other half, both ways, averaged over five random halvings.

The dev metrics printed and written to OUTPUT_DIR/ensemble.json need the dev labels: --data_dir
holds the course files (as for training).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets import DataError, load_split, show_data_warnings_on_one_line
from evaluation import overall_score, summarize_line, task_metrics, unwritable_folder, write_predictions
from scores import ScoresFileError, read_scores, scores_path
from tasks import MULTITASK, default_output

SPLITS = ("dev", "test")
METHODS = {"sst": ("vote", "mean"), "qqp": ("vote", "mean"), "sts": ("mean", "weighted")}
PRIMARY_METRIC = {"sst": "sst_acc", "qqp": "qqp_acc", "sts": "sts_pearson"}  # what selection maximises
HELD_OUT_REPEATS = 5  # random halvings of dev averaged into the held-out figure


@dataclass
class Member:
    """One run's scores: (task, split) -> (ids, scores)."""
    run_dir: Path
    scores: dict[tuple[str, str], tuple[list[str], np.ndarray]]


def load_members(run_dirs: list[str | Path]) -> list[Member]:
    """Every run's six scores files; all members must answer the same ids in the same order."""
    members = [Member(Path(d), {(t, s): read_scores(scores_path(d, t, s), t) for t in MULTITASK for s in SPLITS})
               for d in run_dirs]
    for member in members[1:]:
        for key, (ids, _) in member.scores.items():
            if ids != members[0].scores[key][0]:
                raise ScoresFileError(f"{scores_path(member.run_dir, *key)}: its ids differ from those of "
                                      f"{scores_path(members[0].run_dir, *key)}; members must answer the same data")
    return members


# ---------------------------------------------------------------------------------------------------
# Combining scores (pure functions of arrays)


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
    """One member's predictions, exactly as its own CSV has them (losses.py's decide)."""
    if task == "sst":
        return scores.argmax(axis=-1)
    if task == "qqp":
        return (scores > 0).astype(np.int64)
    return scores


def combine(task: str, members: list[np.ndarray], method: str, weights: list[float] | None = None) -> np.ndarray:
    """The ensemble's predictions from its members' scores (one array per member, repeats allowed)."""
    if method not in METHODS[task]:
        raise ValueError(f"{task}: method must be one of {METHODS[task]}, got {method!r}")
    if task == "sts":
        stacked = np.stack(members)  # (M, N)
        if method == "mean":
            return stacked.mean(axis=0)
        if weights is None or len(weights) != len(members) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError("weighted STS needs one non-negative weight per member, not all zero")
        return np.average(stacked, axis=0, weights=weights)
    probabilities = np.mean([class_probabilities(task, m) for m in members], axis=0)  # (N, C)
    if method == "mean":
        return probabilities.argmax(axis=-1)
    votes = np.zeros_like(probabilities)
    for member in members:
        votes[np.arange(len(member)), member_predictions(task, member)] += 1
    # Most votes first; among tied classes, the one with the higher mean probability.
    leading = votes == votes.max(axis=-1, keepdims=True)
    return np.where(leading, probabilities, -np.inf).argmax(axis=-1)


def metric(task: str, predictions: np.ndarray, gold: np.ndarray) -> float:
    return task_metrics(task, predictions, gold)[PRIMARY_METRIC[task]]


def greedy_selection(task: str, members: list[np.ndarray], gold: np.ndarray, method: str,
                     rounds: int | None = None) -> list[int]:
    """Caruana et al.'s forward selection with replacement on dev: indices of the chosen members (a member
    may appear more than once, which weights it). Starts from the best single member; each round adds the
    member that scores best together with those chosen; returns the best-scoring prefix."""
    rounds = rounds or 2 * len(members)
    single = member_metrics(task, members, gold)
    chosen = [int(np.argmax(single))]
    best, best_size = single[chosen[0]], 1
    for _ in range(rounds - 1):
        trials = [metric(task, combine(task, [members[i] for i in chosen + [j]], method,
                                       member_weights(method, chosen + [j], single)), gold)
                  for j in range(len(members))]
        chosen.append(int(np.argmax(trials)))
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
# The command line


def dev_labels(data_dir: str | Path, ids: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Gold dev labels per task in the order of the members' ids."""
    labels = {}
    for task in MULTITASK:
        by_id = {e.id: e.label for e in load_split(data_dir, task, "dev")}
        missing = [i for i in ids[task] if i not in by_id]
        if missing:
            raise DataError(f"{data_dir}", f"{task} dev has no example with id {missing[0]!r}, which the members answered")
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="finished runs' output folders (each with scores/)")
    parser.add_argument("--output_dir", required=True, help="where the six CSVs and ensemble.json go")
    parser.add_argument("--data_dir", default="data", help="the course files, for the dev labels")
    parser.add_argument("--sst", choices=METHODS["sst"], default="vote")
    parser.add_argument("--qqp", choices=METHODS["qqp"], default="vote")
    parser.add_argument("--sts", choices=METHODS["sts"], default="mean")
    parser.add_argument("--select", action="store_true", help="greedy forward selection of members per task on dev")
    args = parser.parse_args(argv)
    show_data_warnings_on_one_line()
    problem = unwritable_folder(args.output_dir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        members = load_members(args.runs)
        gold = dev_labels(args.data_dir, {t: members[0].scores[(t, "dev")][0] for t in MULTITASK})
        predictions, report = build_ensemble(members, gold, {"sst": args.sst, "qqp": args.qqp, "sts": args.sts},
                                             args.select)
    except (ScoresFileError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    output_dir = Path(args.output_dir)
    try:
        for (task, split), predicted in predictions.items():
            path = output_dir / Path(default_output(task, split)).name
            write_predictions(path, members[0].scores[(task, split)][0], predicted.tolist(), task)
        (output_dir / "ensemble.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    except OSError as err:
        print(f"error: {output_dir}: cannot write there ({err.strerror or err})", file=sys.stderr)
        return 2
    for task, info in report["tasks"].items():
        print(f"{task}: members on dev {', '.join(f'{v:.4f}' for v in info['members_dev'])} -> ensemble "
              f"{info['ensemble_dev']:.4f} ({len(info['chosen'])} chosen)")
    print("ensemble on dev: " + summarize_line(report["dev"]))
    print(f"best member on dev: {report['best_member']['run']} (overall {report['best_member']['overall_dev']:.4f})")
    if args.select or args.sts == "weighted":
        print("note: the dev set chose the members or weights, so these dev scores are optimistic; quote test scores")
    if args.select:
        held_out = ", ".join(f"{t} {info['held_out_dev']:.4f}" for t, info in report["tasks"].items())
        print(f"held out (chosen on half of dev, scored on the other half, both ways, {HELD_OUT_REPEATS} random "
              f"halvings): {held_out}, "
              f"overall {report['held_out_overall']:.4f}")
    print(f"wrote the six CSVs and ensemble.json to {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
