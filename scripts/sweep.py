"""Hyperparameter sweeps of multitask_classifier.py on Optuna, resumable, on one machine or many (docs/sweeps.md).

    python scripts/sweep.py --study lr_smart --space space.json --trials 20 -- --demo
    python scripts/sweep.py --study lr_smart --space space.json --trials 20 --seeds 3 -- --config recipe.json
    python scripts/sweep.py ... --storage postgresql://user@host/sweeps      # workers on several machines

The flags after `--` are the base run, as multitask_classifier.py takes them; each trial adds the space's flags
(space.json: {"lr": {"float": [1e-5, 1e-3], "log": true}, "smart": {"choices": [true, false]},
"smart_weight": {"float": [1, 20], "when": {"smart": true}}}), its seed, its --output_dir
(SWEEPS/STUDY/trial_N, or trial_N/seed_S with --seeds) and its CSVs inside that folder. Every trial is an ordinary
run: its args.json reruns it with --config. The study lives in SWEEPS/STUDY.db (SQLite) unless --storage (or
$MINBERT_SWEEP_STORAGE, which keeps a password out of shell history) names another database; the same command run again, or by several workers at once, continues it, and a trial whose
worker was killed continues from its own checkpoint.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from minbert.arguments import OneLineErrorParser
from minbert.sweeps.base_run import check_base, check_data_files, check_objective
from minbert.sweeps.settings import Sweep, SweepError
from minbert.sweeps.space import check_space, parse_run, read_enqueued, read_space
from minbert.sweeps.study import (STORAGE_VARIABLE, forget_if_nothing_kept, open_study, refuse_if_every_trial_failed,
                                  shown_url, storage_url)
from minbert.sweeps.summary import report
from minbert.sweeps.trials import work


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True, help="the study's name: its folder SWEEPS/STUDY, its database")
    parser.add_argument("--space", required=True, type=Path, help="the search space, a JSON file (docs/sweeps.md)")
    parser.add_argument("--trials", type=int, default=20, help="trials of the whole sweep, all workers together")
    parser.add_argument("--timeout", type=float, help="seconds after which this worker begins no new trial")
    parser.add_argument("--objective", default="overall", help="a metric of metrics.jsonl, the kept model's")
    parser.add_argument("--direction", choices=("maximize", "minimize"), default="maximize")
    parser.add_argument("--seeds", type=int, default=1, help="runs per configuration, seeds SEED..SEED+K-1; "
                        "the trial's value is their mean")
    parser.add_argument("--pruner", choices=("median", "halving", "none"), default="median",
                        help="stops runs whose stage scores fall behind (the first seed's)")
    parser.add_argument("--startup_trials", type=int, default=5, help="trials the median pruner lets finish first")
    parser.add_argument("--warmup_stages", type=int, default=0, help="stages of each trial the median pruner never "
                        "stops at, e.g. until a sequential schedule has trained every task once")
    parser.add_argument("--sweeps_dir", type=Path, default=Path("runs/sweeps"))
    parser.add_argument("--storage", help=f"an SQLAlchemy database URL (default: ${STORAGE_VARIABLE}, else "
                        "sqlite:///SWEEPS/STUDY.db)")
    parser.add_argument("--heartbeat", type=int, default=60, help="seconds between a worker's signs of life; a "
                        "trial silent for 3 of them is continued by another worker")
    parser.add_argument("--enqueue", type=Path, help="a JSON object of the space's parameters (or a list of them): "
                        "configurations the first trials take, e.g. a recipe's own settings; queued once")
    parser.add_argument("base", nargs=argparse.REMAINDER, help="-- then multitask_classifier.py's flags")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.study):
        parser.error(f"--study {args.study!r}: use letters, digits, '_', '-' and '.' (it names a folder)")
    for name in ("trials", "seeds", "heartbeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.startup_trials < 0 or args.warmup_stages < 0 or (args.timeout is not None and not args.timeout > 0):
        parser.error("--startup_trials and --warmup_stages must be at least 0 and --timeout positive")
    args.base = args.base[1:] if args.base[:1] == ["--"] else args.base
    return args


def make_sweep(args: argparse.Namespace) -> Sweep:
    if args.warmup_stages and args.pruner != "median":
        raise SweepError(f"--warmup_stages is the median pruner's; --pruner is {args.pruner}")
    check_base(args.base)
    space = read_space(args.space)
    check_space(space, args.base, args.space, args.seeds)
    enqueued = read_enqueued(args.enqueue, space, args.base) if args.enqueue else ()
    base_run = parse_run(args.base + ["--output_dir", tempfile.gettempdir()], "the base flags after --")
    check_objective(args.objective, base_run)
    check_data_files(base_run)
    folder = args.sweeps_dir / args.study
    storage, source = storage_url(args.storage, args.sweeps_dir, args.study)
    return Sweep(args.study, folder, storage, f"{source} {shown_url(storage)}", space, tuple(args.base), args.objective, args.direction,
                 tuple(base_run.seed + i for i in range(args.seeds)), args.trials, args.timeout, args.pruner,
                 args.startup_trials, args.warmup_stages, args.heartbeat, enqueued)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import optuna
    except ImportError:
        print("error: scripts/sweep.py needs Optuna: pip install optuna (requirements.txt)", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = None
    try:
        sweep = make_sweep(args)
        args.sweeps_dir.mkdir(parents=True, exist_ok=True)
        study = open_study(sweep)
        work(study, sweep)
        refuse_if_every_trial_failed(study)
    except SweepError as err:
        forgotten = study is not None and forget_if_nothing_kept(study, sweep)
        print(f"error: {err}" + (f"; study {sweep.study} has no other trial, so it is removed: the same command "
                                 "begins it again" if forgotten else ""), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted between trials: rerun the same command to continue the sweep", file=sys.stderr)
        return 130
    report(study, sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
