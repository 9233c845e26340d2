"""The peer run for SQuAD 2.0: transformers' BertForQuestionAnswering on this project's weights, data, windows
and machine (benchmark-only: transformers stays a test / benchmark dependency; nothing in the project imports
this script).

    python scripts/qa_peer.py --out runs/qa_peer.json                      # train 1 epoch, evaluate on dev
    python scripts/qa_peer.py --max_train_examples 200 --out /tmp/peer.json  # a smoke run
    python scripts/qa_peer.py --compare_steps 20 --out /tmp/steps.json     # same batches: minBERT span model vs
                                                                           # transformers, seconds per step

What is shared with this project's own QA run: the pretrained directory (`base_bert.resolve_pretrained`), the
tokenizer (`tokenizer.BertTokenizer`), the questions (`squad.load_squad`), the windows and their gold labels
(`squad.QAWindows.build`: [CLS] question [SEP] piece [SEP], doc_stride overlap, [CLS] when the window lacks the
answer), the batches (`QAWindows.collate`), the decoding and the official metric (`squad.decode_answers`,
`best_threshold`, `squad_metrics`). What is transformers': the model (`BertForQuestionAnswering.from_pretrained`,
whose qa_outputs head is new and initialised under --seed) and its loss (start and end cross-entropy, averaged).

Training as transformers' run_qa.py users run it by default: every window padded to --max_length
(--pad_to_max_length), a seeded random order, torch.optim.AdamW (weight decay 0), a constant learning rate (the
project's default schedule), no gradient clipping, float32. Evaluation pads each batch only to its longest window
(windows sorted by length; padding does not change a window's logits beyond float noise).

--compare_steps N times N training steps of minBERT with a linear span head (the project's encoder and its
optimizer.AdamW) against transformers' BertForQuestionAnswering on identical batches, the two alternating step by
step, and exits without the full training run.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import squad  # noqa: E402
from base_bert import resolve_pretrained  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402

SKIPPED_STEPS = 5  # steps left out of the mean step time (allocator and kernel warm-up)
EVAL_BATCH_SIZE = 64
COMPARE_WARMUP = 2  # untimed steps per side before --compare_steps' timed ones
METRIC_KEYS = ("em", "f1", "has_answer_em", "has_answer_f1", "no_answer_em", "no_answer_f1")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "squad"),
                        help="folder with train-v2.0.json and dev-v2.0.json")
    parser.add_argument("--pretrained", default="minilm-l6", help="a name or directory for resolve_pretrained")
    parser.add_argument("--max_length", type=int, default=384)
    parser.add_argument("--doc_stride", type=int, default=128)
    parser.add_argument("--max_answer_tokens", type=int, default=30)
    parser.add_argument("--n_best", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=11711)
    parser.add_argument("--max_train_examples", type=int, default=None,
                        help="train on a seeded random sample of this many questions (smoke tests)")
    parser.add_argument("--pad_to_max_length", action=argparse.BooleanOptionalAction, default=True,
                        help="pad every training window to --max_length (run_qa.py's default); "
                             "--no-pad_to_max_length pads each batch to its longest window")
    parser.add_argument("--compare_steps", type=int, default=0,
                        help="only time N training steps of minBERT + span head vs transformers on the same batches")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    for name in ("max_length", "doc_stride", "max_answer_tokens", "n_best", "batch_size", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.max_train_examples is not None and args.max_train_examples < 1:
        parser.error("--max_train_examples must be at least 1")
    if args.compare_steps < 0:
        parser.error("--compare_steps must be >= 0")
    return args


# -- data ------------------------------------------------------------------------------------------

def load_split(args, split: str, tokenizer, limit: int | None = None) -> squad.QAWindows:
    examples = squad.load_squad(Path(args.data_dir) / f"{split}-v2.0.json", split)
    if limit is not None and limit < len(examples):
        keep = sorted(random.Random(args.seed).sample(range(len(examples)), limit))  # file order kept
        examples = [examples[i] for i in keep]
    return squad.QAWindows.build(examples, tokenizer, args.max_length, args.doc_stride)


def batch_of(windows: squad.QAWindows, indices, pad_to: int | None = None) -> dict:
    """windows.collate(indices), padded further to `pad_to` tokens (pad id 0, mask 0, segment 0) when given."""
    batch = windows.collate(indices)
    extra = 0 if pad_to is None else pad_to - batch["input_ids"].shape[1]
    if extra > 0:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            batch[key] = F.pad(batch[key], (0, extra), value=0)
    return batch


def training_batches(windows: squad.QAWindows, args, epoch: int) -> list[list[int]]:
    """A seeded random permutation of the windows (a new one each epoch), cut into batches of batch_size."""
    order = np.random.RandomState(args.seed + epoch).permutation(len(windows)).tolist()
    return [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]


# -- the two models --------------------------------------------------------------------------------

def load_transformers_model(directory: Path, seed: int):
    """BertForQuestionAnswering from the pretrained directory; qa_outputs is new, initialised under `seed`.
    Returns the model and transformers' loading info (missing / unexpected keys)."""
    from transformers import BertForQuestionAnswering
    torch.manual_seed(seed)
    model, info = BertForQuestionAnswering.from_pretrained(str(directory), output_loading_info=True)
    info = {key: sorted(str(k) for k in value) for key, value in info.items() if isinstance(value, (list, set))}
    return model, info


