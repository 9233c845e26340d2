"""How robust is a run's model? Its kept model scored on perturbed dev sets and under two attacks, each beside the
clean score, with the drop's bootstrap 95% interval paired over the same examples (docs/robustness_suite.md).

    python scripts/robustness.py runs/demo --data_dir data/demo --max_examples 200 --attack_examples 50
    python scripts/robustness.py runs/other --perturbed_dir runs/demo/robustness/perturbed   # the same inputs
    python scripts/robustness.py runs/a runs/b runs/c --output_dir runs/abc_robustness --perturbed_dir ...  # ensemble

Families (--families): char (adjacent swap, insertion, deletion, keyboard typo) and word (deletion, adjacent swap,
a near neighbour in the model's input-embedding space) noise at each of --rates, on a seeded subset of
--max_examples dev examples per task; an embedding attack (projected gradient ascent on the gold loss in an
eps-ball around the input embeddings, SMART's threat model) at each of --epsilons; a greedy word-substitution
attack with --budget queries per example. The attacks run on the first --attack_examples of the subset. A pair
task's two sentences are both perturbed. A family's flags typed without the family (--families char --epsilons 0.1)
would do nothing and are refused.

The noisy sets are written once, in the course's format, with a manifest: to --perturbed_dir when it has none yet
(else OUTPUT_DIR/perturbed), and read back from --perturbed_dir when it has one (its seed, rates and subset then
decide: --seed, --rates or --max_examples typed with other values is refused), so that other runs are scored on
exactly the same inputs; each variant's folder is a --data_dir that predict.py reads too. Writes
OUTPUT_DIR/robustness.md and robustness.json (clean, perturbed and
drop [95% interval] per task and variant), robustness_predictions.json (each row's examples and predictions, for
scripts/compare_robustness.py), greedy-TASK.jsonl (each example's attack) and greedy/ (the texts the
greedy attack ended with, in the course's format).

Several runs are scored as their ensemble (--output_dir required; scripts/ensemble.py's `mean`: the mean class
probabilities, the mean STS score), a greedy query being one ensemble evaluation and the embedding attack one shared
perturbation ascending the members' mean gold loss; they must share the first run's max_length, hidden size and
tokenizer vocabulary, whose word neighbours are used (docs/robustness_suite.md#an-ensemble-of-runs).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from base_bert import CheckpointError
from minbert.arguments import OneLineErrorParser, flags_given, rng_seed
from minbert.data.batches import load_split
from minbert.files import (DataError, OutputError, atomic_write_text, forbidden_output, locked_folder,
                           show_data_warnings_on_one_line, unwritable_folder)
from minbert.robustness.embedding_attack import EmbeddingAttack
from minbert.robustness.greedy_attack import GreedyAttack
from minbert.robustness.neighbours import EmbeddingNeighbours
from minbert.robustness.perturbed_sets import (MANIFEST, PerturbedSets, SetOptions, make_sets, read_manifest,
                                               read_sets)
from minbert.robustness.report import markdown_table, predictions_json
from minbert.robustness.suite import FAMILIES, FamilyRun, SuiteSettings, run_families
from minbert.robustness.text_noise import CHAR_KINDS, WORD_KINDS, Noise
from minbert.run.kept_ensemble import check_members, checkpoint_json, load_scored
from minbert.run.run_outputs import run_settings
from minbert.run.run_record import recorded_path, working_dir_of
from minbert.runtime import resolve_device, seed_everything, use_tf32
from minbert.tasks import TASKS, TEXT_TASKS, task_name


def names(text: str, allowed: tuple[str, ...], flag: str, parser: argparse.ArgumentParser) -> list[str]:
    """A comma-separated list of `allowed` names (a task's course aliases too), or the parser's error naming `flag`."""
    chosen = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            chosen.append(item if item in allowed else task_name(item, allowed))
        except ValueError:
            parser.error(f"{flag}: {item!r} is not one of {', '.join(allowed)}")
    if not chosen:
        parser.error(f"{flag}: name at least one of {', '.join(allowed)}")
    return list(dict.fromkeys(chosen))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="run", help="a run's folder (its kept model, best) or a checkpoint "
                        "prefix; several: their ensemble")
    parser.add_argument("--data_dir", help="the course's dev files (default: the (first) run's own --data_dir)")
    parser.add_argument("--tasks", help=f"comma-separated, some of {', '.join(TEXT_TASKS)} (default: the model's)")
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help=f"comma-separated, some of {', '.join(FAMILIES)}")
    parser.add_argument("--output_dir", type=Path, help="default: RUN/robustness (an ensemble: required)")
    parser.add_argument("--perturbed_dir", type=Path, help="the noisy sets: read when it holds a manifest, else made "
                        "there (default: OUTPUT_DIR/perturbed)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.1, 0.2],
                        help="the noise rates: shares of the words each kind applies to that it changes")
    parser.add_argument("--max_examples", type=int, default=1000, help="dev examples per task (0: all of them)")
    parser.add_argument("--attack_examples", type=int, default=100, help="of those, how many each attack runs on")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1e-3, 1e-2, 3e-2, 1e-1],
                        help="the embedding attack's radii (each entry of the perturbation within [-eps, eps])")
    parser.add_argument("--attack_steps", type=int, default=10, help="ascent steps per radius")
    parser.add_argument("--budget", type=int, default=50, help="the greedy attack's queries per example")
    parser.add_argument("--neighbours", type=int, default=8, help="nearest words per word (noise and greedy attack)")
    parser.add_argument("--regression_margin", type=float, default=1.0,
                        help="a greedy attack on STS succeeds when its absolute error grows by this much")
    parser.add_argument("--seed", type=rng_seed, default=0, help="of the subset and every variant's noise")
    parser.add_argument("--replicates", type=int, default=1000, help="bootstrap replicates of each interval")
    parser.add_argument("--batch_size", type=int, help="default: the run's --eval_batch_size")
    parser.add_argument("--use_gpu", action="store_true", help="run on CUDA when there is a GPU")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given = flags_given(parser, argv)  # typed: check_set_flags_agree refuses what existing sets would ignore
    if len(args.runs) > 1 and args.output_dir is None:
        parser.exit(2, f"{parser.prog}: error: --output_dir: name the folder for the ensemble of {len(args.runs)} "
                       "runs' files\n")
    args.tasks = names(args.tasks, TEXT_TASKS, "--tasks", parser) if args.tasks else None
    args.families = names(args.families, tuple(FAMILIES), "--families", parser)
    problem = flag_without_family(args)
    if problem:
        parser.error(problem)
    bounds = [("--max_examples", args.max_examples, 0), ("--attack_examples", args.attack_examples, 1),
              ("--neighbours", args.neighbours, 1), ("--replicates", args.replicates, 100)]
    if args.batch_size is not None:  # None: the run's own --eval_batch_size
        bounds.append(("--batch_size", args.batch_size, 1))
    for flag, value, low in bounds:
        if value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    try:
        args.noises = [Noise(kind, rate) for kind in CHAR_KINDS + WORD_KINDS for rate in sorted(set(args.rates))]
    except ValueError:
        parser.error(f"--rates must each be in (0, 1], got {' '.join(map(str, args.rates))}")
    try:
        args.embedding = EmbeddingAttack(tuple(sorted(set(args.epsilons))), args.attack_steps)
    except ValueError as err:
        parser.error(f"--epsilons / --attack_steps: {err}")
    if not (math.isfinite(args.regression_margin) and args.regression_margin > 0):
        parser.error(f"--regression_margin must be a finite number > 0, got {args.regression_margin}")
    if args.budget < 1:
        parser.error(f"--budget must be >= 1, got {args.budget}")
    args.greedy = GreedyAttack(args.budget, args.regression_margin)
    return args


def flag_without_family(args: argparse.Namespace) -> str | None:
    """Why a flag typed would do nothing, in one line, or None: a family's setting (Family.flags) that no family of
    --families reads."""
    for flag in dict.fromkeys(flag for family in FAMILIES.values() for flag in family.flags):
        if flag in args.given and not any(flag in FAMILIES[name].flags for name in args.families):
            users = [name for name, family in FAMILIES.items() if flag in family.flags]
            which = f"the {users[0]} family uses" if len(users) == 1 else \
                f"the {', '.join(users[:-1])} and {users[-1]} families use"
            return f"--{flag} would do nothing with --families {','.join(args.families)}: only {which} it"
    regressions = [task for task in args.tasks or TEXT_TASKS if not TASKS[task].num_classes]
    if "regression_margin" in args.given and not regressions:  # the greedy attack's success on a score (STS)
        return f"--regression_margin would do nothing with --tasks {','.join(args.tasks)}: only a task scored as a " \
               "number (sts) reads it"
    return None


def check_inputs(args: argparse.Namespace) -> tuple[list[Path], list[str], Path, PerturbedSets | dict]:
    """Everything the flags name, before a model loads: the checkpoints (members of one ensemble, checked), the
    tasks, the sets' folder, and the sets read from it (checked), or when it has none yet the dev examples to make
    them from (the first run's --data_dir by default)."""
    prefixes, tasks = check_members(args.runs, args.tasks)
    run = Path(args.runs[0])
    args.output_dir = args.output_dir or (run if run.is_dir() else prefixes[0].parent) / "robustness"
    sets_dir = args.perturbed_dir or args.output_dir / "perturbed"
    for folder in {args.output_dir, sets_dir}:
        problem = unwritable_folder(folder)
        if problem:
            raise OutputError(problem)
    if sets_dir.resolve() == args.output_dir.resolve():
        raise OutputError(f"--output_dir {args.output_dir}: the same folder as --perturbed_dir; the perturbed sets "
                          "are read there by every run scored on them, the results are this run's: name another "
                          "--output_dir (by default RUN/robustness)")
    # The sets are read back from their folder (after making them, too): the results never go among them.
    problem = forbidden_output("--output_dir", args.output_dir, reads=[sets_dir], own_runs=args.runs)
    if problem:
        raise OutputError(problem)
    manifest = read_manifest(sets_dir)
    if manifest is not None:
        check_set_flags_agree(args, manifest, sets_dir)
        sets_made_by_another_model(manifest, prefixes, sets_dir)
        return prefixes, tasks, sets_dir, read_sets(sets_dir, tasks)
    check_attack_examples(args, args.max_examples or None, sets_dir, "--max_examples")
    settings = run_settings(run) if run.is_dir() else {}
    data_dir = args.data_dir or recorded_path(settings.get("data_dir") or "data", working_dir_of(run, settings))
    args.data_dir = str(data_dir)
    for flag, folder in (("--output_dir", args.output_dir), ("--perturbed_dir", sets_dir)):  # sets written now
        problem = forbidden_output(flag, folder, reads=[data_dir], own_runs=args.runs) or holds_data(
            flag, folder, data_dir)
        if problem:
            raise OutputError(problem)
    return prefixes, tasks, sets_dir, {task: load_split(data_dir, task, "dev") for task in tasks}


def holds_data(flag: str, folder: Path, data_dir: str | Path) -> str | None:
    """Why `folder` must not be written, being above the data folder the sets are made from (forbidden_output refuses
    it there and below): the data's tree is the user's input, and the fixed names written there (greedy/, perturbed/,
    a variant's folder) could be that data's own folders, their course files the dev files it reads."""
    data = Path(data_dir).resolve()
    if data.is_relative_to(folder.resolve()):
        return f"{flag} {folder}: holds {data_dir}, the data folder this command reads; write elsewhere"
    return None


def check_attack_examples(args: argparse.Namespace, subset: object, sets_dir: Path, source: str) -> None:
    """--attack_examples typed above the sets' examples a task (`subset`, as `source` gives it; None: all) would do
    nothing beyond them: the attacks run on the first of those. A DataError naming the sets' folder."""
    if "attack_examples" in args.given and isinstance(subset, int) and args.attack_examples > subset:
        raise DataError(sets_dir, f"--attack_examples {args.attack_examples} would do nothing: the attacks run on the "
                                  f"first examples of the perturbed sets, {subset} a task here ({source}); name at "
                                  f"most {subset}")


def say(args: argparse.Namespace):
    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)
    return progress


def scored(args: argparse.Namespace, prefixes: list[Path]) -> tuple[dict, str, str]:
    """What was scored: the record's keys naming it (with each checkpoint's weights' SHA-256, which loading checked:
    compare_robustness.py matches it with the run folder the results lie in, whose paths may have moved), the
    report's title, and what an interval covers."""
    digests = [checkpoint_json(prefix).get("sha256") for prefix in prefixes]
    if len(prefixes) == 1:
        return ({"run": str(args.runs[0]), "checkpoint": str(prefixes[0]), "checkpoint_sha256": digests[0]},
                f"# Robustness of {args.runs[0]}", "one run")
    return ({"members": [str(run) for run in args.runs], "checkpoints": [str(prefix) for prefix in prefixes],
             "checkpoints_sha256": digests, "ensemble": "mean"},
            f"# Robustness of an ensemble of {len(prefixes)} runs: {', '.join(args.runs)}",
            f"one ensemble of {len(prefixes)} runs, the mean of their class probabilities and STS scores")


def write_report(args, prefixes: list[Path], sets, rows: list, seconds: dict, outcomes: dict, sets_dir: Path) -> None:
    names, title, what = scored(args, prefixes)
    settings = {**names, "perturbed_dir": str(sets_dir), "families": args.families,
                "attack_examples": args.attack_examples,
                "epsilons": list(args.embedding.epsilons), "attack_steps": args.embedding.steps,
                "budget": args.budget, "neighbours": args.neighbours, "regression_margin": args.regression_margin,
                "replicates": args.replicates, "seed": args.seed, "sets": {k: sets.manifest[k] for k in (
                    "seed", "max_examples", "tasks", "source")}}
    report = {"settings": settings, "seconds": seconds, "rows": [row.as_json() for row in rows]}
    atomic_write_text(args.output_dir / "robustness.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(args.output_dir / "robustness_predictions.json", json.dumps(predictions_json(rows)) + "\n")
    lines = [title, "", f"Perturbed sets: {sets_dir} (seed {sets.manifest['seed']}); "
             f"{args.replicates} bootstrap replicates over the examples ({what}: the intervals say nothing about "
             "another seed). Drop = clean - perturbed; seconds per family and task: " + json.dumps(seconds), "",
             *markdown_table(rows), ""]
    atomic_write_text(args.output_dir / "robustness.md", "\n".join(lines))
    for family, by_task in outcomes.items():
        for task, found in by_task.items():
            FAMILIES[family].write_outcomes(args.output_dir, task, found)


def check_set_flags_agree(args: argparse.Namespace, manifest: dict, sets_dir: Path) -> None:
    """--seed, --rates and --max_examples make the sets; sets read back are as their manifest says they were made, so
    one of these flags typed with another value would do nothing: a DataError naming the folder, the flag and the
    value the sets were made with (the same value is accepted: a study's recipe repeats it on every run)."""
    variants = manifest["variants"].values()
    made = {"seed": manifest.get("seed"), "max_examples": manifest.get("max_examples"),
            "rates": sorted({variant.get("rate") for variant in variants if isinstance(variant, dict)})}
    asked = {"seed": args.seed, "max_examples": args.max_examples or None, "rates": sorted(set(args.rates))}
    for name, value in asked.items():
        if name in args.given and value != made[name]:
            raise DataError(sets_dir, f"--{name} would do nothing: these perturbed sets were made with --{name} "
                                      f"{_as_typed(made[name])} ({MANIFEST}); drop the flag, or name another "
                                      "--perturbed_dir to make new ones")
    check_attack_examples(args, made["max_examples"], sets_dir, MANIFEST)


def sets_made_by_another_model(manifest: dict, prefixes: list[Path], sets_dir: Path) -> None:
    """A DataError naming the manifest when the sets' word_neighbour texts came from another model of a run folder
    scored now: the manifest's source names the checkpoint whose embeddings made them and (sets made since this
    check) its weights' SHA-256, and a scored checkpoint in that same folder now holds other weights (the run trained
    again there since, or resumed to another kept model: those texts are not this model's neighbours). Sets made by
    ANOTHER run are read on purpose (--perturbed_dir shared by a study's runs: the same inputs for every model), and
    sets recording no digest (made before it was recorded) cannot be told apart, so both are read. A fresh training
    run removes RUN/robustness/ (run_files.robustness_files) besides; this covers the sets it cannot: a resumed run,
    sets copied into the folder, or a RUN/robustness/perturbed made before that removal existed."""
    source = manifest.get("source") if isinstance(manifest.get("source"), dict) else {}
    made_by, digest = source.get("run"), source.get("run_sha256")
    if not (isinstance(made_by, str) and isinstance(digest, str)):
        return
    for prefix in prefixes:
        if Path(made_by).resolve().parent != prefix.resolve().parent:
            continue
        now = checkpoint_json(prefix).get("sha256")
        if now != digest:
            raise DataError(sets_dir / MANIFEST, f"these perturbed sets were made from {made_by}'s embeddings when it "
                                                 f"held other weights (SHA-256 {digest[:12]}..., now {str(now)[:12]}"
                                                 "...): the run was trained again since; remove the folder to make "
                                                 "the new model's sets, or name another --perturbed_dir")


def _as_typed(value) -> str:
    """A flag's value in a manifest as the command line types it: rates space-separated, all examples 0."""
    return " ".join(f"{rate:g}" for rate in value) if isinstance(value, list) else str(0 if value is None else value)


def evaluate(args: argparse.Namespace) -> int:
    prefixes, tasks, sets_dir, sets = check_inputs(args)
    seed_everything(args.seed)
    device = resolve_device(args.use_gpu)
    use_tf32(device)
    attacks_embeddings = any(FAMILIES[family].attacks_embeddings for family in args.families)
    predictor, first = load_scored(prefixes, args.runs, device, args.batch_size, tasks if attacks_embeddings else [])
    neighbours = EmbeddingNeighbours(first.splits.tokenizer.backend.get_vocab(),
                                     first.model.bert.embeddings.word_embeddings.weight, args.neighbours)
    with locked_folder(args.output_dir):
        start, made = time.perf_counter(), not isinstance(sets, PerturbedSets)
        if made:  # `sets` holds the dev examples: the sets are made here, then read back
            with locked_folder(sets_dir):
                # run_sha256: the weights whose embeddings gave the word neighbours (sets_made_by_another_model)
                source = {"run": str(prefixes[0]), "run_sha256": checkpoint_json(prefixes[0]).get("sha256"),
                          "data_dir": args.data_dir, "neighbours": args.neighbours}
                make_sets(sets_dir, sets, args.noises, SetOptions(args.seed, args.max_examples or None), neighbours,
                          source)
            say(args)(f"wrote {len(args.noises)} perturbed sets per task in {sets_dir}")
            sets = read_sets(sets_dir, tasks)
        making = round(time.perf_counter() - start, 1)
        settings = SuiteSettings(args.attack_examples, args.embedding, args.greedy, args.replicates, args.seed)
        rows, seconds, outcomes = run_families(args.families, tasks,
                                               FamilyRun(predictor, sets, neighbours, settings, say(args)))
        if made:
            seconds["making the sets"] = making
        write_report(args, prefixes, sets, rows, seconds, outcomes, sets_dir)
    print("\n".join(markdown_table(rows)))
    say(args)(f"wrote {args.output_dir / 'robustness.md'} and robustness.json")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    try:
        return evaluate(args)
    except (CheckpointError, DataError, OutputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
