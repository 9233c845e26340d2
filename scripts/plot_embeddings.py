"""t-SNE of SST dev sentence embeddings, coloured by gold label, for one model or several side by side.

    python scripts/plot_embeddings.py runs/NAME/stage_3 runs/NAME/stage_4 --data_dir data --output runs/NAME/sst_tsne_stages.png
    python scripts/plot_embeddings.py minilm-l6 runs/NAME/best --data_dir data --output before_after.png

A MODEL is a checkpoint prefix (runs/NAME/best, or runs/NAME/stage_N from --keep_stage_models) or a
pretrained model (a name or directory, read with mean pooling and no training). Every run already
writes its best model's plot as OUTPUT_DIR/sst_tsne.png.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from base_bert import CheckpointError
from bert import BertModel
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.batches import DataError, load_split
from minbert.files import forbidden_output, unwritable_folder
from minbert.model.multitask_bert import MultitaskBERT, load_multitask_checkpoint
from minbert.reports.embedding_analysis import plot_tsne, sentence_embeddings
from minbert.run.run_record import recorded_pretrained
from minbert.runtime import resolve_device
from tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]


def load_model(name: str, device) -> tuple[MultitaskBERT, str]:
    """(model, the pretrained model whose tokenizer it reads)."""
    if Path(name).with_suffix(".json").is_file() and Path(name).with_suffix(".safetensors").is_file():
        model, metadata = load_multitask_checkpoint(name, device)
        pretrained = recorded_pretrained(Path(name), metadata)
        if not pretrained:
            raise CheckpointError(f"{name}: does not say which pretrained model (tokenizer) it came from")
        return model, pretrained
    return MultitaskBERT(BertModel.from_pretrained(name)).to(device), name


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="checkpoint prefixes or pretrained models, one panel each")
    parser.add_argument("--data_dir", default="data", help="the course files (ids-sst-dev.csv)")
    parser.add_argument("--output", required=True, help="the PNG to write")
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--use_gpu", action="store_true")
    parser.add_argument("--seed", type=rng_seed, default=0)
    args = parser.parse_args(argv)
    device = resolve_device(args.use_gpu)
    output = Path(args.output)
    # Before the models run: a bad path costs no embeddings. Beside the checkpoints it reads (runs/NAME/...) is
    # theirs to hold; another run's folder is not.
    problem = unwritable_folder(output.parent) or forbidden_output("--output", output, reads=args.models,
                                                                   own_runs=args.models)
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
