"""minBERT part 1: sentiment classification of SST-5 and CFIMDB from BERT's pooled [CLS] output.

One call trains and evaluates both datasets in turn, as the course's classifier.py does: SST
(5 classes), then CFIMDB (2 classes). For each, a fresh pretrained BERT gets a dropout + linear
head, trains for --epochs while the best dev accuracy so far is kept as
OUTPUT_DIR/{option}-{dataset}-best.safetensors + .json, and that best model then writes

    PREDICTIONS_DIR/{option}-{sst,cfimdb}-{dev,test}-out.csv

the files `prepare_submit.py --part minbert` zips. Their format is evaluation.write_predictions':
a header `id,Predicted_Sentiment`, then one `id,label` row per example in the input file's order.
The handout shows the header as "id, Predicted_Sentiment"; evaluation.read_predictions (the
checker prepare_submit uses) strips the space and accepts both.

    python classifier.py --option pretrain --lr 1e-3 --use_gpu      # BERT frozen: only the head learns
    python classifier.py --option finetune --lr 1e-5 --use_gpu      # every parameter learns
    python classifier.py --pretrained minilm-l6 --data_dir data/demo --option finetune --epochs 2 --lr 5e-5

Every data file of both datasets is validated before a model is loaded; a bad file or checkpoint
ends the run with one line `error: ...` and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from base_bert import BertConfig, CheckpointError
from bert import BertModel
from datasets import (DataError, SentenceExample, in_file_order, load_sentence_examples, make_dataloader,
                      show_data_warnings_on_one_line, standard_paths, subsample)
from evaluation import sst_metrics, summarize_line, write_predictions
from multitask_classifier import TaskData, atomic_save, read_checkpoint, seed_everything
from optimizer import AdamW
from tokenizer import BertTokenizer

TASKS = ("sst", "cfimdb")  # trained in this order, as in the course
NUM_LABELS = {"sst": 5, "cfimdb": 2}
OPTIONS = ("pretrain", "finetune")
# Both datasets are sentiment labels, so both use the SST leaderboard column, Predicted_Sentiment.
PREDICTION_FORMAT = "sst"


class BertSentimentClassifier(nn.Module):
    """Dropout and a linear layer on BERT's pooled output.

    option="pretrain" freezes BERT (requires_grad False), so only the linear layer learns;
    option="finetune" updates every parameter. In train mode BERT's own dropout stays active
    in both options, as in the course, which trains the whole model with model.train().
    """

    def __init__(self, bert: BertModel, num_labels: int, dropout: float, option: str):
        super().__init__()
        if option not in OPTIONS:
            raise ValueError(f"option must be one of {OPTIONS}, got {option!r}")
        self.bert = bert
        self.num_labels = num_labels
        self.option = option
        for parameter in self.bert.parameters():
            parameter.requires_grad = option == "finetune"
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(bert.config.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)
        return self.classifier(self.dropout(pooled))  # (B, num_labels)

    def head_options(self) -> dict:
        return {"num_labels": self.num_labels, "dropout": self.dropout.p, "option": self.option}


# ---------------------------------------------------------------------------------------------------
# Checkpoints: safetensors for tensors, JSON for the rest; nothing is ever unpickled.


def save_classifier(model: BertSentimentClassifier, prefix: Path, metrics: dict) -> None:
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_save(prefix, tensors, {"bert_config": model.bert.config.to_dict(), "heads": model.head_options(),
                                  "metrics": metrics})


def load_classifier(prefix: str | Path, device: torch.device | str = "cpu") -> BertSentimentClassifier:
    """Rebuild a BertSentimentClassifier from PREFIX.safetensors + PREFIX.json (no pretrained download)."""
    tensors, metadata = read_checkpoint(Path(prefix))
    try:
        bert = BertModel(BertConfig.from_dict(metadata["bert_config"]))
        model = BertSentimentClassifier(bert, **metadata["heads"])
        model.load_state_dict(tensors)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{prefix}: checkpoint does not describe a sentiment classifier "
                              f"({type(err).__name__}: {err})") from None
    return model.to(device)


# ---------------------------------------------------------------------------------------------------
# Data


def data_path(args, task: str, split: str) -> Path:
    explicit = getattr(args, f"{task}_{split}")
    return Path(explicit) if explicit else standard_paths(args.data_dir)[(task, split)]


def load_data(args) -> dict[str, TaskData]:
    """Every file of both datasets, validated before any model is loaded."""
    data = {}
    for task in TASKS:
        train = load_sentence_examples(data_path(args, task, "train"), task, "train")
        data[task] = TaskData(subsample(train, args.max_train_examples, args.seed),
                                   load_sentence_examples(data_path(args, task, "dev"), task, "dev"),
                                   load_sentence_examples(data_path(args, task, "test"), task, "test"))
    return data


def prediction_path(args, task: str, split: str) -> Path:
    return Path(args.predictions_dir) / f"{args.option}-{task}-{split}-out.csv"


# ---------------------------------------------------------------------------------------------------
# Training and prediction


def train_epoch(model: nn.Module, loader, optimizer: torch.optim.Optimizer, device: torch.device,
                description: str = "train", quiet: bool = False) -> float:
    """One pass of cross-entropy steps over `loader`; returns the mean batch loss."""
    model.train()
    losses = []
    bar = tqdm(loader, desc=description, leave=False, disable=quiet)
    for batch in bar:
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))  # (B, C)
        loss = F.cross_entropy(logits, batch["labels"].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
    return float(np.mean(losses))


@torch.no_grad()
def predict(model: nn.Module, examples: list[SentenceExample], tokenizer: BertTokenizer, device: torch.device,
            batch_size: int, max_length: int, quiet: bool = False) -> tuple[list[str], np.ndarray]:
    """Predicted class per example, returned with the ids in the examples' order."""
    model.eval()
    loader = make_dataloader(examples, tokenizer, batch_size, shuffle=False, max_length=max_length)
    ids, classes = [], []
    for batch in tqdm(loader, desc="predict", leave=False, disable=quiet):
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))  # (B, C)
        ids += batch["ids"]
        classes += logits.argmax(dim=-1).cpu().tolist()
    return in_file_order(examples, ids, classes)