def transformers_loss(model, batch) -> torch.Tensor:
    labels = batch["labels"]
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"], start_positions=labels[:, 0],
                 end_positions=labels[:, 1]).loss


class MinbertSpan(nn.Module):
    """minBERT with a linear (hidden -> start, end) head on its last hidden states: the stand-in for the project's
    QA model in --compare_steps, with transformers' loss (start and end cross-entropy, averaged)."""

    def __init__(self, bert, head: nn.Linear):
        super().__init__()
        self.bert, self.qa_outputs = bert, head

    def forward(self, batch) -> torch.Tensor:
        hidden = self.bert.encode(self.bert.embed(batch["input_ids"], batch["token_type_ids"]),
                                  batch["attention_mask"])  # (B, T, H); no key mask when nothing is padding
        start, end = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        labels = batch["labels"]
        return (F.cross_entropy(start, labels[:, 0]) + F.cross_entropy(end, labels[:, 1])) / 2


def minbert_span_model(directory: Path, reference) -> MinbertSpan:
    """minBERT from the same directory, with a copy of the transformers model's qa_outputs as its head."""
    from bert import BertModel
    bert = BertModel.from_pretrained(directory)
    head = nn.Linear(bert.config.hidden_size, 2)
    with torch.no_grad():
        head.weight.copy_(reference.qa_outputs.weight)
        head.bias.copy_(reference.qa_outputs.bias)
    return MinbertSpan(bert, head)


def timed_step(loss_fn, optimizer, batch) -> float:
    """One training step (forward, backward, optimizer step); its wall-clock seconds."""
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(batch)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


# -- training and evaluation -----------------------------------------------------------------------

