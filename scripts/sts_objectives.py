"""Which STS training target? One STS epoch from the same pretrained weights per objective, scored on dev.

    python scripts/sts_objectives.py --data_dir ../shared/data/protocol [--pretrained minilm-l6]

cosine:  MSE(cos(u, v), label / 5)            (sentence-transformers' CosineSimilarityLoss)
shifted: MSE(cos(u, v), (label - 2.5) / 2.5)  (the thesis' 2.5 cos + 2.5 against the 0-5 label)
cosent:  CoSENT ranking loss on cos(u, v)
Prints one JSON line per objective with dev Pearson before and after the epoch.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from base_bert import CheckpointError
from bert import BertModel
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.batches import DataError, TaskData, load_split
from minbert.model.multitask_bert import MultitaskBERT
from minbert.run.run_setup import build_trainer
from minbert.run.training_args import TrainingArguments
from minbert.runtime import seed_everything
from minbert.tasks.losses import SIMILARITY_OBJECTIVES
from minbert.tasks.metrics import sts_metrics
from minbert.training.schedules import Stage, StageKind
from tokenizer import BertTokenizer


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--pretrained", default="minilm-l6")
    parser.add_argument("--objectives", default="cosine,shifted,cosent")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=rng_seed, default=11711)
    options = parser.parse_args(argv)
    objectives = options.objectives.split(",")
    unknown = [o for o in objectives if o not in SIMILARITY_OBJECTIVES]
    if unknown:
        parser.error(f"--objectives: unknown {', '.join(unknown)} (choose from {', '.join(SIMILARITY_OBJECTIVES)})")
    data_dir = Path(options.data_dir)
    try:
        train = load_split(data_dir, "sts", "train")
        dev = load_split(data_dir, "sts", "dev")
        tokenizer = BertTokenizer.from_pretrained(options.pretrained)
    except (DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    gold = np.array([e.label for e in dev])
    for objective in objectives:
        args = TrainingArguments(pretrained=options.pretrained, option="finetune", quiet=True, lr=options.lr,
                                 batch_size=options.batch_size, hidden_dropout_prob=0.1, max_length=64,
                                 seed=options.seed, similarity_objective=objective,
                                 output_dir="runs/sts_objectives")
        seed_everything(options.seed)
        bert = BertModel.from_pretrained(options.pretrained)
        model = MultitaskBERT(bert, args.pooling, args.hidden_dropout_prob, similarity_objective=objective)
        data = {"sts": TaskData(train, dev, [])}
        trainer = build_trainer(args, model, tokenizer, data, [], torch.device("cpu"))
        before = sts_metrics(trainer.predictor.predict("sts", dev)[1], gold)["pearson"]
        start = time.time()
        trainer.run_stage(0, Stage(StageKind.TASK, "sts"))
        after = sts_metrics(trainer.predictor.predict("sts", dev)[1], gold)["pearson"]
        print(json.dumps({"objective": objective, "pretrained": options.pretrained, "dev_pearson_before": before,
                          "dev_pearson_after_1_epoch": after, "train_seconds": time.time() - start,
                          "lr": options.lr, "batch_size": options.batch_size, "seed": options.seed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
