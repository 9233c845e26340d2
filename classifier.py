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
ends the run with one line `error: ...` and exit code 2. Under `torchrun --nproc_per_node N` it trains
data parallel (minbert/distributed.py): each process on its slice of every batch, rank 0 alone writing.
"""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from base_bert import BertConfig, CheckpointError, pretrained_config
from bert import BertModel
from evaluation import summarize_line, write_predictions
from minbert.data.batches import (DataError, SentenceExample, TaskData, load_task_data, make_dataloader,
                                  predict_in_file_order, show_data_warnings_on_one_line)
from minbert.distributed import SINGLE_PROCESS, Distributed, data_parallel
from minbert.files import describe_os_error, forbidden_output
from minbert.model.checkpoint import atomic_save, checkpoint_folder, read_checkpoint
from minbert.run.training_args import (ClassifierArguments, UsageError, build_parser, check_max_length, check_writable,
                                       data_paths, from_namespace)
from minbert.runtime import seed_everything
from minbert.tasks import PART1_TASKS, TASKS
from optimizer import AdamW
from tokenizer import BertTokenizer

NUM_LABELS = {task: TASKS[task].num_classes for task in PART1_TASKS}  # trained in PART1_TASKS' order, as in the course
OPTIONS = ("pretrain", "finetune")


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


def load_data(args: ClassifierArguments) -> dict[str, TaskData]:
    """Every file of both datasets, validated before any model is loaded."""
    return load_task_data(data_paths(args.data_dir, args.data_files, PART1_TASKS), PART1_TASKS, set(PART1_TASKS),
                          args.max_train_examples, args.seed)


def prediction_path(args: ClassifierArguments, task: str, split: str) -> Path:
    return Path(args.predictions_dir) / f"{args.option}-{task}-{split}-out.csv"


# ---------------------------------------------------------------------------------------------------
# Training and prediction


def train_epoch(model: nn.Module, loader, optimizer: torch.optim.Optimizer, device: torch.device,
                description: str = "train", quiet: bool = False, distributed: Distributed = SINGLE_PROCESS) -> float:
    """One pass of cross-entropy steps over `loader`; returns the mean batch loss (this rank's)."""
    model.train()
    losses = []
    bar = tqdm(loader, desc=description, leave=False, disable=quiet)
    for batch in bar:
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))  # (B, C)
        loss = F.cross_entropy(logits, batch["labels"].to(device))
        optimizer.zero_grad(set_to_none=True)
        if distributed.enabled:  # this rank's share of the global batch's mean
            (loss * distributed.share(len(logits), device)).backward()
            distributed.average_gradients(model.parameters())
        else:
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
    return float(np.mean(losses))


@torch.no_grad()
def predict(model: nn.Module, examples: list[SentenceExample], tokenizer: BertTokenizer, device: torch.device,
            batch_size: int, max_length: int, quiet: bool = False,
            distributed: Distributed = SINGLE_PROCESS) -> tuple[list[str], np.ndarray]:
    """Predicted class per example, returned with the ids in the examples' order. Under torchrun each rank
    predicts every world_size-th example and all ranks get all predictions."""
    model.eval()

    def predict_shard(shard: list[SentenceExample]) -> tuple[list[str], np.ndarray]:
        loader = make_dataloader(shard, tokenizer, batch_size, shuffle=False, max_length=max_length)
        ids, classes = [], []
        for batch in tqdm(loader, desc="predict", leave=False, disable=quiet):
            logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))  # (B, C)
            ids += batch["ids"]
            classes += logits.argmax(dim=-1).cpu().tolist()
        return ids, np.array(classes)
    return predict_in_file_order(examples, predict_shard, distributed)


def dev_accuracy(model, task: str, examples, tokenizer, device, args: ClassifierArguments,
                 distributed: Distributed = SINGLE_PROCESS) -> float:
    _, predicted = predict(model, examples, tokenizer, device, args.eval_batch_size, args.max_length,
                           args.quiet or not distributed.is_main, distributed)
    return TASKS[task].model.metrics(predicted, [e.label for e in examples])[TASKS[task].model.score_key]


