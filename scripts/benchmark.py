"""Speed and memory benchmarks; every figure is a ratio or a number measured in this one run.

    python scripts/benchmark.py encoder    # minBERT vs transformers.BertModel train step (same weights, batch)
    python scripts/benchmark.py precision  # minBERT train step: float32 vs 16-bit autocast (bf16 / fp16)
    python scripts/benchmark.py smart      # SMART step vs plain step, and peak memory with and without SMART
    python scripts/benchmark.py memory     # live-tensor bytes of one QQP step: plain / SMART, checkpointing, 16-bit
    python scripts/benchmark.py adapters   # full fine-tuning vs LoRA / DoRA / PALs: parameters, size, time, memory
    python scripts/benchmark.py checkpointing  # train step with and without gradient checkpointing
    python scripts/benchmark.py pipeline   # tokens/s of the full training pipeline (tokenize, collate, step)
    python scripts/benchmark.py data_parallel  # 1 process vs 2 gloo processes (distributed.py), same global batch
    python scripts/benchmark.py ensemble   # one model's inference on dev + test vs combining 5 runs' saved scores
    python scripts/benchmark.py dev_eval   # a run's dev scoring after a stage: every dev example vs --max_eval_examples
    python scripts/benchmark.py all        # every benchmark above that runs on --device (data_parallel: the CPU's)
    python scripts/benchmark.py padding    # padded tokens of the length buckets (CUDA, --compile) on the train files
    python scripts/benchmark.py qqp_epoch  # one QQP SMART epoch of the course's 141,506 pairs, from timed real steps
    python scripts/benchmark.py step_audit # host syncs, operators and graph breaks of one training step (no timing)
    python scripts/benchmark.py qa_peer    # SQuAD 2.0: transformers' BertForQuestionAnswering peer (own flags, --help)

Defaults: minilm-l6, batch 32 x 64 tokens, 2 CPU threads, `--precision auto` resolved per device as training
does (runtime.resolve_precision: bf16 autocast where the device computes bf16 natively, fp16 autocast with a
gradient scaler on older GPUs such as a T4, float32 on other CPUs; `--bf16` / `--no-bf16` are aliases of
`--precision bf16` / `fp32`). `--config bert-base-random` uses a randomly initialised bert-base-sized model and
`--config random:NAME_OR_CONFIG_JSON` random weights of any checkpoint's or config.json's shape: no download.
The two sides of a comparison alternate, round after round, so drift in machine load hits both. minBERT runs as
training runs it (runtime.place_encoder: packed tokens on the CPU, the padded grid on CUDA; the batch's row lengths
known on the host); `--compile` compiles its layers (and, in `encoder`, times transformers compiled too).

Model FLOPs utilisation (MFU) sits beside each training-step time: the step's useful matmul FLOPs (6 x the layers'
weights x the real tokens, plus the attention's 12 x layers x hidden x length^2 per sequence; padding counts for
nothing) per second, over the device's peak in the step's precision: the published dense peak of known GPUs
(PEAK_TFLOPS), on a CPU the dense matmul throughput measured here (labelled so).

step_audit builds the Trainer as the training command line does (the recipes' flags, scripts/_common.sh: CPU_FLAGS on
the CPU, GPU_FLAGS on CUDA, with SMART_FLAGS for the SMART step) on --data_dir's real batches (default data/demo), and
counts one plain and one SMART step after a warm-up step. Its last two lines:
    plain step: host syncs N, ops M, graph breaks G
    smart step: host syncs N, ops M
A flag the benchmarks cannot use is refused before anything loads, in one line naming it (exit code 2).
"""
from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import math
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from base_bert import BertConfig, CheckpointError, pretrained_config, resolve_pretrained, to_hf_state_dict
from bert import BertModel
from minbert.data.batches import row_lengths, standard_paths, subsample
from minbert.files import DataError, unwritable_folder
from minbert.arguments import OneLineErrorParser
from minbert.run.training_args import UsageError
from minbert.runtime import (COMPILE_MODES, PRECISIONS, autocast, float32_exact, has_native_bf16, place_encoder, precision_notice,
                             requested_precision, resolve_precision, scaled_step, to_device, use_tf32)
from minbert.tasks import MULTITASK, TASKS, squad
from optimizer import AdamW
from tokenizer import BertTokenizer, shortest_max_length

ROOT = Path(__file__).resolve().parents[1]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_batch(batch_size: int, seq_len: int, vocab_size: int, device: torch.device, seed: int = 0,
               full_length: bool = False):
    """Random token ids and their attention mask: real lengths drawn from seq_len / 2 .. seq_len (the first
    sequence full), or all seq_len with `full_length` (no padding: the memory benchmark's worst case)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=generator)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size,), generator=generator)
    lengths[0] = seq_len
    if full_length:
        lengths[:] = seq_len
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def place(bert: BertModel, device: torch.device, args) -> BertModel:
    """minBERT on `device` as training places it (runtime.place_encoder), compiled under --compile; --token_layout
    packed or padded overrides the device's choice (to measure the other one)."""
    bert.to(device)
    place_encoder(bert.encoder, device, args.compile, args.compile_mode)
    if args.token_layout != "auto":
        bert.encoder.pack_tokens = args.token_layout == "packed"
    return bert


RANDOM = "random:"


def random_config(config: str, **overrides) -> BertConfig | None:
    """The BertConfig of a --config with random weights: bert-base's for "bert-base-random", a checkpoint's or a
    config.json's for "random:NAME_OR_PATH"; None for a pretrained checkpoint (weights to load)."""
    if config == "bert-base-random":
        return BertConfig(**overrides)
    if config.startswith(RANDOM):
        source = config[len(RANDOM):]
        file = Path(source).expanduser() if source.endswith(".json") else resolve_pretrained(source) / "config.json"
        return BertConfig.from_json_file(file, **overrides)
    return None


def random_twin(config: str) -> str:
    """The --config of random weights in the shape of `config` (itself when its weights are random already)."""
    return config if random_config_name(config) else RANDOM + config


def random_config_name(config: str) -> bool:
    return config == "bert-base-random" or config.startswith(RANDOM)


def build_minbert(args, **overrides) -> BertModel:
    """minBERT alone for --config: random weights (bert-base-random, random:NAME_OR_PATH) or pretrained;
    `overrides` change its config (e.g. attention_probs_dropout_prob)."""
    torch.manual_seed(0)
    config = random_config(args.config, **overrides)
    return BertModel(config) if config is not None else BertModel.from_pretrained(args.config, **overrides)


def model_config(config: str) -> BertConfig:
    """The BertConfig of a --config, random or pretrained, read without any weights."""
    random_weights = random_config(config)
    return random_weights if random_weights is not None else pretrained_config(config)


RANDOM_WEIGHTS_TOKENIZER = "minilm-l6"  # bundled, and its vocabulary is bert-base-uncased's


def tokenizer_directory(config: str) -> str:
    """Where the tokenizer of --config lives: the checkpoint's own, or RANDOM_WEIGHTS_TOKENIZER for random weights
    (parse_args checks that the model's embedding table holds its vocabulary)."""
    return RANDOM_WEIGHTS_TOKENIZER if random_config_name(config) else config


def build_tokenizer(args):
    return BertTokenizer.from_pretrained(tokenizer_directory(args.config))


def build_encoders(args, device):
    """minBERT and transformers.BertModel holding identical weights (random ones for a random --config: the
    transformers model's own initialisation, converted into minBERT)."""
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel
    config = random_config(args.config)
    if config is not None:
        from base_bert import convert_hf_state_dict
        torch.manual_seed(0)
        ours = BertModel(config)
        hf_config = {k: v for k, v in config.to_dict().items() if k != "attn_implementation"}
        reference = HFBertModel(HFConfig(**hf_config, attn_implementation="sdpa"))
        ours.load_state_dict(convert_hf_state_dict(reference.state_dict(), config.num_hidden_layers))
    else:
        ours = BertModel.from_pretrained(args.config)
        reference = HFBertModel.from_pretrained(str(resolve_pretrained(args.config)), attn_implementation="sdpa")
    return place(ours, device, args).train(), reference.to(device).train()


def timed_steps(step, steps: int, device) -> list[float]:
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def alternate(steps: dict, args, device) -> dict[str, float]:
    """Median step time of each named step function, the sides alternating round after round."""
    for step in steps.values():  # warm-up: allocator, kernels, autotuning
        timed_steps(step, args.warmup, device)
    samples = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            samples[name] += timed_steps(step, args.steps, device)
    return {name: statistics.median(values) for name, values in samples.items()}


# Published dense peaks (no sparsity), TFLOP/s, by the precision a step's matmuls run in (fp32 on CUDA: TF32,
# runtime.use_tf32). Names are matched in order against torch.cuda.get_device_name.
PEAK_TFLOPS = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 378.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),  # no TF32 and no bf16 tensor cores
)


def train_flops(config: BertConfig, lengths) -> float:
    """The useful matmul FLOPs of one training step (forward and backward: 3 x the forward's) on rows of these
    real lengths: 2 x 3 x the layers' weights (and the pooler's) per real token, and each sequence's attention
    scores and weighted values, 2 x 2 x hidden x length^2 per layer, x 3. Padding counts for nothing."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    weights = layers * (4 * hidden * hidden + 2 * hidden * config.intermediate_size) + hidden * hidden
    lengths = np.asarray(lengths, dtype=np.float64)
    return float(6 * weights * lengths.sum() + 12 * layers * hidden * (lengths ** 2).sum())


def peak_flops(device: torch.device, precision: str, threads: int) -> tuple[float | None, str]:
    """(FLOP/s, where the figure comes from): a known GPU's published dense peak in `precision`, or on a CPU the
    dense matmul throughput measured here with these threads; (None, why) when neither is known."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for pattern, peaks in PEAK_TFLOPS:
            if pattern in name and precision in peaks:
                return peaks[precision] * 1e12, f"published dense peak of the {pattern} in {precision}"
        return None, f"no published peak known for {name} in {precision}"
    if precision == "fp16":  # emulated on CPUs: no peak to speak of, and slow to measure
        return None, "fp16 is emulated on CPUs"
    return measured_matmul_flops(precision, threads), (f"this CPU's measured {CPU_MATMUL_SIZE}^3 matmul in "
                                                       f"{precision}, {threads} threads")


