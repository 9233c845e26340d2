"""qa_peer: the SQuAD 2.0 peer run (transformers' BertForQuestionAnswering on this project's weights, data and
windows), with its own command line (QA_PEER_DOC), and minBERT with a span head timed against it on the same
batches.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from base_bert import CheckpointError, pretrained_config, resolve_pretrained
from bert import BertModel
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.benchmarks.settings import ROOT
from minbert.files import DataError, unwritable_folder
from minbert.tasks import squad
from optimizer import AdamW
from tokenizer import BertTokenizer, shortest_max_length


@dataclass(frozen=True)
class QAPeerSettings:
    """qa_peer's flags, checked (qa_peer_arguments); the defaults are its command line's."""
    data_dir: str = str(ROOT.parent / "shared" / "data" / "squad")
    pretrained: str = "minilm-l6"
    max_length: int = 384
    doc_stride: int = 128
    max_answer_tokens: int = 30
    n_best: int = 20
    batch_size: int = 16
    lr: float = 5e-5
    epochs: int = 1
    seed: int = 11711
    max_train_examples: int | None = None
    pad_to_max_length: bool = True
    compare_steps: int = 0
    out: Path | None = None


# ---------------------------------------------------------------------------------------------------
# qa_peer: the SQuAD 2.0 peer, its own command line (python scripts/benchmark.py qa_peer --help)

QA_PEER_DOC = """benchmark.py qa_peer, the peer run for SQuAD 2.0: transformers' BertForQuestionAnswering on this
project's weights, data, windows and machine (transformers stays a test / benchmark dependency).

    python scripts/benchmark.py qa_peer --out runs/qa_peer.json            # train 1 epoch, evaluate on dev
    python scripts/benchmark.py qa_peer --max_train_examples 200 --out /tmp/peer.json     # a smoke run
    python scripts/benchmark.py qa_peer --compare_steps 20 --out /tmp/steps.json
        # same batches: minBERT span model vs transformers, seconds per step

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
QA_SKIPPED_STEPS = 5  # steps left out of the mean step time (allocator and kernel warm-up)
QA_EVAL_BATCH_SIZE = 64
QA_COMPARE_WARMUP = 2  # untimed steps per side before --compare_steps' timed ones
QA_METRIC_KEYS = ("em", "f1", "has_answer_em", "has_answer_f1", "no_answer_em", "no_answer_f1")


def qa_peer_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="benchmark.py qa_peer", description=QA_PEER_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=QAPeerSettings.data_dir,
                        help="folder with train-v2.0.json and dev-v2.0.json")
    parser.add_argument("--pretrained", default=QAPeerSettings.pretrained,
                        help="a name or directory for resolve_pretrained")
    parser.add_argument("--max_length", type=int, default=QAPeerSettings.max_length)
    parser.add_argument("--doc_stride", type=int, default=QAPeerSettings.doc_stride)
    parser.add_argument("--max_answer_tokens", type=int, default=QAPeerSettings.max_answer_tokens)
    parser.add_argument("--n_best", type=int, default=QAPeerSettings.n_best)
    parser.add_argument("--batch_size", type=int, default=QAPeerSettings.batch_size)
    parser.add_argument("--lr", type=float, default=QAPeerSettings.lr)
    parser.add_argument("--epochs", type=int, default=QAPeerSettings.epochs)
    parser.add_argument("--seed", type=rng_seed, default=QAPeerSettings.seed)
    parser.add_argument("--max_train_examples", type=int, default=QAPeerSettings.max_train_examples,
                        help="train on a seeded random sample of this many questions (smoke tests)")
    parser.add_argument("--pad_to_max_length", action=argparse.BooleanOptionalAction,
                        default=QAPeerSettings.pad_to_max_length,
                        help="pad every training window to --max_length (run_qa.py's default); "
                             "--no-pad_to_max_length pads each batch to its longest window")
    parser.add_argument("--compare_steps", type=int, default=QAPeerSettings.compare_steps,
                        help="only time N training steps of minBERT + span head vs transformers on the same batches")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    return parser


