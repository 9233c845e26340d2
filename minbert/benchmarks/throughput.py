"""Throughput beyond one step: the real-text training pipeline (`pipeline`), one process against two gloo processes
(`data_parallel`), an ensemble's prediction cost (`ensemble`), predict.py's path against a transformers forward pass
(`predict`) and the padded tokens of length buckets (`padding`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from minbert.benchmarks.models import build_encoders, build_minbert, build_tokenizer, multitask_setup, synchronize
from minbert.benchmarks.settings import BenchmarkSettings
from minbert.benchmarks.timing import Update, alternate
from minbert.runtime import autocast, to_device
from minbert.tasks import MULTITASK, TASKS
from optimizer import AdamW


def bench_pipeline(settings: BenchmarkSettings, device) -> dict:
    """Real-text training throughput: loading, tokenizing, collating, forward, backward, AdamW."""
    from minbert.data.batches import load_sentence_examples, make_dataloader
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.training.objective import compute_task_loss
    data = Path(settings.data_dir) / "ids-sst-train.csv"
    examples = load_sentence_examples(data, "sst", "train")
    tokenizer = build_tokenizer(settings)
    model = MultitaskBERT(build_minbert(settings)).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    update = Update(optimizer, device, settings.precision)
    loader = make_dataloader(examples, tokenizer, settings.batch_size, shuffle=True, seed=0,
                             max_length=settings.seq_len)
    tokens, batches = 0, 0
    start = None
    for index, batch in enumerate(loader):
        if index == settings.warmup:
            synchronize(device)
            start = time.perf_counter()
        if index >= settings.warmup:
            tokens += int(batch["attention_mask"].sum())
            batches += 1
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, settings.precision):
            loss, _ = compute_task_loss(model, "sst", batch)
        update(loss)
        if batches == settings.steps * settings.rounds:
            break
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"benchmark": f"SST training pipeline on {data}", "batches": batches, "real_tokens": tokens,
            "seconds": seconds, "tokens_per_second": tokens / seconds}


def _data_parallel_worker(rank: int, world_size: int, port: int, settings: BenchmarkSettings, results) -> None:
    """One rank of the data-parallel benchmark: QQP SBERT train steps on a per-rank slice of the global batch,
    gradients averaged by distributed.py; rank 0 reports the median step and all-reduce times."""
    import os

    from minbert.distributed import Distributed, leaving_together
    from minbert.training.objective import compute_task_loss
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world_size))
    torch.set_num_threads(max(1, settings.threads // world_size))
    distributed, _ = Distributed.from_environment(use_gpu=False)
    with leaving_together(distributed):
        local = replace(settings, batch_size=settings.batch_size // world_size)
        cpu = torch.device("cpu")
        model, optimizer, _, batch = multitask_setup(local, cpu, False)
        batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
        update = Update(optimizer, cpu, settings.precision)
        step_times, reduce_times = [], []
        for index in range(settings.warmup + settings.steps * settings.rounds):
            distributed.barrier()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with autocast(cpu, settings.precision):
                loss, _ = compute_task_loss(model, "qqp", batch)
            # A disabled scaler (bf16, fp32) passes the loss and the step through.
            update.scaler.scale(loss).backward()
            reduce_start = time.perf_counter()
            distributed.average_gradients(model.parameters())
            reduce_end = time.perf_counter()
            update.scaler.step(optimizer)
            update.scaler.update()
            distributed.barrier()
            if index >= settings.warmup:
                step_times.append(time.perf_counter() - start)
                reduce_times.append(reduce_end - reduce_start)
        if rank == 0:
            results.put((statistics.median(step_times), statistics.median(reduce_times)))


def bench_data_parallel(settings: BenchmarkSettings, device) -> dict:
    """The same global batch trained by one process with all threads and by two gloo processes with half
    the threads each: examples per second and the all-reduce's share of a step."""
    import socket

    import torch.multiprocessing as mp
    context = mp.get_context("spawn")
    figures = {}
    for processes in (1, 2):
        results = context.Queue()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(_data_parallel_worker, args=(processes, port, settings, results), nprocs=processes, join=True)
        step, reduce = results.get()
        figures[f"{processes} process(es) x {max(1, settings.threads // processes)} thread(s)"] = {
            "median_step_s": step, "examples_per_s": settings.batch_size / step, "all_reduce_s": reduce}
    return {"benchmark": f"QQP SBERT train step, global batch {settings.batch_size}: one process vs two gloo processes",
            "figures": figures}


def scores_shape(task: str, rows: int) -> tuple[int, ...]:
    """The shape of a run's saved scores of `rows` examples, as read_scores gives them: (rows, columns), or (rows,)
    for one column."""
    columns = len(TASKS[task].outputs.score_columns)
    return (rows, columns) if columns > 1 else (rows,)