def train(model, windows: squad.QAWindows, args) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)  # constant rate, no clipping
    pad_to = args.max_length if args.pad_to_max_length else None
    model.train()
    torch.manual_seed(args.seed)  # dropout
    step_times, losses = [], []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for indices in training_batches(windows, args, epoch):
            batch = batch_of(windows, indices, pad_to)
            step_start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = transformers_loss(model, batch)
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - step_start)
            losses.append(loss.item())
    train_seconds = time.perf_counter() - start
    timed = step_times[SKIPPED_STEPS:] or step_times  # a run of <= 5 steps: all of them
    return {"steps": len(step_times), "timed_steps": len(timed), "step_seconds": statistics.mean(timed),
            "step_seconds_median": statistics.median(timed), "train_seconds": train_seconds,
            "first_loss": losses[0], "last_loss": losses[-1],
            "mean_loss_last_10pct": statistics.mean(losses[-max(1, len(losses) // 10):]),
            "all_step_seconds": [round(t, 4) for t in step_times]}


@torch.inference_mode()
def window_logits(model, windows: squad.QAWindows, max_length: int) -> np.ndarray:
    """(N, max_length, 2) start / end logits of every window (zeros past a window's length)."""
    model.eval()
    logits = np.zeros((len(windows), max_length, 2), dtype=np.float32)
    order = sorted(range(len(windows)), key=lambda i: windows.lengths[i])
    for i in range(0, len(order), EVAL_BATCH_SIZE):
        indices = order[i:i + EVAL_BATCH_SIZE]
        batch = batch_of(windows, indices)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        stacked = torch.stack([out.start_logits, out.end_logits], dim=-1).float().numpy()  # (B, T, 2)
        logits[indices, :stacked.shape[1]] = stacked
    return logits


def evaluate(model, windows: squad.QAWindows, args) -> dict:
    start = time.perf_counter()
    logits = window_logits(model, windows, args.max_length)
    answers = squad.decode_answers(windows, logits, args.n_best, args.max_answer_tokens)
    examples = windows.examples
    tau = squad.best_threshold(answers, examples)
    at_zero = squad.squad_metrics(squad.predictions(answers, 0.0), examples)
    tuned = squad.squad_metrics(squad.predictions(answers, tau), examples)
    pick = lambda metrics, threshold: {**{k: metrics[k] for k in METRIC_KEYS if k in metrics}, "tau": threshold}  # noqa: E731
    return {"tau0": pick(at_zero, 0.0), "tuned": pick(tuned, tau), "eval_seconds": time.perf_counter() - start}


# -- same batches: minBERT span model vs transformers ----------------------------------------------

def compare_steps(args, directory: Path, windows: squad.QAWindows, steps: int) -> dict:
    """`steps` training steps of minBERT + a span head and of BertForQuestionAnswering on identical batches (the
    first batches of the training order, padded as --pad_to_max_length says), after COMPARE_WARMUP untimed steps
    each; the two alternate step by step (which goes first alternating too), so machine drift hits both."""
    from optimizer import AdamW
    reference, _ = load_transformers_model(directory, args.seed)
    ours = minbert_span_model(directory, reference)
    reference.train(), ours.train()
    sides = {
        "transformers": (lambda batch: transformers_loss(reference, batch),
                         torch.optim.AdamW(reference.parameters(), lr=args.lr, weight_decay=0.0)),
        "minbert": (ours, AdamW(ours.parameters(), lr=args.lr, weight_decay=0.0)),
    }
    pad_to = args.max_length if args.pad_to_max_length else None
    order = [i for indices in training_batches(windows, args, 0) for i in indices]
    needed = (COMPARE_WARMUP + steps) * args.batch_size
    order = (order * (needed // len(order) + 1))[:needed]  # a small set is cycled through
    batches = [batch_of(windows, order[i:i + args.batch_size], pad_to) for i in range(0, needed, args.batch_size)]
    times = {name: [] for name in sides}
    torch.manual_seed(args.seed)
    for number, batch in enumerate(batches):
        names = list(sides) if number % 2 == 0 else list(sides)[::-1]
        for name in names:
            seconds = timed_step(*sides[name], batch)
            if number >= COMPARE_WARMUP:
                times[name].append(seconds)
    result = {name: {"mean_step_seconds": statistics.mean(values), "median_step_seconds": statistics.median(values)}
              for name, values in times.items()}
    result["speedup_minbert_vs_transformers"] = (result["transformers"]["median_step_seconds"]
                                                 / result["minbert"]["median_step_seconds"])
    result["speedup_of_means"] = result["transformers"]["mean_step_seconds"] / result["minbert"]["mean_step_seconds"]
    result["timed_steps"], result["warmup_steps"] = steps, COMPARE_WARMUP
    result["batch_tokens"] = [int(b["input_ids"].numel()) for b in batches[COMPARE_WARMUP:]]
    result["batch_real_tokens"] = [int(b["attention_mask"].sum()) for b in batches[COMPARE_WARMUP:]]
    return result


# -- main ------------------------------------------------------------------------------------------

def settings(args, directory: Path) -> dict:
    import transformers
    return {"pretrained": args.pretrained, "pretrained_dir": str(directory), "data_dir": str(args.data_dir),
            "max_length": args.max_length, "doc_stride": args.doc_stride, "max_answer_tokens": args.max_answer_tokens,
            "n_best": args.n_best, "batch_size": args.batch_size, "eval_batch_size": EVAL_BATCH_SIZE,
            "lr": args.lr, "epochs": args.epochs, "seed": args.seed, "max_train_examples": args.max_train_examples,
            "pad_to_max_length": args.pad_to_max_length, "optimizer": "torch.optim.AdamW, weight_decay 0",
            "schedule": "constant", "precision": "float32", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.machine()}


def main(argv=None) -> int:
    args = parse_args(argv)
    directory = resolve_pretrained(args.pretrained)
    tokenizer = BertTokenizer.from_pretrained(directory)
    train_windows = load_split(args, "train", tokenizer, args.max_train_examples)
    result = {"settings": settings(args, directory),
              "train_questions": len(train_windows.examples), "train_windows": len(train_windows)}
    if args.compare_steps:
        result["compare_steps"] = compare_steps(args, directory, train_windows, args.compare_steps)
        c = result["compare_steps"]
        print(f"same batches, {args.compare_steps} steps: transformers {c['transformers']['median_step_seconds']:.3f} "
              f"s/step, minBERT {c['minbert']['median_step_seconds']:.3f} s/step, "
              f"speed-up {c['speedup_minbert_vs_transformers']:.2f}x")
    else:
        dev_windows = load_split(args, "dev", tokenizer)
        result.update(dev_questions=len(dev_windows.examples), dev_windows=len(dev_windows))
        model, info = load_transformers_model(directory, args.seed)
        result["loading_info"] = info
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        result["train"] = train(model, train_windows, args)
        result["dev"] = evaluate(model, dev_windows, args)
        t, d = result["train"], result["dev"]
        print(f"transformers peer: {result['train_windows']} train windows, {t['steps']} steps, "
              f"{t['step_seconds']:.3f} s/step (mean after {SKIPPED_STEPS}), train {t['train_seconds']:.0f} s, "
              f"{torch.get_num_threads()} thread(s); dev F1 {d['tuned']['f1']:.4f} EM {d['tuned']['em']:.4f} "
              f"(tau {d['tuned']['tau']:.3f}), at tau 0 F1 {d['tau0']['f1']:.4f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