CPU_MATMUL_SIZE = 1024


@functools.lru_cache(maxsize=None)
def measured_matmul_flops(precision: str, threads: int) -> float:
    """The CPU's dense matmul FLOP/s in `precision` (bf16 operands, as autocast casts them) with `threads` threads
    (the benchmark's own setting): the best of a few runs, measured once per run."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(CPU_MATMUL_SIZE, CPU_MATMUL_SIZE).to(dtype) for _ in range(2))
    a @ b  # warm-up
    best = min(timed_steps(lambda: a @ b, 3, torch.device("cpu")))
    return 2 * CPU_MATMUL_SIZE ** 3 / best


def significant(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def utilisation(medians: dict[str, float], precisions: dict[str, str], config: BertConfig, lengths, device,
                args) -> dict:
    """TFLOP/s and model FLOPs utilisation of timed training steps (each on rows of `lengths`, computing in its
    precision), for the results beside their times."""
    flops = train_flops(config, lengths)
    result = {"train_step_tflop": significant(flops / 1e12), "achieved_tflops": {}, "mfu": {}, "mfu_peak": {}}
    for name, seconds in medians.items():
        peak, source = peak_flops(device, precisions[name], args.threads)
        result["achieved_tflops"][name] = significant(flops / seconds / 1e12)
        result["mfu"][name] = None if peak is None else significant(flops / seconds / peak)
        result["mfu_peak"][name] = source
    return result


GRADIENT_SCALING: list[dict] = []  # {"skipped": n} of this benchmark's fp16 updates (not the updates: no
# reference to their optimizers and models)


class Update:
    """The backward pass and optimizer step of a training step as minbert/training/loop.py takes them at
    `precision`: with fp16 through a torch.amp.GradScaler (the loss scaled before backward; scaler.step skips the
    step when a gradient is inf or NaN and scaler.update then lowers the scale). No clipping here, so no unscale_
    before the step."""

    def __init__(self, optimizer, device: torch.device, precision: str):
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.record = {"skipped": 0}
        if self.scaler.is_enabled():
            GRADIENT_SCALING.append(self.record)

    def __call__(self, loss: torch.Tensor) -> bool:
        """Backward and step; False when the gradient scaler skipped the step."""
        self.scaler.scale(loss).backward()  # the loss itself when the scaler is disabled
        stepped = scaled_step(self.scaler, self.optimizer)
        self.record["skipped"] += not stepped
        return stepped


def train_step_fn(model, optimizer, ids, mask, device, precision: str, hf: bool, lengths=None):
    """A train step of an encoder alone (loss: the mean square of its outputs); minBERT's layout is built each step
    from the rows' host `lengths`, as MultitaskBERT.encoder_inputs builds it from a collated batch."""
    update = Update(optimizer, device, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            if hf:
                out = model(input_ids=ids, attention_mask=mask)
                hidden, pooled = out.last_hidden_state, out.pooler_output
            else:
                hidden = model.encode(model.embed(ids), mask, model.encoder.layout(mask, lengths))
                pooled = model.pooler(hidden)
            loss = hidden.float().pow(2).mean() + pooled.float().pow(2).mean()
        update(loss)
    return step


def attention_operators(names) -> str:
    """The fused attention kernels among aten operator names (scaled_dot_product_attention's backends: flash,
    memory-efficient or cuDNN on CUDA, flash on the CPU), or "math" for none: its math path, whose (B, heads,
    T, T) softmax and dropout tensors are kept for the backward."""
    return ", ".join(sorted(n for n in names if "attention" in n and not n.endswith("_backward"))) or "math"


def attention_kernel(model: BertModel, ids, mask, device, precision: str) -> str:
    """Which kernel scaled_dot_product_attention picks for minBERT's attention in a training forward (its mask
    and dropout included)."""
    # The probe watches eager operators: compiled layers (BertEncoder.compile_layers' instance attribute) run as a
    # graph a dispatch mode cannot enter, so the class's eager method stands in meanwhile; SDPA picks the same kernel.
    compiled = model.encoder.__dict__.pop("run_layers", None)
    try:
        with LiveTensorBytes() as ops, autocast(device, precision):
            model(ids, mask)
    finally:
        if compiled is not None:
            model.encoder.run_layers = compiled
    return attention_operators(ops.names)


def bench_encoder(args, device) -> dict:
    """minBERT's train step against transformers.BertModel's (same weights, batch and AdamW); under --compile
    minBERT's layers are compiled and transformers is timed both eager and compiled."""
    ours, reference = build_encoders(args, device)
    ids, mask = make_batch(args.batch_size, args.seq_len, ours.config.vocab_size, device)
    lengths = row_lengths(mask)
    kernel = attention_kernel(ours, ids, mask, device, args.precision)
    steps = {
        "minbert": train_step_fn(ours, AdamW(ours.parameters(), lr=1e-5), ids, mask, device, args.precision,
                                 hf=False, lengths=lengths),
        "transformers": train_step_fn(reference, AdamW(reference.parameters(), lr=1e-5), ids, mask, device,
                                      args.precision, hf=True),
    }
    if args.compile:
        steps["transformers_compiled"] = train_step_fn(torch.compile(reference), AdamW(reference.parameters(), lr=1e-5),
                                                       ids, mask, device, args.precision, hf=True)
    medians = alternate(steps, args, device)
    result = {
        "benchmark": "encoder train step (forward, backward, AdamW)" + (", minBERT compiled" if args.compile else "")
                     + ("" if args.compile_mode == "default" else f" ({args.compile_mode})")
                     + ("" if args.token_layout == "auto" else f", minBERT's tokens {args.token_layout}"),
        "median_step_s": medians,
        "speedup_minbert_vs_transformers": medians["transformers"] / medians["minbert"],
        "minbert_attention_kernel": kernel,
        **utilisation(medians, {name: args.precision for name in medians}, ours.config, lengths, device, args),
    }
    if args.compile:
        result["speedup_minbert_vs_transformers_compiled"] = medians["transformers_compiled"] / medians["minbert"]
    return result


def sixteen_bit(args, device) -> str:
    """The 16-bit autocast that the precision benchmark sets against float32: on CUDA the device's (bf16 where
    it is native, else fp16); on the CPU the one --precision names, bf16 by default."""
    if device.type == "cuda":
        return "bf16" if has_native_bf16(device) else "fp16"
    return args.requested_precision if args.requested_precision in ("bf16", "fp16") else "bf16"


def bench_precision(args, device) -> dict:
    """minBERT train step in float32 against the same step under 16-bit autocast (same weights, batch); fp16
    steps go through a gradient scaler, as training's do."""
    half = sixteen_bit(args, device)
    ours = place(build_minbert(args), device, args).train()
    ids, mask = make_batch(args.batch_size, args.seq_len, ours.config.vocab_size, device)
    lengths = row_lengths(mask)
    optimizer = AdamW(ours.parameters(), lr=1e-5)
    steps = {"float32": train_step_fn(ours, optimizer, ids, mask, device, "fp32", hf=False, lengths=lengths),
             f"{half}_autocast": train_step_fn(ours, optimizer, ids, mask, device, half, hf=False, lengths=lengths)}
    medians = alternate(steps, args, device)
    return {
        "benchmark": f"minBERT train step, float32 vs {half} autocast",
        "sixteen_bit": half,
        "median_step_s": medians,
        "speedup_16bit_vs_float32": medians["float32"] / medians[f"{half}_autocast"],
        **utilisation(medians, {"float32": "fp32", f"{half}_autocast": half}, ours.config, lengths, device, args),
    }


def describe(args, device) -> dict:
    info = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
            "config": args.config, "batch": f"{args.batch_size}x{args.seq_len}",
            "python": platform.python_version(), "machine": platform.machine()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["native_bf16"] = has_native_bf16(device)
    info["precision"] = args.precision  # resolved: bf16, fp16 or fp32 (the precision benchmark sets its own)
    info["precision_notice"] = precision_notice(device, args.requested_precision)
    info["float32_matmul_precision"] = torch.get_float32_matmul_precision()  # "high": TF32 (runtime.use_tf32)
    info["compile"], info["token_layout"] = args.compile, args.token_layout
    if args.compile:
        info["compile_mode"] = args.compile_mode
    return info


def multitask_setup(args, device, smart: bool, adapter: str | None = None, checkpointing: bool = False,
                    full_length: bool = False, smart_precision: str = "run", **config_overrides):
    """A MultitaskBERT with its optimizer and (optionally) SMART, its passes at `smart_precision`, on one fixed
    STS-like pair batch; with an adapter kind, per-task adapters of rank 8 over a frozen encoder; `full_length`: no
    padding."""
    from minbert.model.adapters import AdapterConfig
    from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder
    from smart import SmartConfig, SmartRegularizer
    bert = build_minbert(args, **config_overrides)
    model = MultitaskBERT(bert, adapter=AdapterConfig(adapter) if adapter else None)
    if adapter:
        freeze_encoder(model)
    model.bert.encoder.gradient_checkpointing = checkpointing
    place(model.bert, device, args)
    model = model.to(device).train()
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig(precision=smart_precision)) if smart else None
    ids_1, mask_1 = make_batch(args.batch_size, args.seq_len, bert.config.vocab_size, device, 1, full_length)
    ids_2, mask_2 = make_batch(args.batch_size, args.seq_len, bert.config.vocab_size, device, 2, full_length)
    batch = {"input_ids_1": ids_1, "attention_mask_1": mask_1, "input_ids_2": ids_2, "attention_mask_2": mask_2,
             "lengths_1": row_lengths(mask_1), "lengths_2": row_lengths(mask_2),
             "labels": torch.rand(args.batch_size, device=device) * 5}
    return model, optimizer, regularizer, batch


