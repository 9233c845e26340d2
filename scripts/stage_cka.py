"""Where a sequential run rewrites its encoder (issue 46, item 4): linear CKA, layer by layer, between each stage's
model (RUN/stage_N, which --keep_stage_models saves) and the model that stage began from: the one before it, the
best stage of the block before it under --stage_start best, the pretrained model for stage 1.

    python scripts/stage_cka.py runs/forgetting_none runs/forgetting_bregman --names none,bregman \\
        --data_dir ../shared/data/protocol --output_dir results/cpu_forgetting_cka

The sentences: the first --per_task dev texts of each of --tasks (a pair's first sentence), the same for every
model; a sentence's representation at a layer is its tokens' mean state there (minbert/reports/cka.py), in float32.
For each run it writes OUTPUT_DIR/NAME.json (every pair of its models' CKA per layer, on all the sentences and on
each task's, and each stage's with its start) and OUTPUT_DIR/NAME.png (the heat map of the latter); with two runs or
more, OUTPUT_DIR/compare.png (a line per run: a panel per stage against its start, then the last stage against stage
1 and against the pretrained model) and OUTPUT_DIR/compare_by_task.png (the last stage against stage 1 on each task's
sentences).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

from base_bert import CheckpointError
from bert import BertModel
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.files import atomic_write_text, forbidden_output, unwritable_folder
from minbert.model.checkpoint import changed_settings
from minbert.model.multitask_bert import MultitaskBERT, load_multitask_checkpoint
from minbert.reports.cka import (cka_matrices, dev_sentences, layer_representations, plot_cka_comparison,
                                 plot_stage_cka, sentence_spans, with_start)
from minbert.run.run_files import replaces_run_file
from minbert.run.run_record import recorded_pretrained
from minbert.run.training_args import TrainingArguments, field_defaults, resume_free_fields
from minbert.arguments import OneLineErrorParser
from minbert.tasks import MULTITASK, task_name
from minbert.training.stage_transitions import stage_starts
from tokenizer import BertTokenizer

STAGE_FILE = re.compile(r"stage_(\d+)\.json")
REPRESENTATION = ("each sentence's mean token state after the embeddings and after each layer (float32, eval mode, "
                  "each task's sentences through its own adapters)")


def stage_checkpoints(run: Path) -> list[tuple[Path, dict]]:
    """(prefix, metadata) of the run's stage_N checkpoints, by N; the metadata is the checkpoint's JSON."""
    numbered = sorted((int(m.group(1)), path) for path in run.glob("stage_*.json")
                      if (m := STAGE_FILE.fullmatch(path.name)))
    if not numbered:
        raise CheckpointError(f"{run}: no stage_N checkpoints (train the run with --keep_stage_models)")
    stages = []
    for number, path in numbered:
        try:
            metadata = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path}: cannot read it ({type(err).__name__}: {err})") from None
        if not (isinstance(metadata, dict) and isinstance(metadata.get("metrics"), dict)
                and "stage" in metadata["metrics"] and isinstance(metadata.get("args"), dict)):
            raise CheckpointError(f"{path}: not a stage checkpoint's metadata (no metrics with a stage, or no args)")
        if metadata["metrics"].get("index") != number:  # the trainer saves stage N's record as stage_N
            raise CheckpointError(f"{path}: holds stage {metadata['metrics'].get('index')!r}'s model, not stage "
                                  f"{number}'s (a checkpoint renamed or copied from another run?)")
        stages.append((path.with_suffix(""), metadata))
    check_one_run(run, stages)
    return stages


def check_one_run(run: Path, stages: list[tuple[Path, dict]]) -> None:
    """A CheckpointError naming the first stage_N.json whose settings ("args", every flag, seed and output_dir among
    them) differ from stage_1.json's, or best.json when its own differ (or it is missing or damaged): the stage
    models must all be those of the run in the folder (another run's stage_2.* copied in, or an earlier run's stage
    files beside a run trained since, would make a CKA that mixes runs). The flags a resume of the same run may
    change without changing what it trains (resume_free, output_dir excepted) are not compared; a flag added to the
    code since a checkpoint was written reads as its default, as --resume reads it."""
    defaults = field_defaults(TrainingArguments)
    free = resume_free_fields(TrainingArguments) - {"output_dir"}
    first_path, first = stages[0][0].with_suffix(".json"), stages[0][1]["args"]
    best = run / "best.json"
    try:
        kept = json.loads(best.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{best}: cannot read it ({type(err).__name__}), so the stage models cannot be checked "
                              "against the run's own settings") from None
    if not (isinstance(kept, dict) and isinstance(kept.get("args"), dict)):
        raise CheckpointError(f"{best}: not a checkpoint's metadata (no args)")
    for path, settings in [(prefix.with_suffix(".json"), metadata["args"]) for prefix, metadata in stages[1:]] + \
            [(best, kept["args"])]:
        # as --resume compares a checkpoint's flags with its own, a flag either side lacks read as its default
        differing = changed_settings(first, {**defaults, **settings}, free, defaults)
        if differing:
            key, ours, theirs = differing[0]
            raise CheckpointError(f"{path}: another run's checkpoint (its --{key} {theirs!r} is {ours!r} in "
                                  f"{first_path}); every stage_N and best of the run must come from one run")


def representations(run: Path, stages: list[tuple[Path, dict]], sentences: dict, batch_size: int) -> list:
    """layer_representations of the pretrained model the run began from, then of each stage's model."""
    pretrained = recorded_pretrained(stages[0][0], stages[0][1])
    tokenizer = BertTokenizer.from_pretrained(pretrained)
    max_length = stages[0][1]["args"].get("max_length", 128)
    device = torch.device("cpu")
    models = [lambda: MultitaskBERT(BertModel.from_pretrained(pretrained))]
    models += [lambda prefix=prefix: load_multitask_checkpoint(prefix, device)[0] for prefix, _ in stages]
    arrays = []
    for index, load in enumerate(models):
        arrays.append(layer_representations(load(), sentences, tokenizer, device, batch_size, max_length))
        print(f"{run}: model {index + 1} of {len(models)} encoded", flush=True)
    return arrays