def qa_peer_arguments(argv=None) -> QAPeerSettings:
    """qa_peer's flags, checked: one line and exit code 2 for a bad one, before anything loads."""
    parser = qa_peer_parser()
    args = parser.parse_args(argv)
    for name in ("max_length", "doc_stride", "max_answer_tokens", "n_best", "batch_size", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.max_train_examples is not None and args.max_train_examples < 1:
        parser.error("--max_train_examples must be at least 1")
    if args.compare_steps < 0:
        parser.error("--compare_steps must be >= 0")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.max_length < shortest_max_length(2):
        parser.error(f"--max_length must be >= {shortest_max_length(2)}, got {args.max_length}: a window holds "
                     "[CLS] question [SEP] context [SEP], a token of each at least")
    if args.doc_stride >= args.max_length:
        parser.error(f"--doc_stride {args.doc_stride} must be below --max_length {args.max_length}")
    try:
        positions = pretrained_config(args.pretrained).max_position_embeddings
    except CheckpointError as err:
        parser.error(f"--pretrained {args.pretrained}: {err}")
    if args.max_length > positions:
        parser.error(f"--max_length {args.max_length} is longer than the {positions} positions of {args.pretrained}")
    for split in ("train",) if args.compare_steps else ("train", "dev"):
        if not (Path(args.data_dir) / f"{split}-v2.0.json").is_file():
            parser.error(f"--data_dir {args.data_dir}: no {split}-v2.0.json there")
    if args.out is not None:
        problem = "a folder, not a file" if args.out.is_dir() else unwritable_folder(args.out.parent)
        if problem:
            parser.error(f"--out {args.out}: {problem}")
    return QAPeerSettings(**vars(args))


# -- data ------------------------------------------------------------------------------------------

def qa_load_split(settings: QAPeerSettings, split: str, tokenizer, limit: int | None = None) -> squad.QAWindows:
    examples = squad.load_squad(Path(settings.data_dir) / f"{split}-v2.0.json", split)
    if limit is not None and limit < len(examples):
        keep = sorted(random.Random(settings.seed).sample(range(len(examples)), limit))  # file order kept
        examples = [examples[i] for i in keep]
    return squad.QAWindows.build(examples, tokenizer, settings.max_length, settings.doc_stride)


def qa_batch_of(windows: squad.QAWindows, indices, pad_to: int | None = None) -> dict:
    """windows.collate(indices), padded further to `pad_to` tokens (pad id 0, mask 0, segment 0) when given."""
    batch = windows.collate(indices)
    extra = 0 if pad_to is None else pad_to - batch["input_ids"].shape[1]
    if extra > 0:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            batch[key] = F.pad(batch[key], (0, extra), value=0)
    return batch


def qa_training_batches(windows: squad.QAWindows, settings: QAPeerSettings, epoch: int) -> list[list[int]]:
    """A seeded random permutation of the windows (a new one each epoch), cut into batches of batch_size."""
    order = np.random.RandomState(settings.seed + epoch).permutation(len(windows)).tolist()
    return [order[i:i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]


# -- the two models --------------------------------------------------------------------------------

def qa_transformers_model(directory: Path, seed: int):
    """BertForQuestionAnswering from the pretrained directory; qa_outputs is new, initialised under `seed`.
    Returns the model and transformers' loading info (missing / unexpected keys)."""
    from transformers import BertForQuestionAnswering
    torch.manual_seed(seed)
    model, info = BertForQuestionAnswering.from_pretrained(str(directory), output_loading_info=True)
    info = {key: sorted(str(k) for k in value) for key, value in info.items() if isinstance(value, (list, set))}
    return model, info


def qa_transformers_loss(model, batch) -> torch.Tensor:
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
    bert = BertModel.from_pretrained(directory)
    head = nn.Linear(bert.config.hidden_size, 2)
    with torch.no_grad():
        head.weight.copy_(reference.qa_outputs.weight)
        head.bias.copy_(reference.qa_outputs.bias)
    return MinbertSpan(bert, head)


def qa_timed_step(loss_fn, optimizer, batch) -> float:
    """One training step (forward, backward, optimizer step); its wall-clock seconds."""
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(batch)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


# -- training and evaluation -----------------------------------------------------------------------

def qa_train(model, windows: squad.QAWindows, settings: QAPeerSettings) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)  # constant rate, no clipping
    pad_to = settings.max_length if settings.pad_to_max_length else None
    model.train()
    torch.manual_seed(settings.seed)  # dropout
    step_times, losses = [], []
    start = time.perf_counter()
    for epoch in range(settings.epochs):
        for indices in qa_training_batches(windows, settings, epoch):
            batch = qa_batch_of(windows, indices, pad_to)
            step_start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = qa_transformers_loss(model, batch)
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - step_start)
            losses.append(loss.item())
    train_seconds = time.perf_counter() - start
    timed = step_times[QA_SKIPPED_STEPS:] or step_times  # a run of <= 5 steps: all of them
    return {"steps": len(step_times), "timed_steps": len(timed), "step_seconds": statistics.mean(timed),
            "step_seconds_median": statistics.median(timed), "train_seconds": train_seconds,
            "first_loss": losses[0], "last_loss": losses[-1],
            "mean_loss_last_10pct": statistics.mean(losses[-max(1, len(losses) // 10):]),
            "all_step_seconds": [round(t, 4) for t in step_times]}


@torch.inference_mode()
def qa_window_logits(model, windows: squad.QAWindows, max_length: int) -> np.ndarray:
    """(N, max_length, 2) start / end logits of every window (zeros past a window's length)."""
    model.eval()
    logits = np.zeros((len(windows), max_length, 2), dtype=np.float32)
    order = sorted(range(len(windows)), key=lambda i: windows.lengths[i])
    for i in range(0, len(order), QA_EVAL_BATCH_SIZE):
        indices = order[i:i + QA_EVAL_BATCH_SIZE]
        batch = qa_batch_of(windows, indices)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        stacked = torch.stack([out.start_logits, out.end_logits], dim=-1).float().numpy()  # (B, T, 2)
        logits[indices, :stacked.shape[1]] = stacked
    return logits


def qa_evaluate(model, windows: squad.QAWindows, settings: QAPeerSettings) -> dict:
    start = time.perf_counter()
    logits = qa_window_logits(model, windows, settings.max_length)
    answers = squad.decode_answers(windows, logits, settings.n_best, settings.max_answer_tokens)
    examples = windows.examples
    tau = squad.best_threshold(answers, examples)
    at_zero = squad.squad_metrics(squad.predictions(answers, 0.0), examples)
    tuned = squad.squad_metrics(squad.predictions(answers, tau), examples)
    pick = lambda metrics, threshold: {**{k: metrics[k] for k in QA_METRIC_KEYS if k in metrics}, "tau": threshold}  # noqa: E731
    return {"tau0": pick(at_zero, 0.0), "tuned": pick(tuned, tau), "eval_seconds": time.perf_counter() - start}


# -- same batches: minBERT span model vs transformers ----------------------------------------------

def qa_compare_steps(settings: QAPeerSettings, directory: Path, windows: squad.QAWindows, steps: int) -> dict:
    """`steps` training steps of minBERT + a span head and of BertForQuestionAnswering on identical batches (the
    first batches of the training order, padded as --pad_to_max_length says), after QA_COMPARE_WARMUP untimed steps
    each; the two alternate step by step (which goes first alternating too), so machine drift hits both."""
    reference, _ = qa_transformers_model(directory, settings.seed)
    ours = minbert_span_model(directory, reference)
    reference.train(), ours.train()
    sides = {
        "transformers": (lambda batch: qa_transformers_loss(reference, batch),
                         torch.optim.AdamW(reference.parameters(), lr=settings.lr, weight_decay=0.0)),
        "minbert": (ours, AdamW(ours.parameters(), lr=settings.lr, weight_decay=0.0)),
    }
    pad_to = settings.max_length if settings.pad_to_max_length else None
    order = [i for indices in qa_training_batches(windows, settings, 0) for i in indices]
    needed = (QA_COMPARE_WARMUP + steps) * settings.batch_size
    order = (order * (needed // len(order) + 1))[:needed]  # a small set is cycled through
    batches = [qa_batch_of(windows, order[i:i + settings.batch_size], pad_to)
               for i in range(0, needed, settings.batch_size)]
    times = {name: [] for name in sides}
    torch.manual_seed(settings.seed)
    for number, batch in enumerate(batches):
        names = list(sides) if number % 2 == 0 else list(sides)[::-1]
        for name in names:
            seconds = qa_timed_step(*sides[name], batch)
            if number >= QA_COMPARE_WARMUP:
                times[name].append(seconds)
    result = {name: {"mean_step_seconds": statistics.mean(values), "median_step_seconds": statistics.median(values)}
              for name, values in times.items()}
    result["speedup_minbert_vs_transformers"] = (result["transformers"]["median_step_seconds"]
                                                 / result["minbert"]["median_step_seconds"])
    result["speedup_of_means"] = result["transformers"]["mean_step_seconds"] / result["minbert"]["mean_step_seconds"]
    result["timed_steps"], result["warmup_steps"] = steps, QA_COMPARE_WARMUP
    result["batch_tokens"] = [int(b["input_ids"].numel()) for b in batches[QA_COMPARE_WARMUP:]]
    result["batch_real_tokens"] = [int(b["attention_mask"].sum()) for b in batches[QA_COMPARE_WARMUP:]]
    return result


# -- main ------------------------------------------------------------------------------------------

def qa_settings(settings: QAPeerSettings, directory: Path) -> dict:
    import transformers
    return {"pretrained": settings.pretrained, "pretrained_dir": str(directory), "data_dir": str(settings.data_dir),
            "max_length": settings.max_length, "doc_stride": settings.doc_stride,
            "max_answer_tokens": settings.max_answer_tokens,
            "n_best": settings.n_best, "batch_size": settings.batch_size, "eval_batch_size": QA_EVAL_BATCH_SIZE,
            "lr": settings.lr, "epochs": settings.epochs, "seed": settings.seed,
            "max_train_examples": settings.max_train_examples,
            "pad_to_max_length": settings.pad_to_max_length, "optimizer": "torch.optim.AdamW, weight_decay 0",
            "schedule": "constant", "precision": "float32", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.machine()}


def qa_peer_main(argv=None) -> int:
    settings = qa_peer_arguments(argv)
    try:
        return qa_peer_run(settings)
    except (CheckpointError, DataError) as err:  # a SQuAD file or checkpoint found wrong once read: one line
        print(f"benchmark.py qa_peer: error: {err}", file=sys.stderr)
        return 2


def qa_peer_run(settings: QAPeerSettings) -> int:
    directory = resolve_pretrained(settings.pretrained)
    tokenizer = BertTokenizer.from_pretrained(directory)
    train_windows = qa_load_split(settings, "train", tokenizer, settings.max_train_examples)
    result = {"settings": qa_settings(settings, directory),
              "train_questions": len(train_windows.examples), "train_windows": len(train_windows)}
    if settings.compare_steps:
        result["compare_steps"] = qa_compare_steps(settings, directory, train_windows, settings.compare_steps)
        c = result["compare_steps"]
        print(f"same batches, {settings.compare_steps} steps: "
              f"transformers {c['transformers']['median_step_seconds']:.3f} "
              f"s/step, minBERT {c['minbert']['median_step_seconds']:.3f} s/step, "
              f"speed-up {c['speedup_minbert_vs_transformers']:.2f}x")
    else:
        dev_windows = qa_load_split(settings, "dev", tokenizer)
        result.update(dev_questions=len(dev_windows.examples), dev_windows=len(dev_windows))
        model, info = qa_transformers_model(directory, settings.seed)
        result["loading_info"] = info
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        result["train"] = qa_train(model, train_windows, settings)
        result["dev"] = qa_evaluate(model, dev_windows, settings)
        t, d = result["train"], result["dev"]
        print(f"transformers peer: {result['train_windows']} train windows, {t['steps']} steps, "
              f"{t['step_seconds']:.3f} s/step (mean after {QA_SKIPPED_STEPS}), train {t['train_seconds']:.0f} s, "
              f"{torch.get_num_threads()} thread(s); dev F1 {d['tuned']['f1']:.4f} EM {d['tuned']['em']:.4f} "
              f"(tau {d['tuned']['tau']:.3f}), at tau 0 F1 {d['tau0']['f1']:.4f}")
    if settings.out:
        settings.out.parent.mkdir(parents=True, exist_ok=True)
        settings.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0