def multitask_step_fn(model, optimizer, regularizer, batch, device, precision: str, task="qqp"):
    """One training step as the trainer takes it: with SMART at precision exact, compute_task_loss runs the whole loss
    in float32 whatever the autocast around it."""
    from minbert.training.objective import compute_task_loss
    from minbert.training.regularization import SmartPenalty
    penalties = [] if regularizer is None else [SmartPenalty({task: regularizer})]
    if TASKS[task].num_classes == 2:  # two classes on one logit: the 0-5 labels cut at their middle
        batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    update = Update(optimizer, device, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss, _ = compute_task_loss(model, task, batch, penalties)
        if update(loss) and regularizer is not None:
            regularizer.anchor.update(model)
    return step


def _memory_status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: peak resident)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def first_row(batch: dict, tokens: int) -> dict:
    """The batch cut to its first row and at most `tokens` tokens (its host lengths cut with it)."""
    return {k: np.minimum(v[:1], tokens) if isinstance(v, np.ndarray) else v[:1, :tokens] if v.dim() == 2 else v[:1]
            for k, v in batch.items()}


def _peak_memory_worker(args, device, smart, adapter, checkpointing, queue):
    torch.set_num_threads(args.threads)
    if device.type == "cpu":
        # Random weights of the same shape: loading a checkpoint would set a higher-water mark than a step.
        args = argparse.Namespace(**{**vars(args), "config": random_twin(args.config)})
    model, optimizer, regularizer, batch = multitask_setup(args, device, smart, adapter, checkpointing)
    small = first_row(batch, 8)
    # A float32 step creates the optimizer state (an fp16 gradient scaler could skip the step that would).
    multitask_step_fn(model, optimizer, regularizer, small, device, "fp32")()
    # Without the gradients of that step: every step frees them first (set_to_none) and makes them anew, so
    # they belong to the step's memory, not the base (else full fine-tuning's 87 MiB of them go uncounted).
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current size
        base = _memory_status("VmRSS")
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, args.precision)
    for _ in range(2):
        step()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _memory_status("VmHWM")
    queue.put(peak - base)


def peak_step_memory(args, device, smart: bool, adapter: str | None = None, checkpointing: bool = False) -> int:
    """Peak memory a training step adds over the loaded model, measured in a fresh process
    (CPU: peak resident set size; CUDA: peak allocated bytes)."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_peak_memory_worker, args=(args, device, smart, adapter, checkpointing, queue))
    process.start()
    while True:  # a worker that fails (its traceback on stderr) is an error here, not a wait forever
        try:
            value = queue.get(timeout=1)
            break
        except Empty:
            if not process.is_alive():
                raise RuntimeError(f"the memory probe's process failed (exit code {process.exitcode}): "
                                   "its traceback is above") from None
    process.join()
    return value


def smart_phase_fns(model, regularizer, batch, device: torch.device, precision: str, task="qqp") -> dict:
    """The passes of a SMART step, each as a function timed on its own (forwards include the clean one
    they need): where a SMART step's time goes. Each runs where the SMART step runs it (compute_task_loss): at
    the run's `precision`, or in exact float32 with SMART's precision exact."""
    from smart import find_perturbation
    batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
    model.set_adapter(task)
    inputs = model.encoder_inputs(task, batch)
    objective = model.objectives[task]

    def clean():
        embeddings = model.embed(inputs)
        return model.outputs_from_embeddings(task, embeddings, inputs), embeddings

    def forward_fn(embeddings):
        return model.outputs_from_embeddings(task, embeddings, inputs)

    def ascent():
        outputs, embeddings = clean()
        find_perturbation(forward_fn, embeddings, outputs, objective.divergence, regularizer.config)

    def as_in_smart_step(fn):
        def run():
            model.zero_grad(set_to_none=True)
            with float32_exact() if regularizer.config.precision == "exact" else autocast(device, precision):
                fn()
        return run
    return {
        "clean forward": as_in_smart_step(clean),
        "clean forward + backward": as_in_smart_step(lambda: objective.loss(clean()[0], batch["labels"]).backward()),
        "clean forward + ascent step": as_in_smart_step(ascent),
        "clean forward + perturbed forward": as_in_smart_step(lambda: forward_fn(clean()[1])),
        # "teacher": the name the results files and BENCHMARKS.md give SMART's anchor in this phase and its copy
        "teacher forward": as_in_smart_step(lambda: regularizer.anchor(model, task, batch)),
    }


class TransformersSbertQQP(torch.nn.Module):
    """The benchmark's QQP SBERT model on transformers.BertModel: mean pooling, [u, v, |u - v|], linear.
    SMART perturbs its word embeddings (passed as inputs_embeds), as SMART written on transformers does."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        self.head = torch.nn.Linear(3 * bert.config.hidden_size, 1)

    def outputs_from_word_embeddings(self, word_embeddings, mask):
        from minbert.model.multitask_bert import mean_pool
        hidden = self.bert(inputs_embeds=word_embeddings, attention_mask=mask).last_hidden_state  # (2B, T, H)
        u, v = mean_pool(hidden, mask).chunk(2)  # (B, H) each
        return self.head(torch.cat([u, v, (u - v).abs()], dim=-1)).squeeze(-1)  # (B,)

    def forward(self, ids, mask):
        return self.outputs_from_word_embeddings(self.bert.embeddings.word_embeddings(ids), mask)


def transformers_step_fn(args, device, smart: bool):
    """A plain or SMART QQP step of TransformersSbertQQP on the same batch as multitask_setup's, with this
    project's SMART functions (one ascent step, gradient to the perturbation only, the anchor without gradient);
    a SMART step at the run's precision, as compute_task_loss runs this code's by default."""

    from smart import SmartConfig, SmartRegularizer
    _, reference = build_encoders(args, device)
    model = TransformersSbertQQP(reference).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig()) if smart else None
    (ids_1, mask_1), (ids_2, mask_2) = (make_batch(args.batch_size, args.seq_len, reference.config.vocab_size,
                                                   device, seed=seed) for seed in (1, 2))
    ids, mask = torch.cat([ids_1, ids_2]), torch.cat([mask_1, mask_2])  # (2B, T): both sides in one pass
    labels = (torch.rand(args.batch_size, device=device) > 0.5).float()
    update = Update(optimizer, device, args.precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, args.precision):
            embeddings = model.bert.embeddings.word_embeddings(ids)

            def forward_fn(e):
                return model.outputs_from_word_embeddings(e, mask)
            logits = forward_fn(embeddings)
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
            if regularizer is not None:
                loss = loss + regularizer.penalty(forward_fn, embeddings, logits, "bernoulli", anchor_args=(ids, mask))
        if update(loss) and regularizer is not None:
            regularizer.anchor.update(model)
    return step


def bench_smart(args, device) -> dict:
    """SMART step (clean forward, 1 ascent step, perturbed forward, the anchor's forward) vs a plain step, here
    and with the same SMART functions around transformers.BertModel (its ratio is the issue's yardstick)."""
    steps = {}
    for name, smart in (("plain", False), ("smart", True)):
        model, optimizer, regularizer, batch = multitask_setup(args, device, smart)
        steps[name] = multitask_step_fn(model, optimizer, regularizer, batch, device, args.precision)
        steps[f"transformers_{name}"] = transformers_step_fn(args, device, smart)
    exact = multitask_setup(args, device, True, smart_precision="exact")  # --smart_precision exact, for the record
    steps["smart_exact"] = multitask_step_fn(*exact, device, args.precision)
    medians = alternate(steps, args, device)
    phases = alternate(smart_phase_fns(model, regularizer, batch, device, args.precision), args, device)
    memory = {name: peak_step_memory(args, device, name == "smart") for name in ("plain", "smart")}
    plain_lengths = np.concatenate([batch["lengths_1"], batch["lengths_2"]])
    return {
        "benchmark": "QQP SBERT train step with and without SMART (SMART at the run's precision; smart_exact: "
                     "--smart_precision exact)",
        "median_step_s": medians,
        "smart_cost_ratio": medians["smart"] / medians["plain"],
        "smart_exact_cost_ratio": medians["smart_exact"] / medians["plain"],
        **utilisation({"plain": medians["plain"]}, {"plain": args.precision}, model.bert.config, plain_lengths,
                      device, args),
        "transformers_smart_cost_ratio": medians["transformers_smart"] / medians["transformers_plain"],
        "smart_step_speedup_vs_transformers": medians["transformers_smart"] / medians["smart"],
        "smart_phase_s": {name: round(value, 4) for name, value in phases.items()},
        "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
        "teacher_copy_mib": round(sum(t.numel() * t.element_size() for t in regularizer.anchor.params.values())
                                  / 2**20, 1),
        "smart_memory_ratio": memory["smart"] / max(memory["plain"], 1),
    }


def bench_pipeline(args, device) -> dict:
    """Real-text training throughput: loading, tokenizing, collating, forward, backward, AdamW."""
    from minbert.data.batches import load_sentence_examples, make_dataloader
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.training.objective import compute_task_loss
    data = Path(args.data_dir) / "ids-sst-train.csv"
    examples = load_sentence_examples(data, "sst", "train")
    tokenizer = build_tokenizer(args)
    model = MultitaskBERT(build_minbert(args)).to(device).train()
    optimizer = AdamW(model.parameters(), lr=1e-5)
    update = Update(optimizer, device, args.precision)
    loader = make_dataloader(examples, tokenizer, args.batch_size, shuffle=True, seed=0, max_length=args.seq_len)
    tokens, batches = 0, 0
    start = None
    for index, batch in enumerate(loader):
        if index == args.warmup:
            synchronize(device)
            start = time.perf_counter()
        if index >= args.warmup:
            tokens += int(batch["attention_mask"].sum())
            batches += 1
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, args.precision):
            loss, _ = compute_task_loss(model, "sst", batch)
        update(loss)
        if batches == args.steps * args.rounds:
            break
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"benchmark": f"SST training pipeline on {data}", "batches": batches, "real_tokens": tokens,
            "seconds": seconds, "tokens_per_second": tokens / seconds}


