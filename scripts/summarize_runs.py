"""Markdown rows for RESULTS.md from finished runs: the model kept (best overall dev score) of each run,
and mean ± sample std over the runs when more than one is given (e.g. the seeds of one configuration).

    python scripts/summarize_runs.py runs/cpu_sbert_bf16_s11711 runs/cpu_sbert_bf16_s1 runs/cpu_sbert_bf16_s2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COLUMNS = [("SST acc", "sst_acc"), ("SST F1 (w)", "sst_f1_weighted"), ("QQP acc", "qqp_acc"),
           ("QQP F1", "qqp_f1"), ("STS r", "sts_pearson"), ("overall", "overall")]


def read_run(run: Path) -> dict:
    """The kept model's dev metrics, the stage it came from, and the run's training minutes."""
    try:
        history = json.loads((run / "history.json").read_text())
        # Folders published without best.json hold runs made before runs kept the best score over the tasks
        # they train (evaluation.kept_model_score): those kept the first stage with the highest overall dev
        # score (never the pretrained row), which is what this reproduces.
        best = (json.loads((run / "best.json").read_text())["metrics"] if (run / "best.json").exists()
                else max(history[1:], key=lambda record: record["overall"]))
    except (OSError, json.JSONDecodeError, KeyError, ValueError) as err:
        raise SystemExit(f"error: {run}: not a finished run ({err})") from None
    return {**{key: best[key] for _, key in COLUMNS}, "best_after": f"stage {best['index'] + 1} ({best['stage']})",
            "final_overall": history[-1]["overall"],
            "train_minutes": sum(record.get("seconds", 0.0) for record in history[1:]) / 60}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (--output_dir of multitask_classifier.py)")
    args = parser.parse_args(argv)
    rows = {run.name: read_run(run) for run in args.runs}
    print("| run | " + " | ".join(name for name, _ in COLUMNS) + " | best after | final overall | train min |")
    print("|---" * (len(COLUMNS) + 4) + "|")
    for name, row in rows.items():
        cells = [f"{row[key]:.3f}" for _, key in COLUMNS]
        print(f"| {name} | " + " | ".join(cells)
              + f" | {row['best_after']} | {row['final_overall']:.3f} | {row['train_minutes']:.1f} |")
    if len(rows) > 1:
        cells = []
        for key in [key for _, key in COLUMNS] + ["final_overall", "train_minutes"]:
            values = [row[key] for row in rows.values()]
            digits = 1 if key == "train_minutes" else 3
            cells.append(f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}")
        print(f"| mean ± std ({len(rows)} runs) | " + " | ".join(cells[:len(COLUMNS)]) + " | — | "
              + " | ".join(cells[len(COLUMNS):]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