def train_task(task: str, data: TaskData, tokenizer: BertTokenizer, device: torch.device,
               args: ClassifierArguments, distributed: Distributed = SINGLE_PROCESS) -> dict:
    """Train one dataset from a fresh pretrained BERT, keep the best dev epoch, write its predictions."""
    seed_everything(args.seed)  # each dataset's run is reproducible on its own, whatever ran before it
    bert = BertModel.from_pretrained(args.pretrained)
    model = BertSentimentClassifier(bert, NUM_LABELS[task], args.hidden_dropout_prob, args.option).to(device)
    distributed.start_from_one_model([model], args.seed)
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    loader = make_dataloader(data.train, tokenizer, args.batch_size, shuffle=True, seed=args.seed,
                             max_length=args.max_length, world_size=distributed.world_size, rank=distributed.rank)
    best_prefix = Path(args.output_dir) / f"{args.option}-{task}-best"
    quiet = args.quiet or not distributed.is_main
    best = None
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        loader.batch_sampler.set_epoch(epoch)
        train_loss = train_epoch(model, loader, optimizer, device, f"{task} epoch {epoch}", quiet, distributed)
        record = {"task": task, "epoch": epoch, "train_loss": train_loss,
                  "dev_acc": dev_accuracy(model, task, data.dev, tokenizer, device, args, distributed),
                  "seconds": time.time() - start}
        print(summarize_line(record))
        if best is None or record["dev_acc"] > best["dev_acc"]:  # the same gathered accuracy on every rank
            best = record
            if distributed.is_main:
                save_classifier(model, best_prefix, record)
    distributed.barrier()  # the best checkpoint is written before every rank reads it

    model = load_classifier(best_prefix, device)
    for split in ("dev", "test"):
        examples = getattr(data, split)
        ids, predicted = predict(model, examples, tokenizer, device, args.eval_batch_size, args.max_length,
                                 quiet, distributed)
        path = prediction_path(args, task, split)
        if distributed.is_main:
            write_predictions(path, ids, predicted.tolist(), task)  # both: Predicted_Sentiment
            print(f"wrote {path} ({len(ids)} rows)")
    return best


def run(args: ClassifierArguments) -> dict[str, dict]:
    """Both datasets in turn; returns each one's best epoch record."""
    with data_parallel(args.use_gpu) as (distributed, device):
        return _run(args, distributed, device)


def check_outputs(args: ClassifierArguments) -> None:
    """UsageError for an output that would replace a file the run reads (a data file, the --pretrained checkpoint's
    folder) or lie in another run's folder: the checkpoints' --output_dir and each CSV of --predictions_dir."""
    reads = [*data_paths(args.data_dir, args.data_files, PART1_TASKS).values()]
    reads += [Path(args.pretrained)] if Path(args.pretrained).is_dir() else []
    outputs = [("--output_dir", Path(args.output_dir))]
    outputs += [("--predictions_dir", prediction_path(args, task, split)) for task in PART1_TASKS
                for split in ("dev", "test")]
    problem = next(filter(None, (forbidden_output(flag, path, reads) for flag, path in outputs)), None)
    if problem:
        raise UsageError(problem)


def _run(args: ClassifierArguments, distributed: Distributed, device: torch.device) -> dict[str, dict]:
    check_outputs(args)
    check_writable([args.output_dir, args.predictions_dir])
    data = load_data(args)  # every data file validated before the model loads, and before a folder is made
    # One writer per folder: two runs there at once would overwrite each other's best checkpoints mid-run.
    with checkpoint_folder(args.output_dir) if distributed.is_main else nullcontext():
        return train_both(args, data, distributed, device)


def train_both(args: ClassifierArguments, data: dict[str, TaskData], distributed: Distributed,
               device: torch.device) -> dict[str, dict]:
    config = pretrained_config(args.pretrained)
    check_max_length(args.max_length, config.max_position_embeddings, args.pretrained)
    tokenizer = BertTokenizer.from_pretrained(args.pretrained)
    tokenizer.check_fits(config.vocab_size, args.pretrained)
    results = {}
    for task in PART1_TASKS:
        print(f"training {args.option} on {task}: {len(data[task].train)} train, {len(data[task].dev)} dev, "
              f"{len(data[task].test)} test examples")
        results[task] = train_task(task, data[task], tokenizer, device, args, distributed)
    print(" | ".join(f"{task} best dev acc {r['dev_acc']:.4f} (epoch {r['epoch']})" for task, r in results.items()))
    return results


# ---------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None) -> ClassifierArguments:
    parser = build_parser(ClassifierArguments, __doc__)
    try:
        return from_namespace(ClassifierArguments, parser.parse_args(argv))
    except ValueError as err:
        parser.error(str(err))


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    try:
        run(args)
    except (DataError, CheckpointError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk or a read-only folder while saving (files.OutputError)
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the best epoch so far of the dataset in training is saved in "
              f"{args.output_dir}; rerun the command to train again", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