def bench_adapters(args, device) -> dict:
    """Full fine-tuning against per-task LoRA, DoRA (rank 8 on query and value) and PALs over a frozen
    encoder: trainable parameters, checkpoint size, train-step time and peak step memory."""
    import tempfile

    from minbert.model.multitask_bert import save_multitask_model
    kinds = {"full fine-tuning": None, "lora": "lora", "dora": "dora", "pals": "pals"}
    steps, sizes, trainable = {}, {}, {}
    for name, kind in kinds.items():
        model, optimizer, _, batch = multitask_setup(args, device, False, kind)
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, args.precision)
        trainable[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        with tempfile.TemporaryDirectory() as folder:
            save_multitask_model(model, Path(folder) / "model", {})
            sizes[name] = (Path(folder) / "model.safetensors").stat().st_size
    medians = alternate(steps, args, device)
    memory = {name: peak_step_memory(args, device, False, kind) for name, kind in kinds.items()}
    return {"benchmark": "QQP SBERT train step: full fine-tuning vs per-task adapters over a frozen encoder",
            "trainable_parameters": trainable, "checkpoint_mib": {k: round(v / 2**20, 2) for k, v in sizes.items()},
            "median_step_s": medians, "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()}}


def bench_checkpointing(args, device) -> dict:
    """A QQP SBERT train step with and without --gradient_checkpointing: time and peak step memory."""
    steps = {}
    for name, checkpointing in (("plain", False), ("checkpointed", True)):
        model, optimizer, _, batch = multitask_setup(args, device, False, checkpointing=checkpointing)
        steps[name] = multitask_step_fn(model, optimizer, None, batch, device, args.precision)
    medians = alternate(steps, args, device)
    memory = {name: peak_step_memory(args, device, False, checkpointing=name == "checkpointed") for name in steps}
    return {"benchmark": "QQP SBERT train step with and without gradient checkpointing",
            "median_step_s": medians, "checkpointing_time_ratio": medians["checkpointed"] / medians["plain"],
            "peak_step_memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
            "checkpointing_memory_ratio": memory["checkpointed"] / max(memory["plain"], 1)}


class LiveTensorBytes(TorchDispatchMode):
    """The bytes of the tensor storages that operators create while it is active and that are still alive, and
    their peak: what a computation adds to the memory already held (weights, optimizer state), at operator
    granularity. Each storage counts once, from the operator whose output it is (views and in-place results
    share their input's storage and add nothing) until it is freed (a weakref finalizer on the storage). The
    backward pass is seen too (autograd runs it with this thread's dispatch modes). Not seen: what a kernel
    allocates and frees inside itself (workspaces), and on CUDA the caching allocator's rounding (to 512-byte
    blocks) and fragmentation, which torch.cuda.max_memory_allocated includes. Also records operator names."""

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self.live: set[int] = set()  # the storages counted and still alive, by address of their StorageImpl
        self.names: set[str] = set()
        self.lock = threading.RLock()  # finalizers may run on autograd's threads, or inside a dispatch here

    def _freed(self, key: int, nbytes: int) -> None:
        with self.lock:
            self.live.discard(key)
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.names.add(func.overloadpacket.__name__)
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            with self.lock:
                if key in inputs or key in self.live:
                    continue
                self.live.add(key)
                self.current += nbytes
                self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


class FloatMatmuls(TorchDispatchMode):
    """Matrix products (and the CPU's flash attention) of bf16 / fp16 tensors computed in float32, their outputs
    rounded to the dtypes the 16-bit kernels return (read off the operator's meta kernel): the same tensors, of
    the same sizes, without the 16-bit kernels that a CPU lacking them emulates (two orders of magnitude slower
    than float32 on an AVX2 CPU). For counting memory under LiveTensorBytes entered after it (which then sees
    the 16-bit operator and its 16-bit output, not the float32 copies); never for timing."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
    SIXTEEN_BIT = (torch.bfloat16, torch.float16)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.OPS or not any(isinstance(t, torch.Tensor) and t.dtype in self.SIXTEEN_BIT
                                           for t in tree_flatten((args, kwargs))[0]):
            return func(*args, **kwargs)
        meta_args, meta_kwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
        dtypes = [t.dtype if isinstance(t, torch.Tensor) else None
                  for t in tree_flatten(func(*meta_args, **meta_kwargs))[0]]
        upcast = (lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in self.SIXTEEN_BIT else t)
        outputs, spec = tree_flatten(func(*tree_map(upcast, args), **tree_map(upcast, kwargs)))
        return tree_unflatten([t.to(dtype) if dtype is not None and t.dtype != dtype else t
                               for t, dtype in zip(outputs, dtypes)], spec)


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages that `tensors` hold."""
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


MEMORY_ROWS = {  # name: (SMART, gradient checkpointing, 16-bit autocast)
    "plain": (False, False, False),
    "plain, checkpointing": (False, True, False),
    "plain, 16-bit": (False, False, True),
    "plain, 16-bit, checkpointing": (False, True, True),
    "SMART": (True, False, False),
    "SMART, checkpointing": (True, True, False),
}
CUDA_CONTEXT_GIB = 0.5  # an assumption (CUDA context and kernels), to be checked on a GPU: see BENCHMARKS.md


def emulates_sixteen_bit(device: torch.device, precision: str) -> bool:
    """Whether the device computes this 16-bit precision's matmuls by emulation (CPUs without the instructions)."""
    return device.type == "cpu" and precision != "fp32" and not (precision == "bf16" and has_native_bf16(device))


def step_memory(args, device, smart: bool, checkpointing: bool, precision: str, fused_attention: bool,
                float_matmuls: bool | None = None) -> dict:
    """Bytes of one QQP SBERT training step over the loaded model and optimizer state (LiveTensorBytes' peak,
    the gradients the step makes included), and the static bytes held across steps. `fused_attention` on the
    CPU: attention dropout off, so that scaled_dot_product_attention runs the CPU's flash kernel, which keeps
    what CUDA's fused kernels keep for the backward (output and log-sum-exp, dropout replayed from a seed);
    with dropout on, the CPU runs the math path, which keeps (B, heads, T, T) probabilities and masks.
    `float_matmuls` (by default where 16-bit is emulated): FloatMatmuls, the same bytes in a fraction of the time."""
    if float_matmuls is None:
        float_matmuls = emulates_sixteen_bit(device, precision)
    overrides = {"attention_probs_dropout_prob": 0.0} if fused_attention and device.type == "cpu" else {}
    model, optimizer, regularizer, batch = multitask_setup(args, device, smart, checkpointing=checkpointing,
                                                           full_length=True, **overrides)
    small = first_row(batch, 8)
    multitask_step_fn(model, optimizer, regularizer, small, device, "fp32")()  # the AdamW state now exists
    optimizer.zero_grad(set_to_none=True)  # every step frees the gradients first and makes them anew
    step = multitask_step_fn(model, optimizer, regularizer, batch, device, precision)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    with FloatMatmuls() if float_matmuls else nullcontext(), LiveTensorBytes() as counter:
        step()
    synchronize(device)
    figures = {
        "step_peak": counter.peak, "step_s": time.perf_counter() - start,
        "attention": attention_operators(counter.names),
        "weights": tensor_bytes([*model.parameters(), *model.buffers()]),
        "gradients": tensor_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "adamw_states": tensor_bytes(t for state in optimizer.state.values() for t in state.values()
                                     if torch.is_tensor(t)),
        "smart_teacher_copy": tensor_bytes(regularizer.anchor.params.values()) if smart else 0}
    if device.type == "cuda":
        figures["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(device) - base
    return figures


def bench_memory(args, device) -> dict:
    """Peak memory of one QQP SBERT training step, counted tensor by tensor (LiveTensorBytes), for every
    sequence of the batch full length (the worst case): plain and SMART steps (SMART's in float32, as an fp16 run
    or --smart_precision exact computes its passes: the largest case), with and without gradient checkpointing, plain steps
    in float32 and 16-bit autocast (bf16 and fp16 keep activations in 2 bytes alike). On the CPU every row is
    measured twice: with the attention the CPU runs in training (the math path: dropout rules out its fused
    kernel) and with a fused kernel's memory (as CUDA runs it); on CUDA once, as it runs. The GPU estimate of
    a row: weights + AdamW states (+ SMART's anchor copy) + the step's peak with fused attention
    + CUDA_CONTEXT_GIB."""
    half = sixteen_bit(args, device)
    variants = {"fused_attention": True, "attention_as_run_here": False} if device.type == "cpu" else {
        "attention_as_run_here": True}
    rows, static, kernels = {}, {}, {}
    for name, (smart, checkpointing, sixteen) in MEMORY_ROWS.items():
        rows[name] = {"precision": "fp32 (SMART in float32: fp16 runs, --smart_precision exact)" if smart else half if sixteen else "fp32"}
        for variant, fused in variants.items():
            figures = step_memory(args, device, smart, checkpointing, half if sixteen else "fp32", fused)
            gc.collect()
            print(f"memory: {name}, {variant}: step peak {figures['step_peak'] / 2**20:.1f} MiB "
                  f"({figures['step_s']:.1f} s)", file=sys.stderr, flush=True)
            rows[name][f"step_peak_mib_{variant}"] = round(figures["step_peak"] / 2**20, 1)
            rows[name][f"step_s_{variant}"] = round(figures["step_s"], 2)
            if "cuda_peak_allocated" in figures:
                rows[name]["cuda_peak_allocated_mib"] = round(figures["cuda_peak_allocated"] / 2**20, 1)
            # The plain step's: SMART's anchor forward, in eval mode, has no dropout to keep it off the flash kernel.
            kernels.setdefault(variant, figures["attention"])
            for key in ("weights", "gradients", "adamw_states", "smart_teacher_copy"):
                static[key] = max(static.get(key, 0), figures[key])
            if fused:
                held = figures["weights"] + figures["adamw_states"] + figures["smart_teacher_copy"]
                rows[name]["held_across_steps_mib"] = round(held / 2**20, 1)
                rows[name]["gpu_estimate_gib"] = round((held + figures["step_peak"]) / 2**30 + CUDA_CONTEXT_GIB, 2)
    return {"benchmark": f"peak live-tensor memory of one QQP SBERT training step, {args.batch_size} pairs x "
                         f"{args.seq_len} tokens, no padding",
            "sixteen_bit": half, "attention_kernels": kernels,
            "sixteen_bit_matmuls": "in float32, rounded to 16 bits (FloatMatmuls: the same tensors; this device "
                                   "emulates 16-bit matmuls)" if emulates_sixteen_bit(device, half) else "native",
            "static_mib": {k: round(v / 2**20, 1) for k, v in static.items()},
            "cuda_context_gib_assumed": CUDA_CONTEXT_GIB, "rows": rows}


def _data_parallel_worker(rank: int, world_size: int, port: int, args, results) -> None:
    """One rank of the data-parallel benchmark: QQP SBERT train steps on a per-rank slice of the global batch,
    gradients averaged by distributed.py; rank 0 reports the median step and all-reduce times."""
    import os

    from minbert.distributed import Distributed, leaving_together
    from minbert.training.objective import compute_task_loss
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world_size))
    torch.set_num_threads(max(1, args.threads // world_size))
    distributed, _ = Distributed.from_environment(use_gpu=False)
    with leaving_together(distributed):
        local = argparse.Namespace(**{**vars(args), "batch_size": args.batch_size // world_size})
        cpu = torch.device("cpu")
        model, optimizer, _, batch = multitask_setup(local, cpu, False)
        batch = {**batch, "labels": (batch["labels"] > 2.5).float()}
        update = Update(optimizer, cpu, args.precision)
        step_times, reduce_times = [], []
        for index in range(args.warmup + args.steps * args.rounds):
            distributed.barrier()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with autocast(cpu, args.precision):
                loss, _ = compute_task_loss(model, "qqp", batch)
            # A disabled scaler (bf16, fp32) passes the loss and the step through.
            update.scaler.scale(loss).backward()
            reduce_start = time.perf_counter()
            distributed.average_gradients(model.parameters())
            reduce_end = time.perf_counter()
            update.scaler.step(optimizer)
            update.scaler.update()
            distributed.barrier()
            if index >= args.warmup:
                step_times.append(time.perf_counter() - start)
                reduce_times.append(reduce_end - reduce_start)
        if rank == 0:
            results.put((statistics.median(step_times), statistics.median(reduce_times)))


def bench_data_parallel(args, device) -> dict:
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
        mp.spawn(_data_parallel_worker, args=(processes, port, args, results), nprocs=processes, join=True)
        step, reduce = results.get()
        figures[f"{processes} process(es) x {max(1, args.threads // processes)} thread(s)"] = {
            "median_step_s": step, "examples_per_s": args.batch_size / step, "all_reduce_s": reduce}
    return {"benchmark": f"QQP SBERT train step, global batch {args.batch_size}: one process vs two gloo processes",
            "figures": figures}


def scores_shape(task: str, rows: int) -> tuple[int, ...]:
    """The shape of a run's saved scores of `rows` examples, as read_scores gives them: (rows, columns), or (rows,)
    for one column."""
    columns = len(TASKS[task].score_columns)
    return (rows, columns) if columns > 1 else (rows,)


def bench_ensemble(args, device) -> dict:
    """What an ensemble costs at prediction time: one model's inference on the real dev and test files of
    --data_dir (the six leaderboard splits), against combining five members' saved scores of the same sizes
    (ensemble_scores.combine); the members' own inference is paid once, at the end of their runs."""
    from minbert.data.batches import load_split
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.prediction.ensemble_scores import combine
    from minbert.prediction.inference import predict_examples
    model = MultitaskBERT(build_minbert(args)).to(device).eval()
    tokenizer = build_tokenizer(args)
    splits = {(t, s): load_split(args.data_dir, t, s) for t in MULTITASK for s in ("dev", "test")}
    seconds = {}
    for (task, split), examples in splits.items():
        synchronize(device)
        start = time.perf_counter()
        predict_examples(model, task, examples, tokenizer, device, 64, args.seq_len, args.precision, scores=True)
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
                         f"examples of {args.data_dir} vs combining 5 members' saved scores",
            "one_model_inference_s": sum(seconds.values()), "per_split_s": seconds,
            "combine_5_members_s": combine_seconds}


DEV_SUBSET = 2000  # dev_eval's --max_eval_examples: the subset it times beside the full dev sets


def bench_dev_eval(args, device) -> dict:
    """What a run's dev scoring after each stage costs (trainer.Trainer.score_dev): an untrained MultitaskBERT of
    --config (SBERT pairs) scoring the dev sets of --data_dir through the run's Evaluator, tokenised once beforehand
    as a run's cache holds them, in batches of --batch_size (a run's --eval_batch_size) at --precision; every dev
    example against --max_eval_examples DEV_SUBSET, alternating for --rounds rounds (median seconds)."""
    from minbert.data.batches import load_task_data
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.prediction.inference import PredictionSettings, Predictor, TokenizedSplits
    from minbert.prediction.run_evaluation import Evaluator
    model = MultitaskBERT(build_minbert(args)).to(device).eval()
    data = load_task_data(standard_paths(args.data_dir), MULTITASK, set())
    splits = TokenizedSplits(build_tokenizer(args), model, args.seq_len, {})
    predictor = Predictor(model, splits, device, PredictionSettings(args.batch_size, args.seq_len, args.precision, True))
    evaluator = Evaluator(predictor, data, seed=0)
    for limit in (None, DEV_SUBSET):  # the tokenisation a run does once, before its first stage
        for task, task_data in data.items():
            splits.get(task, subsample(task_data.dev, limit, 0))
    seconds = {"all": [], f"max_eval_examples {DEV_SUBSET}": []}
    for _ in range(args.rounds):
        for name, limit in zip(seconds, (None, DEV_SUBSET)):
            synchronize(device)
            start = time.perf_counter()
            evaluator.evaluate("dev", limit)
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {"benchmark": f"a run's dev scoring after a stage: the {sum(len(d.dev) for d in data.values())} dev "
                         f"examples of {args.data_dir}, all of them vs a fixed subset of at most {DEV_SUBSET} per task",
            "dev_examples": {task: len(d.dev) for task, d in data.items()},
            "median_s": {name: statistics.median(values) for name, values in seconds.items()},
            "seconds": seconds}


def bench_predict(args, device) -> dict:
    """predict.py's throughput: SST's dev sentences of --data_dir predicted by a MultitaskBERT (tokenised once, the
    evaluation loader's length-sorted batches of --batch_size, the head and the scores to the host included), against
    a plain transformers BertModel forward pass of the same weights over the same batches; sentences per second."""
    from minbert.data.batches import TokenizedExamples, load_split, tokenized_dataloader
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.prediction.inference import predict_examples
    from minbert.runtime import pad_to_multiple_of
    ours, reference = build_encoders(args, device)
    model, reference = MultitaskBERT(ours).to(device).eval(), reference.eval()
    tokenizer = build_tokenizer(args)
    examples = TokenizedExamples.tokenize(load_split(args.data_dir, "sst", "dev"), tokenizer, args.seq_len)
    batches = [to_device(batch, device) for batch in tokenized_dataloader(
        examples, args.batch_size, shuffle=False, pad_to_multiple_of=pad_to_multiple_of(device))]

    @torch.inference_mode()
    def transformers_forward():
        for batch in batches:
            with autocast(device, args.precision):
                reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    steps = {"minbert_predict": lambda: predict_examples(model, "sst", examples, tokenizer, device, args.batch_size,
                                                         args.seq_len, args.precision, scores=True),
             "transformers_forward": transformers_forward}
    medians = alternate(steps, args, device)
    sentences = len(examples)
    return {"benchmark": f"prediction: SST dev ({sentences} sentences of {args.data_dir}), minBERT through predict.py's "
                         "path vs a transformers forward pass",
            "sentences": sentences, "median_pass_s": medians,
            "sentences_per_s": {name: sentences / seconds for name, seconds in medians.items()},
            "speedup_minbert_vs_transformers": medians["transformers_forward"] / medians["minbert_predict"]}

# ---------------------------------------------------------------------------------------------------
# step_audit: what one training step makes the host wait for, and where torch.compile breaks its graph

# Operators whose result the host must have before it goes on: a scalar read back (item(), bool() or float() of a
# tensor), or an output whose size depends on the data (nonzero, masked_select, unique), which CUDA knows only once
# the kernel has run.
READ_BACK_OPERATORS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "equal", "_unique2",
                                 "unique_dim", "unique_consecutive"})
# Indexing with a boolean mask (x[mask], x[mask] = y) runs a nonzero inside the operator.
INDEXING_OPERATORS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
COPY_OPERATORS = frozenset({"copy_", "_to_copy"})
AUDIT_SCRIPT = Path(__file__).resolve()


def copy_sync(name: str, args, kwargs, out) -> str | None:
    """Why the host waits for this copy_ / _to_copy, or None: a copy to the host waits for the device's queue; so
    does a blocking copy to the device (torch synchronizes the stream after it), and a non-blocking one from
    pageable memory may (CUDA: "might be synchronous with respect to host"); one from pinned memory does not."""
    if name == "copy_":
        destination, source = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    else:
        source, destination = args[0], out
        non_blocking = kwargs.get("non_blocking", False)
    if source.device.type != "cpu" and destination.device.type == "cpu":
        return f"device-to-host copy (aten::{name})"
    if source.device.type != "cpu" or destination.device.type == "cpu":
        return None
    if not non_blocking:
        return f"blocking host-to-device copy (aten::{name})"
    return None if source.is_pinned() else f"host-to-device copy from pageable memory (aten::{name})"


def host_sync(func, args, kwargs, out, device: torch.device) -> str | None:
    """Why the host waits for this operator call, or None. Audited on the CPU, every tensor stands for the one a GPU
    run holds on the device (the step moves its whole batch there); on CUDA an operator on host tensors alone (a
    CPU tensor's item()) does not wait for the GPU."""
    name = func.overloadpacket.__name__
    if name in COPY_OPERATORS:
        return copy_sync(name, args, kwargs, out)
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if device.type != "cpu" and all(t.device.type == "cpu" for t in tensors):
        return None
    if name in READ_BACK_OPERATORS:
        return f"aten::{name}"
    if name in INDEXING_OPERATORS and any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                                          for t in tree_flatten(args[1])[0]):
        return f"aten::{name} with a boolean mask (a nonzero inside)"
    return None


def project_frame(frames) -> str | None:
    """'file.py:line (function)' of the innermost frame of the project's own code among `frames` (innermost last),
    neither torch's nor this script's; None when there is none."""
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        installed = {"site-packages", "dist-packages"} & set(path.parts)  # a virtual environment inside the repo
        if path != AUDIT_SCRIPT and path.is_relative_to(ROOT) and not installed:
            return f"{path.relative_to(ROOT)}:{frame.lineno} ({frame.name})"
    return None


@dataclass
class StepCount:
    """What counting() saw: every aten operator call by operator, and the host syncs by (what, where)."""
    operators: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)

    @property
    def host_syncs(self) -> int:
        return sum(self.syncs.values())

    @property
    def ops(self) -> int:
        return sum(self.operators.values())

    def add_sync(self, what: str) -> None:
        # CUDA runs the backward pass on a thread of its own, where no frame of the project's is on the stack.
        self.syncs[(what, project_frame(traceback.extract_stack()) or "the backward pass")] += 1