def analyse(run: Path, sentences: dict, batch_size: int) -> dict:
    """The JSON of one run: its models, where each stage began, and the CKA matrices."""
    stages = stage_checkpoints(run)
    settings = stages[0][1]["args"]
    history = [{"stage": "pretrained"}] + [metadata["metrics"] for _, metadata in stages]
    starts = stage_starts(history, settings.get("stage_start", "last"), settings.get("simcse_keep", "last"))
    arrays = representations(run, stages, sentences, batch_size)
    matrices = cka_matrices(arrays, sentence_spans(sentences))
    layers = ["embeddings"] + [f"layer {i}" for i in range(1, arrays[0].shape[0])]
    models = [settings["pretrained"]] + [f"stage {m['metrics']['index']} ({m['metrics']['stage']})" for _, m in stages]
    return {"run": str(run), "representation": REPRESENTATION,
            "sentences": {task: len(examples) for task, examples in sentences.items()},
            "layers": layers, "models": models, "started_from": starts,
            "with_start": {name: np.round(with_start(m, starts), 5).tolist() for name, m in matrices.items()},
            "matrices": {name: np.round(m, 5).tolist() for name, m in matrices.items()}}


def write_run(result: dict, name: str, output_dir: Path) -> None:
    atomic_write_text(output_dir / f"{name}.json", json.dumps(result, indent=1) + "\n")
    stages = [f"{model} vs {result['models'][start]}"
              for model, start in zip(result["models"], result["started_from"]) if start is not None]
    title = f"{name}: each stage against the model it began from (linear CKA, {sum(result['sentences'].values())} dev sentences)"
    plot_stage_cka(np.array(result["with_start"]["all"]), stages, result["layers"], title, output_dir / f"{name}.png")
    print(f"wrote {output_dir / name}.json and .png")


def comparison_curves(results: dict[str, dict], span: str = "all") -> dict[str, dict[str, list[float]]]:
    """compare.png's panels on the sentences of `span`: one per stage position (the first run's labels) against the
    model it began from, then the last stage against stage 1 and against the pretrained model; each {run name ->
    CKA per layer}."""
    first = next(iter(results.values()))
    panels = {}
    for position, model in enumerate(first["models"][1:]):
        panels[f"{model} vs its start"] = {name: r["with_start"][span][position] for name, r in results.items()
                                           if position < len(r["with_start"][span])}
    return {**panels, **last_against(results, 1, span), **last_against(results, 0, span)}


def last_against(results: dict[str, dict], model: int, span: str) -> dict[str, dict[str, list[float]]]:
    """One panel: each run's last model against its model `model` (0: the pretrained one), on `span`'s sentences."""
    title = f"last stage vs {'stage 1' if model else 'pretrained'}" + (f", {span} sentences" if span != "all" else "")
    return {title: {name: [layer[-1][model] for layer in r["matrices"][span]] for name, r in results.items()}}


