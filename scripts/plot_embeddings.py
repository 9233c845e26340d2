"""t-SNE of SST dev sentence embeddings, coloured by gold label, for one model or several side by side.

    python scripts/plot_embeddings.py runs/NAME/stage_3 runs/NAME/stage_4 --data_dir data --output runs/NAME/sst_tsne_stages.png
    python scripts/plot_embeddings.py minilm-l6 runs/NAME/best --data_dir data --output before_after.png

A MODEL is a checkpoint prefix (runs/NAME/best, or runs/NAME/stage_N from --keep_stage_models) or a
pretrained model (a name or directory, read with mean pooling and no training). Every run already
writes its best model's plot as OUTPUT_DIR/sst_tsne.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from base_bert import CheckpointError, pretrained_config
from bert import BertModel
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.batches import DataError, load_split
from minbert.files import forbidden_output, unwritable_folder
from minbert.model.multitask_bert import MultitaskBERT, load_multitask_checkpoint
from minbert.reports.embedding_analysis import plot_tsne, sentence_embeddings
from minbert.run.run_files import replaces_run_file
from minbert.run.run_record import recorded_pretrained
from minbert.run.training_args import UsageError, check_max_length
from minbert.runtime import resolve_device
from minbert.tasks import course_file_name
from tokenizer import BertTokenizer, shortest_max_length

ROOT = Path(__file__).resolve().parents[1]
MAX_LENGTH = 128  # --max_length's default, as the runs' own


def is_checkpoint(name: str) -> bool:
    return Path(name).with_suffix(".json").is_file() and Path(name).with_suffix(".safetensors").is_file()


def model_files(name: str) -> list[Path]:
    """The files and folders a model's panel reads: a checkpoint's two files and the pretrained folder its tokenizer
    comes from, or a pretrained folder (a name of the Hub's is no file of the user's)."""
    if not is_checkpoint(name):
        return [Path(name)] if Path(name).is_dir() else []
    pretrained = recorded_pretrained(Path(name), read_metadata(name))
    return [Path(name).with_suffix(".json"), Path(name).with_suffix(".safetensors"),
            *([Path(pretrained)] if pretrained and Path(pretrained).is_dir() else [])]


def read_metadata(name: str) -> dict:
    try:
        metadata = json.loads(Path(name).with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{name}.json: cannot read it ({type(err).__name__}: {err})") from None
    return metadata if isinstance(metadata, dict) else {}


def positions(name: str) -> int:
    """The model's position table, from its config alone (a checkpoint's JSON, a pretrained model's config.json):
    --max_length is checked against it before any weights load."""
    if not is_checkpoint(name):
        return pretrained_config(name).max_position_embeddings
    config = read_metadata(name).get("bert_config")
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if not isinstance(value, int):
        raise CheckpointError(f"{name}.json: its bert_config records no max_position_embeddings")
    return value


def load_model(name: str, device) -> tuple[MultitaskBERT, str]:
    """(model, the pretrained model whose tokenizer it reads)."""
    if is_checkpoint(name):
        model, metadata = load_multitask_checkpoint(name, device)
        pretrained = recorded_pretrained(Path(name), metadata)
        if not pretrained:
            raise CheckpointError(f"{name}: does not say which pretrained model (tokenizer) it came from")
        return model, pretrained
    return MultitaskBERT(BertModel.from_pretrained(name)).to(device), name


def problem_before_loading(args: argparse.Namespace, output: Path) -> str | None:
    """Before the models run (a bad path costs no embeddings), why the command cannot: beside the checkpoints it reads
    (runs/NAME/...) is theirs to hold; another run's folder is not, nor any file it reads (a checkpoint's PREFIX.json
    and .safetensors, not only PREFIX; the data file) or a file of the run it writes beside (its sst_tsne.png); and
    --max_length against each model's positions (default: MAX_LENGTH, or the fewest positions if fewer)."""
    try:
        reads = [file for name in args.models for file in model_files(name)]
        reads.append(Path(args.data_dir) / course_file_name("sst", "dev"))
        problem = unwritable_folder(output.parent) or forbidden_output("--output", output, reads=reads,
                                                                       own_runs=args.models)
        problem = problem or replaces_run_file("--output", output)
        tables = {name: positions(name) for name in args.models}
        if args.max_length is None:
            args.max_length = min(MAX_LENGTH, *tables.values())
        for name, table in tables.items():  # a text longer than a model's positions would fail mid-run
            check_max_length(args.max_length, table, name)
    except (CheckpointError, UsageError) as err:
        return str(err)
    return problem


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="checkpoint prefixes or pretrained models, one panel each")
    parser.add_argument("--data_dir", default="data", help="the course files (ids-sst-dev.csv)")
    parser.add_argument("--output", required=True, help="the PNG to write")
    parser.add_argument("--max_length", type=int, help=f"tokens per sentence (default: {MAX_LENGTH}, or the fewest "
                        "positions of the models if fewer)")
    parser.add_argument("--use_gpu", action="store_true")
    parser.add_argument("--seed", type=rng_seed, default=0)
    args = parser.parse_args(argv)
    shortest = shortest_max_length(1)  # SST's sentences, one text each
    if args.max_length is not None and args.max_length < shortest:
        parser.error(f"--max_length must be >= {shortest}, got {args.max_length}: the tokenizer cannot cut a text "
                     "below its special tokens and a token of it")
    device = resolve_device(args.use_gpu)
    output = Path(args.output)
    problem = problem_before_loading(args, output)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        examples = load_split(args.data_dir, "sst", "dev")
        panels = {}
        for name in args.models:
            model, pretrained = load_model(name, device)
            tokenizer = BertTokenizer.from_pretrained(pretrained)
            panels[name] = sentence_embeddings(model, "sst", examples, tokenizer, device, max_length=args.max_length)
    except (DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        print(f"wrote {plot_tsne(panels, [e.label for e in examples], output, args.seed)}")
    except OSError as err:
        print(f"error: {output}: cannot write there ({err.strerror or err})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
