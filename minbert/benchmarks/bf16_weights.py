"""What --bf16_weights changes in a plain bf16 training step (forward, loss, backward, AdamW), measured on the demo
data (BENCHMARKS.md, "bf16 weight copies"): how far its losses and weights drift from autocast's casts over a run of
steps (compare_runs), and a step's median time and the operators it dispatches, each side alternating with the other
round after round (compare_step_costs).

    compare_runs(TINY, "sts", steps=50)                 # {'max_loss_difference': ..., 'max_weight_difference': ...}
    compare_step_costs(MINILM_L6, "sst", batch_size=8, max_length=64, rounds=10)
"""
from __future__ import annotations

import statistics
import time
from itertools import cycle, islice
from pathlib import Path

import torch

from base_bert import BertConfig
from bert import BertModel
from minbert.data.batches import collate_pairs, collate_sentences, load_examples
from minbert.model.multitask_bert import MultitaskBERT
from minbert.tasks import TASKS, course_file_name
from minbert.training.objective import TaskObjective
from minbert.training.optimization import build_optimizer
from minbert.training.precision import count_dispatches
from optimizer import AdamW
from tokenizer import BertTokenizer

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
# Random weights of two sizes: the tests' tiny BERT and minilm-l6's shape (6 layers, hidden 384).
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
MINILM_L6 = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                 intermediate_size=1536)


def demo_batches(task: str, batch_size: int, max_length: int) -> list[dict]:
    """The demo train split of `task` in batches (a pair's sentences each encoded on its own)."""
    examples = load_examples(DEMO / course_file_name(task, "train"), task, "train")
    tokenizer = BertTokenizer.from_pretrained("minilm-l6")
    chunks = [examples[i:i + batch_size] for i in range(0, len(examples) - batch_size + 1, batch_size)]
    collate = collate_pairs if TASKS[task].is_pair else collate_sentences
    return [collate(chunk, tokenizer, max_length) for chunk in chunks]


def seeded_model(bert_config: dict, seed: int = 0, bf16_weights: bool = False) -> tuple[MultitaskBERT, AdamW]:
    """A MultitaskBERT on random weights (dropout as BERT's) and its AdamW (lr 1e-4, weight decay 0.01)."""
    torch.manual_seed(seed)
    model = MultitaskBERT(BertModel(BertConfig(**bert_config)))
    model.train()
    return model, build_optimizer(model, 1e-4, 0.01, bf16_weights=bf16_weights)


def plain_step(model: MultitaskBERT, optimizer: AdamW, objective: TaskObjective, batch: dict) -> torch.Tensor:
    """One update under bf16 autocast on the CPU: forward and loss, backward, AdamW's step; the loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = objective(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def compare_runs(bert_config: dict, task: str, steps: int = 50, batch_size: int = 8, max_length: int = 32,
                 seed: int = 0) -> dict:
    """`steps` plain steps from the same weights, dropout masks and batches, with autocast's casts and with the
    bf16 copies: the largest difference of their losses at a step, and of their weights after the last one
    (absolute, and relative to the largest weight)."""
    batches = list(islice(cycle(demo_batches(task, batch_size, max_length)), steps))
    losses, weights = {}, {}
    for bf16_weights in (False, True):
        model, optimizer = seeded_model(bert_config, seed, bf16_weights)
        objective = TaskObjective(task, [])
        torch.manual_seed(seed + 1)  # the same dropout masks on both sides
        losses[bf16_weights] = torch.stack([plain_step(model, optimizer, objective, b) for b in batches])
        weights[bf16_weights] = torch.cat([p.detach().flatten() for p in model.parameters()])
    weight_difference = (weights[True] - weights[False]).abs().max().item()
    return {"task": task, "steps": steps, "max_loss_difference": (losses[True] - losses[False]).abs().max().item(),
            "first_loss": losses[False][0].item(), "last_loss": losses[False][-1].item(),
            "max_weight_difference": weight_difference,
            "relative_weight_difference": weight_difference / weights[False].abs().max().item()}


def compare_step_costs(bert_config: dict, task: str, batch_size: int = 8, max_length: int = 64,
                       rounds: int = 10) -> dict:
    """Per side (autocast's casts, bf16 copies): the median seconds of a plain step over `rounds` rounds that
    alternate the sides (after one untimed step each), and the operators and weight casts one step dispatches."""
    batches = demo_batches(task, batch_size, max_length)
    sides = {}
    for bf16_weights in (False, True):
        model, optimizer = seeded_model(bert_config, 0, bf16_weights)
        sides[bf16_weights] = (model, optimizer, TaskObjective(task, []))
        plain_step(*sides[bf16_weights], batches[0])
    seconds = {side: [] for side in sides}
    for index in range(rounds):
        for side, (model, optimizer, objective) in sides.items():
            start = time.perf_counter()
            plain_step(model, optimizer, objective, batches[index % len(batches)])
            seconds[side].append(time.perf_counter() - start)
    result = {}
    for side, (model, optimizer, objective) in sides.items():
        counts = count_dispatches(lambda: plain_step(model, optimizer, objective, batches[0]), model.parameters())
        result["bf16_copies" if side else "autocast_casts"] = {
            "median_step_s": statistics.median(seconds[side]), "operators": counts.operators,
            "views": counts.views, "weight_casts": counts.weight_casts}
    return result
