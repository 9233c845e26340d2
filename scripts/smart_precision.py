"""What does exact float32 buy SMART in training? --smart_precision exact against the run's precision.

For a few batches per task, with dropout on (training mode) and the same random state in every variant (so the
dropout masks and SMART's random start are the same draws), one SMART step of the trainer
(objective.compute_task_loss, the thesis' weights: lambda_s 5 for the pair tasks, 10 for SST; mu 1) runs in
exact float32 and again in each other precision the device offers: bf16 autocast (CPUs with native bf16, Ampere+
GPUs), fp16 autocast (CUDA) and float32 with TF32 matmuls (CUDA). Against exact float32 it prints, averaged over
the batches:

  * sign agreement: the share of coordinates where the first ascent gradient (d divergence / d delta, the direction
    the perturbation moves) has the same sign;
  * R_s: the relative difference of the smoothness term;
  * gradient cosine: the cosine between the step's whole weight gradients (task loss + SMART's penalty).

The same random state gives the same dropout masks only where every variant draws them with the same kernel, as
on the CPU. CUDA's fused kernels draw per data type (SDPA's attention kernels and the vectorised dropout differ
between float32 and bf16), so a GPU's 16-bit rows compare other masks as well as another precision. The row
"exact, other masks" reads them: exact float32 again under another random state, the spread that dropout alone
gives. A precision whose figures sit at that row's adds nothing dropout does not already.

    python scripts/smart_precision.py --data_dir ../shared/data/protocol
    python scripts/smart_precision.py --data_dir ../shared/data/protocol --device cuda   # on a GPU
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

import smart
from base_bert import CheckpointError
from bert import BertModel
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.batches import DataError, TokenizedExamples, load_split
from minbert.model.multitask_bert import MultitaskBERT, load_multitask_model
from minbert.run.training_args import parse_training_args
from minbert.runtime import has_native_bf16, place_encoder, to_device
from minbert.tasks import MULTITASK
from minbert.training.objective import compute_task_loss
from minbert.training.penalties.smart import SmartPenalty, smart_configs
from smart import SmartRegularizer
from tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]

# The thesis' SMART settings per task, read as a run reads the recipes' flags (scripts/_common.sh's SMART_FLAGS).
THESIS_SMART = smart_configs(parse_training_args(["--smart", "--smart_adv_weight", "5", "--smart_bregman_weight", "1",
                                                  "--smart_override", "sst:adv_weight=10"], __doc__))


def precisions(device: torch.device) -> list[str]:
    """The variants compared with exact float32 on this device."""
    if device.type == "cuda":
        return ["tf32", "bf16", "fp16"] if has_native_bf16(device) else ["fp16"]
    return ["bf16"] if has_native_bf16(device) else []


def context(precision: str, device: torch.device):
    if precision in ("bf16", "fp16"):
        return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return nullcontext()


OTHER_MASKS = "exact, other masks"  # exact float32 under another random state: dropout's own spread
OTHER_MASKS_SEED_OFFSET = 1_000_003


def one_step(model: MultitaskBERT, task: str, batch: dict, precision: str, seed: int) -> dict:
    """The first ascent gradient, R_s and the weight gradient of one SMART step in `precision`."""
    device = next(model.parameters()).device
    if precision == OTHER_MASKS:
        precision, seed = "exact", seed + OTHER_MASKS_SEED_OFFSET
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    config = dataclasses.replace(THESIS_SMART[task], precision="exact" if precision == "exact" else "run")
    regularizer = SmartRegularizer(model, config)
    seen: dict = {}
    normalise, regularize = smart._normalise, smart.adversarial_regularizer

    def first_gradient(gradient, config):  # the ascent direction, as the step computes it
        seen.setdefault("ascent", gradient.detach().float().flatten())
        return normalise(gradient, config)

    def smoothness(*args, **kwargs):
        value, skipped = regularize(*args, **kwargs)
        seen["r_s"] = value.detach().item()
        return value, skipped
    smart._normalise, smart.adversarial_regularizer = first_gradient, smoothness
    try:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(seed)
        with context(precision, device):
            loss, _ = compute_task_loss(model, task, batch, [SmartPenalty({task: regularizer})])
        loss.backward()
    finally:
        smart._normalise, smart.adversarial_regularizer = normalise, regularize
        torch.set_float32_matmul_precision("highest")
    seen["gradient"] = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
    return seen


def compare(reference: dict, other: dict) -> tuple[float, float, float]:
    """(sign agreement of the ascent direction, |R_s - R_s exact| / R_s exact, weight-gradient cosine)."""
    signs = (torch.sign(reference["ascent"]) == torch.sign(other["ascent"])).float().mean().item()
    r_s = abs(other["r_s"] - reference["r_s"]) / max(abs(reference["r_s"]), torch.finfo(torch.float32).tiny)
    cosine = torch.nn.functional.cosine_similarity(reference["gradient"], other["gradient"], dim=0).item()
    return signs, r_s, cosine


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(ROOT / "data"))
    parser.add_argument("--checkpoint", help="a MultitaskBERT checkpoint prefix (default: minilm-l6, new heads)")
    parser.add_argument("--split", default="train", choices=("train", "dev"))
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--seed", type=rng_seed, default=0)
    args = parser.parse_args(argv)
    for name in ("batches", "batch_size", "max_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    try:
        model = (load_multitask_model(args.checkpoint) if args.checkpoint
                 else MultitaskBERT(BertModel.from_pretrained("minilm-l6")))
        tokenizer = BertTokenizer.from_pretrained("minilm-l6")  # every supported checkpoint shares this vocabulary
        batches = {}
        for task in MULTITASK:
            examples = load_split(args.data_dir, task, args.split)[: args.batches * args.batch_size]
            tokenized = TokenizedExamples.tokenize(examples, tokenizer, args.max_length)
            batches[task] = [to_device(tokenized.collate(range(i, min(i + args.batch_size, len(examples)))), device)
                             for i in range(0, len(examples), args.batch_size)]
    except (DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model.to(device).train()  # dropout on: training as it runs
    place_encoder(model.bert.encoder, device)
    variants = precisions(device)
    if not variants:  # the other masks' rows still say how far dropout alone moves the step
        print(f"{device}: no precision other than float32 to compare (no native bf16 on this CPU): only other "
              "dropout masks' rows")
    print(f"model: {args.checkpoint or 'minilm-l6 + untrained heads'}; {args.batches} {args.split} batches of "
          f"{args.batch_size} per task, max_length {args.max_length}, dropout on; means over batches\n")
    print("| task | precision | ascent sign agreement | R_s relative difference | weight-gradient cosine |")
    print("|---|---|---|---|---|")
    for task in MULTITASK:
        references = [one_step(model, task, batch, "exact", args.seed + i) for i, batch in enumerate(batches[task])]
        for precision in [OTHER_MASKS, *variants]:
            rows = [compare(reference, one_step(model, task, batch, precision, args.seed + i))
                    for i, (reference, batch) in enumerate(zip(references, batches[task]))]
            signs, r_s, cosine = (sum(column) / len(rows) for column in zip(*rows))
            print(f"| {task} | {precision} | {signs:.4f} | {r_s:.2e} | {cosine:.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
