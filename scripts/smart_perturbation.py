"""How much does SMART's adversarial perturbation move the outputs, next to dropout noise?

For a few SST and STS dev batches, with the ascent of smart.find_perturbation (one step, inf-norm ball
of radius eps, start noise sigma = eps), this prints the divergence between the clean outputs and the
outputs at the adversarial point with dropout off, and the divergence between two dropout masks with no
perturbation, in float32 and under bf16 autocast. SMART's smoothness term is computed with dropout on,
so when the first number is orders of magnitude below the second, R_s mostly measures dropout
disagreement rather than sensitivity to the perturbation. The bf16 rows show why training runs SMART's
steps in float32 whatever the run's precision (smart.py): under raw bf16 autocast a 1e-5 perturbation is
rounded away and what remains is rounding noise.

    python scripts/smart_perturbation.py --data_dir ../shared/data/protocol --checkpoint runs/cpu_ss/best
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from base_bert import CheckpointError
from bert import BertModel
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.batches import DataError, collate_pairs, collate_sentences, load_split
from minbert.model.multitask_bert import MultitaskBERT, load_multitask_model
from minbert.runtime import autocast
from minbert.tasks import TASKS
from smart import DIVERGENCES, SmartConfig, find_perturbation
from tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]

MEASURED_TASKS = ("sst", "sts")


def batches(data_dir: str, task: str, tokenizer, count: int, size: int, max_length: int) -> list[dict]:
    examples = load_split(data_dir, task, "dev")[: count * size]
    collate = collate_pairs if TASKS[task].is_pair else collate_sentences
    return [collate(examples[i:i + size], tokenizer, max_length) for i in range(0, len(examples), size)]


def divergences(model: MultitaskBERT, task: str, batch: dict, epsilon: float, bf16: bool) -> tuple[float, float]:
    """(adversarial divergence with dropout off, divergence between two dropout masks)."""
    name = model.objectives[task].divergence
    divergence = DIVERGENCES[name]
    config = SmartConfig(epsilon=epsilon, noise_std=epsilon)
    with autocast(torch.device("cpu"), "bf16" if bf16 else "fp32"):
        model.eval()
        model.set_adapter(task)
        inputs = model.encoder_inputs(task, batch)
        embeddings = model.embed(inputs)

        def forward(e):
            return model.outputs_from_embeddings(task, e, inputs)

        clean = forward(embeddings)
        delta = find_perturbation(forward, embeddings, clean, name, config)
        with torch.no_grad():
            adversarial = divergence(forward(embeddings + delta), clean).item()
            model.train()
            dropout = divergence(forward(embeddings), forward(embeddings)).item()
    return adversarial, dropout


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(ROOT / "data"))
    parser.add_argument("--checkpoint", help="a MultitaskBERT checkpoint prefix (default: minilm-l6, new heads)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1e-5, 1e-3, 1e-1])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--seed", type=rng_seed, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        model = (load_multitask_model(args.checkpoint) if args.checkpoint
                 else MultitaskBERT(BertModel.from_pretrained("minilm-l6")))
        tokenizer = BertTokenizer.from_pretrained("minilm-l6")  # every supported checkpoint shares this vocabulary
        task_batches = {task: batches(args.data_dir, task, tokenizer, args.batches, args.batch_size, args.max_length)
                        for task in MEASURED_TASKS}
    except (DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"model: {args.checkpoint or 'minilm-l6 + untrained heads'}; {args.batches} dev batches of "
          f"{args.batch_size} per task; means over batches\n")
    print("| task (divergence) | eps | autocast | adversarial, dropout off | two dropout masks | ratio |")
    print("|---|---|---|---|---|---|")
    for task in MEASURED_TASKS:
        for epsilon in args.epsilons:
            for bf16 in (False, True):
                pairs = [divergences(model, task, batch, epsilon, bf16) for batch in task_batches[task]]
                adversarial = sum(p[0] for p in pairs) / len(pairs)
                dropout = sum(p[1] for p in pairs) / len(pairs)
                print(f"| {task} ({model.objectives[task].divergence}) | {epsilon:g} | {'bf16' if bf16 else 'fp32'} | "
                      f"{adversarial:.2e} | {dropout:.2e} | {adversarial / dropout:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
