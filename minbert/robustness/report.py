"""The robustness suite's table: per task and variant, the clean score, the score on the perturbed inputs, and the drop
(clean minus perturbed) with a bootstrap 95% interval, paired over the same examples (minbert/reports/bootstrap.py),
as markdown and as JSON.

    rows = score_rows("sst", "char", examples, clean_predictions, {"char_swap-0.1": predictions}, details, 1000, 0)
    markdown_table(rows), [row.as_json() for row in rows], predictions_json(rows)

The score is each task's own (its score_key: SST's and QQP's accuracy, STS's Pearson r). An interval covers the
examples alone: one run, one seed; a drop whose interval holds zero is "not separable" from no drop. The rows'
per-example predictions (predictions_json) let configurations be compared over seeds and the same examples
(minbert/reports/robustness_comparison.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from minbert.reports.bootstrap import Arm, Difference, Estimate, compare
from minbert.tasks import TASKS

CLEAN = "clean"


@dataclass(frozen=True)
class Predictions:
    """A row's examples in order: their ids, gold labels, and the decided predictions on the clean and the perturbed
    inputs (SST's and QQP's classes, STS's scores), as its scores compare them."""
    ids: tuple[str, ...]
    gold: np.ndarray
    clean: np.ndarray
    perturbed: np.ndarray


@dataclass(frozen=True)
class Row:
    """One variant of one task: its family (char, word, embedding, greedy), the examples scored, the clean and
    perturbed scores with their intervals, the drop, and what else the variant measured (`details`)."""
    task: str
    family: str
    variant: str
    examples: int
    clean: Estimate
    perturbed: Estimate
    drop: Difference
    details: dict = field(default_factory=dict)
    predictions: Predictions | None = field(default=None, repr=False, compare=False)

    def as_json(self) -> dict:
        """Its scores, without the per-example predictions (predictions_json)."""
        row = asdict(replace(self, predictions=None))
        del row["predictions"]
        row["drop"]["separable"] = self.drop.separable
        row["metric"] = TASKS[self.task].model.score_key
        return row


def score_rows(task: str, family: str, examples: Sequence, clean: np.ndarray, perturbed: Mapping[str, np.ndarray],
               details: Mapping[str, dict], replicates: int, seed: int) -> list[Row]:
    """A Row per variant of `perturbed` (name -> predictions of `examples`, in their order, as `clean` is)."""
    gold = np.array([example.label for example in examples], dtype=np.float64)
    ids = tuple(str(example.id) for example in examples)
    arms = [Arm(CLEAN, [{task: (np.asarray(clean, dtype=np.float64), gold)}])]
    arms += [Arm(name, [{task: (np.asarray(predictions, dtype=np.float64), gold)}])
             for name, predictions in perturbed.items()]
    comparison = compare(arms, (task,), replicates, seed)
    rows = []
    for name in perturbed:
        difference = comparison.differences[name][task]  # perturbed minus clean
        # 0.0 - x, not -x: a drop of zero prints as +0.0000, not -0.0000
        drop = Difference(0.0 - difference.value, 0.0 - difference.high, 0.0 - difference.low, difference.p)
        rows.append(Row(task, family, name, len(gold), comparison.scores[CLEAN][task], comparison.scores[name][task],
                        drop, dict(details.get(name, {})),
                        Predictions(ids, gold, np.asarray(clean), np.asarray(perturbed[name]))))
    return rows


def predictions_json(rows: Sequence[Row]) -> dict:
    """task -> family -> {ids, gold, clean, variants: name -> predictions}: each family's examples and its own clean
    predictions (an attack's are its first examples'), as robustness_predictions.json keeps them."""
    found: dict[str, dict[str, dict]] = {}
    for row in rows:
        family = found.setdefault(row.task, {}).setdefault(row.family, {
            "ids": list(row.predictions.ids), "gold": row.predictions.gold.tolist(),
            "clean": row.predictions.clean.tolist(), "variants": {}})
        family["variants"][row.variant] = row.predictions.perturbed.tolist()
    return found


def _detail_text(details: Mapping[str, object]) -> str:
    return ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in details.items())


def markdown_table(rows: list[Row]) -> list[str]:
    """The rows as a markdown table, a drop whose interval holds zero marked "not separable"."""
    lines = ["| task | family | variant | n | clean | perturbed | drop [95% interval] | p | |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        verdict = "" if row.drop.separable else "not separable"
        lines.append(f"| {TASKS[row.task].title} {TASKS[row.task].model.score_key.split('_')[-1]} | {row.family} | "
                     f"{row.variant} | {row.examples} | {row.clean.value:.4f} | {row.perturbed.value:.4f} | "
                     f"{row.drop.value:+.4f} [{row.drop.low:+.4f}, {row.drop.high:+.4f}] | {row.drop.p:.3f} | "
                     f"{'; '.join(filter(None, [verdict, _detail_text(row.details)]))} |")
    return lines