def folder_name_clash(runs: list[Path]) -> str | None:
    """Why the runs' folder names cannot name their results (each RESULT.json and .png): a run given twice, or two
    folders of one name; None when they can."""
    first: dict[str, Path] = {}
    for run in runs:
        other = first.setdefault(run.name, run)
        if other is run:
            continue
        if other.resolve() == run.resolve():
            return f"{run} is given twice: compare a run with another"
        return f"{other} and {run} share the folder name {run.name!r}, which names each run's results: name them " \
               "with --names"
    return None


def output_files(names: list[str], output_dir: Path) -> list[Path]:
    """What main writes: each run's NAME.json and NAME.png (write_run), with two runs or more the comparisons."""
    written = [output_dir / f"{name}.{suffix}" for name in names for suffix in ("json", "png")]
    return written + ([output_dir / "compare.png", output_dir / "compare_by_task.png"] if len(names) > 1 else [])


def bad_name(name: str) -> str | None:
    """Why a run's name cannot name its files in --output_dir (a path would write outside it: ../evil), or None."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return f"--names: {name!r} is not a plain file name (it names OUTPUT_DIR/NAME.json and .png)"
    return None


def pretrained_folders(runs: list[Path]) -> list[Path]:
    """The pretrained folders the runs' stage 1 is compared with (read as the first model): a run that cannot be read
    yet is refused later, after the output is checked."""
    folders = []
    for run in runs:
        try:
            prefix, metadata = stage_checkpoints(run)[0]
        except CheckpointError:
            continue
        pretrained = recorded_pretrained(prefix, metadata)
        if pretrained and Path(pretrained).is_dir():
            folders.append(Path(pretrained))
    return folders


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders holding stage_N.safetensors + .json")
    parser.add_argument("--names", help="comma-separated, one per run (default: the folders' names)")
    parser.add_argument("--data_dir", default="data", help="the course files (their dev splits)")
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--tasks", default=",".join(MULTITASK), help="whose dev sentences (default: %(default)s)")
    parser.add_argument("--per_task", type=int, default=500, help="dev sentences per task (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args(argv)
    if args.names is None:
        problem = folder_name_clash(args.runs)
        if problem:
            parser.error(problem)
    args.names = args.names.split(",") if args.names else [run.name for run in args.runs]
    if len(args.names) != len(args.runs) or len(set(args.names)) != len(args.names):
        parser.error(f"--names: give {len(args.runs)} different names, one per run, got {len(args.names)}")
    problem = next(filter(None, map(bad_name, args.names)), None)
    if problem:
        parser.error(problem)
    clash = {"compare", "compare_by_task"} & set(args.names) if len(args.names) > 1 else set()
    if clash:  # NAME.png would be replaced by the comparison's figure of that name
        parser.error(f"--names: {sorted(clash)[0]!r} names a figure of the comparison ({sorted(clash)[0]}.png); "
                     "choose another")
    if args.batch_size < 1:
        parser.error(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.per_task < 2:
        parser.error(f"--per_task: CKA needs at least 2 sentences per task, got {args.per_task}")
    typed, args.tasks = args.tasks, []
    try:
        args.tasks = [task_name(task, MULTITASK) for task in typed.split(",") if task.strip()]
    except ValueError as err:
        parser.error(f"--tasks: {err}")
    if not args.tasks:
        parser.error(f"--tasks: name at least one of {','.join(MULTITASK)}, got {typed!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    problem = unwritable_folder(args.output_dir) or forbidden_output("--output_dir", args.output_dir,
                                                                      own_runs=args.runs)
    # In a run's folder its own files are not ours to replace (--names best wrote OUTPUT_DIR/best.json over the
    # run's checkpoint): the names stay the user's (results/ holds NONE.json of --names none), each file is checked;
    # nor is the pretrained model's folder, which every run's stage 1 is compared with.
    reads = pretrained_folders(args.runs)
    problem = problem or next(filter(None, (forbidden_output("--output_dir", path, reads=reads, own_runs=args.runs)
                                            or replaces_run_file("--output_dir", path)
                                            for path in output_files(args.names, args.output_dir))), None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        for run in args.runs:  # every run checked before any model loads
            stage_checkpoints(run)
        sentences = dev_sentences(args.data_dir, args.tasks, args.per_task)
        results = {name: analyse(run, sentences, args.batch_size) for name, run in zip(args.names, args.runs)}
    except (DataError, CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, result in results.items():
        write_run(result, name, args.output_dir)
    if len(results) > 1:
        plot_cka_comparison(comparison_curves(results), args.output_dir / "compare.png")
        by_task = {}
        for span in next(iter(results.values()))["sentences"]:
            by_task.update(last_against(results, 1, span))
        plot_cka_comparison(by_task, args.output_dir / "compare_by_task.png")
        print(f"wrote {args.output_dir / 'compare.png'} and compare_by_task.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