def dev_accuracy(model, examples, tokenizer, device, args) -> float:
    _, predicted = predict(model, examples, tokenizer, device, args.eval_batch_size, args.max_length, args.quiet)
    return sst_metrics(predicted, [e.label for e in examples])["acc"]


def train_task(task: str, data: TaskData, tokenizer: BertTokenizer, device: torch.device, args) -> dict:
    """Train one dataset from a fresh pretrained BERT, keep the best dev epoch, write its predictions."""
    seed_everything(args.seed)  # each dataset's run is reproducible on its own, whatever ran before it
    bert = BertModel.from_pretrained(args.pretrained)
    model = BertSentimentClassifier(bert, NUM_LABELS[task], args.hidden_dropout_prob, args.option).to(device)
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    loader = make_dataloader(data.train, tokenizer, args.batch_size, shuffle=True, seed=args.seed,
                             max_length=args.max_length)
    best_prefix = Path(args.output_dir) / f"{args.option}-{task}-best"
    best = None
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        loader.batch_sampler.set_epoch(epoch)
        train_loss = train_epoch(model, loader, optimizer, device, f"{task} epoch {epoch}", args.quiet)
        record = {"task": task, "epoch": epoch, "train_loss": train_loss,
                  "dev_acc": dev_accuracy(model, data.dev, tokenizer, device, args),
                  "seconds": time.time() - start}
        print(summarize_line(record))
        if best is None or record["dev_acc"] > best["dev_acc"]:
            best = record
            save_classifier(model, best_prefix, record)

    model = load_classifier(best_prefix, device)
    for split in ("dev", "test"):
        examples = getattr(data, split)
        ids, predicted = predict(model, examples, tokenizer, device, args.eval_batch_size, args.max_length,
                                 args.quiet)
        path = prediction_path(args, task, split)
        write_predictions(path, ids, predicted.tolist(), PREDICTION_FORMAT)
        print(f"wrote {path} ({len(ids)} rows)")
    return best


def run(args) -> dict[str, dict]:
    """Both datasets in turn; returns each one's best epoch record."""
    device = torch.device("cuda" if args.use_gpu and torch.cuda.is_available() else "cpu")
    if args.use_gpu and device.type == "cpu":
        warnings.warn("--use_gpu given but CUDA is not available; training on the CPU")
    data = load_data(args)  # every data file validated before the model loads
    tokenizer = BertTokenizer.from_pretrained(args.pretrained)
    results = {}
    for task in TASKS:
        print(f"training {args.option} on {task}: {len(data[task].train)} train, {len(data[task].dev)} dev, "
              f"{len(data[task].test)} test examples")
        results[task] = train_task(task, data[task], tokenizer, device, args)
    print(" | ".join(f"{task} best dev acc {r['dev_acc']:.4f} (epoch {r['epoch']})" for task, r in results.items()))
    return results


# ---------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    course = parser.add_argument_group("course options (defaults unchanged)")
    course.add_argument("--seed", type=int, default=11711)
    course.add_argument("--epochs", type=int, default=10)
    course.add_argument("--option", choices=OPTIONS, default="pretrain",
                        help="pretrain: BERT frozen, only the linear head trained; finetune: everything trained")
    course.add_argument("--use_gpu", action="store_true")
    course.add_argument("--batch_size", type=int, default=8, help="sst: 64, cfimdb: 8 can fit a 12GB GPU")
    course.add_argument("--hidden_dropout_prob", type=float, default=0.3,
                        help="dropout before the linear head (BERT keeps its own 0.1, as in the course)")
    course.add_argument("--lr", type=float, default=1e-5,
                        help="learning rate; the course suggests 1e-3 for pretrain and 1e-5 for finetune")

    files = parser.add_argument_group("data and outputs")
    files.add_argument("--data_dir", default="data", help="folder with the course's file names (ids-sst-*.csv, ...)")
    for task in TASKS:
        for split in ("train", "dev", "test"):
            files.add_argument(f"--{task}_{split}", default=None,
                               help=f"default: DATA_DIR/{standard_paths('')[(task, split)].name}")
    files.add_argument("--predictions_dir", default="predictions",
                       help="where the {option}-{dataset}-{dev,test}-out.csv files go")
    files.add_argument("--output_dir", default="runs/classifier", help="best-dev checkpoints")

    run_group = parser.add_argument_group("model and run")
    run_group.add_argument("--pretrained", default="bert-base-uncased",
                           help="hub id, local directory, or minilm-l6 (bundled, offline)")
    run_group.add_argument("--max_train_examples", type=int, default=None, help="subsample each train set")
    run_group.add_argument("--max_length", type=int, default=512,
                           help="tokens per text; 512 keeps CFIMDB reviews whole, as the course does")
    run_group.add_argument("--eval_batch_size", type=int, default=64)
    run_group.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("epochs", "batch_size", "eval_batch_size", "max_length"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1")
    if args.max_train_examples is not None and args.max_train_examples < 1:
        parser.error("--max_train_examples must be >= 1")
    if not args.lr > 0:
        parser.error("--lr must be > 0")
    if not 0 <= args.hidden_dropout_prob < 1:
        parser.error("--hidden_dropout_prob must be in [0, 1)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    try:
        run(args)
    except (DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