class OperatorCounter(TorchDispatchMode):
    """Counts every aten operator dispatched while active, the backward pass's included, and its host syncs."""

    def __init__(self, count: StepCount, device: torch.device):
        super().__init__()
        self.count, self.device = count, device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.count.operators[f"aten::{func.overloadpacket.__name__}"] += 1
        what = host_sync(func, args, kwargs, out, self.device)
        if what is not None:
            self.count.add_sync(what)
        return out


class HostReadCounter(TorchFunctionMode):
    """Tensor.tolist() and .numpy() read a CPU tensor's memory directly, with no operator that OperatorCounter
    could see; on a GPU the same call first copies the tensor to the host. Counted when auditing on the CPU."""

    READS = frozenset({"tolist", "numpy"})

    def __init__(self, count: StepCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", None)
        if name in self.READS:
            self.count.add_sync(f"Tensor.{name}() (a device-to-host copy on a GPU)")
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(device: torch.device):
    """A StepCount of what runs inside the block."""
    count = StepCount()
    with HostReadCounter(count) if device.type == "cpu" else nullcontext(), OperatorCounter(count, device):
        yield count


def recipe_flags(array: str) -> list[str]:
    """A flag array of scripts/_common.sh (CPU_FLAGS, GPU_FLAGS, SMART_FLAGS), as the recipes pass it."""
    script = f'source "{ROOT / "scripts" / "_common.sh"}" && printf "%s\\0" "${{{array}[@]}}"'
    return subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout.split("\0")[:-1]


def audit_training_argv(args, smart: bool, pretrained: str, output_dir: str) -> list[str]:
    """The training command line of the recipes for --device (cpu_sbert.sh's flags on the CPU, gpu_sbert.sh's on
    CUDA; cpu_ss.sh's and gpu_ss.sh's with SMART) with this benchmark's model, data, batch size, --seq_len as
    --max_length and precision; --train_flags come last, so they win."""
    argv = recipe_flags("GPU_FLAGS" if torch.device(args.device).type == "cuda" else "CPU_FLAGS")
    if smart:
        argv += recipe_flags("SMART_FLAGS")
    argv += ["--pretrained", pretrained, "--data_dir", args.data_dir, "--batch_size", str(args.batch_size),
             "--max_length", str(args.seq_len), "--precision", args.requested_precision, "--output_dir", output_dir,
             "--quiet"]
    return argv + shlex.split(args.train_flags)


def random_checkpoint(config: BertConfig, folder: Path) -> Path:
    """Random weights of `config` saved as a pretrained folder, with the bundled minilm-l6 tokenizer (the
    bert-base-uncased vocabulary): the training command line loads it as it loads any checkpoint."""
    from safetensors.torch import save_file
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config.to_dict()), encoding="utf-8")
    torch.manual_seed(0)
    save_file(to_hf_state_dict(BertModel(config).state_dict()), folder / "model.safetensors")
    tokenizer = resolve_pretrained(RANDOM_WEIGHTS_TOKENIZER)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
    return folder