def bench_ensemble(settings: BenchmarkSettings, device) -> dict:
    """What an ensemble costs at prediction time: one model's inference on the real dev and test files of
    --data_dir (the six leaderboard splits), against combining five members' saved scores of the same sizes
    (ensemble_scores.combine); the members' own inference is paid once, at the end of their runs."""
    from minbert.data.batches import load_split
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.prediction.ensemble_scores import combine
    from minbert.prediction.inference import predict_examples
    model = MultitaskBERT(build_minbert(settings)).to(device).eval()
    tokenizer = build_tokenizer(settings)
    splits = {(t, s): load_split(settings.data_dir, t, s) for t in MULTITASK for s in ("dev", "test")}
    seconds = {}
    for (task, split), examples in splits.items():
        synchronize(device)
        start = time.perf_counter()
        predict_examples(model, task, examples, tokenizer, device, 64, settings.seq_len, settings.precision,
                         scores=True)
        synchronize(device)
        seconds[f"{task}-{split}"] = time.perf_counter() - start
    generator = np.random.default_rng(0)
    members = {key: [generator.normal(size=scores_shape(key[0], len(examples))) for _ in range(5)]
               for key, examples in splits.items()}
    methods = {task: TASKS[task].ensemble_methods[0] for task in MULTITASK}  # each task's default
    start = time.perf_counter()
    for (task, _), scores in members.items():
        combine(task, scores, methods[task])
    combine_seconds = time.perf_counter() - start
    return {"benchmark": f"prediction: one model's inference on the {sum(len(e) for e in splits.values())} dev + test "
                         f"examples of {settings.data_dir} vs combining 5 members' saved scores",
            "one_model_inference_s": sum(seconds.values()), "per_split_s": seconds,
            "combine_5_members_s": combine_seconds}


def bench_predict(settings: BenchmarkSettings, device) -> dict:
    """predict.py's throughput: SST's dev sentences of --data_dir predicted by a MultitaskBERT (tokenised once, the
    evaluation loader's length-sorted batches of --batch_size, the head and the scores to the host included), against
    a plain transformers BertModel forward pass of the same weights over the same batches; sentences per second."""
    from minbert.data.batches import TokenizedExamples, load_split, tokenized_dataloader
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.prediction.inference import predict_examples
    from minbert.runtime import pad_to_multiple_of
    ours, reference = build_encoders(settings, device)
    model, reference = MultitaskBERT(ours).to(device).eval(), reference.eval()
    tokenizer = build_tokenizer(settings)
    examples = TokenizedExamples.tokenize(load_split(settings.data_dir, "sst", "dev"), tokenizer, settings.seq_len)
    batches = [to_device(batch, device) for batch in tokenized_dataloader(
        examples, settings.batch_size, shuffle=False, pad_to_multiple_of=pad_to_multiple_of(device))]

    @torch.inference_mode()
    def transformers_forward():
        for batch in batches:
            with autocast(device, settings.precision):
                reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    steps = {"minbert_predict": lambda: predict_examples(model, "sst", examples, tokenizer, device, settings.batch_size,
                                                         settings.seq_len, settings.precision, scores=True),
             "transformers_forward": transformers_forward}
    medians = alternate(steps, settings, device)
    sentences = len(examples)
    return {"benchmark": f"prediction: SST dev ({sentences} sentences of {settings.data_dir}), minBERT through predict.py's "
                         "path vs a transformers forward pass",
            "sentences": sentences, "median_pass_s": medians,
            "sentences_per_s": {name: sentences / seconds for name, seconds in medians.items()},
            "speedup_minbert_vs_transformers": medians["transformers_forward"] / medians["minbert_predict"]}


PADDING_MULTIPLES = (8, 16, 32)  # the bucket sizes the padding benchmark compares (runtime.PAD_TO_MULTIPLE_OF is one)


def bench_padding(settings: BenchmarkSettings, device) -> dict:
    """What length buckets cost (runtime.PAD_TO_MULTIPLE_OF pads CUDA and --compile runs): the tokens the encoder
    computes on in one shuffled epoch of each task's train file at --batch_size and --seq_len (SBERT pairs: both
    sides stacked, as MultitaskBERT.encoder_inputs stacks them), padded to each batch's longest row and to buckets
    of PADDING_MULTIPLES tokens, beside the real tokens (all that the CPU's packed layout computes on) and the
    number of batch widths each gives (a compiled graph or CUDA graph each)."""
    from minbert.data.batches import TokenizedExamples, load_split, tokenized_dataloader
    from minbert.runtime import PAD_TO_MULTIPLE_OF
    tokenizer = build_tokenizer(settings)
    paddings = {"longest": None, **{f"multiple_{m}": m for m in PADDING_MULTIPLES}}
    result = {"benchmark": f"padded tokens of length buckets on the train files (training pads to multiples of "
                           f"{PAD_TO_MULTIPLE_OF} on CUDA)", "tasks": {}}
    for task in MULTITASK:
        examples = TokenizedExamples.tokenize(load_split(settings.data_dir, task, "train"), tokenizer, settings.seq_len)
        counts, widths = dict.fromkeys(["real", *paddings], 0), {name: set() for name in paddings}
        for name, multiple in paddings.items():
            for batch in tokenized_dataloader(examples, settings.batch_size, shuffle=True, pad_to_multiple_of=multiple):
                suffixes = ("",) if "input_ids" in batch else ("_1", "_2")
                width = max(batch["input_ids" + suffix].shape[1] for suffix in suffixes)
                counts[name] += len(suffixes) * len(batch["ids"]) * width
                widths[name].add(width)
                if name == "longest":
                    counts["real"] += sum(int(batch["lengths" + suffix].sum()) for suffix in suffixes)
        result["tasks"][task] = {**counts, "widths": {name: len(seen) for name, seen in widths.items()}}
    totals = {key: sum(task[key] for task in result["tasks"].values()) for key in ("real", *paddings)}
    result["all_tasks"] = totals
    result["tokens_vs_longest"] = {name: round(totals[name] / totals["longest"], 4) for name in paddings}
    result["tokens_vs_real"] = {name: round(totals[name] / totals["real"], 4) for name in paddings}
    return result