def audit_trainer(args, device: torch.device, smart: bool, pretrained: str, output_dir: str):
    """The Trainer that multitask_classifier.py builds from the recipe's command line (audit_training_argv), through
    the same run_setup functions as its _run: flags parsed and checked, data loaded, the flags that depend on the
    model checked, the model built and placed on the device (packed or padded tokens, compiled layers), the
    Trainer; and the run's stages."""
    from minbert.run.run_setup import build_run, check_pretrained, load_inputs
    settings = training_settings(audit_training_argv(args, smart, pretrained, output_dir))
    stages, data, _, triplets, teacher = load_inputs(settings)
    return build_run(settings, stages, data, check_pretrained(settings, data), triplets, teacher, device), stages


def training_settings(argv: list[str]):
    """multitask_classifier.py's settings of a command line (training_args.parse_training_args, its parser)."""
    from minbert.run.training_args import parse_training_args
    return parse_training_args(argv, "multitask_classifier.py's command line, as step_audit and qqp_epoch build it")


def first_training_batches(trainer, stages, args) -> tuple[str, list[dict]]:
    """The task of the run's first task stage and its first two batches, from the loader that run_stage makes (its
    seed included): one to warm up on and the one to count."""
    from minbert.training.schedules import StageKind
    index, stage = next((i, s) for i, s in enumerate(stages) if s.kind is StageKind.TASK)
    stage_data = trainer.stage_data
    loader = stage_data.train_loader(stage.task, trainer.config.seed + 1000 * index, stage_data.stage_size(stage))
    batches = [batch for _, batch in zip(range(2), loader)]
    if len(batches) < 2:
        raise UsageError(f"--batch_size {args.batch_size}: {args.data_dir}'s {stage.task} training set makes fewer "
                         "than the two batches step_audit needs (a warm-up step, then the counted one)")
    return stage.task, batches


def audited_step(trainer, task: str, warm_up: dict, counted: dict) -> StepCount:
    """One training step as run_steps takes it (task_step, then optimizer_step), counted after an uncounted one on
    `warm_up` (the optimizer's state, SMART's anchor). task_step's loss, a float or a tensor on the device, is not
    read here: reading it is the training loop's affair, once per step or once per log line."""
    trainer.model.train()
    steps, loop = trainer.steps, trainer.loop
    steps.task_step(task, warm_up, 1)
    loop.optimizer_step()
    with counting(trainer.device) as count:
        steps.task_step(task, counted, 1)
        loop.optimizer_step()
    return count


def graph_breaks(function) -> dict:
    """The graph breaks torch.compile meets in function(): torch._dynamo.explain's count (with default settings: the
    graphs it made, less one, resumed frames' included) and the reasons it recorded, by project line."""
    import torch._dynamo
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(function)()
    torch._dynamo.reset()
    reasons = Counter((reason.reason.splitlines()[0][:160], project_frame(reason.user_stack) or "torch")
                      for reason in explanation.break_reasons)
    return {"count": explanation.graph_break_count,
            "reasons": [{"reason": reason, "where": where, "times": times}
                        for (reason, where), times in reasons.most_common()]}


def plain_step_graph_breaks(trainer, task: str, batch: dict) -> dict:
    """Graph breaks of the model's forward in the plain step (embeddings, encoder and head: what torch.compile is
    to capture, its inputs and token layout prepared on the host beforehand, as the step prepares them) and of the
    step's whole loss computation (compute_task_loss under the run's autocast, as task_step runs it: the host-side
    preparation included)."""
    from minbert.training.objective import compute_task_loss
    model = trainer.model
    batch = to_device(batch, trainer.device)

    def loss():
        with trainer.steps.amp:
            return compute_task_loss(model, task, batch, trainer.penalties)[0]
    model.set_adapter(task)
    inputs = model.encoder_inputs(task, batch)

    def forward():
        with trainer.steps.amp:
            return model.outputs_from_embeddings(task, model.embed(inputs), inputs)
    return {"model forward": graph_breaks(forward), "loss computation": graph_breaks(loss)}


def step_figures(count: StepCount, task: str, batch: dict, argv: list[str]) -> dict:
    return {"task": task, "batch_shapes": {k: list(v.shape) for k, v in batch.items() if torch.is_tensor(v)},
            "training_argv": argv, "host_syncs": count.host_syncs, "ops": count.ops,
            "host_syncs_by_site": [{"what": what, "where": where, "times": times}
                                   for (what, where), times in count.syncs.most_common()],
            "operators": dict(count.operators.most_common())}


def bench_step_audit(args, device) -> dict:
    """One plain and one SMART training step as the command line trains them, each counted after a warm-up step:
    the host syncs (what and where), every aten operator dispatched (the backward pass and the optimizer step
    included) and, for the plain step, the graph breaks that torch.compile meets in the model's forward (and in
    the whole loss computation, reported beside it)."""
    result = {"benchmark": "step_audit: host syncs, aten operators and graph breaks of one training step"}
    with tempfile.TemporaryDirectory() as folder:
        config = random_config(args.config)
        pretrained = args.config if config is None else str(random_checkpoint(config, Path(folder) / "model"))
        for name, smart in (("plain", False), ("smart", True)):
            trainer, stages = audit_trainer(args, device, smart, pretrained, folder)
            task, (warm_up, counted) = first_training_batches(trainer, stages, args)
            count = audited_step(trainer, task, warm_up, counted)
            result[f"{name}_step"] = step_figures(count, task, counted,
                                                  audit_training_argv(args, smart, args.config, "OUTPUT_DIR"))
            if not smart:
                breaks = plain_step_graph_breaks(trainer, task, counted)
                result["plain_step"].update(
                    graph_breaks=breaks["model forward"]["count"],
                    graph_break_reasons=breaks["model forward"]["reasons"],
                    graph_breaks_loss_computation=breaks["loss computation"]["count"],
                    graph_break_reasons_loss_computation=breaks["loss computation"]["reasons"])
            del trainer
            gc.collect()
    return result


COURSE_QQP_TRAIN_PAIRS = 141_506  # the handout's quora-train.csv (seed 001)
THESIS_SMART_QQP_EPOCH_HOURS = 5.0  # the thesis' SMART QQP epoch on a Colab L4, at batch 8 (seed 000)


def bench_qqp_epoch(args, device) -> dict:
    """One QQP SMART epoch of the course's 141,506 pairs at --batch_size, as the SS recipe trains it (gpu_ss.sh's
    flags on CUDA, cpu_ss.sh's on the CPU, with --config's model and --seq_len as --max_length): after --warmup
    steps, --steps x --rounds real QQP steps of --data_dir's train file (batches as the stage draws them, length
    buckets on CUDA) run back to back, the device synchronised only before and after, as training runs them; the
    epoch is that step time x the epoch's steps. On a GPU with a known peak, the L4 time it implies scales the
    epoch by the two cards' published peaks in the run's precision (an estimate, labelled so)."""
    with tempfile.TemporaryDirectory() as folder:
        config = random_config(args.config)
        pretrained = args.config if config is None else str(random_checkpoint(config, Path(folder) / "model"))
        trainer, _ = audit_trainer(args, device, True, pretrained, folder)
        loader = trainer.stage_data.train_loader("qqp", trainer.config.seed)
        needed = args.warmup + args.steps * args.rounds
        batches = [batch for _, batch in zip(range(needed), itertools.cycle(loader))]
        trainer.model.train()
        steps, loop = trainer.steps, trainer.loop
        for batch in batches[:args.warmup]:
            steps.task_step("qqp", batch, 1)
            loop.optimizer_step()
        synchronize(device)
        start = time.perf_counter()
        for batch in batches[args.warmup:]:
            steps.task_step("qqp", batch, 1)
            loop.optimizer_step()
        synchronize(device)
        step_s = (time.perf_counter() - start) / (needed - args.warmup)
    epoch_steps = math.ceil(COURSE_QQP_TRAIN_PAIRS / args.batch_size)
    result = {"benchmark": f"one QQP SMART epoch of the course's {COURSE_QQP_TRAIN_PAIRS:,} pairs at batch "
                           f"{args.batch_size} (measured steps x the epoch's {epoch_steps} steps)",
              "smart_precision": trainer.penalty("smart").regularizers["qqp"].config.precision,
              "timed_steps": needed - args.warmup, "step_s": round(step_s, 5), "epoch_steps": epoch_steps,
              "epoch_hours": round(step_s * epoch_steps / 3600, 3),
              "thesis_l4_epoch_hours_at_batch_8": THESIS_SMART_QQP_EPOCH_HOURS}
    here, _ = peak_flops(device, args.precision, args.threads)
    l4 = dict(PEAK_TFLOPS)["L4"].get(args.precision)
    if device.type == "cuda" and here is not None and l4 is not None:
        result["implied_l4_epoch_hours_estimate"] = round(result["epoch_hours"] * here / (l4 * 1e12), 2)
    return result


PADDING_MULTIPLES = (8, 16, 32)  # the bucket sizes the padding benchmark compares (runtime.PAD_TO_MULTIPLE_OF is one)


def bench_padding(args, device) -> dict:
    """What length buckets cost (runtime.PAD_TO_MULTIPLE_OF pads CUDA and --compile runs): the tokens the encoder
    computes on in one shuffled epoch of each task's train file at --batch_size and --seq_len (SBERT pairs: both
    sides stacked, as MultitaskBERT.encoder_inputs stacks them), padded to each batch's longest row and to buckets
    of PADDING_MULTIPLES tokens, beside the real tokens (all that the CPU's packed layout computes on) and the
    number of batch widths each gives (a compiled graph or CUDA graph each)."""
    from minbert.data.batches import TokenizedExamples, load_split, tokenized_dataloader
    from minbert.runtime import PAD_TO_MULTIPLE_OF
    tokenizer = build_tokenizer(args)
    paddings = {"longest": None, **{f"multiple_{m}": m for m in PADDING_MULTIPLES}}
    result = {"benchmark": f"padded tokens of length buckets on the train files (training pads to multiples of "
                           f"{PAD_TO_MULTIPLE_OF} on CUDA)", "tasks": {}}
    for task in MULTITASK:
        examples = TokenizedExamples.tokenize(load_split(args.data_dir, task, "train"), tokenizer, args.seq_len)
        counts, widths = dict.fromkeys(["real", *paddings], 0), {name: set() for name in paddings}
        for name, multiple in paddings.items():
            for batch in tokenized_dataloader(examples, args.batch_size, shuffle=True, pad_to_multiple_of=multiple):
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


def step_audit_lines(result: dict) -> list[str]:
    """What the audit prints after its JSON: every host sync by site, the graph breaks, then the two summary lines."""
    plain, smart = result["plain_step"], result["smart_step"]
    lines = [f"{name} step sync: {site['times']} x {site['what']} at {site['where']}"
             for name, step in (("plain", plain), ("smart", smart)) for site in step["host_syncs_by_site"]]
    lines.append(f"graph breaks (torch._dynamo.explain: graphs - 1): the model's forward {plain['graph_breaks']}, "
                 f"the plain step's whole loss computation {plain['graph_breaks_loss_computation']}")
    for part, key in (("forward", "graph_break_reasons"), ("loss computation", "graph_break_reasons_loss_computation")):
        lines += [f"graph break in the {part}: {r['times']} x {r['reason']} at {r['where']}" for r in plain[key]]
    lines.append(f"plain step: host syncs {plain['host_syncs']}, ops {plain['ops']}, "
                 f"graph breaks {plain['graph_breaks']}")
    lines.append(f"smart step: host syncs {smart['host_syncs']}, ops {smart['ops']}")
    return lines


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
    return parser


def qa_peer_arguments(argv=None) -> argparse.Namespace:
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
    return args


# -- data ------------------------------------------------------------------------------------------

def qa_load_split(args, split: str, tokenizer, limit: int | None = None) -> squad.QAWindows:
    examples = squad.load_squad(Path(args.data_dir) / f"{split}-v2.0.json", split)
    if limit is not None and limit < len(examples):
        keep = sorted(random.Random(args.seed).sample(range(len(examples)), limit))  # file order kept
        examples = [examples[i] for i in keep]
    return squad.QAWindows.build(examples, tokenizer, args.max_length, args.doc_stride)


def qa_batch_of(windows: squad.QAWindows, indices, pad_to: int | None = None) -> dict:
    """windows.collate(indices), padded further to `pad_to` tokens (pad id 0, mask 0, segment 0) when given."""
    batch = windows.collate(indices)
    extra = 0 if pad_to is None else pad_to - batch["input_ids"].shape[1]
    if extra > 0:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            batch[key] = F.pad(batch[key], (0, extra), value=0)
    return batch


def qa_training_batches(windows: squad.QAWindows, args, epoch: int) -> list[list[int]]:
    """A seeded random permutation of the windows (a new one each epoch), cut into batches of batch_size."""
    order = np.random.RandomState(args.seed + epoch).permutation(len(windows)).tolist()
    return [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]


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

def qa_train(model, windows: squad.QAWindows, args) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)  # constant rate, no clipping
    pad_to = args.max_length if args.pad_to_max_length else None
    model.train()
    torch.manual_seed(args.seed)  # dropout
    step_times, losses = [], []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for indices in qa_training_batches(windows, args, epoch):
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


def qa_evaluate(model, windows: squad.QAWindows, args) -> dict:
    start = time.perf_counter()
    logits = qa_window_logits(model, windows, args.max_length)
    answers = squad.decode_answers(windows, logits, args.n_best, args.max_answer_tokens)
    examples = windows.examples
    tau = squad.best_threshold(answers, examples)
    at_zero = squad.squad_metrics(squad.predictions(answers, 0.0), examples)
    tuned = squad.squad_metrics(squad.predictions(answers, tau), examples)
    pick = lambda metrics, threshold: {**{k: metrics[k] for k in QA_METRIC_KEYS if k in metrics}, "tau": threshold}  # noqa: E731
    return {"tau0": pick(at_zero, 0.0), "tuned": pick(tuned, tau), "eval_seconds": time.perf_counter() - start}


# -- same batches: minBERT span model vs transformers ----------------------------------------------

def qa_compare_steps(args, directory: Path, windows: squad.QAWindows, steps: int) -> dict:
    """`steps` training steps of minBERT + a span head and of BertForQuestionAnswering on identical batches (the
    first batches of the training order, padded as --pad_to_max_length says), after QA_COMPARE_WARMUP untimed steps
    each; the two alternate step by step (which goes first alternating too), so machine drift hits both."""
    reference, _ = qa_transformers_model(directory, args.seed)
    ours = minbert_span_model(directory, reference)
    reference.train(), ours.train()
    sides = {
        "transformers": (lambda batch: qa_transformers_loss(reference, batch),
                         torch.optim.AdamW(reference.parameters(), lr=args.lr, weight_decay=0.0)),
        "minbert": (ours, AdamW(ours.parameters(), lr=args.lr, weight_decay=0.0)),
    }
    pad_to = args.max_length if args.pad_to_max_length else None
    order = [i for indices in qa_training_batches(windows, args, 0) for i in indices]
    needed = (QA_COMPARE_WARMUP + steps) * args.batch_size
    order = (order * (needed // len(order) + 1))[:needed]  # a small set is cycled through
    batches = [qa_batch_of(windows, order[i:i + args.batch_size], pad_to) for i in range(0, needed, args.batch_size)]
    times = {name: [] for name in sides}
    torch.manual_seed(args.seed)
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

def qa_settings(args, directory: Path) -> dict:
    import transformers
    return {"pretrained": args.pretrained, "pretrained_dir": str(directory), "data_dir": str(args.data_dir),
            "max_length": args.max_length, "doc_stride": args.doc_stride, "max_answer_tokens": args.max_answer_tokens,
            "n_best": args.n_best, "batch_size": args.batch_size, "eval_batch_size": QA_EVAL_BATCH_SIZE,
            "lr": args.lr, "epochs": args.epochs, "seed": args.seed, "max_train_examples": args.max_train_examples,
            "pad_to_max_length": args.pad_to_max_length, "optimizer": "torch.optim.AdamW, weight_decay 0",
            "schedule": "constant", "precision": "float32", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.machine()}


def qa_peer_main(argv=None) -> int:
    args = qa_peer_arguments(argv)
    try:
        return qa_peer_run(args)
    except (CheckpointError, DataError) as err:  # a SQuAD file or checkpoint found wrong once read: one line
        print(f"benchmark.py qa_peer: error: {err}", file=sys.stderr)
        return 2


def qa_peer_run(args) -> int:
    directory = resolve_pretrained(args.pretrained)
    tokenizer = BertTokenizer.from_pretrained(directory)
    train_windows = qa_load_split(args, "train", tokenizer, args.max_train_examples)
    result = {"settings": qa_settings(args, directory),
              "train_questions": len(train_windows.examples), "train_windows": len(train_windows)}
    if args.compare_steps:
        result["compare_steps"] = qa_compare_steps(args, directory, train_windows, args.compare_steps)
        c = result["compare_steps"]
        print(f"same batches, {args.compare_steps} steps: transformers {c['transformers']['median_step_seconds']:.3f} "
              f"s/step, minBERT {c['minbert']['median_step_seconds']:.3f} s/step, "
              f"speed-up {c['speedup_minbert_vs_transformers']:.2f}x")
    else:
        dev_windows = qa_load_split(args, "dev", tokenizer)
        result.update(dev_questions=len(dev_windows.examples), dev_windows=len(dev_windows))
        model, info = qa_transformers_model(directory, args.seed)
        result["loading_info"] = info
        result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        result["train"] = qa_train(model, train_windows, args)
        result["dev"] = qa_evaluate(model, dev_windows, args)
        t, d = result["train"], result["dev"]
        print(f"transformers peer: {result['train_windows']} train windows, {t['steps']} steps, "
              f"{t['step_seconds']:.3f} s/step (mean after {QA_SKIPPED_STEPS}), train {t['train_seconds']:.0f} s, "
              f"{torch.get_num_threads()} thread(s); dev F1 {d['tuned']['f1']:.4f} EM {d['tuned']['em']:.4f} "
              f"(tau {d['tuned']['tau']:.3f}), at tau 0 F1 {d['tau0']['f1']:.4f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0



BENCHMARKS = {"encoder": bench_encoder, "precision": bench_precision, "smart": bench_smart, "memory": bench_memory,
              "pipeline": bench_pipeline, "adapters": bench_adapters, "checkpointing": bench_checkpointing,
              "data_parallel": bench_data_parallel, "ensemble": bench_ensemble, "padding": bench_padding,
              "qqp_epoch": bench_qqp_epoch, "predict": bench_predict, "dev_eval": bench_dev_eval}
# Measurements of the data or of a whole epoch rather than of a step: asked for by name, outside `all`.
ON_THEIR_OWN = {"padding", "qqp_epoch", "predict", "dev_eval"}
# Kinds that count rather than time, outside `all`; each prints lines of its own after its JSON, its summary last.
AUDITS = {"step_audit": bench_step_audit}
AUDIT_LINES = {"step_audit": step_audit_lines}
PROTOCOL_DATA = ROOT.parent / "shared" / "data" / "protocol"
DEMO_DATA = ROOT / "data" / "demo"
# The course files each kind reads from --data_dir (step_audit: the training command line checks its own).
DATA_FILES = {"pipeline": [("sst", "train")],
              "ensemble": [(task, split) for task in MULTITASK for split in ("dev", "test")],
              "padding": [(task, "train") for task in MULTITASK], "qqp_epoch": [("qqp", "train")],
              "predict": [("sst", "dev")], "dev_eval": [(task, "dev") for task in MULTITASK]}
# those that tokenize real text with --config's tokenizer
TEXT_KINDS = {"pipeline", "ensemble", "step_audit", "padding", "qqp_epoch", "predict", "dev_eval"}
# The shortest --seq_len that lets each kind act: the tokenizer's shortest cut for a text (pairs: step_audit's
# training may encode them jointly); random batches need rows of seq_len / 2 .. seq_len tokens, at least one each.
SHORTEST_SEQ_LEN = {"pipeline": shortest_max_length(1), "ensemble": shortest_max_length(1),
                    "step_audit": shortest_max_length(2), "padding": shortest_max_length(1),
                    "qqp_epoch": shortest_max_length(2), "predict": shortest_max_length(1),
                    "dev_eval": shortest_max_length(1)}
RANDOM_BATCH_SHORTEST_SEQ_LEN = 2


def whole_number(minimum: int):
    """An argparse type: a whole number >= minimum (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def device_flag(text: str) -> str:
    """An argparse type: a device these benchmarks run on that torch can see (cpu, cuda, cuda:N)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"the benchmarks run on cpu or cuda, not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise argparse.ArgumentTypeError(f"{text}: torch sees no CUDA device (torch {torch.__version__}, {build})")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return text


def chosen_kinds(which: str, device: torch.device) -> list[str]:
    """The kinds a run measures: `which`, or for all every timed kind that runs on the device (data_parallel
    measures gloo processes on the CPU)."""
    if which != "all":
        return [which]
    return [kind for kind in BENCHMARKS
            if kind not in ON_THEIR_OWN and (kind != "data_parallel" or device.type == "cpu")]


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks that need several flags or the model's config.json (no weights): each bad flag is one line and
    exit code 2 (parser.error) before anything loads."""
    device = torch.device(args.device)
    kinds = chosen_kinds(args.which, device)
    if args.which == "data_parallel" and device.type != "cpu":
        parser.error(f"--device {args.device}: data_parallel measures gloo processes on the CPU; on GPUs time a "
                     "torchrun run instead")
    if "data_parallel" in kinds and args.batch_size < 2:
        parser.error(f"--batch_size {args.batch_size}: data_parallel splits it over 2 processes, so it must be >= 2")
    shortest = max(SHORTEST_SEQ_LEN.get(kind, RANDOM_BATCH_SHORTEST_SEQ_LEN) for kind in kinds)
    if args.seq_len < shortest:
        parser.error(f"--seq_len must be >= {shortest} for {args.which}, got {args.seq_len}")
    try:
        config = model_config(args.config)
        if TEXT_KINDS & set(kinds):
            BertTokenizer.from_pretrained(tokenizer_directory(args.config)).check_fits(config.vocab_size, args.config)
    except CheckpointError as err:
        parser.error(f"--config {args.config}: {err}")
    if args.seq_len > config.max_position_embeddings:
        parser.error(f"--seq_len {args.seq_len} is longer than the {config.max_position_embeddings} positions of "
                     f"{args.config}")
    data_dir = Path(args.data_dir)
    if TEXT_KINDS & set(kinds) and not data_dir.is_dir():
        parser.error(f"--data_dir {data_dir}: not a folder")
    for task, split in sorted({pair for kind in kinds for pair in DATA_FILES.get(kind, [])}):
        path = standard_paths(data_dir)[(task, split)]
        if not path.is_file():
            parser.error(f"--data_dir {data_dir}: no {path.name} there (the {task} {split} file)")
    if args.json is not None:
        problem = "a folder, not a file" if args.json.is_dir() else unwritable_folder(args.json.parent)
        if problem:
            parser.error(f"--json {args.json}: {problem}")
    if args.which == "step_audit":  # the training command line checks its own flags (one line, exit code 2)
        settings = training_settings(audit_training_argv(args, True, args.config, "OUTPUT_DIR"))
        if settings.compile:
            parser.error("--train_flags --compile: torch.compile does not run under the TorchDispatchMode that counts "
                         "the step's operators; step_audit counts the eager step, and its graph breaks say what "
                         "--compile can capture")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked, with --precision resolved for --device: args.precision is bf16, fp16 or fp32
    and args.requested_precision what was asked (auto, or --bf16 / --no-bf16 through their alias)."""
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHMARKS, "all", *AUDITS])
    parser.add_argument("--config", default="minilm-l6", help="minilm-l6, a checkpoint, or random weights: "
                        "bert-base-random, random:NAME_OR_CONFIG_JSON")
    parser.add_argument("--device", type=device_flag, default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=whole_number(1), default=2)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: as training resolves it for the device (runtime.resolve_precision)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="alias: --bf16 is --precision bf16, --no-bf16 is --precision fp32")
    parser.add_argument("--batch_size", type=whole_number(1), default=32)
    parser.add_argument("--seq_len", type=whole_number(1), default=64,
                        help="tokens per sequence (step_audit: the training run's --max_length)")
    parser.add_argument("--warmup", type=whole_number(0), default=2, help="untimed steps per side")
    parser.add_argument("--steps", type=whole_number(1), default=3, help="timed steps per side per round")
    parser.add_argument("--rounds", type=whole_number(1), default=3)
    parser.add_argument("--data_dir", help=f"course files: pipeline reads ids-sst-train.csv, ensemble the dev and "
                        f"test files (default {PROTOCOL_DATA}); step_audit trains on it (default {DEMO_DATA})")
    parser.add_argument("--train_flags", default="", help="step_audit: more flags of the training command line, "
                        "after the recipe's, so they win; with an = as they start with --, e.g. "
                        "--train_flags='--gradient_checkpointing'")
    parser.add_argument("--compile", action="store_true", help="torch.compile minBERT's layers as --compile does in "
                        "training (encoder: transformers is timed compiled too)")
    parser.add_argument("--compile_mode", choices=COMPILE_MODES, default="default",
                        help="with --compile: torch.compile's mode, as --compile_mode in training (reduce-overhead: "
                        "CUDA graphs; give them --warmup 5 or more to record)")
    parser.add_argument("--token_layout", choices=("auto", "packed", "padded"), default="auto",
                        help="minBERT's bert.TokenLayout: auto as training places it (packed on the CPU, padded on "
                        "CUDA), or forced")
    parser.add_argument("--json", type=Path, help="also append the results to this JSON-lines file")
    args = parser.parse_args(argv)
    if args.compile_mode != "default" and not args.compile:
        parser.error(f"--compile_mode {args.compile_mode}: only with --compile")
    if args.data_dir is None:
        args.data_dir = str(DEMO_DATA if args.which in AUDITS else PROTOCOL_DATA)
    try:
        args.requested_precision = requested_precision(args.precision, args.bf16)
    except ValueError as err:
        parser.error(str(err))
    args.precision = resolve_precision(torch.device(args.device), args.requested_precision)
    check_arguments(parser, args)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["qa_peer"]:  # a training run with its own flags, not a timed kind
        return qa_peer_main(argv[1:])
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    use_tf32(device)  # as training does: float32 matmuls through TF32 on CUDA
    for name in chosen_kinds(args.which, device):
        GRADIENT_SCALING.clear()
        try:
            result = {**BENCHMARKS, **AUDITS}[name](args, device)
        except (CheckpointError, DataError, UsageError) as err:  # an input found wrong once read: one line
            print(f"benchmark.py {name}: error: {err}", file=sys.stderr)
            return 2
        if GRADIENT_SCALING:
            result["fp16_skipped_steps"] = sum(record["skipped"] for record in GRADIENT_SCALING)
        result["setup"] = describe(args, device)
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
        if name in AUDIT_LINES:
            print("\n".join(AUDIT_LINES[name](result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
